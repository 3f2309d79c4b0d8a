"""What the gateway adds to an evaluation: MCP over Streamable HTTP and SSE vs a direct POST /eval.

Starts the built-in evaluator as its own service and the gateway in front of it (SNEKBOX_URL),
both under uvicorn on loopback ports, then runs ``print(1)`` N times each way, interleaved in
one loop so that machine noise hits all three alike. The direct call sends the very request the
gateway sends (prelude included), so the difference is the gateway alone: MCP framing, JSON-RPC,
the tool layer, and one more HTTP hop; and the MCP client's own work (its share is not small:
it validates every result against the tool's output schema). Target: at most 3 ms at p50.

    uv run python bench/bench_gateway.py [-n 200]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from collections.abc import Awaitable, Callable

from _common import free_port, percentile, python_server
from mcp import Client
from mcp.client.sse import sse_client

import plotting
from snekbox_client import SnekboxClient

TARGET_MS = 3.0


async def measure(n: int, evaluator_url: str, gateway_url: str) -> dict[str, list[float]]:
    request = plotting.build_request("print(1)")
    samples: dict[str, list[float]] = {"direct /eval": [], "MCP Streamable HTTP": [], "MCP SSE": []}
    async with (
        SnekboxClient(evaluator_url) as direct,
        Client(f"{gateway_url}/mcp") as http,
        Client(sse_client(f"{gateway_url}/sse")) as sse,
    ):

        async def via_direct() -> None:
            result = await direct.eval(request)
            assert result.stdout == "1\n", result

        def via(client: Client) -> Callable[[], Awaitable[None]]:
            async def call() -> None:
                result = await client.call_tool("execute_python_code", {"code": "print(1)"})
                assert not result.is_error and result.structured_content is not None
                assert result.structured_content["stdout"] == "1\n", result

            return call

        ways = list(zip(samples, [via_direct, via(http), via(sse)], strict=True))
        for _, way in ways:  # warm-up: connections, imports, first sandbox
            for _ in range(3):
                await way()
        for i in range(n):
            for name, way in ways[i % 3 :] + ways[: i % 3]:
                started = time.perf_counter()
                await way()
                samples[name].append((time.perf_counter() - started) * 1000)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=200, help="calls per way (default 200)")
    args = parser.parse_args()

    eval_port, gateway_port = free_port(), free_port()
    evaluator_url = f"http://127.0.0.1:{eval_port}"
    gateway_url = f"http://127.0.0.1:{gateway_port}"
    gateway_env = {**os.environ, "MCP_LOG_LEVEL": "warning", "SNEKBOX_URL": evaluator_url}
    with (
        python_server(
            ["-m", "evaluator", "--port", str(eval_port), "--log-level", "warning"],
            f"OPTIONS {evaluator_url}/eval",
        ),
        python_server(
            ["-m", "python_mcp_server", "--port", str(gateway_port)],
            f"GET {gateway_url}/healthz",
            env=gateway_env,
        ),
    ):
        samples = asyncio.run(measure(args.n, evaluator_url, gateway_url))

    base50 = statistics.median(samples["direct /eval"])
    base95 = percentile(samples["direct /eval"], 95)
    print(f"print(1), {args.n} calls each way, interleaved; times in ms")
    print(f"{'way':<22}{'p50':>8}{'p95':>8}{'p50 - direct':>14}{'p50 ratio':>11}")
    for name, values in samples.items():
        p50, p95 = statistics.median(values), percentile(values, 95)
        print(f"{name:<22}{p50:8.1f}{p95:8.1f}{p50 - base50:14.1f}{p50 / base50:11.2f}")
    print(f"(direct p95 {base95:.1f} ms; target: the gateway adds at most {TARGET_MS:g} ms at p50)")


if __name__ == "__main__":
    main()
