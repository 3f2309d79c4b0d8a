"""The prelude: runs the user's code as ``__main__`` (see ``plotting/__init__.py``).

It comes in the bundle, compiled by the gateway, and the first file of the run (``_boot.py``)
runs it in its own namespace, then calls :func:`main`; only an interpreter with another
bytecode format compiles it from source. It holds only the checks every run makes, and imports
nothing a bare interpreter has not loaded: what a check finds to do is done by the support module
(``_support.py``), made (loaded from the bundle) only then. Nothing here assumes a fresh
interpreter: one that imported matplotlib before running the first file as a script
(``runpy.run_path``) gets the same figures.

Output: the evaluator discards the whole output (and the files) of a run that wrote one byte that
is not UTF-8, so ``sys.stdout`` and ``sys.stderr`` are replaced, before the code runs, by
:class:`_Stream` s, which write only UTF-8.
"""

# contextlib is not loaded at interpreter startup; importing it would cost every run. Names are
# imported, not modules: this namespace outlives the run (the streams' and finder's functions
# use it), and holding os, io or codecs would make the interpreter's exit clear them (and what
# they import) one name at a time, where it otherwise frees them whole.
# ruff: noqa: SIM105

import builtins
import marshal
import sys
from codecs import register_error
from io import TextIOWrapper
from os import getcwd, listdir, remove

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from importlib.machinery import ModuleSpec
    from io import BufferedIOBase
    from types import CodeType, ModuleType

    from ._ending import end_run  # the prelude's second part: one module with this one

# The files of a run: the first (``_boot.py``), the bundle (see prelude_files()).
PRELUDE_NAME = "_mcp_prelude.py"
BUNDLE_NAME = "_mcp_prelude.bin"
# The name python -c gives its code: exec() of a string uses it, and compile() is avoided.
CODE_FILENAME = "<string>"
# Imports handed to the support module (see its find_spec()); all others cost one set lookup.
WATCHED_IMPORTS = frozenset({"_mcp_backend", "matplotlib", "matplotlib.pyplot", "linecache"})
# The error handler of the guarded sys.stdout (the support module's replace()).
ERRORS = "mcp-replace"
# A last expression's value is shown as its repr, cut in the middle beyond this many characters.
SHOWN_MAX_CHARS = 10_000
# First words of a last line that is not an expression statement, or whose value is None.
_NOT_SHOWN = frozenset(
    b"import from def class for while if elif else try except finally with async return "
    b"raise pass break continue del global nonlocal assert print".split()
)

# Set by main(): the user's source, the bundle and its tail's size (the support module) and
# whether to load code from it, the working directory, the guarded streams. The finder on
# sys.meta_path. The support module, once made.
_source = b""
_bundle = b""
_tail_size = 0
_support_compiled = False
# Whether this is a cell of a session (the warm agent's sys._mcp_session): the namespace, the
# guarded streams and the support module then last from cell to cell.
_session = False
# The names the first file binds in the namespace it runs in (see _boot.py).
_BOOT_NAMES = (
    "_boot_file",
    "_boot_data",
    "_boot",
    "_boot_magic",
    "_boot_resident",
    "_boot_compiled",
    "_boot_prelude",
)
_workdir = "."
_guarded: "list[_Stream]" = []
_finder = type(sys)("_mcp_finder")
_support_module: "ModuleType | None" = None
# Whether the support module was configured for this run (a session's later cells keep it).
_configured = False
# Which prelude this is (the gateway's digest of it): a later cell runs it only if it names it.
_digest = b""
# Whether this run's code was started (an interrupt came in the prelude's work before or after).
_code_started = False
# Whether a warm sandbox loaded this prelude before its first run (see warm()).
_loaded_ahead = False


def warm(head: "tuple[bytes, bytes, bytes, bytes, int, bytes]", bundle: bytes) -> None:
    """Make the support module ahead of the first run, from the resident ``bundle`` (``head``,
    its head), and keep this prelude where a run's first file finds it (``sys._mcp_prelude``).

    A warm sandbox's interpreter runs this before any code (``_warm.py``), so that a session's
    first cell, or a run, skips loading both, as a session's later cells do.
    """
    global _bundle, _tail_size, _support_compiled, _digest, _support_module, _loaded_ahead
    _bundle, _tail_size, _support_compiled, _digest = bundle, head[4], True, head[5]
    _support_module = _made_support()
    _loaded_ahead = True
    sys._mcp_prelude = globals()  # type: ignore[attr-defined]


def main(
    head: "tuple[bytes, bytes, bytes, bytes, int, bytes]",
    bundle: bytes,
    compiled: bool,
    namespace: "dict[str, object]",
) -> None:
    """Run the user's code as ``__main__`` (:func:`_main`); exit the way ``python`` would have.

    A session's time limit is a KeyboardInterrupt, which may come while the prelude itself
    works, before the code or after it (a tiny ``timeout_seconds``): it is said in one line,
    with none of the prelude's frames, and the cell ends as an interrupted one.

    Args:
        head: The bundle's head (see ``prelude_files()``): the user's code, the tail's size,
            the digest of the prelude that sent it.
        bundle: The bundle, whose tail is the support module and its parts: their code and,
            apart, their sources, compressed with ``zlib`` (see :func:`_support`).
        compiled: Whether the support module is to be loaded as code (the prelude was).
        namespace: The first file's globals. Its module, ``sys.modules["__main__"]``, becomes
            the user's, emptied: whoever ran the first file (python, ``runpy``, an interpreter
            kept warm) holds the user's module, and frees the user's objects as it would
            have freed the first file's.
    """
    global _code_started
    _code_started = False
    try:
        _main(head, bundle, compiled, namespace)
    except KeyboardInterrupt:
        when = "as the code ended" if _code_started else "before the code started"
        try:
            print("KeyboardInterrupt: the time limit came", when, file=sys.stderr, flush=True)
        except BaseException:
            pass
        raise SystemExit(130) from None


def _main(
    head: "tuple[bytes, bytes, bytes, bytes, int, bytes]",
    bundle: bytes,
    compiled: bool,
    namespace: "dict[str, object]",
) -> None:
    """:func:`main`'s work (see its arguments)."""
    global _source, _bundle, _tail_size, _support_compiled, _workdir, _session, _configured
    global _digest, _code_started
    _source, _bundle, _tail_size, _support_compiled = head[3], bundle, head[4], compiled
    _digest = head[5]
    _session = getattr(sys, "_mcp_session", False) is True
    _configured = False
    _guarded.clear()
    if _session:  # the session's later cells come without the prelude, and run this one
        sys._mcp_prelude = globals()  # type: ignore[attr-defined]
    _guard_streams()
    _workdir = getcwd()
    for name in (PRELUDE_NAME, BUNDLE_NAME):  # the user's directory holds the user's files
        try:
            remove(name)
        except OSError:
            pass
    sys.meta_path[:] = [f for f in sys.meta_path if getattr(f, "__name__", "") != "_mcp_finder"]
    sys.meta_path.insert(0, _finder)
    # Files sent in (the manifest leaves out those the code leaves alone); modules the hooks
    # come too late for: linecache loaded by a .pth file, matplotlib by a warm interpreter.
    if _session:  # the manifest of the cell before is not the code's to see
        try:
            remove(_support().MANIFEST_NAME)
        except OSError:
            pass
    if _session or _has_files() or "linecache" in sys.modules or "matplotlib" in sys.modules:
        _support().start()
    module = sys.modules.get("__main__")
    if getattr(module, "__dict__", None) is not namespace:  # run by exec() in a plain dict
        module = sys.modules["__main__"] = type(sys)("__main__")
    namespace = vars(module)
    if _session:  # the cell's namespace is the session's: only the first file's names go
        for name in _BOOT_NAMES:
            namespace.pop(name, None)
        namespace.setdefault("__builtins__", builtins)
    else:
        namespace.clear()
        # What a new module has, and no __file__, as with python -c: no file holds the code,
        # and multiprocessing's spawn and forkserver start methods would try to re-run a
        # __main__ that has one.
        namespace.update(vars(type(sys)("__main__")), __builtins__=builtins)
    sys.argv[:1] = [CODE_FILENAME]
    status = None
    # exec() of the bytes: read as python reads a script (BOM, coding cookie, bad UTF-8, NUL
    # bytes); a compile error has no frame of the user's and is reported as python reports
    # one. The prelude is compiled with no __future__ imports to pass on. (_split raises only
    # an interrupt, which is main()'s to report.)
    code, last = _split(_source) if _may_end_with_expression(_source) else (_source, None)
    _code_started = True
    try:
        exec(code, namespace)
        if last is not None:
            _show(eval(last, namespace))
    except SystemExit as exc:
        status = exc.code
    except BaseException as exc:
        status = _support().report_uncaught(exc)
        if _session and isinstance(exc, KeyboardInterrupt):
            status = 130  # as a shell reports SIGINT, which ends a run that is not a session
    # Figures pyplot may hold open, files to list, bytes held by a stream's buffer, a note.
    if _support_module or "matplotlib._pylab_helpers" in sys.modules or _has_files():
        _support().finish()  # flushes the streams too
    else:  # python would flush only after printing a sys.exit() message: stdout goes first
        for stream in (sys.stdout, sys.stderr, *_guarded):  # the code may have rebound them
            try:
                stream.flush()
            except Exception:
                pass
    if not _session:
        end_run(status, namespace, _guarded)  # returns if python is to end the run itself
    if status is not None:
        raise SystemExit(status)


def _guard_streams() -> None:
    """Make ``sys.stdout`` and ``sys.stderr`` :class:`_Stream` s (a session's later cells keep
    those of the cell before), listed in ``_guarded``."""
    register_error(ERRORS, _replace)
    for name, errors in (("stdout", ERRORS), ("stderr", "backslashreplace")):
        stream = getattr(sys, name)
        if type(stream).__name__ == "_Stream" and _session:  # guarded by an earlier cell
            _guarded.append(stream)
            continue
        if type(stream) is not TextIOWrapper:  # no such stream (a closed descriptor)
            continue
        try:
            line_buffering, write_through = stream.line_buffering, stream.write_through
            guarded = _Stream(stream.detach(), "utf-8", errors, "\n", line_buffering, write_through)
        except Exception:
            continue
        _guarded.append(guarded)
        setattr(sys, name, guarded)
        setattr(sys, f"__{name}__", guarded)


def _show(value: object) -> None:
    """Print a last expression's value as a notebook shows it: its ``repr``, bounded; nothing
    for ``None`` or for matplotlib's objects (their figure comes back as an image)."""
    items = value if isinstance(value, list | tuple) and value else (value,)
    if value is None or all(type(item).__module__.startswith("matplotlib") for item in items):
        return
    text = repr(value)
    if len(text) > SHOWN_MAX_CHARS:
        cut = SHOWN_MAX_CHARS // 2
        text = f"{text[:cut]} ... [{len(text) - 2 * cut:,} characters cut] ... {text[-cut:]}"
    print(text)


def _may_end_with_expression(source: bytes) -> bool:
    """Whether the last statement may be an expression, whose value a notebook would show.

    Parsing costs about as much as compiling again, so a last line that plainly is not one
    (a statement keyword, or ``print(...)``, whose value is None) is not parsed; nor one that
    ends with ``;``, which hides the value, as in IPython."""
    for line in reversed(source.splitlines()):
        stripped = line.strip()
        if not stripped or stripped.startswith(b"#"):
            continue
        if stripped.endswith(b";"):
            return False
        if line[:1] in b" \t)]}":  # within a statement that began above
            return True
        stripped = stripped.rsplit(b";", 1)[-1].strip() or stripped  # the last statement
        word = stripped.split(None, 1)[0].split(b"(", 1)[0].rstrip(b":")
        return word not in _NOT_SHOWN and not word.startswith(b"@")
    return False


def _split(source: bytes) -> "tuple[bytes | CodeType, CodeType | None]":
    """The code to run, and apart, its last statement's expression to show, if it is one.

    ``_ast``, not ``ast``: importing ``ast`` would cost more than the parse."""
    import _ast

    try:
        tree = compile(source, CODE_FILENAME, "exec", _ast.PyCF_ONLY_AST, dont_inherit=True)
        if not isinstance(tree, _ast.Module):
            return source, None
        last = tree.body[-1] if tree.body else None
        if not isinstance(last, _ast.Expr):
            return compile(tree, CODE_FILENAME, "exec", dont_inherit=True), None
        body = _ast.Module(tree.body[:-1], tree.type_ignores)
        return (
            compile(body, CODE_FILENAME, "exec", dont_inherit=True),
            compile(_ast.Expression(last.value), CODE_FILENAME, "eval", dont_inherit=True),
        )
    except Exception:  # a syntax error (or a tree too deep): exec() of the source reports it
        return source, None


def find_spec(
    fullname: str, path: "Sequence[str] | None", target: "ModuleType | None" = None
) -> "ModuleSpec | None":
    """The ``sys.meta_path`` finder's: main() puts it first on the path."""
    if fullname in WATCHED_IMPORTS:
        return _support().find_spec(_finder, fullname, path, target)  # type: ignore[no-any-return]
    return None


_finder.find_spec = find_spec  # type: ignore[attr-defined]


def _has_files() -> bool:
    """Whether the working directory holds what Snekbox could return: nothing hidden counts
    (an evaluator may keep its own ``.tmp`` or ``.config`` there)."""
    try:
        for name in listdir(_workdir):
            if not name.startswith("."):
                return True
    except OSError:
        pass
    return False


def _replace(error: UnicodeError) -> tuple[str | bytes, int]:
    return _support().replace(error)  # type: ignore[no-any-return]


class _Stream(TextIOWrapper):
    """A standard stream that writes only UTF-8, whatever the code writes through it.

    Text is encoded as UTF-8 with :data:`ERRORS` (stdout) or ``backslashreplace`` (stderr, as
    Python's own), and ``reconfigure()`` keeps both. ``buffer`` and ``detach()`` give the
    support module's ``CheckedBytes``. Only a write to the file descriptor itself escapes.
    """

    @property
    def buffer(self) -> "BufferedIOBase":  # type: ignore[override]
        return _support().buffer(self)  # type: ignore[no-any-return]

    def detach(self) -> "BufferedIOBase":  # type: ignore[override]
        return _support().detach(self)  # type: ignore[no-any-return]

    def reconfigure(
        self, *, encoding: object = None, errors: object = None, **options: object
    ) -> None:
        # Another encoding or error handler (surrogateescape) could write bytes that are not UTF-8.
        super().reconfigure(**options)  # type: ignore[arg-type]


def _support() -> "ModuleType":
    """The support module, made on first use."""
    global _support_module, _configured
    if _support_module is None:
        _support_module = _made_support()
    if not _configured:
        _support_module.configure(
            workdir=_workdir,
            source=_source,
            hide=(main.__code__, _main.__code__, _show.__code__),
            streams=_guarded,
            session=_session,
        )
        _configured = True
    return _support_module


def _made_support() -> "ModuleType":
    """The support module a session's earlier cell made, if this prelude (its digest) made
    it: its figures' backend and counters go on. Else one made from the bundle's tail."""
    module = sys.modules.get("_mcp_support") if _session else None
    if module is not None and getattr(module, "_mcp_digest", None) == _digest:
        return module
    if not _tail_size:
        raise RuntimeError("the gateway's support module was removed from this session")
    # Its parts and itself from the bundle's tail: (name, code) pairs (or (name, source), for
    # an interpreter with another bytecode format than the gateway's), each part after those
    # it imports, the module itself (name "") last.
    module = type(sys)("_mcp_support")
    module.__path__ = []  # a package: its parts import one another relatively
    sys.modules["_mcp_support"] = module
    try:
        import zlib

        tail = marshal.loads(_bundle[-_tail_size:])
        parts = marshal.loads(zlib.decompress(tail[0 if _support_compiled else 1]))
        for name, item in parts:
            part = type(sys)("_mcp_support." + name) if name else module
            part.__package__ = "_mcp_support"
            if name:
                sys.modules[part.__name__] = part
                setattr(module, name, part)
            if not _support_compiled:
                item = compile(item, "<mcp-support>", "exec", dont_inherit=True)
            exec(item, vars(part))
        module._mcp_digest = _digest  # type: ignore[attr-defined]  # whole: a cell may take it
    except BaseException:
        # Half made (an interrupt): a session's later cells would find it as it is.
        for name in [name for name in sys.modules if name.startswith("_mcp_support")]:
            del sys.modules[name]
        raise
    return module
