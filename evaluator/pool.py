"""Sandboxes made ahead of time, one per slot, and their disposal after each run.

A sandbox is a run's working directory, its cgroups, its host user and a launcher started in
them that waits for its command line (see :mod:`.jail`). Each slot keeps its next sandbox ready
while idle, so a request pays only for bwrap and the interpreter. Disposal (kill, unmount,
cgroup removal) runs in the background once the answer is produced, always, and
:meth:`SandboxPool.aclose` waits for all of it.

Warm sandboxes (:meth:`SandboxPool.start_warming`) go further: bwrap and the interpreter are
started, and the agent (:mod:`._agent`) imports the modules a run is likely to need, before the
run arrives. They are made with spare CPU only, and made again as soon as one is taken, so that
calls that come steadily find one warm:

- with a cpu controller, in a cgroup of the least CPU weight until it is used: their imports
  take only CPU time no run wants, so they are made at once, however busy the service is (a
  saturated service makes no progress on them, and loses next to nothing to them), as many
  at a time as the service has CPUs (more would share the spare CPU time, and each would be
  ready later than the first of them could be);
- without one, one at a time, started only while fewer runs are in progress than the service
  has CPUs (a run's end tries again): a run then shares a CPU with one agent's imports at most.

How many are kept follows demand: ``count`` (``EVALUATOR_WARM_SANDBOXES``) at the least; each
run that wanted a warm sandbox and found none adds one, up to ``most``
(``EVALUATOR_WARM_SANDBOXES_MAX``, by default :data:`DEMAND_FACTOR` times ``count``); after
:data:`SHRINK_AFTER` seconds without such a miss, one fewer (the surplus warm one is disposed
of). A run takes a warm sandbox only once it is warm; else it takes a cold one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any

from ._agent import WARM
from .cgroups import Cgroups
from .jail import MOUNTED
from .sandbox import Sandbox, SandboxMaker
from .users import RunUsers
from .workdir import Workdir, WorkdirRoot

__all__ = ["Sandbox", "SandboxPool"]

log = logging.getLogger(__name__)


_ANSWER_FIRST = 0.002
#: Seconds into a run that took a warm sandbox after which its replacement is made, if the run's
#: answer has not made it already (a short run's answer goes first; a long run's does not
#: keep the pool short meanwhile).
_REFILL_DURING = 0.1
#: The most warm sandboxes demand may keep by default, as a multiple of the ``count`` asked for.
DEMAND_FACTOR = 4
#: Seconds without a run that found no warm sandbox, after which one fewer is kept.
SHRINK_AFTER = 60.0


class SandboxPool:
    """Makes sandboxes, keeps ``ready`` of them prepared, and disposes of them.

    Args:
        root: Where the working directories are created.
        cgroups: The factory of the runs' cgroups.
        users: The host users of the runs.
        covers: Host directories the runs' user may not traverse, with the paths below them
            it needs (see :func:`.users.covers`).
        workdir_size: Bytes of each working directory.
        workdir_inodes: Inodes of each working directory.
        shm_size: Bytes of each run's ``noexec`` ``/dev/shm``, made with its working directory
            (see :attr:`.workdir.Workdir.shm`); ``None``: none (unsandboxed runs).
        rlimits: ``(resource, limit)`` pairs set in every run's process.
        seccomp_program: The compiled seccomp filter, or ``None`` for none.
        host_env: ``None`` for runs in bwrap (which sets the environment); else the environment
            of unsandboxed runs, whose home and temporary directories are then set to the
            working directory's host path.
        ready: Sandboxes kept prepared while idle (0: each run prepares its own).
        on_dispose: Called with each sandbox disposed of, once its processes are gone.
    """

    def __init__(
        self,
        root: WorkdirRoot,
        cgroups: Cgroups,
        users: RunUsers,
        *,
        covers: tuple[tuple[str, tuple[str, ...]], ...] = (),
        workdir_size: int,
        workdir_inodes: int,
        shm_size: int | None = None,
        rlimits: Sequence[tuple[int, int]],
        seccomp_program: bytes | None,
        host_env: Mapping[str, str] | None,
        ready: int,
        on_dispose: Callable[[Sandbox], None] | None = None,
    ) -> None:
        self._maker = SandboxMaker(
            root,
            cgroups,
            users,
            covers=covers,
            workdir_size=workdir_size,
            workdir_inodes=workdir_inodes,
            shm_size=shm_size,
            rlimits=rlimits,
            seccomp_program=seccomp_program,
            host_env=host_env,
            on_dispose=on_dispose,
        )
        self._cgroups = cgroups
        self._target = ready
        self._ready: list[Sandbox] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = False
        # Warm sandboxes: the agent's command line, how many to keep at the least and now,
        # whether a CPU is spare; the last miss; those still importing, and those ready.
        self._agent: Callable[[Workdir], list[str]] | None = None
        self._warm_floor = 0
        self._warm_most = 0
        self._warm_target = 0
        self._spare_cpu: Callable[[], bool] = lambda: False
        self._warm_at_once = 1
        self._last_miss = 0.0
        self._shrink_timer: asyncio.TimerHandle | None = None
        self._warming: list[Sandbox] = []
        self._warm: list[Sandbox] = []
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

    async def ready(self, sandbox: Sandbox) -> bool:
        """Wait until a sandbox's working directory is there to write in (see :meth:`take`).

        ``False``: its launcher failed (it is killed; its output says why).
        """
        workdir = sandbox.workdir
        if workdir.launcher_mount is None or workdir.mounted:
            return True
        try:
            if await sandbox.process.mounted():
                workdir.attach(sandbox.process.pid)
                return True
        except OSError:
            log.exception(
                "could not reach the working directory of sandbox %d", sandbox.process.pid
            )
        sandbox.process.kill()
        return False

    @property
    def warm_count(self) -> int:
        """Warm sandboxes waiting for a run."""
        return len(self._warm)

    @property
    def warm_target(self) -> int:
        """Warm sandboxes kept now (see the module: it follows demand)."""
        return self._warm_target

    def take_warm(self) -> Sandbox | None:
        """A warm sandbox whose agent waits for its run, if there is one; a miss makes the pool
        keep one more (see the module). The caller refills the pool once its run has answered
        (:meth:`retire`, :meth:`refill_soon`), or it is refilled :data:`_REFILL_DURING`
        seconds into the run."""
        if not self._warm:
            if self._agent is not None and self._warm_floor:
                self._last_miss = time.monotonic()
                self._warm_target = min(self._warm_most, self._warm_target + 1)
            return None
        self.warm_taken += 1
        asyncio.get_running_loop().call_later(_REFILL_DURING, self.refill)
        return self._warm.pop()

    def start_warming(
        self,
        agent: Callable[[Workdir], list[str]],
        count: int,
        most: int | None,
        spare_cpu: Callable[[], bool],
        cpus: int = 1,
    ) -> None:
        """Keep ``count`` warm sandboxes at the least, and as demand asks up to ``most``
        (``None``: :data:`DEMAND_FACTOR` times ``count``), running ``agent(workdir)`` (bwrap's
        command line).

        ``spare_cpu``: whether fewer runs are in progress than the service has CPUs; without a
        cpu controller, a sandbox is warmed only then (see the module). ``cpus``: the service's
        CPUs, the most warmed at a time with a cpu controller.
        """
        self._agent, self._spare_cpu, self._warm_at_once = agent, spare_cpu, max(1, cpus)
        self._warm_floor = self._warm_target = count
        self._warm_most = max(count, count * DEMAND_FACTOR if most is None else most)
        self._last_miss = time.monotonic()
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
                # Awaiting it returns at once: yield, so that its _filled clears _filling.
                await asyncio.sleep(0)
            else:
                await asyncio.shield(filling)

    def refill_soon(self) -> None:
        """:meth:`refill` once the answer that is on its way has gone (see :meth:`_retire`)."""
        if not self._closing:
            asyncio.get_running_loop().call_later(_ANSWER_FIRST, self.refill)

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
            while self._wants_warm():
                sandbox = await self._make_off_loop(warm=True, session=True)
                if sandbox is None:
                    break
                assert self._agent is not None
                self._warming.append(sandbox)
                sandbox.process.release(self._agent(sandbox.workdir), None)
                sandbox.process.watch(self._watcher(sandbox))

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

    def _wants_warm(self) -> bool:
        """Whether to start one more warm sandbox now (see the module)."""
        if self._agent is None or self._closing or not self._warm_target:
            return False
        self._shrink()
        if len(self._warm) + len(self._warming) >= self._warm_target:
            return False
        if self._cgroups.cpu is not None:
            return len(self._warming) < self._warm_at_once
        return not self._warming and self._spare_cpu()

    def _shrink(self) -> None:
        """One warm sandbox fewer per :data:`SHRINK_AFTER` seconds without a miss, down to the
        ``count`` asked for; a surplus one waiting is disposed of."""
        if self._warm_target <= self._warm_floor or self._closing:
            return
        now = time.monotonic()
        if now - self._last_miss >= SHRINK_AFTER:
            self._warm_target -= 1
            self._last_miss = now
            if len(self._warm) > self._warm_target:
                self._spawn(self.dispose(self._warm.pop(0)))
        if self._shrink_timer is None and self._warm_target > self._warm_floor:
            # Also when no run comes to look: an idle service gives the memory back.
            wait = self._last_miss + SHRINK_AFTER - now
            self._shrink_timer = asyncio.get_running_loop().call_later(wait, self._shrink_later)

    def _shrink_later(self) -> None:
        self._shrink_timer = None
        self._shrink()

    def _watcher(self, sandbox: Sandbox) -> Callable[[bytes], bool]:
        """What reads a warming agent's output: the launcher's mount, then the agent's WARM."""
        expected = [*([MOUNTED] if sandbox.workdir.launcher_mount else []), WARM]
        pending = bytearray()

        def on_output(chunk: bytes) -> bool:
            if self._closing or sandbox not in self._warming:  # aclose disposes of it
                return False
            pending.extend(chunk)
            while pending and expected and pending[:1] == expected[0]:
                del pending[:1]
                if expected.pop(0) == MOUNTED:
                    try:
                        sandbox.workdir.attach(sandbox.process.pid)
                    except OSError as exc:
                        return self._warming_failed(sandbox, f"its directory: {exc}".encode())
            if not expected:
                self._warming.remove(sandbox)
                self._warm.append(sandbox)
                # The next may start now (so many at a time, see the module).
                self.refill()
                return False
            if pending or not chunk:
                return self._warming_failed(sandbox, bytes(pending) or b"(exited)")
            return True

        return on_output

    def _warming_failed(self, sandbox: Sandbox, output: bytes) -> bool:
        """A warm sandbox that did not get warm: no more are made (the next would fail too)."""
        log.warning(
            "warm sandboxes are turned off: one failed to start (memory limit too low for "
            "EVALUATOR_PREIMPORT?): %s",
            output[:500].decode("utf-8", "replace").strip(),
        )
        self._warm_target = 0
        self._warming.remove(sandbox)
        self._spawn(self.dispose(sandbox))
        return False

    async def aclose(self) -> None:
        """Wait for every disposal, then dispose of the ready sandboxes."""
        self._closing = True
        if self._shrink_timer is not None:
            self._shrink_timer.cancel()
            self._shrink_timer = None
        while self._tasks:
            # Removed here, not only by their done callbacks: gathering tasks that are all done
            # already returns without yielding to the loop, which would never run those
            # callbacks, and this loop would spin for ever (seen on CPython 3.13).
            tasks = list(self._tasks)
            await asyncio.gather(*tasks, return_exceptions=True)
            self._tasks.difference_update(tasks)
        for waiting in (self._ready, self._warm, self._warming):
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
