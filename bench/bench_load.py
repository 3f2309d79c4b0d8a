"""Load on the gateway: 50 concurrent MCP sessions, half SSE and half Streamable HTTP, 1,000 calls.

Starts ``python -m python_mcp_server`` (built-in evaluator, loopback, a free port) as its own
process, opens the sessions with the mcp SDK's clients and has each make its share of calls,
one after the other, each running ``print("<unique token>")``. Every result must carry exactly
its own token: none lost, duplicated or mixed up. "Busy" refusals are counted apart; the gateway
is started with MCP_MAX_WAITING=100 and MCP_MAX_WAIT=120 so that with 50 callers none should be
refused (the default queue of 32 would refuse some). Prints latency percentiles, throughput and
the peak memory of the gateway process and, separately, of its children (the sandboxes).

    uv run python bench/bench_load.py [--sessions 50] [--calls 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import anyio
from _common import descendants, free_port, percentile, python_server, status_kib
from mcp import Client
from mcp.client.sse import sse_client

OVERALL_LIMIT = 600.0  # seconds: the whole run is bounded


@contextmanager
def gateway_on(port: int, default_admission: bool) -> Iterator[subprocess.Popen[bytes]]:
    env = {**os.environ, "MCP_LOG_LEVEL": "warning"}
    if not default_admission:
        env |= {"MCP_MAX_WAITING": "100", "MCP_MAX_WAIT": "120"}
    env.pop("SNEKBOX_URL", None)
    env.pop("MCP_AUTH_TOKEN", None)
    env.pop("MCP_AUTH_TOKEN_FILE", None)
    args = ["-m", "python_mcp_server", "--host", "127.0.0.1", "--port", str(port)]
    probe = f"GET http://127.0.0.1:{port}/readyz"
    with python_server(args, probe, env=env, quiet=True) as process:
        yield process


# --- Memory -------------------------------------------------------------------------------------


class MemorySampler:
    """Samples the gateway's RSS and its children's total RSS every 50 ms, in a thread."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak_rss = 0
        self.peak_children = 0
        self.peak_children_count = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.peak_rss = max(self.peak_rss, status_kib(self.pid, "VmRSS"))
            children = descendants(self.pid)
            total = sum(status_kib(child, "VmRSS") for child in children)
            self.peak_children = max(self.peak_children, total)
            self.peak_children_count = max(self.peak_children_count, len(children))

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def hwm(self) -> int:
        """The kernel's own high-water mark of the gateway's RSS."""
        return status_kib(self.pid, "VmHWM")


# --- The load -----------------------------------------------------------------------------------


@dataclass
class Tally:
    latencies: list[float] = field(default_factory=list)
    seen: dict[str, int] = field(default_factory=dict)  # token -> times seen in its own result
    busy: int = 0
    errors: list[str] = field(default_factory=list)
    mixed_up: list[str] = field(default_factory=list)


async def session(url: str, number: int, calls: int, tally: Tally) -> None:
    transport = "sse" if number % 2 == 0 else "http"
    mcp = Client(sse_client(f"{url}/sse")) if transport == "sse" else Client(f"{url}/mcp")
    async with mcp:
        for i in range(calls):
            token = f"s{number:02d}-{transport}-c{i:03d}-{uuid.uuid4().hex}"
            started = time.perf_counter()
            result = await mcp.call_tool("execute_python_code", {"code": f"print({token!r})"})
            elapsed = time.perf_counter() - started
            first = result.content[0]
            text = first.text if first.type == "text" else ""
            if result.is_error:
                if "The gateway is busy" in text:
                    tally.busy += 1
                else:
                    tally.errors.append(f"{token}: {text[:200]}")
                continue
            tally.latencies.append(elapsed)
            stdout = (result.structured_content or {}).get("stdout")
            if stdout == token + "\n" and text.startswith(token + "\n"):
                tally.seen[token] = tally.seen.get(token, 0) + 1
            else:
                tally.mixed_up.append(f"{token}: got {stdout!r}")


async def load(url: str, sessions: int, total_calls: int) -> tuple[Tally, float]:
    tally = Tally()
    shares = [
        total_calls // sessions + (1 if n < total_calls % sessions else 0) for n in range(sessions)
    ]
    started = time.perf_counter()
    with anyio.fail_after(OVERALL_LIMIT):
        async with anyio.create_task_group() as group:
            for number, share in enumerate(shares):
                group.start_soon(session, url, number, share, tally)
    return tally, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=50)
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument(
        "--default-admission",
        action="store_true",
        help="keep the default MCP_MAX_WAITING / MCP_MAX_WAIT (some calls are refused as busy)",
    )
    args = parser.parse_args()

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with gateway_on(port, args.default_admission) as gateway:
        baseline = status_kib(gateway.pid, "VmRSS")
        with MemorySampler(gateway.pid) as memory:
            tally, total = asyncio.run(load(url, args.sessions, args.calls))
        hwm = memory.hwm

    ok = sum(tally.seen.values())
    duplicated = [t for t, n in tally.seen.items() if n > 1]
    lost = args.calls - ok - tally.busy - len(tally.errors) - len(tally.mixed_up)
    ms = [s * 1000 for s in tally.latencies]
    print(f"gateway: built-in evaluator, {os.cpu_count()} CPUs, loopback port {port}")
    print(
        f"sessions: {args.sessions} ({(args.sessions + 1) // 2} SSE, {args.sessions // 2} "
        f"Streamable HTTP); calls: {args.calls}"
    )
    print(
        f"results: {ok} with exactly their own token; {len(tally.mixed_up)} mixed up; "
        f"{len(duplicated)} duplicated; {lost} lost; {tally.busy} busy refusals; "
        f"{len(tally.errors)} other errors"
    )
    for line in (tally.errors + tally.mixed_up)[:10]:
        print("  ", line)
    if ms:
        print(
            f"latency ms: p50 {percentile(ms, 50):.0f}  p95 {percentile(ms, 95):.0f}  "
            f"p99 {percentile(ms, 99):.0f}  max {max(ms):.0f}"
        )
    print(f"total: {total:.1f} s, {len(ms) / total:.1f} calls/s")
    print(
        f"gateway memory: RSS {baseline / 1024:.0f} MiB at start, peak sampled "
        f"{memory.peak_rss / 1024:.0f} MiB, VmHWM {hwm / 1024:.0f} MiB"
    )
    print(
        f"children (sandboxes): peak total RSS {memory.peak_children / 1024:.0f} MiB, "
        f"at most {memory.peak_children_count} processes at once"
    )
    admission = "defaults" if args.default_admission else "MCP_MAX_WAITING=100, MCP_MAX_WAIT=120"
    print(f"admission: {admission}")
    if tally.mixed_up or duplicated or lost or tally.errors:
        sys.exit(1)


if __name__ == "__main__":
    main()
