"""The HTTP app around the MCP server: health routes, start-up, the README's commands."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable
from typing import Any

import anyio
import httpx
import pytest
from mcp import Client

from evaluator import SandboxUnavailable
from gateway.connection import evaluation_service
from python_mcp_server import Gateway, Settings
from tests.gateway.conftest import with_evaluator
from tests.support import (
    assert_all_enforced_as_root,
    closed_port,
    connect,
    sse_endpoint,
    text_of,
    wait_until_answers,
)


def test_healthz_and_readyz(gateway_url: str, request: pytest.FixtureRequest) -> None:
    assert httpx.get(f"{gateway_url}/healthz").json() == {"status": "ok"}
    ready = httpx.get(f"{gateway_url}/readyz")
    assert (ready.status_code, ready.json()["status"]) == (200, "ready")
    local = request.node.callspec.params["gateway_url"] == "in-process"
    assert_all_enforced_as_root(ready.json(), local=local)


def test_bad_host_header_is_refused(gateway_url: str) -> None:
    response = httpx.post(
        f"{gateway_url}/mcp", headers={"Host": "evil.example:80"}, json={"jsonrpc": "2.0"}
    )
    assert response.status_code == 421


def test_a_refused_sse_stream_is_answered_without_an_error_logged(gateway_url: str) -> None:
    """A bad Host or Origin on ``GET /sse`` is refused, and is no error of the server's (the
    SDK raises after answering: uvicorn logged a traceback at ERROR for each one)."""
    handler = _Kept(logging.ERROR)
    logger = logging.getLogger("uvicorn.error")
    logger.addHandler(handler)
    try:
        for headers, status in (
            ({"Host": "evil.example:80"}, 421),
            ({"Origin": "http://evil.example"}, 403),
        ):
            response = httpx.get(f"{gateway_url}/sse", headers=headers, timeout=10)
            assert response.status_code == status
    finally:
        logger.removeHandler(handler)
    assert handler.records == [], [record.getMessage() for record in handler.records]


@pytest.mark.anyio
async def test_a_message_that_is_not_json_rpc_is_a_warning_not_an_error(gateway_url: str) -> None:
    handler = _Kept(logging.WARNING)
    logger = logging.getLogger("mcp.server.sse")
    logger.addHandler(handler)
    try:
        async with (
            httpx.AsyncClient(timeout=10) as http,
            http.stream("GET", f"{gateway_url}/sse") as stream,
        ):
            lines = stream.aiter_lines()
            endpoint = await sse_endpoint(lines)
            headers = {"Content-Type": "application/json"}
            answer = await http.post(f"{gateway_url}{endpoint}", content=b"{no", headers=headers)
    finally:
        logger.removeHandler(handler)
    assert (answer.status_code, answer.text) == (400, "Could not parse message")
    levels = [(record.levelname, record.exc_info) for record in handler.records]
    assert levels == [("WARNING", None)], levels


class _Kept(logging.Handler):
    """Keeps the records it is given."""

    def __init__(self, level: int) -> None:
        super().__init__(level)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.mark.anyio
async def test_no_sandbox_means_no_start(settings: Settings) -> None:
    broken = with_evaluator(settings, bwrap="/nonexistent/bwrap")
    with pytest.raises(SandboxUnavailable, match="SNEKBOX_URL"):
        async with Gateway(broken, evaluation_service(broken)):
            pass


@pytest.mark.parametrize(
    "command",
    [
        ["-c", "from python_mcp_server import main; main()", "--port", "{port}"],
        ["-m", "uvicorn", "python_mcp_server:starlette_app", "--port", "{port}"],
    ],
    ids=["python-mcp-server", "uvicorn"],
)
def test_readme_commands_serve_and_stop_cleanly(command: list[str]) -> None:
    port = closed_port()
    args = [arg.format(port=port) for arg in command]
    env = {**os.environ, "MCP_PORT": str(port), "MCP_LOG_LEVEL": "warning"}
    env.pop("SNEKBOX_URL", None)
    process = subprocess.Popen([sys.executable, *args], env=env, stderr=subprocess.PIPE)
    try:
        ready = wait_until_answers(f"http://127.0.0.1:{port}/readyz", process)
        assert (ready.status_code, ready.json()["status"]) == (200, "ready")
        assert_all_enforced_as_root(ready.json())
    finally:
        process.send_signal(signal.SIGTERM)
        # uvicorn shuts down gracefully, then re-raises the signal it caught.
        _, stderr = process.communicate(timeout=30)
    assert process.returncode in (0, -signal.SIGTERM)
    if "uvicorn" not in command:  # plain uvicorn takes its own --log-level, not MCP_LOG_LEVEL
        assert b" INFO " not in stderr and b"INFO:" not in stderr, "MCP_LOG_LEVEL=warning holds"


def start_gateway(port: int, **env: str) -> subprocess.Popen[bytes]:
    environ = {**os.environ, "MCP_LOG_LEVEL": "warning", **env}
    environ.pop("SNEKBOX_URL", None)
    command = [sys.executable, "-m", "python_mcp_server", "--port", str(port)]
    process = subprocess.Popen(command, env=environ)
    wait_until_answers(f"http://127.0.0.1:{port}/readyz", process)
    return process


@pytest.mark.anyio
async def test_sigterm_drains_calls_in_flight_and_turns_new_ones_away() -> None:
    port = closed_port()
    url = f"http://127.0.0.1:{port}"
    # A grace no loaded host comes near: the exit once the calls are done is told from it.
    process = start_gateway(port, MCP_SHUTDOWN_GRACE="300")
    results: dict[str, Any] = {}
    slow = {"code": "import time\ntime.sleep(2)\nprint('finished')"}
    try:
        with anyio.fail_after(60):
            async with connect(url, "sse") as sse, connect(url, "http") as http:

                async def run(name: str, client: Client) -> None:
                    results[name] = await client.call_tool("execute_python_code", slow)

                async with anyio.create_task_group() as calls:
                    calls.start_soon(run, "sse", sse)
                    calls.start_soon(run, "http", http)
                    # Both in flight first, however loaded the machine (a fixed 0.7 s was not
                    # enough under a busy loop on both cores: a call still in transit is new).
                    await _until_evaluations(url, 2)
                    process.send_signal(signal.SIGTERM)
                    await anyio.sleep(0.2)
                    late = await http.call_tool("execute_python_code", {"code": "print(1)"})
                    async with httpx.AsyncClient() as plain:
                        ready = await plain.get(f"{url}/readyz")
        started = time.monotonic()
        assert process.wait(timeout=200) in (0, -signal.SIGTERM)
        assert time.monotonic() - started < 150  # drained, not the whole grace
    finally:
        process.kill()
    for name in ("sse", "http"):
        assert not results[name].is_error, name
        assert text_of(results[name]).startswith("finished\n"), name
    assert late.is_error
    assert "The gateway is shutting down" in text_of(late)
    # Draining, it says it is not ready, so that a load balancer sends it no more calls.
    assert ready.status_code == 503
    assert ready.json() == {"status": "unavailable", "reason": "the gateway is shutting down"}


@pytest.mark.anyio
async def test_sigterm_stops_after_the_grace_period() -> None:
    port = closed_port()
    # The endless call would run for 120 s: only the grace ends it sooner.
    process = start_gateway(port, MCP_SHUTDOWN_GRACE="1", EVALUATOR_TIME_LIMIT="120")
    try:
        with anyio.fail_after(60):
            async with (
                connect(f"http://127.0.0.1:{port}", "http") as client,
                anyio.create_task_group() as calls,
            ):
                endless = {"code": "while True: pass"}
                calls.start_soon(_ignore_errors, client.call_tool("execute_python_code", endless))
                await _until_evaluations(
                    f"http://127.0.0.1:{port}", 1
                )  # in flight, not turned away
                sent = time.monotonic()
                process.send_signal(signal.SIGTERM)
                await anyio.to_thread.run_sync(process.wait, 30)
                calls.cancel_scope.cancel()
        assert time.monotonic() - sent < 25, "the grace period (1 s) bounds the drain"
    finally:
        process.kill()


async def _until_evaluations(url: str, count: int) -> None:
    """Until ``count`` evaluations are running or waiting for a slot (the gateway's metrics)."""
    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        while True:
            text = (await http.get("/metrics")).text
            values = re.findall(r"^mcp_evaluations_(?:in_flight|waiting) (\S+)$", text, re.M)
            if sum(float(v) for v in values) >= count:
                return
            await anyio.sleep(0.02)


async def _ignore_errors(call: Awaitable[object]) -> None:
    with contextlib.suppress(Exception):
        await call
