"""The evaluator run by an ordinary user: no mounts, no cgroups, so the rlimit fallbacks hold.

CI runs as root, where the evaluator has cgroups and a tmpfs per run; a laptop user has neither.
This starts ``python -m evaluator`` as uid 65534 (``setpriv``) from a venv that user can read
(the project's own interpreter lives under ``/root``, which it cannot), built with ``uv`` from
Debian's ``/usr/bin/python3.11``. When the suite itself runs unprivileged, every other test
already covers this path.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

import plotting
from evaluator import EvaluatorConfig, limits
from evaluator.cgroups import Cgroups
from tests.support import closed_port, connect, wait_until_answers

from . import dropped_binaries, isolation
from .lockouts import LOCKOUTS, code, directories_marked

PROJECT = Path(__file__).resolve().parents[2]
NOBODY = 65534
SYSTEM_PYTHON = "/usr/bin/python3.11"

pytestmark = [
    pytest.mark.skipif(
        os.geteuid() != 0, reason="already unprivileged: the rest of the suite tests this path"
    ),
    # Its evaluators run as nobody, whose processes the kernel counts together outside the
    # runs' own namespaces: under pytest-xdist (--dist loadgroup), the modules that run code as
    # nobody share a worker.
    pytest.mark.xdist_group("uid-nobody"),
]


@pytest.fixture(scope="module")
def venv() -> Iterator[Path]:
    uv = shutil.which("uv")
    if uv is None or not os.path.exists(SYSTEM_PYTHON):
        pytest.fail(f"this test needs uv and {SYSTEM_PYTHON} (Debian's python3.11)")
    # Under /home, as a laptop user's checkout is: the sandbox binds it there, read-only, and
    # its working directory is elsewhere (the root suite's runs keep /home).
    root = Path(tempfile.mkdtemp(prefix="evaluator-unprivileged-", dir="/home"))
    try:
        env = Path(root, "venv")
        subprocess.run([uv, "venv", "-q", "--python", SYSTEM_PYTHON, env], check=True)
        python = env / "bin" / "python"
        # Compiled, as the project's own environment is (pyproject.toml): nobody's runs read it.
        install: list[str | Path] = [
            uv, "pip", "install", "-q", "--compile-bytecode", "--python", python, PROJECT,
        ]  # fmt: skip
        subprocess.run(install, check=True, timeout=600)
        subprocess.run(["chmod", "-R", "a+rX", root], check=True)
        yield env
    finally:
        shutil.rmtree(root, ignore_errors=True)


@contextmanager
def nobody_evaluator(
    venv: Path,
    time_limit: float,
    tmpdir: str = "/tmp",
    flags: tuple[str, ...] = (),
    prefix: tuple[str, ...] = (),
) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """``python -m evaluator`` as nobody, its private directory in ``tmpdir``, its command line
    after ``prefix`` (``prlimit``, say); yields its URL."""
    port = closed_port()
    command: list[str | Path] = [
        *prefix, "setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
        venv / "bin" / "python", "-m", "evaluator", "--port", str(port),
        "--time-limit", str(time_limit), *flags,
    ]  # fmt: skip
    process = subprocess.Popen(
        command,
        cwd="/",
        env={"PATH": "/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8", "TMPDIR": tmpdir},
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


@pytest.fixture(scope="module")
def service(venv: Path) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """Nobody's evaluator, with a time limit no run a test means to finish comes near (a pool
    of processes importing numpy took more than 2 s on a loaded host)."""
    with nobody_evaluator(venv, 30) as started:
        yield started


def run(url: str, code: str, **body: object) -> dict[str, object]:
    answer = httpx.post(f"{url}/eval", json={"input": code, **body}, timeout=90)
    assert answer.status_code == 200, answer.text
    return answer.json()  # type: ignore[no-any-return]


def test_an_environment_under_home_is_bound_there_and_the_code_works_elsewhere(
    service: tuple[str, subprocess.Popen[str]], venv: Path
) -> None:
    """A checkout in a home directory: its venv (and a Python installed there) stays visible,
    read-only, where the working directory would hide it; the code works in /sandbox."""
    url, _ = service
    code = (
        "import os, sys\nprint(os.getcwd(), os.environ['HOME'], os.environ['TMPDIR'])\n"
        "print(sys.prefix)\nprint([f for f in os.listdir() if not f.startswith('.')])\n"
        "open('out.txt', 'w').write('x')\n"
        "try:\n    open(sys.prefix + '/x', 'w')\nexcept OSError as e:\n    print(e.errno)"
    )
    result = run(url, code)
    assert result["returncode"] == 0, result
    assert str(result["stdout"]).splitlines() == [
        "/sandbox /sandbox /sandbox/.tmp",
        str(venv),
        "[]",
        "30",  # EROFS
    ]
    assert [f["path"] for f in result["files"]] == ["out.txt"]  # type: ignore[attr-defined]


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
    started = time.monotonic()
    spin = run(url, "while True: pass", time_limit=2)
    assert (spin["returncode"], spin["ended_by"]) == (137, "time_limit")
    assert time.monotonic() - started < 20  # at its own limit, not the service's 30 s
    # Without a memory cgroup, a SIGKILL the jail did not send may be the kernel's OOM killer
    # or the code's own: the answer does not say.
    killed = run(url, "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert killed["returncode"] == 137 and "ended_by" not in killed


def test_a_live_session_for_an_ordinary_user(service: tuple[str, object]) -> None:
    """Cells share one interpreter; a time limit interrupts (the rlimit fallbacks change
    nothing there), and ending the session ends its interpreter."""
    url, _ = service

    def cell(code: str, **body: object) -> dict[str, object]:
        return run(url, code, session="nobody", **body)

    assert cell("import os\nkept = os.getuid()")["session_ended"] is False
    started = time.monotonic()
    spin = cell("while True: pass", time_limit=2)
    assert time.monotonic() - started < 20  # at its own limit, not the service's 30 s
    assert (spin["returncode"], spin["ended_by"], spin["session_ended"]) == (
        130,
        "time_limit",
        False,
    )
    assert cell("print(kept)")["stdout"] == f"{NOBODY}\n"
    assert httpx.delete(f"{url}/sessions/nobody", timeout=30).status_code == 204
    assert cell("print('kept' in globals())")["stdout"] == "False\n"


def test_a_sessions_later_cells_run_the_prelude_it_kept(service: tuple[str, object]) -> None:
    """The gateway's requests, as an ordinary user's evaluator gets them: later cells come
    without the prelude and run the one the first cell kept."""
    url, _ = service

    def cell(code: str, *, later_cell: bool = True) -> dict[str, object]:
        request = plotting.build_request(code, later_cell=later_cell).to_json()
        answer = httpx.post(f"{url}/eval", json={**request, "session": "prelude"}, timeout=60)
        assert answer.status_code == 200, answer.text
        return answer.json()  # type: ignore[no-any-return]

    assert cell("import os\nuid = os.getuid()", later_cell=False)["returncode"] == 0
    assert cell("uid")["stdout"] == f"{NOBODY}\n"
    assert str(cell("print('a\\udcff')")["stdout"]).startswith("a\ufffd\n")
    failed = cell("1 / 0")
    assert failed["returncode"] == 1 and "_mcp" not in str(failed["stdout"]), failed


def test_an_ordinary_users_sandboxes_made_ahead_load_the_prelude(
    service: tuple[str, object],
) -> None:
    """The gateway's first cell of a session, sent without the prelude, finds the one the
    evaluator keeps resident already loaded by a sandbox made ahead (``warm.py``), and draws
    with it; the service makes them one at a time for nobody, so a few tries may start cold."""
    url, _ = service
    code = "import sys, matplotlib.pyplot as plt\nplt.plot([1, 2])\n"
    request = plotting.build_request(code + "sys._mcp_prelude['_loaded_ahead']", resident=True)
    deadline = time.monotonic() + 240
    for attempt in itertools.count():
        session = f"ahead-{attempt}"
        body = {**request.to_json(), "session": session}
        answer = httpx.post(f"{url}/eval", json=body, timeout=90).json()
        httpx.delete(f"{url}/sessions/{session}", timeout=30)
        assert answer["returncode"] == 0, answer
        if answer["stdout"] == "True\n" or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert answer["stdout"] == "True\n", answer
    assert [f["path"] for f in answer["files"] if f["path"].endswith(".png")] == ["figure_001.png"]


def test_every_live_session_starts_on_a_shared_uid(venv: Path) -> None:
    """Every run has the service's uid, which the kernel counts all together outside the runs'
    own user namespaces: the sandboxes the service keeps (ready ones, a full house of live
    sessions) leave a session's interpreter room to start and a one-shot run room to fork."""
    sessions = 16  # 5 tasks each (bubblewrap's two, three threads): 80, over a single run's 64
    flags = ("--max-sessions", str(sessions))
    with (
        nobody_evaluator(venv, 30, flags=flags) as (url, _),
        httpx.Client(base_url=url, timeout=60) as client,
    ):
        for n in range(sessions):
            cell = {"input": "import os\nprint(os.getuid())", "session": f"s{n}"}
            answer = client.post("/eval", json=cell).json()
            assert (answer["stdout"], answer["returncode"]) == (f"{NOBODY}\n", 0), (n, answer)
        fork = "import os\nfor _ in range(8):\n    os.fork() or os._exit(0)\nprint('forked')"
        answer = client.post("/eval", json={"input": fork}).json()
        assert (answer["stdout"], answer["returncode"]) == ("forked\n", 0), answer
        again = client.post("/eval", json={"input": "print(os.getuid())", "session": "s0"})
        assert again.json()["stdout"] == f"{NOBODY}\n", "the first session was not kept"


def test_runs_start_after_the_users_other_processes_grew(venv: Path) -> None:
    """Each run's RLIMIT_NPROC counts the tasks of its own user namespace, not every task of the
    uid: a user whose other processes grew since the service started (a browser, a build) still
    gets runs. A limit of the uid's tasks at start plus room refused every new sandbox then
    ("bwrap: Creating new namespace failed: Resource temporarily unavailable"), the ready one
    made ahead too."""
    flags = ("--concurrency", "1", "--max-sessions", "2", "--warm-sandboxes", "0")
    grow = (  # 150 more tasks of the uid until its stdin closes, then reaped (no zombie stays)
        "import os, signal, sys, time\n"
        "children = []\n"
        "for _ in range(150):\n"
        "    child = os.fork()\n"
        "    if child == 0:\n"
        "        time.sleep(600); os._exit(0)\n"
        "    children.append(child)\n"
        "print('grown', flush=True); sys.stdin.read()\n"
        "for child in children:\n"
        "    os.kill(child, signal.SIGKILL)\n"
        "for child in children:\n"
        "    os.waitpid(child, 0)\n"
    )
    with nobody_evaluator(venv, 30, flags=flags) as (url, _):
        assert run(url, "print(1)")["stdout"] == "1\n"
        others = subprocess.Popen(
            ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
             SYSTEM_PYTHON, "-c", grow],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True,
        )  # fmt: skip
        try:
            assert others.stdout is not None and others.stdout.readline() == "grown\n"
            for code in ("print(1)", "print(2)"):  # the ready sandbox, then one made now
                answer = run(url, code)
                assert (answer["stdout"], answer["returncode"]) == (code[6] + "\n", 0), answer
            forks = "import os\nfor _ in range(8):\n    os.fork() or os._exit(0)\nprint('forked')"
            assert run(url, forks)["stdout"] == "forked\n"
            cell = run(url, "print(3)", session="grown")
            assert (cell["stdout"], cell["returncode"]) == ("3\n", 0), cell
        finally:
            assert others.stdin is not None
            others.stdin.close()
            try:
                others.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(others.pid, signal.SIGKILL)
                raise


@pytest.mark.skipif(
    not limits.kernel_counts_nproc_per_namespace(),
    reason=f"Linux {os.uname().release} counts RLIMIT_NPROC per user, not per user namespace: "
    "no bound per run for runs sharing a uid (the readiness test checks /readyz says so)",
)
def test_a_run_holding_all_the_processes_it_may_leaves_other_runs_theirs(
    service: tuple[str, object],
) -> None:
    """Runs share nobody's uid, but each one's RLIMIT_NPROC is set in its own user namespace,
    where the kernel counts that run's tasks alone: a session that forks until refused, and
    keeps its children, leaves a one-shot run beside it its own 64 (with one RLIMIT_NPROC for
    the uid, the session took what every run shared, and the next could not start)."""
    hog = (
        "import os\n"
        "r, w = os.pipe()\n"
        "held = 0\n"
        "try:\n"
        "    while True:\n"
        "        if os.fork() == 0:\n"
        "            os.close(w); os.read(r, 1); os._exit(0)\n"
        "        held += 1\n"
        "except BlockingIOError:\n"
        "    print('held', held)\n"
    )
    url, _ = service
    # Its limit holds: the children stay zombies, and the 65th fork is refused.
    zombies = run(url, "import os\nfor _ in range(5000):\n    os.fork() or os._exit(0)\nprint('?')")
    assert zombies["returncode"] == 1 and "BlockingIOError" in str(zombies["stdout"]), zombies
    try:
        took = run(url, hog, session="hog")
        assert took["returncode"] == 0, took
        held = int(str(took["stdout"]).split()[1])
        assert 40 < held < 64, took  # its 64, less the sandbox's own tasks
        forks = "import os\nfor _ in range(40):\n    os.fork() or os._exit(0)\nprint('forked')"
        for _ in range(2):
            answer = run(url, forks)
            assert (answer["stdout"], answer["returncode"]) == ("forked\n", 0), answer
        tasks = "print(held, sum(p.isdigit() for p in os.listdir('/proc')))"
        still = str(run(url, tasks, session="hog")["stdout"]).split()
        assert still[0] == str(held) and int(still[1]) > held, still  # its children live on
    finally:
        httpx.delete(f"{url}/sessions/hog", timeout=30)


@pytest.mark.skipif(
    not limits.kernel_counts_nproc_per_namespace(),
    reason=f"Linux {os.uname().release}: no RLIMIT_NPROC per run for runs sharing a uid",
)
def test_a_runs_nproc_stays_within_the_users_hard_limit(venv: Path) -> None:
    """A launcher may lower its hard RLIMIT_NPROC, never raise it (that takes a capability of
    the host's namespace): a user whose hard limit is below the processes asked per run gets
    that, said so, and keeps its tmpfs (asking for more failed every launcher, and the service
    went on without either bound, saying its tmpfs could not be mounted)."""
    # High enough for every task nobody has (this module's other service, its sessions): the
    # kernel checks them all against the soft limit, the one the launchers' namespaces record.
    prefix = ("prlimit", "--nproc=2000:2000", "--")
    flags = ("--pids-limit", "5000")
    with nobody_evaluator(venv, 30, flags=flags, prefix=prefix) as (url, process):
        answer = run(url, "print(1)")
        assert (answer["stdout"], answer["returncode"]) == ("1\n", 0), answer
        process.terminate()
        log = process.communicate(timeout=30)[0]
    assert "5000 asked" not in log and "cannot be mounted" not in log, log
    assert "RLIMIT_NPROC 2000 of the run's own user namespace" in log, log
    assert "PIDS_LIMIT 5000 is above this user's hard RLIMIT_NPROC: each run gets 2000" in log, log
    assert "soft RLIMIT_NPROC (2000) bounds all its processes and threads together" in log, log
    assert "limit working directory: 48 MiB tmpfs" in log, log


@pytest.mark.parametrize(
    ("release", "counts"),
    [
        ("4.19.0-26-amd64", False),
        ("5.10.0-28-amd64", False),
        ("5.13.19", False),
        ("5.14.0-362.el9.x86_64", True),
        ("6.18.44-fc-v1272", True),
        ("unknown", False),
    ],
)
def test_a_runs_own_nproc_needs_a_kernel_that_counts_it_per_namespace(
    release: str, counts: bool
) -> None:
    assert limits.kernel_counts_nproc_per_namespace(release) is counts


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
    # No mount privilege here: the run's launcher mounts its tmpfs in a namespace of its own.
    disk = run(url, isolation.DISK)
    assert disk["returncode"] == 0, disk["stdout"]
    isolation.check_disk(str(disk["stdout"]))


def test_a_dropped_binary_runs_neither_from_dev_shm_nor_from_a_memfd(
    service: tuple[str, object],
) -> None:
    """As for root (test_isolation.py): here the launcher mounts the noexec /dev/shm."""
    url, _ = service
    dropped = run(url, dropped_binaries.DROP_AND_EXECUTE)
    assert dropped["returncode"] == 0, dropped["stdout"]
    dropped_binaries.check_not_executed(str(dropped["stdout"]))
    works = run(url, dropped_binaries.SHM_STILL_WORKS)
    assert works["returncode"] == 0, works["stdout"]
    dropped_binaries.check_shm_still_works(str(works["stdout"]))


def test_a_sessions_traps_neither_redirect_nor_hold_up_its_files(
    service: tuple[str, object],
) -> None:
    """As for root (test_isolation.py): here a followed symlink would write as nobody, so the
    host file and directory are nobody's."""
    url, _ = service
    base = Path(tempfile.mkdtemp(prefix="evaluator-traps-", dir="/tmp"))
    try:
        base.chmod(0o711)
        host = base / "host"
        isolation.make_victim(host, NOBODY)

        def call(code: str, files: list[dict[str, str]] | None = None) -> dict[str, Any]:
            body = {"input": code, "session": "traps", "files": files or []}
            answer = httpx.post(f"{url}/eval", json=body, timeout=30)
            assert answer.status_code == 200, answer.text
            return answer.json()  # type: ignore[no-any-return]

        assert call(isolation.session_traps(host))["stdout"] == "set\n"
        for path in isolation.TRAPPED_PATHS:
            content = base64.b64encode(b"x").decode()
            isolation.check_trap_refused(
                path, call("print('ran')", [{"path": path, "content": content}])
            )
        isolation.check_victim_untouched(host, NOBODY)
        ok = call(
            "print(open('sub/ok.txt').read())", [{"path": "sub/ok.txt", "content": "ZmluZQ=="}]
        )
        assert ok["stdout"] == "fine\n", ok
    finally:
        httpx.delete(f"{url}/sessions/traps", timeout=30)
        shutil.rmtree(base, ignore_errors=True)


def test_a_run_sharing_the_users_uid_gets_no_inotify_instance(
    service: tuple[str, object],
) -> None:
    """Runs share this user's per-user quotas, so the one a run could exhaust is refused."""
    url, _ = service
    result = run(url, isolation.inotify_hog(hold=0))
    assert str(result["stdout"]).split() == ["0", "24"]  # none taken: EMFILE at once


@pytest.mark.parametrize("name", LOCKOUTS)
def test_a_run_that_locks_out_its_files_is_answered_and_removed(
    service: tuple[str, subprocess.Popen[str]], name: str
) -> None:
    url, process = service
    marker = f".marker-{uuid.uuid4().hex}"
    result = run(url, code(name, marker))
    assert result["returncode"] == 0, result["stdout"]
    files = result["files"]
    assert isinstance(files, list)
    assert {f["path"]: base64.b64decode(f["content"]).decode() for f in files} == LOCKOUTS[name][1]
    assert run(url, "print(1)")["stdout"] == "1\n"
    [root] = Path("/tmp").glob(f"evaluator-{process.pid}-*")
    deadline = time.monotonic() + 10  # removed in the background, after the answer
    while directories_marked(root, marker):
        assert time.monotonic() < deadline, "the working directory is still there"
        time.sleep(0.05)


#: As nobody, with the service's own code: lock-outs, a symlink to a locked directory outside.
_REPAIR = """
import json, os, sys
from pathlib import Path
from evaluator.workdir import Workdir
base = Path(sys.argv[1])
outside, tree = base / "outside", base / "run-x"
outside.mkdir(); (outside / "secret").write_text("secret"); os.chmod(outside, 0)
(tree / "a" / "b").mkdir(parents=True)
(tree / "a" / "b" / "f.txt").write_text("f"); (tree / "top.txt").write_text("top")
os.symlink(outside, tree / "a" / "outside")
os.chmod(tree / "top.txt", 0); os.chmod(tree / "a" / "b", 0o100); os.chmod(tree / "a", 0o600)
os.chmod(tree, 0o300)
workdir = Workdir(tree, False, 1 << 20)
files = workdir.collect({}, max_files=100, timeout=5)
workdir.remove()
print(json.dumps({
    "files": {f.path: f.content.decode() for f in files},
    "removed": not tree.exists(),
    "outside": oct(os.stat(outside).st_mode & 0o777),
}))
"""


def test_collection_and_removal_give_back_permissions_never_through_a_symlink(
    venv: Path,
) -> None:
    base = Path(tempfile.mkdtemp(prefix="evaluator-repair-", dir="/tmp"))
    try:
        os.chown(base, NOBODY, NOBODY)
        as_nobody = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
        done = subprocess.run(
            [*as_nobody, venv / "bin" / "python", "-c", _REPAIR, base],
            capture_output=True, text=True, timeout=60, cwd="/", check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == {
            "files": {"a/b/f.txt": "f", "top.txt": "top"},
            "removed": True,
            "outside": "0o0",  # the symlink's target was never touched
        }
    finally:
        shutil.rmtree(base)


def test_a_start_is_not_stopped_by_what_a_dead_evaluator_left(venv: Path) -> None:
    base = Path(tempfile.mkdtemp(prefix="evaluator-sweep-", dir="/tmp"))
    try:
        base.chmod(0o777)
        finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                                  capture_output=True, text=True, check=True)  # fmt: skip
        dead = int(finished.stdout)
        # Locked out: removable by its owner, once it gives itself back the permissions.
        locked = base / f"evaluator-{dead}-locked"
        (locked / "run-x" / "d" / "e").mkdir(parents=True)
        (locked / "run-x" / "d" / "e" / "f").write_text("f")
        # Not removable by nobody: a directory of root's inside.
        stuck = base / f"evaluator-{dead}-stuck"
        (stuck / "root-owned").mkdir(parents=True)
        (stuck / "root-owned" / "f").write_text("f")
        for path in [locked, *locked.rglob("*"), stuck]:
            os.chown(path, NOBODY, NOBODY)
        for path in sorted(locked.rglob("*"), key=lambda p: len(p.parts), reverse=True):
            path.chmod(0)
        locked.chmod(0o300)
        with nobody_evaluator(venv, 30, str(base)) as (url, process):
            assert run(url, "print(1)")["stdout"] == "1\n"
            process.terminate()
            log = process.communicate(timeout=30)[0]
        assert not locked.exists()
        assert (stuck / "root-owned" / "f").exists()
        assert f"could not remove {stuck}, left by evaluator process {dead}" in log
    finally:
        shutil.rmtree(base)


def nobodys_gateway(
    venv: Path, prefix: tuple[str, ...] = (), env: dict[str, str] | None = None
) -> tuple[httpx.Response, str, str]:
    """``python-mcp-server`` as nobody, after ``prefix``, with ``env`` added: its answer to
    /readyz, its tool's description and its log, once stopped."""
    port = closed_port()
    command: list[str | Path] = [
        *prefix, "setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
        venv / "bin" / "python-mcp-server", "--port", str(port),
    ]  # fmt: skip
    environment = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8", **(env or {})}
    process = subprocess.Popen(command, cwd="/", env=environment, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        ready = wait_until_answers(f"http://127.0.0.1:{port}/readyz", process)
        description = anyio.run(_tool_description, f"http://127.0.0.1:{port}")
    except Exception as exc:
        pytest.fail(f"{exc!r}; the unprivileged gateway's log:\n{_stopped(process)}")
    return ready, description, _stopped(process)


def _stopped(process: subprocess.Popen[str]) -> str:
    """The output of ``process``, stopped: terminated, and killed if it has not ended 30 s on."""
    process.terminate()
    try:
        return process.communicate(timeout=30)[0]
    except subprocess.TimeoutExpired:
        process.kill()
        return process.communicate()[0]


def test_the_gateways_readiness_names_the_limits_it_cannot_enforce(venv: Path) -> None:
    """As an ordinary user (no mounts, no cgroups here): /readyz says which limits are weaker."""
    ready, description, _ = nobodys_gateway(venv)
    # What cannot be enforced here is not promised to the model either; what can, is.
    assert "wall-clock" in description and "working directory holds" in description
    assert "MemoryError" in description
    body = ready.json()
    assert body["status"] == "ready"
    weaker = {item["limit"]: item["how"] for item in body["not_enforced"]}
    assert "user" in weaker and "working directory" not in weaker, body
    per_run = limits.kernel_counts_nproc_per_namespace()  # on a host that can mount: this one
    assert ("processes" not in weaker) is per_run, body
    assert ("64 processes and threads" in description) is per_run, description


@pytest.mark.skipif(
    not limits.kernel_counts_nproc_per_namespace(), reason="no RLIMIT_NPROC per run here"
)
def test_the_tool_states_the_processes_a_run_gets_where_the_users_limits_lower_them(
    venv: Path,
) -> None:
    """A hard RLIMIT_NPROC below the setting lowers each run's, and the soft one bounds every
    task of the user (the runs' and the service's) together: the model is told the lowest; a
    soft limit below what the runs at once may hold is warned about."""
    # Room for every task nobody has (this module's other service, its sessions): all count.
    prefix = ("prlimit", "--nproc=1000:2000", "--")
    ready, description, log = nobodys_gateway(venv, prefix, {"EVALUATOR_PIDS_LIMIT": "5000"})
    assert ready.status_code == 200, ready.text
    assert "1000 processes and threads" in description, description
    assert "5000" not in description and "2000" not in description, description
    assert "hard RLIMIT_NPROC: each run gets 2000 processes and threads" in log, log
    assert "this user's soft RLIMIT_NPROC (1000) bounds all its processes" in log, log
    assert "of 2000 each do not fit in it" in log and "up to the hard limit, 2000" in log, log


async def _tool_description(url: str) -> str:
    async with connect(url, "http") as client:
        tools = (await client.list_tools()).tools
    (tool,) = [t for t in tools if t.name == "execute_python_code"]
    return tool.description or ""


#: As nobody: an evaluator in its process, a reading of /proc/meminfo short of memory once
#: both sessions are open, until the watchdog ended one (see test_memory_watchdog.py).
_WATCHDOG = """
import asyncio, json
from evaluator import Evaluator, EvaluatorConfig, SessionNotFound
from evaluator.watchdog import MemInfo
from snekbox_client import EvalRequest

GiB = 1 << 30
short = False

def reading():
    if short and evaluator.sessions_ended_for_memory == 0:
        return MemInfo(24 * GiB, GiB)
    return MemInfo(24 * GiB, 20 * GiB)

async def cell(session, code, resume=False):
    request = EvalRequest(args=("-c", code), session=session, session_resume=resume)
    return await evaluator.run(request)

async def main():
    global short
    out = {"limit": evaluator.session_limit}
    async with evaluator:
        out["limit"] = evaluator.session_limit
        large = await cell("large", "held = bytearray(b'x') * (200 << 20)\\n"
                           "open('/dev/shm/shm', 'wb').write(b'z' * (8 << 20))")
        out["large"] = large.returncode
        await cell("small", "kept = 'small'")
        short = True
        for _ in range(600):
            if evaluator.sessions_ended_for_memory:
                break
            await asyncio.sleep(0.1)
        out["small"] = (await cell("small", "print(kept)", True)).stdout
        try:
            await cell("large", "print(1)", True)
        except SessionNotFound as exc:
            out["refused"] = str(exc)
    print(json.dumps(out))

evaluator = Evaluator(
    EvaluatorConfig(time_limit=30, preimport=(), warm_sandboxes=0, concurrency=2),
    meminfo=reading,
)
asyncio.run(main())
"""


def test_without_a_memory_cgroup_the_cap_is_derived_and_the_watchdog_ends_the_largest(
    venv: Path,
) -> None:
    """An ordinary user's evaluator counts each session at what its rlimits leave, and its
    watchdog measures sessions it cannot ptrace as root would: their processes' memory
    (nobody's, in a user namespace) and their /dev/shm."""
    command: list[str | Path] = [
        "setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
        venv / "bin" / "python", "-c", _WATCHDOG,
    ]  # fmt: skip
    environment = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8"}
    done = subprocess.run(
        command, cwd="/", env=environment, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.splitlines()[-1])
    defaults = EvaluatorConfig()
    derived = defaults.sessions_within(limits.session_bytes(defaults, Cgroups({}, None)))
    assert out["limit"] == derived < defaults.session_limit, out
    assert (out["large"], out["small"]) == (0, "small\n"), out
    assert "host was running out of memory" in out["refused"], out
    held = int(out["refused"].split("its processes held ")[1].split(" MiB")[0])
    assert held >= 208, out  # its heap and its /dev/shm
    assert "ended live session large, whose processes held" in done.stderr, done.stderr


def test_an_idle_session_of_an_ordinary_user_is_stopped_until_its_next_cell(
    service: tuple[str, subprocess.Popen[str]],
) -> None:
    """No cpu controller here: between cells every process of the session's sandbox is stopped
    (a spinning thread and child process take no CPU); its next cell finds them running."""
    url, evaluator = service
    marker = f"idle-spinner-{uuid.uuid4().hex}"

    def cell(code: str) -> dict[str, object]:
        answer = httpx.post(f"{url}/eval", json={"input": code, "session": "spin"}, timeout=60)
        assert answer.status_code == 200, answer.text
        return answer.json()  # type: ignore[no-any-return]

    assert cell(isolation.idle_spinners(marker))["returncode"] == 0
    (sandbox,) = isolation.processes_with(marker)
    while (
        parent := int(Path(f"/proc/{sandbox}/stat").read_text().rsplit(")", 1)[1].split()[1])
    ) != evaluator.pid:
        sandbox = parent  # up to the sandbox's outer bwrap, the service's child
    deadline = time.monotonic() + 60
    while set((states := isolation.tree_states(sandbox)).values()) != {"T"}:
        assert time.monotonic() < deadline, states
        time.sleep(0.05)
    assert len(states) >= 4  # bwrap, its init, the interpreter, the child
    assert cell(isolation.spinners_again())["stdout"] == "True None R\n"


# Last: it stops the module's service.
def test_startup_log_tells_which_limits_hold(
    service: tuple[str, subprocess.Popen[str]],
) -> None:
    url, process = service
    run(url, "print(1)")
    process.terminate()
    log = process.communicate(timeout=30)[0]
    assert "no memory cgroup; address-space rlimit" in log
    processes = (
        "limit processes: 64: no pids cgroup; RLIMIT_NPROC 64 of the run's own user namespace"
        if limits.kernel_counts_nproc_per_namespace()
        else f"64 asked, not bounded per run: no pids cgroup, and every run has uid {NOBODY}"
    )
    assert processes in log
    assert "limit working directory: 48 MiB tmpfs" in log
