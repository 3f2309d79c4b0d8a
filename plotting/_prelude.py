"""The prelude: runs the user's code as ``__main__`` (see ``plotting/__init__.py``).

Every run pays for compiling this file (a script has no cached bytecode), so it holds only what
every run needs and imports nothing a bare interpreter has not loaded. The rest is in the support
module (``_support.py``), compiled only when a run needs it. Standard-library only.

Output: the evaluator discards the whole output (and the files) of a run that wrote one byte that
is not UTF-8, so ``sys.stdout`` and ``sys.stderr`` are replaced, before the user's code runs, by
streams that write only UTF-8 (see :class:`_Stream`); what had to be replaced is said once, in a
note at the end of the output.
"""

# contextlib is not loaded at interpreter startup; importing it would cost every run.
# ruff: noqa: SIM105

import builtins
import codecs
import io
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from importlib.machinery import ModuleSpec
    from types import ModuleType

CODE_NAME = "_mcp_code.py"
SUPPORT_NAME = "_mcp_support.py"
# The name python -c gives its code: exec() of a string uses it, and compile() is avoided.
CODE_FILENAME = "<string>"
# Imports handed to the support module (see its find_spec()); all others cost one set lookup.
WATCHED_IMPORTS = frozenset({"_mcp_backend", "matplotlib", "matplotlib.pyplot", "linecache"})

#: The error handler of the guarded standard streams (see _replace()).
ERRORS = "mcp-replace"

# Set by main().
_self: object = None
_workdir = ""
_source = b""
_support_source = b""
# The guarded sys.stdout and sys.stderr, and how many characters or bytes they had to replace.
_guarded: "list[_Stream]" = []
_replaced = 0


def main() -> None:
    """Run the user's code as ``__main__``; exit the way ``python`` would have."""
    global _self, _workdir, _source, _support_source
    _guard_streams()
    _self, _workdir = sys.modules[__name__], os.getcwd()
    with open(CODE_NAME, "rb") as f:
        _source = f.read()
    with open(SUPPORT_NAME, "rb") as f:
        _support_source = f.read()
    for name in (CODE_NAME, SUPPORT_NAME, __file__):  # the user's directory holds only its own
        try:
            os.remove(name)
        except OSError:
            pass
    if _has_files():  # files were sent in: the manifest leaves out those the code leaves alone
        _support().note_inputs()
    sys.meta_path.insert(0, _self)  # this module is the finder: see find_spec()
    if "linecache" in sys.modules:  # a .pth file loaded it already
        _support().register_source(sys.modules["linecache"])
    module = type(sys)("__main__")
    # No __file__, as with python -c: no file holds the code, and multiprocessing's spawn and
    # forkserver start methods would try to re-run a __main__ that has one.
    module.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = module
    sys.argv[:1] = [CODE_FILENAME]
    status: object = None
    interrupted = False
    try:
        # exec() of the bytes, not compile(): compile() first builds the ast module's types,
        # about 1.5 ms that every run would pay. Bytes are read as python reads a script (BOM,
        # coding cookie, bad UTF-8, NUL bytes); a compile error has no frame of the user's and
        # is reported as python reports one. This file has no __future__ imports to pass on.
        exec(_source, module.__dict__)
    except SystemExit as exc:
        status = exc.code
    except BaseException as exc:
        _support().report_uncaught(exc)
        status = 1
        interrupted = isinstance(exc, KeyboardInterrupt)
    if "matplotlib._pylab_helpers" in sys.modules:  # pyplot was imported: figures may be open
        _support().capture_open_figures()
    if _has_files():
        _support().write_manifest()
    _finish_streams()
    if interrupted:
        _support().die_of_sigint()
    if status is not None:
        try:
            sys.stdout.flush()  # before python prints a sys.exit() message on stderr
        except Exception:
            pass
        raise SystemExit(status)


def find_spec(
    fullname: str, path: "Sequence[str] | None", target: "ModuleType | None" = None
) -> "ModuleSpec | None":
    """The ``sys.meta_path`` finder: this module is put first on it."""
    if fullname in WATCHED_IMPORTS:
        return _support().find_spec(_self, fullname, path, target)  # type: ignore[no-any-return]
    return None


def _has_files() -> bool:
    try:
        return bool(os.listdir(_workdir))
    except OSError:
        return False


def _replace(error: UnicodeError) -> tuple[str | bytes, int]:
    """The guarded streams' error handler: U+FFFD for what is not UTF-8, counted for the note."""
    global _replaced
    if isinstance(error, UnicodeDecodeError):  # bytes that are not UTF-8: one mark per sequence
        _replaced += 1
        return "\ufffd", error.end
    if isinstance(error, UnicodeEncodeError):  # lone surrogates: one mark per character
        _replaced += error.end - error.start
        # Bytes: the UTF-8 encoder takes only ASCII text from an error handler.
        return b"\xef\xbf\xbd" * (error.end - error.start), error.end
    raise error


class _Stream(io.TextIOWrapper):
    """A standard stream that writes only UTF-8, whatever the code writes through it.

    Text is encoded as UTF-8 with :data:`ERRORS` (stdout) or ``backslashreplace`` (stderr, as
    Python's own), and ``reconfigure()`` keeps both. ``buffer`` and ``detach()`` give the
    support module's ``CheckedBytes``, which replaces bytes that are not UTF-8 (built on first
    use). Only a write to the file descriptor itself (``os.write``, a subprocess, C code) escapes.
    """

    _mcp_checked: "io.BufferedIOBase | None" = None

    @property
    def buffer(self) -> "io.BufferedIOBase":  # type: ignore[override]
        if self._mcp_checked is None:
            self._mcp_checked = _support().CheckedBytes(self, super().buffer)
        return self._mcp_checked

    def detach(self) -> "io.BufferedIOBase":  # type: ignore[override]
        checked = self.buffer
        super().detach()
        return checked

    def reconfigure(self, **options: object) -> None:
        # Another encoding or error handler (surrogateescape) could write bytes that are not UTF-8.
        options.pop("encoding", None)
        options.pop("errors", None)
        super().reconfigure(**options)  # type: ignore[arg-type]


def _guard_streams() -> None:
    """Replace sys.stdout and sys.stderr (and their ``__`` twins) with :class:`_Stream` s."""
    codecs.register_error(ERRORS, _replace)
    for name, errors in (("stdout", ERRORS), ("stderr", "backslashreplace")):
        stream = getattr(sys, name)
        if type(stream) is not io.TextIOWrapper:  # no such stream (a closed descriptor)
            continue
        try:
            line_buffering, write_through = stream.line_buffering, stream.write_through
            stream.flush()
            guarded = _Stream(stream.detach(), "utf-8", errors, "\n", line_buffering, write_through)
        except Exception:
            continue
        _guarded.append(guarded)
        setattr(sys, name, guarded)
        setattr(sys, f"__{name}__", guarded)


def _finish_streams() -> None:
    """Write out what is pending, then say once whether anything was replaced."""
    for stream in (sys.stdout, sys.stderr, *_guarded):  # the code may have wrapped them anew
        try:
            stream.flush()
        except Exception:
            pass
    for stream in _guarded:
        try:
            if stream._mcp_checked is not None:
                stream._mcp_checked.finish()  # type: ignore[attr-defined]
        except Exception:
            pass
    if _replaced and _guarded:
        try:  # on stderr, after the output (flushed above)
            _guarded[-1].write(
                f"[{_replaced:,} character(s) or byte(s) of the output were not valid UTF-8 "
                "and were replaced with U+FFFD]\n"
            )
            _guarded[-1].flush()
        except Exception:
            pass


def _support() -> "ModuleType":
    """The support module, compiled on first use."""
    module = sys.modules.get("_mcp_support")
    if module is None:
        module = sys.modules["_mcp_support"] = type(sys)("_mcp_support")
        exec(compile(_support_source, "<mcp-support>", "exec", dont_inherit=True), module.__dict__)
        module.configure(workdir=_workdir, source=_source, hide=main.__code__.co_filename)
    return module


if __name__ == "__main__":
    main()
