"""What the prelude needs only sometimes: tracebacks, import hooks, figures as PNG files.

It travels as ``_mcp_support.py``; the prelude reads it at startup and compiles it, as the module
``_mcp_support``, the first time a run needs it: an uncaught exception, a syntax error, or the
user's code importing matplotlib or ``linecache``. Standard-library only; matplotlib is imported
only here, and only once the user's code has imported it.

Figures: the backend defined here draws with Agg; ``plt.show()`` saves every open figure and
closes it, ``Figure.show()`` saves and closes that figure, and the prelude has whatever is still
open at the end saved too. Each becomes ``figure_001.png``, ``figure_002.png``, ... in the working
directory, in drawing order, skipping names that already exist (a file the user saved is never
overwritten), at :data:`FIGURE_DPI`, lowered so that no side exceeds :data:`FIGURE_MAX_PIXELS`.
A figure that cannot be saved is reported in one line on stderr; nothing else changes.

The module has no side effects on import: the gateway imports it for its constants.
"""

# contextlib is not loaded at interpreter startup; importing it would cost a failing run.
# ruff: noqa: SIM105

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence
    from importlib.abc import Loader
    from importlib.machinery import ModuleSpec
    from types import ModuleType, TracebackType
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

# Set by configure(): where figures go, the user's source, the prelude's file name. Then how
# many figures were created and how many names were taken.
_workdir = "."
_source = b""
_hide = ""
_figures_created = 0
_figures_saved = 0


def configure(*, workdir: str, source: bytes, hide: str) -> None:
    """Called by the prelude once this module is loaded.

    Args:
        workdir: The run's working directory, where figures are saved.
        source: The user's code, for ``linecache``.
        hide: The prelude's file name: its frames are dropped from tracebacks.
    """
    global _workdir, _source, _hide
    _workdir, _source, _hide = workdir, source, hide


# --- tracebacks ------------------------------------------------------------------------------


def report_uncaught(exc: BaseException) -> None:
    """Print an exception that escaped the user's code as ``python`` would.

    The prelude's leading frames are dropped from ``exc`` and from every exception chained to
    it. A ``sys.excepthook`` the user installed is called instead.
    """
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
            return
        except BaseException:
            pass
    _print_exception(exc)


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


def _trim_tracebacks(exc: BaseException, hide: str) -> None:
    seen: set[int] = set()
    pending = [exc]
    while pending:
        e = pending.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        tb: TracebackType | None = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename == hide:
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
      ``matplotlib.use("Agg")``, the usual way of saying "there is no display");
    * ``linecache``: once loaded, it learns the user's source.
    """
    if fullname == BACKEND_MODULE:
        from importlib.machinery import ModuleSpec

        return ModuleSpec(fullname, _BackendLoader(), origin="<mcp>")
    if fullname == "matplotlib":
        return _spec_then(finder, fullname, path, target, _select_backend)
    if fullname == "matplotlib.pyplot":
        _select_backend(sys.modules.get("matplotlib"))
    elif fullname == "linecache":
        return _spec_then(finder, fullname, path, target, register_source)
    return None


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
    while True:  # the next free name: a file the user saved is never overwritten
        _figures_saved += 1
        path = os.path.join(_workdir, f"{FIGURE_PREFIX}{_figures_saved:03d}{FIGURE_SUFFIX}")
        try:
            out = open(path, "xb")  # noqa: SIM115 (closed below, or removed on failure)
        except FileExistsError:
            continue
        break
    try:
        with out:
            figure.savefig(out, format="png", dpi=dpi)
    except BaseException:
        try:
            os.remove(path)
            _figures_saved -= 1  # the name is free again: no gap in the numbering
        except OSError:
            pass
        raise


def _note(message: str) -> None:
    _flush_stdout()
    try:
        sys.stderr.write(f"[{message}]\n")
    except Exception:
        pass
    _flush(sys.stderr)
