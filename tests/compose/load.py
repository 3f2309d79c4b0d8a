"""Load on the stack's two gateways, as bench/bench_load.py puts it on one: concurrent MCP
clients, half over SSE and half over Streamable HTTP, each making its calls one after the other,
each call printing a token of its own that its result must carry back exactly.

Every call is bounded (CALL_LIMIT): one that takes longer is counted as hung, not waited for.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import anyio

from tests.support import connect

#: Far above any call under load on a loaded 2-core host; a call past it is "hung".
CALL_LIMIT = 120.0


@dataclass
class Tally:
    started: float = field(default_factory=time.monotonic)
    latencies: list[float] = field(default_factory=list)
    ok: int = 0
    mixed_up: list[str] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)  # first line of each tool error
    hung: int = 0
    last_ok: dict[int, bool] = field(default_factory=dict)  # client -> its last call was ok
    done: int = 0
    elapsed: float = 0.0
    #: Set once ``milestone`` calls are done (for what runs beside the load).
    milestone: int = 0
    reached: anyio.Event = field(default_factory=anyio.Event)

    @property
    def calls_per_second(self) -> float:
        return self.ok / self.elapsed if self.elapsed else 0.0

    def percentile(self, p: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))] if ordered else 0.0

    def summary(self) -> str:
        errors = sum(self.errors.values())
        return (
            f"{self.done} calls in {self.elapsed:.1f} s: {self.ok} ok ({self.calls_per_second:.1f}"
            f" calls/s), {errors} tool errors, {len(self.mixed_up)} mixed up, {self.hung} hung;"
            f" latency p50 {self.percentile(50):.2f} s, p95 {self.percentile(95):.2f} s,"
            f" max {max(self.latencies, default=0):.2f} s"
        )


async def client(url: str, number: int, calls: int, tally: Tally) -> None:
    transport = "sse" if number % 2 == 0 else "http"
    async with connect(url, transport) as mcp:
        for i in range(calls):
            token = f"c{number:02d}-{transport}-{i:03d}-{uuid.uuid4().hex}"
            started = time.monotonic()
            ok = False
            with anyio.move_on_after(CALL_LIMIT) as scope:
                result = await mcp.call_tool("execute_python_code", {"code": f"print({token!r})"})
            tally.done += 1
            if tally.done >= tally.milestone:
                tally.reached.set()
            if scope.cancelled_caught:
                tally.hung += 1
            elif result.is_error:
                first = result.content[0]
                text = first.text if first.type == "text" else repr(first)
                tally.errors[text.splitlines()[0][:160]] += 1
            elif (result.structured_content or {}).get("stdout") == token + "\n":
                tally.ok += 1
                tally.latencies.append(time.monotonic() - started)
                ok = True
            else:
                tally.mixed_up.append(f"{token}: {result.structured_content!r}"[:300])
            tally.last_ok[number] = ok


async def run(
    urls: list[str],
    clients: int,
    calls: int,
    meanwhile: Callable[[Tally], Coroutine[Any, Any, None]] | None = None,
    milestone: int = 0,
) -> Tally:
    """``clients`` clients spread over ``urls``, ``calls`` calls each; ``meanwhile`` runs beside
    them (it is cancelled when they are done), ``tally.reached`` set after ``milestone`` calls."""
    tally = Tally(milestone=milestone)
    async with anyio.create_task_group() as outer:
        if meanwhile is not None:
            outer.start_soon(meanwhile, tally)
        async with anyio.create_task_group() as group:
            for number in range(clients):
                group.start_soon(client, urls[number % len(urls)], number, calls, tally)
        tally.elapsed = time.monotonic() - tally.started
        outer.cancel_scope.cancel()
    return tally
