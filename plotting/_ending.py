"""How a run ends: the prelude's second part (``_bundle.py`` makes one module of both).

As python's shutdown would, without tearing the imported modules down, which takes 2 ms of a
bare interpreter's run and over 100 ms once numpy and pyplot are loaded: the non-daemon threads
are waited for, the atexit functions run, the code's objects freed (their files flushed and
closed) by clearing its namespace, the streams flushed. What only an imported module or a
reference cycle holds is not freed, its ``__del__`` not called (python does not promise to call
it at exit either; collecting the cycles would take 50 ms once numpy and pyplot are loaded). The
warm agent ends the runs it makes without the prelude in a like way (``evaluator/_agent.py``).

Standard library only: what a bare interpreter has loaded, and ctypes where C code is.
"""

# contextlib is not loaded at interpreter startup; importing it would cost every run.
# ruff: noqa: SIM105

import sys
from os import _exit

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import TextIO


def end_run(status: object, namespace: "dict[str, object]", streams: "Sequence[TextIO]") -> None:
    """End the run whose code ended with ``status`` (as ``SystemExit.code``) in ``namespace``;
    ``streams``: the guarded standard streams, flushed with the code's own.

    Where C code other than the standard library's is loaded, C's ``exit()`` ends it, which
    flushes C's stdio buffers and runs its exit handlers (a Fortran library's output); else
    ``os._exit()``. Returns, for python to end the run, when the status is one python prints
    (``sys.exit("why")``) or computes (past 255), when a standard stream cannot be flushed
    (python says so, and its status is 120), or when C's ``exit()`` cannot be had.
    """
    if status is not None and (type(status) is not int or not 0 <= status <= 255):
        return
    shutdown = getattr(sys.modules.get("threading"), "_shutdown", None)
    if shutdown is not None:  # python's shutdown does both, and neither twice
        try:
            shutdown()
        except BaseException:  # an interrupt while waiting: python's shutdown goes on too
            pass
    import atexit

    atexit._run_exitfuncs()
    end = _exit
    if _loads_c():
        try:
            import ctypes

            end = ctypes.PyDLL(None).exit  # PyDLL holds the GIL: no Python code runs on
        except BaseException:
            return
    if not _flushed(streams):  # what was printed goes before what the freeing prints
        return
    _free(namespace)
    if _flushed(streams):
        end(status or 0)


def _free(namespace: "dict[str, object]") -> None:
    """Free the code's objects: the last exception's frames (which hold their functions'
    objects), then its names, the last bound first, so that an object's ``__del__`` finds
    those bound before it (python's shutdown promises less); ``__builtins__`` last."""
    for name in ("last_type", "last_value", "last_traceback", "last_exc"):
        vars(sys).pop(name, None)
    for name in reversed(list(namespace)):
        if name != "__builtins__":
            try:
                del namespace[name]
            except BaseException:  # gone (a __del__ took it), or an interrupt
                pass
    namespace.clear()


def _flushed(streams: "Sequence[TextIO]") -> bool:
    """Whether the standard streams were flushed as python's shutdown flushes them (one that
    is ``None`` or closed is left alone), then the guarded ones beneath them."""
    flushed = True
    for stream in (getattr(sys, "stdout", None), getattr(sys, "stderr", None)):
        try:
            closed = stream is None or bool(stream.closed)
        except Exception:  # python's shutdown flushes it then
            closed = False
        try:
            if not closed:
                stream.flush()  # type: ignore[union-attr]
        except BaseException:
            flushed = False
    for stream in streams:  # the code may have replaced them
        try:
            if not stream.closed:
                stream.flush()
        except BaseException:
            pass
    return flushed


def _loads_c() -> bool:
    """Whether C code other than the standard library's extension modules is loaded, or
    ctypes, which calls any."""
    if "_ctypes" in sys.modules:
        return True
    try:
        ours = getattr(sys.modules["os"], "__file__", "").rpartition("/")[0] + "/lib-dynload/"
        for module in list(sys.modules.values()):
            path = getattr(module, "__file__", None)
            if type(path) is str and path.endswith(".so") and not path.startswith(ours):
                return True
    except Exception:
        return True
    return False
