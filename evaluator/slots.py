"""The run slots: a bounded number of runs at once, and a bounded queue of those waiting, shared
fairly between session owners (:class:`serving.FairSlots`, its groups the requests'
``session_owner``; requests without one count as one owner)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Callable

from serving import FairSlots, SlotsFull

from .errors import QueueFull

__all__ = ["RunSlots"]


class RunSlots:
    """``concurrency`` runs at once; at most ``queue_limit`` wait (one owner's at most three
    quarters of them while another owner's run runs or waits), and one more is refused. A slot
    that comes free goes to a waiting run of the owner running the fewest. A run waits until a
    slot comes, however long.

    ``on_release``: called each time a run has given its slot back (the pool refills after).
    """

    def __init__(self, concurrency: int, queue_limit: int, on_release: Callable[[], None]) -> None:
        self._slots = FairSlots(concurrency, queue_limit, on_release=on_release)
        self._cpus = min(concurrency, _cpus())

    @property
    def running(self) -> int:
        """Runs holding a slot."""
        return self._slots.running

    @property
    def cpus(self) -> int:
        """The CPUs this process may use, at most its slots."""
        return self._cpus

    def spare_cpu(self) -> bool:
        """Whether fewer runs hold a slot than this process has CPUs (and slots)."""
        return self._slots.running < self._cpus

    @property
    def waiting(self) -> int:
        """Runs waiting for a slot."""
        return self._slots.waiting

    @contextlib.asynccontextmanager
    async def hold(self, owner: str | None = None) -> AsyncIterator[None]:
        """Hold a slot for the block on behalf of ``owner``, waiting for one in the queue if
        need be.

        Raises:
            QueueFull: every slot is busy and ``queue_limit`` runs already wait, or the owner's
                own fill its share of them.
        """
        try:
            await self._slots.acquire(owner)
        except SlotsFull as full:
            raise QueueFull(self._slots.limit, full.waiting) from None
        try:
            yield
        finally:
            self._slots.release(owner)


def _cpus() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1
