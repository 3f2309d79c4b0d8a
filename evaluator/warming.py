"""Warm sandboxes: how many to keep (what was asked for at the least, more while runs miss
one), and those of one agent command line.

Each run that wanted a warm sandbox and found none adds one, up to ``most``; after
:data:`SHRINK_AFTER` seconds without such a miss, one fewer, down to the ``floor`` asked for
again (an idle service gives the memory back).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from . import run_cgroup
from .sandbox import Sandbox
from .workdir import Workdir

__all__ = ["DEMAND_FACTOR", "SHRINK_AFTER", "Tier", "WarmDemand"]

#: The most warm sandboxes demand may keep by default, as a multiple of the ``count`` asked for.
DEMAND_FACTOR = 4
#: Seconds without a run that found no warm sandbox, after which one fewer is kept.
SHRINK_AFTER = 60.0


class WarmDemand:
    """The number of warm sandboxes kept now (:attr:`target`), following the misses."""

    def __init__(self, floor: int = 0, most: int | None = None) -> None:
        #: Kept at the least (the setting).
        self.floor = floor
        #: Kept at the most (``None``: :data:`DEMAND_FACTOR` times ``floor``).
        self.most = max(floor, floor * DEMAND_FACTOR if most is None else most)
        #: Kept now.
        self.target = floor
        self._last_miss = time.monotonic()

    def missed(self) -> None:
        """A run wanted a warm sandbox and found none: keep one more."""
        if self.floor:
            self._last_miss = time.monotonic()
            self.target = min(self.most, self.target + 1)

    def shrink(self) -> bool:
        """Keep one fewer if :data:`SHRINK_AFTER` seconds passed without a miss (counted
        again from now); whether it did."""
        now = time.monotonic()
        if self.target <= self.floor or now - self._last_miss < SHRINK_AFTER:
            return False
        self.target -= 1
        self._last_miss = now
        return True

    def next_shrink(self) -> float | None:
        """Seconds until :meth:`shrink` may keep one fewer; ``None``: at the floor already."""
        if self.target <= self.floor:
            return None
        return max(0.0, self._last_miss + SHRINK_AFTER - time.monotonic())

    def stop(self) -> None:
        """Keep none (warming failed: the next would fail too)."""
        self.floor = self.target = 0


@dataclass
class Tier:
    """Warm sandboxes of one agent command line: those still importing, and those waiting."""

    agent: Callable[[Workdir], list[str]]
    #: The most made at a time (with a cpu controller; else one, with spare CPU only).
    at_once: int
    warming: list[Sandbox] = field(default_factory=list)
    waiting: list[Sandbox] = field(default_factory=list)

    def bound_idle(self, sandbox: Sandbox, *, again: bool = False) -> None:
        """While ``sandbox`` warms, take it out of ``SCHED_IDLE`` every
        :data:`.run_cgroup.IDLE_AT_MOST` seconds from now (``again``: now too; its launcher may
        enter it late): a busy host still warms it, at the least weight (see
        :mod:`.run_cgroup`)."""
        cgroup = sandbox.cgroup
        if sandbox in self.warming and cgroup is not None and cgroup.starts_idle:
            if again:
                cgroup.leave_idle()
            loop = asyncio.get_running_loop()
            loop.call_later(run_cgroup.IDLE_AT_MOST, lambda: self.bound_idle(sandbox, again=True))
