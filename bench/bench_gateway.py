"""What the gateway adds to an evaluation: MCP over Streamable HTTP and SSE vs a direct POST /eval.

Starts the built-in evaluator as its own service and the gateway in front of it (SNEKBOX_URL),
both under uvicorn on loopback ports, then runs ``print(1)`` N times each way, interleaved in
one loop so that machine noise hits all three alike. The direct call sends the very request the
gateway sends (the prelude, but in a live session's later cells), so the difference is the
gateway alone: MCP framing, JSON-RPC, the tool layer, and one more HTTP hop; and the MCP
client's own work (its share is not small).
To tell the two apart, a third way per gateway, "plain", calls the tool over Streamable HTTP
(protocol 2026-07-28: one JSON-RPC POST per call) with a bare httpx client, the same kind of
client the direct call uses: the gateway's share alone. Target: at most 3 ms at p50.

Floors, in the same loop (so the same idle gaps precede them): ``GET /healthz`` (one HTTP round
trip to the gateway's process) and a call of a tool that does not exist over each transport (the
MCP stack, client and server, around a tool call that runs no gateway code and no evaluation).
On a machine where waking an idle process is slow, these are most of what the gateway adds.

Without ``--session`` a fourth way, "direct one-shot", is a plain ``{"input": "print(1)"}``:
what a user without the gateway sends, and the baseline of a call without ``session_id``.

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

import httpx
from _common import ROOT, before_checkout, free_port, percentile, service_of
from mcp import Client
from mcp.client.sse import sse_client
from mcp.types import (
    CLIENT_CAPABILITIES_META_KEY,
    CLIENT_INFO_META_KEY,
    PROTOCOL_VERSION_META_KEY,
)
from mcp.types.version import LATEST_MODERN_VERSION

import plotting
from snekbox_client import EvalRequest, SnekboxClient

TARGET_MS = 3.0
DIRECT = "direct /eval"
#: A plain one-shot ``{"input": "print(1)"}``: what a user without the gateway would send. The
#: target for a call without ``session_id`` is set against it (issue 31).
ONE_SHOT = "direct one-shot"
#: Marks the ways that run no code: printed apart, as absolute times.
FLOOR = " (floor)"


async def measure(
    n: int, evaluator_url: str, gateways: dict[str, str], *, session: bool
) -> dict[str, list[float]]:
    """``gateways``: a name for each gateway's URL; each is called over both transports."""
    request = plotting.build_request("print(1)")
    # The gateway sends a live session's later cells without the prelude its interpreter holds.
    later_cell = plotting.build_request("print(1)", later_cell=True)
    new_sessions = itertools.count()
    async with AsyncExitStack() as stack:
        direct = await stack.enter_async_context(SnekboxClient(evaluator_url))
        direct_started = False

        async def via_direct() -> None:
            nonlocal direct_started
            if session:
                sent = replace(later_cell if direct_started else request, session="bench-direct")
                direct_started = True
            else:
                sent = replace(request, session=f"bench-new-{next(new_sessions)}")
            result = await direct.eval(sent)
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

        async def via_one_shot() -> None:
            result = await direct.eval(EvalRequest(input="print(1)"))
            assert result.stdout == "1\n", result

        plain = await stack.enter_async_context(httpx.AsyncClient())
        ways: list[tuple[str, Callable[[], Awaitable[None]]]] = [(DIRECT, via_direct)]
        if not session:
            ways.append((ONE_SHOT, via_one_shot))
        for name, url in gateways.items():
            http = await stack.enter_async_context(Client(f"{url}/mcp"))
            sse = await stack.enter_async_context(Client(sse_client(f"{url}/sse")))
            ways += [
                (f"{name} HTTP", via(http)),
                (f"{name} HTTP plain", via_plain(plain, f"{url}/mcp", session=session)),
                (f"{name} SSE", via(sse)),
                (f"{name} HTTP no tool{FLOOR}", no_tool(http)),
                (f"{name} SSE no tool{FLOOR}", no_tool(sse)),
                (f"{name} GET /healthz{FLOOR}", healthz(plain, url)),
            ]
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


def no_tool(client: Client) -> Callable[[], Awaitable[None]]:
    """Calls of a tool the gateway does not have: the MCP round trip and nothing else."""

    async def call() -> None:
        result = await client.call_tool("no_such_tool", {})
        assert result.is_error, result

    return call


def healthz(client: httpx.AsyncClient, url: str) -> Callable[[], Awaitable[None]]:
    async def call() -> None:
        (await client.get(f"{url}/healthz")).raise_for_status()

    return call


def via_plain(
    client: httpx.AsyncClient, url: str, *, session: bool
) -> Callable[[], Awaitable[None]]:
    """Calls of the tool as one JSON-RPC POST each (protocol 2026-07-28), without an MCP client."""
    arguments: dict[str, Any] = {"code": "print(1)"}
    ids = itertools.count(1)
    headers = {
        "accept": "application/json, text/event-stream",
        "mcp-protocol-version": LATEST_MODERN_VERSION,
        "mcp-method": "tools/call",
        "mcp-name": "execute_python_code",
    }
    meta = {
        PROTOCOL_VERSION_META_KEY: LATEST_MODERN_VERSION,
        CLIENT_INFO_META_KEY: {"name": "bench_gateway", "version": "1"},
        CLIENT_CAPABILITIES_META_KEY: {},
    }

    async def call() -> None:
        params = {"name": "execute_python_code", "arguments": arguments, "_meta": meta}
        message = {"jsonrpc": "2.0", "id": next(ids), "method": "tools/call", "params": params}
        response = await client.post(url, json=message, headers=headers)
        # A call that sends no notification is answered as JSON, not as an event stream.
        assert response.headers["content-type"].startswith("application/json"), response
        structured = response.json()["result"]["structuredContent"]
        assert structured["stdout"] == "1\n", structured
        if session:
            arguments["session_id"] = structured["session_id"]

    return call


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
    one50 = statistics.median(samples[ONE_SHOT]) if ONE_SHOT in samples else None
    head = f"{'way':<24}{'p50':>8}{'p95':>8}{'p50 - direct':>14}{'p50 ratio':>11}"
    print(head + (f"{'p50 - one-shot':>16}" if one50 is not None else ""))
    for name, values in samples.items():
        if not name.endswith(FLOOR):
            p50, p95 = statistics.median(values), percentile(values, 95)
            line = f"{name:<24}{p50:8.1f}{p95:8.1f}{p50 - base50:14.1f}{p50 / base50:11.2f}"
            print(line + (f"{p50 - one50:16.1f}" if one50 is not None else ""))
    print(
        f"(direct p95 {base95:.1f} ms; target: the gateway adds at most {TARGET_MS:g} ms at p50"
        + (", over the one-shot for a call without session_id)" if one50 is not None else ")")
    )
    print("floors, no code run (in the same loop):")
    for name, values in samples.items():
        if name.endswith(FLOOR):
            p50, p95 = statistics.median(values), percentile(values, 95)
            print(f"{name.removesuffix(FLOOR):<24}{p50:8.1f}{p95:8.1f}")


if __name__ == "__main__":
    main()
