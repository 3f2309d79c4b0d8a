"""What the gateway costs per call beyond the MCP SDK's own, with nothing evaluated behind it.

Issue 31 compares the gateway's ``print(1)`` with a direct ``POST /eval`` (targets 1 and 2). What
it adds is the MCP SDK's cost, client and server, which any gateway on this SDK pays, and the
gateway's own. This separates the two, in CPU time as well as wall time (CPU time is what a busy
host makes everything wait for, and it is steadier than wall time on a shared machine):

- ``floor``: a bare ``MCPServer`` (``_floor_server.py``: no middleware, no sessions) whose
  ``execute_python_code`` returns ``"1\\n"``;
- ``seed-like``: the same bare server, whose tool posts ``{"input": code}`` to the stand-in below
  and returns its stdout (``_floor_server.py --snekbox-url``): the least a gateway in front of
  Snekbox can cost (issue 31 compares with seed 004, as ``bench_snekbox.py`` does);
- ``gateway`` (this tree) and, with ``--before DIR``, another checkout's: each with
  ``SNEKBOX_URL`` set to ``_instant_snekbox.py``, a stand-in that answers every ``POST /eval``
  with ``print(1)``'s result at once, and its default ``MCP_LOG_LEVEL`` (one line per call).

Each is called over Streamable HTTP and SSE with ``mcp.Client``, one call at a time, without
``session_id``: ``--batch`` calls per way, in ``--rounds`` rounds each in a new order. Read around
each batch: the server process's CPU time (all its threads' ``/proc/<pid>/task/*/schedstat``,
nanoseconds) and this process's, the client's (``time.process_time()``). Prints per call: p50
and p95 wall time, server CPU, client CPU, and each gateway's excess over the floor.

    uv run python bench/bench_gateway_cpu.py [--rounds 20] [--batch 20] [--before DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack, ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from _common import (
    ROOT,
    before_checkout,
    cpu_ns,
    free_port,
    percentile,
    python_server,
    rounds,
    service_of,
)
from mcp import Client
from mcp.client.sse import sse_client

HERE = Path(__file__).resolve().parent
FLOOR = "floor"
SEED_LIKE = "seed-like"


@dataclass
class Way:
    """One server over one transport, and what its calls took."""

    name: str
    server_pid: int
    call: Callable[[], Awaitable[None]]
    wall_ms: list[float] = field(default_factory=list)
    server_ns: int = 0
    client_s: float = 0.0


def calling(client: Client) -> Callable[[], Awaitable[None]]:
    """One call of the tool without ``session_id``, its answer checked."""

    async def call() -> None:
        result = await client.call_tool("execute_python_code", {"code": "print(1)"})
        text = [block.text for block in result.content if block.type == "text"]
        if result.is_error or not text or not text[0].startswith("1\n"):
            raise SystemExit(f"unexpected answer: {result}"[:2000])

    return call


async def measure(servers: dict[str, tuple[int, str]], n: int, batch: int) -> list[Way]:
    """``servers``: a name for each server's (pid, base URL); both transports each."""
    async with AsyncExitStack() as stack:
        ways = []
        for name, (pid, url) in servers.items():
            http = await stack.enter_async_context(Client(f"{url}/mcp"))
            sse = await stack.enter_async_context(Client(sse_client(f"{url}/sse")))
            ways += [Way(f"{name} HTTP", pid, calling(http)), Way(f"{name} SSE", pid, calling(sse))]
        for way in ways:  # warm-up: connections, imports, caches
            for _ in range(batch):
                await way.call()
        for order in rounds(ways, n):
            for way in order:
                server, client = cpu_ns(way.server_pid), time.process_time()
                for _ in range(batch):
                    started = time.perf_counter()
                    await way.call()
                    way.wall_ms.append((time.perf_counter() - started) * 1000)
                way.server_ns += cpu_ns(way.server_pid) - server
                way.client_s += time.process_time() - client
    return ways


def report(ways: list[Way], checkouts: dict[str, Path], args: argparse.Namespace) -> None:
    print(
        f"print(1) against an instant stand-in Snekbox; {args.rounds} rounds of {args.batch} "
        "calls each way, interleaved; ms per call"
    )
    print(f"  {FLOOR}: {HERE / '_floor_server.py'} (the MCP SDK alone)")
    for name, checkout in checkouts.items():
        print(f"  {name}: {checkout} (MCP_LOG_LEVEL={args.log_level})")
    rows = {}
    for way in ways:
        calls = len(way.wall_ms)
        rows[way.name] = (
            statistics.median(way.wall_ms),
            percentile(way.wall_ms, 95),
            way.server_ns / calls / 1e6,
            way.client_s / calls * 1000,
        )
    print(
        f"{'way':<18}{'p50':>7}{'p95':>7}{'server CPU':>12}{'client CPU':>12}"
        f"{'p50 - floor':>13}{'server CPU - floor':>20}"
    )
    for name, (p50, p95, server, client) in rows.items():
        transport = name.rsplit(" ", 1)[1]
        floor_p50, _, floor_server, _ = rows[f"{FLOOR} {transport}"]
        print(
            f"{name:<18}{p50:7.2f}{p95:7.2f}{server:12.2f}{client:12.2f}"
            f"{p50 - floor_p50:13.2f}{server - floor_server:20.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20, help="rounds (20)")
    parser.add_argument("--batch", type=int, default=20, help="calls per way per round (20)")
    parser.add_argument("--before", help="a checkout of the 'before' commit, for its gateway")
    parser.add_argument("--log-level", default="info", help="the gateways' MCP_LOG_LEVEL (info)")
    args = parser.parse_args()
    before = before_checkout(args.before)
    checkouts = {"gateway": ROOT} | ({"before": before} if before else {})
    with ExitStack() as stack:
        standin_port, floor_port = free_port(), free_port()
        standin = f"http://127.0.0.1:{standin_port}"
        stack.enter_context(
            python_server(
                [str(HERE / "_instant_snekbox.py"), "--port", str(standin_port)],
                f"OPTIONS {standin}/eval",
                quiet=True,
            )
        )
        floor = stack.enter_context(
            python_server(
                [str(HERE / "_floor_server.py"), "--port", str(floor_port)],
                f"GET http://127.0.0.1:{floor_port}/healthz",
                quiet=True,
            )
        )
        seed_port = free_port()
        seed_like = stack.enter_context(
            python_server(
                [
                    str(HERE / "_floor_server.py"),
                    "--port",
                    str(seed_port),
                    "--snekbox-url",
                    standin,
                ],
                f"GET http://127.0.0.1:{seed_port}/healthz",
                quiet=True,
            )
        )
        servers = {
            FLOOR: (floor.pid, f"http://127.0.0.1:{floor_port}"),
            SEED_LIKE: (seed_like.pid, f"http://127.0.0.1:{seed_port}"),
        }
        env = {"SNEKBOX_URL": standin, "MCP_LOG_LEVEL": args.log_level}
        for name, checkout in checkouts.items():
            port = free_port()
            gateway = stack.enter_context(service_of(checkout, "python_mcp_server", port, env=env))
            servers[name] = (gateway.pid, f"http://127.0.0.1:{port}")
        ways = asyncio.run(measure(servers, args.rounds, args.batch))
    report(ways, checkouts, args)


if __name__ == "__main__":
    main()
