"""The limits of a run on this machine: rlimits where cgroups are missing, and what is enforced.

Decided once, at start-up, from the configuration and what the machine offers (cgroups, tmpfs
mounts, seccomp); the service logs the result and reports it through ``limits_in_force()``.
"""

from __future__ import annotations

import os
import re
import resource

from .cgroups import Cgroups
from .config import EvaluatorConfig, MiB
from .models import Limit
from .users import RunUsers

__all__ = [
    "ADDRESS_SPACE_HEADROOM",
    "describe",
    "kernel_counts_nproc_per_namespace",
    "rlimits",
    "session_bytes",
    "users_soft_nproc",
]

#: Headroom of the address-space rlimit over the memory limit, used only without a memory cgroup:
#: libraries reserve far more virtual memory than they use (OpenBLAS fails under 256 MiB).
ADDRESS_SPACE_HEADROOM = 512 * MiB
#: The first kernel that counts RLIMIT_NPROC per user namespace (``kernel/ucount.c``): a limit
#: set inside a namespace then bounds the tasks in it (and in those nested in it) alone.
NPROC_PER_NAMESPACE = (5, 14)


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
    config: EvaluatorConfig, cgroups: Cgroups, *, mounted: bool, own_uid: bool, own_namespace: bool
) -> tuple[list[tuple[int, int]], int | None]:
    """The ``(resource, limit)`` pairs of every run, and its RLIMIT_NPROC, if any: among the
    pairs when each run has a uid of its own; else (runs sharing the service's uid, no pids
    cgroup) not among them: set by the launcher in its own user namespace (see
    :func:`kernel_counts_nproc_per_namespace`), where it bounds the run alone.

    Args:
        mounted: Whether each working directory is a size-bounded tmpfs.
        own_uid: Whether each run has a host uid of its own (see :mod:`.users`).
        own_namespace: Whether each run's launcher enters a user namespace of its own.
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
    elif cgroups.pids is None and own_namespace and kernel_counts_nproc_per_namespace():
        # Set before the namespace, it would count every task of the uid (the user's own, every
        # sandbox's, other containers of the same image): one bound for all runs, which the
        # user's other processes or one run's fork bomb could use up for the others. Within the
        # service's hard limit, which only a capability of the host's namespace may raise.
        hard = resource.getrlimit(resource.RLIMIT_NPROC)[1]
        unlimited = hard == resource.RLIM_INFINITY
        nproc = config.pids_limit if unlimited else min(config.pids_limit, hard)
    if not mounted:
        pairs.append((resource.RLIMIT_FSIZE, config.workdir_size * MiB))
    return pairs, nproc


def kernel_counts_nproc_per_namespace(release: str | None = None) -> bool:
    """Whether this kernel (or ``release``) checks RLIMIT_NPROC against a uid's tasks in each
    user namespace: then a launcher that sets it in a namespace of its own bounds its run's
    tasks (those of bubblewrap's namespace nested in it included), not all of the uid's."""
    numbers = re.match(r"(\d+)\.(\d+)", release or os.uname().release)
    return numbers is not None and (int(numbers[1]), int(numbers[2])) >= NPROC_PER_NAMESPACE


def users_soft_nproc(users: RunUsers) -> int | None:
    """The soft RLIMIT_NPROC that bounds all the runs' tasks together with the service's own:
    that of the service's uid where runs share it (not root's, which it does not bind)."""
    soft = resource.getrlimit(resource.RLIMIT_NPROC)[0]
    shared = not users.dropping and os.getuid() != 0
    return soft if shared and soft != resource.RLIM_INFINITY else None


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
        nproc: The RLIMIT_NPROC of every run, if any (of its own uid or of its own namespace).
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
    per_run = cgroups.pids is not None or nproc is not None
    pids = _processes(cgroups.pids, nproc, users)
    cpu = cgroups.cpu
    return (
        Limit("time", True, f"{config.time_limit:g} s, then the whole tree is killed (137)"),
        Limit("memory", True, f"{config.memory_limit} MiB: {memory}"),
        Limit(
            "processes",
            per_run,
            f"{config.pids_limit}: {pids}" if per_run else f"{config.pids_limit} asked, {pids}",
            _most_processes(config, nproc, users) if per_run else None,
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


def _most_processes(config: EvaluatorConfig, nproc: int | None, users: RunUsers) -> int:
    """The most processes and threads a run may have: its bound, within the soft limit of the
    uid it shares with the service, if any (which the service's own tasks count against too)."""
    most = config.pids_limit if nproc is None else nproc
    soft = users_soft_nproc(users)
    return most if soft is None else min(most, soft)


def _processes(cgroup: str | None, nproc: int | None, users: RunUsers) -> str:
    """How a run's processes are bounded: its pids cgroup, an RLIMIT_NPROC, or neither."""
    own = "the run's own uid" if users.dropping else "the run's own user namespace"
    if cgroup is None:
        if nproc is not None:
            return f"no pids cgroup; RLIMIT_NPROC {nproc} of {own}"
        if os.getuid() == 0:
            return "no pids cgroup, and RLIMIT_NPROC does not apply to root"
        return (
            f"not bounded per run: no pids cgroup, and every run has uid {os.getuid()}, whose "
            "RLIMIT_NPROC counts all of that user's processes together (one per run needs its "
            "launcher in a user namespace of its own, on Linux "
            f"{'.'.join(map(str, NPROC_PER_NAMESPACE))} or later: this is {os.uname().release})"
        )
    if nproc is not None:
        return cgroup + f" and RLIMIT_NPROC {nproc} of {own}"
    return cgroup
