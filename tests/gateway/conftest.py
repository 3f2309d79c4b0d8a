"""The gateway under test, with short limits, on the built-in evaluator in-process or over HTTP.

``connect`` (from :mod:`tests.support`) is importable from here too, as it always was.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from python_mcp_server import Settings, create_app
from tests.support import TIME_LIMIT, closed_port, serve, wait_until_answers
from tests.support import connect as connect

#: The time limit of the gateways that test the kill itself, whose code never ends.
KILL_LIMIT = 2.0


def with_evaluator(settings: Settings, **changes: Any) -> Settings:
    """``settings`` with these changes to the built-in evaluator's config."""
    evaluator_config = settings.evaluator_config.model_copy(update=changes)
    return settings.model_copy(update={"evaluator_config": evaluator_config})


def with_time_limit(settings: Settings, time_limit: float) -> Settings:
    return with_evaluator(settings, time_limit=time_limit)


@pytest.fixture(scope="session")
def settings() -> Settings:
    return with_time_limit(Settings(), TIME_LIMIT)


@contextlib.contextmanager
def evaluator_service(
    time_limit: float,
    *,
    sessions: bool = False,
    port: int | None = None,
    env: Mapping[str, str] | None = None,
) -> Iterator[str]:
    """``python -m evaluator`` as its own process, on ``port`` (a free one if not given).

    Without ``sessions`` it is one-shot (``EVALUATOR_MAX_SESSIONS=0``): the gateway reaches it
    as it would Snekbox, and sessions keep files only; with them, it keeps live interpreters.
    """
    port = port or closed_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "evaluator", "--port", str(port), "--log-level", "warning"]
    environ = {**os.environ, "EVALUATOR_MAX_SESSIONS": "4" if sessions else "0", **(env or {})}
    process = subprocess.Popen([*command, "--time-limit", str(time_limit)], env=environ)
    try:
        assert wait_until_answers(f"{url}/eval", process, method="OPTIONS").status_code == 200
        yield url
    finally:
        process.terminate()
        process.wait(timeout=15)


@contextlib.contextmanager
def gateway(settings: Settings, where: str) -> Iterator[str]:
    """The gateway under uvicorn; its evaluator in-process, or a service at ``SNEKBOX_URL``:
    one-shot, as Snekbox (``over-http``), or keeping live sessions (``live-over-http``)."""
    with contextlib.ExitStack() as stack:
        if where in ("over-http", "live-over-http"):
            time_limit = settings.evaluator_config.time_limit
            service = evaluator_service(time_limit, sessions=where == "live-over-http")
            url = stack.enter_context(service)
            settings = settings.model_copy(update={"snekbox_url": url})
        yield stack.enter_context(serve(create_app(settings)))


@pytest.fixture(scope="session", params=["in-process", "over-http"])
def gateway_url(request: pytest.FixtureRequest, settings: Settings) -> Iterator[str]:
    with gateway(settings, request.param) as url:
        yield url


@pytest.fixture(scope="session", params=["in-process", "over-http"])
def kill_gateway_url(request: pytest.FixtureRequest, settings: Settings) -> Iterator[str]:
    """A gateway whose runs are killed after :data:`KILL_LIMIT` seconds."""
    with gateway(with_time_limit(settings, KILL_LIMIT), request.param) as url:
        yield url
