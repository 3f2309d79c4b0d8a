"""Warm sandboxes (see :mod:`.pool`): how many of each kind are kept, and which is made next.

How many are kept follows demand: ``count`` (``EVALUATOR_WARM_SANDBOXES``) at the least, up
to ``most`` (``EVALUATOR_WARM_SANDBOXES_MAX``): each run that wanted a warm sandbox and found
none adds one; after :data:`SHRINK_AFTER` seconds without such a miss, one fewer, down to
``count`` again (an idle service gives the memory back).

When they import modules (``EVALUATOR_PREIMPORT``), *started* sandboxes are kept beside them
(none when ``most`` is ``count``): the interpreter and agent started, nothing imported but the
gateway's prelude (about 5 MiB, a few hundredths of a CPU-second to make, where a warm one
takes tenths). A run that finds no warm sandbox takes one of those, else starts cold: calls
that come faster than sandboxes can be warmed still skip the interpreter's start. How many are
kept follows the runs that started cold, as the warm ones follow those that found none warm
(with the defaults, 2 to 8 of each). While fewer are kept than that, they are made first, and
no warm one is begun meanwhile: under calls that come back to back, the spare CPU time goes
to the sandboxes that can keep up with them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from . import run_cgroup
from .sandbox import Sandbox
from .workdir import Workdir

__all__ = ["DEMAND_FACTOR", "SHRINK_AFTER", "Tier", "WarmDemand", "next_tier"]

#: The most sandboxes of a kind demand may keep by default, as a multiple of the ``count`` asked
#: for.
DEMAND_FACTOR = 4
#: Seconds without a run that found none of a kind, after which one fewer of it is kept.
SHRINK_AFTER = 60.0


class WarmDemand:
    """The number of sandboxes of a kind kept now (:attr:`target`), following the misses."""

    def __init__(self, floor: int, most: int | None = None) -> None:
        #: Kept at the least (the setting).
        self.floor = floor
        #: Kept at the most (``None``: :data:`DEMAND_FACTOR` times ``floor``).
        self.most = max(floor, floor * DEMAND_FACTOR if most is None else most)
        #: Kept now.
        self.target = floor
        self._last_miss = time.monotonic()

    def missed(self) -> None:
        """A run wanted one of this kind and found none: keep one more."""
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
    """Warm sandboxes of one agent command line: those still importing, those waiting, and
    how many are kept."""

    agent: Callable[[Workdir], list[str]]
    #: The most made at a time (with a cpu controller; else one, with spare CPU only).
    at_once: int
    demand: WarmDemand
    warming: list[Sandbox] = field(default_factory=list)
    waiting: list[Sandbox] = field(default_factory=list)

    @property
    def short(self) -> bool:
        """Whether fewer are waiting or being made than are kept now."""
        return len(self.waiting) + len(self.warming) < self.demand.target

    def shrink(self) -> Sandbox | None:
        """Keep one fewer once demand says so; a waiting one beyond the number kept (those
        still being made counted: one made after the number fell is surplus too), to dispose
        of."""
        self.demand.shrink()
        if self.waiting and len(self.waiting) + len(self.warming) > self.demand.target:
            return self.waiting.pop(0)
        return None

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


def next_tier(
    full: Tier, started: Tier | None, *, cpu_controller: bool, spare_cpu: Callable[[], bool]
) -> Tier | None:
    """Which kind of sandbox to start now, if any (see the module): a started one while those
    are short, and meanwhile no warm one; with a cpu controller, up to the kind's ``at_once``
    at a time; without, one at a time, and only with ``spare_cpu``."""
    kind = started if started is not None and started.short else full if full.short else None
    if kind is None:
        return None
    if cpu_controller:
        return kind if len(kind.warming) < kind.at_once else None
    warming = full.warming or (started is not None and started.warming)
    return kind if not warming and spare_cpu() else None
