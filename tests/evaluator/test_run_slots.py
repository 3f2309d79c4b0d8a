"""The evaluator's run slots, without a sandbox: serving's fair slots, their groups the requests'
``session_owner``, a refusal the evaluator's ``QueueFull`` (its 503), no bound on a wait."""

from __future__ import annotations

import anyio
import pytest

from evaluator import QueueFull
from evaluator.answers import queue_full_description
from evaluator.slots import RunSlots

pytestmark = pytest.mark.anyio


async def _hold(slots: RunSlots, release: anyio.Event, owner: str | None) -> None:
    async with slots.hold(owner):
        await release.wait()


async def test_a_full_queue_is_the_evaluators_queue_full() -> None:
    slots = RunSlots(1, 1, lambda: None)
    release = anyio.Event()
    async with anyio.create_task_group() as runs:
        runs.start_soon(_hold, slots, release, None)
        runs.start_soon(_hold, slots, release, None)
        await anyio.wait_all_tasks_blocked()
        assert (slots.running, slots.waiting) == (1, 1)
        with pytest.raises(QueueFull) as refused:
            async with slots.hold():
                pass
        assert queue_full_description(refused.value) == (
            "All 1 evaluation slots are busy and 1 evaluations are waiting; try again later."
        )
        release.set()
    assert (slots.running, slots.waiting) == (0, 0)


async def test_one_owner_fills_three_quarters_of_the_queue_beside_another() -> None:
    slots = RunSlots(1, 4, lambda: None)
    release = anyio.Event()
    async with anyio.create_task_group() as runs:
        runs.start_soon(_hold, slots, release, "calm")
        await anyio.wait_all_tasks_blocked()
        for _ in range(3):
            runs.start_soon(_hold, slots, release, None)  # requests without an owner: one owner
        await anyio.wait_all_tasks_blocked()
        with pytest.raises(QueueFull) as refused:
            async with slots.hold():
                pass
        assert (refused.value.running, refused.value.waiting) == (1, 3)
        runs.start_soon(_hold, slots, release, "calm")  # the last place is another owner's
        await anyio.wait_all_tasks_blocked()
        assert slots.waiting == 4
        release.set()


async def test_a_free_slot_goes_to_the_owner_running_the_fewest() -> None:
    slots = RunSlots(1, 8, lambda: None)
    order: list[str] = []
    release = anyio.Event()

    async def run(owner: str) -> None:
        async with slots.hold(owner):
            order.append(owner)
            await release.wait()

    async with anyio.create_task_group() as runs:
        for owner in ("flood", "flood", "flood", "calm"):
            runs.start_soon(run, owner)
            await anyio.wait_all_tasks_blocked()
        release.set()
    assert order == ["flood", "calm", "flood", "flood"]


async def test_the_pool_is_told_of_each_end() -> None:
    ended: list[int] = []
    slots = RunSlots(2, 2, lambda: ended.append(slots.running))
    async with slots.hold("a"):
        assert slots.running == 1
    assert ended == [0]
