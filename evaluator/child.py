"""The service's hold on one child process, by its pidfd: its exit watched, its tree killed
(by the event loop, or by a watchdog thread when the loop stalls), its status reaped once."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import select
import signal
import threading
from collections.abc import Iterator

from . import deadlines
from .cgroups import RunCgroup
from .procfs import reap_owned

__all__ = ["KILLED", "LOST_STATUS", "Child"]

log = logging.getLogger(__name__)

#: Reported when the exit status is lost (the child was reaped by someone else: never expected).
LOST_STATUS = 255
#: The status of a process killed by SIGKILL, as a shell reports it.
KILLED = 128 + signal.SIGKILL


class Child:
    """A child process (the launcher, then bwrap) and what must die with it.

    Args:
        pid: The child, started by :func:`.procfs.spawn_owned` (the process group's leader).
        cgroup: The run's cgroups: every process in them is killed with the child.
    """

    def __init__(self, pid: int, cgroup: RunCgroup | None) -> None:
        self.pid = pid
        self.pidfd = os.pidfd_open(pid)
        self._cgroup = cgroup
        self._returncode: int | None = None
        # Guards the exit status and kills: the watchdog thread may kill while the loop reaps.
        self._lock = threading.Lock()
        self._watchdog: deadlines.Deadline | None = None
        #: Whether the watchdog killed it (the event loop did not in time).
        self.timed_out = False

    @property
    def reaped(self) -> bool:
        """Whether its exit status is known."""
        return self._returncode is not None

    @property
    def alive(self) -> bool:
        """Whether the process has not exited yet."""
        return self._returncode is None and not select.select([self.pidfd], [], [], 0)[0]

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

    def terminate(self) -> None:
        """SIGTERM to the child alone (bwrap: its tree dies with it, 143)."""
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(self.pidfd, signal.SIGTERM)

    def start_watchdog(self, seconds: float) -> None:
        """Kill the tree from a thread after ``seconds`` (see :mod:`.deadlines`), unless it
        exited or :meth:`stop_watchdog` came first."""
        self._watchdog = deadlines.call_later(seconds, self._on_deadline)

    def stop_watchdog(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()

    def _on_deadline(self) -> None:
        if select.select([self.pidfd], [], [], 0)[0]:
            return  # it exited by itself
        self.timed_out = True
        self.kill()

    def reap(self, *, block: bool) -> int:
        """Reap the child through its pidfd (never another process), once; never raises.

        The returncode as a shell reports it (128 + signal for a signal). Not blocking and still
        running after SIGKILL (stuck in the kernel): reported as killed, reaped later.
        """
        with self._lock:
            if self._returncode is None:
                try:
                    result = reap_owned(self.pid, self.pidfd, block=block)
                except OSError as exc:
                    # Only possible if something else reaped our child: the status is gone.
                    log.error("the exit status of process %d is lost: %r", self.pid, exc)
                    self._returncode = LOST_STATUS
                    return self._returncode
                if result is None:
                    return KILLED
                if result.si_code == os.CLD_EXITED:
                    self._returncode = result.si_status
                else:  # CLD_KILLED, CLD_DUMPED
                    self._returncode = 128 + result.si_status
            return self._returncode

    @contextlib.contextmanager
    def exit_watch(self) -> Iterator[asyncio.Future[None]]:
        """While entered, a future done once the process has exited."""
        loop = asyncio.get_running_loop()
        exited: asyncio.Future[None] = loop.create_future()

        def on_exit() -> None:
            loop.remove_reader(self.pidfd)  # readable from now on: once is enough
            if not exited.done():
                exited.set_result(None)

        loop.add_reader(self.pidfd, on_exit)
        try:
            yield exited
        finally:
            loop.remove_reader(self.pidfd)

    async def exits_within(self, seconds: float) -> bool:
        """Whether the process exits within ``seconds`` (or has already)."""
        with self.exit_watch() as exited:
            await asyncio.wait((exited,), timeout=seconds)
        return exited.done()

    def close(self) -> None:
        """Release the pidfd (once reaped)."""
        os.close(self.pidfd)
