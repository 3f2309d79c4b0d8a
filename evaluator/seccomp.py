"""The syscall filter of every run, in the spirit of container runtimes' default profiles.

Everything is allowed except what lets code attack the kernel or escape the namespaces: tracing
other processes, mounting, new namespaces, kernel keyrings, BPF, perf, userfaultfd, io_uring,
module loading and the like answer EPERM. ``clone3`` answers ENOSYS, so that libc falls back to
``clone``, whose namespace flags the filter can inspect (EPERM there would break threads).
Sockets: only the families a run needs, ``AF_UNIX``, ``AF_INET`` and ``AF_INET6`` (the latter
two in an empty network namespace) and ``AF_NETLINK`` with ``NETLINK_ROUTE``; every other
family or netlink protocol (``NETLINK_AUDIT``, ``NETLINK_KOBJECT_UEVENT``, ``AF_PACKET``,
``AF_VSOCK``, which a network namespace does not isolate, ``AF_ALG``, ``AF_BLUETOOTH``, ...)
answers EAFNOSUPPORT, as it would on a kernel without it. When runs share the service's uid
(an unprivileged service), ``inotify_init`` answers EMFILE too: its instances are a per-user
quota that one run could otherwise take from the user's desktop and from the other runs.
``memfd_create`` answers ENOSYS, as on a kernel without it (callers fall back to files): a
memfd is the one writable file a run could otherwise execute (``/home`` and ``/dev/shm`` are
``noexec``), by ``execve`` of ``/proc/self/fd/N`` or ``execveat``, or load with ``ld.so`` even
when sealed ``MFD_NOEXEC_SEAL``. The kernel's own ``vm.memfd_noexec`` cannot be set for the
runs: it needs host root and a writable ``/proc/sys`` in their pid namespace.
The program is compiled once with libseccomp (through ``pyseccomp``) and handed to bwrap in a
fresh memfd per run: bwrap reads it from the fd's current offset.
"""

from __future__ import annotations

import errno
import logging
import os

try:
    import pyseccomp  # type: ignore[import-untyped]
except (ImportError, OSError, RuntimeError) as exc:  # RuntimeError: no libseccomp.so.2
    pyseccomp = None
    _IMPORT_ERROR: str | None = f"libseccomp is not available ({exc}); install libseccomp2"
else:
    _IMPORT_ERROR = None

__all__ = ["compile_filter", "program_fd", "unavailable_reason"]

log = logging.getLogger(__name__)

DENIED = (
    "acct", "add_key", "bpf", "clock_adjtime", "clock_settime", "create_module",
    "delete_module", "fanotify_init", "finit_module", "fsconfig", "fsmount", "fsopen", "fspick",
    "get_kernel_syms", "init_module", "io_uring_enter", "io_uring_register", "io_uring_setup",
    "ioperm", "iopl", "kcmp", "kexec_file_load", "kexec_load", "keyctl", "lookup_dcookie",
    "mount", "mount_setattr", "move_mount", "name_to_handle_at", "nfsservctl",
    "open_by_handle_at", "open_tree", "perf_event_open", "pidfd_getfd", "pivot_root",
    "process_vm_readv", "process_vm_writev", "ptrace", "query_module", "quotactl",
    "quotactl_fd", "reboot", "request_key", "setns", "settimeofday", "swapoff", "swapon",
    "syslog", "umount", "umount2", "unshare", "uselib", "userfaultfd", "ustat", "vhangup",
    "vm86", "vm86old",
)  # fmt: skip

# clone(2) flags that create namespaces (CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER,
# NEWPID, NEWNET, NEWTIME).
_NAMESPACE_FLAGS = (
    0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000, 0x80,
)  # fmt: skip

# Terminal ioctls that inject input into, or take over, the controlling terminal.
_TIOCSTI, _TIOCLINUX = 0x5412, 0x541C

#: The socket families a run may create: AF_UNIX, AF_INET, AF_INET6, and AF_NETLINK for
#: NETLINK_ROUTE only (glibc's getaddrinfo and Python's socket.if_nameindex read the network
#: namespace's own, empty, state through it).
ALLOWED_FAMILIES = (1, 2, 10, 16)
_AF_NETLINK, _NETLINK_ROUTE = 16, 0


def unavailable_reason() -> str | None:
    """Why no filter can be built here, or ``None`` when it can."""
    return _IMPORT_ERROR


def compile_filter(*, shared_user: bool = False) -> bytes:
    """The BPF program, ready for ``bwrap --seccomp``.

    Args:
        shared_user: Runs share the service's host uid (see :mod:`.users`): refuse inotify.

    Raises:
        RuntimeError: libseccomp is not available (see :func:`unavailable_reason`).
        OSError: libseccomp refused the filter.
    """
    if pyseccomp is None:
        raise RuntimeError(_IMPORT_ERROR)
    deny = pyseccomp.ERRNO(errno.EPERM)
    program = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
    for name in DENIED:
        try:
            program.add_rule(deny, name)
        except (OSError, ValueError) as exc:
            # A syscall this architecture or libseccomp version does not know cannot be called.
            log.debug("seccomp: %s not filtered: %s", name, exc)
    for flag in _NAMESPACE_FLAGS:
        program.add_rule(deny, "clone", pyseccomp.Arg(0, pyseccomp.MASKED_EQ, flag, flag))
    program.add_rule(pyseccomp.ERRNO(errno.ENOSYS), "clone3")
    program.add_rule(pyseccomp.ERRNO(errno.ENOSYS), "memfd_create")
    for request in (_TIOCSTI, _TIOCLINUX):
        program.add_rule(deny, "ioctl", pyseccomp.Arg(1, pyseccomp.MASKED_EQ, 0xFFFFFFFF, request))
    no_family = pyseccomp.ERRNO(errno.EAFNOSUPPORT)
    for call in ("socket", "socketpair"):
        # Compared on all 64 bits: a value with high bits set (which the kernel would truncate
        # to an int) is at least the first refused range, so it is refused too.
        for low, high in _refused_ranges(ALLOWED_FAMILIES):
            if high is None:
                program.add_rule(no_family, call, pyseccomp.Arg(0, pyseccomp.GE, low))
            else:
                for family in range(low, high + 1):
                    program.add_rule(no_family, call, pyseccomp.Arg(0, pyseccomp.EQ, family))
    program.add_rule(
        no_family,
        "socket",
        pyseccomp.Arg(0, pyseccomp.EQ, _AF_NETLINK),
        pyseccomp.Arg(2, pyseccomp.NE, _NETLINK_ROUTE),
    )
    if shared_user:
        for call in ("inotify_init", "inotify_init1"):
            program.add_rule(pyseccomp.ERRNO(errno.EMFILE), call)
    fd = os.memfd_create("seccomp-export", os.MFD_CLOEXEC)
    try:
        with os.fdopen(os.dup(fd), "rb") as export:
            program.export_bpf(export)
        os.lseek(fd, 0, os.SEEK_SET)
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _refused_ranges(allowed: tuple[int, ...]) -> list[tuple[int, int | None]]:
    """The closed ranges of family numbers not in ``allowed``; the last one is open-ended."""
    ranges: list[tuple[int, int | None]] = []
    low = 0
    for family in sorted(allowed):
        if family > low:
            ranges.append((low, family - 1))
        low = family + 1
    ranges.append((low, None))
    return ranges


def program_fd(program: bytes) -> int:
    """A new close-on-exec memfd holding ``program``, its offset at the start."""
    fd = os.memfd_create("seccomp", os.MFD_CLOEXEC)
    os.write(fd, program)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
