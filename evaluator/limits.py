"""The limits of a run on this machine: rlimits where cgroups are missing, and what is enforced.

Decided once, at start-up, from the configuration and what the machine offers (cgroups, tmpfs
mounts, seccomp); the service logs the result and reports it through ``limits_in_force()``.
"""

from __future__ import annotations

import contextlib
import math
import os
import resource
import time
from pathlib import Path

from .cgroups import Cgroups
from .config import EvaluatorConfig, MiB
from .models import Limit
from .users import RunUsers

__all__ = ["ADDRESS_SPACE_HEADROOM", "SharedNproc", "describe", "rlimits", "session_bytes"]

#: Headroom of the address-space rlimit over the memory limit, used only without a memory cgroup:
#: libraries reserve far more virtual memory than they use (OpenBLAS fails under 256 MiB).
ADDRESS_SPACE_HEADROOM = 512 * MiB
#: Tasks an idle sandbox holds (bubblewrap's two, the interpreter's three threads: measured 4-5),
#: with room for one retiring beside it: counted in the shared RLIMIT_NPROC below.
IDLE_SANDBOX_TASKS = 8
#: Seconds a count of the tasks of the runs' shared uid is used for (see :class:`SharedNproc`).
_RECOUNT_AFTER = 1.0
#: Ancestors looked through to tell a sandbox's task from another's (bwrap nests a few).
_MOST_DEPTH = 16


def session_bytes(config: EvaluatorConfig, cgroups: Cgroups) -> int:
    """The memory one live session is counted at, for the default cap on them
    (:meth:`.EvaluatorConfig.sessions_within`): what is enforced on it.

    A memory cgroup bounds all of a session's memory, tmpfs pages included: ``memory_limit``.
    Without one, only the address-space rlimit of each process holds, and it misses the
    working directory and ``/dev/shm`` (tmpfs): one interpreter's address space plus both
    sizes. A session whose processes each fill their address space can hold more (up to the
    rlimit times ``pids_limit``, which would leave room for a single session): that is left to
    the memory watchdog (:mod:`.watchdog`), and the cap bounds the common case, one interpreter
    holding all it may.
    """
    if cgroups.memory is not None:
        return config.memory_limit * MiB
    address_space = config.memory_limit * MiB + ADDRESS_SPACE_HEADROOM
    return address_space + (config.workdir_size + config.shm_size) * MiB


def rlimits(
    config: EvaluatorConfig, cgroups: Cgroups, *, mounted: bool, own_uid: bool
) -> tuple[list[tuple[int, int]], int | None]:
    """The ``(resource, limit)`` pairs of every run, and its RLIMIT_NPROC, if any: among the
    pairs when each run has a uid of its own; else (runs sharing the service's uid, no pids
    cgroup) not among them, and the room it leaves over the uid's tasks (:class:`SharedNproc`).

    Args:
        mounted: Whether each working directory is a size-bounded tmpfs.
        own_uid: Whether each run has a host uid of its own (see :mod:`.users`).
    """
    pairs = [(resource.RLIMIT_CORE, 0)]
    nproc = None
    if cgroups.memory is None:
        pairs.append((resource.RLIMIT_AS, config.memory_limit * MiB + ADDRESS_SPACE_HEADROOM))
    if own_uid:
        # The uid is the run's alone, so the per-user count is exactly the run's processes
        # (and threads), as in the pids cgroup.
        nproc = config.pids_limit
        pairs.append((resource.RLIMIT_NPROC, nproc))
    elif cgroups.pids is None:
        # One count for every task (process or thread) of the uid: the service's, every
        # sandbox's, and those of anything else running as that uid, other containers of the same
        # image included (the kernel counts per user, not per container). No bound per run can be
        # had from it, only one for all: room for every slot's run at its limit and for the
        # sandboxes kept between runs (ready ones, live sessions), over the uid's tasks outside
        # this service's sandboxes when each sandbox is made (see :class:`SharedNproc`), not at
        # start: the user's other processes come and go, and a count taken once would soon
        # refuse every new sandbox.
        idle = (config.concurrency if config.prewarm else 0) + config.session_limit
        nproc = config.concurrency * config.pids_limit + idle * IDLE_SANDBOX_TASKS
    if not mounted:
        pairs.append((resource.RLIMIT_FSIZE, config.workdir_size * MiB))
    return pairs, nproc


def describe(
    config: EvaluatorConfig,
    cgroups: Cgroups,
    *,
    mounted: bool,
    nproc: int | None,
    users: RunUsers,
    seccomp_reason: str | None,
    home: str,
) -> tuple[Limit, ...]:
    """Which limits are really enforced, and how.

    Args:
        mounted: Whether each working directory is a size-bounded tmpfs.
        nproc: The RLIMIT_NPROC of every run, if any.
        users: The host users of the runs.
        seccomp_reason: Why there is no seccomp filter; ``None`` when there is one.
        home: The working directory inside the sandbox.
    """
    sandboxed = not config.unsandboxed
    size, inodes = config.workdir_size, config.workdir_inodes
    memory = cgroups.memory or (
        f"no memory cgroup; address-space rlimit of "
        f"{(config.memory_limit * MiB + ADDRESS_SPACE_HEADROOM) // MiB} MiB "
        "(code gets MemoryError, not 137; tmpfs and /dev/shm are not counted)"
    )
    per_run = cgroups.pids is not None or (nproc is not None and users.dropping)
    pids = _processes(cgroups.pids, nproc, users)
    cpu = cgroups.cpu
    return (
        Limit("time", True, f"{config.time_limit:g} s, then the whole tree is killed (137)"),
        Limit("memory", True, f"{config.memory_limit} MiB: {memory}"),
        Limit(
            "processes",
            per_run,
            f"{config.pids_limit}: {pids}" if per_run else f"{config.pids_limit} asked, {pids}",
        ),
        Limit(
            "cpu", cpu is not None,
            f"{config.cpu_limit:g} CPUs, an equal share: {cpu}"
            if cpu is not None
            else "no cpu cgroup: a run may take CPU time from the others",
        ),
        Limit("output", True, f"{config.output_limit} bytes, then SIGTERM (143)"),
        Limit(
            "working directory",
            mounted,
            f"{size} MiB tmpfs with {inodes} inodes"
            if mounted
            else f"plain directory, size not bounded (no mount privilege); files returned "
            f"are bounded to {size} MiB in total",
        ),
        Limit("output files", True, f"at most {config.max_files}"),
        Limit(
            "network",
            sandboxed,
            "none: an empty network namespace" if sandboxed else "the host's",
        ),
        Limit(
            "file system",
            sandboxed,
            "read-only binds of the interpreter and system libraries; "
            f"writable: {home}, /dev/shm"
            + (" (noexec: no dropped binary runs)" if mounted else "")
            if sandboxed
            else "the host's",
        ),
        Limit("user", users.dropping, users.describe()),
        Limit(
            "syscalls",
            seccomp_reason is None,
            "seccomp filter (ptrace, mount, namespaces, bpf, keyctl, ... denied; sockets: "
            "AF_UNIX, AF_INET, AF_INET6 and AF_NETLINK route only)"
            if seccomp_reason is None
            else f"no seccomp filter: {seccomp_reason}",
        ),
    )  # fmt: skip


def _processes(cgroup: str | None, nproc: int | None, users: RunUsers) -> str:
    """How a run's processes are bounded: its pids cgroup, its uid's RLIMIT_NPROC, or neither."""
    if cgroup is None:
        if nproc is None:
            return "no pids cgroup, and RLIMIT_NPROC does not apply to root"
        if users.dropping:
            return f"no pids cgroup; RLIMIT_NPROC {nproc} of the run's own uid"
        return (
            f"not per run: no pids cgroup, and every run has uid {os.getuid()}, whose "
            f"RLIMIT_NPROC bounds all runs together at {nproc} over that uid's tasks outside "
            "the sandboxes (it counts every process and thread of that uid, in any container)"
        )
    if nproc is not None and users.dropping:
        return cgroup + f" and RLIMIT_NPROC {nproc} of the run's own uid"
    return cgroup


class SharedNproc:
    """The RLIMIT_NPROC of sandboxes whose runs share the service's uid (no pids cgroup).

    The kernel counts every task of the uid, the user's own and every sandbox's, against the
    limit the launcher holds when it enters its user namespace: one bound for all runs together.
    Each sandbox gets ``room`` (for this service's runs and kept sandboxes, together) over the
    uid's other tasks (the user's, other services'), counted when it is made (at most once a
    second: a count reads all of ``/proc``), within the service's own hard limit. One made
    ahead is :meth:`spent` once the uid's tasks, all counted, leave it less than ``need``
    (enough to start), and is made again: the user's other processes come and go.
    """

    def __init__(self, room: int, need: int, uid: int) -> None:
        self.room = room
        self.need = need
        self._uid = uid
        self._counted = (-math.inf, 0, 0)
        hard = resource.getrlimit(resource.RLIMIT_NPROC)[1]
        self._hard = None if hard == resource.RLIM_INFINITY else hard

    def limit(self) -> int:
        """The limit of a sandbox made now."""
        others, _ = self._count()
        limit = others + self.room
        return limit if self._hard is None else min(limit, self._hard)

    def spent(self, limit: int) -> bool:
        """Whether a sandbox made with ``limit`` lacks room to start now."""
        _, total = self._count()
        return limit - total < self.need

    def _count(self) -> tuple[int, int]:
        now = time.monotonic()
        if now - self._counted[0] >= _RECOUNT_AFTER:
            self._counted = (now, *_tasks_of(self._uid))
        return self._counted[1], self._counted[2]


def _tasks_of(uid: int) -> tuple[int, int]:
    """Processes and threads of ``uid`` in sight (RLIMIT_NPROC counts both): those not in this
    service's sandboxes (its descendants in other user namespaces), and all of them."""
    me, own = os.getpid(), os.readlink("/proc/self/ns/user")
    tasks: dict[int, tuple[int, int, bool]] = {}  # pid: (parent, tasks, in a sandbox's namespace)
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                if entry.stat().st_uid == uid:
                    stat = (entry / "stat").read_text()
                    parent = int(stat[stat.rindex(")") + 2 :].split()[1])
                    inside = os.readlink(entry / "ns" / "user") != own
                    tasks[int(entry.name)] = (parent, len(os.listdir(entry / "task")), inside)
    total = sum(count for _, count, _ in tasks.values())
    ours = 0
    for parent, count, inside in tasks.values():
        for _ in range(_MOST_DEPTH):  # a pid reused during the scan cannot make it loop
            if not inside or parent == me or parent not in tasks:
                break
            parent = tasks[parent][0]
        ours += count if inside and parent == me else 0
    return total - ours, total
