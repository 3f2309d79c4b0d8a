"""Fair slots: a bounded number of calls at once, and a bounded queue shared fairly by groups.

Both services hold such slots (the gateway's evaluations, its ``Admission``; the evaluator's
runs and cells, its ``RunSlots``), with one rule for who waits, who is refused and who goes
next:

- at most ``limit`` calls hold a slot at once; a call finding none free waits for one, at most
  ``max_wait`` seconds (``None``: until one comes);
- at most ``max_waiting`` calls wait (waits for something else may be counted among them:
  :meth:`FairSlots.counted`); one more is refused at once, so no caller hangs;
- a group (a client: a token's name, the evaluator's ``session_owner``; ``None`` for every
  call that names none) may fill at most three quarters of the queue while another group runs
  or waits; alone, all of it;
- a slot that comes free goes to a waiting call of the group running the fewest calls (among
  those, of the group served the longest ago, then the first in line), not simply to the first
  in line: a group flooding the slots waits behind its own calls, and another group's call
  waits for one running call to end, not behind the whole flood.

The slots decide who goes; what a refusal is called, and says, is the owner's (the gateway's
``Busy``, the evaluator's ``QueueFull``): :class:`SlotsFull`, :class:`SlotTimeout`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator, Callable, Hashable, Iterator

import anyio

__all__ = ["FairSlots", "SlotTimeout", "SlotsFull"]


class SlotsFull(Exception):
    """No place to wait: ``waiting`` calls wait already, the queue's bound (``share`` is
    ``None``), or the group's own calls fill its ``share`` of it."""

    def __init__(self, waiting: int, share: int | None = None) -> None:
        self.waiting = waiting
        self.share = share
        if share is None:
            super().__init__(f"{waiting} calls are waiting already")
        else:
            super().__init__(f"{share} of this group's calls are waiting already")


class SlotTimeout(TimeoutError):
    """No slot came free within ``max_wait`` seconds."""

    def __init__(self, max_wait: float) -> None:
        self.max_wait = max_wait
        super().__init__(f"no slot came free within {max_wait:g} s")


class FairSlots:
    """At most ``limit`` calls at once; up to ``max_waiting`` wait, each at most ``max_wait``
    seconds (``None``: no bound), the slots shared fairly between groups (see the module).

    Args:
        limit: Calls holding a slot at once.
        max_waiting: Calls waiting at most (for a slot, or counted with :meth:`counted`).
        max_wait: Seconds a call waits for a slot at most; ``None``: until one comes.
        on_release: Called each time a slot is given back (the evaluator refills its pool).
    """

    def __init__(
        self,
        limit: int,
        max_waiting: int,
        max_wait: float | None = None,
        *,
        on_release: Callable[[], None] | None = None,
    ) -> None:
        if limit < 1:
            raise ValueError("the slots' limit must be at least 1")
        self.limit = limit
        self.max_waiting = max_waiting
        self.max_wait = max_wait
        self._on_release = on_release
        self._free = limit
        #: Waits for something else counted among ``max_waiting`` (:meth:`counted`).
        self._counted = 0
        #: Calls each group runs now.
        self._running: collections.Counter[Hashable] = collections.Counter()
        #: Calls waiting for a slot, in arrival order: (group, the future the slot is given by).
        self._queue: list[tuple[Hashable, asyncio.Future[None]]] = []
        #: When each group running or waiting was last given a slot (a count of grants).
        self._served: dict[Hashable, int] = {}
        self._grants = 0

    @property
    def running(self) -> int:
        """Slots held now (given, whether or not their call has resumed yet)."""
        return self.limit - self._free

    @property
    def waiting(self) -> int:
        """Calls waiting now: for a slot, and those counted (:meth:`counted`)."""
        return len(self._queue) + self._counted

    @property
    def share(self) -> int | None:
        """The calls one group may have waiting while another group runs or waits: three
        quarters of ``max_waiting``, rounded up (``None``: that is the whole queue)."""
        share = -(-self.max_waiting * 3 // 4)
        return share if share < self.max_waiting else None

    @contextlib.asynccontextmanager
    async def hold(self, group: Hashable = None) -> AsyncIterator[None]:
        """Hold a slot for the block on behalf of ``group`` (see :meth:`acquire`)."""
        await self.acquire(group)
        try:
            yield
        finally:
            self.release(group)

    async def acquire(self, group: Hashable = None) -> None:
        """Take a slot on behalf of ``group``, waiting for one within the bounds; give it back
        with :meth:`release`.

        Raises:
            SlotsFull: no slot is free and the queue, or the group's share of it, is full.
            SlotTimeout: no slot came free within ``max_wait``.
        """
        if self._free > 0 and not self._queue:
            self._free -= 1
            self._grant(group)
            return
        self._check_room(group)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (group, future)
        self._queue.append(entry)
        timeout = anyio.fail_after(self.max_wait) if self.max_wait is not None else None
        try:
            with timeout or contextlib.nullcontext():
                await asyncio.shield(future)
        except BaseException as exc:
            if future.done():  # the slot was given as the wait ended: pass it on
                self.release(group)
            else:
                self._queue.remove(entry)
                future.cancel()
                self._forget_if_gone(group)
            if isinstance(exc, TimeoutError) and self.max_wait is not None:
                raise SlotTimeout(self.max_wait) from None
            raise

    def release(self, group: Hashable = None) -> None:
        """Give ``group``'s slot to the waiting call whose group runs the fewest (of those, the
        one served the longest ago; then the first in line), or free it."""
        self._running[group] -= 1
        if self._running[group] <= 0:
            del self._running[group]
            self._forget_if_gone(group)
        if self._queue:

            def rank(index: int) -> tuple[int, int, int]:
                taker = self._queue[index][0]
                return self._running[taker], self._served.get(taker, 0), index

            taker, future = self._queue.pop(min(range(len(self._queue)), key=rank))
            self._grant(taker)
            future.set_result(None)
        else:
            self._free += 1
        if self._on_release is not None:
            self._on_release()

    @contextlib.contextmanager
    def counted(self) -> Iterator[None]:
        """Count a wait for something else (the gateway's call waiting for its session's turn)
        among the ``max_waiting`` for the block.

        Raises:
            SlotsFull: the queue is full.
        """
        if self.waiting >= self.max_waiting:
            raise SlotsFull(self.waiting)
        self._counted += 1
        try:
            yield
        finally:
            self._counted -= 1

    def _check_room(self, group: Hashable) -> None:
        """Refuse a wait the queue, or ``group``'s share of it beside another group, has no
        room for."""
        if self.waiting >= self.max_waiting:
            raise SlotsFull(self.waiting)
        share = self.share
        if share is None:
            return
        # Alone, a group may use the whole queue; beside others, its share of it.
        others = any(g != group for g in self._running) or any(g != group for g, _ in self._queue)
        if others and sum(g == group for g, _ in self._queue) >= share:
            raise SlotsFull(self.waiting, share)

    def _forget_if_gone(self, group: Hashable) -> None:
        """Drop ``group``'s record when nothing of it runs or waits any more."""
        if group not in self._running and all(g != group for g, _ in self._queue):
            self._served.pop(group, None)

    def _grant(self, group: Hashable) -> None:
        self._running[group] += 1
        self._grants += 1
        self._served[group] = self._grants
