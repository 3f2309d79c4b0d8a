"""A plot round trip through the gateway vs the same script run by a bare interpreter.

The call an agent makes most: numpy + matplotlib, one figure back as an image. This starts the
gateway (``python -m python_mcp_server``, built-in evaluator, Streamable HTTP, the mcp SDK's
client) of this working tree and, with ``--before DIR``, the gateway of another checkout
(``git worktree add /tmp/bench-before 39914de``: the commit before warm sandboxes), both with
their defaults, and runs :data:`SCRIPT` through each and as ``<venv python> -c SCRIPT`` (the
interpreter of the same environment, its bytecode compiled, matplotlib's font cache warm: run
once first; it draws the figure but, with no display, shows nothing). Calls are made one at a
time, as an agent makes them: each starts ``--gap`` seconds (1.5) after the previous one ended,
the ways interleaved (each round in a new order, seeded), so that machine noise hits all alike,
and each call once the machine has settled (the call before has ended and its sandbox was made
again), so that no way pays for the one before it.
Every gateway result must hold exactly one image.

Prints p50 and p95 of each way, each gateway's p50 as a ratio of the bare interpreter's, and the
CPUs the machine kept busy, on average, while each way's calls ran (a way that takes one
CPU alone shows about 1; more means others ran meanwhile: the machine's noise, or a gateway
warming sandboxes).

Target: the gateway's p50 at most 0.25 x the bare interpreter's. A round of the three takes
about 8 s on 2 CPUs (15 rounds: 2.5 minutes, with the start).

    uv run python bench/bench_plot.py [-n 15] [--gap 1.5] [--before /tmp/bench-before]
        [--before-python /tmp/venv-plain/bin/python]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack, ExitStack
from pathlib import Path

from _common import (
    ROOT,
    before_checkout,
    free_port,
    machine_busy,
    percentile,
    rounds,
    service_of,
    settle,
)
from mcp import Client

SCRIPT = (
    "import numpy as np, matplotlib.pyplot as plt; x = np.linspace(0, 10, 10000); "
    "plt.plot(x, np.sin(x)); plt.title('bench'); plt.show()"
)
TARGET = 0.25
BARE = "bare python -c"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=15, help="calls of each way (default 15)")
    parser.add_argument("--gap", type=float, default=1.5, help="seconds between calls (1.5)")
    parser.add_argument("--before", help="a checkout of the 'before' commit, for its gateway")
    parser.add_argument(
        "--before-python",
        help="the interpreter of the 'before' gateway (default: this one), e.g. of an "
        "environment made without bytecode (see bench_evaluator.py)",
    )
    args = parser.parse_args()
    before = before_checkout(args.before)

    checkouts = {"gateway": ROOT} | ({"gateway before": before} if before else {})
    with ExitStack() as stack:
        urls = {}
        for name, checkout in checkouts.items():
            port = free_port()
            python = args.before_python if name == "gateway before" else None
            stack.enter_context(service_of(checkout, "python_mcp_server", port, python=python))
            urls[name] = f"http://127.0.0.1:{port}"
        samples, busy = asyncio.run(measure(urls, args.n, args.gap))

    print(f"plot round trip: {args.n} calls each way, interleaved, {args.gap:g} s apart; ms")
    print(f"  script: {SCRIPT}")
    print(f"  bare: {sys.executable} -c SCRIPT   CPUs: {os.cpu_count()}")
    for name, checkout in checkouts.items():
        print(f"  {name}: {checkout} (Streamable HTTP, built-in evaluator, defaults)")
    bare50 = statistics.median(samples[BARE])
    print(f"{'way':<18}{'p50':>8}{'p95':>8}{'min':>8}{'max':>8}{'p50/bare':>10}{'CPUs busy':>11}")
    for name, values in samples.items():
        p50, p95 = statistics.median(values), percentile(values, 95)
        cpus = statistics.mean(busy[name])
        print(
            f"{name:<18}{p50:8.0f}{p95:8.0f}{min(values):8.0f}{max(values):8.0f}"
            f"{p50 / bare50:10.2f}{cpus:11.2f}"
        )
    for name in checkouts:
        ratio = statistics.median(samples[name]) / bare50
        verdict = "meets" if ratio <= TARGET else f"MISSES (by {ratio / TARGET:.1f}x)"
        print(f"{name}: p50 {ratio:.2f} x bare; target <= {TARGET:g} x: {verdict}")
    if "gateway before" in samples:
        after, before_ = (statistics.median(samples[k]) for k in ("gateway", "gateway before"))
        print(f"gateway p50 after / before: {after / before_:.2f}")


async def measure(
    urls: dict[str, str], n: int, gap: float
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Per way, the call latencies (ms) and the CPUs the machine kept busy during each."""
    samples: dict[str, list[float]] = {name: [] for name in [*urls, BARE]}
    busy: dict[str, list[float]] = {name: [] for name in samples}
    async with AsyncExitStack() as clients:
        ways: list[tuple[str, Callable[[], Awaitable[None]]]] = []
        for name, url in urls.items():
            client = await clients.enter_async_context(Client(f"{url}/mcp"))
            ways.append((name, via_gateway(client)))
        ways.append((BARE, via_bare))
        for _, way in ways:  # warm-up: connections, font cache, the first sandboxes
            for _ in range(2):
                await way()
                await asyncio.sleep(gap)
        for order in rounds(ways, n):
            for name, way in order:
                await asyncio.sleep(gap)
                await settle()  # the call before has ended, its sandbox made again
                busy0 = machine_busy()
                started = time.perf_counter()
                await way()
                elapsed = time.perf_counter() - started
                busy1 = machine_busy()
                samples[name].append(elapsed * 1000)
                busy[name].append((busy1 - busy0) / elapsed)
    return samples, busy


def via_gateway(client: Client) -> Callable[[], Awaitable[None]]:
    async def call() -> None:
        result = await client.call_tool("execute_python_code", {"code": SCRIPT})
        images = [block for block in result.content if block.type == "image"]
        if result.is_error or len(images) != 1:
            raise SystemExit(f"expected one image, got: {result}"[:2000])

    return call


async def via_bare() -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        SCRIPT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")},
        cwd=Path.home(),
    )
    _, stderr = await process.communicate()
    if process.returncode != 0:
        raise SystemExit(f"the bare interpreter failed ({process.returncode}): {stderr!r}")


if __name__ == "__main__":
    main()
