"""Admission: how many evaluations run at once, and how long a call may wait for a slot.

The limit matches what the evaluation service runs at once (its workers, by default), so a call
waits here, where the wait is bounded and said, rather than in the service's own queue, where
the gateway could not tell waiting from running.

Slots are shared fairly between clients (a token's name; see :mod:`.code_sessions`): a slot
that comes free goes to a waiting call of the client running the fewest evaluations (among
those, of the client served the longest ago, then the first in line), not simply to the first
in line, and one client's calls may take at
most three quarters of the wait queue. A client flooding the gateway waits behind its own calls;
another client's call waits at most for one running evaluation to end. The rule is
:class:`serving.FairSlots`' (the evaluator's run queue shares it, between session owners).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator

import anyio

from serving import FairSlots, SlotsFull, SlotTimeout

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
    The slots and their fair rule are :class:`serving.FairSlots`, the clients its groups.
    """

    def __init__(self, limit: int, max_waiting: int, max_wait: float) -> None:
        self.limit = limit
        self.max_waiting = max_waiting
        self.max_wait = max_wait
        self._slots = FairSlots(limit, max_waiting, max_wait)

    @property
    def in_flight(self) -> int:
        """Evaluations running now."""
        return self._slots.running

    @property
    def waiting(self) -> int:
        """Calls waiting now: for a slot, for their session's turn, or counted (:meth:`queued`)."""
        return self._slots.waiting

    @contextlib.asynccontextmanager
    async def slot(self, client: str | None = None) -> AsyncIterator[None]:
        """Hold one slot for the block on behalf of ``client``, waiting for it within the
        bounds.

        Raises:
            Busy: the queue (or the client's share of it) is full, or no slot came free
                within ``max_wait``.
        """
        try:
            await self._slots.acquire(client)
        except SlotsFull as full:
            if full.share is not None:
                raise Busy(f"{full.share} of this client's calls are waiting already") from None
            raise Busy(
                f"all {self.limit} slots are running and {full.waiting} calls are waiting"
            ) from None
        except SlotTimeout as late:
            raise Busy(str(late)) from None
        try:
            yield
        finally:
            self._slots.release(client)

    @contextlib.asynccontextmanager
    async def turn(self, turns: Turns) -> AsyncIterator[None]:
        """Hold a session's turn for the block, waiting for it as for a slot: among the
        ``max_waiting``, at most ``max_wait`` seconds.

        Raises:
            Busy: the queue is full, or the call before did not end within ``max_wait``.
        """
        waits = turns.busy
        with self.queued() if waits else contextlib.nullcontext():
            turns.calls += 1
            try:
                with anyio.fail_after(self.max_wait if waits else None):
                    await turns.lock.acquire()
            except BaseException as exc:
                turns.calls -= 1
                if isinstance(exc, TimeoutError):
                    raise Busy(f"its call before this one ran on for {self.max_wait:g} s") from None
                raise
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
        with contextlib.ExitStack() as counted:
            try:
                counted.enter_context(self._slots.counted())
            except SlotsFull as full:
                raise Busy(str(full)) from None
            yield anyio.current_time() + self.max_wait
