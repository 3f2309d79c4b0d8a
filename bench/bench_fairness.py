"""A flooding client against a well-behaved one, on one gateway (built-in evaluator).

Two clients with tokens of their own (``MCP_AUTH_TOKENS_FILE``). The well-behaved one ("calm")
keeps one live session and runs a small cell in it, call after call; the flooding one ("flood")
runs ``print(1)`` without ``session_id`` from several tasks at once, each call a new session,
so that the gateway's cap (``--cap``) is reached again and again. Rounds alternate the calm
client's calls alone and under the flood, side by side in one run. Prints the calm client's
p50/p95 latency alone and flooded, their ratio, whether its session survived every call, and
how many of the flood's sessions were closed to make room.

    uv run python bench/bench_fairness.py [--rounds 4] [--calls 10] [--flooders 3] [--cap 8]
"""

from __future__ import annotations

import argparse
import os
import re
import tempfile
import time
from pathlib import Path

import anyio
import httpx
import httpx2
from _common import free_port, percentile, python_server
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

CALM, FLOOD = "calm-token-0123456789abcdef", "flood-token-0123456789abcdef"
OVERALL_LIMIT = 900.0


def _client(url: str, token: str) -> Client:
    http = httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {token}"}, timeout=httpx2.Timeout(30, read=300)
    )
    return Client(streamable_http_client(f"{url}/mcp", http_client=http))


async def _call(client: Client, code: str, **arguments: object) -> tuple[float, dict[str, object]]:
    started = time.perf_counter()
    result = await client.call_tool("execute_python_code", {"code": code, **arguments})
    took = time.perf_counter() - started
    if result.is_error:
        return took, {"error": result.content[0].text}  # type: ignore[union-attr]
    return took, dict(result.structured_content or {})


async def _run(url: str, rounds: int, calls: int, flooders: int) -> None:
    alone: list[float] = []
    flooded: list[float] = []
    lost: list[str] = []
    flood_calls = 0
    async with _client(url, CALM) as calm, _client(url, FLOOD) as flood:
        _, first = await _call(calm, "x = 0")
        session_id = str(first["session_id"])

        async def calm_calls(into: list[float]) -> None:
            for _ in range(calls):
                took, facts = await _call(calm, "x += 1\nprint(x)", session_id=session_id)
                if "error" in facts:
                    lost.append(str(facts["error"])[:120])
                into.append(took)

        async def flooding(stop: anyio.Event) -> None:
            nonlocal flood_calls
            while not stop.is_set():
                await _call(flood, "print(1)")
                flood_calls += 1

        for _ in range(rounds):
            await calm_calls(alone)
            stop = anyio.Event()
            async with anyio.create_task_group() as group:
                for _ in range(flooders):
                    group.start_soon(flooding, stop)
                await anyio.sleep(0.5)  # the flood under way first
                await calm_calls(flooded)
                stop.set()
    async with httpx.AsyncClient() as http:
        metrics = (await http.get(f"{url}/metrics")).text
    evicted = re.search(r'^mcp_code_sessions_closed_total\{why="evicted"\} (\S+)$', metrics, re.M)
    a50, a95 = percentile(alone, 50) * 1000, percentile(alone, 95) * 1000
    f50, f95 = percentile(flooded, 50) * 1000, percentile(flooded, 95) * 1000
    print(f"calm client, {len(alone)} calls alone:   p50 {a50:7.1f} ms  p95 {a95:7.1f} ms")
    print(f"calm client, {len(flooded)} calls flooded: p50 {f50:7.1f} ms  p95 {f95:7.1f} ms")
    print(f"flooded / alone: p50 {f50 / a50:.2f}x  p95 {f95 / a95:.2f}x")
    print(
        f"flood: {flood_calls} calls, sessions closed to make room: {evicted[1] if evicted else 0}"
    )
    print(f"calm session survived every call: {not lost} ({len(lost)} failed)")
    for message in lost[:3]:
        print("  ", message)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--flooders", type=int, default=3)
    parser.add_argument("--cap", type=int, default=8, help="MCP_MAX_CODE_SESSIONS")
    args = parser.parse_args()
    port = free_port()
    with tempfile.TemporaryDirectory() as scratch:
        tokens = Path(scratch) / "tokens"
        tokens.write_text(f"calm {CALM}\nflood {FLOOD}\n")
        env = {
            **os.environ,
            "MCP_LOG_LEVEL": "warning",
            "MCP_AUTH_TOKENS_FILE": str(tokens),
            "MCP_MAX_CODE_SESSIONS": str(args.cap),
        }
        for name in ("SNEKBOX_URL", "MCP_AUTH_TOKEN", "MCP_AUTH_TOKEN_FILE"):
            env.pop(name, None)
        server = ["-m", "python_mcp_server", "--host", "127.0.0.1", "--port", str(port)]
        with python_server(server, f"GET http://127.0.0.1:{port}/readyz", env=env, quiet=True):
            url = f"http://127.0.0.1:{port}"

            async def bounded() -> None:
                with anyio.fail_after(OVERALL_LIMIT):
                    await _run(url, args.rounds, args.calls, args.flooders)

            anyio.run(bounded)


if __name__ == "__main__":
    main()
