"""The warm agent: the interpreter of a sandbox made ahead of time, importing before the code.

bwrap runs it in a warm sandbox (``python <this file> [--watch=a,b] <module>...``, bound read-only)
with the run's isolation and limits from the start. It imports the modules it is given and runs
the files among them (absolute paths), output sent to ``/dev/null``, writes :data:`WARM` on
stdout, then blocks reading the run's arguments from fd 5 (NUL-terminated, then the release
marker) as ``python`` would have received them: ``-c CODE [ARG...]`` or ``SCRIPT.py [ARG...]``.
It runs them as ``python`` would (a fresh ``__main__``, ``sys.argv`` and ``sys.path[0]`` set the
same way, an uncaught exception printed without this file's frame, the same exit statuses), then
ends as the interpreter's shutdown does, short of tearing the modules down (see :func:`finish`).
EOF without the marker: the sandbox was not used; it exits. The time limit starts at the write.

``python <this file> [--watch=a,b] --session <module>...`` is a session's interpreter
(:func:`serve_cells`): cell after cell in one ``__main__``, each framed on fd 5, how each ended
(and whether it imported the watched modules) said on fd 6, until fd 5 is closed. A warm agent
becomes one when handed :data:`SESSION` instead of a run's arguments.

Standard library only, nothing of the evaluator: the sandbox's Python may not be the service's.
"""

# contextlib is not loaded at interpreter startup: the agent imports only what it must.
# ruff: noqa: SIM105

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from _thread import LockType
    from types import ModuleType

WARM, RELEASE, REQUEST_FD = b"\x07", b"\xffrun\xff", 5
# A session's frames on fd 5: a kind, the payload's length (4 bytes, big-endian), the payload.
CELL, INTERRUPT = b"c", b"i"
#: Where a session's interpreter writes each cell's status (4 bytes, big-endian, signed), then the
#: watched modules not imported ahead and those of them imported since (2-byte masks each).
STATUS_FD = 6
#: The status of a cell that ended by an uncaught KeyboardInterrupt, as a shell reports SIGINT.
INTERRUPTED = 130
#: Written alone on fd 5 of a warm agent (instead of a run's arguments): it becomes a session's.
SESSION = b"\xffsession\xff"
#: Seconds between the SIGINTs of an interrupt, until the cell ends.
_INTERRUPT_EVERY = 0.25
#: A session's package layers (evaluator/layers.py): each directory below, named ``NNN-key``
#: in the order they were added, goes on ``sys.path`` before the cell that asked for it.
PACKAGES = "/opt/packages"


def warm(names: "list[str]") -> None:
    """Import ``names``, or run those that are paths (as ``__warm__``; an ``after_imports``
    they define is called after the rest), silenced (one that fails is left for the code to
    meet); then freeze what they made out of the garbage collector's reach."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    for fd in (1, 2):
        os.dup2(devnull, fd)
    files: list[dict[str, object]] = []
    try:
        compile("", "<warm>", "exec")  # the first compile() builds the AST types (~1 ms)
        # Their C code's runs end by C's exit() through ctypes (finish(), the prelude's end).
        for name in [*names, "ctypes"] if any(n[:1] != "/" for n in names) else names:
            try:
                if name.startswith("/"):
                    files.append({"__file__": name, "__name__": "__warm__"})
                    with open(name, "rb") as file:
                        exec(compile(file.read(), name, "exec"), files[-1])
                    continue
                if name.split(".")[0] == "matplotlib" and "matplotlib" not in sys.modules:
                    # No display: a headless interpreter's backend, before pyplot seeks one.
                    __import__("matplotlib").use("Agg")
                __import__(name)
            except BaseException:
                pass
        for scope in files:  # what a file changed for the imports after it, undone
            scope.get("after_imports", lambda: None)()  # type: ignore[operator]
        # A cell's full collection then skips all they made (44 ms with pandas). Not collected
        # first: the imports' collections left a dozen objects, not worth 40 ms.
        __import__("gc").freeze()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, devnull):
            os.close(fd)


def request() -> "list[str] | bytes | None":
    """The run's arguments; :data:`SESSION` when the sandbox becomes a session's (see
    :func:`serve_cells`); ``None`` when it is not used."""
    # The marker is one write under PIPE_BUF, read whole; a session's first cell may follow it.
    first = os.read(REQUEST_FD, len(SESSION))
    if first == SESSION:
        return SESSION
    chunks = [first]
    while first and (chunk := os.read(REQUEST_FD, 65536)):
        chunks.append(chunk)
    os.close(REQUEST_FD)
    if not (data := b"".join(chunks)).endswith(RELEASE):
        return None
    return [os.fsdecode(arg) for arg in data[: -len(RELEASE)].split(b"\0")[:-1]]


def run(args: "list[str]") -> "tuple[int, ModuleType]":
    """Run ``args`` as ``python ARGS`` would, in a fresh ``__main__``: the exit status (-2:
    "killed by SIGINT", an uncaught KeyboardInterrupt) and the ``__main__`` module."""
    import builtins
    from importlib.machinery import BuiltinImporter, SourceFileLoader

    main = type(sys)("__main__")
    # What python gives its __main__: the loader of -c code is the built-in importer.
    main.__dict__.update(__builtins__=builtins, __annotations__={}, __loader__=BuiltinImporter)
    if args[0] != "-c":
        filename = os.path.abspath(args[0])  # as _load names it
        loader = SourceFileLoader("__main__", filename)
        main.__dict__.update(__file__=filename, __cached__=None, __loader__=loader)
    return _run_cell(args, main, -2), main  # with its own layers, if any (none imported yet)


def exit_status(code: object) -> int:
    """The status ``raise SystemExit(code)`` gives, its message printed as python prints it."""
    if code is None or isinstance(code, int):  # as python's exit status: -1 is 255
        return 0 if code is None else int.__and__(code, 0xFF)
    try:
        sys.stderr.write(f"{code}\n")
    except Exception:
        pass
    return 1


def finish(status: int, main: "ModuleType") -> None:
    """End as the interpreter's shutdown would, without tearing the imported modules down:
    python waits for the non-daemon threads, runs the atexit functions and flushes the standard
    streams, then frees every module, which takes hundreds of milliseconds once pandas and
    matplotlib are loaded. The code's own objects are freed (their files flushed and closed) by
    clearing its ``__main__``; the modules are left to the kernel."""
    shutdown = getattr(sys.modules.get("threading"), "_shutdown", None)
    if shutdown is not None:
        try:
            shutdown()
        except BaseException:
            pass
    __import__("atexit")._run_exitfuncs()
    try:
        main.__dict__.clear()
    except BaseException:
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            status = 120 if status == 0 else status  # python's status when stdout cannot flush
    if status == -2:
        signal = __import__("signal")
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    try:  # C's exit() where ctypes is: C code's stdio buffers, exit handlers (no Python runs on:
        sys.modules["ctypes"].PyDLL(None).exit(status & 0xFF)  # PyDLL holds the GIL)
    except BaseException:
        pass
    os._exit(status & 0xFF)


def serve_cells(watched: "list[str]", unloaded: int) -> None:
    """Run cells in one ``__main__`` until fd 5 is closed; then exit.

    A thread reads fd 5 and hands each cell to the main thread, which runs it as :func:`run`
    would (``sys.exit()`` ends the cell, not the interpreter) and writes its status on fd 6. An
    interrupt is a SIGINT to the main thread: even a ``time.sleep`` ends in KeyboardInterrupt.
    ``sys._mcp_session`` tells the prelude it runs in a session (it keeps the namespace).
    """
    import _queue
    import _signal as signal  # type: ignore[import-not-found]  # C half: no enum (~10 ms)
    import _thread
    import time

    signal.signal(signal.SIGINT, _between_cells)  # interrupts are for cells, set for each
    main = type(sys)("__main__")
    sys._mcp_session = True  # type: ignore[attr-defined]
    cells: _queue.SimpleQueue[bytes] = _queue.SimpleQueue()
    guard = _thread.allocate_lock()
    # Cells handed over and not started yet (an interrupt that comes first waits for one).
    pending, running, interrupted = [0], [False], [False]
    main_thread, agent = _thread.get_ident(), os.getpid()

    def read_frames() -> None:
        while True:
            head = _read_exact(5)
            payload = _read_exact(int.from_bytes(head[1:], "big")) if head else None
            if head is None or payload is None:
                break
            if head[:1] == CELL:
                with guard:
                    pending[0] += 1
                cells.put(payload)
            elif head[:1] == INTERRUPT:
                # Again until the cell ends: code (or os.fork's callbacks) may swallow one
                # KeyboardInterrupt; the service kills the interpreter after its grace.
                while True:
                    with guard:
                        if not running[0] and not pending[0]:
                            break
                        interrupted[0] = True
                        if running[0]:
                            signal.pthread_kill(main_thread, signal.SIGINT)
                    time.sleep(_INTERRUPT_EVERY)
        cells.put(b"")  # EOF: the session is over

    _thread.start_new_thread(read_frames, ())
    os.register_at_fork(before=_quiet_fork_warning)
    while True:
        payload = cells.get()
        if not payload:
            os._exit(0)
        args = [os.fsdecode(arg) for arg in payload.split(b"\0")[:-1]]
        status: int | None = None
        with guard:  # SIGINT is still the no-op's: nothing can skip this
            pending[0] -= 1
            running[0] = True
        try:
            try:  # from here on, an interrupt is the cell's
                signal.signal(signal.SIGINT, signal.default_int_handler)
                if interrupted[0]:  # asked for before it started
                    raise KeyboardInterrupt
                status = _run_cell(args, main)
            finally:  # a SIGINT sent as the cell ended meets the no-op, not python's handler
                signal.signal(signal.SIGINT, _between_cells)
        except KeyboardInterrupt:
            pass
        if os.getpid() != agent:  # a child the cell forked, at the cell's end: it ends there
            os._exit(INTERRUPTED if status is None else status)
        status = _end_cell(signal, guard, (running, interrupted), status)
        used = unloaded & sum(1 << i for i, name in enumerate(watched) if name in sys.modules)
        said = status.to_bytes(4, "big", signed=True) + (unloaded << 16 | used).to_bytes(4, "big")
        os.write(STATUS_FD, said)


def _end_cell(
    signal: "ModuleType", guard: "LockType", flags: "tuple[list[bool], ...]", status: "int | None"
) -> int:
    """After a cell: no more interrupts; if it was interrupted (at the time limit), what it
    started goes too (a fork bomb): SIGKILL to every other process of the sandbox but its init
    (kill(-1) spares those two), this one's children reaped; streams flushed. Its status: one
    ended before its code ran (``None``) is INTERRUPTED, said in one line."""
    import time

    running, interrupted = flags
    while True:  # should the cell's own switch have met a KeyboardInterrupt: again
        try:
            signal.signal(signal.SIGINT, _between_cells)
            with guard:
                running[0] = False
            break
        except KeyboardInterrupt:
            pass
    if interrupted[0]:
        interrupted[0] = False
        try:
            os.kill(-1, 9)  # SIGKILL
        except OSError:
            pass
        deadline = time.monotonic() + 1.0  # SIGKILL lands at once; a zombie is reaped here
        while time.monotonic() < deadline:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                time.sleep(0.01)
    if status is None:  # no traceback of the code says so
        try:
            sys.stderr.write("KeyboardInterrupt\n")
        except Exception:  # the code's own stderr, or none
            pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    return INTERRUPTED if status is None else status


def _between_cells(signum: int, frame: object) -> None:
    """SIGINT between cells: nothing (SIG_IGN would print "Signal 2 ignored due to race")."""


def _quiet_fork_warning() -> None:
    """Before a cell's first fork: no DeprecationWarning (3.12+) that the process is
    multi-threaded, for the agent's own thread (it holds no lock a child could need); from then
    on not for the code's threads either, which the filter cannot tell apart."""
    import warnings

    if not getattr(_quiet_fork_warning, "done", False):
        _quiet_fork_warning.done = True  # type: ignore[attr-defined]
        message = r"This process \(pid=\d+\) is multi-threaded"
        warnings.filterwarnings("ignore", message, DeprecationWarning)


def _read_exact(size: int) -> "bytes | None":
    """``size`` bytes from fd 5, or ``None`` at EOF first."""
    data = b""
    while len(data) < size and (chunk := os.read(REQUEST_FD, size - len(data))):
        data += chunk
    return data if len(data) == size else None


def _load(args: "list[str]") -> "tuple[str | bytes, str] | None":
    """The source and file name ``args`` run (``-c CODE`` or a script), ``sys.argv`` and
    ``sys.path[0]`` set as python sets them; ``None`` when the script cannot be read (said on
    stderr, as python says it, whose status is then 2)."""
    if args[0] == "-c":
        sys.argv[:] = ["-c", *args[2:]]
        sys.path[0] = ""
        return args[1], "<string>"
    filename = os.path.abspath(args[0])
    sys.argv[:] = list(args)
    sys.path[0] = os.path.dirname(filename)
    try:
        with open(args[0], "rb") as file:
            return file.read(), filename
    except OSError as exc:
        sys.stderr.write(f"{sys.executable}: can't open file {args[0]!r}: {exc}\n")
        return None


def add_packages() -> None:
    """Put the layers added since the last cell on ``sys.path``, the newest first (after the
    script's directory, before the standard library, as ``PYTHONPATH`` would); a module the
    interpreter imported before from elsewhere keeps its first version, said on stderr."""
    try:
        names = sorted(os.listdir(PACKAGES))
    except OSError:
        return
    added = [f"{PACKAGES}/{name}" for name in names if not name.startswith(".")]
    added = [path for path in added if path not in sys.path]
    for path in added:
        sys.path.insert(1, path)
        try:
            provided = {entry.split(".")[0] for entry in os.listdir(path)}
        except OSError:
            continue
        # One from an earlier layer is the same version (the session's sets are resolved to
        # keep what it has); one from elsewhere (the environment) may not be.
        kept = sorted(
            name
            for name in provided
            if name in sys.modules
            and not str(getattr(sys.modules[name], "__file__", "") or "").startswith(PACKAGES)
        )
        if kept:
            sys.stderr.write(
                f"note: {', '.join(kept)} was imported in this session before this call added "
                "its package; the interpreter keeps what it imported first (a new session "
                "imports the added version)\n"
            )
    if added:
        __import__("importlib").invalidate_caches()


def _run_cell(args: "list[str]", main: "ModuleType", interrupted: int = INTERRUPTED) -> int:
    """One cell (or a run): ``args`` run in ``main``; its status (``interrupted`` for an
    uncaught KeyboardInterrupt), an uncaught exception printed as python prints it."""
    import builtins

    add_packages()
    if not main.__dict__:
        main.__dict__.update(__builtins__=builtins, __annotations__={})
    loaded = _load(args)
    if loaded is None:
        return 2
    source, filename = loaded
    sys.modules["__main__"] = main
    try:
        exec(compile(source, filename, "exec", dont_inherit=True), main.__dict__)
    except SystemExit as exc:
        return exit_status(exc.code)
    except BaseException as exc:
        # Without this function's frame, as python prints an uncaught exception of a script.
        tb = exc.__traceback__
        exc.__traceback__ = tb.tb_next if tb is not None else None
        sys.excepthook(type(exc), exc, exc.__traceback__)
        return interrupted if isinstance(exc, KeyboardInterrupt) else 1
    return 0


if __name__ == "__main__":
    argv = sys.argv[1:]
    watched = argv.pop(0)[8:].split(",")[:16] if argv[:1] and argv[0][:8] == "--watch=" else []
    session = argv[:1] == ["--session"]
    warm(argv[1:] if session else argv)
    unloaded = sum(1 << i for i, name in enumerate(watched) if name not in sys.modules)
    os.write(1, WARM)
    if (arguments := SESSION if session else request()) == SESSION:
        serve_cells(watched, unloaded)
    if not isinstance(arguments, list):
        os._exit(0)
    os.closerange(STATUS_FD, STATUS_FD + 1)  # a run: the code gets no descriptor of the service's
    finish(*run(arguments))
