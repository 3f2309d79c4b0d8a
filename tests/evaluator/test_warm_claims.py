"""A run that finds no warm sandbox waiting takes one still importing, and waits for it.

Real sandboxes: those warming are frozen (SIGSTOP, each whole tree, until the evaluator is
closed) so that the run finds them still importing however fast or loaded the machine is; each
test then decides what becomes of the one it takes. Two are kept, none started
(``warm_sandboxes_max`` equal to the count).
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress

import anyio
import pytest

from evaluator import Evaluator, pool, warming
from evaluator.sandbox import Sandbox
from snekbox_client import EvalRequest, EvalResult
from tests.gateway.harness import descendants

from .conftest import config
from .test_warm_idle import OTHER, POLICIES

PROBE = "import sys; print('numpy' in sys.modules)"


@asynccontextmanager
async def two_taken(
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[tuple[Evaluator, Sandbox, Callable[[], None]]]:
    """An evaluator whose two warm sandboxes were taken, those made again frozen as they import
    (any that far along is worth waiting for): the first of them, and what lets it go on."""
    monkeypatch.setattr(warming, "CLAIM_AFTER", 0.0)
    settings = config(warm_sandboxes=2, warm_sandboxes_max=2, preimport=("numpy",))
    thaws: list[Callable[[], None]] = []
    try:
        async with Evaluator(settings) as ev:
            with anyio.fail_after(240):
                while ev.warm_sandboxes < 2:  # noqa: ASYNC110 - nothing to wait on
                    await asyncio.sleep(0.05)
                assert ev._pool is not None and ev._pool._full is not None
                full = ev._pool._full
                both = [ev.run(EvalRequest(args=("-c", PROBE))) for _ in range(2)]
                assert [r.stdout for r in await asyncio.gather(*both)] == ["True\n"] * 2
                assert ev.warm_runs == 2
                while not full.warming:  # noqa: ASYNC110
                    await asyncio.sleep(0.001)
            thaws += [frozen(sandbox) for sandbox in full.warming]
            yield ev, full.warming[0], thaws[0]
    finally:
        for thaw in thaws:
            thaw()


def frozen(sandbox: Sandbox) -> Callable[[], None]:
    """Stop every process of ``sandbox``, each before its children are listed (none forks
    unseen); what lets them go on."""
    stopped: list[int] = []
    root = sandbox.process.pid
    while new := [pid for pid in (root, *descendants(root)) if pid not in stopped]:
        for pid in new:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
            stopped.append(pid)

    def thaw() -> None:
        for pid in stopped:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    return thaw


async def claimed(ev: Evaluator, sandbox: Sandbox, code: str = PROBE) -> asyncio.Task[EvalResult]:
    """A run of ``code`` started, once it waits for ``sandbox``."""
    assert ev._pool is not None and ev._pool._full is not None
    task = asyncio.ensure_future(ev.run(EvalRequest(args=("-c", code))))
    with anyio.fail_after(60):
        while sandbox not in ev._pool._full.claimed:
            assert not task.done(), task.result()  # it did not wait: started cold
            await asyncio.sleep(0.01)
    return task


async def disposed_of(ev: Evaluator, sandbox: Sandbox) -> None:
    """Wait until ``sandbox``'s processes are gone; it is nobody's any more."""
    assert ev._pool is not None and ev._pool._full is not None
    full = ev._pool._full
    assert not full.warms(sandbox) and sandbox not in full.waiting
    with anyio.fail_after(60):
        while True:
            try:
                os.kill(sandbox.process.pid, 0)
            except ProcessLookupError:
                return
            await asyncio.sleep(0.05)


async def test_a_run_waits_for_a_sandbox_still_importing(monkeypatch: pytest.MonkeyPatch) -> None:
    async with two_taken(monkeypatch) as (ev, sandbox, thaw):
        task = await claimed(ev, sandbox)
        await asyncio.sleep(0.2)
        assert not task.done(), "it did not wait for its sandbox"
        thaw()
        with anyio.fail_after(120):
            result = await task
        assert (result.returncode, result.stdout) == (0, "True\n")
        assert ev.warm_runs == 3


async def test_the_code_in_a_claimed_sandbox_runs_under_sched_other(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its threads leave SCHED_IDLE when it is taken, and again once it is warm (its launcher
    may enter SCHED_IDLE after the first)."""
    async with two_taken(monkeypatch) as (ev, sandbox, thaw):
        task = await claimed(ev, sandbox, POLICIES)
        thaw()
        with anyio.fail_after(120):
            result = await task
        assert result.stdout == OTHER


async def test_a_claimed_sandbox_not_warm_in_time_is_disposed_of_and_the_run_starts_cold(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pool, "_CLAIM_AT_MOST", 0.5)
    async with two_taken(monkeypatch) as (ev, sandbox, _):
        task = await claimed(ev, sandbox)
        with anyio.fail_after(120):
            result = await task
        assert result.returncode == 0, result.stdout  # cold, or in one made since
        await disposed_of(ev, sandbox)


async def test_a_run_cancelled_while_it_waits_disposes_of_its_sandbox(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with two_taken(monkeypatch) as (ev, sandbox, _):
        task = await claimed(ev, sandbox)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await disposed_of(ev, sandbox)


async def test_a_claimed_sandbox_that_dies_leaves_its_run_to_go_on_without_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pool, "_CLAIM_AT_MOST", 3600.0)  # its failure, not the timeout, ends it
    async with two_taken(monkeypatch) as (ev, sandbox, _):
        task = await claimed(ev, sandbox)
        for pid in (sandbox.process.pid, *descendants(sandbox.process.pid)):
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with anyio.fail_after(120):
            result = await task
        assert result.returncode == 0, result.stdout
        await disposed_of(ev, sandbox)


async def test_an_evaluator_closed_while_a_run_waits_disposes_of_its_sandbox(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The run is told the evaluator stops; closing waits for the disposal (the working
    directories' root, removed last, would still have that sandbox's mount below it)."""
    monkeypatch.setattr(pool, "_CLAIM_AT_MOST", 3600.0)
    async with two_taken(monkeypatch) as (ev, sandbox, _):
        task = await claimed(ev, sandbox)
    with pytest.raises(RuntimeError, match="stopping"):
        await task
    assert ev._pool is None  # closed whole
