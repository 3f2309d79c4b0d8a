"""evaluator/bytecode.py on real environments: a fresh venv, a read-only one, and this project's.

The venvs get two small pure-Python distributions from the index, installed by ``uv pip install
--no-compile-bytecode`` (run outside the project, whose ``compile-bytecode = true`` would apply):
``six`` (a single module) and ``tabulate`` (a package).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from evaluator import Evaluator, bytecode
from evaluator.bytecode import compile_in_place, missing_bytecode, uncompiled
from snekbox_client import EvalRequest

from .conftest import config

#: Some tests run code as nobody: under pytest-xdist, beside test_unprivileged's (see there).
pytestmark = pytest.mark.xdist_group("uid-nobody")

NOBODY = 65534
SYSTEM_PYTHON = "/usr/bin/python3.11"
DISTRIBUTIONS = ("six==1.17.0", "tabulate==0.10.0")
MODULES = ("six", "tabulate")


def make_venv(root: Path, python: str) -> Path:
    """A venv in ``root`` with :data:`DISTRIBUTIONS`, not compiled; returns its interpreter."""
    uv = shutil.which("uv")
    if uv is None:
        pytest.fail("this test needs uv (the project's own tool) on PATH")
    env = root / "venv"
    subprocess.run([uv, "venv", "-q", "--python", python, env], check=True, cwd=root)
    interpreter = env / "bin" / "python"
    # Copies, not uv's default hard links into its cache: these tests touch and append to
    # six.py, which would change every venv (and the cache) sharing that inode, even those of
    # tests running beside them on another worker.
    install: list[str | Path] = [
        uv, "pip", "install", "-q", "--no-compile-bytecode", "--link-mode", "copy",
        "--python", interpreter,
    ]  # fmt: skip
    subprocess.run([*install, *DISTRIBUTIONS], check=True, cwd=root, timeout=300)
    return interpreter


def site_packages(python: Path) -> Path:
    [found] = python.parent.parent.glob("lib/python3*/site-packages")
    return found


def sources(python: Path) -> list[Path]:
    packages = site_packages(python)
    return [packages / "six.py", *sorted((packages / "tabulate").rglob("*.py"))]


def loaded_from_bytecode(python: Path, module: str) -> bool:
    """Whether importing ``module`` (writing nothing) used its ``.pyc``: ``-v`` says so."""
    done = subprocess.run(
        [python, "-v", "-c", f"import {module}; print({module}.__file__)"],
        env={"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"},
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    # "# .../__pycache__/six.cpython-311.pyc matches .../six.py"
    source = done.stdout.strip()
    return any(line.endswith(f" matches {source}") for line in done.stderr.splitlines())


@pytest.fixture
def venv(tmp_path: Path) -> Path:
    return make_venv(tmp_path, sys.executable)


def test_an_uncompiled_install_is_found_compiled_and_then_used(venv: Path) -> None:
    packages = site_packages(venv)
    assert not list(packages.rglob("*.pyc"))
    found = {u.module: u for u in uncompiled(str(venv), [*MODULES, "no_such_module_here"])}
    assert set(found) == set(MODULES), "what the venv cannot import is not listed"
    assert found["six"].paths == (str(packages / "six.py"),)
    assert found["six"].stale == found["six"].sources == 1
    tabulate_sources = len(list((packages / "tabulate").rglob("*.py")))
    assert found["tabulate"].paths == (str(packages / "tabulate"),)
    assert found["tabulate"].stale == found["tabulate"].sources == tabulate_sources
    assert str(found["tabulate"]).startswith(f"tabulate: {tabulate_sources} of ")
    assert not loaded_from_bytecode(venv, "six")

    paths = [p for u in found.values() for p in u.paths]
    assert compile_in_place(str(venv), paths) is True
    assert missing_bytecode(str(venv), MODULES) == []
    assert len(list(packages.rglob("*.pyc"))) == len(sources(venv))
    assert loaded_from_bytecode(venv, "six") and loaded_from_bytecode(venv, "tabulate")
    assert compile_in_place(str(venv), paths) is True, "again: nothing to do, still a success"


def test_the_child_writes_bytecode_whatever_this_process_says(
    venv: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Not beside the sources would be useless to the sandbox: no prefix, no -B, no -O."""
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.setenv("PYTHONPYCACHEPREFIX", str(tmp_path / "prefix"))
    monkeypatch.setenv("PYTHONOPTIMIZE", "2")
    assert missing_bytecode(str(venv), MODULES) == list(MODULES)
    assert compile_in_place(str(venv), [str(site_packages(venv))]) is True
    assert missing_bytecode(str(venv), MODULES) == []
    assert not (tmp_path / "prefix").exists()
    assert not list(site_packages(venv).rglob("*.opt-*.pyc"))


def test_a_source_changed_after_compiling_is_stale(venv: Path) -> None:
    six = site_packages(venv) / "six.py"
    assert compile_in_place(str(venv), [str(six)]) is True
    assert missing_bytecode(str(venv), MODULES) == ["tabulate"]
    later = six.stat().st_mtime + 10
    os.utime(six, (later, later))
    assert missing_bytecode(str(venv), MODULES) == ["six", "tabulate"]
    assert compile_in_place(str(venv), [str(six)]) is True
    assert missing_bytecode(str(venv), ["six"]) == []


def test_hash_based_bytecode_is_checked_against_the_source(venv: Path) -> None:
    """As with SOURCE_DATE_EPOCH set: pycs keyed by the source's hash, not its mtime."""
    six = site_packages(venv) / "six.py"
    subprocess.run(
        [venv, "-m", "compileall", "-q", "--invalidation-mode", "checked-hash", six], check=True
    )
    later = six.stat().st_mtime + 10
    os.utime(six, (later, later))
    assert missing_bytecode(str(venv), ["six"]) == [], "the mtime does not matter"
    with six.open("a") as f:
        f.write("# changed\n")
    assert missing_bytecode(str(venv), ["six"]) == ["six"]


def test_a_source_that_does_not_compile_is_reported(
    venv: Path, caplog: pytest.LogCaptureFixture
) -> None:
    package = site_packages(venv) / "tabulate"
    (package / "broken.py").write_text("def (:\n")
    assert compile_in_place(str(venv), [str(package)]) is False
    assert "broken.py" in caplog.text
    [left] = uncompiled(str(venv), ["tabulate"])
    assert (left.stale, left.example) == (1, str(package / "broken.py"))


def test_what_cannot_run_is_answered_without_an_exception(tmp_path: Path) -> None:
    assert compile_in_place(str(tmp_path / "no-python"), [str(tmp_path)]) is False
    assert compile_in_place(sys.executable, []) is False
    assert compile_in_place(sys.executable, [str(tmp_path / "nothing-here")]) is False
    with pytest.raises(RuntimeError, match="did not check its bytecode"):
        missing_bytecode(str(tmp_path / "no-python"))
    with pytest.raises(ValueError, match="top-level"):
        missing_bytecode(sys.executable, ["matplotlib.pyplot"])


@pytest.mark.skipif(
    os.geteuid() == 0,
    reason="root ignores file permissions: test_a_read_only_environment_for_nobody covers it",
)
def test_a_read_only_environment_is_left_alone(venv: Path) -> None:
    packages = site_packages(venv)
    subprocess.run(["chmod", "-R", "a-w", packages], check=True)
    try:
        assert compile_in_place(str(venv), [str(packages)]) is False
        assert missing_bytecode(str(venv), MODULES) == list(MODULES)
        assert not list(packages.rglob("*.pyc"))
    finally:
        subprocess.run(["chmod", "-R", "u+w", packages], check=True)


#: Run as nobody: this module, imported from a copy (the project's own environment may be out of
#: nobody's reach), checks and then tries to compile a venv that nobody cannot write.
_AS_NOBODY = """
import json, sys
sys.path.insert(0, sys.argv[1])
import bytecode
python, packages = sys.argv[2], sys.argv[3]
before = bytecode.missing_bytecode(python, ["six", "tabulate"])
compiled = bytecode.compile_in_place(python, [packages])
after = bytecode.missing_bytecode(python, ["six", "tabulate"])
print(json.dumps([before, compiled, after]))
"""


@pytest.fixture
def nobodys_venv() -> Iterator[Path]:
    """A venv under /tmp (root's: nobody reads it, cannot write it), from Debian's Python."""
    if os.geteuid() != 0:
        pytest.skip("needs root, to run as another user: the test above covers this user")
    if shutil.which("setpriv") is None or not os.path.exists(SYSTEM_PYTHON):
        pytest.fail(f"as root, this test needs setpriv and {SYSTEM_PYTHON} (Debian's python3.11)")
    root = Path(tempfile.mkdtemp(prefix="evaluator-bytecode-", dir="/tmp"))
    try:
        python = make_venv(root, SYSTEM_PYTHON)
        shutil.copy(bytecode.__file__, root / "bytecode.py")
        subprocess.run(["chmod", "-R", "a+rX,go-w", root], check=True)
        yield python
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_read_only_environment_for_nobody(nobodys_venv: Path) -> None:
    packages = site_packages(nobodys_venv)
    command: list[str | Path] = [
        "setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
        SYSTEM_PYTHON, "-I", "-c", _AS_NOBODY,
        nobodys_venv.parents[2], nobodys_venv, packages,
    ]  # fmt: skip
    started = time.monotonic()
    done = subprocess.run(
        command, cwd="/", env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [list(MODULES), False, list(MODULES)]
    assert time.monotonic() - started < 30
    assert not list(packages.rglob("*.pyc"))
    # The same venv, for root: it is compiled (root can write it).
    assert compile_in_place(str(nobodys_venv), [str(packages)]) is True
    assert missing_bytecode(str(nobodys_venv), MODULES) == []


def test_this_projects_environment_is_compiled() -> None:
    """pyproject.toml's ``compile-bytecode = true``: ``uv sync`` and ``uv run`` compile it.

    What the sandbox imports most is compiled, in the environment these tests run in (CI's:
    a fresh ``uv sync``): if not, every run compiles it again from source.
    """
    modules = bytecode.DEFAULT_MODULES
    assert set(modules) >= {"numpy", "pandas", "matplotlib"}
    find = "import importlib.util, sys; print(all(map(importlib.util.find_spec, sys.argv[1:])))"
    importable = subprocess.run(
        [sys.executable, "-I", "-c", find, *modules], capture_output=True, text=True, check=True
    ).stdout
    assert importable.strip() == "True", "the checked modules are installed (the check is real)"
    found = uncompiled(sys.executable, modules)
    assert found == [], "not compiled: " + "; ".join(map(str, found))


async def test_the_evaluator_compiles_its_runs_packages_at_start(
    nobodys_venv: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An environment made without bytecode is compiled once, in the background, and said so."""
    caplog.set_level(logging.INFO, logger="evaluator")
    settings = config(executable=str(nobodys_venv), preimport=("tabulate", "six"))
    async with Evaluator(settings) as evaluator:
        result = await evaluator.run(EvalRequest(args=("-c", "import six, tabulate; print(1)")))
        assert (result.returncode, result.stdout) == (0, "1\n")
    # Closing waits for the compilation.
    assert missing_bytecode(str(nobodys_venv), MODULES) == []
    assert loaded_from_bytecode(nobodys_venv, "tabulate")
    messages = [record.getMessage() for record in caplog.records]
    assert any("have no fresh bytecode" in message for message in messages), messages
    assert any("compiled the bytecode of six, tabulate" in message for message in messages)
