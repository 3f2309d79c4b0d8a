"""Sandboxes made ahead wait under ``SCHED_IDLE``; the run that takes one does not.

A cgroup's CPU weight counts only against its siblings, so a sandbox importing its modules at
the least weight still competed with the service, the gateway and their clients. Its processes
now start under ``SCHED_IDLE`` where the service may later undo it (see
:mod:`evaluator.run_cgroup`), and the run's code never sees it: one-shot runs, a session's
first cell and its later ones all run under ``SCHED_OTHER``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest

import plotting
from evaluator import Evaluator, procfs, run_cgroup
from evaluator.pool import SandboxPool
from snekbox_client import EvalRequest

from .conftest import config
from .test_warm import until_warm, warm_request, without_cpu

#: Prints the scheduling policies of the sandbox's first process and of every thread of the
#: code's process (the preimported numpy's thread pool among them).
POLICIES = (
    "import os\n"
    "threads = {os.sched_getscheduler(int(t)) for t in os.listdir('/proc/self/task')}\n"
    "print(os.sched_getscheduler(1), sorted(threads), len(os.listdir('/proc/self/task')) > 1)"
)
#: OpenBLAS starts a thread per further CPU: with one CPU, numpy brings none.
OTHER = f"{os.SCHED_OTHER} [{os.SCHED_OTHER}] {len(os.sched_getaffinity(0)) > 1}\n"
ROOT = Path(__file__).parents[2]


def waiting_policies(sandboxes: SandboxPool) -> set[int]:
    """The scheduling policies of the processes of the warm sandboxes waiting now."""
    assert sandboxes._full is not None
    found: set[int] = set()
    for sandbox in sandboxes._full.waiting:
        assert sandbox.cgroup is not None
        for pid in sandbox.cgroup.pids():
            for tid in os.listdir(f"/proc/{pid}/task"):
                found.add(os.sched_getscheduler(int(tid)))
    return found


def settings() -> dict[str, object]:
    # numpy starts a pool of threads as it is imported.
    return {"time_limit": 10, "warm_sandboxes": 2, "preimport": ("numpy",), "memory_limit": 384}


@pytest.fixture(scope="module")
async def evaluator() -> AsyncIterator[Evaluator]:
    # However slowly a loaded machine warms them: none leaves SCHED_IDLE before its run.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(run_cgroup, "IDLE_AT_MOST", 3600.0)
        async with Evaluator(config(**settings())) as started:
            assert started._pool is not None
            if started._cgroups.cpu is None or not procfs.may_leave_idle():
                pytest.skip("no cpu controller, or no CAP_SYS_NICE: warm sandboxes wait as any")
            yield started


async def test_a_warm_sandbox_waits_under_sched_idle(evaluator: Evaluator) -> None:
    assert evaluator._pool is not None
    await until_warm(evaluator)
    assert waiting_policies(evaluator._pool) == {os.SCHED_IDLE}


async def test_a_one_shot_run_in_a_warm_sandbox_runs_under_sched_other(
    evaluator: Evaluator,
) -> None:
    result = await warm_request(evaluator, EvalRequest(args=("-c", POLICIES)))
    assert result.stdout == OTHER


async def test_a_sessions_cells_run_under_sched_other(evaluator: Evaluator) -> None:
    first = plotting.build_request(POLICIES, resident=True)
    result = await warm_request(evaluator, replace(first, session="idle-policy"))
    assert result.stdout == OTHER, result
    later = plotting.build_request(POLICIES, later_cell=True)
    result = await evaluator.run(replace(later, session="idle-policy", session_resume=True))
    assert result.stdout == OTHER, result


async def test_a_sandbox_still_warming_after_a_while_leaves_sched_idle(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A saturated host gives SCHED_IDLE next to nothing: the imports go on at the least
    weight, every IDLE_AT_MOST while it warms (here 20 ms)."""
    monkeypatch.setattr(run_cgroup, "IDLE_AT_MOST", 0.02)
    async with Evaluator(config(**settings())) as ev:
        assert ev._pool is not None
        if ev._cgroups.cpu is None or not procfs.may_leave_idle():
            pytest.skip("no cpu controller, or no CAP_SYS_NICE: warm sandboxes wait as any")
        await until_warm(ev, 2)
        assert waiting_policies(ev._pool) == {os.SCHED_OTHER}


async def test_where_it_could_not_be_undone_a_sandbox_waits_as_any(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(run_cgroup, "may_leave_idle", lambda: False)
    await _waits_as_any()


async def test_without_a_cpu_controller_a_sandbox_waits_as_any(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    without_cpu(monkeypatch)
    await _waits_as_any()


async def _waits_as_any() -> None:
    async with Evaluator(config(**settings())) as ev:
        assert ev._pool is not None
        await until_warm(ev)
        if ev._cgroups.cpu is not None:
            assert waiting_policies(ev._pool) == {os.SCHED_OTHER}
        result = await warm_request(ev, EvalRequest(args=("-c", POLICIES)))
        assert result.stdout == OTHER


def test_may_leave_idle_never_claims_more_than_the_kernel_allows() -> None:
    """Whatever user runs it: when it says yes, a child moved to SCHED_IDLE comes back."""
    child = subprocess.Popen(["sleep", "30"])
    try:
        os.sched_setscheduler(child.pid, os.SCHED_IDLE, os.sched_param(0))
        try:
            os.sched_setscheduler(child.pid, os.SCHED_OTHER, os.sched_param(0))
            undone = True
        except PermissionError:
            undone = False
        assert undone or not procfs.may_leave_idle()
    finally:
        child.kill()
        child.wait()


def may_leave_idle_in(*command: str, preamble: str = "") -> str:
    """What may_leave_idle() says in a fresh interpreter started through ``command``."""
    code = f"from evaluator.procfs import may_leave_idle\n{preamble}print(may_leave_idle())\n"
    out = subprocess.run(
        [*command, sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=True,
        timeout=120,
    )
    return out.stdout.strip()


def test_root_of_a_user_namespace_may_not_leave_idle() -> None:
    """Its CAP_SYS_NICE is not the initial namespace's, which the kernel asks for."""
    assert may_leave_idle_in("unshare", "--user", "--map-root-user") == "False"


@pytest.mark.skipif(os.geteuid() != 0, reason="drops from root to an ordinary user")
def test_an_ordinary_user_may_not_leave_idle() -> None:
    drop = (
        "import os\n"
        "os.setgroups([])\n"
        "os.setresgid(65534, 65534, 65534)\n"
        "os.setresuid(65534, 65534, 65534)  # CAP_SYS_NICE goes with uid 0\n"
    )
    assert may_leave_idle_in(preamble=drop) == "False"
