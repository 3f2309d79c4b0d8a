"""What the prelude needs only sometimes: tracebacks, import hooks, figures, files, bytes.

It travels in the prelude's bundle, compiled by the gateway (or as source, for an interpreter
with another bytecode format), and the prelude makes it the module ``_mcp_support`` the first
time a run needs it: an uncaught exception, a syntax error, the user's code importing matplotlib
or ``linecache`` or using ``sys.stdout.buffer``, files in the working directory, or an
interpreter that imported matplotlib or ``linecache`` before the prelude ran (see :func:`start`).
Standard-library only; matplotlib is imported only here, and only once something else did.

Figures: the backend defined here draws with Agg; ``plt.show()`` saves every open figure and
closes it, ``Figure.show()`` saves and closes that figure, and the prelude has whatever is still
open at the end saved too. Each becomes ``figure_001.png``, ``figure_002.png``, ... in the working
directory, in drawing order, skipping names that already exist (a file the user saved is never
overwritten), at :data:`FIGURE_DPI`, lowered so that no side exceeds :data:`FIGURE_MAX_PIXELS`.
A figure is drawn under its name plus :data:`PARTIAL_SUFFIX` and takes its name only once
complete, so a run killed while saving one leaves ``figure_NNN.png.part``, never a truncated PNG
under a figure's name. A figure that cannot be saved is reported in one line on stderr; nothing
else changes.

Files: at the end of a run that left files, :data:`MANIFEST_NAME` lists the files the evaluator
should return (see :func:`write_manifest`), so that the gateway can name those it did not return.

The module has no side effects on import: the gateway imports it for its constants.
"""

# contextlib is not loaded at interpreter startup; importing it would cost a failing run.
# ruff: noqa: SIM105

import codecs
import io
import os
import stat
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence
    from importlib.abc import Loader
    from importlib.machinery import ModuleSpec
    from types import CodeType, ModuleType, TracebackType
    from typing import NoReturn

    from matplotlib.backend_bases import FigureManagerBase
    from matplotlib.figure import Figure
else:
    Loader = object  # importlib.abc may not be loaded: the type matters to mypy only

#: Captured figures are ``FIGURE_PREFIX + "%03d" % n + FIGURE_SUFFIX``, n = 1, 2, ...
FIGURE_PREFIX = "figure_"
FIGURE_SUFFIX = ".png"
#: Resolution of captured figures; lowered so that neither side exceeds FIGURE_MAX_PIXELS.
FIGURE_DPI = 100
FIGURE_MAX_PIXELS = 2000
#: The in-memory backend: ``matplotlib.use("module://_mcp_backend")``.
BACKEND_MODULE = "_mcp_backend"
#: The file name of the user's code (in tracebacks and linecache).
CODE_FILENAME = "<string>"
#: What a figure is called while it is being saved.
PARTIAL_SUFFIX = ".part"
#: The manifest: a name Snekbox returns (no leading ``_`` or ``.``) and that sorts before any
#: ordinary name, so that an evaluator returning files in path order returns it first.
MANIFEST_NAME = "!mcp-manifest"
#: The manifest's first line, then one ``<size> <path>\0`` record per file, in path order,
#: then one ``- <path>\0`` per file that was there when the code started and is gone.
MANIFEST_HEADER = b"mcp-manifest 1 %d %d\n"  # files found, 1 if the walk saw everything
MANIFEST_MAX_BYTES = 64 * 1024
# Bounds of the walk over the working directory: entries examined, directory levels.
_WALK_ENTRIES = 10_000
_WALK_DEPTH = 100

# Set by configure(): where figures go, the user's source, the prelude's frame to hide, its
# guarded streams. Then how many figures were created and how many names were taken, and how many
# characters or bytes of the output had to be replaced.
_workdir = "."
_source = b""
_hide: "tuple[CodeType, ...]" = ()
_streams: "Sequence[io.TextIOWrapper]" = ()
_figures_created = 0
_figures_saved = 0
_replaced = 0
# Whether the code ended with an uncaught KeyboardInterrupt; whether it is a session's cell.
_interrupted = False
_session = False
# Files that were in the working directory before the code ran: path -> mtime (ns).
_inputs: "dict[str, int]" = {}


def configure(
    *,
    workdir: str,
    source: bytes,
    hide: "tuple[CodeType, ...]",
    streams: "Sequence[io.TextIOWrapper]" = (),
    session: bool = False,
) -> None:
    """Called by the prelude once this module is loaded.

    Args:
        workdir: The run's working directory, where figures are saved.
        source: The user's code, for ``linecache``.
        hide: The code of the prelude's functions that run the user's (and show its last
            value): their frames are dropped from the head of tracebacks (whatever their file
            name: compiled by the gateway, or from source).
        streams: The prelude's guarded ``sys.stdout`` and ``sys.stderr`` (see
            :func:`finish_streams`).
        session: The code is a cell of a session: called again for each cell, which starts
            afresh (its note, its interruption), and an interrupted cell ends the cell only.
    """
    global _workdir, _source, _hide, _streams, _session, _replaced, _interrupted
    _workdir, _source, _hide, _streams = workdir, source, hide, streams
    _session, _replaced, _interrupted = session, 0, False


def start() -> None:
    """Called by the prelude, before the code runs, when one of these needs doing.

    Files in the working directory were sent in: they are remembered, so that the manifest
    leaves out those the code leaves alone. Modules loaded before the prelude ran, so that its
    import hooks never see them: ``linecache`` learns the user's source, and matplotlib gets
    the capturing backend (see :func:`adopt_matplotlib`).
    """
    note_inputs()
    if "linecache" in sys.modules:
        register_source(sys.modules["linecache"])
    if "matplotlib" in sys.modules:
        adopt_matplotlib()


def finish() -> None:
    """Called by the prelude once the code has run, when something is left to do.

    Figures pyplot still holds open are saved, the manifest is written, the streams are
    flushed and what ``sys.stdout.buffer`` still holds written out, followed by the note on
    what had to be replaced; after a KeyboardInterrupt, the run ends by SIGINT.
    """
    capture_open_figures()
    if _inputs or _has_files():  # files sent in may all be gone: the manifest says so
        write_manifest()
    for stream in (sys.stdout, sys.stderr, *_streams):  # the code may have rebound them
        _flush(stream)
    finish_streams()
    if _interrupted and not _session:
        die_of_sigint()


def _has_files() -> bool:
    try:
        return any(not name.startswith(".") for name in os.listdir(_workdir))
    except OSError:
        return False


# --- tracebacks ------------------------------------------------------------------------------


def report_uncaught(exc: BaseException) -> int:
    """Print an exception that escaped the user's code as ``python`` would; the exit status, 1.

    The prelude's leading frames are dropped from ``exc`` and from every exception chained to
    it. A ``sys.excepthook`` the user installed is called instead. After a KeyboardInterrupt,
    :func:`finish` ends the run as python would, by SIGINT.
    """
    global _interrupted
    _interrupted = isinstance(exc, KeyboardInterrupt)
    _trim_tracebacks(exc, _hide)
    if "linecache" in sys.modules:  # the user's code may have cleared its cache
        register_source(sys.modules["linecache"])
    sys.last_type, sys.last_value, sys.last_traceback = type(exc), exc, exc.__traceback__
    if sys.version_info >= (3, 12):
        sys.last_exc = exc
    if sys.excepthook is not sys.__excepthook__:
        _flush_stdout()
        try:
            sys.excepthook(type(exc), exc, exc.__traceback__)
            return 1
        except BaseException:
            pass
    _print_exception(exc)
    return 1


def die_of_sigint() -> "NoReturn":
    """End like ``python`` after an uncaught KeyboardInterrupt: atexit handlers, then SIGINT."""
    import atexit
    import signal

    atexit._run_exitfuncs()
    _flush_stdout()
    _flush(sys.stderr)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)
    os._exit(128 + signal.SIGINT)  # only if the signal did not end the process


def _print_exception(exc: BaseException) -> None:
    # stdout and stderr share one pipe in the sandbox: whatever the user printed goes first.
    _flush_stdout()
    try:
        # The interpreter's own printer (before 3.13) reads source lines from files, not from
        # linecache (where the prelude puts the user's source), so it would show none.
        import traceback

        traceback.print_exception(exc)
    except BaseException:
        sys.__excepthook__(type(exc), exc, exc.__traceback__)
    _flush(sys.stderr)


def _trim_tracebacks(exc: BaseException, hide: "tuple[CodeType, ...]") -> None:
    seen: set[int] = set()
    pending = [exc]
    while pending:
        e = pending.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        tb: TracebackType | None = e.__traceback__
        while tb is not None and tb.tb_frame.f_code in hide:
            tb = tb.tb_next
        e.__traceback__ = tb
        pending.extend(x for x in (e.__cause__, e.__context__) if x is not None)
        if isinstance(e, BaseExceptionGroup):
            pending.extend(e.exceptions)


def register_source(linecache: "ModuleType") -> None:
    """Put the user's source in ``linecache`` so tracebacks, warnings and inspect show it."""
    text = _source.decode("utf-8", "replace").removeprefix("\ufeff")
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    # mtime None: checkcache() keeps the entry (no such file exists on disk).
    linecache.cache[CODE_FILENAME] = (len(_source), None, lines, CODE_FILENAME)


def _flush_stdout() -> None:
    _flush(sys.stdout)


def _flush(stream: object) -> None:
    try:
        stream.flush()  # type: ignore[attr-defined]
    except Exception:
        pass


# --- import hooks ----------------------------------------------------------------------------


def find_spec(
    finder: object, fullname: str, path: "Sequence[str] | None", target: "ModuleType | None"
) -> "ModuleSpec | None":
    """The prelude's ``sys.meta_path`` finder, for the names it watches.

    * ``_mcp_backend``: the figure-capturing backend, built in memory;
    * ``matplotlib``: once loaded, that backend becomes its default, before anything could
      resolve the default to another backend (unless the user chose one: ``MPLBACKEND``);
    * ``matplotlib.pyplot``: just before it loads, the same again (it overrides the user's
      ``matplotlib.use("Agg")``, the usual way of saying "there is no display"), and once
      loaded, a later switch to Agg is a switch to that backend (see :func:`_guard_agg`);
    * ``linecache``: once loaded, it learns the user's source.

    What was imported before the prelude ran gets the same from :func:`adopt_matplotlib` and
    the prelude's own call of :func:`register_source`.
    """
    if fullname == BACKEND_MODULE:
        from importlib.machinery import ModuleSpec

        return ModuleSpec(fullname, _BackendLoader(), origin="<mcp>")
    if fullname == "matplotlib":
        return _spec_then(finder, fullname, path, target, _select_backend)
    if fullname == "matplotlib.pyplot":
        _select_backend(sys.modules.get("matplotlib"))
        return _spec_then(finder, fullname, path, target, _guard_agg)
    if fullname == "linecache":
        return _spec_then(finder, fullname, path, target, register_source)
    return None


def adopt_matplotlib() -> None:
    """What the import hooks would have done, for a matplotlib imported before the prelude ran.

    An interpreter kept warm imports matplotlib (and pyplot, after ``matplotlib.use("Agg")``)
    before it is given the run: the capturing backend becomes the default as if the hooks had
    seen those imports, and a pyplot that already resolved its backend switches to it (it has
    no figure yet: the code has not run).
    """
    matplotlib = sys.modules.get("matplotlib")
    _select_backend(matplotlib)
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is None:
        return  # the hook on its import will do the rest
    _guard_agg(pyplot)
    backend = "module://" + BACKEND_MODULE
    try:
        rc = getattr(matplotlib, "rcParams", None)
        if pyplot._backend_mod is not None and rc is not None and rc._get("backend") == backend:
            pyplot.switch_backend(backend)
    except Exception:  # then figures are still saved when the run ends
        pass


def _spec_then(
    finder: object,
    fullname: str,
    path: "Sequence[str] | None",
    target: "ModuleType | None",
    hook: "Callable[[ModuleType], None]",
) -> "ModuleSpec | None":
    """The spec the other finders give, with ``hook(module)`` run after loading it."""
    for other in sys.meta_path:
        other_find_spec = getattr(other, "find_spec", None)
        if other is finder or other_find_spec is None:
            continue
        spec: ModuleSpec | None = other_find_spec(fullname, path, target)
        if spec is not None:
            if spec.loader is not None:
                spec.loader = _LoaderThen(spec.loader, hook)
            return spec
    return None


class _LoaderThen(Loader):
    """Delegates to ``loader``, runs ``hook`` after ``exec_module``, then steps aside."""

    def __init__(self, loader: "Loader", hook: "Callable[[ModuleType], None]") -> None:
        self._loader = loader
        self._hook = hook

    def create_module(self, spec: "ModuleSpec") -> "ModuleType | None":
        return self._loader.create_module(spec)

    def exec_module(self, module: "ModuleType") -> None:
        self._loader.exec_module(module)
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        try:
            self._hook(module)
        except Exception:  # a hook must never break the user's import
            pass

    def __getattr__(self, name: str) -> object:
        return getattr(self._loader, name)


class _BackendLoader(Loader):
    def create_module(self, spec: "ModuleSpec") -> None:
        return None

    def exec_module(self, module: "ModuleType") -> None:
        define_backend(module)


def _select_backend(matplotlib: "ModuleType | None") -> None:
    """Make the capturing backend matplotlib's unless the user chose another one than Agg."""
    rc = getattr(matplotlib, "rcParams", None)
    if rc is None:
        return
    try:
        current = rc._get("backend")  # read without triggering the default's resolution
        # Not a str: the "auto" sentinel. Agg is what scripts pick to say "no display".
        if not isinstance(current, str) or current.lower() == "agg":
            rc["backend"] = "module://" + BACKEND_MODULE
    except Exception:  # then pyplot picks a backend itself; open figures are saved at exit
        pass


def _guard_agg(pyplot: "ModuleType") -> None:
    """Make pyplot's switches to Agg switches to the capturing backend.

    ``matplotlib.use("Agg")`` once pyplot is loaded, or a backend set to Agg and resolved on the
    first figure, both go through ``pyplot.switch_backend()``: Agg there is also what scripts
    pick to say "there is no display", and the capturing backend draws with Agg. Any other
    backend is the user's choice, and switched to.
    """
    switch = pyplot.switch_backend
    if getattr(switch, "_mcp_guard", False):
        return

    def switch_backend(newbackend: str) -> None:
        if isinstance(newbackend, str) and newbackend.lower() == "agg":
            newbackend = "module://" + BACKEND_MODULE
        switch(newbackend)

    switch_backend._mcp_guard = True  # type: ignore[attr-defined]
    switch_backend.__wrapped__ = switch  # type: ignore[attr-defined]
    for name in ("__name__", "__qualname__", "__doc__", "__module__"):
        setattr(switch_backend, name, getattr(switch, name, None))
    setattr(pyplot, "switch_backend", switch_backend)  # noqa: B010 (a module's, untyped)


# --- the backend -----------------------------------------------------------------------------


def define_backend(module: "ModuleType") -> None:
    """Fill a backend module: Agg canvases whose ``show()`` captures figures as PNG files."""
    from matplotlib.backend_bases import FigureCanvasBase, FigureManagerBase
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    class FigureManager(FigureManagerBase):
        def __init__(self, canvas: FigureCanvasBase, num: int | str) -> None:
            global _figures_created
            super().__init__(canvas, num)
            _figures_created += 1
            self.mcp_draw_order = _figures_created

        def show(self) -> None:  # Figure.show()
            _capture([self])

        @classmethod
        def pyplot_show(cls, *, block: bool | None = None) -> None:  # pyplot.show()
            capture_open_figures()

    class FigureCanvas(FigureCanvasAgg):
        manager_class = FigureManager

    module.__dict__.update(FigureCanvas=FigureCanvas, FigureManager=FigureManager)


# --- figures ---------------------------------------------------------------------------------


def capture_open_figures() -> None:
    """Save and close every figure pyplot holds open, in drawing order."""
    if "matplotlib._pylab_helpers" not in sys.modules:
        return  # pyplot was never imported: no figure, and nothing to import
    try:
        from matplotlib._pylab_helpers import Gcf

        managers = Gcf.get_all_fig_managers()
    except Exception as exc:
        _note(f"figures could not be listed: {type(exc).__name__}: {exc}")
        return
    _capture(managers)


def _capture(managers: "Iterable[FigureManagerBase]") -> None:
    from matplotlib._pylab_helpers import Gcf

    for manager in sorted(managers, key=_drawing_order):
        try:
            _save_figure(manager.canvas.figure)
        except Exception as exc:
            _note(f"figure {manager.num} could not be saved: {type(exc).__name__}: {exc}")
        try:
            Gcf.destroy(manager)
        except Exception:
            pass


def _drawing_order(manager: "FigureManagerBase") -> tuple[int, int]:
    # Our managers count their creation; another backend's fall back to the figure number
    # (pyplot's own order is by last activation, not by creation).
    order = getattr(manager, "mcp_draw_order", None)
    if isinstance(order, int):
        return (0, order)
    return (1, manager.num if isinstance(manager.num, int) else sys.maxsize)


def _save_figure(figure: "Figure") -> None:
    global _figures_saved
    width, height = figure.get_size_inches()
    longest = max(float(width), float(height))
    dpi = float(FIGURE_DPI)
    if longest * dpi > FIGURE_MAX_PIXELS:
        dpi = FIGURE_MAX_PIXELS / longest
    while True:  # the next number free under both names: a file the user saved is never overwritten
        _figures_saved += 1
        path = os.path.join(_workdir, f"{FIGURE_PREFIX}{_figures_saved:03d}{FIGURE_SUFFIX}")
        if os.path.lexists(path):
            continue
        try:
            out = open(path + PARTIAL_SUFFIX, "xb")  # noqa: SIM115 (closed below)
        except FileExistsError:
            continue
        break
    try:
        with out:
            figure.savefig(out, format="png", dpi=dpi)
        # A link fails if the name was taken meanwhile (by a thread of the user's), where a
        # rename would replace that file.
        os.link(path + PARTIAL_SUFFIX, path)
    except BaseException:
        try:
            os.remove(path + PARTIAL_SUFFIX)
            _figures_saved -= 1  # the name is free again: no gap in the numbering
        except OSError:
            pass
        raise
    try:
        os.remove(path + PARTIAL_SUFFIX)
    except OSError:  # the figure is saved; the gateway ignores a partial beside its figure
        pass


def _note(message: str) -> None:
    _flush_stdout()
    try:
        sys.stderr.write(f"[{message}]\n")
    except Exception:
        pass
    _flush(sys.stderr)


# --- output -----------------------------------------------------------------------------------


def replace(error: UnicodeError) -> tuple[str | bytes, int]:
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


def finish_streams() -> None:
    """At the end of the run, once the streams are flushed: what ``buffer`` still holds, then
    the note, on stderr, saying once whether anything had to be replaced."""
    for stream in _streams:
        try:
            checked = stream.__dict__.get("_mcp_checked")
            if checked is not None:
                checked.finish()
        except Exception:
            pass
    if _replaced and _streams:
        try:  # after the output (flushed by the prelude)
            _streams[-1].write(
                f"[{_replaced:,} character(s) or byte(s) of the output were not valid UTF-8 "
                "and were replaced with U+FFFD]\n"
            )
            _streams[-1].flush()
        except Exception:
            pass


def buffer(stream: "io.TextIOWrapper") -> "CheckedBytes":
    """The prelude's guarded stream's ``buffer``: a :class:`CheckedBytes` made on first use."""
    checked: CheckedBytes | None = stream.__dict__.get("_mcp_checked")
    if checked is None:
        binary = io.TextIOWrapper.buffer.__get__(stream)  # the stream's own, under the property
        checked = stream.__dict__["_mcp_checked"] = CheckedBytes(stream, binary)
    return checked


def detach(stream: "io.TextIOWrapper") -> "CheckedBytes":
    """The prelude's guarded stream's ``detach()``: its ``buffer``, which stays guarded."""
    checked = buffer(stream)
    io.TextIOWrapper.detach(stream)
    return checked


class CheckedBytes(io.BufferedIOBase):
    """``sys.stdout.buffer`` (or stderr's): bytes that are not UTF-8 are replaced on the way.

    They are decoded with the text stream's error handler (which counts what it replaces for the
    prelude's note) and written, re-encoded, to the real binary stream, after whatever the text
    stream still holds. A character split over two writes waits for its end; :meth:`finish`
    writes out what is left at the end of the run.
    """

    def __init__(
        self, text: "io.TextIOWrapper", target: "io.RawIOBase | io.BufferedIOBase"
    ) -> None:
        super().__init__()
        self._text = text
        self._target = target
        self._decoder = codecs.getincrementaldecoder("utf-8")(text.errors or "strict")

    def write(self, data: "bytes | bytearray | memoryview") -> int:  # type: ignore[override]
        if self.closed:
            raise ValueError("write to closed file")
        raw = bytes(data)
        self._write(self._decoder.decode(raw))
        return len(raw)

    def finish(self) -> None:
        self._write(self._decoder.decode(b"", final=True))
        self.flush()

    def _write(self, text: str) -> None:
        if not text:
            return
        try:
            self._text.flush()
        except ValueError:  # the code detached or closed the text stream
            pass
        view = memoryview(text.encode("utf-8"))
        while view:  # an unbuffered stream may take only part of a write
            written = self._target.write(view)
            view = view[written if written is not None else 0 :]

    def flush(self) -> None:
        if not self.closed:
            self._target.flush()

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._target.fileno()

    def isatty(self) -> bool:
        return self._target.isatty()

    @property
    def name(self) -> object:
        return getattr(self._target, "name", None)

    @property
    def mode(self) -> str:
        return "wb"


# --- the manifest -----------------------------------------------------------------------------


def note_inputs() -> None:
    """Remember the files sent in, which Snekbox does not return unless the code changes them."""
    global _inputs
    found, _ = _walk()
    _inputs = {path: mtime for path, _, mtime in found}


def write_manifest() -> None:
    """List the files the evaluator should return, with their sizes, in :data:`MANIFEST_NAME`.

    The rules are Snekbox's: regular files, not symlinks, no name starting with ``_`` and nothing
    under a name starting with ``.``; files sent in and left unchanged are left out. The walk is
    bounded (:data:`_WALK_ENTRIES`, :data:`_WALK_DEPTH`) and says whether it saw everything; the
    list is cut at :data:`MANIFEST_MAX_BYTES`, the count still covering every file found. Inputs
    now gone follow (the gateway forgets them). A failure writes nothing.
    """
    try:
        found, complete = _walk()
        files = sorted(
            (path, size)
            for path, size, mtime in found
            if path != MANIFEST_NAME and _inputs.get(path) != mtime
        )
        there = {path for path, _, _ in found}
        # Only names the gateway can have kept: a name that is not UTF-8 never came back.
        gone = [
            p
            for p in sorted(set(_inputs) - there - {MANIFEST_NAME})
            if complete and os.fsencode(p) == p.encode("utf-8", "replace")
        ]
        if not files and not gone:
            return
        header = MANIFEST_HEADER % (len(files), complete)
        room = MANIFEST_MAX_BYTES - len(header)
        # The files gone first: the gateway forgets them, where the list only names files.
        removed = _fitting([b"- %s\0" % os.fsencode(path) for path in gone], room)
        room -= sum(map(len, removed))
        listed = _fitting([b"%d %s\0" % (size, os.fsencode(path)) for path, size in files], room)
        records = listed + removed
        with open(os.path.join(_workdir, MANIFEST_NAME), "wb") as out:
            out.write(header + b"".join(records))
    except Exception:
        pass


def _fitting(records: "list[bytes]", room: int) -> "list[bytes]":
    kept = []
    for record in records:
        room -= len(record)
        if room < 0:
            break
        kept.append(record)
    return kept


def _walk() -> "tuple[list[tuple[str, int, int]], bool]":
    """``(path, size, mtime_ns)`` of the files Snekbox would return; whether all were seen."""
    found: list[tuple[str, int, int]] = []
    budget = [_WALK_ENTRIES]
    fd = os.open(_workdir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        complete = _walk_directory(fd, "", 0, found, budget)
    finally:
        os.close(fd)
    return found, complete


def _walk_directory(
    fd: int, prefix: str, depth: int, found: "list[tuple[str, int, int]]", budget: "list[int]"
) -> bool:
    # By descriptor, never by path: a deep tree's paths are longer than the kernel accepts.
    complete = True
    with os.scandir(fd) as entries:
        for entry in entries:
            budget[0] -= 1
            if budget[0] < 0:
                return False
            name = entry.name
            if name.startswith("."):
                continue
            try:
                info = entry.stat(follow_symlinks=False)
                if stat.S_ISDIR(info.st_mode):
                    if depth >= _WALK_DEPTH:
                        complete = False
                        continue
                    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
                    sub = os.open(name, flags, dir_fd=fd)
                    try:
                        seen = _walk_directory(sub, f"{prefix}{name}/", depth + 1, found, budget)
                    finally:
                        os.close(sub)
                    complete = complete and seen
                elif stat.S_ISREG(info.st_mode) and not name.startswith("_"):
                    found.append((prefix + name, info.st_size, info.st_mtime_ns))
            except OSError:
                complete = False
    return complete
