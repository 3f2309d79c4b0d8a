"""A run holds nothing of the host: no root, no capability, no shared quota, no foreign socket.

The evaluator here runs in-process, as the suite's user (root in CI: the case where the sandbox
once mapped to host uid 0); ``test_unprivileged.py`` runs the shared checks as uid 65534.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import secrets
import sys
import sysconfig
import time
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import httpx
import pytest

from evaluator import Evaluator
from snekbox_client import EvalRequest

from . import dropped_binaries, isolation
from .conftest import b64, config, run

pytestmark = pytest.mark.anyio

AS_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="a fact of the host seen by root")


@pytest.fixture(scope="module")
async def roomy() -> AsyncIterator[Evaluator]:
    """Time enough for runs that wait for each other; one slot per concurrent run."""
    async with Evaluator(config(time_limit=30, concurrency=3)) as started:
        yield started


async def test_no_host_root_capability_sysctl_or_root_only_file(
    client: httpx.AsyncClient,
) -> None:
    result = await run(client, isolation.IDENTITY)
    assert result["returncode"] == 0, result["stdout"]
    isolation.check_identity(result["stdout"])


async def test_only_the_needed_socket_families(client: httpx.AsyncClient) -> None:
    result = await run(client, isolation.SOCKETS)
    assert result["returncode"] == 0, result["stdout"]
    isolation.check_sockets(result["stdout"])


async def test_a_dropped_binary_runs_neither_from_dev_shm_nor_from_a_memfd(
    roomy: Evaluator,
) -> None:
    """Issue 27, finding 9: both ran; the working directory alone was noexec."""
    result = await roomy.run(EvalRequest(input=dropped_binaries.DROP_AND_EXECUTE))
    assert result.returncode == 0, result.stdout
    dropped_binaries.check_not_executed(result.stdout)


async def test_dev_shm_and_native_callbacks_still_work(roomy: Evaluator) -> None:
    """A pool of processes, numpy in shared memory, a ctypes callback: more than 2 s on a
    loaded host (one CI run was killed at it)."""
    result = await roomy.run(EvalRequest(input=dropped_binaries.SHM_STILL_WORKS))
    assert result.returncode == 0, result.stdout
    dropped_binaries.check_shm_still_works(result.stdout)


async def test_a_sessions_traps_neither_redirect_nor_hold_up_its_files(
    client: httpx.AsyncClient, tmp_path: Path
) -> None:
    """The next call's files never follow a symlink the code left, nor wait on its FIFO."""
    host = tmp_path / "host"
    isolation.make_victim(host, os.geteuid())
    session = f"traps-{secrets.token_hex(4)}"
    planted = await run(client, isolation.session_traps(host), session=session)
    assert planted["stdout"] == "set\n", planted
    for path in isolation.TRAPPED_PATHS:
        with anyio.fail_after(30):
            files = [{"path": path, "content": b64(b"x")}]
            answer = await run(client, "print('ran')", session=session, files=files)
        isolation.check_trap_refused(path, answer)
    isolation.check_victim_untouched(host, os.geteuid())
    # A directory the code made takes files as before, and the session goes on.
    files = [{"path": "sub/ok.txt", "content": b64(b"fine")}]
    ok = await run(client, "print(open('sub/ok.txt').read())", session=session, files=files)
    assert ok["stdout"] == "fine\n", ok


@AS_ROOT
async def test_the_host_sees_an_unprivileged_uid_without_capabilities(roomy: Evaluator) -> None:
    marker = "marker-" + secrets.token_hex(8)
    code = "import time\ntime.sleep(20)"
    task = asyncio.ensure_future(roomy.run(EvalRequest(args=("-c", code, marker))))
    try:
        with anyio.fail_after(60):
            # Polling another process's state: no event to wait for.
            while len(pids := isolation.processes_with(marker)) < 3:  # noqa: ASYNC110 - bwrap, init, python
                await asyncio.sleep(0.05)
        for pid in pids:
            status = isolation.status(pid)
            uids = {int(u) for u in status["Uid"].split()}
            gids = {int(g) for g in status["Gid"].split()}
            assert len(uids) == 1 and min(uids) >= roomy.config.sandbox_uid, status["Uid"]
            assert gids == uids, status["Gid"]
            assert status["Groups"].strip() == ""
            if pid == pids[-1]:  # the code's own process
                assert int(status["CapEff"], 16) == 0 and int(status["CapPrm"], 16) == 0
            assert "1" in status["NoNewPrivs"]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


@AS_ROOT
async def test_one_run_cannot_take_the_inotify_quota_of_the_host_or_another_run(
    roomy: Evaluator,
) -> None:
    """A run takes every inotify instance it can and holds them: the host and a second run
    still get theirs (as root each run has a uid, hence a quota, of its own)."""
    marker = "marker-" + secrets.token_hex(8)
    hog = asyncio.ensure_future(
        roomy.run(EvalRequest(args=("-c", isolation.inotify_hog(hold=8), marker)))
    )
    try:
        with anyio.fail_after(60):
            await _until_it_holds_its_inotify_instances(marker)
        libc = ctypes.CDLL(None, use_errno=True)
        fd = libc.inotify_init1(0)
        assert fd >= 0, f"the host lost its inotify instances: errno {ctypes.get_errno()}"
        os.close(fd)
        probe = await roomy.run(EvalRequest(args=("-c", isolation.inotify_probe(delay=0))))
        assert probe.stdout == "ok\n", "the second run lost its inotify instances"
    finally:
        result = await hog
    taken, error = map(int, result.stdout.split())
    assert taken > 0 and error == 24  # EMFILE: it reached its own quota


async def test_the_time_limit_holds_while_the_event_loop_is_stalled() -> None:
    """A watchdog thread, not the loop, ends a run at its limit."""
    code = (
        "import time\nstart = time.monotonic()\n"
        "while True:\n    print(round(time.monotonic() - start, 2), flush=True)\n"
        "    time.sleep(0.05)\n"
    )
    async with Evaluator(config(time_limit=1)) as evaluator:
        task = asyncio.ensure_future(evaluator.run(EvalRequest(args=("-c", code))))
        await asyncio.sleep(0.3)  # running
        time.sleep(6)  # noqa: ASYNC251 - the stall under test: nothing else runs on the loop
        result = await task
    assert result.returncode == 137
    # Without the watchdog the run would print until the loop woke, after 6 s; with it, it
    # stops at 1.25 s, or a little later on a loaded machine.
    last = float(result.stdout.split()[-1])
    assert last < 4, f"the run printed until {last} s, with a 1 s limit and a 6 s stall"


@AS_ROOT
async def test_a_run_cannot_use_more_than_its_cpu_quota(roomy: Evaluator) -> None:
    """Eight setsid'd spinners (each its own autogroup) get one CPU between them at most."""
    code = (
        "import os, time\n"
        "start = time.monotonic()\n"
        "for _ in range(8):\n"
        "    if os.fork() == 0:\n"
        "        os.setsid()\n"
        "        while time.monotonic() - start < 3: pass\n"
        "        os._exit(0)\n"
        "for _ in range(8): os.wait()\n"
        "times = os.times()\n"
        "print((times.children_user + times.children_system) / (time.monotonic() - start))\n"
    )
    result = await roomy.run(EvalRequest(args=("-c", code)))
    assert result.returncode == 0, result.stdout
    cpus = float(result.stdout)
    # The kernel enforces the quota per period; load elsewhere can only lower the share.
    assert cpus < roomy.config.cpu_limit * 1.25, f"{cpus:.2f} CPUs used"


async def _until_it_holds_its_inotify_instances(marker: str) -> None:
    """Wait until a process of the run holds inotify instances, and no more come."""
    held = -1
    while True:
        counts = [_inotify_fds(pid) for pid in isolation.processes_with(marker)]
        now = max(counts, default=0)
        if now > 0 and now == held:
            return
        held = now
        await asyncio.sleep(0.2)


def _inotify_fds(pid: int) -> int:
    try:
        links = [os.readlink(f) for f in Path(f"/proc/{pid}/fd").iterdir()]
    except OSError:
        return 0
    return sum(link == "anon_inode:inotify" for link in links)


@AS_ROOT
async def test_two_services_never_give_their_sandboxes_the_same_uid() -> None:
    """Each sandbox's uid is claimed host-wide, so two evaluators (or processes) share none."""
    async with Evaluator(config()) as first, Evaluator(config()) as second:
        ready = [s.user for e in (first, second) if e._pool for s in e._pool._ready]
        result = await second.run(EvalRequest(args=("-c", "import os; print(os.getuid())")))
    assert result.returncode == 0, result.stdout
    assert len(ready) == 4 and None not in ready, ready  # two ready sandboxes each
    assert len(set(ready)) == len(ready), f"two sandboxes share a uid: {ready}"


@AS_ROOT
async def test_an_environment_below_a_directory_the_run_cannot_enter(tmp_path: Path) -> None:
    """A venv (with its bundled bwrap) below a 0700 directory, like /root: covered, it runs."""
    private = tmp_path / "home"
    private.mkdir(mode=0o700)
    os.chmod(tmp_path, 0o755)
    venv = private / "venv"
    await anyio.run_process([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    bwrap = venv / "bwrap-dir" / "bwrap"
    bwrap.parent.mkdir()
    bwrap.symlink_to(config().bwrap)  # the run must reach bwrap through the venv too
    libraries = [Path("/usr/lib") / sysconfig.get_config_var("MULTIARCH"), Path("/usr/lib64")]
    settings = config(
        executable=str(venv / "bin" / "python"),
        readonly_paths=(str(venv), sys.base_prefix, *map(str, libraries)),
        bwrap=str(bwrap),
    )
    async with Evaluator(settings) as evaluator:
        result = await evaluator.run(EvalRequest(args=("-c", "import sys; print(sys.prefix)")))
    assert (result.stdout, result.returncode) == (f"{venv}\n", 0)
