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
    cgroup) not among them, and the room it leaves over the uid's tasks (:func:`shared_nproc`).

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
        # sandboxes kept between runs (ready ones, live sessions), over what the uid runs when
        # each sandbox is made (see :class:`SharedNproc`), not at start: the user's other
        # processes come and go, and a count taken once would soon refuse every new sandbox.
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
            f"RLIMIT_NPROC bounds all runs together at {nproc} over that uid's tasks when "
            "each sandbox is made (it counts every process and thread of that uid, in any "
            "container)"
        )
    if nproc is not None and users.dropping:
        return cgroup + f" and RLIMIT_NPROC {nproc} of the run's own uid"
    return cgroup


class SharedNproc:
    """The RLIMIT_NPROC of sandboxes whose runs share the service's uid (no pids cgroup).

    The kernel counts the uid's tasks everywhere, the user's own included, against the limit
    the launcher holds when it enters its user namespace: one bound for all runs together.
    A sandbox gets ``room`` over the uid's tasks counted when it is made (at most once a second:
    a count reads all of ``/proc``); one made ahead that the count has since outgrown, so
    that it has less than ``need`` tasks left, is :meth:`spent`, and is made again.
    """

    def __init__(self, room: int, need: int, uid: int) -> None:
        self.room = room
        self.need = need
        self._uid = uid
        self._counted = (-math.inf, 0)

    def limit(self) -> int:
        """The limit of a sandbox made now."""
        return self._count() + self.room

    def spent(self, limit: int) -> bool:
        """Whether a sandbox made with ``limit`` lacks room for a run now."""
        return limit - self._count() < self.need

    def _count(self) -> int:
        now = time.monotonic()
        if now - self._counted[0] >= _RECOUNT_AFTER:
            self._counted = (now, _tasks_of(self._uid))
        return self._counted[1]


def _tasks_of(uid: int) -> int:
    """Processes and threads of ``uid`` in sight (RLIMIT_NPROC counts both)."""
    count = 0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if entry.stat().st_uid == uid:
                    count += len(os.listdir(entry / "task"))
    return count
