"""The evaluator under test: real sandboxes, reached through the ASGI app."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from evaluator import Evaluator, EvaluatorConfig, create_app

#: The service's time limit: no run a test means to finish comes near it, however loaded the
#: machine (a run that imports packages took over 2 s at load 25 on two cores).
TIME_LIMIT = 30.0
#: The limit a test sends with a run it means to be killed (``time_limit`` in the request), so
#: that the kill comes fast and no other run shares it.
KILL_LIMIT = 2.0


def config(**overrides: Any) -> EvaluatorConfig:
    """A roomy time limit (runs meant to be killed ask for ``KILL_LIMIT``); no warm sandboxes
    (test_warm.py has them), so that every run takes the same path."""
    values: dict[str, Any] = {"time_limit": TIME_LIMIT, "concurrency": 2, "warm_sandboxes": 0}
    values.update(overrides)
    return EvaluatorConfig(**values)


@pytest.fixture(scope="module")
async def evaluator() -> AsyncIterator[Evaluator]:
    async with Evaluator(config()) as started:
        yield started


@pytest.fixture(scope="module")
async def client(evaluator: Evaluator) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(create_app(evaluator))
    async with httpx.AsyncClient(
        transport=transport, base_url="http://evaluator", timeout=90
    ) as http:
        yield http


async def run(client: httpx.AsyncClient, code: str, **body: Any) -> dict[str, Any]:
    """POST ``code`` as ``input``; return the 200 answer's JSON."""
    response = await client.post("/eval", json={"input": code, **body})
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")
