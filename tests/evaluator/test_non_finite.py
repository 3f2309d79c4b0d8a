"""NaN and the infinities, which Python's json accepts, are refused as invalid data (400), never
answered 500 with a traceback, wherever they are in a request (issue 27, finding 8)."""

from __future__ import annotations

import logging
import math

import httpx
import pytest

from snekbox_client import (
    ContentWanted,
    EvalRequest,
    InvalidRequest,
    check_request,
    parse_request,
)

from .conftest import run

_INVALID = "Request data failed validation"


@pytest.mark.parametrize(
    ("body", "number"),
    [
        (b'{"input": "print(1)", "time_limit": NaN}', "NaN"),
        (b'{"input": "print(1)", "time_limit": Infinity}', "Infinity"),
        (b'{"input": "print(1)", "time_limit": -Infinity}', "-Infinity"),
        # Not a literal of its own: a float too large to be finite.
        (b'{"input": "print(1)", "time_limit": 1e999}', "1e999"),
        (b'{"input": "", "content_wanted": {"paths": [], "max_bytes": NaN}}', "NaN"),
        (b'{"input": "", "content_wanted": {"head_bytes": Infinity}}', "Infinity"),
        # Fields the evaluator ignores, and values of the wrong type, are no way in either.
        (b'{"input": "", "anything": [1, {"deep": NaN}]}', "NaN"),
        (b'{"input": "", "args": ["-c", -Infinity]}', "-Infinity"),
    ],
)
async def test_non_finite_numbers_are_a_400(
    client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture, body: bytes, number: str
) -> None:
    with caplog.at_level(logging.ERROR):
        response = await client.post(
            "/eval", content=body, headers={"Content-Type": "application/json"}
        )
    assert response.status_code == 400, response.text
    assert response.json() == {"title": _INVALID, "description": f"{number} is not a finite number"}
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_finite_numbers_still_run(client: httpx.AsyncClient) -> None:
    result = await run(client, "print(1)", time_limit=20.5e0)
    assert result["stdout"] == "1\n"


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_a_body_decoded_elsewhere_is_checked_too(value: float) -> None:
    """``parse_request`` is public: a body decoded by another parser holds real floats."""
    with pytest.raises(InvalidRequest) as caught:
        parse_request({"input": "", "time_limit": value}, max_files=10)
    assert caught.value.title == _INVALID


@pytest.mark.parametrize("value", [math.nan, math.inf, 0.0, -1.0])
def test_a_request_cannot_be_built_with_a_time_limit_that_is_not_finite(value: float) -> None:
    """What the gateway builds in process: the model itself refuses it, so that
    :func:`check_request` (and the JSON body it would send to Snekbox) never sees it."""
    with pytest.raises(ValueError, match="positive, finite"):
        EvalRequest(input="", time_limit=value)


def test_check_request_passes_a_finite_time_limit() -> None:
    check_request(EvalRequest(input="", time_limit=0.5), max_files=10)


@pytest.mark.parametrize(
    "numbers", [{"max_bytes": math.nan}, {"head_bytes": math.inf}, {"max_bytes": 1.5}]
)
def test_content_wanted_takes_integers_only(numbers: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="non-negative integers"):
        ContentWanted(("*",), **numbers)  # type: ignore[arg-type]
