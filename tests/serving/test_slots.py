"""The shared fair slots: how many at once, who waits, who is refused, and who goes next."""

from __future__ import annotations

import functools
from collections.abc import Hashable

import anyio
import pytest

from serving import FairSlots, SlotsFull, SlotTimeout

pytestmark = pytest.mark.anyio


async def _hold(slots: FairSlots, release: anyio.Event, group: Hashable) -> None:
    """A call of ``group`` that holds its slot until ``release``."""
    async with slots.hold(group):
        await release.wait()


async def _served_in_order(slots: FairSlots, *queued: str) -> list[str]:
    """The order in which calls of the groups ``queued`` (in arrival order, behind one call of
    "first" that holds the only slot until all of them wait) are served."""
    order: list[str] = []
    release = anyio.Event()

    async def call(group: str) -> None:
        async with slots.hold(group):
            order.append(group)
            if group == "first":
                await release.wait()

    async with anyio.create_task_group() as calls:
        calls.start_soon(call, "first")
        await anyio.wait_all_tasks_blocked()
        for group in queued:
            calls.start_soon(call, group)
            await anyio.wait_all_tasks_blocked()  # arrival order is start order
        assert (slots.running, slots.waiting) == (1, len(queued))
        release.set()
    assert (slots.running, slots.waiting) == (0, 0)
    return order[1:]


async def test_calls_beyond_the_limit_wait_and_one_more_than_the_queue_is_refused() -> None:
    slots = FairSlots(limit=2, max_waiting=1)
    release = anyio.Event()
    async with anyio.create_task_group() as calls:
        for _ in range(3):
            calls.start_soon(_hold, slots, release, None)
        await anyio.wait_all_tasks_blocked()
        assert (slots.running, slots.waiting) == (2, 1)
        with pytest.raises(SlotsFull, match="1 calls are waiting already") as refused:
            await slots.acquire()
        assert (refused.value.waiting, refused.value.share) == (1, None)
        release.set()
    assert (slots.running, slots.waiting) == (0, 0)


async def test_a_wait_is_bounded_by_max_wait_and_unbounded_without() -> None:
    bounded = FairSlots(limit=1, max_waiting=4, max_wait=0.1)
    async with bounded.hold():
        with anyio.fail_after(60), pytest.raises(SlotTimeout, match=r"within 0\.1 s"):
            await bounded.acquire()
    assert (bounded.running, bounded.waiting) == (0, 0)
    unbounded = FairSlots(limit=1, max_waiting=4)
    release = anyio.Event()
    async with anyio.create_task_group() as calls:
        calls.start_soon(_hold, unbounded, release, None)
        calls.start_soon(_hold, unbounded, release, None)
        await anyio.sleep(0.3)  # past any bound a default could have
        assert (unbounded.running, unbounded.waiting) == (1, 1)
        release.set()


async def test_a_free_slot_goes_to_the_group_running_the_fewest() -> None:
    order = await _served_in_order(FairSlots(1, 8), "first", "first", "first", "calm")
    assert order == ["calm", "first", "first", "first"]


async def test_between_groups_running_as_many_the_one_served_the_longest_ago_goes_first() -> None:
    order = await _served_in_order(FairSlots(1, 8), "b", "b", "c", "c")
    assert order == ["b", "c", "b", "c"]


async def test_calls_of_one_group_go_first_in_line_first() -> None:
    # Without a name, every call is of the one group None: first come, first served.
    slots = FairSlots(1, 8)
    order: list[int] = []
    release = anyio.Event()

    async def call(number: int) -> None:
        async with slots.hold():
            order.append(number)
            if number == 0:
                await release.wait()

    async with anyio.create_task_group() as calls:
        for number in range(5):
            calls.start_soon(call, number)
            await anyio.wait_all_tasks_blocked()
        release.set()
    assert order == [0, 1, 2, 3, 4]


async def test_one_group_may_fill_three_quarters_of_the_queue_beside_another() -> None:
    slots = FairSlots(limit=1, max_waiting=4)
    assert slots.share == 3
    release = anyio.Event()
    call = functools.partial(_hold, slots, release)
    async with anyio.create_task_group() as calls:
        calls.start_soon(call, "calm")  # runs
        await anyio.wait_all_tasks_blocked()
        for _ in range(3):  # the flood's share of the queue
            calls.start_soon(call, "flood")
        await anyio.wait_all_tasks_blocked()
        with pytest.raises(SlotsFull, match="3 of this group's calls") as refused:
            await slots.acquire("flood")
        assert (refused.value.waiting, refused.value.share) == (3, 3)
        calls.start_soon(call, "calm")  # the last place is another group's
        await anyio.wait_all_tasks_blocked()
        assert slots.waiting == 4
        release.set()
    assert (slots.running, slots.waiting) == (0, 0)


async def test_a_group_alone_may_fill_the_whole_queue_and_a_small_queue_has_no_share() -> None:
    assert (FairSlots(1, 1).share, FairSlots(1, 0).share, FairSlots(1, 8).share) == (None, None, 6)
    slots = FairSlots(limit=1, max_waiting=4)
    release = anyio.Event()
    call = functools.partial(_hold, slots, release)
    async with anyio.create_task_group() as calls:
        for _ in range(5):  # one runs, four wait
            calls.start_soon(call, "only")
        await anyio.wait_all_tasks_blocked()
        assert slots.waiting == 4
        release.set()
    assert (slots.running, slots.waiting) == (0, 0)


async def test_a_slot_given_to_a_call_cancelled_meanwhile_passes_on() -> None:
    slots = FairSlots(limit=1, max_waiting=4)
    got: list[str] = []
    async with anyio.create_task_group() as calls:
        async with slots.hold("a"):
            waiter = anyio.CancelScope()

            async def cancelled() -> None:
                with waiter:
                    async with slots.hold("b"):
                        got.append("b")

            async def patient() -> None:
                async with slots.hold("c"):
                    got.append("c")

            calls.start_soon(cancelled)
            calls.start_soon(patient)
            await anyio.wait_all_tasks_blocked()
        waiter.cancel()  # the slot was just handed to "b", which goes before it runs
    assert got in (["c"], ["b", "c"])
    assert (slots.running, slots.waiting) == (0, 0)
    assert not slots._served  # nothing kept of groups gone


async def test_waits_counted_for_something_else_fill_the_queue_too() -> None:
    slots = FairSlots(limit=1, max_waiting=1)
    with slots.counted():
        assert slots.waiting == 1
        with pytest.raises(SlotsFull, match="1 calls are waiting already"), slots.counted():
            pass
        async with slots.hold():  # a free slot needs no place in the queue
            with pytest.raises(SlotsFull):
                await slots.acquire()
    assert (slots.running, slots.waiting) == (0, 0)


async def test_each_release_is_told_once_the_slot_is_given_on() -> None:
    """The callback sees the slot freed, or already given to a waiting call (the pool then
    knows whether a CPU is spare)."""
    released: list[int] = []
    slots = FairSlots(limit=1, max_waiting=1, on_release=lambda: released.append(slots.running))
    async with slots.hold("a"):
        pass
    assert released == [0]
    async with anyio.create_task_group() as group:
        await slots.acquire("a")
        group.start_soon(slots.acquire, "b")
        await anyio.wait_all_tasks_blocked()
        slots.release("a")  # straight to b: still one running
        assert released == [0, 1]
    slots.release("b")
    assert released == [0, 1, 0]


def test_a_limit_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        FairSlots(limit=0, max_waiting=1)
