"""The syscall filter of every run, in the spirit of container runtimes' default profiles.

Everything is allowed except what lets code attack the kernel or escape the namespaces: tracing
other processes, mounting, new namespaces, kernel keyrings, BPF, perf, userfaultfd, io_uring,
module loading and the like answer EPERM. ``clone3`` answers ENOSYS, so that libc falls back to
``clone``, whose namespace flags the filter can inspect (EPERM there would break threads).
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


def unavailable_reason() -> str | None:
    """Why no filter can be built here, or ``None`` when it can."""
    return _IMPORT_ERROR


def compile_filter() -> bytes:
    """The BPF program, ready for ``bwrap --seccomp``.

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
    for request in (_TIOCSTI, _TIOCLINUX):
        program.add_rule(deny, "ioctl", pyseccomp.Arg(1, pyseccomp.MASKED_EQ, 0xFFFFFFFF, request))
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


def program_fd(program: bytes) -> int:
    """A new close-on-exec memfd holding ``program``, its offset at the start."""
    fd = os.memfd_create("seccomp", os.MFD_CLOEXEC)
    os.write(fd, program)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
