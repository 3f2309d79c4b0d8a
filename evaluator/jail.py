"""One jailed process: a launcher started ahead of time, released, read, limited and killed.

The service spawns the launcher (:mod:`.launch`, :mod:`._launcher`) ahead of time, in the run's
cgroups; a request writes its command line, and the clock starts. The process is then a one-shot
run (:meth:`JailedProcess.wait`), a warm agent handed its run (:meth:`JailedProcess.deliver`),
or a session's interpreter running cell after cell (:meth:`JailedProcess.run_cell`). Runs and
cells read their output through the one pump of :mod:`.pump`. What bwrap is told lives in
:mod:`.policy`; how the service talks to an agent, in :mod:`.agent_pipes`.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Sequence
from typing import Literal

from . import _agent, agent_pipes
from .cgroups import RunCgroup
from .child import KILLED, LOST_STATUS, Child
from .launch import MOUNTED, RELEASE, RELEASE_AGENT, LaunchSpec, start_launcher, write_args
from .policy import SANDBOX_UID, SandboxView
from .pump import (
    INVALID_UTF8,
    OnOutput,
    Outcome,
    OutputPump,
    decode_output,
    first_read,
    read_what_the_pipe_holds,
)

__all__ = [
    "INVALID_UTF8",
    "LOST_STATUS",
    "MOUNTED",
    "SANDBOX_UID",
    "JailedProcess",
    "LaunchSpec",
    "Outcome",
    "SandboxView",
    "decode_output",
    "read_what_the_pipe_holds",
]

# Seconds to wait for the output to end after the process exited, and for a kill to take effect.
_DRAIN_GRACE, _KILL_GRACE = 0.5, 5.0
# The watchdog thread kills a run this long after its time limit if the event loop, stalled,
# has not done it already.
_WATCHDOG_MARGIN = 0.25
# Seconds a launcher may take to mount the working directory (a few ms; it is never released
# past this: the run fails as a sandbox failure).
_MOUNT_WAIT = 10.0
EndedBy = Literal["exit", "time_limit", "output_limit", "interrupted"]


class JailedProcess:
    """A launcher started ahead of time, in its cgroups, waiting for its command line."""

    def __init__(
        self,
        pid: int,
        args_fd: int,
        output_fd: int,
        request_fd: int | None = None,
        status_fd: int | None = None,
        *,
        cgroup: RunCgroup | None,
    ) -> None:
        self._child = Child(pid, cgroup)
        self.pid = pid
        self._pidfd = self._child.pidfd
        #: A session agent's status pipe (see :meth:`run_cell`).
        self._status_fd = status_fd
        self._args_fd: int | None = args_fd
        #: The warm agent's request pipe (see :meth:`deliver`); ``None`` for a plain launch.
        self._request_fd = request_fd
        self._output_fd: int | None = output_fd
        self.released_at: float | None = None
        self._deadline: float | None = None
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
        pipes = start_launcher(spec, seccomp_fd=seccomp_fd, warm=warm, session=session)
        return cls(*pipes, cgroup=cgroup)

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

    async def _first_read(self, seconds: float, size: int) -> bytes | None:
        if self._output_fd is None:
            return None
        return await first_read(self._output_fd, seconds, size)

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
        write_args(fd, argv, RELEASE_AGENT if agent else RELEASE)
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
        write_args(fd, args)
        self._start_clock(time_limit)

    def become_session(self) -> None:
        """Make a warm agent (spawned with ``session``) a session's: it runs cells from now on
        (see :meth:`run_cell`) instead of one run."""
        if self._request_fd is None or self._status_fd is None or self.released_at is None:
            raise RuntimeError("become_session() needs a released warm agent with a status pipe")
        self.stop_watching()
        agent_pipes.start_session(self._request_fd)

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
        self._child.start_watchdog(time_limit + _WATCHDOG_MARGIN)

    def cancel(self) -> None:
        """Let a launcher never released, or an agent never delivered to, exit at once."""
        for name in ("_args_fd", "_request_fd"):
            fd = getattr(self, name)
            if fd is not None:
                os.close(fd)
                setattr(self, name, None)

    def kill(self) -> None:
        """SIGKILL the whole tree: bwrap's process group, and everything in the cgroup."""
        self._child.kill()

    async def wait(self, output_limit: int, *, on_output: OnOutput | None = None) -> Outcome:
        """Read the output until the process ends, enforcing the time and output limits.

        Past the time limit given to :meth:`release`, the tree is killed (137); past
        ``output_limit`` bytes, bwrap is sent SIGTERM (143) and its tree dies with it.
        ``on_output`` is handed each chunk of the output as it is read (see :mod:`.pump`).
        """
        if self._deadline is None or self._output_fd is None:
            raise RuntimeError("wait() needs a released process")
        pump = OutputPump(
            self._output_fd,
            output_limit,
            on_limit=self._child.terminate,
            on_output=on_output,
            initial=self._early,
        )
        timed_out = False
        with pump, self._child.exit_watch() as exited:
            remaining = self._deadline - time.monotonic()
            await asyncio.wait((pump.ended, exited), timeout=max(remaining, 0))
            if not exited.done():
                timed_out = True
                self.kill()
            elif not pump.ended.done():
                # Exited, yet something still holds the output pipe open: only possible when
                # a process escaped the tree (unsandboxed mode). Give it a moment, then kill.
                await asyncio.wait((pump.ended,), timeout=_DRAIN_GRACE)
                self.kill()
            # Killed processes close the pipe at once; the bound only guards against a process
            # stuck in the kernel.
            await asyncio.wait((pump.ended, exited), timeout=_KILL_GRACE)
        returncode = self._child.reap(block=exited.done())
        self._child.stop_watchdog()
        ended_by: EndedBy = "exit"
        if pump.over_limit:
            ended_by = "output_limit"
        elif timed_out or self._child.timed_out:
            ended_by, returncode = "time_limit", KILLED
        return Outcome(returncode, pump.output, ended_by)

    @property
    def alive(self) -> bool:
        """Whether the process has not exited yet."""
        return self._child.alive

    async def run_cell(
        self,
        args: Sequence[str],
        *,
        time_limit: float,
        output_limit: int,
        grace: float,
        on_output: OnOutput | None = None,
        interrupted: asyncio.Future[None] | None = None,
        starting: bool = False,
    ) -> Outcome:
        """Run one cell in a session's agent (released with ``release(argv, None)``).

        The cell ends when the agent writes its status, or when the process ends. Past
        ``time_limit`` seconds the agent is interrupted (KeyboardInterrupt; it then kills the
        cell's other processes); if the cell has not ended ``grace`` seconds later, the tree is
        killed. Past ``output_limit`` bytes, as for a one-shot run, bwrap gets SIGTERM (143)
        and the interpreter ends. :attr:`alive` then says whether it lives on. ``on_output``
        is handed each chunk of the output as it is read (see :mod:`.pump`). Once
        ``interrupted`` is done, the cell is interrupted as at the time limit (``ended_by``
        ``"interrupted"``). ``starting``: the agent was just released and this is its first
        cell, sent without waiting for it to start (its WARM comes first, and is dropped).

        Raises:
            ValueError: an argument contains a NUL byte.
            RuntimeError: ``starting``, and the agent ended before it started (its output
                says why).
        """
        request_fd, status_fd = self._request_fd, self._status_fd
        if request_fd is None or status_fd is None or self._output_fd is None:
            raise RuntimeError("run_cell() needs a released session agent")
        frame = agent_pipes.cell_frame(args)
        ended_by: EndedBy = "exit"

        def on_limit() -> None:  # as for a one-shot run: the interpreter ends, the session too
            nonlocal ended_by
            if ended_by == "exit":
                ended_by = "output_limit"
                self._child.terminate()

        marker = _agent.WARM if starting else None
        pump = OutputPump(
            self._output_fd, output_limit, on_limit=on_limit, on_output=on_output, marker=marker
        )
        status = agent_pipes.CellStatus(status_fd)
        asked = (interrupted,) if interrupted is not None else ()
        with pump, status.watch() as said, self._child.exit_watch() as exited:
            ends = (pump.eof, said, exited)
            self.released_at = time.monotonic()
            await agent_pipes.write_within(request_fd, frame, time_limit)
            remaining = time_limit - (time.monotonic() - self.released_at)
            await _any_within((*ends, *asked), remaining)
            if not any(end.done() for end in ends):
                if ended_by == "exit":
                    ended_by = "interrupted" if any(a.done() for a in asked) else "time_limit"
                    agent_pipes.send_frame(request_fd, _agent.INTERRUPT)
                if not await _any_within(ends, grace):
                    self.kill()
                    await _any_within(ends, _KILL_GRACE)
        pump.drain()  # what the cell wrote before its status is in the pipe by now
        if starting and not pump.marked and ended_by == "exit":
            self.kill()
            why = pump.output.decode("utf-8", "replace").strip()[:500] or "(no output)"
            raise RuntimeError(f"the session's interpreter did not start: {why}")
        if status.value is not None and self.alive:
            return Outcome(status.value, pump.output, ended_by, status.imports)
        # The agent is gone (or closed its status pipe): bwrap follows it in a moment.
        if self.alive and not await self._child.exits_within(_DRAIN_GRACE):
            self.kill()
            await self._child.exits_within(_KILL_GRACE)
        returncode = self._child.reap(block=False)
        if ended_by in ("time_limit", "interrupted"):  # killed after the grace
            returncode = KILLED
        return Outcome(returncode, pump.output, ended_by)

    def end_session(self) -> None:
        """Close a session agent's request pipe: it exits once its cell, if any, ends."""
        self.cancel()

    async def aclose(self) -> None:
        """Kill what is left, reap the child and release the file descriptors.

        A launcher never released exits by itself once its command-line pipe is closed.
        """
        self.stop_watching()
        self.cancel()
        self._child.stop_watchdog()
        if not self._child.reaped:
            if self.released_at is not None:
                self.kill()
            if not await self._child.exits_within(_KILL_GRACE):
                self.kill()
                await self._child.exits_within(_KILL_GRACE)
            self._child.reap(block=True)
        for name in ("_output_fd", "_status_fd"):
            fd = getattr(self, name)
            if fd is not None:
                os.close(fd)
                setattr(self, name, None)
        self._child.close()


async def _any_within(futures: Sequence[asyncio.Future[None]], seconds: float) -> bool:
    """Wait until one of ``futures`` is done, at most ``seconds``; whether one is."""
    if not any(future.done() for future in futures):
        await asyncio.wait(futures, timeout=max(seconds, 0), return_when=asyncio.FIRST_COMPLETED)
    return any(future.done() for future in futures)
