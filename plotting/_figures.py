"""The support module's figures: the capturing backend, and figures saved as PNG files.

Part of the support module (see ``_support.py``): the backend defined here draws with Agg;
``plt.show()`` saves every open figure and closes it, ``Figure.show()`` saves and closes that
figure, and the prelude has whatever is still open at the end saved too
(:func:`capture_open_figures`). Names and sizes: see :data:`FIGURE_PREFIX`, :data:`FIGURE_DPI`.
"""

# contextlib is not loaded at interpreter startup; importing it would cost a failing run.
# ruff: noqa: SIM105

import os
import sys

from ._output import note

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from types import ModuleType

    from matplotlib.backend_bases import FigureManagerBase
    from matplotlib.figure import Figure

#: Captured figures are ``FIGURE_PREFIX + "%03d" % n + FIGURE_SUFFIX``, n = 1, 2, ...
FIGURE_PREFIX = "figure_"
FIGURE_SUFFIX = ".png"
#: Resolution of captured figures; lowered so that neither side exceeds FIGURE_MAX_PIXELS.
FIGURE_DPI = 100
FIGURE_MAX_PIXELS = 2000
#: The in-memory backend: ``matplotlib.use("module://_mcp_backend")``.
BACKEND_MODULE = "_mcp_backend"
#: What a figure is called while it is being saved.
PARTIAL_SUFFIX = ".part"

# Set by configure(): where figures go. How many figures were created and how many names were
# taken (a session's cells go on counting).
_workdir = "."
_figures_created = 0
_figures_saved = 0


def configure(workdir: str) -> None:
    """Called for each run (each cell of a session): the working directory figures go to."""
    global _workdir
    _workdir = workdir


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


def capture_open_figures() -> None:
    """Save and close every figure pyplot holds open, in drawing order."""
    if "matplotlib._pylab_helpers" not in sys.modules:
        return  # pyplot was never imported: no figure, and nothing to import
    try:
        from matplotlib._pylab_helpers import Gcf

        managers = Gcf.get_all_fig_managers()
    except Exception as exc:
        note(f"figures could not be listed: {type(exc).__name__}: {exc}")
        return
    _capture(managers)


def _capture(managers: "Iterable[FigureManagerBase]") -> None:
    from matplotlib._pylab_helpers import Gcf

    for manager in sorted(managers, key=_drawing_order):
        try:
            _save_figure(manager.canvas.figure)
        except Exception as exc:
            note(f"figure {manager.num} could not be saved: {type(exc).__name__}: {exc}")
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
