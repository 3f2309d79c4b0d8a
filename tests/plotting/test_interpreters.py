"""The same run, whichever interpreter runs it: a fresh one, as Snekbox starts for every run, that
loads the prelude compiled by the gateway; one with another bytecode format, which compiles it
from source; one kept warm, which imported numpy, pandas and pyplot before the run began."""

import signal
import subprocess
import textwrap
from pathlib import Path

import pytest
from PIL import Image

from plotting import MANIFEST_NAME, PNG_SIGNATURE, PRELUDE_NAME, build_request

from .conftest import PYTHON, Run, RunCode, runner

WAYS = {
    "compiled": {},
    "from source": {"compiled": False},
    "warm": {"warm": True},
}


def code(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def sizes(run: Run) -> dict[str, tuple[int, int]]:
    """Pixel size of each PNG the run left."""
    found = {}
    for name in run.files():
        path = run.workdir / name
        if path.read_bytes().startswith(PNG_SIGNATURE):
            with Image.open(path) as image:
                found[name] = image.size
    return found


PROGRAMS = {
    "traceback": (
        code("""
            print("before")
            def divide(a, b):
                return a / b
            divide(1, 0)
        """),
        1,
    ),
    "syntax error": ("x = 1\nif x = 2:\n    pass\n", 1),
    "exit message": ("import sys\nprint('before')\nsys.exit('boom')", 1),
    "keyboard interrupt": (
        "import atexit\natexit.register(print, 'atexit ran')\nraise KeyboardInterrupt",
        -signal.SIGINT,
    ),
    "main module": (
        code("""
            import sys, warnings
            print(__name__, sys.argv, "__file__" in globals())
            print(sorted(k for k in globals() if k.startswith("_")))
            warnings.warn("careful")
        """),
        0,
    ),
    "not utf-8": (
        code("""
            import sys
            print("one")
            sys.stdout.buffer.write(b"two \\xff\\n")
            print("three \\udc80")
        """),
        0,
    ),
    "files": ("open('out.txt', 'w').write('x')\nprint(open('data.csv').read())", 0),
}


@pytest.mark.parametrize("way", list(WAYS))
@pytest.mark.parametrize("program", list(PROGRAMS))
def test_a_run_ends_the_same_whichever_interpreter_runs_it(
    run_code: RunCode, tmp_path_factory: pytest.TempPathFactory, program: str, way: str
) -> None:
    source, status = PROGRAMS[program]
    files = {"data.csv": b"a,b\n"}
    run = run_code(source, files=files, **WAYS[way])
    assert run.returncode == status, run.output
    assert "_mcp" not in run.output and "prelude" not in run.output
    if way != "compiled":  # the reference: the way every run goes on an interpreter like this one
        reference = runner(tmp_path_factory.mktemp("reference"))(source, files=files)
        assert (run.output, run.returncode) == (reference.output, reference.returncode)
        assert run.files() == reference.files()
        if MANIFEST_NAME in run.files():
            manifest = (run.workdir / MANIFEST_NAME).read_bytes()
            assert manifest == (reference.workdir / MANIFEST_NAME).read_bytes()


DRAW = code("""
    import matplotlib.pyplot as plt

    def draw(width):
        fig = plt.figure(figsize=(width, 2))
        fig.add_axes((0.4, 0.4, 0.2, 0.2)).plot([0, 1], [1, 0])
""")


@pytest.mark.parametrize("way", list(WAYS))
@pytest.mark.parametrize("agg", ["", "import matplotlib\nmatplotlib.use('Agg')\n"])
def test_each_show_and_the_end_capture_the_figures(run_code: RunCode, way: str, agg: str) -> None:
    run = run_code(
        agg + DRAW + "draw(3)\nplt.show()\ndraw(4)\nplt.show()\ndraw(5)\nprint('done')",
        **WAYS[way],
    )
    assert (run.output, run.returncode) == ("done\n", 0)
    assert sizes(run) == {
        "figure_001.png": (300, 200),
        "figure_002.png": (400, 200),
        "figure_003.png": (500, 200),
    }


@pytest.mark.parametrize("way", list(WAYS))
def test_a_backend_the_user_chose_is_kept(run_code: RunCode, way: str) -> None:
    # Not Agg: the user's choice. plt.show() does not save with it; the figures open at the
    # end are still saved, as ever.
    run = run_code(
        "import matplotlib\nmatplotlib.use('svg')\n"
        + DRAW
        + "draw(3)\nplt.show()\nprint(matplotlib.get_backend(), plt.get_fignums())",
        **WAYS[way],
    )
    assert (run.output, run.returncode) == ("svg [1]\n", 0)
    assert sizes(run) == {"figure_001.png": (300, 200)}


def test_a_warm_interpreter_whose_pyplot_resolved_agg_still_captures(run_code: RunCode) -> None:
    # As after a first figure, closed: pyplot resolved the backend before the prelude ran.
    run = run_code(
        DRAW + "draw(3)\nplt.show()\nprint(plt.get_backend(), plt.get_fignums())",
        warm="matplotlib.pyplot.close(matplotlib.pyplot.figure())",
    )
    assert (run.output, run.returncode) == ("module://_mcp_backend []\n", 0)
    assert sizes(run) == {"figure_001.png": (300, 200)}


def test_the_module_that_ran_the_first_file_becomes_the_users(tmp_path: Path) -> None:
    # A runner that keeps its interpreter warm runs the first file in a __main__ of its own
    # and, skipping the interpreter's teardown, frees what the run left by clearing that module
    # (the evaluator's warm agent does): it must be the user's, or a file the code left open
    # would never be flushed. (A status python prints is the runner's to end the run with:
    # the prelude ends the others itself, tests/plotting/test_run_end.py.)
    runner = textwrap.dedent(f"""
        import sys
        main = sys.modules["__main__"] = type(sys)("__main__")
        sys.argv = [{PRELUDE_NAME!r}]
        source = open({PRELUDE_NAME!r}, "rb").read()
        try:
            exec(compile(source, "/home/" + {PRELUDE_NAME!r}, "exec"), vars(main))
        finally:
            print(sys.modules["__main__"] is main, sorted(main.__dict__)[-1])
            main.__dict__.clear()
            print(open("out.txt").read())
    """)
    source = "out = open('out.txt', 'w')\nout.write('flushed')\nraise SystemExit('done')"
    for file in build_request(source).files:
        (tmp_path / file.path).write_bytes(file.content)
    proc = subprocess.run(
        [*PYTHON, "-c", runner], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert (proc.stdout, proc.stderr, proc.returncode) == ("True out\nflushed\n", "done\n", 1)
