"""The memory of the gateway and of its sandboxes, at idle and under load, before vs after.

Starts the gateway (``python -m python_mcp_server``, built-in evaluator in-process, defaults) of
this working tree and, with ``--before DIR``, of another checkout (``git worktree add
/tmp/bench-before 39914de``: the commit before warm sandboxes), both at once, and reads from
``/proc`` the resident memory (RSS) of each service process and of all its descendants: the
sandboxes made ahead of their runs (their launchers waiting; after warm sandboxes, also bwrap
and the agents with their modules imported) and, under load, those running.

- idle: once a call has been made and the service's process tree has used no CPU for
  :data:`QUIET` seconds (its sandboxes made, the warm ones warm), RSS by kind of process, and
  PSS (``/proc/<pid>/smaps_rollup``: shared pages split among the processes that map them,
  which RSS counts in full in each);
- under load: the load of ``bench_load.py`` (``--sessions`` MCP sessions, half SSE and half
  Streamable HTTP, ``--calls`` calls of ``print(<token>)`` in all, every result checked),
  against one service at a time (the order alternates round by round), sampling the service's
  RSS and the total RSS of its descendants every 50 ms: the peaks, and the service's VmHWM;
- idle again after the load, as at first.

There is no target: the numbers say what warm sandboxes cost (``after/before``).

First (``--only at-rest``: only this, ~20 s), what one sandbox holds at rest: an evaluator
service of this tree (``python -m evaluator``, defaults but ``--count`` warm sandboxes), its
``--count`` warm sandboxes side by side (and its started ones, nothing imported), then
``--count`` live sessions, each after its first cell (imports numpy, pandas,
matplotlib.pyplot and saves a plot), beside the warm sandboxes made again. Per sandbox (the
mean): RSS, PSS, USS (Private_Clean + Private_Dirty) and Shared_* of
``/proc/<pid>/smaps_rollup`` summed over its processes (bwrap, its init, the agent), what its
memory cgroup is charged, and the agent's memory by kind of mapping (``/proc/<pid>/smaps``):
anonymous, shared libraries by owner, other files. PSS against RSS says what is shared with the
other sandboxes (and any process mapping the same files); ``bench_memory_sharing.py`` measures
what could be shared beyond that.

    uv run python bench/bench_memory.py [--sessions 50] [--calls 500] [--rounds 1]
        [--before /tmp/bench-before] [--count 4] [--only at-rest|load]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import bench_load
import httpx
from _common import (
    ROOT,
    before_checkout,
    cpu_ticks,
    descendants,
    free_port,
    percentile,
    service_of,
    status_kib,
)
from mcp import Client

#: Seconds a load may take in all (bench_load.py's bound is 600).
LOAD_LIMIT = 200.0
#: Seconds without CPU use, by the whole process tree, that make a service idle.
QUIET = 1.5
IDLE_TIMEOUT = 90.0
ADMISSION = {"MCP_MAX_WAITING": "100", "MCP_MAX_WAIT": "120"}  # as bench_load.py: none refused
#: How the agent's file ends (``agent.pyc``, compiled into the sandbox's /run; once a script).
AGENT = (b"agent.py", b"agent.pyc")
KINDS = ("launcher", "bwrap", "warm agent", "started agent", "interpreter")


def kind_of(pid: int) -> str | None:
    """What a descendant of the service is, from its command line (``None``: gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except (FileNotFoundError, ProcessLookupError):
        return None
    if any(arg.endswith((b"_launcher.py", b"_launcher.pyc")) for arg in argv[:4]):
        return "launcher"
    if os.path.basename(argv[0]).startswith((b"bwrap", b"bubblewrap")):
        return "bwrap"
    if any(arg.endswith(AGENT) for arg in argv[:2]):
        # A started sandbox's agent imports nothing: no module follows it (see evaluator.pool).
        at = next(i for i, arg in enumerate(argv) if arg.endswith(AGENT))
        return "warm agent" if any(argv[at + 1 :]) else "started agent"
    return "interpreter"


def pss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


@dataclass
class Idle:
    """One reading of an idle service: KiB by kind of process, and how many of each."""

    service_rss: int
    service_pss: int
    rss: dict[str, int] = field(default_factory=dict)
    pss: dict[str, int] = field(default_factory=dict)
    count: dict[str, int] = field(default_factory=dict)
    waited: float = 0.0

    def processes(self) -> str:
        return " + ".join(f"{n} {kind}" for kind in KINDS if (n := self.count[kind])) or "none"


def wait_idle(pid: int) -> float:
    """Seconds until ``pid``'s tree has used no CPU for :data:`QUIET` s (its processes the same)."""
    started = time.monotonic()
    last: tuple[list[int], int] | None = None
    quiet_since = time.monotonic()
    while time.monotonic() - started < IDLE_TIMEOUT:
        tree = sorted(descendants(pid))
        now = (tree, cpu_ticks([pid, *tree]))
        if now != last:
            last, quiet_since = now, time.monotonic()
        elif time.monotonic() - quiet_since >= QUIET:
            return time.monotonic() - started
        time.sleep(0.1)
    raise SystemExit(f"the service {pid} did not become idle within {IDLE_TIMEOUT:g} s")


def read_idle(pid: int) -> Idle:
    waited = wait_idle(pid)
    idle = Idle(status_kib(pid, "VmRSS"), pss_kib(pid), waited=waited)
    for each in KINDS:
        idle.rss[each] = idle.pss[each] = idle.count[each] = 0
    for child in descendants(pid):
        if (kind := kind_of(child)) is None:
            continue
        idle.rss[kind] += status_kib(child, "VmRSS")
        idle.pss[kind] += pss_kib(child)
        idle.count[kind] += 1
    return idle


class Sampler:
    """Peaks of the service's RSS and of its descendants' total RSS, sampled every 50 ms."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.service = 0
        self.children = 0
        self.processes = 0
        self.together = 0  # service + descendants, in one sample
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            service = status_kib(self.pid, "VmRSS")
            children = descendants(self.pid)
            total = sum(status_kib(c, "VmRSS") for c in children)
            self.service = max(self.service, service)
            self.children = max(self.children, total)
            self.together = max(self.together, service + total)
            self.processes = max(self.processes, len(children))

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()


@dataclass
class Loaded:
    service: int
    hwm: int
    children: int
    together: int
    processes: int
    calls_per_s: float
    p50_ms: float
    problems: int
    failed: str = ""


async def one_call(url: str) -> None:
    async with Client(f"{url}/mcp") as client:
        result = await client.call_tool("execute_python_code", {"code": "print(1)"})
        if result.is_error:
            raise SystemExit(f"the first call failed: {result}")


def under_load(pid: int, url: str, sessions: int, calls: int) -> Loaded:
    """The peaks under bench_load.py's load; a load that failed keeps those seen until then."""
    bench_load.OVERALL_LIMIT = LOAD_LIMIT
    with Sampler(pid) as sampler:
        try:
            tally, total = asyncio.run(bench_load.load(url, sessions, calls))
        except Exception as exc:  # a session that could not connect, the bound exceeded
            causes = exc.exceptions if isinstance(exc, BaseExceptionGroup) else [exc]
            failed = ", ".join(sorted({_innermost(cause) for cause in causes}))
            h, c, t, p = sampler.service, sampler.children, sampler.together, sampler.processes
            return Loaded(h, status_kib(pid, "VmHWM"), c, t, p, 0.0, 0.0, calls, failed)
    ok = sum(tally.seen.values())
    duplicated = sum(1 for n in tally.seen.values() if n > 1)
    return Loaded(
        sampler.service,
        status_kib(pid, "VmHWM"),
        sampler.children,
        sampler.together,
        sampler.processes,
        len(tally.latencies) / total,
        percentile([s * 1000 for s in tally.latencies], 50) if tally.latencies else 0.0,
        calls - ok + duplicated,  # lost, mixed up, refused as busy, failed
    )


def _innermost(exc: BaseException) -> str:
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return type(exc).__name__ + (f": {exc}" if str(exc) else "")


# --- One sandbox at rest: what it holds, and what of it is shared -------------------------------

#: Written by the first cell of each live session into its working directory: the agents whose
#: working directory holds it are the sessions' (the others are warm sandboxes waiting).
MARKER = "bench-memory-session"
FIRST_CELL = (
    "import numpy as np, pandas as pd, matplotlib.pyplot as plt\n"
    "frame = pd.DataFrame({'x': np.arange(100), 'y': np.random.default_rng(1).normal(size=100)})\n"
    "frame.plot(x='x', y='y')\n"
    "plt.savefig('plot.png')\n"
    f"open({MARKER!r}, 'w').close()\n"
    "print('ok')\n"
)
#: smaps_rollup fields read (KiB); USS is Private_Clean + Private_Dirty.
ROLLUP = ("Rss", "Pss", "Shared_Clean", "Shared_Dirty", "Private_Clean", "Private_Dirty")
SETTLE_TIMEOUT = 180.0
#: Shared libraries (and the interpreter's executable) by owner: the first whose marks are in
#: the path (a package's wheel-bundled libraries, e.g. ``numpy.libs``, go with it).
LIBRARY_OWNERS = (
    ("numpy", ("/numpy/", "/numpy.libs/")),
    ("pandas", ("/pandas/", "/pandas.libs/")),
    (
        "matplotlib, PIL, kiwisolver, contourpy",
        (
            "/matplotlib/",
            "/matplotlib.libs/",
            "/PIL/",
            "/pillow.libs/",
            "/kiwisolver",
            "/contourpy",
        ),
    ),
    ("python: libpython, lib-dynload, executable", ("/libpython", "/lib-dynload/", "/bin/python")),
    ("system: libc, libstdc++, libcrypto...", ("/usr/lib", "/lib/", "/lib64/")),
)
MAPPING_KINDS = (
    "anon: [heap] (malloc)",
    "anon: mmap'd (pymalloc arenas, big blocks)",
    "anon: stacks",
    *(f"lib: {owner}" for owner, _ in LIBRARY_OWNERS),
    "lib: other",
    "other files (and [vdso])",
)


@dataclass
class Usage:
    """KiB of one process or mapping kind: resident, proportional, private (USS)."""

    rss: int = 0
    pss: int = 0
    uss: int = 0
    shared_clean: int = 0
    shared_dirty: int = 0

    def add(self, fields: Mapping[str, int]) -> None:
        self.rss += fields.get("Rss", 0)
        self.pss += fields.get("Pss", 0)
        self.uss += fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0)
        self.shared_clean += fields.get("Shared_Clean", 0)
        self.shared_dirty += fields.get("Shared_Dirty", 0)

    def __iadd__(self, other: Usage) -> Usage:
        for name in ("rss", "pss", "uss", "shared_clean", "shared_dirty"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        return self


def rollup(pid: int) -> Usage:
    """A process's memory from ``/proc/<pid>/smaps_rollup`` (zero once it is gone)."""
    usage = Usage()
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            usage.add(_fields(f))
    except (FileNotFoundError, ProcessLookupError):
        pass
    return usage


def _fields(lines: Iterable[str]) -> dict[str, int]:
    fields = {}
    for line in lines:
        name, _, rest = line.partition(":")
        if name in ROLLUP:
            fields[name] = int(rest.split()[0])
    return fields


def mapping_kind(path: str) -> str:
    """Which of :data:`MAPPING_KINDS` a mapping of ``path`` (smaps' last column) is."""
    if not path or path.startswith("[anon"):
        return MAPPING_KINDS[1]
    if path == "[heap]":
        return MAPPING_KINDS[0]
    if path.startswith("[stack"):
        return MAPPING_KINDS[2]
    if path.startswith("["):  # [vdso], [vvar], [vsyscall]
        return MAPPING_KINDS[-1]
    if re.search(r"\.so(\.[0-9.]+)?$", path) or "/bin/python" in path:
        for owner, marks in LIBRARY_OWNERS:
            if any(mark in path for mark in marks):
                return f"lib: {owner}"
        return "lib: other"
    return MAPPING_KINDS[-1]


def by_mapping(pid: int) -> dict[str, Usage]:
    """A process's memory by kind of mapping, from ``/proc/<pid>/smaps``."""
    kinds = {kind: Usage() for kind in MAPPING_KINDS}
    try:
        with open(f"/proc/{pid}/smaps") as f:
            text = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return kinds
    kind, lines = MAPPING_KINDS[1], list[str]()
    for line in [*text.splitlines(), "0-0 ---p 0 0:0 0"]:  # a last header flushes the last one
        head = line.split(maxsplit=5)
        if len(head) >= 5 and "-" in head[0] and not head[0].endswith(":"):
            kinds[kind].add(_fields(lines))
            kind, lines = mapping_kind(head[5].strip() if len(head) > 5 else ""), []
        else:
            lines.append(line)
    return kinds


@dataclass
class SandboxReading:
    """One sandbox at rest: its processes' memory (the agent's by kind of mapping), its cgroup's."""

    agent: int
    processes: Usage
    python: Usage
    bwrap: Usage
    kinds: dict[str, Usage]
    cgroup: int  # KiB charged to its memory cgroup (what its limit counts), 0: unknown


def agents_of(service: int, kind: str = "warm agent") -> list[int]:
    """The interpreters of the service's warm sandboxes and live sessions (``_agent.py``), or
    of its started sandboxes (``kind="started agent"``)."""
    return [pid for pid in descendants(service) if kind_of(pid) == kind]


def is_session(agent: int) -> bool:
    """Whether ``agent`` is a live session's (its first cell wrote :data:`MARKER`)."""
    return os.path.exists(f"/proc/{agent}/cwd/{MARKER}")


def parent_of(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return 0


def cgroup_kib(pid: int) -> int:
    """What the memory cgroup (v1) of ``pid`` is charged, in KiB; 0 where there is none."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            path = next(line.split(":", 2)[2].strip() for line in f if ":memory:" in line)
        with open(f"/sys/fs/cgroup/memory{path}/memory.usage_in_bytes") as f:
            return int(f.read()) // 1024
    except (OSError, StopIteration, ValueError):
        return 0


def read_sandbox(service: int, agent: int) -> SandboxReading:
    """The sandbox of ``agent``: it and its ancestors below the service (bwrap, its init)."""
    processes, bwrap = rollup(agent), Usage()
    pid = parent_of(agent)
    while pid not in (0, 1, service):
        processes += (one := rollup(pid))
        bwrap += one
        pid = parent_of(pid)
    return SandboxReading(
        agent, processes, rollup(agent), bwrap, by_mapping(agent), cgroup_kib(agent)
    )


def settle(service: int, warm: int, sessions: int) -> tuple[list[int], list[int]]:
    """The agents of ``warm`` warm sandboxes and ``sessions`` live sessions, once they are all
    there and the service's tree is idle (see :func:`wait_idle`)."""
    deadline = time.monotonic() + SETTLE_TIMEOUT
    while True:
        wait_idle(service)
        agents = agents_of(service)
        live = [pid for pid in agents if is_session(pid)]
        waiting = [pid for pid in agents if pid not in live]
        if len(waiting) >= warm and len(live) >= sessions:
            return waiting[:warm], live[:sessions]
        if time.monotonic() > deadline:
            raise SystemExit(
                f"after {SETTLE_TIMEOUT:g} s: {len(waiting)} warm sandboxes (of {warm}), "
                f"{len(live)} live sessions (of {sessions})"
            )
        time.sleep(0.5)


def start_session(url: str, name: str) -> None:
    answer = httpx.post(
        f"{url}/eval", json={"input": FIRST_CELL, "session": name}, timeout=180, trust_env=False
    )
    result = answer.json()
    if answer.status_code != 200 or result.get("returncode") != 0:
        raise SystemExit(f"the first cell of session {name} failed: {answer.status_code} {result}")


@dataclass
class AtRest:
    """``count`` warm sandboxes side by side, then as many live sessions (and warm sandboxes made
    again) side by side."""

    count: int
    warm: list[SandboxReading]
    started: list[SandboxReading]
    live: list[SandboxReading]
    warm_beside_live: list[SandboxReading]
    seconds: float


def sandboxes_at_rest(count: int) -> AtRest:
    """An evaluator service (this tree's, defaults but ``count`` warm sandboxes): its warm
    sandboxes read at rest; then ``count`` live sessions started (each takes a warm sandbox,
    which is made again), each after its first cell, read at rest beside the new warm ones."""
    started = time.monotonic()
    port = free_port()
    env = {"EVALUATOR_WARM_SANDBOXES": str(count)}
    with service_of(ROOT, "evaluator", port, env=env) as process:
        url = f"http://127.0.0.1:{port}"
        result = httpx.post(f"{url}/eval", json={"input": "print(1)"}, timeout=60, trust_env=False)
        if result.status_code != 200:
            raise SystemExit(f"the first run failed: {result.status_code} {result.text}")
        warm, _ = settle(process.pid, count, 0)
        warm_readings = [read_sandbox(process.pid, agent) for agent in warm]
        started_readings = [
            read_sandbox(process.pid, agent) for agent in agents_of(process.pid, "started agent")
        ]
        for i in range(count):
            start_session(url, f"bench-memory-{i}")
        warm, live = settle(process.pid, count, count)
        beside = [read_sandbox(process.pid, agent) for agent in warm]
        live_readings = [read_sandbox(process.pid, agent) for agent in live]
    return AtRest(
        count, warm_readings, started_readings, live_readings, beside, time.monotonic() - started
    )


def sum_of(usages: list[Usage]) -> Usage:
    total = Usage()
    for usage in usages:
        total += usage
    return total


def mean(usages: list[Usage]) -> Usage:
    total = Usage()
    for usage in usages:
        total += usage
    n = max(1, len(usages))
    return Usage(*(value // n for value in vars(total).values()))


def report_at_rest(rest: AtRest) -> None:
    def mib(kib: float) -> str:
        return f"{kib / 1024:8.1f}"

    n = rest.count
    groups = (
        (f"warm sandbox ({n} side by side)", rest.warm),
        (f"started sandbox ({len(rest.started)}, nothing imported)", rest.started),
        (f"live session after its first cell ({n} + {n} warm)", rest.live),
        (f"warm sandbox beside the {n} sessions", rest.warm_beside_live),
    )
    print(
        f"one sandbox at rest, MiB (the mean of {n}; smaps_rollup summed over its processes; "
        f"USS = Private_Clean + Private_Dirty; {rest.seconds:.0f} s)"
    )
    print(f"{'':<52}{'RSS':>8}{'PSS':>8}{'USS':>8}{'Sh_Clean':>9}{'Sh_Dirty':>9}{'cgroup':>8}")
    for label, readings in groups:
        cgroup = sum(r.cgroup for r in readings) / max(1, len(readings))
        for part, usages in (
            (label, [r.processes for r in readings]),
            ("  python (the agent)", [r.python for r in readings]),
            ("  bwrap + its init (pid 1 inside)", [r.bwrap for r in readings]),
        ):
            usage = mean(usages)
            print(
                f"{part:<52}{mib(usage.rss)}{mib(usage.pss)}{mib(usage.uss)}"
                f" {mib(usage.shared_clean)} {mib(usage.shared_dirty)}"
                + (mib(cgroup) if part == label else "")
            )
    print("the python process by kind of mapping, MiB (shared = RSS - USS; PSS/RSS: how shared)")
    print(f"{'':<52}{'warm':>8}{'':>16}{'live':>8}")
    print(f"{'':<52}" + f"{'RSS':>8}{'PSS':>8}{'USS':>8}" * 2)
    for kind in MAPPING_KINDS:
        cells = ""
        for readings in (rest.warm, rest.live):
            usage = mean([r.kinds[kind] for r in readings])
            cells += f"{mib(usage.rss)}{mib(usage.pss)}{mib(usage.uss)}"
        print(f"  {kind:<50}{cells}")
    anonymous = [kind for kind in MAPPING_KINDS if kind.startswith("anon")]
    files = [kind for kind in MAPPING_KINDS if kind not in anonymous]
    for label, kinds in (("anonymous, all", anonymous), ("file-backed, all", files)):
        cells = ""
        for readings in (rest.warm, rest.live):
            usage = mean([sum_of([r.kinds[kind] for kind in kinds]) for r in readings])
            cells += f"{mib(usage.rss)}{mib(usage.pss)}{mib(usage.uss)}"
        print(f"  {label:<50}{cells}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=50)
    parser.add_argument("--calls", type=int, default=500, help="calls per load (default 500)")
    parser.add_argument("--rounds", type=int, default=1, help="loads of each service (1)")
    parser.add_argument("--before", help="a checkout of the 'before' commit, for its gateway")
    parser.add_argument(
        "--count", type=int, default=4, help="sandboxes side by side, at rest (default 4)"
    )
    parser.add_argument("--only", choices=("at-rest", "load"), help="one part only")
    args = parser.parse_args()
    if args.only != "load":
        report_at_rest(sandboxes_at_rest(args.count))
        if args.only == "at-rest":
            return
        print()
    before = before_checkout(args.before)

    checkouts = {"after": ROOT} | ({"before": before} if before else {})
    names = list(checkouts)[::-1]  # before first
    first: dict[str, Idle] = {}
    loaded: dict[str, list[Loaded]] = {name: [] for name in names}
    last: dict[str, Idle] = {}
    with ExitStack() as stack:
        pids, urls = {}, {}
        for name in names:
            port = free_port()
            process = stack.enter_context(
                service_of(checkouts[name], "python_mcp_server", port, env=ADMISSION)
            )
            pids[name], urls[name] = process.pid, f"http://127.0.0.1:{port}"
        for name in names:
            asyncio.run(one_call(urls[name]))
        for name in names:
            first[name] = read_idle(pids[name])
        for round_ in range(args.rounds):
            for name in names if round_ % 2 == 0 else names[::-1]:
                wait_idle(pids[name])
                loaded[name].append(under_load(pids[name], urls[name], args.sessions, args.calls))
        for name in names:
            last[name] = read_idle(pids[name])

    report(checkouts, names, first, loaded, last, args)
    if any(load.problems for runs in loaded.values() for load in runs):
        sys.exit(1)


def report(
    checkouts: Mapping[str, Path],
    names: list[str],
    first: dict[str, Idle],
    loaded: dict[str, list[Loaded]],
    last: dict[str, Idle],
    args: argparse.Namespace,
) -> None:
    def mib(kib: float) -> str:
        return f"{kib / 1024:9.1f}"

    ratio = "before" in names

    def row(label: str, values: dict[str, float], note: str = "") -> None:
        line = f"{label:<44}" + "".join(mib(values[name]) for name in names)
        if ratio:
            line += (
                f"{values['after'] / values['before']:9.2f}" if values["before"] else f"{'-':>9}"
            )
        print(line + note)

    print(f"gateway memory, MiB (RSS from /proc; {os.cpu_count()} CPUs; built-in evaluator)")
    for name in names:
        print(f"  {name}: {checkouts[name]}")
    print(
        f"{'':<44}" + "".join(f"{name:>9}" for name in names) + (f"{'ratio':>9}" if ratio else "")
    )
    for when, idle in (("idle", first), ("idle after the loads", last)):
        counts = ", ".join(f"{name}: {idle[name].processes()}" for name in names)
        waited = ", ".join(f"{name} {idle[name].waited:.1f} s" for name in names)
        print(f"{when} (quiet after: {waited})")
        row("  service RSS", {n: idle[n].service_rss for n in names})
        row("  service PSS", {n: idle[n].service_pss for n in names})
        for kind in KINDS:
            if any(idle[n].count[kind] for n in names):
                row(f"  {kind} RSS (all of them)", {n: idle[n].rss[kind] for n in names})
        row("  sandboxes RSS, total", {n: sum(idle[n].rss.values()) for n in names})
        row("  sandboxes PSS, total", {n: sum(idle[n].pss.values()) for n in names})
        row(
            "  service + sandboxes RSS",
            {n: idle[n].service_rss + sum(idle[n].rss.values()) for n in names},
        )
        print(f"  processes: {counts}")
    print(
        f"under load ({args.sessions} sessions, {args.calls} calls of print(<token>), "
        f"{args.rounds} round(s); the peak of the rounds)"
    )
    row("  service RSS, peak sampled", {n: max(x.service for x in loaded[n]) for n in names})
    row("  service VmHWM", {n: max(x.hwm for x in loaded[n]) for n in names})
    row("  sandboxes RSS, peak total", {n: max(x.children for x in loaded[n]) for n in names})
    row(
        "  service + sandboxes RSS, peak (one sample)",
        {n: max(x.together for x in loaded[n]) for n in names},
    )
    for name in names:
        runs = loaded[name]
        print(
            f"  {name}: at most {max(x.processes for x in runs)} processes below the service; "
            + "; ".join(
                f"{x.calls_per_s:.1f} calls/s, p50 {x.p50_ms:.0f} ms" for x in runs if not x.failed
            )
            + "".join(f"; {x.problems} calls FAILED or refused" for x in runs if x.problems)
            + "".join(f"; a load FAILED ({x.failed})" for x in runs if x.failed)
        )


if __name__ == "__main__":
    main()
