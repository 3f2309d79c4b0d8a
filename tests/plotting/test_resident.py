"""The prelude kept resident by the service (``plotting/_bundle.py``, run by the Snekbox image):
a request without it runs the resident one, and one the service does not keep ends before the
code, as the gateway expects (``plotting.prelude_missing``)."""

import importlib.util
import marshal
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import plotting
from plotting import PRELUDE_NAME, build_request, carries_prelude, prelude_missing
from plotting._bundle import BOOT_SUFFIX, RESIDENT_DIR, resident_path, write_resident
from snekbox_client import EvalRequest, EvalResult, File
from tests.plotting.conftest import PYTHON, Run, run_request


def pointed_at(request: EvalRequest, resident: Path) -> EvalRequest:
    """``request`` looking for the resident prelude in ``resident`` (in place of
    :data:`RESIDENT_DIR`, which only the image has): its launcher or its first file."""
    here, there = RESIDENT_DIR, str(resident)
    args = [arg.replace(here, there) for arg in request.args or ()]
    files = [
        File(f.path, f.content.replace(here.encode(), there.encode()))
        if f.path == PRELUDE_NAME
        else f
        for f in request.files
    ]
    assert (args, files) != (list(request.args or ()), list(request.files))
    return EvalRequest(args=args, files=files)


def resident_run(code: str, workdir: Path, resident: Path) -> Run:
    """Run ``code`` sent without the prelude, in a sandbox whose service keeps it in
    ``resident`` (written there with ``seen_as=resident``)."""
    request = build_request(code, resident=True)
    assert not carries_prelude(request)
    return run_request(pointed_at(request, resident), workdir)


def bundled_run(code: str, workdir: Path, resident: Path) -> Run:
    """Run ``code`` sent without the prelude and not as an argument: the first file and the
    bundle's head, as a resident run of code no argument can carry goes."""
    files = plotting.prelude_files(code.encode(), resident=True)
    return run_request(pointed_at(EvalRequest(args=[PRELUDE_NAME], files=files), resident), workdir)


def test_a_run_without_the_prelude_runs_the_resident_one(tmp_path: Path) -> None:
    resident, workdir = tmp_path / "resident", tmp_path / "work"
    workdir.mkdir()
    # As the image writes it: by the sandbox's interpreter, running the file as a script.
    script = Path(plotting.__file__).parent / "_bundle.py"
    written = subprocess.run(
        [sys.executable, "-I", str(script), str(resident), str(resident)],
        capture_output=True,
        check=True,
    ).stdout.decode()
    [name] = [name for name in os.listdir(resident) if name.endswith(".bin")]
    boot = name.removesuffix(".bin") + BOOT_SUFFIX
    warm = os.path.basename(plotting.WARM_PATH)
    assert sorted(os.listdir(resident)) == sorted([name, boot, warm])
    assert written.strip() == str(resident / name)
    _, bundle = plotting.prelude_files(b"", resident=True)
    digest = marshal.loads(bundle.content)[5]
    assert name == os.path.basename(resident_path(digest, importlib.util.MAGIC_NUMBER))
    assert len(bundle.content) < 100 < 30_000 < (resident / name).stat().st_size
    code = "import matplotlib.pyplot as plt\nplt.plot([1, 2])\nprint(__name__, 6 * 7)\n1 / 0"
    request = build_request(code, resident=True)
    assert (request.args or [])[0] == "-c" and request.files == ()  # no file to write
    run = resident_run(code, workdir, resident)
    assert run.returncode == 1, run.output
    assert run.output.startswith("__main__ 42\nTraceback"), run.output
    assert "line 4, in <module>\n    1 / 0\n" in run.output and "_mcp" not in run.output
    assert run.files() == [plotting.MANIFEST_NAME, "figure_001.png"]  # the support module's work


#: What code learns of how it was run, and what it was sent as.
PROBE = (
    "# -*- coding: utf-8 -*-\n"
    "import os, sys\n"
    "print(__name__, sys.argv, sys.path[0] == os.getcwd(), sorted(globals()))\n"
    "print(sorted(os.listdir()), ascii('\u00e9\u2603\U0001f600'), 'line\\ttab')\n"
)


def test_launched_code_runs_as_the_bundle_would_run_it(tmp_path: Path) -> None:
    """Code sent as the launcher's argument sees the same ``__main__``, ``sys.argv``,
    ``sys.path[0]``, working directory and text as code sent in the bundle; code no argument
    can carry (NUL, a lone surrogate, over 64 KiB) goes in the bundle, and runs."""
    resident = tmp_path / "resident"
    write_resident(str(resident), seen_as=str(resident))
    runs = []
    for index, run in enumerate((resident_run, bundled_run)):
        workdir = tmp_path / f"work{index}"
        workdir.mkdir()
        runs.append(run(PROBE, workdir, resident))
    assert runs[0].returncode == 0, runs[0].output
    assert (runs[0].output, runs[0].returncode) == (runs[1].output, runs[1].returncode)
    assert runs[0].output.startswith("__main__ ['<string>'] True ['__builtins__', '__doc__'"), runs[
        0
    ]
    assert "[] '\\xe9\\u2603\\U0001f600' line\ttab\n" in runs[0].output
    big = "x = 1\n" + "# " + "x" * 70_000 + "\nprint(x)\n"
    for code in ("print(1)\0", "print('\ud800')", big):
        request = build_request(code, resident=True)
        assert request.args == [PRELUDE_NAME] and not carries_prelude(request), code[:20]
    for code, expected in ((big, "1\n"), ("print(1)\0", "null bytes")):
        workdir = tmp_path / f"work-{len(code)}"
        workdir.mkdir()
        request = build_request(code, resident=True)
        result = run_request(pointed_at(request, resident), workdir)
        assert expected in result.output, result.output


def test_a_prelude_the_service_does_not_keep_ends_the_run_before_the_code(tmp_path: Path) -> None:
    resident = tmp_path / "resident"
    path = Path(write_resident(str(resident), seen_as=str(resident)))
    boot = path.with_name(path.name.removesuffix(".bin") + BOOT_SUFFIX)

    def ran(run: Callable[[str, Path, Path], Run]) -> Run:
        workdir = tmp_path / f"work{len(os.listdir(tmp_path))}"
        workdir.mkdir()
        return run("open('ran', 'w').close()", workdir, resident)

    # Kept for another interpreter's bytecode only (or another prelude's digest): not run. First
    # the launcher finds no first file (a bundle's run needs none), then none finds the prelude.
    for kept, running in ((boot, [bundled_run]), (path, [])):
        kept.rename(kept.with_name(kept.name.replace(importlib.util.MAGIC_NUMBER.hex(), "0000")))
        for run in (resident_run, bundled_run):
            result = ran(run)
            if run in running:
                assert result.returncode == 0 and "ran" in result.files(), result.output
                continue
            assert result.returncode == 121, result.output
            assert prelude_missing(EvalResult(stdout=result.output, returncode=result.returncode))
            assert "ran" not in result.files()


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


def test_a_head_an_interrupted_launch_left_is_not_run(tmp_path: Path) -> None:
    """A session's interpreter goes on after a cell ends: a head its launcher made but the first
    file never took (a time limit came between) is not the next cell's, sent with its files."""
    runner = textwrap.dedent(f"""
        import sys
        sys._mcp_session = True
        sys._mcp_launched = (b"", b"", b"", b"print('stale')", 0, bytes(16))
        sys.argv[:] = [{PRELUDE_NAME!r}]
        source = open({PRELUDE_NAME!r}, "rb").read()
        exec(compile(source, {PRELUDE_NAME!r}, "exec"), {{"__name__": "__main__"}})
        print(hasattr(sys, "_mcp_launched"))
    """)
    for file in build_request("print('cell')").files:
        (tmp_path / file.path).write_bytes(file.content)
    proc = subprocess.run(
        [*PYTHON, "-c", runner], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert (proc.stdout, proc.returncode) == ("cell\nFalse\n", 0), proc.stderr
