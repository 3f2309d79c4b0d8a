"""``GET /info``: what a service offers beyond Snekbox's API, read as hostile input."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from snekbox_client import EvaluatorRejected, InvalidResponse, ServiceInfo, SnekboxClient


def test_what_the_built_in_evaluator_says_is_read() -> None:
    body = {"sessions": {"max": 4, "idle_timeout": 900.0}, "time_limit": 15}
    assert ServiceInfo.from_json(body) == ServiceInfo(4, 900.0, 15.0)
    assert ServiceInfo.from_json({"sessions": {"max": 0}}) == ServiceInfo.none()


@pytest.mark.parametrize(
    "body",
    [
        None,
        [],
        {},
        {"sessions": []},
        {"sessions": {}},
        {"sessions": {"max": -1}},
        {"sessions": {"max": True}},
        {"sessions": {"max": 1.5}},
        {"sessions": {"max": 1, "idle_timeout": 0}},
        {"sessions": {"max": 1, "idle_timeout": "900"}},
        {"sessions": {"max": 1}, "time_limit": float("nan")},
        {"sessions": {"max": 1}, "time_limit": float("inf")},
        {"sessions": {"max": 1}, "time_limit": False},
    ],
)
def test_a_malformed_answer_is_refused(body: Any) -> None:
    with pytest.raises(InvalidResponse):
        ServiceInfo.from_json(body)


@pytest.mark.anyio
async def test_a_service_with_only_snekboxs_route_offers_nothing_more() -> None:
    """Snekbox has one route, ``/eval`` (its image cannot be pulled here): a 404 or 405 for
    ``/info`` means one-shot runs; any other failure is the service's failure."""

    async def eval_(request: Request) -> JSONResponse:
        return JSONResponse({"stdout": "", "returncode": 0, "files": []})

    async def broken(request: Request) -> JSONResponse:
        return JSONResponse({"title": "500 Internal Server Error"}, status_code=500)

    snekbox = Starlette(routes=[Route("/eval", eval_, methods=["POST"])])
    async with SnekboxClient(transport=httpx.ASGITransport(snekbox)) as client:
        assert await client.info() == ServiceInfo.none()
    failing = Starlette(routes=[Route("/info", broken)])
    async with SnekboxClient(transport=httpx.ASGITransport(failing)) as client:
        with pytest.raises(EvaluatorRejected, match="500"):
            await client.info()
