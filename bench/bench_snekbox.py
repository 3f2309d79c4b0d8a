"""What the gateway adds in front of the real Snekbox: ``print(1)`` over MCP vs a plain POST /eval.

The gateway runs as its own process with ``SNEKBOX_URL`` set to ``--snekbox-url`` (a Snekbox
started beforehand: NsJail, one-shot runs; this bench starts no evaluator). Each way runs
``print(1)`` N times, interleaved in one loop (each round in a new order) so that machine noise
hits every way alike:

- ``direct /eval``: the plain ``POST /eval {"input": "print(1)"}`` a Snekbox user would send,
  with a bare ``httpx.AsyncClient`` (keep-alive, no proxies): the baseline every way's overhead
  is taken over (issue 31 compares the gateways' overheads over it).
- ``direct prelude resident``: the very request the gateway sends for that call to an image
  keeping the prelude resident (docker/snekbox/Dockerfile: the boot file and the code), with
  the same client: what Snekbox itself takes for the gateway's request; left out when the
  Snekbox keeps none. ``direct prelude carried``: the request carrying the prelude (37 KB), as
  the gateway sends it to an image without it.
- ``<gateway> HTTP`` and ``<gateway> SSE``: the tool called with the official MCP client
  (``mcp.Client``) over Streamable HTTP and over SSE, each call without ``session_id`` (the
  call starts a code session, as a model's first call does).
- ``seed-like HTTP`` and ``seed-like SSE``: the least a gateway in front of Snekbox can be, as
  the seed gateways were (``_floor_server.py --snekbox-url``: a bare ``MCPServer`` whose tool
  posts ``{"input": code}`` and returns the stdout; no prelude, figures, files or sessions).
  Issue 31 compares with seed 004, whose code is not here; this is its stand-in.

Floors, in the same loop: a call of a tool that does not exist over each transport (the MCP
stack, client and server, around a tool call that runs no gateway code and no evaluation).

``--before DIR`` adds, side by side, the gateway of another checkout started the same way
(``git worktree add /tmp/bench-before <commit>``). ``--snekbox-before URL`` adds another
Snekbox's plain ``POST /eval`` (``direct /eval before``: an image built before a change to it,
such as docker/snekbox/usercustomize.py, run beside the new one), whose difference from
``direct /eval`` is what the change to the image gave every run. With both, the "before"
gateway is in front of that Snekbox (an image whose resident prelude is the older checkout's).
``--log-level`` is the gateways' ``MCP_LOG_LEVEL`` (default ``info``, the gateway's own
default: one log line per call). ``--plot`` runs :data:`PLOT` (numpy and pyplot, one figure, which
the gateways return as an image) in place of ``print(1)``.

    uv run python bench/bench_snekbox.py --snekbox-url http://127.0.0.1:8060 [-n 200]
        [--before DIR] [--snekbox-before http://127.0.0.1:8061] [--log-level info] [--plot]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack, ExitStack
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

import plotting

HERE = Path(__file__).resolve().parent
DIRECT = "direct /eval"
SEED_LIKE = "seed-like"
#: Marks the ways that run no code: printed apart, as absolute times.
FLOOR = " (floor)"
#: ``--plot``: what an agent's plotting call runs (``bench_plot.py``'s script), in place of
#: ``print(1)``.
PLOT = (
    "import numpy as np, matplotlib.pyplot as plt; x = np.linspace(0, 10, 10000); "
    "plt.plot(x, np.sin(x)); plt.title('bench'); plt.show()"
)
#: What each code prints.
STDOUT = {"print(1)": "1\n", PLOT: ""}


async def measure(
    n: int,
    snekbox_url: str,
    gateways: dict[str, str],
    code: str,
    snekbox_before: str | None = None,
) -> dict[str, list[float]]:
    """``gateways``: a name for each gateway's URL; each is called over both transports, each
    way running ``code``."""
    async with AsyncExitStack() as stack:
        direct = await stack.enter_async_context(
            httpx.AsyncClient(base_url=snekbox_url, trust_env=False, timeout=30)
        )
        carried = plotting.build_request(code).to_json()
        resident = plotting.build_request(code, resident=True).to_json()

        def plain(client: httpx.AsyncClient) -> Callable[[], Awaitable[None]]:
            async def way() -> None:
                response = await client.post("/eval", json={"input": code})
                response.raise_for_status()
                assert response.json()["stdout"] == STDOUT[code], response.text

            return way

        def via_prelude(body: dict[str, object]) -> Callable[[], Awaitable[None]]:
            async def way() -> None:
                response = await direct.post("/eval", json=body)
                response.raise_for_status()
                assert response.json()["stdout"] == STDOUT[code], response.text

            return way

        ways: list[tuple[str, Callable[[], Awaitable[None]]]] = [
            (DIRECT, plain(direct)),
            ("direct prelude carried", via_prelude(carried)),
        ]
        if snekbox_before is not None:
            before = await stack.enter_async_context(
                httpx.AsyncClient(base_url=snekbox_before, trust_env=False, timeout=30)
            )
            ways.append((f"{DIRECT} before", plain(before)))
        answer = (await direct.post("/eval", json=resident)).json()
        if answer.get("returncode") == 0:
            ways.append(("direct prelude resident", via_prelude(resident)))
        else:
            print("this Snekbox keeps no resident prelude of this checkout's: the gateway's")
            print("runs carry it, and 'direct prelude resident' is left out")
        for name, url in gateways.items():
            http = await stack.enter_async_context(Client(f"{url}/mcp"))
            sse = await stack.enter_async_context(Client(sse_client(f"{url}/sse")))
            ways += [
                (f"{name} HTTP", via(http, code, name == SEED_LIKE)),
                (f"{name} SSE", via(sse, code, name == SEED_LIKE)),
                (f"{name} HTTP no tool{FLOOR}", no_tool(http)),
                (f"{name} SSE no tool{FLOOR}", no_tool(sse)),
            ]
        samples: dict[str, list[float]] = {name: [] for name, _ in ways}
        for _, way in ways:  # warm-up: connections, imports, Snekbox's first runs
            for _ in range(3):
                await way()
        for order in rounds(ways, n):
            for name, way in order:
                started = time.perf_counter()
                await way()
                samples[name].append((time.perf_counter() - started) * 1000)
    return samples


def via(client: Client, code: str, seed_like: bool) -> Callable[[], Awaitable[None]]:
    """Calls of the tool, each without ``session_id`` (a new code session each); the plot's
    figure comes back as an image (the seed-like gateway returns none)."""
    arguments: dict[str, Any] = {"code": code}

    async def call() -> None:
        result = await client.call_tool("execute_python_code", arguments)
        text = [block.text for block in result.content if block.type == "text"]
        images = [block for block in result.content if block.type == "image"]
        assert not result.is_error and text and text[0].startswith(STDOUT[code]), result
        assert len(images) == (code == PLOT and not seed_like), result

    return call


def no_tool(client: Client) -> Callable[[], Awaitable[None]]:
    """Calls of a tool the gateway does not have: the MCP round trip and nothing else."""

    async def call() -> None:
        result = await client.call_tool("no_such_tool", {})
        assert result.is_error, result

    return call


def report(samples: dict[str, list[float]], checkouts: dict[str, Path], args: Any) -> None:
    base50 = statistics.median(samples[DIRECT])
    base95 = percentile(samples[DIRECT], 95)
    print(
        f"{'a plot' if args.plot else 'print(1)'}, {args.n} calls each way, interleaved; times "
        "in ms; gateways on "
        f"SNEKBOX_URL={args.snekbox_url}, MCP_LOG_LEVEL={args.log_level}"
    )
    for name, checkout in checkouts.items():
        print(f"  {name}: {checkout}")
    print(f"  {SEED_LIKE}: {HERE / '_floor_server.py'} --snekbox-url")
    print(f"{'way':<20}{'p50':>8}{'p95':>8}{'p50 - direct':>14}{'p95 - direct':>14}")
    for name, values in samples.items():
        if not name.endswith(FLOOR):
            p50, p95 = statistics.median(values), percentile(values, 95)
            print(f"{name:<20}{p50:8.1f}{p95:8.1f}{p50 - base50:14.1f}{p95 - base95:14.1f}")
    print(f"over the {SEED_LIKE} gateway (p50, p95; positive: slower):")
    for name, values in samples.items():
        gateway, _, transport = name.partition(" ")
        if gateway in checkouts and transport in ("HTTP", "SSE"):
            seed = samples[f"{SEED_LIKE} {transport}"]
            p50 = statistics.median(values) - statistics.median(seed)
            p95 = percentile(values, 95) - percentile(seed, 95)
            print(f"{name:<20}{p50:+8.1f}{p95:+8.1f}")
    print("floors, no code run (in the same loop):")
    for name, values in samples.items():
        if name.endswith(FLOOR):
            p50, p95 = statistics.median(values), percentile(values, 95)
            print(f"{name.removesuffix(FLOOR):<20}{p50:8.1f}{p95:8.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--snekbox-url", required=True, help="a running Snekbox, e.g. http://127.0.0.1:8060"
    )
    parser.add_argument("-n", type=int, default=200, help="calls per way (default 200)")
    parser.add_argument("--before", help="a checkout of the 'before' commit, for its gateway")
    parser.add_argument("--snekbox-before", help="another Snekbox, its plain /eval beside")
    parser.add_argument("--log-level", default="info", help="the gateways' MCP_LOG_LEVEL")
    parser.add_argument("--plot", action="store_true", help="run PLOT rather than print(1)")
    args = parser.parse_args()
    before = before_checkout(args.before)
    snekbox_url = args.snekbox_url.rstrip("/")
    httpx.options(f"{snekbox_url}/eval", timeout=10).raise_for_status()  # it is there

    checkouts = {"gateway": ROOT} | ({"before": before} if before else {})
    env = {"SNEKBOX_URL": snekbox_url, "MCP_LOG_LEVEL": args.log_level}
    with ExitStack() as stack:
        seed_port = free_port()
        seed_args = ["--port", str(seed_port), "--snekbox-url", snekbox_url]
        stack.enter_context(
            python_server(
                [str(HERE / "_floor_server.py"), *seed_args],
                f"GET http://127.0.0.1:{seed_port}/healthz",
                quiet=True,
            )
        )
        gateways = {SEED_LIKE: f"http://127.0.0.1:{seed_port}"}
        before_url = args.snekbox_before and args.snekbox_before.rstrip("/")
        for name, checkout in checkouts.items():
            port = free_port()
            if name == "before" and before_url:  # each gateway's prelude resident in its image
                env = env | {"SNEKBOX_URL": before_url}
            stack.enter_context(service_of(checkout, "python_mcp_server", port, env=env))
            gateways[name] = f"http://127.0.0.1:{port}"
        code = PLOT if args.plot else "print(1)"
        samples = asyncio.run(measure(args.n, snekbox_url, gateways, code, before_url))
    report(samples, checkouts, args)


if __name__ == "__main__":
    main()
