"""Where runs' cgroups are made (v2, else v1, else none) with their memory, process and CPU limits.

cgroup v2 is used where this process may create children with the memory and pids controllers (a
delegated subtree; cpu too where delegated); else cgroup v1's memory, pids and cpu hierarchies
where they are writable (as root on hosts like this one); else nothing, and the jail falls back
to rlimits. Each run gets ``<hierarchy>/<name>/<service pid>-<n>``; directories left by a
service that died are swept at start. A hierarchy is used only once a trial run cgroup could be
made in it, with its limits: the parent directory may exist yet belong to another user (made by
root, the service run as a user). One run's cgroup is a :class:`.run_cgroup.RunCgroup`.
"""

from __future__ import annotations

import errno
import itertools
import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from .procfs import alive
from .run_cgroup import LEAST_WEIGHT, RunCgroup

__all__ = ["NO_LIMIT", "Cgroups", "RunCgroup", "memory_cgroups", "own_memory_limit"]

log = logging.getLogger(__name__)

_RUN_NAME = re.compile(r"(\d+)-\d+")
_CPU_PERIOD = 100_000  # microseconds
# Where a v2 service moves itself, so that its own cgroup may hand controllers to the runs.
_SERVICE_LEAF = "service"
# Shared by every Cgroups of this process, so that two evaluators never pick the same name.
_run_numbers = itertools.count(1)


@dataclass(frozen=True)
class _Hierarchy:
    """One place where run cgroups are created, and the limit files written in each."""

    parent: Path
    limits: tuple[tuple[str, str], ...]
    kill_file: bool


class Cgroups:
    """The cgroup support of this machine, and the factory of run cgroups."""

    def __init__(self, hierarchies: dict[str, _Hierarchy], version: int | None) -> None:
        self._hierarchies = hierarchies
        self.version = version

    @classmethod
    def detect(cls, name: str, memory_bytes: int, pids_max: int, cpus: float) -> Cgroups:
        """Find where run cgroups can be created, preferring v2; never raises.

        ``cpus``: the CPU quota of each run; every run also gets the default weight, so that
        runs share the CPU fairly whatever number of processes each one has.
        """
        mounts = _cgroup_mounts()
        quota = max(1000, round(cpus * _CPU_PERIOD))
        v2 = _setup_v2(mounts, name, memory_bytes, pids_max, quota)
        if v2 is not None and _usable(v2, "cgroup v2"):
            controllers = {"memory": v2, "pids": v2}
            if any(file == "cpu.max" for file, _ in v2.limits):
                controllers["cpu"] = v2
            return cls(controllers, 2)
        found: dict[str, _Hierarchy] = {}
        for controller, limits in (
            ("memory", _v1_memory_limits(memory_bytes)),
            ("pids", (("pids.max", str(pids_max)),)),
            (
                "cpu",
                (
                    ("cpu.shares", "1024"),
                    ("cpu.cfs_period_us", str(_CPU_PERIOD)),
                    ("cpu.cfs_quota_us", str(quota)),
                ),
            ),
        ):
            root = mounts.get(controller)
            own = _own_v1_cgroup(controller)
            if root is None or own is None:
                continue
            # Below this process's own cgroup, so that a limit set on the service (its
            # container, its systemd unit) covers its sandboxes too.
            parent = root / own.lstrip("/") / name
            try:
                parent.mkdir(exist_ok=True)
            except OSError as exc:
                log.info("cgroup v1 %s at %s is not usable: %s", controller, parent, exc)
                continue
            if controller == "memory" and not (root / "memory.memsw.limit_in_bytes").exists():
                limits = limits[:1]
            hierarchy = _Hierarchy(parent, limits, kill_file=False)
            if _usable(hierarchy, f"cgroup v1 {controller}"):
                found[controller] = hierarchy
        return cls(found, 1 if found else None)

    @property
    def memory(self) -> str | None:
        """How memory is limited, or ``None`` when no cgroup does it."""
        if "memory" not in self._hierarchies:
            return None
        if self.version == 2:
            return "cgroup v2 memory.max, memory.swap.max=0"
        files = [f for f, _ in self._hierarchies["memory"].limits]
        return "cgroup v1 " + " + ".join(files)

    @property
    def pids(self) -> str | None:
        """How processes are limited, or ``None`` when no cgroup does it."""
        if "pids" not in self._hierarchies:
            return None
        return f"cgroup v{self.version} pids.max"

    @property
    def cpu(self) -> str | None:
        """How the CPU is shared, or ``None`` when no cgroup does it."""
        if "cpu" not in self._hierarchies:
            return None
        if self.version == 2:
            return "cgroup v2 cpu.weight (equal for every run) and cpu.max"
        return "cgroup v1 cpu.shares (equal for every run) and cpu.cfs_quota_us"

    def create(self, *, background: bool = False) -> RunCgroup | None:
        """Create a run's cgroup with its limits; ``None`` when there is no cgroup support.

        ``background``: with the least CPU weight, so that what it does first (a warm agent's
        imports) takes only CPU time no run wants, until :meth:`RunCgroup.foreground`.
        """
        if not self._hierarchies:
            return None
        run_name = f"{os.getpid()}-{next(_run_numbers)}"
        memory = self._hierarchies.get("memory")
        oom_counter = None
        weight: tuple[Path, str] | None = None
        dirs: list[Path] = []
        try:
            for hierarchy in {id(h): h for h in self._hierarchies.values()}.values():
                d = hierarchy.parent / run_name
                d.mkdir()
                dirs.append(d)
                for file, value in hierarchy.limits:
                    if file in LEAST_WEIGHT:
                        weight = (d / file, value)
                        value = LEAST_WEIGHT[file] if background else value
                    (d / file).write_text(value)
                if hierarchy is memory:
                    oom_counter = d / (
                        "memory.events" if self.version == 2 else "memory.oom_control"
                    )
        except OSError:
            for d in dirs:
                d.rmdir()
            raise
        return RunCgroup(tuple(dirs), self.version == 2, oom_counter, weight, background=background)

    def sweep(self) -> int:
        """Remove run cgroups left by evaluator processes that no longer exist."""
        removed = 0
        for hierarchy in {id(h): h for h in self._hierarchies.values()}.values():
            for d in hierarchy.parent.iterdir():
                match = _RUN_NAME.fullmatch(d.name)
                if match is None or not d.is_dir() or alive(int(match[1])):
                    continue
                stale = RunCgroup((d,), hierarchy.kill_file)
                try:
                    stale.kill()
                    busy = not stale.remove()
                except OSError as exc:  # another user's, say
                    log.warning("stale cgroup %s cannot be removed: %s", d, exc)
                    continue
                if busy:
                    log.warning(
                        "stale cgroup %s is still busy; it will be retried at next start", d
                    )
                else:
                    removed += 1
        return removed


def _usable(hierarchy: _Hierarchy, what: str) -> bool:
    """Whether run cgroups can be made here: try one, with its limits and ``cgroup.procs``.

    Its name is a run's that never occurs (``<pid>-0``), so a sweep removes it if it stays.
    """
    trial = hierarchy.parent / f"{os.getpid()}-0"
    try:
        trial.mkdir(exist_ok=True)
        try:
            for file, value in hierarchy.limits:
                (trial / file).write_text(value)
            if not os.access(trial / "cgroup.procs", os.W_OK):
                raise PermissionError(errno.EACCES, "cannot join", str(trial / "cgroup.procs"))
        finally:
            trial.rmdir()
    except OSError as exc:
        log.info("%s at %s is not usable, falling back: %s", what, hierarchy.parent, exc)
        return False
    return True


def _v1_memory_limits(memory_bytes: int) -> tuple[tuple[str, str], ...]:
    # memsw (memory + swap) may only be set at or above limit_in_bytes: write that one first.
    return (
        ("memory.limit_in_bytes", str(memory_bytes)),
        ("memory.memsw.limit_in_bytes", str(memory_bytes)),
    )


def _setup_v2(
    mounts: dict[str, Path], name: str, memory_bytes: int, pids_max: int, cpu_quota: int
) -> _Hierarchy | None:
    """Our own v2 cgroup, when it delegates memory and pids to children we may create."""
    root = mounts.get("cgroup2")
    own = _own_v2_cgroup()
    if root is None or own is None:
        return None
    base = root / own.lstrip("/")
    if base.name == _SERVICE_LEAF:
        base = base.parent  # moved there by an earlier evaluator of this process
    try:
        controllers = (base / "cgroup.controllers").read_text().split()
        if not {"memory", "pids"} <= set(controllers):
            return None
        wanted = {"memory", "pids"} | ({"cpu"} & set(controllers))
        enable = " ".join(f"+{c}" for c in sorted(wanted))
        enabled = (base / "cgroup.subtree_control").read_text().split()
        if not wanted <= set(enabled):
            # No internal processes: a cgroup that hands controllers to its children may hold
            # no process itself, so everything in it (this service, and whatever shares its
            # container or unit) moves into a leaf first, as Snekbox does.
            _move_all_then_enable(base, base / _SERVICE_LEAF, enable)
        parent = base / name
        parent.mkdir(exist_ok=True)
        (parent / "cgroup.subtree_control").write_text(enable)
    except OSError as exc:
        # memory and pids are offered here: this is a delegation we failed to use, say why.
        log.warning("cgroup v2 at %s is delegated but cannot be used: %s", base, exc)
        return None
    limits: tuple[tuple[str, str], ...] = (
        ("memory.max", str(memory_bytes)),
        ("memory.swap.max", "0"),
        ("pids.max", str(pids_max)),
    )
    if "cpu" in wanted:
        limits += (("cpu.weight", "100"), ("cpu.max", f"{cpu_quota} {_CPU_PERIOD}"))
    return _Hierarchy(parent, limits, kill_file=(parent / "cgroup.kill").exists())


#: Passes of moving ``source``'s processes into the leaf before enabling controllers: a process
#: that forks meanwhile (a shell's readiness loop, a health check in the same container) leaves
#: a child in ``source``, and the write to ``cgroup.subtree_control`` fails with EBUSY.
_MOVE_PASSES = 50


def _move_all_then_enable(source: Path, leaf: Path, enable: str) -> None:
    """Move every process of ``source`` into its child ``leaf``, then enable ``enable`` in it.

    Raises:
        OSError: EBUSY after :data:`_MOVE_PASSES` passes (processes keep coming), or another
            error of the writes.
    """
    leaf.mkdir(exist_ok=True)
    for attempt in range(_MOVE_PASSES):
        for pid in (source / "cgroup.procs").read_text().split():
            try:
                (leaf / "cgroup.procs").write_text(pid)
            except ProcessLookupError:
                continue  # it exited meanwhile
        try:
            (source / "cgroup.subtree_control").write_text(enable)
            return
        except OSError as exc:
            # Forked meanwhile, or exited but not yet gone from cgroup.procs: once more.
            if exc.errno != errno.EBUSY or attempt == _MOVE_PASSES - 1:
                raise
            time.sleep(0.01)


def own_memory_limit(process: Path = Path("/proc/self")) -> int | None:
    """The smallest memory limit, in bytes, on this process's cgroup and its ancestors (a
    container's ``mem_limit``, a systemd unit's ``MemoryMax``); ``None``: none is set here."""
    limits = [memory_limit(directory, v1) for directory, v1 in memory_cgroups(process)]
    return min((limit for limit in limits if limit is not None), default=None)


def memory_limit(directory: Path, v1: bool) -> int | None:
    """The memory limit, in bytes, of the cgroup ``directory``; ``None``: none, or unreadable."""
    try:
        value = (directory / ("memory.limit_in_bytes" if v1 else "memory.max")).read_text()
    except OSError:
        return None
    # v2 says "max" for none; v1, a number at or above NO_LIMIT
    return int(value) if value.strip().isdigit() and int(value) < NO_LIMIT else None


#: A memory limit at or above this is none (v1 writes 2**63 rounded down to a page for
#: "unlimited").
NO_LIMIT = 1 << 60


def memory_cgroups(process: Path = Path("/proc/self")) -> list[tuple[Path, bool]]:
    """The directories of ``process``'s memory cgroup and its ancestors up to the mount's
    root, each with whether it is v1: the v1 memory hierarchy where one is mounted (hybrid
    hosts), else the unified one."""
    try:
        mounts = [line.split() for line in (process / "mountinfo").read_text().splitlines()]
        groups = [line.split(":", 2) for line in (process / "cgroup").read_text().splitlines()]
    except OSError:
        return []
    for v1 in (True, False):
        own = next((g[2] for g in groups if len(g) == 3 and _is_memory(g[1], v1)), None)
        for fields in mounts:
            fstype, options = fields[fields.index("-") + 1], fields[fields.index("-") + 3]
            if own is None or fstype != ("cgroup" if v1 else "cgroup2"):
                continue
            if v1 and "memory" not in options.split(","):
                continue
            # The mount shows the hierarchy from its root (a container's cgroup, or "/").
            root, mount_point = Path(fields[3]), Path(fields[4])
            below = Path(own).relative_to(root) if Path(own).is_relative_to(root) else Path()
            directory = mount_point / below
            ancestors = (directory, *directory.parents)
            return [(d, v1) for d in ancestors if d.is_relative_to(mount_point)]
    return []


def _is_memory(controllers: str, v1: bool) -> bool:
    """Whether a ``/proc/<pid>/cgroup`` line's controllers are v1's memory, or v2's (none)."""
    return "memory" in controllers.split(",") if v1 else controllers == ""


def _cgroup_mounts() -> dict[str, Path]:
    """Mount points by controller (v1) and ``cgroup2`` for the unified hierarchy."""
    found: dict[str, Path] = {}
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        fields = line.split()
        sep = fields.index("-")
        fstype, options = fields[sep + 1], fields[sep + 3].split(",")
        mount_point = Path(fields[4])
        if fstype == "cgroup2":
            found.setdefault("cgroup2", mount_point)
        elif fstype == "cgroup":
            for controller in ("memory", "pids", "cpu"):
                if controller in options:
                    found.setdefault(controller, mount_point)
    return found


def _own_v1_cgroup(controller: str) -> str | None:
    """This process's cgroup in the v1 hierarchy of ``controller``."""
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if controller in controllers.split(","):
                return path
    except (OSError, ValueError):
        pass
    return None


def _own_v2_cgroup() -> str | None:
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            if line.startswith("0::"):
                return line[3:]
    except OSError:
        pass
    return None
