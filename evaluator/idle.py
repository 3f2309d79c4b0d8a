"""What a live session's processes may take of the CPU between its cells: next to nothing.

A cell may return and leave threads or processes running (a spinning thread, a server). Outside
a cell they hold no evaluation slot, so left alone they would take the CPU from the runs that
hold one. Between cells a session is therefore *held*, one of two ways:

- **least CPU weight**, where its cgroup has a cpu controller (root with cgroup v1's cpu
  hierarchy, or a delegated cgroup v2 subtree with ``cpu``): ``cpu.shares`` 2 (v1) or
  ``cpu.weight`` 1 (v2), against 1024 or 100 for a run. Its processes keep running, on CPU time
  no run wants: a CPU-bound run beside ``n`` idle spinning sessions keeps at least
  ``1024 / (1024 + 2 n)`` of its CPU (v1; ``100 / (100 + n)`` on v2), 0.94 for the default cap
  of 31 sessions.
- **stopped** (SIGSTOP), where there is no cpu controller (an ordinary user without a delegated
  cpu controller; root without a cpu hierarchy): renicing would not do, since an unprivileged
  service could never lower the nice value again (that needs CAP_SYS_NICE in the initial user
  namespace). Every process of the sandbox's tree (the outer bwrap and its descendants, found
  through ``/proc``) is stopped, walking the tree again until every process found is stopped
  and a last walk finds no other (a process may fork while the walk goes on). An idle session
  then takes no CPU at all; its threads and processes go on where they were when the next cell
  starts. What a stopped session cannot do between cells: answer on a socket (it has no
  network anyway), or keep time-based work going (it resumes late).

Either way the session gets its normal weight back, or is continued (SIGCONT), before its next
cell is handed its code; and before it is killed (SIGKILL ends stopped processes too, but nothing
else should find them stopped).

Every process is named by a pidfd, and counted as the child of its parent only once the parent
is seen alive after the child's parent was read: a pid freed and reused meanwhile (by a process
outside the sandbox) is never signalled.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import select
import signal
import time
from collections.abc import Iterator
from pathlib import Path

from .cgroups import RunCgroup
from .procfs import status

__all__ = ["IdleHold"]

log = logging.getLogger(__name__)

#: Seconds a session's tree has to stop before it is left as it is (a process stuck in the
#: kernel, uninterruptible, stops only once it is out).
_STOP_WITHIN = 5.0
#: Seconds between two walks while processes are still stopping.
_STOP_PAUSE = 0.002
#: Thread states that run no code of the process: stopped, traced, dead or a zombie.
_HALTED = frozenset("TtXZx")


class IdleHold:
    """Holds a session's processes between cells (see the module): least weight, or stopped.

    Args:
        pid: The sandbox's outer bwrap process, a child of this one not yet reaped.
        cgroup: The sandbox's cgroup, if it has one (its cpu controller gives the weight).
    """

    def __init__(self, pid: int, cgroup: RunCgroup | None) -> None:
        self._pid = pid
        self._cgroup = cgroup if cgroup is not None and cgroup.weighs_cpu else None
        #: The stop in progress or done (``None``: the session's processes run).
        self._stopping: asyncio.Future[bool] | None = None

    @property
    def how(self) -> str:
        """How an idle session is held (for the log, and the benchmark)."""
        return "least CPU weight" if self._cgroup is not None else "stopped (SIGSTOP)"

    def hold(self) -> None:
        """The cell ended and the session lives on: take its CPU away until :meth:`release`."""
        if self._cgroup is not None:
            with _logged("could not lower the CPU weight of an idle session"):
                self._cgroup.background()
            return
        if self._stopping is not None:
            return
        try:
            root = os.pidfd_open(self._pid)  # not yet reaped: the pid is still the sandbox's
        except OSError:
            return  # gone: nothing to hold
        self._stopping = asyncio.ensure_future(asyncio.to_thread(_stop_tree, self._pid, root))

    async def release(self) -> None:
        """A cell is about to run: its processes get their weight back, or run again."""
        if self._cgroup is not None:
            with _logged("could not restore the CPU weight of a session"):
                self._cgroup.foreground()
            return
        stopping = self._stopping
        if stopping is None:
            return
        with contextlib.suppress(Exception):  # logged by the stop itself
            await asyncio.shield(stopping)  # else a stop still walking would follow the SIGCONT
        self._stopping = None
        _continue_tree(self._pid)

    def release_now(self) -> None:
        """:meth:`release`, without waiting for a stop still walking: for a session being
        killed, which a late SIGSTOP does not keep from dying."""
        if self._cgroup is None and self._stopping is not None:
            self._stopping = None
            _continue_tree(self._pid)


@contextlib.contextmanager
def _logged(what: str) -> Iterator[None]:
    try:
        yield
    except OSError as exc:
        log.warning("%s: %s", what, exc)


def _stop_tree(pid: int, root: int) -> bool:
    """SIGSTOP every process of the tree below and at ``pid`` (``root``, its pidfd, is closed
    here) until all are stopped and no other appeared; whether that happened in time."""
    deadline = time.monotonic() + _STOP_WITHIN
    halted: frozenset[int] | None = None
    found: dict[int, int] = {}
    try:
        while True:
            with _tree(pid, root) as found:
                for fd in found.values():
                    _signal(fd, signal.SIGSTOP)
                if halted == frozenset(found):
                    return True  # all were stopped at the last walk, and none came since
                halted = frozenset(found) if _all_halted(found) else None
            if time.monotonic() > deadline:
                log.warning("an idle session's processes did not all stop: %s", sorted(found))
                return False
            if halted is None:
                time.sleep(_STOP_PAUSE)
    except OSError as exc:  # /proc unreadable: the session runs on as it is
        log.warning("could not stop an idle session's processes: %s", exc)
        return False
    finally:
        os.close(root)


def _continue_tree(pid: int) -> None:
    """SIGCONT every process of the tree below and at ``pid`` (stopped, it cannot grow)."""
    try:
        root = os.pidfd_open(pid)
    except OSError:
        return
    try:
        with _tree(pid, root) as found:
            for fd in found.values():
                _signal(fd, signal.SIGCONT)
    finally:
        os.close(root)


@contextlib.contextmanager
def _tree(pid: int, root: int) -> Iterator[dict[int, int]]:
    """The processes at and below ``pid`` now, each with a pidfd (closed on exit, but
    ``root``, the caller's pidfd of ``pid``)."""
    found = {pid: root}
    todo = [pid]
    try:
        while todo:
            parent = todo.pop()
            for child in _children(parent) - found.keys():
                try:
                    fd = os.pidfd_open(child)
                except OSError:
                    continue  # gone already
                seen = status(child)
                # Read while the child lived (its pidfd not exited after the read), and the
                # parent then still lived: the pid was the parent's child, not a reuse.
                if seen is None or seen.parent != parent or _exited(fd) or _exited(found[parent]):
                    os.close(fd)
                    continue
                found[child] = fd
                todo.append(child)
        yield found
    finally:
        for child, fd in found.items():
            if child != pid:
                os.close(fd)


def _children(pid: int) -> set[int]:
    """The children of ``pid`` (of all its threads); every pid whose parent it is where the
    kernel has no ``children`` files."""
    children: set[int] = set()
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return children
    for task in tasks:
        try:
            children.update(map(int, Path(f"/proc/{pid}/task/{task}/children").read_text().split()))
        except FileNotFoundError:
            if not Path(f"/proc/{pid}/task/{task}").exists():
                continue  # the thread ended
            return {
                p for p in map(int, filter(str.isdigit, os.listdir("/proc"))) if _parent(p) == pid
            }
        except OSError:
            continue
    return children


def _parent(pid: int) -> int | None:
    found = status(pid)
    return found.parent if found is not None else None


def _all_halted(found: dict[int, int]) -> bool:
    """Whether every thread of every process in ``found`` runs no code now."""
    for pid, fd in found.items():
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            tasks = []
        for task in tasks:
            try:
                stat = Path(f"/proc/{pid}/task/{task}/stat").read_text()
            except OSError:
                continue  # the thread ended
            if stat[stat.rindex(")") + 2] not in _HALTED and not _exited(fd):
                return False
    return True


def _exited(pidfd: int) -> bool:
    """Whether the process of ``pidfd`` has exited (its pidfd turns readable); poll, not
    select, which refuses descriptors above 1023."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(0))


def _signal(pidfd: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # gone, or not a child
        signal.pidfd_send_signal(pidfd, signum)
