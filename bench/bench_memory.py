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

    uv run python bench/bench_memory.py [--sessions 50] [--calls 500] [--rounds 1]
        [--before /tmp/bench-before]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import threading
import time
from collections.abc import Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import bench_load
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
KINDS = ("launcher", "bwrap", "warm agent", "interpreter")


def kind_of(pid: int) -> str | None:
    """What a descendant of the service is, from its command line (``None``: gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except (FileNotFoundError, ProcessLookupError):
        return None
    if any(arg.endswith(b"_launcher.py") for arg in argv[:4]):
        return "launcher"
    if os.path.basename(argv[0]).startswith((b"bwrap", b"bubblewrap")):
        return "bwrap"
    if any(arg.endswith(b"agent.py") for arg in argv[:2]):
        return "warm agent"
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=50)
    parser.add_argument("--calls", type=int, default=500, help="calls per load (default 500)")
    parser.add_argument("--rounds", type=int, default=1, help="loads of each service (1)")
    parser.add_argument("--before", help="a checkout of the 'before' commit, for its gateway")
    args = parser.parse_args()
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
