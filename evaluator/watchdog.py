"""The memory watchdog: ends the live session holding the most memory before the host runs out.

Where no memory cgroup bounds a session (an ordinary user's evaluator), only each process's
address-space rlimit holds it, which misses tmpfs, ``/dev/shm``, socket buffers and the number of
processes: idle sessions can then hold more than the host has. While any live session is open,
the watchdog reads ``MemAvailable`` every second (``/proc/meminfo``, so it runs in every mode),
or where a memory cgroup the evaluator is in leaves less (a container's or a pod's limit, which
the kernel's OOM killer enforces before the host runs short), that cgroup's limit and what is
left below it. Below the reserve (``memory_reserve`` of that total), it measures every live
session and ends the largest, one per check, until memory is available again; the session's next
call is told why (:class:`MemoryEnded`).

A session's memory is what ending it gives back: the resident memory of its processes that no
file backs (``RssAnon`` and ``RssShmem`` of every process of its sandbox) plus what its working
directory and its ``/dev/shm`` (tmpfs) hold. A tmpfs file the code maps is counted twice, which
only ranks such a session higher.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import NamedTuple

from .cgroups import memory_cgroups, memory_limit
from .config import MiB
from .pool import Sandbox
from .procfs import descendants

__all__ = [
    "MemInfo",
    "MemoryEnded",
    "MemoryWatchdog",
    "cgroup_meminfo",
    "read_meminfo",
    "session_memory",
]

log = logging.getLogger(__name__)

#: Seconds between two readings of /proc/meminfo while a live session is open.
CHECK_EVERY = 1.0
#: Sessions ended for memory that are remembered, so that their next call is told why.
REMEMBERED = 1000


class MemInfo(NamedTuple):
    """The host's memory, in bytes: ``MemTotal`` and ``MemAvailable``."""

    total: int
    available: int


def read_meminfo(proc: Path = Path("/proc")) -> MemInfo:
    """The memory the evaluator may still use: ``MemTotal`` and ``MemAvailable`` from
    ``/proc/meminfo``, or where a memory cgroup it is in leaves less (a container's or a pod's
    limit, which the kernel enforces first), that cgroup's (see :func:`cgroup_meminfo`)."""
    values = {}
    for line in (proc / "meminfo").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in ("MemTotal", "MemAvailable"):
            values[name] = int(rest.split()[0]) * 1024
    host = MemInfo(values["MemTotal"], values["MemAvailable"])
    bounded = cgroup_meminfo(proc / "self")
    return bounded if bounded is not None and bounded.available < host.available else host


def cgroup_meminfo(process: Path = Path("/proc/self")) -> MemInfo | None:
    """The tightest memory limit of ``process``'s cgroup and its ancestors (v1
    ``memory.limit_in_bytes``, else v2 ``memory.max``), as that limit and what is left below
    it; ``None`` where none is set or none can be read.

    What is left is the limit less the usage, the inactive file cache excepted (the kernel
    reclaims it before it kills: what kubelet calls the working set).
    """
    found: MemInfo | None = None
    for directory, v1 in memory_cgroups(process):
        usage_file, inactive = (
            ("memory.usage_in_bytes", "total_inactive_file")
            if v1
            else ("memory.current", "inactive_file")
        )
        limit = memory_limit(directory, v1)
        if limit is None:
            continue
        try:
            usage = int((directory / usage_file).read_text())
            stat = dict(
                line.split(" ", 1) for line in (directory / "memory.stat").read_text().splitlines()
            )
            used = usage - int(stat.get(inactive, 0))
        except (OSError, ValueError):
            continue
        here = MemInfo(limit, max(0, limit - used))
        if found is None or here.available < found.available:
            found = here
    return found


def session_memory(sandbox: Sandbox) -> int:
    """Bytes the sandbox holds: its processes' resident memory that no file backs, and its
    working directory's and ``/dev/shm``'s contents (when they are tmpfs of its own)."""
    pids = descendants(sandbox.process.pid)
    held = sum(_unbacked_resident(pid) for pid in pids)
    if sandbox.workdir.mounted:
        held += _tmpfs_used(str(sandbox.workdir.access))
    host_shm = _device("/dev/shm")
    # The outer bwrap is in the host's mount namespace; the processes below it see the
    # sandbox's /dev/shm (an unsandboxed run sees the host's, which is no session's).
    for pid in sorted(pids - {sandbox.process.pid}):
        shm = f"/proc/{pid}/root/dev/shm"
        if (device := _device(shm)) is not None:
            if device != host_shm:
                held += _tmpfs_used(shm)
            break
    return held


class MemoryEnded:
    """The sessions ended for memory, the last :data:`REMEMBERED` of them, and how many."""

    def __init__(self, keep: int = REMEMBERED) -> None:
        self._keep = keep
        self._ended: OrderedDict[str, tuple[int, float]] = OrderedDict()
        #: Sessions ended for memory since the start.
        self.count = 0

    def add(self, session: str, held: int) -> None:
        """Remember that ``session`` was ended while its processes held ``held`` bytes."""
        self.count += 1
        self._ended.pop(session, None)
        self._ended[session] = (held, time.monotonic())
        while len(self._ended) > self._keep:
            self._ended.popitem(last=False)

    def reason(self, session: str, *, since: float | None = None) -> str | None:
        """Why ``session`` is not held, if it was ended for memory (after ``since``, a
        ``time.monotonic()`` reading, if given)."""
        found = self._ended.get(session)
        if found is None or (since is not None and found[1] < since):
            return None
        return (
            "ended by the evaluator because the host was running out of memory (its "
            f"processes held {found[0] // MiB} MiB, the most of any session)"
        )

    def forget(self, session: str) -> None:
        """``session`` runs again (a new interpreter): a later miss has another reason."""
        self._ended.pop(session, None)


class MemoryWatchdog:
    """Ends the largest live session while ``MemAvailable`` is below ``reserve`` of
    ``MemTotal``, one per check.

    Args:
        reserve: The share of ``MemTotal`` to keep available (0 < reserve < 1).
        sessions: The live sessions now, by id.
        end: Ends a session, given its id, its sandbox and the bytes it held; false when it
            was no longer that session (it ended, or started again, meanwhile).
        meminfo: Reads the host's memory (a seam: tests inject a low reading).
        every: Seconds between checks.
    """

    def __init__(
        self,
        reserve: float,
        sessions: Callable[[], Mapping[str, Sandbox]],
        end: Callable[[str, Sandbox, int], Awaitable[bool]],
        *,
        meminfo: Callable[[], MemInfo] = read_meminfo,
        every: float = CHECK_EVERY,
    ) -> None:
        self._reserve = reserve
        self._sessions = sessions
        self._end = end
        self._meminfo = meminfo
        self._every = every
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Check every ``every`` seconds from now on, until :meth:`aclose`."""
        if self._task is None:
            self._task = asyncio.ensure_future(self._watch())

    async def aclose(self) -> None:
        """Stop checking."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self._every)
            if not self._sessions():
                continue
            try:
                await self.check()
            except Exception:  # a failed check must not end the checks after it
                log.exception("the memory watchdog's check failed")

    async def check(self) -> str | None:
        """End the largest live session if memory is short; return its id (``None``: none)."""
        reading = self._meminfo()
        reserve = int(self._reserve * reading.total)
        if reading.available >= reserve:
            return None
        sessions = dict(self._sessions())
        sizes = await asyncio.to_thread(
            lambda: {session: session_memory(sandbox) for session, sandbox in sessions.items()}
        )
        if not sizes:
            return None
        largest = max(sizes, key=sizes.__getitem__)
        if not await self._end(largest, sessions[largest], sizes[largest]):
            return None
        log.warning(
            "memory is short (%d MiB available, below the reserve of %d MiB): ended live "
            "session %s, whose processes held %d bytes (%d MiB), the most of %d sessions",
            reading.available // MiB, reserve // MiB, largest, sizes[largest],
            sizes[largest] // MiB, len(sizes),
        )  # fmt: skip
        return largest


def _unbacked_resident(pid: int) -> int:
    """``RssAnon`` + ``RssShmem`` of a process, in bytes (0 once it is gone)."""
    held = 0
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(("RssAnon:", "RssShmem:")):
                held += int(line.split()[1]) * 1024
    return held


def _tmpfs_used(path: str) -> int:
    """Bytes a file system holds (0 if it cannot be reached)."""
    try:
        found = os.statvfs(path)
    except OSError:
        return 0
    return (found.f_blocks - found.f_bfree) * found.f_frsize


def _device(path: str) -> int | None:
    try:
        return os.stat(path).st_dev
    except OSError:
        return None
