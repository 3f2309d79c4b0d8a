"""Run the prelude for real, the way the sandbox does: files in a working directory, one process."""

import marshal
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from plotting import BUNDLE_NAME, PRELUDE_NAME, build_request, prelude_files
from snekbox_client import EvalRequest, File

#: The project's interpreter (the venv's, so matplotlib is importable), with the flags a
#: sandbox is likely to use: ignore PYTHON* variables and the user's site-packages.
PYTHON = [sys.executable, "-E", "-s"]

#: An interpreter kept warm, as an evaluator may keep one: numpy, pandas and pyplot imported
#: (Agg chosen before pyplot, no figure made) before the run's first file is run as a script,
#: in the working directory, with the argv python would have given it.
WARM_RUNNER = """
import runpy, sys
import numpy, pandas
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot
{setup}
sys.argv = [{prelude!r}]
runpy.run_path({prelude!r}, run_name="__main__")
"""


@dataclass(frozen=True)
class Run:
    """What a run leaves: merged stdout and stderr, the exit status, the working directory.

    ``output`` is ``raw`` decoded with U+FFFD for what is not UTF-8; ``raw`` is the bytes as the
    evaluator would read them.
    """

    output: str
    returncode: int
    workdir: Path
    raw: bytes = b""

    def files(self) -> list[str]:
        """Names in the working directory after the run, sorted."""
        return sorted(os.listdir(self.workdir))


def run_request(
    request: EvalRequest,
    workdir: Path,
    *,
    extra_env: dict[str, str] | None = None,
    timeout: float = 60,
    warm: bool | str = False,
) -> Run:
    """Write the request's files into ``workdir`` and run the interpreter with its args there.

    stdout and stderr share one pipe, as in Snekbox; stdout is not forced unbuffered, so the
    prelude's own care for output order is what keeps it. ``warm``: the interpreter runs
    :data:`WARM_RUNNER`, which runs the request's first file; a string is more code for it
    to run before.
    """
    assert request.args is not None and request.input is None
    for file in request.files:
        (workdir / file.path).write_bytes(file.content)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
    if "HOME" in os.environ:  # matplotlib's font cache lives there
        env["HOME"] = os.environ["HOME"]
    env.update(extra_env or {})
    proc = subprocess.run(
        [*PYTHON, "-c", warm_runner(warm)] if warm is not False else [*PYTHON, *request.args],
        cwd=workdir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=timeout,
        check=False,
    )
    return Run(proc.stdout.decode("utf-8", "replace"), proc.returncode, workdir, proc.stdout)


RunCode = Callable[..., Run]


def warm_runner(warm: bool | str) -> str:
    setup = warm if isinstance(warm, str) else ""
    return WARM_RUNNER.format(setup=setup, prelude=PRELUDE_NAME)


def from_source(request: EvalRequest) -> EvalRequest:
    """``request`` as an interpreter with another bytecode format than this one sees it: the
    bundle's magic number is not its own, so the prelude and support module are compiled from
    their sources."""
    files = []
    for file in request.files:
        if file.path == BUNDLE_NAME:
            # The head after the magic number: prelude code and source, code, tail size, digest.
            _, *head = marshal.loads(file.content)
            tail = file.content[-head[3] :]
            file = File(BUNDLE_NAME, marshal.dumps((b"\0\0\0\0", *head), 4) + tail)
        files.append(file)
    return EvalRequest(args=request.args, files=files)


def runner(workdir: Path) -> RunCode:
    """``run(code, files=..., extra_env=..., compiled=..., warm=...)``: run ``code`` through the
    prelude in ``workdir``.

    ``code`` as ``bytes`` is sent as it is, to try sources ``build_request`` would not produce.
    ``compiled=False``: as an interpreter that cannot load the gateway's bytecode runs it (see
    :func:`from_source`). ``warm``: in an interpreter kept warm (see :func:`run_request`).
    """

    def run(
        code: str | bytes,
        *,
        files: dict[str, bytes] | None = None,
        extra_env: dict[str, str] | None = None,
        compiled: bool = True,
        warm: bool | str = False,
    ) -> Run:
        for name, content in (files or {}).items():
            (workdir / name).write_bytes(content)
        if isinstance(code, str):
            request = build_request(code)
        else:
            request = EvalRequest(args=[PRELUDE_NAME], files=prelude_files(code))
        if not compiled:
            request = from_source(request)
        return run_request(request, workdir, extra_env=extra_env, warm=warm)

    return run


@pytest.fixture
def run_code(tmp_path: Path) -> RunCode:
    """``run_code(code, ...)``: run ``code`` through the prelude in a temp dir (see runner())."""
    return runner(tmp_path)
