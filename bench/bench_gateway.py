"""What the gateway adds to an evaluation: MCP over Streamable HTTP and SSE vs a direct POST /eval.

Starts the built-in evaluator as its own service and the gateway in front of it (SNEKBOX_URL),
both under uvicorn on loopback ports, then runs ``print(1)`` N times each way, interleaved in
one loop so that machine noise hits all three alike. The direct call sends the very request the
gateway sends (prelude included), so the difference is the gateway alone: MCP framing, JSON-RPC,
the tool layer, and one more HTTP hop; and the MCP client's own work (its share is not small:
it validates every result against the tool's output schema). Target: at most 3 ms at p50.

A call without ``session_id`` starts a live session (the built-in evaluator keeps one, in the
gateway's process or behind ``SNEKBOX_URL``), so each direct call names a new session too.
``--in-process``: the embedded default instead, the gateway with its own evaluator (no
``SNEKBOX_URL``), against the direct ``/eval`` of an evaluator service configured the same.
``--session``: every call a cell of one live session, the direct call naming its own
(``"session"``), each gateway's passing the ``session_id`` it was given: a cell costs
milliseconds, where a call that starts a session costs an interpreter's start.
``--before DIR`` adds, side by side, the gateway of another checkout started the same way
(``git worktree add /tmp/bench-before <commit>``).

    uv run python bench/bench_gateway.py [-n 200] [--in-process] [--session] [--before DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack, ExitStack
from dataclasses import replace
from typing import Any

from _common import ROOT, before_checkout, free_port, percentile, service_of
from mcp import Client
from mcp.client.sse import sse_client

import plotting
from snekbox_client import SnekboxClient

TARGET_MS = 3.0
DIRECT = "direct /eval"


async def measure(
    n: int, evaluator_url: str, gateways: dict[str, str], *, session: bool
) -> dict[str, list[float]]:
    """``gateways``: a name for each gateway's URL; each is called over both transports."""
    request = plotting.build_request("print(1)")
    new_sessions = itertools.count()
    async with AsyncExitStack() as stack:
        direct = await stack.enter_async_context(SnekboxClient(evaluator_url))

        async def via_direct() -> None:
            name = "bench-direct" if session else f"bench-new-{next(new_sessions)}"
            result = await direct.eval(replace(request, session=name))
            assert result.stdout == "1\n", result

        def via(client: Client) -> Callable[[], Awaitable[None]]:
            arguments: dict[str, Any] = {"code": "print(1)"}

            async def call() -> None:
                result = await client.call_tool("execute_python_code", arguments)
                assert not result.is_error and result.structured_content is not None
                assert result.structured_content["stdout"] == "1\n", result
                if session:
                    arguments["session_id"] = result.structured_content["session_id"]

            return call

        ways: list[tuple[str, Callable[[], Awaitable[None]]]] = [(DIRECT, via_direct)]
        for name, url in gateways.items():
            http = await stack.enter_async_context(Client(f"{url}/mcp"))
            sse = await stack.enter_async_context(Client(sse_client(f"{url}/sse")))
            ways += [(f"{name} HTTP", via(http)), (f"{name} SSE", via(sse))]
        samples: dict[str, list[float]] = {name: [] for name, _ in ways}
        for _, way in ways:  # warm-up: connections, imports, first sandbox
            for _ in range(3):
                await way()
        for i in range(n):
            shift = i % len(ways)
            for name, way in ways[shift:] + ways[:shift]:
                started = time.perf_counter()
                await way()
                samples[name].append((time.perf_counter() - started) * 1000)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=200, help="calls per way (default 200)")
    parser.add_argument(
        "--in-process", action="store_true", help="gateways with their own evaluator"
    )
    parser.add_argument("--session", action="store_true", help="cells of one session each")
    parser.add_argument("--before", help="a checkout of the 'before' commit, for its gateway")
    args = parser.parse_args()
    before = before_checkout(args.before)

    eval_port = free_port()
    evaluator_url = f"http://127.0.0.1:{eval_port}"
    checkouts = {"gateway": ROOT} | ({"before": before} if before else {})
    with ExitStack() as stack:
        stack.enter_context(service_of(ROOT, "evaluator", eval_port))
        gateways = {}
        for name, checkout in checkouts.items():
            port = free_port()
            env = {} if args.in_process else {"SNEKBOX_URL": evaluator_url}
            stack.enter_context(service_of(checkout, "python_mcp_server", port, env=env))
            gateways[name] = f"http://127.0.0.1:{port}"
        samples = asyncio.run(measure(args.n, evaluator_url, gateways, session=args.session))

    base50 = statistics.median(samples[DIRECT])
    base95 = percentile(samples[DIRECT], 95)
    where = "its own evaluator" if args.in_process else "SNEKBOX_URL: the evaluator service"
    kind = "cells of one session" if args.session else "calls"
    print(f"print(1), {args.n} {kind} each way, interleaved; times in ms; gateways on {where}")
    for name, checkout in checkouts.items():
        print(f"  {name}: {checkout}")
    print(f"{'way':<22}{'p50':>8}{'p95':>8}{'p50 - direct':>14}{'p50 ratio':>11}")
    for name, values in samples.items():
        p50, p95 = statistics.median(values), percentile(values, 95)
        print(f"{name:<22}{p50:8.1f}{p95:8.1f}{p50 - base50:14.1f}{p50 / base50:11.2f}")
    print(f"(direct p95 {base95:.1f} ms; target: the gateway adds at most {TARGET_MS:g} ms at p50)")


if __name__ == "__main__":
    main()
