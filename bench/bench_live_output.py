"""Live output (issue 29): how soon a printed line reaches the client, and what a running cell
nobody reads costs the gateway.

Latency ("time from a line's print to its progress message"): a cell prints a line with its own
wall-clock time (``time.time()``: the sandbox shares the host's clock) every 100 ms for
``--seconds``; the client (the mcp SDK's, with a progress callback) notes when each progress
message arrives, and for each line it sees there for the first time, latency = arrival -
printed. Four ways, interleaved round by round so that machine noise hits them alike: the gateway
with its evaluator in-process (no ``SNEKBOX_URL``) and the gateway in front of the evaluator as a
service (``SNEKBOX_URL``), each over SSE and Streamable HTTP. Each cell runs in a session that a
first call already started (a sandbox's start is not in it). The gateway sends at most one
progress message per ``MCP_PROGRESS_INTERVAL`` (``--interval``, default 0.5 s, its own default),
gathering the lines printed in between: a line waits up to one interval, so expect p50 about
half of it, p95 near all of it, plus the hops. The last lines of a cell come in its result, not in
a progress message: "seen" counts the lines that came in progress messages, of those printed.

Idle cost ("what a running cell costs the gateway while nobody reads it"): a gateway in front of an
evaluator service (its own process, measured alone) and ``--cells`` sessions, each started by a
first call, then the evaluator left to settle (its warm sandboxes made again); the gateway's RSS
(sampled every 0.25 s) and CPU time over a ``--window`` with no cell running, then over the same
window while each session runs a cell (started with ``wait_seconds=0``: the call answers ``running``
at once) that prints a line every 100 ms and that nobody reads; then each is interrupted
(``interrupt``, whose answer carries the output left unread: its lines are counted). The evaluator
service's whole process tree (sandboxes too; RSS summed over its processes, shared pages counted in
each) is shown for context: it holds the unread output. Its concurrency is raised to ``--cells`` so
that every cell runs at once. The machine's busy CPUs over each window say how noisy it was.

    uv run python bench/bench_live_output.py [--seconds 6] [--rounds 2] [--interval 0.5]
        [--cells 4] [--window 20] [--only latency|idle]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import time
from contextlib import AsyncExitStack, ExitStack
from dataclasses import dataclass, field
from typing import Any

import httpx2
from _common import (
    ROOT,
    cpu_ticks,
    descendants,
    free_port,
    machine_busy,
    percentile,
    rounds,
    service_of,
    status_kib,
)
from mcp import Client
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult

#: A line the cells print: its number and when it was printed (``time.time()``).
LINE = re.compile(r"^L (\d+) (\d+\.\d+)$", re.MULTILINE)
#: Seconds any one tool call may take before the benchmark gives up (a loaded machine is slow).
CALL_TIMEOUT = 180.0
TICK = os.sysconf("SC_CLK_TCK")


def ticker(lines: int) -> str:
    """Code that prints ``lines`` lines, one each 100 ms, each with its wall-clock time."""
    return (
        "import time\n"
        f"for i in range({lines}):\n"
        "    print(f'L {i} {time.time():.6f}', flush=True)\n"
        "    time.sleep(0.1)\n"
    )


def connect(base_url: str, transport: str) -> Client:
    """An mcp SDK client of the gateway (as tests/support.py makes them): reads may take long."""
    if transport == "SSE":
        return Client(sse_client(f"{base_url}/sse", timeout=30, sse_read_timeout=300))
    http = httpx2.AsyncClient(timeout=httpx2.Timeout(30, read=300))
    return Client(streamable_http_client(f"{base_url}/mcp", http_client=http))


async def tool(
    client: Client, name: str, arguments: dict[str, Any], **kwargs: Any
) -> dict[str, Any]:
    """One tool call's structured content; a tool error stops the benchmark."""
    async with asyncio.timeout(CALL_TIMEOUT):
        result: CallToolResult = await client.call_tool(name, arguments, **kwargs)
    if result.is_error or not isinstance(result.structured_content, dict):
        raise RuntimeError(f"{name} failed: {result.content}")
    return result.structured_content


# --- Latency ------------------------------------------------------------------------------------


@dataclass
class Way:
    """One way in (a gateway, a transport): its client, session and what it measured."""

    client: Client
    session_id: str = ""
    latencies: list[float] = field(default_factory=list)  # seconds
    seen: int = 0
    printed: int = 0
    messages: int = 0


async def one_cell(way: Way, lines: int, seconds: float) -> None:
    """Run one ticking cell in ``way``'s session, noting each line's latency (see the docstring)."""
    first_seen: set[int] = set()

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        arrived = time.time()
        way.messages += 1
        for match in LINE.finditer(message or ""):
            number = int(match[1])
            if number not in first_seen:
                first_seen.add(number)
                way.latencies.append(arrived - float(match[2]))

    arguments = {
        "code": ticker(lines),
        "session_id": way.session_id,
        "timeout_seconds": seconds + 120,
    }
    found = await tool(way.client, "execute_python_code", arguments, progress_callback=on_progress)
    if found["status"] != "ok":
        raise RuntimeError(f"the cell ended {found['status']}: {found.get('message')}")
    way.seen += len(first_seen)
    way.printed += len(LINE.findall(found["stdout"]))


async def measure_latency(gateways: dict[str, str], seconds: float, n: int) -> dict[str, Way]:
    """``gateways``: a name for each gateway's URL; each is called over both transports, ``n``
    cells each way, interleaved."""
    lines = max(round(seconds / 0.1), 1)
    ways: dict[str, Way] = {}
    async with AsyncExitStack() as stack:
        for name, url in gateways.items():
            for transport in ("SSE", "HTTP"):
                client = await stack.enter_async_context(connect(url, transport))
                ways[f"{name} {transport}"] = Way(client)
        for way in ways.values():  # a session each, its interpreter started
            found = await tool(way.client, "execute_python_code", {"code": "print(1)"})
            way.session_id = found["session_id"]
        for order in rounds(list(ways.values()), n):
            for way in order:
                await one_cell(way, lines, seconds)
    return ways


def latency(args: argparse.Namespace) -> None:
    eval_port = free_port()
    env = {"MCP_PROGRESS_INTERVAL": str(args.interval)}
    with ExitStack() as stack:
        stack.enter_context(service_of(ROOT, "evaluator", eval_port))
        gateways = {}
        for name, extra in (
            ("in-process", {}),
            ("service", {"SNEKBOX_URL": f"http://127.0.0.1:{eval_port}"}),
        ):
            port = free_port()
            stack.enter_context(service_of(ROOT, "python_mcp_server", port, env=env | extra))
            gateways[name] = f"http://127.0.0.1:{port}"
        ways = asyncio.run(measure_latency(gateways, args.seconds, args.rounds))

    print(
        f"latency from a line's print to its progress message: a line each 100 ms for "
        f"{args.seconds:g} s, {args.rounds} cells each way, interleaved; MCP_PROGRESS_INTERVAL "
        f"{args.interval:g} s; times in ms"
    )
    print(
        f"{'way':<18}{'p50':>8}{'p95':>8}{'max':>8}{'seen/printed':>14}{'messages':>10}"
        f"{'s between':>11}"
    )
    for name, way in ways.items():
        between = args.seconds * args.rounds / way.messages if way.messages else float("nan")
        if way.latencies:
            ms = [value * 1000 for value in way.latencies]
            p50, p95, top = statistics.median(ms), percentile(ms, 95), max(ms)
            figures = f"{p50:8.0f}{p95:8.0f}{top:8.0f}"
        else:
            figures = f"{'-':>8}{'-':>8}{'-':>8}"
        print(
            f"{name:<18}{figures}{f'{way.seen}/{way.printed}':>14}{way.messages:>10}"
            f"{between:>11.2f}"
        )
    print(
        "(seen: lines that came in a progress message; the rest came only in the result. "
        "s between: the cells' seconds over their messages)"
    )


# --- Idle cost ----------------------------------------------------------------------------------


@dataclass
class Window:
    """What a window measured: RSS samples (KiB) of the gateway and of the evaluator's tree,
    their CPU time, the machine's."""

    seconds: float = 0.0
    gateway_rss: list[int] = field(default_factory=list)
    evaluator_rss: list[int] = field(default_factory=list)
    gateway_cpu: float = 0.0  # seconds
    evaluator_cpu: float = 0.0
    machine_cpu: float = 0.0


async def sample(window: float, gateway: int, evaluator: int) -> Window:
    """Watch both processes (the evaluator with its descendants) for ``window`` seconds."""

    def tree() -> list[int]:
        return [evaluator, *descendants(evaluator)]

    def rss(pids: list[int]) -> int:
        return sum(status_kib(pid, "VmRSS") for pid in pids)

    found = Window()
    started, busy = time.monotonic(), machine_busy()
    gateway_ticks, evaluator_ticks = cpu_ticks([gateway]), cpu_ticks(tree())
    while (elapsed := time.monotonic() - started) < window:
        found.gateway_rss.append(status_kib(gateway, "VmRSS"))
        found.evaluator_rss.append(rss(tree()))
        await asyncio.sleep(min(0.25, max(window - elapsed, 0.0)))
    found.seconds = time.monotonic() - started
    found.gateway_cpu = (cpu_ticks([gateway]) - gateway_ticks) / TICK
    found.evaluator_cpu = (cpu_ticks(tree()) - evaluator_ticks) / TICK
    found.machine_cpu = machine_busy() - busy
    found.gateway_rss.append(status_kib(gateway, "VmRSS"))
    found.evaluator_rss.append(rss(tree()))
    return found


async def settle(evaluator: int, *, limit: float = 20.0) -> None:
    """Wait (up to ``limit`` seconds) until the evaluator is done with what the first calls
    left behind (warming the sandboxes they used up): a second in which its tree kept its
    processes and used under 5 % of a core."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        pids = [evaluator, *descendants(evaluator)]
        ticks = cpu_ticks(pids)
        await asyncio.sleep(1.0)
        now = [evaluator, *descendants(evaluator)]
        if sorted(now) == sorted(pids) and cpu_ticks(now) - ticks <= 0.05 * TICK:
            return


async def measure_idle(
    url: str, gateway: int, evaluator: int, cells: int, window: float, cell_seconds: float
) -> tuple[Window, Window, list[int]]:
    """The window with no cell running, the window with ``cells`` running unread, and how many
    lines each interrupt's answer carried."""
    async with connect(url, "HTTP") as client:
        sessions = []
        for _ in range(cells):
            found = await tool(client, "execute_python_code", {"code": "print(1)"})
            sessions.append(found["session_id"])
        await settle(evaluator)
        quiet = await sample(window, gateway, evaluator)
        lines = round(cell_seconds / 0.1)
        try:
            for session_id in sessions:
                found = await tool(
                    client,
                    "execute_python_code",
                    {"code": ticker(lines), "session_id": session_id, "wait_seconds": 0},
                )
                if found["status"] != "running":
                    raise RuntimeError(f"the cell did not run on: {found['status']}")
            await asyncio.sleep(1.0)  # each cell is printing
            running = await sample(window, gateway, evaluator)
        finally:
            left = []
            for session_id in sessions:
                try:
                    stopped = await tool(client, "interrupt", {"session_id": session_id})
                except RuntimeError as exc:  # nothing to stop (it never ran): say so, go on
                    print(f"interrupt of {session_id}: {exc}")
                    continue
                left.append(len(LINE.findall(stopped["stdout"])))
    return quiet, running, left


def idle(args: argparse.Namespace) -> None:
    cell_seconds = max(60.0, args.window + 30)
    eval_port, port = free_port(), free_port()
    concurrency = {"EVALUATOR_CONCURRENCY": str(max(args.cells, os.cpu_count() or 1))}
    with (
        service_of(ROOT, "evaluator", eval_port, env=concurrency) as evaluator,
        service_of(
            ROOT, "python_mcp_server", port, env={"SNEKBOX_URL": f"http://127.0.0.1:{eval_port}"}
        ) as gateway,
    ):
        quiet, running, left = asyncio.run(
            measure_idle(
                f"http://127.0.0.1:{port}",
                gateway.pid,
                evaluator.pid,
                args.cells,
                args.window,
                cell_seconds,
            )
        )

    print(
        f"what {args.cells} running cells nobody reads cost (each a line per 100 ms for up to "
        f"{cell_seconds:g} s, started with wait_seconds=0): {args.window:g} s windows, gateway "
        "with SNEKBOX_URL"
    )
    print(
        f"{'':<26}{'RSS start':>10}{'end':>8}{'max':>8}{'CPU %':>8}{'':4}(MiB; CPU: % of one core)"
    )

    def row(name: str, rss: list[int], cpu: float, seconds: float) -> None:
        start, end, top = (f"{kib / 1024:.1f}" for kib in (rss[0], rss[-1], max(rss)))
        print(f"{name:<26}{start:>10}{end:>8}{top:>8}{cpu / seconds * 100:>8.2f}")

    for label, found in (("no cell", quiet), (f"{args.cells} cells unread", running)):
        row(f"gateway, {label}", found.gateway_rss, found.gateway_cpu, found.seconds)
    for label, found in (("no cell", quiet), (f"{args.cells} cells unread", running)):
        row(f"evaluator, {label}", found.evaluator_rss, found.evaluator_cpu, found.seconds)
    print(
        f"machine busy: {quiet.machine_cpu / quiet.seconds:.2f} CPUs (no cell), "
        f"{running.machine_cpu / running.seconds:.2f} CPUs (cells); "
        f"lines left unread, in each interrupt's answer: {left}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--seconds", type=float, default=6.0, help="seconds each latency cell prints (default 6)"
    )
    parser.add_argument("--rounds", type=int, default=2, help="cells each way (default 2)")
    parser.add_argument(
        "--interval",
        type=float,
        default=0.5,
        help="MCP_PROGRESS_INTERVAL of the latency gateways (default 0.5, at least 0.05)",
    )
    parser.add_argument("--cells", type=int, default=4, help="cells left unread (default 4)")
    parser.add_argument(
        "--window", type=float, default=20.0, help="seconds of each idle window (default 20)"
    )
    parser.add_argument("--only", choices=["latency", "idle"], help="one part alone")
    args = parser.parse_args()
    if args.only != "idle":
        latency(args)
    if args.only != "latency":
        if args.only is None:
            print()
        idle(args)


if __name__ == "__main__":
    main()
