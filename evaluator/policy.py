"""The sandbox policy, as data: what a run sees, what it is denied, and the bwrap line saying it.

Every run's bwrap command line is built from the declarations below, in this order (bwrap
applies its options in order, and the order matters: ``--size`` before the ``--tmpfs`` it sizes,
the ``--remount-ro`` of ``/`` and ``/dev`` after every mount point is made):

======================  =======================================================================
identity                the sandbox user (:data:`SANDBOX_UID`, "nobody"), no capability, no
                        nested user namespace (:data:`IDENTITY`)
namespaces              pid, net (only a downed ``lo``), ipc, uts (its own host name), cgroup
                        where possible; the tree dies with the service (:data:`NAMESPACES`)
environment             cleared, then exactly :attr:`SandboxView.env` and a run's own
read-only binds         the interpreter, its libraries (:attr:`SandboxView.readonly_paths`)
/proc                   fresh, in the pid namespace; :data:`MASKED_PROC_FILES` covered by an empty
                        file; ``/proc/sys`` an empty read-only directory
/dev                    a tmpfs holding :data:`DEVICES` and the standard stream links, read-only
/dev/shm                a ``noexec`` tmpfs of the run's (or bwrap's own, sized)
/home                   the run's working directory, its only writable place
seccomp                 the filter of :mod:`.seccomp`, from :data:`SECCOMP_FD`
======================  =======================================================================
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DEVICES", "MASKED_PROC_FILES", "SANDBOX_UID", "SECCOMP_FD", "SandboxView"]

# The user inside the sandbox: nobody, like Snekbox. On the host it is the run's own uid.
SANDBOX_UID = 65534
#: Where bwrap finds the seccomp program (the launcher's fd 4).
SECCOMP_FD = 4
#: Who the code is. The user namespace must be explicit: as root, bwrap would otherwise run the
#: code as the host's root with all capabilities.
IDENTITY = (
    "--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID),
    "--disable-userns", "--cap-drop", "ALL",
)  # fmt: skip
#: What the code shares with nothing: the host name is set apart (``--hostname`` follows).
NAMESPACES = ("--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts")
#: How the tree ends and what it inherits: with the service, in a session of its own, with no
#: environment but the one given.
LIFETIME = ("--unshare-cgroup-try", "--die-with-parent", "--new-session", "--clearenv")
#: The device nodes of /dev inside. bwrap's own --dev would mount a devpts, which makes it map
#: the sandbox user to uid 0 of an intermediate user namespace (seen in /proc/self/uid_map).
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
#: Host facts a run has no use for, covered by an empty file.
MASKED_PROC_FILES = ("/proc/cmdline",)
#: The standard streams' names in /dev, and /dev/fd.
_STREAM_LINKS = (
    ("/proc/self/fd/0", "/dev/stdin"),
    ("/proc/self/fd/1", "/dev/stdout"),
    ("/proc/self/fd/2", "/dev/stderr"),
    ("/proc/self/fd", "/dev/fd"),
)
#: No sysctl is writable, not even those of the run's own namespaces (ns_last_pid is 0666):
#: /proc/sys is an empty, read-only directory.
_PROC_SYS = ("--tmpfs", "/proc/sys", "--remount-ro", "/proc/sys")
#: Last, after every mount point is created: the root and /dev become read-only.
_READ_ONLY = ("--remount-ro", "/", "--remount-ro", "/dev")


@dataclass(frozen=True)
class SandboxView:
    """What the code sees: the fixed part of every bwrap command line.

    Args:
        bwrap: Absolute path of the bwrap binary.
        readonly_paths: Host paths bound read-only at the same place.
        symlinks: ``(target, link)`` pairs, e.g. ``("usr/lib", "/lib")``.
        env: The whole environment of the code.
        shm_size: Bytes of ``/dev/shm``.
        hostname: The host name inside: never the host's.
        home: The working directory inside (``/home``, unless the interpreter lies there).
    """

    bwrap: str
    readonly_paths: tuple[str, ...]
    symlinks: tuple[tuple[str, str], ...]
    env: tuple[tuple[str, str], ...]
    shm_size: int
    hostname: str = "sandbox"
    home: str = "/home"

    def argv(
        self,
        command: Sequence[str],
        *,
        workdir: Path,
        seccomp: bool,
        readonly_files: Sequence[tuple[str, str]] = (),
        empty_file: str | None = None,
        env: Sequence[tuple[str, str]] = (),
        shm: Path | None = None,
    ) -> list[str]:
        """The complete command line running ``command`` in ``workdir`` (:attr:`home` inside).

        ``readonly_files`` are ``(host path, sandbox path)`` pairs bound read-only;
        ``empty_file``, an empty host file, covers the ``/proc`` files that tell of the host;
        ``env`` is added to the environment of every run; ``shm``, a ``noexec`` tmpfs of
        :attr:`shm_size` bytes made for the run, is bound as ``/dev/shm`` (``None``: bwrap's own
        tmpfs, where a dropped binary can run).
        """
        argv = [self.bwrap, *IDENTITY, *NAMESPACES, "--hostname", self.hostname, *LIFETIME]
        for name, value in (*self.env, *env):
            argv += ["--setenv", name, value]
        for path in self.readonly_paths:
            argv += ["--ro-bind", path, path]
        for target, link in self.symlinks:
            argv += ["--symlink", target, link]
        argv += ["--proc", "/proc", "--tmpfs", "/dev"]
        for device in DEVICES:
            argv += ["--dev-bind", device, device]
        for target, link in _STREAM_LINKS:
            argv += ["--symlink", target, link]
        argv += _PROC_SYS
        if empty_file is not None:
            for path in MASKED_PROC_FILES:
                argv += ["--ro-bind", empty_file, path]
        if shm is not None:
            # A bind keeps the mount's noexec (bwrap adds flags to a bind, never removes any).
            argv += ["--bind", str(shm), "/dev/shm"]
        else:
            argv += ["--size", str(self.shm_size), "--tmpfs", "/dev/shm"]
        argv += ["--bind", str(workdir), self.home]
        for host_path, sandbox_path in readonly_files:
            argv += ["--ro-bind", host_path, sandbox_path]
        if seccomp:
            argv += ["--seccomp", str(SECCOMP_FD)]
        argv += [*_READ_ONLY, "--chdir", self.home, "--", *command]
        return argv
