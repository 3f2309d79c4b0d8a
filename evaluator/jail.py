"""The bwrap command line, and one jailed process: started, limited, read and killed.

A run's process is started ahead of time (see :meth:`JailedProcess.spawn`): the service spawns
the launcher (:mod:`evaluator._launcher`), which joins the run's cgroups (the slow part on
cgroup v1: ~9 ms per ``cgroup.procs`` write), sets its rlimits, drops to the run's host user,
then blocks reading its command line from a pipe. A request only writes the command line and
closes the pipe: the launcher execs bwrap and the clock starts. bwrap's own ``--args FD`` cannot
do this: it takes options from the fd, but the command must already be on its real command line.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import fcntl
import logging
import marshal
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from . import _agent
from .cgroups import RunCgroup
from .procfs import reap_owned, spawn_owned

__all__ = ["JailedProcess", "Outcome", "SandboxView", "decode_output"]

log = logging.getLogger(__name__)

_LAUNCHER = str(Path(__file__).with_name("_launcher.py"))
# Ends a released command line; a launcher that reads EOF without it (the run was cancelled,
# or the service died mid-write) exits without running anything.
_RELEASE = b"\xffrun\xff"
_RELEASE_AGENT = b"\xffagent\xff"  # see _launcher.py: it keeps the agent's pipes
#: What the launcher writes once it has mounted the working directory (_launcher._MOUNTED).
MOUNTED = b"\x06"
# Where bwrap finds the seccomp program (the launcher's fd 4).
_SECCOMP_FD = 4
# The user inside the sandbox: nobody, like Snekbox. On the host it is the run's own uid.
SANDBOX_UID = 65534
# The device nodes of /dev inside. bwrap's own --dev would mount a devpts, which makes it map
# the sandbox user to uid 0 of an intermediate user namespace (seen in /proc/self/uid_map).
_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
# Host facts a run has no use for, covered by an empty file.
_MASKED_PROC_FILES = ("/proc/cmdline",)
INVALID_UTF8 = "UnicodeDecodeError: invalid Unicode in output pipe"
# Seconds to wait for the output to end after the process exited, and for a kill to take effect.
_DRAIN_GRACE, _KILL_GRACE = 0.5, 5.0
# Bytes read from an output pipe at a time; the default /proc/sys/fs/pipe-max-size, the most an
# unprivileged process can give its pipe.
_READ_SIZE, _PIPE_MAX_SIZE = 65536, 1 << 20
# The watchdog thread kills a run this long after its time limit if the event loop, stalled,
# has not done it already.
_WATCHDOG_MARGIN = 0.25
# Seconds a launcher may take to mount the working directory (a few ms; it is never released
# past this: the run fails as a sandbox failure).
_MOUNT_WAIT = 10.0
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
        argv = [
            self.bwrap,
            # The user namespace must be explicit: as root, bwrap would otherwise run the code
            # as the host's root with all capabilities.
            "--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID),
            "--disable-userns", "--cap-drop", "ALL",
            "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
            "--hostname", self.hostname,
            "--unshare-cgroup-try",
            "--die-with-parent", "--new-session",
            "--clearenv",
        ]  # fmt: skip
        for name, value in (*self.env, *env):
            argv += ["--setenv", name, value]
        for path in self.readonly_paths:
            argv += ["--ro-bind", path, path]
        for target, link in self.symlinks:
            argv += ["--symlink", target, link]
        argv += ["--proc", "/proc", "--tmpfs", "/dev"]
        for device in _DEVICES:
            argv += ["--dev-bind", device, device]
        for name, fd in (("stdin", 0), ("stdout", 1), ("stderr", 2)):
            argv += ["--symlink", f"/proc/self/fd/{fd}", f"/dev/{name}"]
        argv += ["--symlink", "/proc/self/fd", "/dev/fd"]
        # No sysctl is writable, not even those of the run's own namespaces (ns_last_pid is
        # 0666): /proc/sys is an empty, read-only directory.
        argv += ["--tmpfs", "/proc/sys", "--remount-ro", "/proc/sys"]
        if empty_file is not None:
            for path in _MASKED_PROC_FILES:
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
            argv += ["--seccomp", str(_SECCOMP_FD)]
        # Last, after every mount point is created: the root and /dev become read-only.
        argv += ["--remount-ro", "/", "--remount-ro", "/dev", "--chdir", self.home, "--", *command]
        return argv


@dataclass(frozen=True)
class Outcome:
    """How a process ended: its exit status as a shell reports it, and its merged output."""

    returncode: int
    output: bytes
    ended_by: Literal["exit", "time_limit", "output_limit"]


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
            :meth:`JailedProcess.mounted` then says when it is there.
        shm: ``(path, bytes, inodes)``: with ``workdir``, a ``noexec`` tmpfs it mounts there
            too, which bwrap binds as ``/dev/shm``.
    """

    cgroup_procs: tuple[str, ...] = ()
    rlimits: tuple[tuple[int, int], ...] = ()
    user: tuple[int, int] | None = None
    covers: tuple[tuple[str, tuple[str, ...]], ...] = ()
    cwd: str = "/"
    env: Mapping[str, str] | None = None
    workdir: tuple[str, int, int] | None = None
    shm: tuple[str, int, int] | None = None

    def argv(self) -> list[str]:
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
        }
        # -I -S: none of the environment, no site-packages, so nothing of the service loads.
        return [sys.executable, "-I", "-S", _LAUNCHER, marshal.dumps(spec).hex()]


class JailedProcess:
    """A launcher started ahead of time, in its cgroups, waiting for its command line."""

    def __init__(
        self,
        pid: int,
        args_fd: int,
        output_fd: int,
        cgroup: RunCgroup | None,
        request_fd: int | None = None,
        status_fd: int | None = None,
    ) -> None:
        self.pid = pid
        #: A session agent's status pipe (see :meth:`run_cell`).
        self._status_fd = status_fd
        self._args_fd: int | None = args_fd
        #: The warm agent's request pipe (see :meth:`deliver`); ``None`` for a plain launch.
        self._request_fd = request_fd
        self._output_fd: int | None = output_fd
        self._cgroup = cgroup
        self._pidfd = os.pidfd_open(pid)
        self._returncode: int | None = None
        self.released_at: float | None = None
        self._deadline: float | None = None
        # Guards the exit status and kills: the watchdog thread may kill while the loop reaps.
        self._lock = threading.Lock()
        self._watchdog: threading.Timer | None = None
        self._timed_out = False
        # Output read before the release, while waiting for the mount (a launcher's error).
        self._early = b""
        self._watched = False

    @classmethod
    def spawn(
        cls,
        spec: LaunchSpec,
        *,
        cgroup: RunCgroup | None,
        seccomp_fd: int | None = None,
        warm: bool = False,
        session: bool = False,
    ) -> JailedProcess:
        """Start the launcher; it blocks until :meth:`release` (or exits on :meth:`cancel`).

        Args:
            spec: What the launcher does first.
            cgroup: The run's cgroups (``spec`` names their ``cgroup.procs`` files).
            seccomp_fd: A seccomp program, handed to the launcher as fd 4.
            warm: Hand it fd 5, the request pipe of a warm agent (see :meth:`deliver`).
            session: And fd 6, where a session's agent says how each cell ended (see
                :meth:`run_cell`).
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
        return cls(pid, args_w, out_r, cgroup, request_w, status_r)

    async def mounted(self) -> bool:
        """Wait until the launcher has mounted the working directory (``LaunchSpec.workdir``).

        ``False``: it failed first (its message becomes the run's output, and it exits 255).
        """
        first = await self._first_read(_MOUNT_WAIT, 1)
        if first is None:
            return False
        if first == MOUNTED:
            return True
        self._early = first
        return False

    async def first_output(self, seconds: float) -> bytes:
        """What the process writes first (a warm agent's WARM, or why it failed); ``b""`` at
        EOF or after ``seconds``."""
        return await self._first_read(seconds, 4096) or b""

    async def _first_read(self, seconds: float, size: int) -> bytes | None:
        """At most ``size`` bytes of output once there are some (``b""``: EOF); ``None``
        when nothing came within ``seconds``."""
        if self._output_fd is None:
            return None
        loop = asyncio.get_running_loop()
        readable: asyncio.Future[None] = loop.create_future()
        fd = self._output_fd

        def on_readable() -> None:
            if not readable.done():
                readable.set_result(None)

        loop.add_reader(fd, on_readable)
        try:
            await asyncio.wait((readable,), timeout=seconds)
        finally:
            loop.remove_reader(fd)
        try:
            return os.read(fd, size)
        except BlockingIOError:
            return None

    def release(self, argv: Sequence[str], time_limit: float | None) -> None:
        """Hand the launcher its command line: it execs it now, and the clock starts.

        Past ``time_limit`` seconds the tree is killed: by :meth:`wait`, or, should the event
        loop be stalled, by a watchdog thread shortly after. ``None``: an agent (warm, or a
        session's), which keeps its pipes, and whose clock starts when it is handed a run
        (:meth:`deliver`, :meth:`run_cell`); any other run gets no pipe of an agent's.

        Raises:
            ValueError: an argument contains a NUL byte.
        """
        if self._args_fd is None:
            raise RuntimeError("the process was already released or cancelled")
        fd, self._args_fd = self._args_fd, None
        agent = time_limit is None
        if not agent:
            for name in ("_request_fd", "_status_fd"):
                if (pipe := getattr(self, name)) is not None:
                    os.close(pipe)
                    setattr(self, name, None)
        _write_args(fd, argv, _RELEASE_AGENT if agent else _RELEASE)
        self.released_at = time.monotonic()
        if time_limit is not None:
            self._start_clock(time_limit)

    def deliver(self, args: Sequence[str], time_limit: float) -> None:
        """Hand a warm agent the run's arguments: it runs them now, and the clock starts.

        Raises:
            ValueError: an argument contains a NUL byte.
        """
        if self._request_fd is None or self.released_at is None:
            raise RuntimeError("deliver() needs a released warm agent, once")
        self.stop_watching()
        fd, self._request_fd = self._request_fd, None
        _write_args(fd, args)
        self._start_clock(time_limit)

    def become_session(self) -> None:
        """Make a warm agent (spawned with ``session``) a session's: it runs cells from now on
        (see :meth:`run_cell`) instead of one run."""
        if self._request_fd is None or self._status_fd is None or self.released_at is None:
            raise RuntimeError("become_session() needs a released warm agent with a status pipe")
        self.stop_watching()
        with contextlib.suppress(BrokenPipeError):  # an empty pipe: one write, never blocks
            os.write(self._request_fd, _agent.SESSION)

    def watch(self, on_output: Callable[[bytes], bool]) -> None:
        """Until :meth:`deliver`, hand what the agent writes to ``on_output`` as it comes.

        ``on_output`` returns whether to go on (``False`` once the agent failed; at EOF it
        is given ``b""``).
        """
        fd = self._output_fd
        if fd is None:
            return

        def readable() -> None:
            try:
                chunk = os.read(fd, 4096)
            except BlockingIOError:
                return
            if not on_output(chunk) or not chunk:
                self.stop_watching()

        asyncio.get_running_loop().add_reader(fd, readable)
        self._watched = True

    def stop_watching(self) -> None:
        """Stop what :meth:`watch` started."""
        if self._watched and self._output_fd is not None:
            asyncio.get_running_loop().remove_reader(self._output_fd)
        self._watched = False

    def _start_clock(self, time_limit: float) -> None:
        self.released_at = time.monotonic()
        self._deadline = self.released_at + time_limit
        self._watchdog = threading.Timer(time_limit + _WATCHDOG_MARGIN, self._on_deadline)
        self._watchdog.daemon = True
        self._watchdog.start()

    def cancel(self) -> None:
        """Let a launcher never released, or an agent never delivered to, exit at once."""
        for name in ("_args_fd", "_request_fd"):
            fd = getattr(self, name)
            if fd is not None:
                os.close(fd)
                setattr(self, name, None)

    def kill(self) -> None:
        """SIGKILL the whole tree: bwrap's process group, and everything in the cgroup.

        bwrap's --die-with-parent and the PID namespace take down whatever is left inside.
        """
        with self._lock:
            if self._returncode is None:  # once reaped, the pid (and group id) may be reused
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.pid, signal.SIGKILL)
        if self._cgroup is not None:
            self._cgroup.kill()

    def _on_deadline(self) -> None:
        """The watchdog: the time limit is over and the loop has not ended the run."""
        if select.select([self._pidfd], [], [], 0)[0]:
            return  # it exited by itself
        self._timed_out = True
        self.kill()

    async def wait(self, output_limit: int) -> Outcome:
        """Read the output until the process ends, enforcing the time and output limits.

        Past the time limit given to :meth:`release`, the tree is killed (137); past
        ``output_limit`` bytes, bwrap is sent SIGTERM (143) and its tree dies with it.
        """
        if self._deadline is None or self._output_fd is None:
            raise RuntimeError("wait() needs a released process")
        loop = asyncio.get_running_loop()
        output = bytearray(self._early)
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
                chunk = os.read(output_fd, _READ_SIZE)
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
            remaining = self._deadline - time.monotonic()
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
        if self._watchdog is not None:
            self._watchdog.cancel()
        if self._timed_out and ended_by == "exit":
            ended_by = "time_limit"
        if ended_by == "time_limit":
            returncode = 128 + signal.SIGKILL
        return Outcome(returncode, bytes(output), ended_by)

    @property
    def alive(self) -> bool:
        """Whether the process has not exited yet."""
        return self._returncode is None and not select.select([self._pidfd], [], [], 0)[0]

    async def run_cell(
        self, args: Sequence[str], *, time_limit: float, output_limit: int, grace: float
    ) -> Outcome:
        """Run one cell in a session's agent (released with ``release(argv, None)``).

        The cell ends when the agent writes its status, or when the process ends. Past
        ``time_limit`` seconds the agent is interrupted (KeyboardInterrupt; it then kills the
        cell's other processes); if the cell has not ended ``grace`` seconds later, the tree is
        killed. Past ``output_limit`` bytes, as for a one-shot run, bwrap gets SIGTERM (143)
        and the interpreter ends. :attr:`alive` then says whether it lives on.

        Raises:
            ValueError: an argument contains a NUL byte.
        """
        if self._request_fd is None or self._status_fd is None or self._output_fd is None:
            raise RuntimeError("run_cell() needs a released session agent")
        if any("\0" in arg for arg in args):
            raise ValueError("embedded null byte")
        payload = b"".join(os.fsencode(arg) + b"\0" for arg in args)
        loop = asyncio.get_running_loop()
        output = bytearray()
        status = bytearray()
        ended_by: Literal["exit", "time_limit", "output_limit"] = "exit"
        done: asyncio.Future[None] = loop.create_future()
        output_fd, status_fd = self._output_fd, self._status_fd

        def finish() -> None:
            if not done.done():
                done.set_result(None)

        def interrupt() -> None:
            nonlocal ended_by
            if ended_by == "exit":
                ended_by = "time_limit"
                self._send(_agent.INTERRUPT, b"")

        def on_output() -> None:
            try:
                chunk = os.read(output_fd, _READ_SIZE)
            except BlockingIOError:
                return
            if not chunk:
                loop.remove_reader(output_fd)
                finish()
                return
            nonlocal ended_by
            room = output_limit - len(output)
            output.extend(chunk[: max(room, 0)])
            if len(chunk) > room and ended_by == "exit":
                # As for a one-shot run (143): the interpreter ends, the session with it.
                ended_by = "output_limit"
                with contextlib.suppress(ProcessLookupError):
                    signal.pidfd_send_signal(self._pidfd, signal.SIGTERM)

        def on_status() -> None:
            try:
                chunk = os.read(status_fd, 4 - len(status))
            except BlockingIOError:
                return
            status.extend(chunk)
            if not chunk or len(status) == 4:
                loop.remove_reader(status_fd)
                finish()

        loop.add_reader(output_fd, on_output)
        loop.add_reader(status_fd, on_status)
        loop.add_reader(self._pidfd, finish)
        try:
            # Within the time limit: an agent that does not read (a thread of an earlier cell
            # holding the GIL) must not hold up the service, only its own cell.
            self.released_at = time.monotonic()
            frame = _agent.CELL + len(payload).to_bytes(4, "big") + payload
            await self._write_within(frame, time_limit)
            remaining = time_limit - (time.monotonic() - self.released_at)
            await asyncio.wait((done,), timeout=max(remaining, 0))
            if not done.done():
                interrupt()
                await asyncio.wait((done,), timeout=grace)
            if not done.done():
                self.kill()
                await asyncio.wait((done,), timeout=_KILL_GRACE)
        finally:
            for fd in (output_fd, status_fd, self._pidfd):
                loop.remove_reader(fd)
        # What the cell wrote before its status is in the pipe by now.
        read_what_the_pipe_holds(output_fd, output, output_limit)
        if len(status) == 4 and self.alive:
            return Outcome(int.from_bytes(status, "big", signed=True), bytes(output), ended_by)
        # The agent is gone (or closed its status pipe): bwrap follows it in a moment.
        if self.alive and not await self._exits_within(_DRAIN_GRACE):
            self.kill()
            await self._exits_within(_KILL_GRACE)
        returncode = self._reap(block=False)
        if ended_by == "time_limit":  # killed after the grace
            returncode = 128 + signal.SIGKILL
        return Outcome(returncode, bytes(output), ended_by)

    def _send(self, kind: bytes, payload: bytes) -> None:
        """A small frame to a session's agent (its kind, its length, the payload), if the
        pipe has room: one that does not fit would not be read anyway."""
        if self._request_fd is None:
            return
        os.set_blocking(self._request_fd, False)
        with contextlib.suppress(BlockingIOError, BrokenPipeError):  # then killed after grace
            os.write(self._request_fd, kind + len(payload).to_bytes(4, "big") + payload)

    async def _write_within(self, data: bytes, seconds: float) -> bool:
        """Write ``data`` to the request pipe; whether it all went within ``seconds``."""
        fd = self._request_fd
        if fd is None:
            return False
        os.set_blocking(fd, False)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(fd, view) :]
                continue
            except BrokenPipeError:
                return False  # the agent is gone; the cell ends with the process
            except BlockingIOError:
                pass
            writable: asyncio.Future[None] = loop.create_future()

            def on_writable(ready: asyncio.Future[None] = writable) -> None:
                if not ready.done():
                    ready.set_result(None)

            loop.add_writer(fd, on_writable)
            try:
                await asyncio.wait((writable,), timeout=max(deadline - loop.time(), 0))
            finally:
                loop.remove_writer(fd)
            if not writable.done():
                return False
        return True

    def end_session(self) -> None:
        """Close a session agent's request pipe: it exits once its cell, if any, ends."""
        self.cancel()

    def _reap(self, *, block: bool) -> int:
        """Reap the child through its pidfd (never another process), once; never raises.

        The returncode as a shell reports it (128 + signal for a signal). Not blocking and still
        running after SIGKILL (stuck in the kernel): reported as killed, reaped by aclose().
        """
        with self._lock:
            return self._reap_locked(block=block)

    def _reap_locked(self, *, block: bool) -> int:
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

        A launcher never released exits by itself once its command-line pipe is closed.
        """
        self.stop_watching()
        self.cancel()
        if self._watchdog is not None:
            self._watchdog.cancel()
        if self._returncode is None:
            if self.released_at is not None:
                self.kill()
            if not await self._exits_within(_KILL_GRACE):
                self.kill()
                await self._exits_within(_KILL_GRACE)
            self._reap(block=True)
        for name in ("_output_fd", "_status_fd"):
            fd = getattr(self, name)
            if fd is not None:
                os.close(fd)
                setattr(self, name, None)
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


def read_what_the_pipe_holds(fd: int, output: bytearray, limit: int) -> None:
    """Read the non-blocking pipe ``fd`` into ``output`` (kept to ``limit`` bytes) until it is
    empty, or a full pipe's worth has come: a writer that goes on (a thread of a session's cell,
    after the cell's status) would otherwise hold the service's loop here as long as it writes.
    """
    try:
        capacity = fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ)
    except OSError:  # not a pipe
        capacity = _PIPE_MAX_SIZE
    for _ in range(capacity // _READ_SIZE + 1):
        try:
            chunk = os.read(fd, _READ_SIZE)
        except BlockingIOError:
            return
        if not chunk:
            return
        output.extend(chunk[: max(limit - len(output), 0)])


def _write_args(fd: int, args: Sequence[str], marker: bytes = _RELEASE) -> None:
    """Write NUL-terminated ``args`` and the release ``marker`` to ``fd``, then close it."""
    try:
        if any("\0" in arg for arg in args):
            raise ValueError("embedded null byte")
        view = memoryview(b"".join(os.fsencode(arg) + b"\0" for arg in args) + marker)
        while view:
            view = view[os.write(fd, view) :]
    except BrokenPipeError:
        pass  # the launcher or agent died first; wait() reports its status
    finally:
        os.close(fd)


def decode_output(output: bytes, *, truncated: bool) -> str | None:
    """The output as text, or ``None`` when it is not UTF-8.

    A truncated output may end in the middle of a character: that part is dropped.
    """
    try:
        return codecs.getincrementaldecoder("utf-8")().decode(output, final=not truncated)
    except UnicodeDecodeError:
        return None
