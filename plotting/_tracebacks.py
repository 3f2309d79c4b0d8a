"""The support module's tracebacks: an uncaught exception reported as ``python`` would.

Part of the support module (see ``_support.py``): the prelude's frames are dropped, the user's
source lines shown (``linecache`` learns them), and a run ended by a KeyboardInterrupt dies of
SIGINT as python's would.
"""

# contextlib is not loaded at interpreter startup; importing it would cost a failing run.

import os
import sys

from ._output import flush, flush_stdout

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import CodeType, ModuleType, TracebackType
    from typing import NoReturn

#: The file name of the user's code (in tracebacks and linecache).
CODE_FILENAME = "<string>"

# Set by configure(): the user's source, the prelude's frames to hide. Whether the code ended
# with an uncaught KeyboardInterrupt.
_source = b""
_hide: "tuple[CodeType, ...]" = ()
interrupted = False


def configure(source: bytes, hide: "tuple[CodeType, ...]") -> None:
    """Called for each run (each cell of a session): the user's source, for ``linecache``, and
    the code of the prelude's functions whose frames head every traceback (see
    :func:`report_uncaught`); no interruption yet."""
    global _source, _hide, interrupted
    _source, _hide, interrupted = source, hide, False


def report_uncaught(exc: BaseException) -> int:
    """Print an exception that escaped the user's code as ``python`` would; the exit status, 1.

    The prelude's leading frames are dropped from ``exc`` and from every exception chained to
    it. A ``sys.excepthook`` the user installed is called instead. After a KeyboardInterrupt,
    :func:`finish` ends the run as python would, by SIGINT.
    """
    global interrupted
    interrupted = isinstance(exc, KeyboardInterrupt)
    _trim_tracebacks(exc, _hide)
    if "linecache" in sys.modules:  # the user's code may have cleared its cache
        register_source(sys.modules["linecache"])
    sys.last_type, sys.last_value, sys.last_traceback = type(exc), exc, exc.__traceback__
    if sys.version_info >= (3, 12):
        sys.last_exc = exc
    if sys.excepthook is not sys.__excepthook__:
        flush_stdout()
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
    flush_stdout()
    flush(sys.stderr)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)
    os._exit(128 + signal.SIGINT)  # only if the signal did not end the process


def _print_exception(exc: BaseException) -> None:
    # stdout and stderr share one pipe in the sandbox: whatever the user printed goes first.
    flush_stdout()
    try:
        # The interpreter's own printer (before 3.13) reads source lines from files, not from
        # linecache (where the prelude puts the user's source), so it would show none.
        import traceback

        traceback.print_exception(exc)
    except BaseException:
        sys.__excepthook__(type(exc), exc, exc.__traceback__)
    flush(sys.stderr)


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
