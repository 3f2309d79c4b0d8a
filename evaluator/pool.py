"""Sandboxes made ahead of time, one per slot, and their disposal after each run.

A sandbox is a run's working directory, its cgroups, its host user and a launcher started in
them that waits for its command line (see :mod:`.jail`). Each slot keeps its next sandbox ready
while idle, so a request pays only for bwrap and the interpreter. Disposal (kill, unmount,
cgroup removal) runs in the background once the answer is produced, always, and
:meth:`SandboxPool.aclose` waits for all of it.

Warm sandboxes (:meth:`SandboxPool.start_warming`) go further: bwrap and the interpreter are
started, and the agent (:mod:`._agent`) imports the modules a run is likely to need, before the
run arrives. They are made only with spare capacity: their cgroup has the least CPU weight until
it is used (so their imports take only CPU time no run wants), or, without a cpu cgroup, they
are made one at a time. Either way they are started only once no run has been in progress for
:data:`WARM_AFTER_IDLE` seconds: under a steady stream of runs, the imports a run does not use
would take CPU time from the service itself. A run takes a warm sandbox only once it is warm;
else it takes a cold one, as without them.
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
#: Seconds without a run in progress before warm sandboxes are started (see the module).
WARM_AFTER_IDLE = 0.25


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
        # Warm sandboxes: the agent's command line, how many to keep, whether the service is
        # idle; those still importing, and those ready.
        self._agent: Callable[[Workdir], list[str]] | None = None
        self._warm_target = 0
        self._idle_since: Callable[[], float | None] = lambda: None
        self._warm_timer: asyncio.TimerHandle | None = None
        self._warming: list[Sandbox] = []
        self._warm: list[Sandbox] = []
        #: Runs that took a warm sandbox.
        self.warm_taken = 0

    def take(self) -> Sandbox:
        """A ready sandbox, or a new one; the caller hands it to :meth:`retire` when done.

        Raises:
            OSError: a new sandbox could not be made.
        """
        return self._ready.pop() if self._ready else self.prepare()

    def take_for_session(self) -> Sandbox:
        """A ready sandbox, or a new one, for a session's agent (given its pipes).

        Raises:
            OSError: a new sandbox could not be made.
        """
        return self._ready.pop() if self._ready else self.prepare(session=True)

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

    def take_warm(self) -> Sandbox | None:
        """A warm sandbox whose agent waits for its run, if there is one."""
        if not self._warm:
            return None
        self.warm_taken += 1
        return self._warm.pop()

    def start_warming(
        self,
        agent: Callable[[Workdir], list[str]],
        count: int,
        idle_since: Callable[[], float | None],
    ) -> None:
        """Keep ``count`` warm sandboxes, running ``agent(workdir)`` (bwrap's command line).

        ``idle_since``: when (``time.monotonic()``) the last run ended, ``None`` while one is in
        progress; the pool is refilled when a run ends, so it waits for idleness from there.
        """
        self._agent, self._warm_target, self._idle_since = agent, count, idle_since
        self._warm_up()

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
        """Prepare sandboxes until ``ready`` of them wait, then warm sandboxes."""
        while not self._closing and len(self._ready) < self._target:
            try:
                # With an agent's pipes, for a session's agent (see take_for_session); a plain
                # run's launcher closes them before it execs (see JailedProcess.release).
                self._ready.append(self.prepare(session=True))
            except OSError:
                log.exception("could not prepare a sandbox ahead of time")
                return
        self._warm_up()

    def _warm_up(self) -> None:
        """Start warm sandboxes until ``count`` of them are warm or warming (see the module)."""
        if self._agent is None or self._closing or self._warm_timer is not None:
            return
        idle_since = self._idle_since()
        if idle_since is None:
            return
        wait = idle_since + WARM_AFTER_IDLE - time.monotonic()
        if wait > 0:
            self._warm_timer = asyncio.get_running_loop().call_later(wait, self._warm_later)
            return
        background = self._cgroups.cpu is not None
        while (
            not self._closing
            and len(self._warm) + len(self._warming) < self._warm_target
            and (background or not self._warming)
        ):
            try:
                # With a status pipe: a session may take it (see JailedProcess.become_session).
                sandbox = self.prepare(warm=True, session=True)
            except OSError:
                log.exception("could not prepare a warm sandbox")
                return
            self._warming.append(sandbox)
            sandbox.process.release(self._agent(sandbox.workdir), None)
            sandbox.process.watch(self._watcher(sandbox))

    def _warm_later(self) -> None:
        self._warm_timer = None
        self._warm_up()

    def _watcher(self, sandbox: Sandbox) -> Callable[[bytes], bool]:
        """What reads a warming agent's output: the launcher's mount, then the agent's WARM."""
        expected = [*([MOUNTED] if sandbox.workdir.launcher_mount else []), WARM]
        pending = bytearray()

        def on_output(chunk: bytes) -> bool:
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
                return False
            if pending or not chunk:
                return self._warming_failed(sandbox, bytes(pending) or b"(exited)")
            return True

        return on_output

    def _warming_failed(self, sandbox: Sandbox, output: bytes) -> bool:
        """A warm sandbox that did not get warm: no more are made (the next would fail too)."""
        if self._closing or sandbox not in self._warming:
            return False
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
        if self._warm_timer is not None:
            self._warm_timer.cancel()
            self._warm_timer = None
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
