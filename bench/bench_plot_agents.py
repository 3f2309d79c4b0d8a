"""Several agents calling a plot at once, without session_id: is every call still warm?

bench_plot.py measures one agent; this one measures a team's load: ``--agents`` (4) MCP clients
over Streamable HTTP, each calling bench_plot.py's SCRIPT (numpy + matplotlib, one figure back)
every ``--gap`` seconds (1.5, counted from the end of its previous call), all at once, against
the gateway of this working tree (built-in evaluator in its process, defaults) and, with
``--before DIR``, another checkout's started the same way. Without ``--session`` no call names
a session (what many models do: each call starts one); with it, each agent continues the
session its first call started.

The ways take turns in phases, each round in a new order (seeded), each phase once the machine
has settled (the phase before has ended and its evaluator has made its sandboxes again): each
gateway's phase is every agent making ``--calls`` calls; the bare interpreter's is ``--calls``
runs of ``<venv python> -c SCRIPT``, one at a time, ``--gap`` apart (its time on the machine the
agents are not loading). Prints p50 and p95 of each way, as ratios of the bare interpreter's p50.

Targets (issue 31): without ``--session``, p50 at most 0.25x and p95 at most 0.5x the bare
interpreter's p50; with it, as before (0.12x).

``--preimport MODULES`` adds a gateway of this working tree whose evaluator imports only those
(``EVALUATOR_PREIMPORT``) in its warm sandboxes: what a lighter warm sandbox gains under this load.

    uv run python bench/bench_plot_agents.py [--agents 4] [--calls 5] [--rounds 3]
        [--gap 1.5] [--session] [--before /tmp/bench-before] [--preimport numpy,matplotlib.pyplot]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from contextlib import AsyncExitStack, ExitStack
from typing import Any

from _common import ROOT, before_checkout, free_port, percentile, service_of, settle
from _common import rounds as rounds_of
from bench_plot import BARE, SCRIPT, via_bare
from mcp import Client

TARGET_P50, TARGET_P95 = 0.25, 0.5


async def agent(client: Client, calls: int, gap: float, session: bool, out: list[float]) -> None:
    """One agent: ``calls`` plots, ``gap`` seconds after each other's end."""
    arguments: dict[str, Any] = {"code": SCRIPT}
    for _ in range(calls):
        started = time.perf_counter()
        result = await client.call_tool("execute_python_code", arguments)
        out.append((time.perf_counter() - started) * 1000)
        images = [block for block in result.content if block.type == "image"]
        if result.is_error or len(images) != 1 or result.structured_content is None:
            raise SystemExit(f"expected one image, got: {result}"[:2000])
        if session:
            arguments["session_id"] = result.structured_content["session_id"]
        await asyncio.sleep(gap)


async def measure(
    urls: dict[str, str], agents: int, calls: int, rounds: int, gap: float, session: bool
) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {name: [] for name in [*urls, BARE]}
    async with AsyncExitStack() as stack:
        clients = {
            name: [await stack.enter_async_context(Client(f"{url}/mcp")) for _ in range(agents)]
            for name, url in urls.items()
        }
        for team in clients.values():  # warm-up: connections, font cache, first sandboxes
            await asyncio.gather(*(agent(c, 1, 0, False, []) for c in team))
        await via_bare()
        for order in rounds_of(list(samples), rounds):
            for name in order:
                await settle()  # the phase before has ended, its sandboxes made again
                if name == BARE:
                    for _ in range(calls):
                        started = time.perf_counter()
                        await via_bare()
                        samples[BARE].append((time.perf_counter() - started) * 1000)
                        await asyncio.sleep(gap)
                else:
                    team = clients[name]
                    await asyncio.gather(
                        *(agent(c, calls, gap, session, samples[name]) for c in team)
                    )
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=4, help="agents at once (4)")
    parser.add_argument("--calls", type=int, default=5, help="calls per agent per round (5)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (3)")
    parser.add_argument("--gap", type=float, default=1.5, help="seconds between calls (1.5)")
    parser.add_argument("--session", action="store_true", help="each agent continues its own")
    parser.add_argument("--before", help="a checkout of the 'before' commit, for its gateway")
    parser.add_argument("--preimport", help="also this tree's gateway with these preimports")
    args = parser.parse_args()
    before = before_checkout(args.before)

    checkouts = {"gateway": ROOT} | ({"gateway before": before} if before else {})
    environs: dict[str, dict[str, str]] = {name: {} for name in checkouts}
    if args.preimport is not None:
        checkouts["gateway lighter"] = ROOT
        environs["gateway lighter"] = {"EVALUATOR_PREIMPORT": args.preimport}
    with ExitStack() as stack:
        urls = {}
        for name, checkout in checkouts.items():
            port = free_port()
            env = environs[name]
            stack.enter_context(service_of(checkout, "python_mcp_server", port, env=env))
            urls[name] = f"http://127.0.0.1:{port}"
        samples = asyncio.run(
            measure(urls, args.agents, args.calls, args.rounds, args.gap, args.session)
        )

    kind = "continuing its session" if args.session else "without session_id"
    print(
        f"plot calls: {args.agents} agents at once, each {kind}, {args.gap:g} s apart; "
        f"{args.rounds} rounds of {args.calls} calls each; ms"
    )
    print(f"  bare: {sys.executable} -c SCRIPT, one at a time")
    for name, checkout in checkouts.items():
        settings = " ".join(f"{k}={v}" for k, v in environs[name].items()) or "defaults"
        print(f"  {name}: {checkout} (Streamable HTTP, built-in evaluator, {settings})")
    bare50 = statistics.median(samples[BARE])
    print(f"{'way':<18}{'calls':>6}{'p50':>8}{'p95':>8}{'max':>8}{'p50/bare':>10}{'p95/bare':>10}")
    for name, values in samples.items():
        p50, p95 = statistics.median(values), percentile(values, 95)
        print(
            f"{name:<18}{len(values):6d}{p50:8.0f}{p95:8.0f}{max(values):8.0f}"
            f"{p50 / bare50:10.2f}{p95 / bare50:10.2f}"
        )
    if not args.session:
        for name in checkouts:
            p50 = statistics.median(samples[name]) / bare50
            p95 = percentile(samples[name], 95) / bare50
            met = p50 <= TARGET_P50 and p95 <= TARGET_P95
            print(
                f"{name}: p50 {p50:.2f}x, p95 {p95:.2f}x bare; targets <= {TARGET_P50:g}x, "
                f"<= {TARGET_P95:g}x: {'meets' if met else 'MISSES'}"
            )


if __name__ == "__main__":
    main()
