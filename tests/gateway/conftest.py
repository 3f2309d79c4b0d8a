"""The gateway under test, with short limits, on the built-in evaluator in-process or over HTTP."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace

import pytest
from mcp import Client
from mcp.client.sse import sse_client

from python_mcp_server import Settings, create_app
from tests.support import closed_port, serve, wait_until_answers

TIME_LIMIT = 2.0


@pytest.fixture(scope="session")
def settings() -> Settings:
    defaults = Settings()
    return replace(
        defaults, evaluator_config=replace(defaults.evaluator_config, time_limit=TIME_LIMIT)
    )


@pytest.fixture(scope="session")
def evaluator_service() -> Iterator[str]:
    """``python -m evaluator`` as its own process: the gateway reaches it as it would Snekbox."""
    port = closed_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "evaluator", "--port", str(port), "--log-level", "warning"]
    process = subprocess.Popen([*command, "--time-limit", str(TIME_LIMIT)])
    try:
        assert wait_until_answers(f"{url}/eval", process, method="OPTIONS").status_code == 200
        yield url
    finally:
        process.terminate()
        process.wait(timeout=15)


@pytest.fixture(scope="session", params=["in-process", "over-http"])
def gateway_url(request: pytest.FixtureRequest, settings: Settings) -> Iterator[str]:
    """The gateway under uvicorn; its evaluator in-process, or a service at ``SNEKBOX_URL``."""
    if request.param == "over-http":
        settings = replace(settings, snekbox_url=request.getfixturevalue("evaluator_service"))
    with serve(create_app(settings)) as url:
        yield url


def connect(base_url: str, transport: str) -> Client:
    """An mcp SDK client of the gateway over ``transport`` ("sse" or "http")."""
    if transport == "sse":
        return Client(sse_client(f"{base_url}/sse"))
    return Client(f"{base_url}/mcp")
