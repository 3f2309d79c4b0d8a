"""Figures come back as PNG files in drawing order; the user's own files are left alone."""

import textwrap

from PIL import Image

from plotting import FIGURE_MAX_PIXELS, MANIFEST_NAME, PNG_SIGNATURE, sort_files
from snekbox_client import File

from .conftest import Run, RunCode

# Draws one figure of the given size (inches) filled with one colour, so each PNG says which
# figure it is by its size and by the colour of any pixel.
DRAW = textwrap.dedent("""
    import matplotlib.pyplot as plt

    def draw(color, width=3, height=2):
        fig = plt.figure(figsize=(width, height), facecolor=color)
        fig.add_axes((0.4, 0.4, 0.2, 0.2)).plot([0, 1], [1, 0])
        return fig
""")

RED, GREEN, BLUE = (255, 0, 0), (0, 255, 0), (0, 0, 255)


def pngs(run: Run) -> dict[str, tuple[tuple[int, int], tuple[int, ...]]]:
    """Each PNG in the working directory: its pixel size and the colour of its corner."""
    found: dict[str, tuple[tuple[int, int], tuple[int, ...]]] = {}
    for name in run.files():
        path = run.workdir / name
        if path.read_bytes().startswith(PNG_SIGNATURE):
            with Image.open(path) as image:
                corner = image.convert("RGB").getpixel((2, 2))
                assert isinstance(corner, tuple), corner  # an RGB image's pixel: (r, g, b)
                found[name] = (image.size, corner)
    return found


def test_each_show_and_the_end_capture_the_open_figures_in_drawing_order(
    run_code: RunCode,
) -> None:
    run = run_code(
        DRAW
        + textwrap.dedent("""
            draw("red", 3)
            plt.show()
            draw("lime", 4)
            plt.show()
            draw("blue", 5)
            print("done")
        """)
    )
    assert (run.output, run.returncode) == ("done\n", 0)
    assert pngs(run) == {
        "figure_001.png": ((300, 200), RED),
        "figure_002.png": ((400, 200), GREEN),
        "figure_003.png": ((500, 200), BLUE),
    }


def test_figures_keep_their_creation_order_when_reactivated(run_code: RunCode) -> None:
    run = run_code(DRAW + 'draw("red")\ndraw("lime")\nplt.figure(1)\ndraw("blue")\nplt.show()')
    assert run.returncode == 0, run.output
    assert [colour for _, colour in pngs(run).values()] == [RED, GREEN, BLUE]
    assert run.files() == [MANIFEST_NAME, "figure_001.png", "figure_002.png", "figure_003.png"]


def test_a_figure_open_at_an_exception_is_captured(run_code: RunCode) -> None:
    run = run_code(DRAW + 'draw("red")\nraise RuntimeError("after drawing")')
    assert run.returncode == 1
    assert run.output.endswith("RuntimeError: after drawing\n")
    assert "_mcp" not in run.output
    assert pngs(run) == {"figure_001.png": ((300, 200), RED)}


def test_a_figure_open_at_sys_exit_is_captured(run_code: RunCode) -> None:
    run = run_code(DRAW + 'draw("blue")\nimport sys\nsys.exit(4)')
    assert run.returncode == 4
    assert pngs(run) == {"figure_001.png": ((300, 200), BLUE)}


def test_the_users_files_are_kept_and_never_overwritten(run_code: RunCode) -> None:
    run = run_code(
        DRAW + 'fig = draw("red")\nfig.savefig("chart.png", dpi=50)\nplt.show()',
        files={"figure_001.png": b"the user's own file"},
    )
    assert run.returncode == 0, run.output
    assert (run.workdir / "figure_001.png").read_bytes() == b"the user's own file"
    assert pngs(run) == {
        "chart.png": ((150, 100), RED),
        "figure_002.png": ((300, 200), RED),
    }
    returned = [File(name, (run.workdir / name).read_bytes()) for name in run.files()]
    files = sort_files(returned)
    assert [f.path for f in files.figures] == ["figure_002.png"]
    assert [f.path for f in files.others] == ["chart.png", "figure_001.png"]
    assert files.manifest is not None


def test_a_huge_figure_is_scaled_down(run_code: RunCode) -> None:
    run = run_code(DRAW + 'draw("red", 100, 50)\ndraw("lime", 10, 25)')
    assert run.returncode == 0, run.output
    assert pngs(run) == {
        "figure_001.png": ((FIGURE_MAX_PIXELS, FIGURE_MAX_PIXELS // 2), RED),
        "figure_002.png": ((FIGURE_MAX_PIXELS * 2 // 5, FIGURE_MAX_PIXELS), GREEN),
    }


def test_figure_show_captures_that_figure(run_code: RunCode) -> None:
    run = run_code(DRAW + 'draw("red")\ndraw("lime").show()\nprint(plt.get_fignums())')
    assert (run.output, run.returncode) == ("[1]\n", 0)
    assert [colour for _, colour in pngs(run).values()] == [GREEN, RED]


def test_an_explicit_agg_backend_still_captures_and_the_environment_is_untouched(
    run_code: RunCode,
) -> None:
    run = run_code(
        "import matplotlib, os\nmatplotlib.use('Agg')\n"
        + DRAW
        + 'draw("red")\nplt.show()\ndraw("lime")\nplt.show()\n'
        + 'print(os.environ.get("MPLBACKEND"))'
    )
    assert (run.output, run.returncode) == ("None\n", 0)
    assert [colour for _, colour in pngs(run).values()] == [RED, GREEN]


def test_mplbackend_agg_in_the_environment_still_captures(run_code: RunCode) -> None:
    # The built-in evaluator sets MPLBACKEND=Agg, as a sandbox without a display should.
    run = run_code(DRAW + 'draw("red")\nplt.show()\ndraw("lime")', extra_env={"MPLBACKEND": "Agg"})
    assert (run.output, run.returncode) == ("", 0)
    assert [colour for _, colour in pngs(run).values()] == [RED, GREEN]


def test_pandas_plots_are_captured(run_code: RunCode) -> None:
    run = run_code(
        "import matplotlib.pyplot as plt, pandas as pd\n"
        "pd.DataFrame({'y': [1, 3, 2]}).plot(figsize=(4, 3))\n"
        "plt.show()\n"
        "pd.Series([3, 1, 2]).plot.bar(figsize=(5, 3))\n"
    )
    assert run.returncode == 0, run.output
    assert [size for size, _ in pngs(run).values()] == [(400, 300), (500, 300)]


def test_a_figure_that_cannot_be_saved_is_reported_and_changes_nothing_else(
    run_code: RunCode,
) -> None:
    run = run_code(
        DRAW + 'bad = draw("red")\nbad.text(0, 0, r"$\\frac{$")\ndraw("lime")\nprint("end")'
    )
    assert run.returncode == 0
    assert run.output.startswith("end\n[figure 1 could not be saved: ValueError: ")
    assert pngs(run) == {"figure_001.png": ((300, 200), GREEN)}


def test_figures_outside_pyplot_are_not_captured(run_code: RunCode) -> None:
    run = run_code(
        "import matplotlib\nfrom matplotlib.figure import Figure\n"
        "Figure().add_subplot().plot([1, 2])\nprint(matplotlib.get_backend())"
    )
    assert (run.output, run.returncode) == ("module://_mcp_backend\n", 0)
    assert run.files() == []
