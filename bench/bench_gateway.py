"""What the gateway adds to an evaluation: MCP over Streamable HTTP and SSE vs a direct POST /eval.

Starts the built-in evaluator as its own service and the gateway in front of it (SNEKBOX_URL),
both under uvicorn on loopback ports, then runs ``print(1)`` N times each way, interleaved in
one loop (each round in a new order) so that machine noise hits every way alike; ``--gap``
pauses before each call (a model's pace: warm sandboxes are made again meanwhile). The direct
call sends the very request the gateway sends (the code, for the prelude the evaluator keeps
resident), so the difference is the gateway alone: MCP framing, JSON-RPC, the tool layer, and one
more HTTP hop; and the MCP client's own work (its share is not small).
To tell the two apart, a third way per gateway, "plain", calls the tool over Streamable HTTP
(protocol 2026-07-28: one JSON-RPC POST per call) with a bare httpx client, the same kind of
client the direct call uses: the gateway's share alone. Target: at most 3 ms at p50.

Floors, in the same loop (so the same idle gaps precede them): ``GET /healthz`` (one HTTP round
trip to the gateway's process) and a call of a tool that does not exist over each transport (the
MCP stack, client and server, around a tool call that runs no gateway code and no evaluation).
On a machine where waking an idle process is slow, these are most of what the gateway adds.

Back to back (``--gap 0``) on 2 cores, calls without ``session_id`` use up sandboxes faster
than spare CPU makes them (each costs about 40 ms of CPU): a call either finds one ready (a few
ms) or waits for one to start (25-50 ms), in every way alike. The times then fall in two modes
and p50 lies wherever the share of ready ones puts it; p25 and p75 show the two modes.

Without ``--session`` a fourth way, "direct one-shot", is a plain ``{"input": "print(1)"}``:
what a user without the gateway sends, and the baseline of a call without ``session_id``. And
beside it the least any gateway on this MCP SDK can add to it, "sdk-only" over both transports:
``_floor_server.py --snekbox-url`` in front of the same evaluator (a bare ``MCPServer`` whose
tool posts that one-shot with httpx and returns its stdout, as the seed gateways do; no
prelude, sessions, limits or middleware).

A call without ``session_id`` starts a live session (the built-in evaluator keeps one, in the
gateway's process or behind ``SNEKBOX_URL``), so each direct call names a new session too.
``--in-process``: the embedded default instead, the gateway with its own evaluator (no
``SNEKBOX_URL``), against the direct ``/eval`` of an evaluator service configured the same.
``--session``: every call a cell of one live session, the direct call naming its own
(``"session"``), each gateway's passing the ``session_id`` it was given: a cell costs
milliseconds, where a call that starts a session costs an interpreter's start.
``--before DIR`` adds, side by side, another checkout's evaluator and its gateway in front of
it, started the same way (``git worktree add /tmp/bench-before <commit>``), its direct ways
beside ours: each gateway is measured against its own evaluator.

    uv run python bench/bench_gateway.py [-n 200] [--gap 0] [--in-process] [--session]
        [--before DIR]
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
from pathlib import Path
from typing import Any

import httpx
from _common import (
    ROOT,
    before_checkout,
    free_port,
    percentile,
    python_server,
    rounds,
    service_of,
)
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
#: The name of this working tree's gateway (and its evaluator's direct ways, unprefixed).
AFTER = "gateway"
DIRECT = "direct /eval"
#: A plain one-shot ``{"input": "print(1)"}``: what a user without the gateway would send. The
#: target for a call without ``session_id`` is set against it (issue 31).
ONE_SHOT = "direct one-shot"
#: A bare MCP SDK server forwarding the one-shot (``_floor_server.py``): its ways' prefix.
SDK_ONLY = "sdk-only"
#: Marks the ways that run no code: printed apart, as absolute times.
FLOOR = " (floor)"


async def measure(
    n: int,
    stacks: dict[str, tuple[str, str]],
    *,
    session: bool,
    gap: float = 0.0,
    sdk_only: str | None = None,
) -> dict[str, list[float]]:
    """``stacks``: for each name, an evaluator's URL and its gateway's; the evaluator is called
    directly, the gateway over both transports; ``gap``: seconds of pause before each call;
    ``sdk_only``: the URL of the bare SDK server in front of this tree's evaluator."""
    async with AsyncExitStack() as stack:

        def via(client: Client) -> Callable[[], Awaitable[None]]:
            arguments: dict[str, Any] = {"code": "print(1)"}

            async def call() -> None:
                result = await client.call_tool("execute_python_code", arguments)
                assert not result.is_error and result.structured_content is not None
                assert result.structured_content["stdout"] == "1\n", result
                if session:
                    arguments["session_id"] = result.structured_content["session_id"]

            return call

        plain = await stack.enter_async_context(httpx.AsyncClient())
        ways: list[tuple[str, Callable[[], Awaitable[None]]]] = []
        for name, (evaluator_url, url) in stacks.items():
            direct = await stack.enter_async_context(SnekboxClient(evaluator_url))
            prefix = "" if name == AFTER else f"{name} "
            ways.append((prefix + DIRECT, via_direct(direct, name, session=session)))
            if not session:
                ways.append((prefix + ONE_SHOT, via_one_shot(direct)))
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
        if sdk_only is not None:
            for transport, client in (
                ("HTTP", Client(f"{sdk_only}/mcp")),
                ("SSE", Client(sse_client(f"{sdk_only}/sse"))),
            ):
                entered = await stack.enter_async_context(client)
                ways.append((f"{SDK_ONLY} {transport}", via_sdk_only(entered)))
        samples: dict[str, list[float]] = {name: [] for name, _ in ways}
        for _, way in ways:  # warm-up: connections, imports, first sandbox
            for _ in range(3):
                await way()
        for order in rounds(ways, n):
            for name, way in order:
                if gap:
                    await asyncio.sleep(gap)
                started = time.perf_counter()
                await way()
                samples[name].append((time.perf_counter() - started) * 1000)
    return samples


def via_direct(direct: SnekboxClient, name: str, *, session: bool) -> Callable[[], Awaitable[None]]:
    """The gateway's very request, sent directly: each call a new session's first cell, or
    (``session``) one session's later cells, as the gateway sends them (without the prelude
    its interpreter holds; a first cell without the prelude the evaluator keeps resident, or
    with it, from the first call on, to an evaluator that keeps none: a 'before' checkout's)."""
    first = plotting.build_request("print(1)", resident=True)
    later_cell = plotting.build_request("print(1)", later_cell=True)
    new_sessions = itertools.count()
    started = False

    async def call() -> None:
        nonlocal started, first
        if session:
            sent = replace(later_cell if started else first, session=f"bench-{name}")
            started = True
        else:
            sent = replace(first, session=f"bench-{name}-{next(new_sessions)}")
        result = await direct.eval(sent)
        if plotting.prelude_missing(result):  # the warm-up's first call, to a 'before'
            first = plotting.build_request("print(1)")
            result = await direct.eval(replace(sent, args=first.args, files=first.files))
        assert result.stdout == "1\n", result

    return call


def via_one_shot(direct: SnekboxClient) -> Callable[[], Awaitable[None]]:
    """A plain ``{"input": "print(1)"}``."""

    async def call() -> None:
        result = await direct.eval(EvalRequest(input="print(1)"))
        assert result.stdout == "1\n", result

    return call


def via_sdk_only(client: Client) -> Callable[[], Awaitable[None]]:
    """Calls of the bare SDK server's tool, which answers the one-shot's stdout as its text."""

    async def call() -> None:
        result = await client.call_tool("execute_python_code", {"code": "print(1)"})
        assert not result.is_error and result.structured_content == {"result": "1\n"}, result

    return call


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
    parser.add_argument(
        "--gap", type=float, default=0.0, help="seconds of pause before each call (default 0)"
    )
    parser.add_argument("--before", help="a checkout of the 'before' commit, for its gateway")
    args = parser.parse_args()
    before = before_checkout(args.before)

    checkouts = {AFTER: ROOT} | ({"before": before} if before else {})
    with ExitStack() as stack:
        stacks = {}
        for name, checkout in checkouts.items():  # each gateway in front of its own evaluator
            eval_port, port = free_port(), free_port()
            evaluator_url = f"http://127.0.0.1:{eval_port}"
            stack.enter_context(service_of(checkout, "evaluator", eval_port))
            env = {} if args.in_process else {"SNEKBOX_URL": evaluator_url}
            stack.enter_context(service_of(checkout, "python_mcp_server", port, env=env))
            stacks[name] = (evaluator_url, f"http://127.0.0.1:{port}")
        sdk_only = None
        if not args.session:
            sdk_port = free_port()
            sdk_only = f"http://127.0.0.1:{sdk_port}"
            script = str(ROOT / "bench" / "_floor_server.py")
            forward = ["--port", str(sdk_port), "--snekbox-url", stacks[AFTER][0]]
            stack.enter_context(
                python_server([script, *forward], f"GET {sdk_only}/healthz", quiet=True)
            )
        samples = asyncio.run(
            measure(args.n, stacks, session=args.session, gap=args.gap, sdk_only=sdk_only)
        )
    report(samples, checkouts, in_process=args.in_process, session=args.session, n=args.n)


def report(
    samples: dict[str, list[float]],
    checkouts: dict[str, Path],
    *,
    in_process: bool,
    session: bool,
    n: int,
) -> None:
    """Each way's quartiles and p95, and its p50's difference from its own evaluator's direct
    calls (back to back, times fall in two modes: see the module)."""
    where = "its own evaluator" if in_process else "SNEKBOX_URL: the evaluator service"
    kind = "cells of one session" if session else "calls"
    print(f"print(1), {n} {kind} each way, interleaved; times in ms; gateways on {where}")
    for name, checkout in checkouts.items():
        print(f"  {name}: {checkout} (its own evaluator and gateway)")
    head = f"{'way':<28}{'p25':>8}{'p50':>8}{'p75':>8}{'p95':>8}{'p50 - direct':>14}"
    head += f"{'p50 ratio':>11}"
    print(head + ("" if session else f"{'p50 - one-shot':>16}"))
    for name, values in samples.items():
        if name.endswith(FLOOR):
            continue
        first = name.split(" ", 1)[0]
        prefix = "" if first in (AFTER, "direct", SDK_ONLY) else first + " "
        base50 = statistics.median(samples[prefix + DIRECT])
        p25, p50, p75, p95 = (percentile(values, q) for q in (25, 50, 75, 95))
        line = f"{name:<28}{p25:8.1f}{p50:8.1f}{p75:8.1f}{p95:8.1f}"
        line += f"{p50 - base50:14.1f}{p50 / base50:11.2f}"
        if not session:
            line += f"{p50 - statistics.median(samples[prefix + ONE_SHOT]):16.1f}"
        print(line)
    print(
        f"(target: the gateway adds at most {TARGET_MS:g} ms at p50"
        + (")" if session else ", over the one-shot for a call without session_id)")
    )
    print("floors, no code run (in the same loop):")
    for name, values in samples.items():
        if name.endswith(FLOOR):
            quantiles = "".join(f"{percentile(values, q):8.1f}" for q in (25, 50, 75, 95))
            print(f"{name.removesuffix(FLOOR):<28}{quantiles}")


if __name__ == "__main__":
    main()
