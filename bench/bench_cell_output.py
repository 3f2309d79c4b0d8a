"""What reading a chatty cell costs the evaluator service: its CPU for a cell that prints a lot.

A gateway reads each cell of a live session with ``wait`` (the service answers at the cell's
end, or ``running`` after ``wait`` seconds). The cell's output comes to the service in as many
pieces as the code flushes; this bench measures the service's own CPU time (its threads,
``/proc/<pid>/task/*/schedstat``; not the sandbox's) over one such cell: ``--lines`` lines, each
flushed, 0.5 ms apart, read with ``wait`` 30 s. Each is the second cell of a new session, timed
once the machine has settled after the first (``pass``: the session's start, and the warm
sandbox made again, are not in it). With ``--before DIR``, another checkout's evaluator is
started the same way and the two take turns (seeded order), so that machine noise hits both
alike; each service runs one cell first, not counted.

    uv run python bench/bench_cell_output.py [-n 10] [--lines 3000] [--before /tmp/bench-before]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import uuid
from contextlib import ExitStack

import httpx
from _common import ROOT, before_checkout, cpu_ns, free_port, percentile, rounds, service_of, settle


def code(lines: int) -> str:
    """A cell printing ``lines`` lines, each flushed, 0.5 ms apart."""
    return f"import time\nfor i in range({lines}):\n    print(i, flush=True)\n    time.sleep(5e-4)"


async def post(client: httpx.AsyncClient, body: dict[str, object]) -> str:
    """``POST /eval``; its stdout, once checked to be an answer."""
    response = await client.post("/eval", json=body)
    if response.status_code != 200:
        raise SystemExit(f"unexpected answer: {response.status_code} {response.text[:500]}")
    stdout: str = response.json()["stdout"]
    return stdout


async def cell(client: httpx.AsyncClient, pid: int, lines: int) -> float:
    """One chatty cell, the second of a new session; the service's CPU milliseconds for it."""
    session = uuid.uuid4().hex
    await post(client, {"input": "pass", "session": session, "wait": 30.0})
    await settle()
    before = cpu_ns(pid)
    stdout = await post(client, {"input": code(lines), "session": session, "wait": 30.0})
    spent = (cpu_ns(pid) - before) / 1e6
    if stdout.count("\n") != lines:
        raise SystemExit(f"expected {lines} lines, got: {stdout[-500:]!r}")
    await client.delete(f"/sessions/{session}")
    return spent


async def measure(services: dict[str, tuple[str, int]], n: int, lines: int) -> None:
    clients = {
        name: httpx.AsyncClient(base_url=url, trust_env=False, timeout=120)
        for name, (url, _) in services.items()
    }
    samples: dict[str, list[float]] = {name: [] for name in services}
    for name, (_, pid) in services.items():  # first use, not counted
        await cell(clients[name], pid, lines)
    for turn in rounds(list(services), n):
        for name in turn:
            samples[name].append(await cell(clients[name], services[name][1], lines))
    for client in clients.values():
        await client.aclose()
    print(f"service CPU per cell of {lines} flushed lines read with wait, ms ({n} cells each)")
    print(f"{'evaluator':10} {'p50':>8} {'p95':>8}")
    for name, values in samples.items():
        print(f"{name:10} {statistics.median(values):8.1f} {percentile(values, 95):8.1f}")
    if "before" in samples:
        ratio = statistics.median(samples["after"]) / statistics.median(samples["before"])
        print(f"after/before p50: {ratio:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=10, help="cells of each evaluator (10)")
    parser.add_argument("--lines", type=int, default=3000, help="lines each cell prints (3000)")
    parser.add_argument("--before", help="a checkout of the 'before' commit")
    args = parser.parse_args()
    before = before_checkout(args.before)
    checkouts = {"after": ROOT} | ({"before": before} if before else {})
    with ExitStack() as stack:
        services = {}
        for name, checkout in checkouts.items():
            port = free_port()
            process = stack.enter_context(service_of(checkout, "evaluator", port, timeout=60))
            services[name] = (f"http://127.0.0.1:{port}", process.pid)
        asyncio.run(measure(services, args.n, args.lines))


if __name__ == "__main__":
    main()
