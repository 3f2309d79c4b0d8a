"""Sandboxes made ahead of time, one per slot, and their disposal after each run.

A sandbox is a run's working directory, its cgroups, its host user and a launcher started in
them that waits for its command line (see :mod:`.jail`). Each slot keeps its next sandbox ready
while idle, so a request pays only for bwrap and the interpreter. Disposal (kill, unmount,
cgroup removal) runs in the background once the answer is produced, always, and
:meth:`SandboxPool.aclose` waits for all of it.

Warm sandboxes (:meth:`SandboxPool.start_warming`) go further: bwrap and the interpreter are
started, and the agent (:mod:`._agent`) imports the modules a run is likely to need, before the
run arrives. They are made with spare CPU only, and made again as soon as one is taken, so that
calls that come steadily find one warm. How many are kept, of the warm ones and of the
*started* ones (the agent up, nothing imported), which is made next and how, and when a run
waits for one still warming: see :mod:`.warming`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from ._agent import WARM
from .jail import MOUNTED
from .preimports import Preimports
from .sandbox import Sandbox, SandboxMaker
from .warming import Tier, WarmDemand, next_tier
from .workdir import Workdir

__all__ = ["Sandbox", "SandboxPool"]

log = logging.getLogger(__name__)

_ANSWER_FIRST = 0.002
#: Seconds after a run gave its slot back before the pool is refilled: making a sandbox holds
#: the GIL for milliseconds at a time (``posix_spawn`` releases it only once the child has
#: exec'd), which would hold up that run's answer, and a gateway's waiting on it.
_AFTER_ANSWER = 0.02
#: Seconds into a run that took a warm sandbox after which its replacement is made, if the run's
#: answer has not made it already (a short run's answer goes first; a long run's does not
#: keep the pool short meanwhile).
_REFILL_DURING = 0.1
#: Seconds a run waits at most for the warm sandbox it took as it warmed (see take_warm).
_CLAIM_AT_MOST = 10.0


class SandboxPool:
    """Keeps ``ready`` sandboxes of ``maker`` prepared (0: each run prepares its own), and
    disposes of them through it; ``preimports``: what warm ones import now."""

    def __init__(
        self, maker: SandboxMaker, *, ready: int, preimports: Preimports | None = None
    ) -> None:
        self._maker = maker
        self._preimports = preimports
        self._target = ready
        self._ready: list[Sandbox] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = False
        # Warm sandboxes (see the module): those that import, and those only started.
        self._full: Tier | None = None
        self._started: Tier | None = None
        self._spare_cpu: Callable[[], bool] = lambda: False
        self._shrink_timer: asyncio.TimerHandle | None = None
        # The task that makes them (see refill), and whether it should look again.
        self._filling: asyncio.Task[None] | None = None
        self._fill_again = False
        #: Runs that took a warm sandbox.
        self.warm_taken = 0

    def take(self, *, session: bool = False) -> Sandbox:
        """A ready sandbox, or a new one (``session``: for a session's agent, given its pipes);
        the caller hands it to :meth:`retire` when done.

        Raises:
            OSError: a new sandbox could not be made.
        """
        return self._ready.pop() if self._ready else self.prepare(session=session)

    @property
    def warm_count(self) -> int:
        """Warm sandboxes waiting for a run (besides those only started)."""
        return len(self._full.waiting) if self._full is not None else 0

    @property
    def started_count(self) -> int:
        """Sandboxes whose agent is started, nothing imported, waiting for a run."""
        return len(self._started.waiting) if self._started is not None else 0

    @property
    def warm_target(self) -> int:
        """Warm sandboxes kept now (see the module: it follows demand)."""
        return self._full.demand.target if self._full is not None else 0

    @property
    def started_target(self) -> int:
        """Started sandboxes kept now (see the module: it follows demand too)."""
        return self._started.demand.target if self._started is not None else 0

    async def take_warm(self) -> Sandbox | None:
        """A warm sandbox whose agent waits for its run, else one far enough in its imports
        (waited for: see :meth:`.warming.Tier.claimable`), else a started one, if there is one;
        a run that finds no warm one makes the pool keep one more, and one that finds neither
        one more started one (see :mod:`.warming`). The pool is refilled once
        the run has answered (:meth:`refill_soon`, when its slot is given back), or
        :data:`_REFILL_DURING` seconds into the run."""
        full = self._full
        if full is None:
            return None
        if not full.waiting:
            full.demand.missed()
            claimable = full.claimable(self._wanted())
            if claimable is not None and (claimed := await self._claim(full, claimable)):
                return claimed
        tier = next((t for t in (full, self._started) if t and t.waiting), None)
        if tier is None:
            if self._started is not None:
                self._started.demand.missed()
            return None
        self.warm_taken += 1
        asyncio.get_running_loop().call_later(_REFILL_DURING, self.refill)
        tier.waiting.sort(key=lambda sandbox: not self._lacks(sandbox))  # stable: newest last
        taken = tier.waiting.pop()
        if tier is full:
            for sandbox in [s for s in tier.waiting if self._lacks(s)]:
                tier.waiting.remove(sandbox)
                self._spawn(self.dispose(sandbox))
        return taken

    async def _claim(self, tier: Tier, sandbox: Sandbox) -> Sandbox | None:
        """``sandbox``, still warming, once it is warm, given a run's CPU weight meanwhile;
        ``None``: it failed, or took longer than :data:`_CLAIM_AT_MOST` (it is disposed of).
        Raises ``RuntimeError``: the pool closed meanwhile."""
        claim = tier.claim(sandbox)
        warm = False
        try:
            if sandbox.cgroup is not None:  # again once it runs: it may enter SCHED_IDLE late
                sandbox.cgroup.foreground(settled=False)
            self.refill()  # its replacement
            async with asyncio.timeout(_CLAIM_AT_MOST):
                warm = await claim
        except TimeoutError:
            pass
        finally:
            if not warm:  # failed, too slow, the pool closing, or the run cancelled
                tier.failed(sandbox)
                sandbox.process.stop_watching()
                sandbox.process.kill()  # now: a loop shutting down may never run the disposal
                self._spawn(self.dispose(sandbox))
        if not warm and self._closing:  # else the run would make a sandbox the pool never sees
            raise RuntimeError("the evaluator is stopping")
        self.warm_taken += int(warm)
        return sandbox if warm else None

    def _lacks(self, sandbox: Sandbox) -> bool:
        """Whether a warm sandbox lacks a module first cells use again (see :mod:`.preimports`):
        those waiting are made again (after a call took one: it imported more than a started
        one)."""
        return not set(self._wanted()) <= set(sandbox.imports)

    def _wanted(self) -> tuple[str, ...]:
        """The modules warm sandboxes import now (see :mod:`.preimports`)."""
        return self._preimports.current() if self._preimports is not None else ()

    def start_warming(
        self,
        agent: Callable[[Workdir], list[str]],
        count: int,
        most: int | None,
        spare_cpu: Callable[[], bool],
        cpus: int = 1,
        started: Callable[[Workdir], list[str]] | None = None,
    ) -> None:
        """Keep ``count`` warm sandboxes at the least, and as demand asks up to ``most``
        (``None``: :data:`.warming.DEMAND_FACTOR` times ``count``), running ``agent(workdir)``
        (bwrap's command line); and as many started ones beside them where ``most`` is above
        ``count`` (up to ``most`` as runs start cold), running ``started(workdir)``, the agent
        importing nothing (``None``: none, ``agent`` imports nothing either).

        ``spare_cpu``: whether fewer runs are in progress than the service has CPUs; without a
        cpu controller, a sandbox is warmed only then (see the module). ``cpus``: the service's
        CPUs, the most warmed at a time with a cpu controller.
        """
        self._spare_cpu = spare_cpu
        self._full = Tier(agent, max(1, cpus), WarmDemand(count, most))
        # Beside the warm ones, where demand may grow: a pool asked to keep exactly ``count``
        # (a bound on its processes) has no started ones.
        if started and self._full.demand.most > count:
            self._started = Tier(started, max(1, cpus), WarmDemand(count, most))
        self.refill()

    def prepare(self, *, warm: bool = False, session: bool = False) -> Sandbox:
        """Make a sandbox: working directory, cgroups, and the process waiting in them.

        ``warm``: a sandbox for the agent, in a cgroup made in the background (see
        :meth:`start_warming`), the launcher given a request pipe. ``session``: given a request
        pipe and a status pipe, for a session's agent (or a plain run: its launcher closes them).

        Raises:
            OSError: any part could not be made (what was made is removed again).
        """
        return self._maker.make(warm=warm, session=session)

    async def dispose(self, sandbox: Sandbox) -> None:
        """Kill what is left of a run and remove its sandbox, each step whatever the others did."""
        await self._maker.dispose(sandbox)

    def retire(self, sandbox: Sandbox) -> None:
        """Dispose of a used sandbox in the background, then prepare the slot's next one."""
        self._spawn(self._retire(sandbox))

    def refill(self) -> None:
        """Prepare sandboxes until ``ready`` of them wait, then warm sandboxes, in the background.

        They are made one at a time in a worker thread (directories, mounts, cgroups, the
        launcher's spawn: milliseconds of system calls), so that the event loop goes on
        answering meanwhile: a request that arrives right after an answer does not wait for
        the sandbox that answer's run is replaced by.
        """
        if self._closing:
            return
        self._fill_again = True
        if self._filling is None:
            self._filling = asyncio.ensure_future(self._fill())
            self._tasks.add(self._filling)
            self._filling.add_done_callback(self._filled)

    async def settled(self, *, refill: bool = False) -> None:
        """Wait until the sandboxes :meth:`refill` was asked for (now, with ``refill``) are
        made (a warm one's agent may still be importing)."""
        if refill:
            self.refill()
        while (filling := self._filling) is not None:
            if filling.done():
                # Awaiting it would return at once, before its _filled (scheduled) clears
                # _filling: this would spin and never let the loop run it.
                await asyncio.sleep(0)
            else:
                await asyncio.shield(filling)

    def refill_soon(self) -> None:
        """:meth:`refill` once the answer, and a gateway's answer waiting on it, have gone."""
        if not self._closing:
            asyncio.get_running_loop().call_later(_AFTER_ANSWER, self.refill)

    async def _fill(self) -> None:
        while self._fill_again and not self._closing:
            self._fill_again = False
            while len(self._ready) < self._target:
                # With an agent's pipes, for a session's agent (see take); a plain
                # run's launcher closes them before it execs (see JailedProcess.release).
                sandbox = await self._make_off_loop(session=True)
                if sandbox is None:
                    break
                self._ready.append(sandbox)
            while (tier := self._next_tier()) is not None:
                sandbox = await self._make_off_loop(warm=True, session=True)
                if sandbox is None:
                    break
                tier.begin(sandbox)
                if tier is self._full and self._preimports is not None:
                    sandbox.imports = self._preimports.current()  # as its command line says
                sandbox.process.release(tier.agent(sandbox.workdir), None)
                sandbox.process.watch(self._watcher(sandbox, tier))
                tier.bound_idle(sandbox)  # a busy host still warms it (see run_cgroup)

    def _filled(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._filling = None
        if not task.cancelled() and task.exception() is not None:
            log.error("making sandboxes ahead of time failed", exc_info=task.exception())
        if self._fill_again and not self._closing:  # asked for while it ended
            self.refill()

    async def _make_off_loop(self, *, warm: bool = False, session: bool = False) -> Sandbox | None:
        """A sandbox made in a worker thread; ``None``: it could not be made (logged), or the
        pool is closing (it is disposed of)."""
        try:
            sandbox = await self._maker.make_in_thread(warm=warm, session=session)
        except OSError:
            log.exception("could not prepare a%s sandbox ahead of time", " warm" if warm else "")
            return None
        if self._closing:
            await self.dispose(sandbox)
            return None
        return sandbox

    def _next_tier(self) -> Tier | None:
        """Which kind of warm sandbox to start now, if any (see the module)."""
        full = self._full
        if full is None or self._closing or not full.demand.target:
            return None
        self._shrink()
        cpu_controller = self._maker.cgroups.cpu is not None
        return next_tier(
            full, self._started, cpu_controller=cpu_controller, spare_cpu=self._spare_cpu
        )

    def _shrink(self) -> None:
        """One warm (or started) sandbox fewer once demand says so; a surplus one waiting is
        disposed of."""
        if self._full is None or self._closing:
            return
        waits = []
        for tier in (self._full, self._started):
            if tier is None:
                continue
            if (surplus := tier.shrink()) is not None:
                self._spawn(self.dispose(surplus))
            if (wait := tier.demand.next_shrink()) is not None:
                waits.append(wait)
        if self._shrink_timer is None and waits:
            wait = min(waits)
            # Also when no run comes to look: an idle service gives the memory back.
            self._shrink_timer = asyncio.get_running_loop().call_later(wait, self._shrink_later)

    def _shrink_later(self) -> None:
        self._shrink_timer = None
        self._shrink()

    def _watcher(self, sandbox: Sandbox, tier: Tier) -> Callable[[bytes], bool]:
        """What reads a warming agent's output: the launcher's mount, then the agent's WARM."""
        expected = [*([MOUNTED] if sandbox.workdir.launcher_mount else []), WARM]
        pending = bytearray()

        def on_output(chunk: bytes) -> bool:
            if self._closing or not tier.warms(sandbox):  # aclose disposes of it
                return False
            pending.extend(chunk)
            while pending and expected and pending[:1] == expected[0]:
                del pending[:1]
                if expected.pop(0) == MOUNTED:
                    try:
                        sandbox.workdir.attach(sandbox.process.pid)
                    except OSError as exc:
                        return self._warming_failed(sandbox, tier, f"its directory: {exc}".encode())
            if not expected:
                tier.warmed(sandbox)
                # The next may start now (so many at a time, see the module).
                self.refill()
                return False
            if pending or not chunk:
                return self._warming_failed(sandbox, tier, bytes(pending) or b"(exited)")
            return True

        return on_output

    def _warming_failed(self, sandbox: Sandbox, tier: Tier, output: bytes) -> bool:
        """A warm sandbox that did not get warm: no more are made (the next would fail too)."""
        log.warning(
            "warm sandboxes are turned off: one failed to start (memory limit too low for "
            "EVALUATOR_PREIMPORT?): %s",
            output[:500].decode("utf-8", "replace").strip(),
        )
        for kind in filter(None, (self._full, self._started)):
            kind.demand.stop()
        claimed = sandbox in tier.claimed
        tier.failed(sandbox)
        if not claimed:  # else its claim disposes of it
            self._spawn(self.dispose(sandbox))
        return False

    async def aclose(self) -> None:
        """Wait for every disposal, then dispose of the ready sandboxes."""
        self._closing = True
        tiers = [tier for tier in (self._full, self._started) if tier is not None]
        for claim in (claim for tier in tiers for claim in tier.claimed.values()):
            if not claim.done():
                claim.set_result(False)  # its run disposes of it (awaited below)
        if self._shrink_timer is not None:
            self._shrink_timer.cancel()
            self._shrink_timer = None
        while self._tasks or any(tier.claimed for tier in tiers):
            # Removed here, not only by their done callbacks: gathering tasks that are all done
            # already returns without yielding to the loop, which would never run those
            # callbacks (nor a claim's run), and this loop would spin for ever (seen on 3.13).
            tasks = list(self._tasks)
            await asyncio.gather(*tasks, asyncio.sleep(0.01), return_exceptions=True)
            self._tasks.difference_update(tasks)
        for waiting in (self._ready, *(kept for t in tiers for kept in (t.waiting, t.warming))):
            while waiting:
                await self.dispose(waiting.pop())

    async def _retire(self, sandbox: Sandbox) -> None:
        # Disposal starts with synchronous work (kill, rmdir, umount, a fork to refill); the
        # run's caller is woken only after this task's first step, so let its answer go first.
        await asyncio.sleep(_ANSWER_FIRST)
        await self.dispose(sandbox)
        self.refill()

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        """Run in the background; :meth:`aclose` waits for it."""
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
