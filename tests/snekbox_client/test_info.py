"""``GET /info``: what a service offers beyond Snekbox's API, read as hostile input."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from snekbox_client import EvaluatorRejected, InvalidResponse, Python, ServiceInfo, SnekboxClient


def test_what_the_built_in_evaluator_says_is_read() -> None:
    body = {"sessions": {"max": 4, "idle_timeout": 900.0}, "time_limit": 15}
    assert ServiceInfo.from_json(body) == ServiceInfo(4, 900.0, 15.0)
    assert ServiceInfo.from_json({"sessions": {"max": 0}}) == ServiceInfo.none()


def test_the_interpreters_and_the_package_policy_are_read_and_round_trip() -> None:
    info = ServiceInfo(
        2,
        900.0,
        15.0,
        (Python("3.11.7", "/venv/bin/python"), Python("3.13.0", "/opt/py/bin/python3.13")),
        "allow-list",
        ("numpy", "tabulate"),
        None,
        120.0,
    )
    assert ServiceInfo.from_json(info.to_json()) == info
    off = ServiceInfo(0, packages="off", packages_why="uv is not found")
    assert ServiceInfo.from_json(off.to_json()) == off
    resident = ServiceInfo(1, resident_prelude="0123456789abcdef" * 2)
    assert ServiceInfo.from_json(resident.to_json()) == resident
    for other in ("../" * 11, 1, "0" * 64):  # not a digest this version knows: none kept
        body = {**resident.to_json(), "resident_prelude": other}
        assert ServiceInfo.from_json(body) == ServiceInfo(1)


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
        {"sessions": {"max": 1}, "pythons": {}},
        {"sessions": {"max": 1}, "pythons": [{"version": "3.13"}]},
        {"sessions": {"max": 1}, "pythons": [{"version": "three", "executable_path": "/p"}]},
        {"sessions": {"max": 1}, "pythons": [{"version": "3.13", "executable_path": "p"}]},
        {"sessions": {"max": 1}, "pythons": [{"version": "3.13", "executable_path": "/p\n"}]},
        {"sessions": {"max": 1}, "pythons": [{"version": "3.1", "executable_path": "/p"}] * 33},
        {"sessions": {"max": 1}, "packages": {"policy": "some"}},
        {"sessions": {"max": 1}, "packages": {"policy": "any", "allowed": ["-r x"]}},
        {"sessions": {"max": 1}, "packages": {"policy": "any", "allowed": "numpy"}},
        {"sessions": {"max": 1}, "packages": {"policy": "off", "why": "x" * 501}},
        {"sessions": {"max": 1}, "packages": {"policy": "any", "timeout": -1}},
        {"sessions": {"max": 1}, "packages": []},
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
