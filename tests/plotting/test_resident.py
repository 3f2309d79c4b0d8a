"""The prelude kept resident by the service (``plotting/_bundle.py``, run by the Snekbox image):
a request without it runs the resident one, and one the service does not keep ends before the
code, as the gateway expects (``plotting.prelude_missing``)."""

import importlib.util
import marshal
import os
import subprocess
import sys
from pathlib import Path

import plotting
from plotting import PRELUDE_NAME, build_request, carries_prelude, prelude_missing
from plotting._bundle import RESIDENT_DIR, resident_path, write_resident
from snekbox_client import EvalRequest, EvalResult, File
from tests.plotting.conftest import Run, run_request


def resident_run(code: str, workdir: Path, resident: Path) -> Run:
    """Run ``code`` sent without the prelude, in a sandbox whose service keeps it in
    ``resident`` (in place of :data:`RESIDENT_DIR`, which only the image has)."""
    request = build_request(code, resident=True)
    assert not carries_prelude(request)
    files = [
        File(f.path, f.content.replace(RESIDENT_DIR.encode(), str(resident).encode()))
        if f.path == PRELUDE_NAME
        else f
        for f in request.files
    ]
    assert files != request.files  # the first file names the directory
    return run_request(EvalRequest(args=request.args, files=files), workdir)


def test_a_run_without_the_prelude_runs_the_resident_one(tmp_path: Path) -> None:
    resident, workdir = tmp_path / "resident", tmp_path / "work"
    workdir.mkdir()
    # As the image writes it: by the sandbox's interpreter, running the file as a script.
    script = Path(plotting.__file__).parent / "_bundle.py"
    written = subprocess.run(
        [sys.executable, "-I", str(script), str(resident)], capture_output=True, check=True
    ).stdout.decode()
    [name] = [name for name in os.listdir(resident) if name.endswith(".bin")]
    assert sorted(os.listdir(resident)) == sorted([name, os.path.basename(plotting.WARM_PATH)])
    assert written.strip() == str(resident / name)
    _, bundle = plotting.prelude_files(b"", resident=True)
    digest = marshal.loads(bundle.content)[5]
    assert name == os.path.basename(resident_path(digest, importlib.util.MAGIC_NUMBER))
    assert len(bundle.content) < 100 < 30_000 < (resident / name).stat().st_size
    code = "import matplotlib.pyplot as plt\nplt.plot([1, 2])\nprint(__name__, 6 * 7)\n1 / 0"
    run = resident_run(code, workdir, resident)
    assert run.returncode == 1, run.output
    assert run.output.startswith("__main__ 42\nTraceback"), run.output
    assert "line 4, in <module>\n    1 / 0\n" in run.output and "_mcp" not in run.output
    assert run.files() == [plotting.MANIFEST_NAME, "figure_001.png"]  # the support module's work


def test_a_prelude_the_service_does_not_keep_ends_the_run_before_the_code(tmp_path: Path) -> None:
    resident, workdir = tmp_path / "resident", tmp_path / "work"
    workdir.mkdir()
    path = Path(write_resident(str(resident)))
    # Kept for another interpreter's bytecode only (or another prelude's digest): not run.
    path.rename(path.with_name(path.name.replace(importlib.util.MAGIC_NUMBER.hex(), "00000000")))
    run = resident_run("open('ran', 'w')", workdir, resident)
    assert run.returncode == 121
    assert prelude_missing(EvalResult(stdout=run.output, returncode=run.returncode))
    assert "ran" not in run.files()


#: Runs the resident directory's warm.py as a warm sandbox's agent does, then says what it left.
WARMED = (
    "import sys\n"
    "path = sys.argv[1]\n"
    "exec(compile(open(path, 'rb').read(), path, 'exec'), {'__file__': path})\n"
    "prelude, modules = getattr(sys, '_mcp_prelude', {}), sys.modules\n"
    "print(prelude.get('_loaded_ahead'), '_mcp_support' in modules, 'matplotlib' in modules)"
)


def test_a_warm_interpreter_loads_the_resident_prelude_of_its_bytecode_ahead(
    tmp_path: Path,
) -> None:
    """``warm.py`` loads the prelude kept for this interpreter's bytecode and makes its support
    module, importing nothing else; kept for another bytecode only, it loads nothing."""
    path = Path(write_resident(str(tmp_path)))
    warm = str(tmp_path / os.path.basename(plotting.WARM_PATH))

    def warmed() -> str:
        ran = subprocess.run([sys.executable, "-I", "-c", WARMED, warm], capture_output=True)
        assert ran.returncode == 0, ran.stderr
        return ran.stdout.decode()

    assert warmed() == "True True False\n"
    path.rename(path.with_name(path.name.replace(importlib.util.MAGIC_NUMBER.hex(), "00000000")))
    assert warmed() == "None False False\n"
