"""Hostile ``# /// script`` blocks through a real gateway and a real MCP client (issue 27, 5-6).

A block is the caller's argument: one too big, too deeply nested or otherwise unreadable is a
refusal (``isError``, a specific message, the metric's ``refused``), the code is not sent to the
evaluation service, and the block is read in a worker thread, never on the event loop. The
service is a small real app that counts what it is sent.
"""

from __future__ import annotations

import asyncio
import logging
import tomllib
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from gateway.choices import MAX_SCRIPT_CHARS
from python_mcp_server import Settings, create_app
from tests.support import connect, serve, text_of

pytestmark = pytest.mark.anyio


def block(*lines: str) -> str:
    """Code with a PEP 723 ``script`` block of these TOML lines."""
    return "\n".join(["# /// script", *(f"# {line}" for line in lines), "# ///", "print(1)"])


#: Each hostile block, and what the refusal says.
HOSTILE = {
    "0.9-MB": (
        block("dependencies = [", *[f"  'package{i}>=1.0'," for i in range(36_000)], "]"),
        f"characters long; the limit is {MAX_SCRIPT_CHARS:,}",
    ),
    "3000-deep": (block("x = " + "[" * 3000 + "]" * 3000), "nested too deeply to read"),
}


class Service:
    """An evaluation service answering every run with ``hi``, counting the runs it is sent."""

    def __init__(self) -> None:
        self.runs = 0

    async def evaluate(self, request: Request) -> JSONResponse:
        self.runs += 1
        return JSONResponse({"stdout": "hi\n", "returncode": 0})


@pytest.fixture(scope="module")
def service() -> Iterator[tuple[str, Service]]:
    counting = Service()
    with serve(Starlette(routes=[Route("/eval", counting.evaluate, methods=["POST"])])) as url:
        yield url, counting


@pytest.fixture(scope="module")
def gateway_url(service: tuple[str, Service]) -> Iterator[str]:
    with serve(create_app(Settings(snekbox_url=service[0]))) as url:
        yield url


def refused_calls(url: str) -> dict[str, float]:
    """The gateway's ``mcp_tool_calls_total`` by outcome."""
    counts = {}
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith("mcp_tool_calls_total{"):
            labels, value = line.rsplit(" ", 1)
            counts[labels.split('"')[1]] = float(value)
    return counts


@pytest.mark.parametrize("transport", ["sse", "http"])
@pytest.mark.parametrize("name", HOSTILE)
async def test_a_hostile_block_is_refused_and_the_code_not_run(
    gateway_url: str,
    service: tuple[str, Service],
    name: str,
    transport: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    code, says = HOSTILE[name]
    before, runs = refused_calls(gateway_url), service[1].runs
    async with connect(gateway_url, transport) as client:
        with anyio.fail_after(60):
            result = await client.call_tool("execute_python_code", {"code": code})
    after = refused_calls(gateway_url)
    assert result.is_error
    assert says in text_of(result)
    assert "whether the code ran is not known" not in text_of(result)
    assert service[1].runs == runs  # nothing was sent to run
    assert after.get("refused", 0) == before.get("refused", 0) + 1
    assert after.get("gateway_error", 0) == before.get("gateway_error", 0)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_a_block_is_read_off_the_event_loop(
    gateway_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the gateway parses a block: ``tomllib.loads`` notes whether an event loop runs
    in its thread (the server's loop runs in uvicorn's)."""
    on_loop: list[bool] = []
    loads = tomllib.loads

    def noted(text: str) -> dict[str, Any]:
        try:
            asyncio.get_running_loop()
            on_loop.append(True)
        except RuntimeError:
            on_loop.append(False)
        return loads(text)

    monkeypatch.setattr(tomllib, "loads", noted)
    async with connect(gateway_url, "http") as client:
        with anyio.fail_after(60):
            result = await client.call_tool(
                "execute_python_code", {"code": block("requires-python = '>=3'")}
            )
    assert not result.is_error, text_of(result)
    assert on_loop == [False]
