"""The bwrap command line, and one jailed process: started, limited, read and killed.

A run's process is forked ahead of time (see :meth:`JailedProcess.spawn`): the child joins the
run's cgroups (the slow part on cgroup v1: ~9 ms per ``cgroup.procs`` write), sets its rlimits
and file descriptors, then blocks reading its command line from a pipe. A request only writes
the command line and closes the pipe: the child execs bwrap and the clock starts. bwrap's own
``--args FD`` cannot do this: it takes options from the fd, but the command must already be on
its real command line.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import ctypes
import fcntl
import logging
import os
import resource
import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, NoReturn

from .cgroups import RunCgroup
from .procfs import fork_owned, reap_owned

__all__ = ["JailedProcess", "Outcome", "SandboxView", "decode_output"]

log = logging.getLogger(__name__)

_libc = ctypes.CDLL(None, use_errno=True)
_PR_SET_PDEATHSIG = 1

# Ends a released command line; a child that reads EOF without it (the run was cancelled, or
# the service died mid-write) exits without running anything.
_RELEASE = b"\xffrun\xff"
# Where the child finds its pipes: fd 3 the command line, fd 4 the seccomp program.
_ARGS_FD, _SECCOMP_FD = 3, 4
# The sandbox user: nobody, like Snekbox.
SANDBOX_UID = 65534
INVALID_UTF8 = "UnicodeDecodeError: invalid Unicode in output pipe"
# Seconds to wait for the output to end after the process exited, and for a kill to take effect.
_DRAIN_GRACE, _KILL_GRACE = 0.5, 5.0
# Reported when the exit status is lost (the child was reaped by someone else: never expected).
LOST_STATUS = 255


@dataclass(frozen=True)
class SandboxView:
    """What the code sees: the fixed part of every bwrap command line.

    Args:
        bwrap: Absolute path of the bwrap binary.
        readonly_paths: Host paths bound read-only at the same place.
        symlinks: ``(target, link)`` pairs, e.g. ``("usr/lib", "/lib")``.
        env: The whole environment of the code.
        shm_size: Bytes of ``/dev/shm``.
    """

    bwrap: str
    readonly_paths: tuple[str, ...]
    symlinks: tuple[tuple[str, str], ...]
    env: tuple[tuple[str, str], ...]
    shm_size: int

    def argv(
        self,
        command: Sequence[str],
        *,
        workdir: Path,
        seccomp: bool,
        readonly_files: Sequence[tuple[str, str]] = (),
    ) -> list[str]:
        """The complete command line running ``command`` in ``workdir`` (``/home`` inside).

        ``readonly_files`` are ``(host path, sandbox path)`` pairs bound read-only.
        """
        argv = [
            self.bwrap,
            # The user namespace must be explicit: as root, bwrap would otherwise run the code
            # as the host's root with all capabilities.
            "--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID),
            "--disable-userns", "--cap-drop", "ALL",
            "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
            "--unshare-cgroup-try",
            "--die-with-parent", "--new-session",
            "--clearenv",
        ]  # fmt: skip
        for name, value in self.env:
            argv += ["--setenv", name, value]
        for path in self.readonly_paths:
            argv += ["--ro-bind", path, path]
        for target, link in self.symlinks:
            argv += ["--symlink", target, link]
        argv += [
            "--proc", "/proc",
            "--dev", "/dev",
            "--size", str(self.shm_size), "--tmpfs", "/dev/shm",
            "--bind", str(workdir), "/home",
        ]  # fmt: skip
        for host_path, sandbox_path in readonly_files:
            argv += ["--ro-bind", host_path, sandbox_path]
        if seccomp:
            argv += ["--seccomp", str(_SECCOMP_FD)]
        # Last, after every mount point is created: the root and /dev become read-only.
        argv += ["--remount-ro", "/", "--remount-ro", "/dev", "--chdir", "/home", "--", *command]
        return argv


@dataclass(frozen=True)
class Outcome:
    """How a process ended: its exit status as a shell reports it, and its merged output."""

    returncode: int
    output: bytes
    ended_by: Literal["exit", "time_limit", "output_limit"]


class JailedProcess:
    """A child forked ahead of time, in its cgroups, waiting for its command line."""

    def __init__(self, pid: int, args_fd: int, output_fd: int, cgroup: RunCgroup | None) -> None:
        self.pid = pid
        self._args_fd: int | None = args_fd
        self._output_fd: int | None = output_fd
        self._cgroup = cgroup
        self._pidfd = os.pidfd_open(pid)
        self._returncode: int | None = None
        self.released_at: float | None = None

    @classmethod
    def spawn(
        cls,
        *,
        cgroup: RunCgroup | None,
        rlimits: Sequence[tuple[int, int]] = (),
        seccomp_fd: int | None = None,
        cwd: str = "/",
        env: Mapping[str, str] | None = None,
    ) -> JailedProcess:
        """Fork the child; it blocks until :meth:`release` (or exits on :meth:`cancel`).

        Args:
            cgroup: The cgroups the child joins before anything else.
            rlimits: ``(resource, limit)`` pairs set as soft and hard limits.
            seccomp_fd: A seccomp program, handed to the child as fd 4.
            cwd: The child's working directory.
            env: The environment of the command (bwrap clears it for the code anyway).
        """
        args_r, args_w = os.pipe2(os.O_CLOEXEC)
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        procs_files = cgroup.procs_files if cgroup is not None else ()
        env_bytes = {os.fsencode(k): os.fsencode(v) for k, v in (env or {}).items()}
        parent = os.getpid()
        max_fd = os.sysconf("SC_OPEN_MAX")
        # os.fork, not subprocess: the command line is only known later. The child runs only
        # os-level calls until it execs, which is what subprocess's preexec_fn does too.
        # The child is owned from the start: only this object reaps it (see procfs).
        pid = fork_owned()
        if pid == 0:
            _child(args_r, out_w, seccomp_fd, procs_files, rlimits, cwd, env_bytes, parent, max_fd)
        os.close(args_r)
        os.close(out_w)
        os.set_blocking(out_r, False)
        return cls(pid, args_w, out_r, cgroup)

    def release(self, argv: Sequence[str]) -> None:
        """Hand the child its command line: it execs it now, and the clock starts.

        Raises:
            ValueError: an argument contains a NUL byte.
        """
        if any("\0" in arg for arg in argv):
            raise ValueError("embedded null byte")
        if self._args_fd is None:
            raise RuntimeError("the process was already released or cancelled")
        payload = b"".join(os.fsencode(arg) + b"\0" for arg in argv) + _RELEASE
        fd, self._args_fd = self._args_fd, None
        try:
            view = memoryview(payload)
            while view:
                view = view[os.write(fd, view) :]
        except BrokenPipeError:
            pass  # the child died before its release; wait() reports its status
        finally:
            os.close(fd)
        self.released_at = time.monotonic()

    def cancel(self) -> None:
        """Let a child that was never released exit without running anything."""
        if self._args_fd is not None:
            os.close(self._args_fd)
            self._args_fd = None

    def kill(self) -> None:
        """SIGKILL the whole tree: bwrap's process group, and everything in the cgroup.

        bwrap's --die-with-parent and the PID namespace take down whatever is left inside.
        """
        if self._returncode is None:  # once reaped, the pid (and group id) may be reused
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)
        if self._cgroup is not None:
            self._cgroup.kill()

    async def wait(self, time_limit: float, output_limit: int) -> Outcome:
        """Read the output until the process ends, enforcing the time and output limits.

        Past ``time_limit`` seconds after :meth:`release`, the tree is killed (137); past
        ``output_limit`` bytes, bwrap is sent SIGTERM (143) and its tree dies with it.
        """
        if self.released_at is None or self._output_fd is None:
            raise RuntimeError("wait() needs a released process")
        loop = asyncio.get_running_loop()
        output = bytearray()
        ended_by: Literal["exit", "time_limit", "output_limit"] = "exit"
        drained: asyncio.Future[None] = loop.create_future()
        exited: asyncio.Future[None] = loop.create_future()
        output_fd = self._output_fd

        def stop_reading() -> None:
            loop.remove_reader(output_fd)
            if not drained.done():
                drained.set_result(None)

        def on_output() -> None:
            nonlocal ended_by
            try:
                chunk = os.read(output_fd, 65536)
            except BlockingIOError:
                return
            if not chunk:
                stop_reading()
                return
            output.extend(chunk)
            if len(output) > output_limit:
                del output[output_limit:]
                ended_by = "output_limit"
                with contextlib.suppress(ProcessLookupError):
                    signal.pidfd_send_signal(self._pidfd, signal.SIGTERM)
                stop_reading()

        def on_exit() -> None:
            loop.remove_reader(self._pidfd)
            if not exited.done():
                exited.set_result(None)

        loop.add_reader(output_fd, on_output)
        loop.add_reader(self._pidfd, on_exit)
        try:
            remaining = self.released_at + time_limit - time.monotonic()
            await asyncio.wait((drained, exited), timeout=max(remaining, 0))
            if not exited.done():
                if ended_by == "exit":
                    ended_by = "time_limit"
                self.kill()
            elif not drained.done():
                # Exited, yet something still holds the output pipe open: only possible when
                # a process escaped the tree (unsandboxed mode). Give it a moment, then kill.
                await asyncio.wait((drained,), timeout=_DRAIN_GRACE)
                self.kill()
            # Killed processes close the pipe at once; the bound only guards against a process
            # stuck in the kernel.
            await asyncio.wait((drained, exited), timeout=_KILL_GRACE)
        finally:
            stop_reading()
            loop.remove_reader(self._pidfd)
        returncode = self._reap(block=exited.done())
        if ended_by == "time_limit":
            returncode = 128 + signal.SIGKILL
        return Outcome(returncode, bytes(output), ended_by)

    def _reap(self, *, block: bool) -> int:
        """Reap the child through its pidfd (never another process), once; never raises.

        The returncode as a shell reports it (128 + signal for a signal). Not blocking and still
        running after SIGKILL (stuck in the kernel): reported as killed, reaped by aclose().
        """
        if self._returncode is None:
            try:
                result = reap_owned(self.pid, self._pidfd, block=block)
            except OSError as exc:
                # Only possible if something else reaped our child: the status is gone.
                log.error("the exit status of process %d is lost: %r", self.pid, exc)
                self._returncode = LOST_STATUS
                return self._returncode
            if result is None:
                return 128 + signal.SIGKILL
            if result.si_code == os.CLD_EXITED:
                self._returncode = result.si_status
            else:  # CLD_KILLED, CLD_DUMPED
                self._returncode = 128 + result.si_status
        return self._returncode

    async def aclose(self) -> None:
        """Kill what is left, reap the child and release the file descriptors.

        A child never released exits by itself once its command-line pipe is closed.
        """
        self.cancel()
        if self._returncode is None:
            if self.released_at is not None:
                self.kill()
            if not await self._exits_within(_KILL_GRACE):
                self.kill()
                await self._exits_within(_KILL_GRACE)
            self._reap(block=True)
        if self._output_fd is not None:
            os.close(self._output_fd)
            self._output_fd = None
        os.close(self._pidfd)

    async def _exits_within(self, seconds: float) -> bool:
        loop = asyncio.get_running_loop()
        exited: asyncio.Future[None] = loop.create_future()

        def on_exit() -> None:
            if not exited.done():
                exited.set_result(None)

        loop.add_reader(self._pidfd, on_exit)
        try:
            await asyncio.wait((exited,), timeout=seconds)
        finally:
            loop.remove_reader(self._pidfd)
        return exited.done()


def decode_output(output: bytes, *, truncated: bool) -> str | None:
    """The output as text, or ``None`` when it is not UTF-8.

    A truncated output may end in the middle of a character: that part is dropped.
    """
    try:
        return codecs.getincrementaldecoder("utf-8")().decode(output, final=not truncated)
    except UnicodeDecodeError:
        return None


def _child(
    args_r: int,
    out_w: int,
    seccomp_fd: int | None,
    procs_files: Sequence[str],
    rlimits: Sequence[tuple[int, int]],
    cwd: str,
    env: Mapping[bytes, bytes],
    parent: int,
    max_fd: int,
) -> NoReturn:
    """The forked child: join the cgroups, wait for the command line, exec it. Never returns."""
    try:
        os.setsid()  # its own process group, to kill the tree; no terminal signals
        # Dies with the service (the flag survives exec), so a run never outlives it.
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(0)
        for path in procs_files:
            fd = os.open(path, os.O_WRONLY)
            os.write(fd, str(os.getpid()).encode())
            os.close(fd)
        for limit_resource, limit in rlimits:
            resource.setrlimit(limit_resource, (limit, limit))
        null = os.open(os.devnull, os.O_RDWR)
        # Move every source above the targets first, so no dup2 overwrites another source.
        sources = [null, out_w, out_w, args_r]
        if seccomp_fd is not None:
            sources.append(seccomp_fd)
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 16) for fd in sources]
        for target, fd in enumerate(high):
            os.dup2(fd, target)  # dup2 clears close-on-exec on the target
        os.closerange(len(high), max_fd)
        os.chdir(cwd)
        chunks = []
        while chunk := os.read(_ARGS_FD, 65536):
            chunks.append(chunk)
        os.close(_ARGS_FD)
        data = b"".join(chunks)
        if not data.endswith(_RELEASE):
            os._exit(0)
        argv = data[: -len(_RELEASE)].split(b"\0")[:-1]
        for signum in (signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(signum, signal.SIG_DFL)  # Python ignores them; exec keeps that
        os.execve(argv[0], argv, env)
    except BaseException as exc:
        with contextlib.suppress(BaseException):
            os.write(2, f"evaluator: the sandbox could not start: {exc!r}\n".encode())
    finally:
        os._exit(255)
