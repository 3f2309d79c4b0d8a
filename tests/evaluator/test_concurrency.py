"""Many runs at once: every run keeps its own exit status, whoever else reaps children."""

from __future__ import annotations

import asyncio
import os
import signal
import stat
import sys
from pathlib import Path

import anyio
import httpx

from evaluator import Evaluator, create_app, startup
from evaluator.jail import JailedProcess, LaunchSpec
from evaluator.procfs import alive, await_orphans, owned, reap_orphans, status
from evaluator.workdir import WorkdirRoot
from snekbox_client import EvalRequest

from .conftest import config


async def test_many_concurrent_requests_all_succeed() -> None:
    """24 requests at concurrency 2: each answers 200 with its own output (was: 500 ECHILD).
    A time limit no loaded host reaches: what is tested is who gets which exit status (a CI
    run at load killed the first runs at 2 s)."""
    async with Evaluator(config(concurrency=2, max_queue=32, time_limit=60)) as evaluator:
        transport = httpx.ASGITransport(create_app(evaluator))
        async with httpx.AsyncClient(
            transport=transport, base_url="http://evaluator", timeout=300
        ) as http:
            with anyio.fail_after(300):
                answers = await asyncio.gather(
                    *(
                        http.post("/eval", json={"input": f"import socket; print({i})"})
                        for i in range(24)
                    )
                )
    assert [(a.status_code, a.json()) for a in answers] == [
        (200, {"stdout": f"{i}\n", "returncode": 0, "files": [], "ended_by": "exit"})
        for i in range(24)
    ]
    assert not owned()


async def test_two_evaluators_in_one_process_never_reap_each_others_runs() -> None:
    """Orphan reaping of one evaluator must not take the exit status of another's run."""
    async with (
        Evaluator(config(max_queue=16, time_limit=60)) as first,
        Evaluator(config(max_queue=16, time_limit=60)) as second,
    ):
        with anyio.fail_after(300):
            results = await asyncio.gather(
                *(
                    evaluator.run(
                        EvalRequest(args=("-c", f"import sys; print({i}); sys.exit({i})"))
                    )
                    for i in range(12)
                    for evaluator in (first, second)
                )
            )
    expected = [(f"{i}\n", i) for i in range(12) for _ in range(2)]
    assert [(r.stdout, r.returncode) for r in results] == expected


async def test_orphan_reaping_leaves_an_exited_run_to_its_owner(tmp_path: Path) -> None:
    """A run's zombie named like an orphan (bwrap) is never reaped by reap_orphans."""
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\nexit 3\n")
    fake.chmod(0o755)
    process = JailedProcess.spawn(LaunchSpec(), cgroup=None)
    try:
        process.release([str(fake)], 5)
        loop = asyncio.get_running_loop()
        exited = asyncio.Event()
        loop.add_reader(process._pidfd, exited.set)  # readable once the process has exited
        try:
            with anyio.fail_after(60):
                await exited.wait()
        finally:
            loop.remove_reader(process._pidfd)
        assert process.pid in owned()
        assert reap_orphans("bwrap").reaped == 0
        outcome = await process.wait(1000)
        assert (outcome.returncode, outcome.ended_by) == (3, "exit")
        assert process.pid not in owned()
    finally:
        await process.aclose()


async def test_an_orphan_that_dies_late_is_reaped_not_left_a_zombie(tmp_path: Path) -> None:
    """A sandbox's init may outlive its outer bwrap, then die: it is waited for and reaped.

    (Was: one look at disposal, and an init still dying stayed a zombie until the next run.)
    """
    async with Evaluator(config()):  # which makes this process a child subreaper
        orphan = await _orphan(tmp_path, lives=1)
        with anyio.fail_after(60):
            assert await await_orphans("bwrap", 5) == frozenset()
        assert not alive(orphan)  # not even a zombie


async def test_an_orphan_that_does_not_die_is_waited_for_once(tmp_path: Path) -> None:
    """One stuck process must not hold up every later disposal: it is named, then passed by."""
    async with Evaluator(config()):
        orphan = await _orphan(tmp_path, lives=120)
        try:
            assert await await_orphans("bwrap", 0.2) == {orphan}
            with anyio.fail_after(30):  # a bound, not a speed: waiting for it would take 60 s
                assert await await_orphans("bwrap", 60, besides=frozenset({orphan})) == {orphan}
        finally:
            os.kill(orphan, signal.SIGKILL)
        with anyio.fail_after(60):  # once it dies, it is reaped all the same
            assert await await_orphans("bwrap", 5) == frozenset()
        assert not alive(orphan)


async def _orphan(tmp_path: Path, *, lives: int) -> int:
    """A running orphan of this process named bwrap (a fork of a fake bwrap, with no child of
    its own to leave behind), which exits after ``lives`` seconds."""
    fake = tmp_path / "bwrap"
    fake.write_text(
        f"#!{sys.executable} -I\n"
        "import os, time\n"
        "if pid := os.fork():\n"
        "    print(pid)\n"
        "else:\n"
        "    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)\n"
        "    os.dup2(1, 2)\n"
        f"    time.sleep({lives})\n"
    )
    fake.chmod(0o755)
    process = JailedProcess.spawn(LaunchSpec(), cgroup=None)
    try:
        process.release([str(fake)], 10)
        outcome = await process.wait(1000)
    finally:
        await process.aclose()
    orphan = int(outcome.output)
    found = status(orphan)
    assert found is not None and found.parent == os.getpid()  # an orphan of ours, still running
    return orphan


async def test_a_launcher_mounts_its_working_directory_or_says_why(tmp_path: Path) -> None:
    """The mount of a service that cannot mount (LaunchSpec.workdir), its success and failure."""
    workdir = tmp_path / "run"
    workdir.mkdir()
    process = JailedProcess.spawn(LaunchSpec(workdir=(str(workdir), 1 << 20, 64)), cgroup=None)
    try:
        with anyio.fail_after(60):
            assert await process.mounted()
        root = Path(f"/proc/{process.pid}/root{workdir}")
        assert os.stat(root).st_dev != os.stat(workdir).st_dev, "not a mount of its own"
        assert os.listdir(root) == [".tmp"] and os.listdir(workdir) == []
    finally:
        await process.aclose()
    missing = JailedProcess.spawn(
        LaunchSpec(workdir=(str(tmp_path / "gone"), 1 << 20, 64)), cgroup=None
    )
    try:
        with anyio.fail_after(60):
            assert not await missing.mounted()
        missing.release(["/bin/true"], 5)
        outcome = await missing.wait(1000)
        assert outcome.returncode == 255
        assert b"the sandbox could not start: FileNotFoundError" in outcome.output
    finally:
        await missing.aclose()


async def test_the_launcher_runs_compiled_and_read_only(tmp_path: Path) -> None:
    """The service's launcher, compiled into its private directory (again for a second pool,
    after a mount fallback), read-only, runs a command as its source does."""
    root = WorkdirRoot.create(str(tmp_path))
    try:
        compiled = startup.place_launcher(root)
        assert startup.place_launcher(root) == compiled
        assert compiled.endswith("/_launcher.pyc")
        assert stat.S_IMODE(os.stat(compiled).st_mode) == 0o444
        process = JailedProcess.spawn(LaunchSpec(launcher=compiled), cgroup=None)
        try:
            process.release(["/bin/sh", "-c", "echo launched; exit 7"], 10)
            outcome = await process.wait(1000)
        finally:
            await process.aclose()
        assert (outcome.output, outcome.returncode) == (b"launched\n", 7)
    finally:
        root.remove()
