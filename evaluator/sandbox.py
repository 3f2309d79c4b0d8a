"""One run's sandbox: its working directory, cgroups, host user and waiting launcher; made and
disposed of by a :class:`SandboxMaker` (the pool, :mod:`.pool`, decides when).

Disposal kills what is left, removes the cgroup (retrying while processes leave it), waits for
orphaned inits, removes the working directory, and only then gives the host uid back.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from . import seccomp
from .cgroups import Cgroups, RunCgroup
from .host import home_environment
from .jail import JailedProcess, LaunchSpec
from .procfs import await_orphans
from .users import RunUsers
from .workdir import SHM_INODES, Workdir, WorkdirRoot

__all__ = ["Sandbox", "SandboxMaker"]

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Sandbox:
    """Everything one run needs, made ahead of time; ``warm``: its agent is waiting."""

    workdir: Workdir
    cgroup: RunCgroup | None
    process: JailedProcess
    user: tuple[int, int] | None
    warm: bool = False
    #: The modules a warm one's agent was given to import (see :mod:`.preimports`).
    imports: tuple[str, ...] = ()

    async def ready(self) -> bool:
        """Wait until the working directory is there to write in (the launcher mounts it).

        ``False``: its launcher failed (it is killed; its output says why).
        """
        workdir = self.workdir
        if workdir.launcher_mount is None or workdir.mounted:
            return True
        try:
            if await self.process.mounted():
                workdir.attach(self.process.pid)
                return True
        except OSError:
            log.exception("could not reach the working directory of sandbox %d", self.process.pid)
        self.process.kill()
        return False


# Seconds a disposal waits for a killed sandbox's init to die (see procfs.await_orphans).
_ORPHANS_WITHIN = 5.0


class SandboxMaker:
    """Makes sandboxes and disposes of them.

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
        nproc: The RLIMIT_NPROC of runs sharing the service's uid, which their launchers set
            in their own user namespaces; ``None``: among ``rlimits``, or none.
        seccomp_program: The compiled seccomp filter, or ``None`` for none.
        host_env: ``None`` for runs in bwrap (which sets the environment); else the environment
            of unsandboxed runs, whose home and temporary directories are then set to the
            working directory's host path.
        on_dispose: Called with each sandbox disposed of, once its processes are gone.
        launcher: The launcher's file (see :class:`.launch.LaunchSpec`).
    """

    def __init__(
        self,
        root: WorkdirRoot,
        cgroups: Cgroups,
        users: RunUsers,
        *,
        covers: tuple[tuple[str, tuple[str, ...]], ...],
        workdir_size: int,
        workdir_inodes: int,
        shm_size: int | None,
        rlimits: Sequence[tuple[int, int]],
        nproc: int | None,
        seccomp_program: bytes | None,
        host_env: Mapping[str, str] | None,
        on_dispose: Callable[[Sandbox], None] | None,
        launcher: str,
    ) -> None:
        self._root = root
        self._on_dispose = on_dispose
        #: The factory of the runs' cgroups.
        self.cgroups = cgroups
        self._users = users
        self._covers = covers
        self._workdir_size = workdir_size
        self._workdir_inodes = workdir_inodes
        self._shm_size = shm_size
        self._rlimits = tuple(rlimits)
        self._nproc = nproc
        self._seccomp = seccomp_program
        self._host_env = dict(host_env) if host_env is not None else None
        self._launcher = launcher
        # Orphans of killed sandboxes that did not die when waited for (see dispose).
        self._stuck: frozenset[int] = frozenset()

    def make(self, *, warm: bool = False, session: bool = False) -> Sandbox:
        """Make a sandbox: working directory, cgroups, and the process waiting in them.

        ``warm``: a sandbox for the agent, in a cgroup made in the background (see
        :meth:`.pool.SandboxPool.start_warming`), the launcher given a request pipe.
        ``session``: given a request pipe and a status pipe, for a session's agent (or a plain
        run: its launcher closes them).

        Raises:
            OSError: any part could not be made (what was made is removed again).
        """
        user = self._users.take()
        cgroup = None
        try:
            workdir = Workdir.create(
                self._root,
                self._workdir_size,
                self._workdir_inodes,
                owner=user,
                shm_size=self._shm_size,
            )
        except BaseException:
            self._users.give_back(user)
            raise
        try:
            cgroup = self.cgroups.create(background=warm)
            spec = LaunchSpec(
                cgroup_procs=cgroup.procs_files if cgroup is not None else (),
                rlimits=self._rlimits,
                user=user,
                covers=self._covers,
                cwd="/" if self._host_env is None else str(workdir.path),
                env=self._environment(workdir),
                workdir=(str(workdir.path), *workdir.launcher_mount)
                if workdir.launcher_mount
                else None,
                shm=(str(workdir.shm), self._shm_size, SHM_INODES)
                if workdir.launcher_mount and workdir.shm is not None and self._shm_size
                else None,
                nproc=self._nproc,
                idle=cgroup is not None and cgroup.starts_idle,
                launcher=self._launcher,
            )
            seccomp_fd = seccomp.program_fd(self._seccomp) if self._seccomp is not None else None
            try:
                process = JailedProcess.spawn(
                    spec, cgroup=cgroup, seccomp_fd=seccomp_fd, warm=warm, session=session
                )
            finally:
                if seccomp_fd is not None:
                    os.close(seccomp_fd)
        except BaseException:
            if cgroup is not None:
                cgroup.kill()
                cgroup.remove()
            workdir.remove()
            self._users.give_back(user)
            raise
        return Sandbox(workdir, cgroup, process, user, warm)

    async def make_in_thread(self, *, warm: bool = False, session: bool = False) -> Sandbox:
        """:meth:`make` in a worker thread: milliseconds of system calls (directories, mounts,
        cgroups, a spawn) the event loop need not wait for. A sandbox made for a task that was
        cancelled meanwhile is killed.

        Raises:
            OSError: as :meth:`make`.
        """
        made = asyncio.get_running_loop().run_in_executor(
            None, functools.partial(self.make, warm=warm, session=session)
        )
        try:
            return await asyncio.shield(made)
        except asyncio.CancelledError:
            made.add_done_callback(_kill_made)
            raise

    async def dispose(self, sandbox: Sandbox) -> None:
        """Kill what is left of a run and remove its sandbox, each step whatever the others did."""
        try:
            await sandbox.process.aclose()
        except Exception:
            log.exception("could not reap the sandbox process %d", sandbox.process.pid)
        emptied = True
        if sandbox.cgroup is not None:
            try:
                emptied = await _remove_cgroup(sandbox.cgroup)
            except OSError:
                log.exception("could not remove the cgroup %s", sandbox.cgroup.dirs)
                emptied = False
        # Its init, inherited if the outer bwrap died first (the runs' own processes are never
        # touched: each is reaped by its JailedProcess). One that does not die keeps this uid
        # out of use, and is not waited for again: it would hold up every later disposal.
        running = await await_orphans("bwrap", _ORPHANS_WITHIN, besides=self._stuck)
        if running - self._stuck:
            log.error(
                "killed sandboxes' processes %s still run %s s on; not waited for again",
                sorted(running - self._stuck),
                _ORPHANS_WITHIN,
            )
            emptied = False
        self._stuck = running
        try:
            # Off the loop: code may have left a deep tree to repair and remove.
            await asyncio.to_thread(sandbox.workdir.remove)
        except OSError:
            log.exception("could not remove the working directory %s", sandbox.workdir.path)
        if self._on_dispose is not None:
            try:
                await asyncio.to_thread(self._on_dispose, sandbox)
            except OSError:
                log.exception("could not clean up after the sandbox %s", sandbox.workdir.path)
        # Its processes are gone (reaped, and the cgroup emptied): the uid may serve again.
        # A cgroup still busy keeps its uid out of use, so no two runs ever share one.
        if emptied:
            self._users.give_back(sandbox.user)

    def _environment(self, workdir: Workdir) -> dict[str, str]:
        """The process's environment: empty under bwrap, else with the host paths of the run."""
        if self._host_env is None:
            return {}
        return {**self._host_env, **home_environment(str(workdir.path))}


async def _remove_cgroup(cgroup: RunCgroup) -> bool:
    """Remove a run's cgroup; processes can take a few ms to leave it after they died (EBUSY).

    Returns whether it is gone.
    """
    for _ in range(400):
        cgroup.kill()
        if cgroup.remove():
            return True
        await asyncio.sleep(0.005)
    log.error("cgroup %s still busy after 2 s; left in place", cgroup.dirs)
    return False


def _kill_made(made: asyncio.Future[Sandbox]) -> None:
    if not made.cancelled() and made.exception() is None:
        made.result().process.kill()
