"""The evaluator run by an ordinary user: no mounts, no cgroups, so the rlimit fallbacks hold.

CI runs as root, where the evaluator has cgroups and a tmpfs per run; a laptop user has neither.
This starts ``python -m evaluator`` as uid 65534 (``setpriv``) from a venv that user can read
(the project's own interpreter lives under ``/root``, which it cannot), built with ``uv`` from
Debian's ``/usr/bin/python3.11``. When the suite itself runs unprivileged, every other test
already covers this path.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support import closed_port, wait_until_answers

from . import isolation

PROJECT = Path(__file__).resolve().parents[2]
NOBODY = 65534
SYSTEM_PYTHON = "/usr/bin/python3.11"

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="already unprivileged: the rest of the suite tests this path"
)


@pytest.fixture(scope="module")
def venv() -> Iterator[Path]:
    uv = shutil.which("uv")
    if uv is None or not os.path.exists(SYSTEM_PYTHON):
        pytest.fail(f"this test needs uv and {SYSTEM_PYTHON} (Debian's python3.11)")
    root = Path(tempfile.mkdtemp(prefix="evaluator-unprivileged-", dir="/tmp"))
    try:
        env = Path(root, "venv")
        subprocess.run([uv, "venv", "-q", "--python", SYSTEM_PYTHON, env], check=True)
        install = [uv, "pip", "install", "-q", "--python", env / "bin" / "python", PROJECT]
        subprocess.run(install, check=True, timeout=600)
        subprocess.run(["chmod", "-R", "a+rX", root], check=True)
        yield env
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def service(venv: Path) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    port = closed_port()
    command = [
        "setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
        venv / "bin" / "python", "-m", "evaluator", "--port", str(port), "--time-limit", "2",
    ]  # fmt: skip
    process = subprocess.Popen(
        command,
        cwd="/",
        env={"PATH": "/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        assert wait_until_answers(f"{url}/eval", process, method="OPTIONS").status_code == 200
    except RuntimeError:
        pytest.fail("the unprivileged evaluator exited:\n" + process.communicate()[0])
    try:
        yield url, process
    finally:
        process.terminate()
        process.wait(timeout=30)


def run(url: str, code: str) -> dict[str, object]:
    answer = httpx.post(f"{url}/eval", json={"input": code}, timeout=30)
    assert answer.status_code == 200, answer.text
    return answer.json()  # type: ignore[no-any-return]


def test_runs_as_nobody_in_its_own_namespaces(service: tuple[str, object]) -> None:
    url, _ = service
    code = (
        "import os, socket\n"
        "print(os.getuid(), os.getpid())\n"
        "try:\n"
        f"    socket.create_connection(('127.0.0.1', {url.rsplit(':', 1)[1]}), timeout=2)\n"
        "except OSError as e:\n"
        "    print('refused', e.errno)\n"
        "for path in ('/tmp/x', '/etc/passwd', '/x'):\n"
        "    try:\n"
        "        open(path, 'w')\n"
        "    except OSError as e:\n"
        "        print(path, 'refused')\n"
    )
    result = run(url, code)
    assert result["returncode"] == 0
    lines = str(result["stdout"]).splitlines()
    assert lines[0].startswith(f"{NOBODY} ") and int(lines[0].split()[1]) < 10, "own PID namespace"
    assert lines[1:] == ["refused 111", "/tmp/x refused", "/etc/passwd refused", "/x refused"]


def test_limits_fall_back_to_rlimits_and_say_so(service: tuple[str, object]) -> None:
    url, _ = service
    memory = run(url, "x = bytearray(1024 * 1024 * 1024)")
    assert memory["returncode"] == 1 and "MemoryError" in str(memory["stdout"])
    forks = run(url, "import os\nfor _ in range(200):\n    os.fork() or os._exit(0)\nprint('?')")
    assert forks["returncode"] == 1 and "BlockingIOError" in str(forks["stdout"])
    spin = run(url, "while True: pass")
    assert spin["returncode"] == 137


def test_shared_isolation_checks_hold_for_an_ordinary_user(
    service: tuple[str, object],
) -> None:
    url, _ = service
    identity = run(url, isolation.IDENTITY)
    assert identity["returncode"] == 0, identity["stdout"]
    isolation.check_identity(str(identity["stdout"]))
    sockets = run(url, isolation.SOCKETS)
    assert sockets["returncode"] == 0, sockets["stdout"]
    isolation.check_sockets(str(sockets["stdout"]))


def test_a_run_sharing_the_users_uid_gets_no_inotify_instance(
    service: tuple[str, object],
) -> None:
    """Runs share this user's per-user quotas, so the one a run could exhaust is refused."""
    url, _ = service
    result = run(url, isolation.inotify_hog(hold=0))
    assert str(result["stdout"]).split() == ["0", "24"]  # none taken: EMFILE at once


# Last: it stops the module's service.
def test_startup_log_tells_which_limits_hold(
    service: tuple[str, subprocess.Popen[str]],
) -> None:
    url, process = service
    run(url, "print(1)")
    process.terminate()
    log = process.communicate(timeout=30)[0]
    assert "no memory cgroup; address-space rlimit" in log
    assert f"RLIMIT_NPROC 65 (counts every process of uid {NOBODY})" in log
    assert "limit working directory: NOT ENFORCED" in log
