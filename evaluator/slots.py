"""The run slots: a bounded number of runs at once, and a bounded queue of those waiting."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable

from .errors import QueueFull

__all__ = ["RunSlots"]


class RunSlots:
    """``concurrency`` runs at once; at most ``queue_limit`` wait, and one more is refused.

    ``on_release``: called each time a run has given its slot back (the pool refills then).
    """

    def __init__(self, concurrency: int, queue_limit: int, on_release: Callable[[], None]) -> None:
        self._slots = asyncio.Semaphore(concurrency)
        self._concurrency = concurrency
        self._queue_limit = queue_limit
        self._on_release = on_release
        #: Runs waiting for a slot, and runs holding one.
        self.waiting = 0
        self.running = 0
        # When the last run ended (see SandboxPool.start_warming); none yet: idle since ever.
        self._idle_since = float("-inf")

    @contextlib.asynccontextmanager
    async def hold(self) -> AsyncIterator[None]:
        """Hold a slot for the block, waiting for one in the queue if need be.

        Raises:
            QueueFull: every slot is busy and ``queue_limit`` runs already wait.
        """
        if self._slots.locked() and self.waiting >= self._queue_limit:
            raise QueueFull(self._concurrency, self.waiting)
        self.waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self.waiting -= 1
        self.running += 1
        try:
            yield
        finally:
            self.running -= 1
            self._idle_since = time.monotonic()
            self._slots.release()
            self._on_release()

    def idle_since(self) -> float | None:
        """When the last run ended; ``None`` while a run is in progress."""
        return None if self.running else self._idle_since
