"""Admission: how many evaluations run at once, and how long a call may wait for a slot.

The limit matches what the evaluation service runs at once (its workers, by default), so a call
waits here, where the wait is bounded and said, rather than in the service's own queue, where
the gateway could not tell waiting from running.

Slots are shared fairly between clients (a token's name; see :mod:`.code_sessions`): a slot
that comes free goes to a waiting call of the client running the fewest evaluations (among
those, of the client served the longest ago, then the first in line), not simply to the first
in line, and one client's calls may take at
most three quarters of the wait queue. A client flooding the gateway waits behind its own calls;
another client's call waits at most for one running evaluation to end.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator, Iterator

import anyio

__all__ = ["Admission", "Busy", "Turns"]


class Busy(Exception):
    """No evaluation slot could be had: the wait queue is full or the wait took too long."""


class Turns:
    """A session's calls, one at a time: a lock, and the count of calls holding or waiting for it.

    ``asyncio.Lock.locked()`` reads False while the lock passes from one call to the next: a
    call arriving then would neither wait within bounds nor find the session busy. The count
    holds from a call's arrival to its end.
    """

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.calls = 0

    @property
    def busy(self) -> bool:
        """Whether a call holds the session or waits for it."""
        return self.calls > 0


class Admission:
    """At most ``limit`` evaluations at once across every session and transport.

    Up to ``max_waiting`` more wait for a slot, each at most ``max_wait`` seconds; beyond either
    bound the call is refused at once with :class:`Busy`, so no caller hangs. A call waiting for
    its session's previous call (:meth:`turn`) is bounded the same way: one client could
    otherwise queue any number of calls on one session, each holding its files in memory.
    """

    def __init__(self, limit: int, max_waiting: int, max_wait: float) -> None:
        self.limit = limit
        self.max_waiting = max_waiting
        self.max_wait = max_wait
        self.waiting = 0
        self._free = limit
        #: Evaluations each client runs now.
        self._running: collections.Counter[str | None] = collections.Counter()
        #: Calls waiting for a slot, in arrival order: (client, the future the slot is given by).
        self._queue: list[tuple[str | None, asyncio.Future[None]]] = []
        #: When each client running or waiting was last given a slot (a count of grants).
        self._served: dict[str | None, int] = {}
        self._grants = 0

    @property
    def in_flight(self) -> int:
        """Evaluations running now."""
        return self.limit - self._free

    @contextlib.asynccontextmanager
    async def slot(self, client: str | None = None) -> AsyncIterator[None]:
        """Hold one slot for the block on behalf of ``client``, waiting for it within the
        bounds.

        Raises:
            Busy: the queue (or the client's share of it) is full, or no slot came free
                within ``max_wait``.
        """
        if self._free > 0 and not self._queue:
            self._free -= 1
            self._grant(client)
        else:
            await self._wait_for_slot(client)
        try:
            yield
        finally:
            self._release(client)

    def _grant(self, client: str | None) -> None:
        self._running[client] += 1
        self._grants += 1
        self._served[client] = self._grants

    def _release(self, client: str | None) -> None:
        """Give ``client``'s slot to the waiting call whose client runs the fewest (of those,
        the one served the longest ago; then the first in line), or free it."""
        self._running[client] -= 1
        if self._running[client] <= 0:
            del self._running[client]
            if all(c != client for c, _ in self._queue):
                del self._served[client]  # nothing of it left: its record is not kept
        if not self._queue:
            self._free += 1
            return

        def rank(index: int) -> tuple[int, int, int]:
            taker = self._queue[index][0]
            return self._running[taker], self._served.get(taker, 0), index

        taker, future = self._queue.pop(min(range(len(self._queue)), key=rank))
        self._grant(taker)
        future.set_result(None)

    @contextlib.asynccontextmanager
    async def turn(self, turns: Turns) -> AsyncIterator[None]:
        """Hold a session's turn for the block, waiting for it as for a slot: among the
        ``max_waiting``, at most ``max_wait`` seconds.

        Raises:
            Busy: the queue is full, or the call before did not end within ``max_wait``.
        """
        waits = turns.busy
        if waits and self.waiting >= self.max_waiting:
            raise Busy(f"{self.waiting} calls are waiting already")
        turns.calls += 1
        self.waiting += int(waits)
        try:
            with anyio.fail_after(self.max_wait if waits else None):
                await turns.lock.acquire()
        except BaseException as exc:
            turns.calls -= 1
            if isinstance(exc, TimeoutError):
                raise Busy(f"its call before this one ran on for {self.max_wait:g} s") from None
            raise
        finally:
            self.waiting -= int(waits)
        try:
            yield
        finally:
            turns.lock.release()
            turns.calls -= 1

    @contextlib.contextmanager
    def queued(self) -> Iterator[float]:
        """Count a call as waiting, among ``max_waiting``, for the block (for what the call
        waits for itself); the block is given its deadline, ``max_wait`` from now
        (``anyio.current_time()``).

        Raises:
            Busy: the queue is full.
        """
        if self.waiting >= self.max_waiting:
            raise Busy(f"{self.waiting} calls are waiting already")
        self.waiting += 1
        try:
            yield anyio.current_time() + self.max_wait
        finally:
            self.waiting -= 1

    async def _wait_for_slot(self, client: str | None) -> None:
        if self.waiting >= self.max_waiting:
            raise Busy(f"all {self.limit} slots are running and {self.waiting} calls are waiting")
        share = -(-self.max_waiting * 3 // 4)
        others = any(c != client for c in self._running) or any(c != client for c, _ in self._queue)
        # Alone, a client may use the whole queue; beside others, its share of it.
        if (
            others
            and share < self.max_waiting
            and sum(c == client for c, _ in self._queue) >= share
        ):
            raise Busy(f"{share} of this client's calls are waiting already")
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (client, future)
        self._queue.append(entry)
        self.waiting += 1
        try:
            with anyio.fail_after(self.max_wait):
                await asyncio.shield(future)
        except BaseException as exc:
            if future.done():  # the slot was given as the wait ended: pass it on
                self._release(client)
            else:
                self._queue.remove(entry)
                future.cancel()
            if isinstance(exc, TimeoutError):
                raise Busy(f"no slot came free within {self.max_wait:g} s") from None
            raise
        finally:
            self.waiting -= 1
