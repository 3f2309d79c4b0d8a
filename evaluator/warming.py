"""Warm sandboxes (see :mod:`.pool`): how many of each kind are kept, and which is made next.

How many are kept follows demand: ``count`` (``EVALUATOR_WARM_SANDBOXES``) at the least, up
to ``most`` (``EVALUATOR_WARM_SANDBOXES_MAX``): each run that wanted a warm sandbox and found
none adds one; after :data:`SHRINK_AFTER` seconds without such a miss, one fewer, down to
``count`` again (an idle service gives the memory back).

They are made with spare CPU only:

- with a cpu controller, in a cgroup of the least CPU weight until it is used (and first
  under ``SCHED_IDLE``, see :mod:`.run_cgroup`): their imports take only CPU time no run
  wants, so they are made at once, however busy the service is, of each kind as many at a
  time as the service has CPUs (more would share the spare CPU time, each ready later);
- without one, one at a time, started only while fewer runs are in progress than the service
  has CPUs (a run's end tries again, once its answer has gone): a run then shares a CPU with
  one agent's imports at most.

When they import modules (``EVALUATOR_PREIMPORT``), *started* sandboxes are kept beside them
(none when ``most`` is ``count``): the interpreter and agent started, nothing imported but the
gateway's prelude (about 5 MiB, a few hundredths of a CPU-second to make, where a warm one
takes tenths). A run that finds no warm sandbox takes one of those, else starts cold: calls
that come faster than sandboxes can be warmed still skip the interpreter's start. How many are
kept follows the runs that started cold, as the warm ones follow those that found none warm
(with the defaults, 2 to 8 of each). While fewer are kept than that, they are made first, and
no warm one is begun meanwhile: under calls that come back to back, the spare CPU time goes
to the sandboxes that can keep up with them.

A run that finds no warm sandbox waiting takes one still importing, and waits for it, once it
has been at it half the time recent ones took (:meth:`Tier.claimable`), if it imports what the
sessions' first cells use: its code would otherwise import them again in a started sandbox, on
the same CPUs that would finish these imports (given a run's CPU weight once taken). Under a
load that outruns the CPUs (agents plotting at once), a run then waits a few tenths of a second
where one started would take most of a second. Until two warm-ups were timed, none is taken
early; one that fails, or is not warm within seconds, is disposed of and the run goes on
without it.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections import deque
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
#: A run that finds no warm sandbox waiting takes one still importing (see
#: :meth:`Tier.claimable`) once it has been at it this share of the time recent ones took.
CLAIM_AFTER = 0.5
#: Recent warm-ups whose time :meth:`Tier.claimable` goes by.
_RECENT = 8


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
    #: Those a run took while they warmed, done once warm (``False``: it failed).
    claimed: dict[Sandbox, asyncio.Future[bool]] = field(default_factory=dict, repr=False)
    #: When each warming one was released.
    _since: dict[Sandbox, float] = field(default_factory=dict, init=False, repr=False)
    #: Seconds recent ones took to get warm.
    _took: deque[float] = field(
        default_factory=lambda: deque(maxlen=_RECENT), init=False, repr=False
    )

    def begin(self, sandbox: Sandbox) -> None:
        """``sandbox`` is released to warm."""
        self.warming.append(sandbox)
        self._since[sandbox] = time.monotonic()

    def warmed(self, sandbox: Sandbox) -> None:
        """``sandbox`` got warm: to its claim, else to wait for a run."""
        since = self._since.pop(sandbox, None)
        if since is not None:  # claimed ones too: under a steady load, all may be
            self._took.append(time.monotonic() - since)
        claim = self.claimed.pop(sandbox, None)
        if claim is not None:
            if not claim.done():
                claim.set_result(True)
            return
        self.warming.remove(sandbox)
        self.waiting.append(sandbox)

    def failed(self, sandbox: Sandbox) -> None:
        """``sandbox`` did not get warm, or its claim gave up on it (it is disposed of)."""
        self._since.pop(sandbox, None)
        claim = self.claimed.pop(sandbox, None)
        if claim is not None and not claim.done():
            claim.set_result(False)
        if sandbox in self.warming:
            self.warming.remove(sandbox)

    def warms(self, sandbox: Sandbox) -> bool:
        """Whether ``sandbox`` is still being made (claimed or not)."""
        return sandbox in self._since

    def claimable(self, wanted: tuple[str, ...]) -> Sandbox | None:
        """The longest warming sandbox that imports exactly ``wanted`` (modules the sessions'
        first cells use, see :mod:`.preimports`), if it has been at it :data:`CLAIM_AFTER` of
        the time recent ones took. A run that takes it waits for the rest of its imports
        (given a run's CPU weight), where a started one would make its code import them all
        again, on the same CPUs; but none that first cells do not use."""
        if not wanted or len(self._took) < 2:
            return None
        enough = CLAIM_AFTER * statistics.median(self._took)
        now = time.monotonic()
        for sandbox in self.warming:
            if sandbox.imports == wanted and now - self._since.get(sandbox, now) >= enough:
                return sandbox
        return None

    def claim(self, sandbox: Sandbox) -> asyncio.Future[bool]:
        """Take ``sandbox`` as it warms: done once it is warm."""
        self.warming.remove(sandbox)
        claim = self.claimed[sandbox] = asyncio.get_running_loop().create_future()
        return claim

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
