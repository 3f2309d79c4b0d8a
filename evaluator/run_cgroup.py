"""One run's cgroup: its CPU weight, its OOM count, and a sure way to kill its processes.

Made by :meth:`.cgroups.Cgroups.create` (one directory per v1 hierarchy, or a single v2 one);
removed once the run's processes are gone.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
from pathlib import Path

__all__ = ["LEAST_WEIGHT", "RunCgroup"]

#: The least CPU weight of a cgroup (v1 cpu.shares, v2 cpu.weight).
LEAST_WEIGHT = {"cpu.shares": "2", "cpu.weight": "1"}


class RunCgroup:
    """The cgroup directories of one run (one per v1 hierarchy, or a single v2 one).

    ``oom_counter``: the file of the memory cgroup that counts OOM kills (v2 ``memory.events``,
    v1 ``memory.oom_control``), ``None`` when no cgroup limits the run's memory.
    """

    def __init__(
        self,
        dirs: tuple[Path, ...],
        kill_file: bool,
        oom_counter: Path | None = None,
        weight: tuple[Path, str] | None = None,
        *,
        background: bool = False,
    ) -> None:
        self.dirs = dirs
        self._kill_file = kill_file
        self._oom_counter = oom_counter
        #: The CPU weight file and the weight of every run (``None``: no cpu controller).
        self._weight = weight
        self._background = background and weight is not None

    @property
    def weighs_cpu(self) -> bool:
        """Whether a cpu controller weighs it: :meth:`background` then lowers its share."""
        return self._weight is not None

    def foreground(self) -> None:
        """Give a cgroup made or put in the background the CPU weight of every run."""
        if self._weight is not None and self._background:
            file, value = self._weight
            file.write_text(value)
            self._background = False

    def background(self) -> None:
        """Give it the least CPU weight: its processes then get only CPU time that no other
        run wants (a live session between cells), until :meth:`foreground`."""
        if self._weight is not None and not self._background:
            file, _ = self._weight
            file.write_text(LEAST_WEIGHT[file.name])
            self._background = True

    @property
    def procs_files(self) -> tuple[str, ...]:
        """Files the run's first process writes its pid into, before it starts anything."""
        return tuple(str(d / "cgroup.procs") for d in self.dirs)

    def pids(self) -> set[int]:
        found: set[int] = set()
        for d in self.dirs:
            try:
                found.update(int(line) for line in (d / "cgroup.procs").read_text().split())
            except FileNotFoundError:
                continue
        return found

    def oom_kills(self) -> int | None:
        """How many of the run's processes the kernel's OOM killer ended, its memory limit
        reached; ``None`` when that is not known (no memory cgroup, a kernel older than 4.13)."""
        if self._oom_counter is None:
            return None
        try:
            lines = self._oom_counter.read_text().splitlines()
        except OSError:
            return None
        for line in lines:
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return None

    def kill(self) -> None:
        """SIGKILL every process in the cgroup (a fork racing with this is caught next time)."""
        if self._kill_file:
            try:
                (self.dirs[0] / "cgroup.kill").write_text("1")
                return
            except OSError:
                pass
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def remove(self) -> bool:
        """Remove the directories; False while processes are still leaving (EBUSY)."""
        done = True
        for d in self.dirs:
            try:
                d.rmdir()
            except FileNotFoundError:
                continue
            except OSError as exc:
                if exc.errno != errno.EBUSY:
                    raise
                done = False
        return done
