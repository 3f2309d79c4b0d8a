"""The launcher's spec, and the command line that releases it (see :mod:`._launcher`).

A run's process is started ahead of time: the service spawns the launcher, which joins the
run's cgroups (the slow part on cgroup v1: ~9 ms per ``cgroup.procs`` write), sets its rlimits,
drops to the run's host user, then blocks reading its command line from a pipe. A request only
writes the command line and closes the pipe (:func:`write_args`): the launcher execs bwrap and
the clock starts. bwrap's own ``--args FD`` cannot do this: it takes options from the fd, but
the command must already be on its real command line.
"""

from __future__ import annotations

import marshal
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from .procfs import spawn_owned

__all__ = [
    "LAUNCHER",
    "MOUNTED",
    "RELEASE",
    "RELEASE_AGENT",
    "LaunchSpec",
    "Launched",
    "start_launcher",
    "write_args",
]

#: The launcher's source; the service runs it compiled (:func:`.startup.place_launcher`).
LAUNCHER = str(Path(__file__).with_name("_launcher.py"))
#: Ends a released command line; a launcher that reads EOF without it (the run was cancelled,
#: or the service died mid-write) exits without running anything. A warm agent's run ends so
#: too (``_agent.RELEASE``).
RELEASE = b"\xffrun\xff"
#: Ends the command line of an agent: see _launcher.py, it keeps the agent's pipes.
RELEASE_AGENT = b"\xffagent\xff"
#: What the launcher writes once it has mounted the working directory (_launcher._MOUNTED).
MOUNTED = b"\x06"


@dataclass(frozen=True)
class LaunchSpec:
    """What the launcher does before it waits for the command line (see :mod:`._launcher`).

    Args:
        cgroup_procs: ``cgroup.procs`` files it writes its pid into, first of all.
        rlimits: ``(resource, limit)`` pairs set as soft and hard limits.
        user: The host ``(uid, gid)`` it drops to; ``None`` keeps the service's own.
        covers: ``(directory, paths)``: the directory, which the run's user may not traverse,
            is covered by a tmpfs holding bind mounts of only ``paths``, in a mount namespace
            of the run's own.
        cwd: Its working directory.
        env: The environment of the command (bwrap clears it for the code anyway).
        workdir: ``(path, bytes, inodes)``: a tmpfs it mounts on the working directory, in a
            user and mount namespace of its own, for a service that cannot mount (not root);
            :meth:`.JailedProcess.mounted` then says when it is there.
        shm: ``(path, bytes, inodes)``: with ``workdir``, a ``noexec`` tmpfs it mounts there
            too, which bwrap binds as ``/dev/shm``.
        nproc: With ``workdir``, the RLIMIT_NPROC it sets in its user namespace (see
            :func:`.limits.kernel_counts_nproc_per_namespace`).
        idle: Once in its cgroups, it moves itself (and so all it starts) to ``SCHED_IDLE``
            (see :mod:`.run_cgroup`).
        launcher: The launcher's file: its source, or the same compiled
            (:func:`.startup.place_launcher`).
    """

    cgroup_procs: tuple[str, ...] = ()
    rlimits: tuple[tuple[int, int], ...] = ()
    user: tuple[int, int] | None = None
    covers: tuple[tuple[str, tuple[str, ...]], ...] = ()
    cwd: str = "/"
    env: Mapping[str, str] | None = None
    workdir: tuple[str, int, int] | None = None
    shm: tuple[str, int, int] | None = None
    nproc: int | None = None
    idle: bool = False
    launcher: str = LAUNCHER

    def argv(self) -> list[str]:
        """The launcher's command line."""
        spec = {
            "cgroup_procs": list(self.cgroup_procs),
            "rlimits": [list(pair) for pair in self.rlimits],
            "uid": self.user[0] if self.user else None,
            "gid": self.user[1] if self.user else None,
            "covers": [[d, list(paths)] for d, paths in self.covers],
            "cwd": self.cwd,
            "env": dict(self.env or {}),
            "workdir": list(self.workdir) if self.workdir else None,
            "shm": list(self.shm) if self.shm else None,
            "nproc": self.nproc,
            "idle": self.idle,
        }
        # -I -S: none of the environment, no site-packages, so nothing of the service loads.
        return [sys.executable, "-I", "-S", self.launcher, marshal.dumps(spec).hex()]


class Launched(NamedTuple):
    """A launcher just started, and the service's ends of its pipes."""

    pid: int
    #: Where its command line goes (:func:`write_args`).
    args_fd: int
    #: Its merged stdout and stderr (non-blocking).
    output_fd: int
    #: A warm agent's request pipe (fd 5 inside), or ``None``.
    request_fd: int | None
    #: A session agent's status pipe (fd 6 inside, non-blocking), or ``None``.
    status_fd: int | None


def start_launcher(
    spec: LaunchSpec, *, seccomp_fd: int | None = None, warm: bool = False, session: bool = False
) -> Launched:
    """Spawn the launcher of ``spec``: it blocks reading its command line.

    Args:
        spec: What the launcher does first.
        seccomp_fd: A seccomp program, handed to the launcher as fd 4.
        warm: Hand it fd 5, the request pipe of a warm agent.
        session: And fd 6, where a session's agent says how each cell ended.
    """
    warm = warm or session
    args_r, args_w = os.pipe2(os.O_CLOEXEC)
    out_r, out_w = os.pipe2(os.O_CLOEXEC)
    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    request_r, request_w = os.pipe2(os.O_CLOEXEC) if warm else (None, None)
    status_r, status_w = os.pipe2(os.O_CLOEXEC) if session else (None, None)
    fds = [null, out_w, out_w, args_r]
    if seccomp_fd is not None or request_r is not None:
        fds.append(null if seccomp_fd is None else seccomp_fd)
    if request_r is not None:
        fds.append(request_r)
    if status_w is not None:
        fds.append(status_w)
    try:
        argv = spec.argv()
        pid = spawn_owned(argv[0], argv, fds=fds, env={})
    except BaseException:
        for fd in (args_w, out_r, request_w, status_r):
            if fd is not None:
                os.close(fd)
        raise
    finally:
        for fd in (args_r, out_w, null, request_r, status_w):
            if fd is not None:
                os.close(fd)
    os.set_blocking(out_r, False)
    if status_r is not None:
        os.set_blocking(status_r, False)
    return Launched(pid, args_w, out_r, request_w, status_r)


def write_args(fd: int, args: Sequence[str], marker: bytes = RELEASE) -> None:
    """Write NUL-terminated ``args`` and the release ``marker`` to ``fd``, then close it.

    Raises:
        ValueError: an argument contains a NUL byte (``fd`` is closed all the same).
    """
    try:
        view = memoryview(encode_args(args) + marker)
        while view:
            view = view[os.write(fd, view) :]
    except BrokenPipeError:
        pass  # the launcher or agent died first; waiting for it reports its status
    finally:
        os.close(fd)


def encode_args(args: Sequence[str]) -> bytes:
    """``args``, each NUL-terminated.

    Raises:
        ValueError: an argument contains a NUL byte.
    """
    if any("\0" in arg for arg in args):
        raise ValueError("embedded null byte")
    return b"".join(os.fsencode(arg) + b"\0" for arg in args)
