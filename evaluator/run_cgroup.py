"""One run's cgroup: its CPU weight, its OOM count, and a sure way to kill its processes.

Made by :meth:`.cgroups.Cgroups.create` (one directory per v1 hierarchy, or a single v2 one);
removed once the run's processes are gone.

A cgroup's weight counts only against its siblings: a warm sandbox importing at the least
weight still took a CPU from the service, the gateway and their clients, which live outside
the sandboxes' parent, whenever they woke. Its launcher therefore moves itself to
``SCHED_IDLE`` once it has joined its cgroups (:attr:`RunCgroup.starts_idle`; what it starts
inherits the policy): the kernel preempts a ``SCHED_IDLE`` thread as soon as any other thread
wakes on its CPU. (Its share of a busy CPU is still set by the cgroups' weights.)
:meth:`RunCgroup.foreground` puts every thread back under ``SCHED_OTHER`` before the run's
code arrives. That takes ``CAP_SYS_NICE`` in the initial user namespace
(:func:`.procfs.may_leave_idle`); without it a run would keep ``SCHED_IDLE``, so sandboxes
are made as before. Within the sandboxes' parent, a ``SCHED_IDLE`` thread gets next to nothing
beside a run, so while a sandbox warms the pool calls :meth:`RunCgroup.leave_idle` every
:data:`IDLE_AT_MOST` seconds from its release (:meth:`.warming.Tier.bound_idle`): its imports
then go on at the least weight, as they did before.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
from pathlib import Path

from .procfs import may_leave_idle

__all__ = ["IDLE_AT_MOST", "LEAST_WEIGHT", "RunCgroup"]

log = logging.getLogger(__name__)

#: The least CPU weight of a cgroup (v1 cpu.shares, v2 cpu.weight).
LEAST_WEIGHT = {"cpu.shares": "2", "cpu.weight": "1"}
#: Seconds a sandbox made ahead spends under ``SCHED_IDLE`` at most (its imports take tenths).
IDLE_AT_MOST = 2.0
#: Readings of a cgroup's threads at most, when threads keep starting (a run that forks).
_PASSES = 50
#: A reset was refused, though :func:`.procfs.may_leave_idle` allowed it.
_refused = False


class RunCgroup:
    """The cgroup directories of one run (one per v1 hierarchy, or a single v2 one).

    ``oom_counter``: the file of the memory cgroup that counts OOM kills (v2 ``memory.events``,
    v1 ``memory.oom_control``), ``None`` when no cgroup limits the run's memory.
    """

    def __init__(
        self,
        dirs: tuple[Path, ...],
        kill_file: bool,
        oom_counter: Path | None = None,
        weight: tuple[Path, str] | None = None,
        *,
        background: bool = False,
    ) -> None:
        self.dirs = dirs
        self._kill_file = kill_file
        self._oom_counter = oom_counter
        #: The CPU weight file and the weight of every run (``None``: no cpu controller).
        self._weight = weight
        self._background = background and weight is not None
        #: Its processes run under ``SCHED_IDLE`` until :meth:`foreground`.
        self.starts_idle = self._background and may_leave_idle() and not _refused

    @property
    def weighs_cpu(self) -> bool:
        """Whether a cpu controller weighs it: :meth:`background` then lowers its share."""
        return self._weight is not None

    def foreground(self, *, settled: bool = True) -> None:
        """Give a cgroup made or put in the background the CPU weight of every run, its threads
        out of ``SCHED_IDLE``; ``settled=False``: its launcher may not have entered it yet (a
        sandbox taken as it warms), so the next call takes them out again."""
        if self._weight is not None and self._background:
            file, value = self._weight
            file.write_text(value)
            self._background = False
        self.leave_idle()
        if settled:
            self.starts_idle = False

    def leave_idle(self) -> None:
        """Put every thread in the cgroup back under ``SCHED_OTHER`` if it started under
        ``SCHED_IDLE`` (a cgroup removed meanwhile is left alone)."""
        if self.starts_idle and self._weight is not None:
            file, _ = self._weight
            # Every thread: v1 lists them in tasks, v2 (whose weight is cpu.weight) in
            # cgroup.threads.
            threads = "tasks" if file.name == "cpu.shares" else "cgroup.threads"
            _leave_idle(file.parent / threads)

    def background(self) -> None:
        """Give it the least CPU weight: its processes then get only CPU time that no other
        run wants (a live session between cells), until :meth:`foreground`."""
        if self._weight is not None and not self._background:
            file, _ = self._weight
            file.write_text(LEAST_WEIGHT[file.name])
            self._background = True

    @property
    def procs_files(self) -> tuple[str, ...]:
        """Files the run's first process writes its pid into, before it starts anything."""
        return tuple(str(d / "cgroup.procs") for d in self.dirs)

    def pids(self) -> set[int]:
        found: set[int] = set()
        for d in self.dirs:
            try:
                found.update(int(line) for line in (d / "cgroup.procs").read_text().split())
            except FileNotFoundError:
                continue
        return found

    def oom_kills(self) -> int | None:
        """How many of the run's processes the kernel's OOM killer ended, its memory limit
        reached; ``None`` when that is not known (no memory cgroup, a kernel older than 4.13)."""
        if self._oom_counter is None:
            return None
        try:
            lines = self._oom_counter.read_text().splitlines()
        except OSError:
            return None
        for line in lines:
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return None

    def kill(self) -> None:
        """SIGKILL every process in the cgroup (a fork racing with this is caught next time)."""
        if self._kill_file:
            try:
                (self.dirs[0] / "cgroup.kill").write_text("1")
                return
            except OSError:
                pass
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def remove(self) -> bool:
        """Remove the directories; False while processes are still leaving (EBUSY)."""
        done = True
        for d in self.dirs:
            try:
                d.rmdir()
            except FileNotFoundError:
                continue
            except OSError as exc:
                if exc.errno != errno.EBUSY:
                    raise
                done = False
        return done


def _leave_idle(threads: Path) -> None:
    """See :meth:`RunCgroup.leave_idle`. A policy is a thread's (a pool of threads started at
    import, as OpenBLAS's, has its own), and a thread inherits its creator's: the cgroup's list
    is read again until it names no thread not yet put back, so one started meanwhile by a
    thread still idle is found too."""
    global _refused
    done: set[str] = set()
    for _ in range(_PASSES):
        try:
            tids = set(threads.read_text().split())
        except FileNotFoundError:  # removed: its processes are gone
            return
        if not tids - done:
            return
        for tid in tids - done:
            try:
                os.sched_setscheduler(int(tid), os.SCHED_OTHER, os.sched_param(0))
            except ProcessLookupError:
                continue
            except PermissionError:  # a security module, say: none is made idle from now on
                _refused = True
                log.error("could not take thread %s of %s out of SCHED_IDLE", tid, threads.parent)
        done |= tids
