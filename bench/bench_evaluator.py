"""The built-in evaluator's overhead: ``print(1)`` through ``POST /eval`` vs a bare interpreter.

Starts ``python -m evaluator`` as a real uvicorn server on a free loopback port and measures,
interleaved in one run so that both see the same machine load:

- the latency of ``print(1)`` through ``POST /eval`` (a plain httpx client, one at a time), and
- a bare ``<interpreter> -c 'print(1)'`` subprocess of the same interpreter (its real path:
  ``python3`` on PATH may be a slow pyenv shim);

then the throughput (evaluations per second) with 1, 2, 4 and 8 concurrent clients.

    uv run python bench/bench_evaluator.py [-n 100] [--per-client 25]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time

import httpx
from _common import free_port, percentile, python_server

TARGET_MS = 15.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=100, help="runs of each kind (default 100)")
    parser.add_argument("--per-client", type=int, default=25, help="runs per client in throughput")
    args = parser.parse_args()

    interpreter = os.path.realpath(sys.executable)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    evaluator = ["-m", "evaluator", "--port", str(port), "--log-level", "warning"]
    with python_server(evaluator, f"OPTIONS {url}/eval", timeout=30):
        print(f"interpreter: {interpreter}   CPUs: {os.cpu_count()}   n={args.n}")
        _latency(url, interpreter, args.n)
        asyncio.run(_throughput(url, args.per_client))


def _latency(url: str, interpreter: str, n: int) -> None:
    evals: list[float] = []
    bares: list[float] = []
    venvs: list[float] = []
    with httpx.Client(base_url=url, trust_env=False, timeout=30) as client:
        for _ in range(5):  # warm-up: connection, first sandboxes
            client.post("/eval", json={"input": "print(1)"})
        for _ in range(n):
            started = time.perf_counter()
            response = client.post("/eval", json={"input": "print(1)"})
            evals.append(time.perf_counter() - started)
            answer = response.json()  # beyond these, the evaluator says how the run ended
            if [answer.get(key) for key in ("stdout", "returncode", "files")] != ["1\n", 0, []]:
                raise SystemExit(f"unexpected answer: {response.text}")
            for command, samples in ((interpreter, bares), (sys.executable, venvs)):
                started = time.perf_counter()
                subprocess.run([command, "-c", "print(1)"], capture_output=True, check=True)
                samples.append(time.perf_counter() - started)
    e50, e95 = _percentiles(evals)
    print(f"{'':34}{'p50 ms':>8}{'p95 ms':>8}{'diff p50':>10}{'diff p95':>10}")
    print(f"{'POST /eval print(1)':34}{e50:8.1f}{e95:8.1f}")
    # The realpath'd binary is the brief's reference; the venv's python (a direct symlink to the
    # same binary, no shim) is exactly what the sandbox runs: same site-packages, same .pth files.
    print(f"  realpath python: {interpreter}\n  venv python:     {sys.executable}")
    for label, samples in (("bare realpath python -c", bares), ("bare venv python -c", venvs)):
        b50, b95 = _percentiles(samples)
        verdict = "within target" if e50 - b50 <= TARGET_MS else "OVER target"
        print(f"{label:34}{b50:8.1f}{b95:8.1f}{e50 - b50:10.1f}{e95 - b95:10.1f}  {verdict}")
    print(f"(target: POST /eval at most {TARGET_MS:g} ms over the bare interpreter at p50)")


async def _throughput(url: str, per_client: int) -> None:
    print(f"\nthroughput ({per_client} runs per client)")
    async with httpx.AsyncClient(base_url=url, trust_env=False, timeout=60) as client:
        for clients in (1, 2, 4, 8):
            statuses: list[int] = []
            started = time.perf_counter()
            await asyncio.gather(*(_worker(client, per_client, statuses) for _ in range(clients)))
            elapsed = time.perf_counter() - started
            ok, busy = statuses.count(200), statuses.count(503)
            failed = len(statuses) - ok - busy
            print(f"  {clients} client(s): {ok / elapsed:6.1f} evals/s"
                  + (f"  ({busy} answered 503 busy)" if busy else "")
                  + (f"  ({failed} FAILED)" if failed else ""))  # fmt: skip


async def _worker(client: httpx.AsyncClient, runs: int, statuses: list[int]) -> None:
    for _ in range(runs):
        response = await client.post("/eval", json={"input": "print(1)"})
        statuses.append(response.status_code)


def _percentiles(samples: list[float]) -> tuple[float, float]:
    """p50 and p95, in ms."""
    return statistics.median(samples) * 1000, percentile(samples, 95) * 1000


if __name__ == "__main__":
    main()
