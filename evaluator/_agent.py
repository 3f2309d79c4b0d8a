"""The warm agent: the interpreter of a sandbox made ahead of time, importing before the code.

It is the command bwrap runs in a warm sandbox (``python <this file> <module>...``, the file
bound read-only), with the run's isolation and limits from the start. It imports the modules it
is given, its output sent to ``/dev/null`` (what they print is not the run's), writes
:data:`WARM` on stdout, then blocks reading the run's arguments from fd 5 (NUL-terminated, then
the release marker) as ``python`` would have received them: ``-c CODE [ARG...]`` or
``SCRIPT.py [ARG...]``. It runs them as ``python`` would: a fresh ``__main__``, ``sys.argv``
and ``sys.path[0]`` set the same way, an uncaught exception printed without this file's frame,
the same exit statuses; then it ends as the interpreter's shutdown does, short of tearing the
modules down (see :func:`finish`). EOF without the marker: the sandbox was not used, and it
exits at once. The time limit starts when the arguments are written.

Standard library only, and nothing of the evaluator: the sandbox's interpreter may be another
Python than the service's.
"""

# contextlib is not loaded at interpreter startup: the agent imports only what it must.
# ruff: noqa: SIM105

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import ModuleType

WARM = b"\x07"
RELEASE = b"\xffrun\xff"
REQUEST_FD = 5


def warm(names: "list[str]") -> None:
    """Import ``names``, silenced; one that fails to import is left for the code to meet."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    try:
        for name in names:
            try:
                if name.split(".")[0] == "matplotlib" and "matplotlib" not in sys.modules:
                    # No display in a sandbox: what a headless interpreter would resolve to,
                    # chosen before pyplot could look for another.
                    import matplotlib

                    matplotlib.use("Agg")
                __import__(name)
            except BaseException:
                pass
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, devnull):
            os.close(fd)


def request() -> "list[str] | None":
    """The run's arguments, or ``None`` when the sandbox is not used."""
    chunks = []
    while chunk := os.read(REQUEST_FD, 65536):
        chunks.append(chunk)
    os.close(REQUEST_FD)
    data = b"".join(chunks)
    if not data.endswith(RELEASE):
        return None
    return [os.fsdecode(arg) for arg in data[: -len(RELEASE)].split(b"\0")[:-1]]


def run(args: "list[str]") -> "tuple[int, ModuleType]":
    """Run ``args`` as ``python ARGS`` would, in a fresh ``__main__``.

    Returns the exit status and the ``__main__`` module; -2 stands for "killed by SIGINT" (an
    uncaught KeyboardInterrupt).
    """
    import builtins
    from importlib.machinery import BuiltinImporter, SourceFileLoader

    main = type(sys)("__main__")
    # What python gives its __main__: the loader of -c code is the built-in importer.
    main.__dict__.update(__builtins__=builtins, __annotations__={}, __loader__=BuiltinImporter)
    if args[0] == "-c":
        source: str | bytes = args[1]
        filename = "<string>"
        sys.argv[:] = ["-c", *args[2:]]
        sys.path[0] = ""
    else:
        filename = os.path.abspath(args[0])
        sys.argv[:] = list(args)
        sys.path[0] = os.path.dirname(filename)
        try:
            with open(args[0], "rb") as file:
                source = file.read()
        except OSError as exc:
            sys.stderr.write(f"{sys.executable}: can't open file {args[0]!r}: {exc}\n")
            return 2, main
        main.__dict__.update(
            __file__=filename, __cached__=None, __loader__=SourceFileLoader("__main__", filename)
        )
    sys.modules["__main__"] = main
    try:
        exec(compile(source, filename, "exec", dont_inherit=True), main.__dict__)
    except SystemExit as exc:
        return exit_status(exc.code), main
    except BaseException as exc:
        # Without this function's frame, as python prints an uncaught exception of a script.
        tb = exc.__traceback__
        exc.__traceback__ = tb.tb_next if tb is not None else None
        sys.excepthook(type(exc), exc, exc.__traceback__)
        return (-2 if isinstance(exc, KeyboardInterrupt) else 1), main
    return 0, main


def exit_status(code: object) -> int:
    """The status ``raise SystemExit(code)`` gives, its message printed as python prints it."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    try:
        sys.stderr.write(f"{code}\n")
    except Exception:
        pass
    return 1


def finish(status: int, main: "ModuleType") -> None:
    """End as the interpreter's shutdown would, without tearing the imported modules down.

    Python waits for the non-daemon threads, runs the atexit functions and flushes the standard
    streams, then frees every module, which takes hundreds of milliseconds once pandas and
    matplotlib are loaded. The code's own objects are freed (their files flushed and closed)
    by clearing its ``__main__``; the modules are left to the kernel.
    """
    threading = sys.modules.get("threading")
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None:
        try:
            shutdown()
        except BaseException:
            pass
    import atexit

    atexit._run_exitfuncs()
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
        import signal

        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(status & 0xFF)


if __name__ == "__main__":
    warm(sys.argv[1:])
    os.write(1, WARM)
    arguments = request()
    if arguments is None:
        os._exit(0)
    finish(*run(arguments))
