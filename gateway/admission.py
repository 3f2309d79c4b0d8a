"""Admission: how many evaluations run at once, and how long a call may wait for a slot.

The limit matches what the evaluation service runs at once (its workers, by default), so a call
waits here, where the wait is bounded and said, rather than in the service's own queue, where
the gateway could not tell waiting from running.
"""

from __future__ import annotations

import asyncio
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
        self.in_flight = 0
        self.waiting = 0
        self._slots = anyio.Semaphore(limit)

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold one slot for the block, waiting for it within the bounds.

        Raises:
            Busy: the queue is full, or no slot came free within ``max_wait``.
        """
        try:
            self._slots.acquire_nowait()
        except anyio.WouldBlock:
            await self._wait_for_slot()
        self.in_flight += 1
        try:
            yield
        finally:
            self.in_flight -= 1
            self._slots.release()

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

    async def _wait_for_slot(self) -> None:
        if self.waiting >= self.max_waiting:
            raise Busy(f"all {self.limit} slots are running and {self.waiting} calls are waiting")
        self.waiting += 1
        try:
            with anyio.fail_after(self.max_wait):
                await self._slots.acquire()
        except TimeoutError:
            raise Busy(f"no slot came free within {self.max_wait:g} s") from None
        finally:
            self.waiting -= 1
