"""Failures worded for the model, the gateway's own failures, and what the server announces.

No sandbox: the wording is pure, and the gateway is driven in this process by an in-memory MCP
client, its evaluation service a small real app or a socket that never answers.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from importlib import metadata

import anyio
import pytest
from mcp import Client
from pydantic import BaseModel
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from gateway.connection import evaluation_service
from gateway.failures import GATEWAY_FAILED, explain
from python_mcp_server import Gateway, Settings, create_server
from snekbox_client import (
    ConnectionLost,
    EvaluatorRejected,
    EvaluatorTimeout,
    EvaluatorUnavailable,
)
from tests.support import closed_port, raw_server, serve, text_of

pytestmark = pytest.mark.anyio

ERROR = "Error executing tool execute_python_code: "


@pytest.fixture(scope="module")
def answering_service() -> Iterator[str]:
    """An evaluation service that answers every request with a plain result."""

    async def evaluate(request: Request) -> JSONResponse:
        return JSONResponse({"stdout": "hi\n", "returncode": 0})

    with serve(Starlette(routes=[Route("/eval", evaluate, methods=["POST"])])) as url:
        yield url


def test_a_timeout_says_whether_the_call_may_have_waited_for_a_worker() -> None:
    timeout = EvaluatorTimeout("http://snekbox:8060", 8)
    ran = explain(timeout, running=2, workers=2)
    assert ran == (
        "The evaluation service did not answer within 8 s; the result is lost. Retry, and if "
        "the code is slow, make it faster or smaller."
    )
    waited = explain(timeout, running=3, workers=2)
    assert waited.startswith("The evaluation service did not answer within 8 s; the result is")
    assert "3 evaluations were running when this one was sent, more than the service's 2 " in (
        waited
    )
    assert "may have waited for a free worker rather than run that long" in waited
    assert "make it faster" not in waited


def test_a_busy_queue_and_busy_live_sessions_are_told_apart() -> None:
    queue = explain(EvaluatorRejected(503, "Evaluation queue is full", "All 2 slots are busy"))
    sessions = explain(
        EvaluatorRejected(503, EvaluatorRejected.SESSIONS_BUSY, "all 4 sessions are running")
    )
    assert "queue is full" in queue and "queue" not in sessions
    assert "live sessions" in sessions and "did not run" in sessions


def test_a_lost_connection_is_not_unreachable() -> None:
    lost = explain(ConnectionLost("http://snekbox:8060", "Server disconnected"))
    assert lost == (
        "The connection to the evaluation service was lost before its answer came (Server "
        "disconnected); the code may have run, but its result is lost. Retry if running it "
        "again does no harm."
    )
    unreachable = explain(EvaluatorUnavailable("http://snekbox:8060", "connection refused"))
    assert "unreachable (connection refused); the code did not run" in unreachable


async def test_calls_that_queue_behind_the_workers_are_told_so() -> None:
    """Three calls at once against two workers: the third may only have waited, and is told."""
    with raw_server() as silent:
        settings = Settings(snekbox_url=silent, max_in_flight=3, eval_timeout=1.0)
        async with (
            Gateway(settings, evaluation_service(settings)) as gateway,
            Client(create_server(gateway)) as client,
        ):
            texts: list[str] = []

            async def call() -> None:
                result = await client.call_tool("execute_python_code", {"code": "print(1)"})
                texts.append(text_of(result))

            with anyio.fail_after(60):
                async with anyio.create_task_group() as calls:
                    for _ in range(3):
                        calls.start_soon(call)
    waited = [text for text in texts if "may have waited for a free worker" in text]
    slow = [text for text in texts if "if the code is slow, make it faster" in text]
    assert (len(waited), len(slow)) == (1, 2), texts
    assert "3 evaluations were running" in waited[0]


async def test_a_failure_of_the_gateway_itself_is_logged_counted_and_said(
    answering_service: str, caplog: pytest.LogCaptureFixture
) -> None:
    # No validation lets such a value in: it stands for a bug in rendering, after the run.
    # pydantic's own copy, which skips validation (Settings.model_copy validates).
    settings = Settings(snekbox_url=answering_service)
    broken = BaseModel.model_copy(settings, update={"max_result_bytes": None})
    caplog.set_level(logging.INFO, logger="python_mcp_server")
    async with (
        Gateway(broken, evaluation_service(broken)) as gateway,
        Client(create_server(gateway)) as client,
    ):
        with anyio.fail_after(60):
            result = await client.call_tool("execute_python_code", {"code": "print('hi')"})
        metrics = gateway.metrics.render().decode()
    assert result.is_error
    assert text_of(result) == ERROR + GATEWAY_FAILED
    assert 'mcp_tool_calls_total{outcome="gateway_error"} 1.0' in metrics
    assert "cancelled" not in metrics
    (failure,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert failure.name == "python_mcp_server" and failure.exc_info is not None
    assert isinstance(failure.exc_info[1], TypeError)


async def test_the_server_announces_the_packages_version() -> None:
    settings = Settings(snekbox_url=f"http://127.0.0.1:{closed_port()}")
    async with (
        Gateway(settings, evaluation_service(settings)) as gateway,
        Client(create_server(gateway), mode="legacy") as client,
    ):
        assert client.server_info is not None
        assert client.server_info.version == metadata.version("python-mcp-server") != ""


async def test_code_over_the_limit_is_refused_before_any_evaluation() -> None:
    settings = Settings(snekbox_url=f"http://127.0.0.1:{closed_port()}", max_code_chars=100)
    async with (
        Gateway(settings, evaluation_service(settings)) as gateway,
        Client(create_server(gateway)) as client,
    ):
        result = await client.call_tool("execute_python_code", {"code": "print(1)\n" * 20})
        metrics = gateway.metrics.render().decode()
    assert result.is_error
    assert "180 characters long; the limit is 100" in text_of(result)
    assert 'mcp_tool_calls_total{outcome="refused"} 1.0' in metrics
