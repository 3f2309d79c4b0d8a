"""Run the prelude for real, the way the sandbox does: files in a working directory, one process."""

import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from plotting import CODE_NAME, PRELUDE_NAME, build_request, prelude_files
from snekbox_client import EvalRequest, File

#: The project's interpreter (the venv's, so matplotlib is importable), with the flags a
#: sandbox is likely to use: ignore PYTHON* variables and the user's site-packages.
PYTHON = [sys.executable, "-E", "-s"]


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
) -> Run:
    """Write the request's files into ``workdir`` and run the interpreter with its args there.

    stdout and stderr share one pipe, as in Snekbox; stdout is not forced unbuffered, so the
    prelude's own care for output order is what keeps it.
    """
    assert request.args is not None and request.input is None
    for file in request.files:
        (workdir / file.path).write_bytes(file.content)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
    if "HOME" in os.environ:  # matplotlib's font cache lives there
        env["HOME"] = os.environ["HOME"]
    env.update(extra_env or {})
    proc = subprocess.run(
        [*PYTHON, *request.args],
        cwd=workdir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=timeout,
        check=False,
    )
    return Run(proc.stdout.decode("utf-8", "replace"), proc.returncode, workdir, proc.stdout)


RunCode = Callable[..., Run]


@pytest.fixture
def run_code(tmp_path: Path) -> RunCode:
    """``run_code(code, files=..., extra_env=...)``: run ``code`` through the prelude in a temp dir.

    ``code`` as ``bytes`` is sent as it is, to try sources ``build_request`` would not produce.
    """

    def run(
        code: str | bytes,
        *,
        files: dict[str, bytes] | None = None,
        extra_env: dict[str, str] | None = None,
    ) -> Run:
        for name, content in (files or {}).items():
            (tmp_path / name).write_bytes(content)
        if isinstance(code, str):
            request = build_request(code)
        else:
            sent = (*prelude_files(), File(CODE_NAME, code))
            request = EvalRequest(args=[PRELUDE_NAME], files=sent)
        return run_request(request, tmp_path, extra_env=extra_env)

    return run
