"""Requests the event loop must survive: too large, too many files, too much JSON structure.

Over a bound, a request gets a Snekbox-style 400 or 413 before any costly work; at the bounds,
its decoding and validation run beside the loop, so a trivial run meanwhile is answered in time.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import time
from collections.abc import AsyncIterator

import anyio
import httpx
import pytest

from evaluator import Evaluator, EvaluatorConfig, create_app
from evaluator.api import MAX_JSON_STRUCTURE
from evaluator.config import MiB
from tests.gateway.harness import evaluator_process, running
from tests.slow_clients import head, read_answer, stall

from .conftest import config, run

CAP = EvaluatorConfig().request_bytes_limit
#: How long a trivial run may take beside a hostile request: far above its ~0.1 s, far below
#: what the requests below cost without their bounds (the review's 1.5 million files: 42 s).
NOT_HELD = 10.0
_JSON = {"Content-Type": "application/json"}


def test_the_default_cap_fits_a_working_directory_of_files() -> None:
    # 48 MiB of content is 64 MiB of base64; 4 MiB more for the code and the JSON around it.
    assert EvaluatorConfig().request_bytes_limit == 68 * MiB
    assert EvaluatorConfig(workdir_size=3).request_bytes_limit == 8 * MiB
    assert EvaluatorConfig(max_request_bytes=1000).request_bytes_limit == 1000
    assert EvaluatorConfig.from_env({"EVALUATOR_MAX_REQUEST_FILES": "5"}).max_request_files == 5


async def test_a_body_announced_over_the_cap_is_refused_before_it_is_sent() -> None:
    with running(evaluator_process(5)) as service:
        # The head only: the answer must not wait for a body that is never sent.
        async with await stall(service.port, head(service.port, "POST", "/eval", CAP + 1)) as s:
            answer = await read_answer(s)
    status, _, body = answer.partition(b"\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 413 "), answer
    assert json.loads(body) == {
        "title": "413 Payload Too Large",
        "description": f"The request body is larger than {CAP} bytes.",
    }


async def test_a_streamed_body_over_the_cap_is_refused(client: httpx.AsyncClient) -> None:
    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: chunked
        yield b'{"input": "", "pad": "'
        for _ in range(CAP // MiB + 1):
            yield b"x" * MiB
        yield b'"}'

    response = await client.post("/eval", content=chunks(), headers=_JSON)
    assert response.status_code == 413
    assert response.json()["description"] == f"The request body is larger than {CAP} bytes."


async def test_more_files_than_allowed_are_refused(client: httpx.AsyncClient) -> None:
    files = [{"path": f"f{i}"} for i in range(1001)]
    response = await client.post("/eval", json={"input": "", "files": files})
    assert response.status_code == 400
    assert response.json() == {
        "title": "Request data failed validation",
        "description": "A request may send at most 1000 files, not 1001",
    }
    code = "import os; print(len([n for n in os.listdir() if not n.startswith('.')]))"
    result = await run(client, code, files=files[:1000])
    assert result["stdout"] == "1000\n"


async def test_a_smaller_files_bound_holds_too() -> None:
    app = create_app(Evaluator(config(max_request_files=2)))  # refused before any run
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://x") as h:
        files = [{"path": name} for name in "abc"]
        response = await h.post("/eval", json={"input": "", "files": files})
    assert response.json()["description"] == "A request may send at most 2 files, not 3"


@pytest.mark.parametrize(
    "body",
    [
        b'{"input": "", "pad": [' + b"0," * MAX_JSON_STRUCTURE + b"0]}",
        # Counted in strings too: large data travels as files, whose base64 has no commas.
        b'{"input": "' + b"," * MAX_JSON_STRUCTURE + b'"}',
    ],
    ids=["values", "in-a-string"],
)
async def test_too_much_json_structure_is_refused(client: httpx.AsyncClient, body: bytes) -> None:
    response = await client.post("/eval", content=body, headers=_JSON)
    assert response.status_code == 413
    assert response.json() == {
        "title": "413 Payload Too Large",
        "description": f"The request body has more than {MAX_JSON_STRUCTURE} commas and brackets; "
        "send large data as files.",
    }


async def test_json_nested_too_deep_is_invalid_json(client: httpx.AsyncClient) -> None:
    body = b'{"input": "", "pad": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    response = await client.post("/eval", content=body, headers=_JSON)
    assert response.status_code == 400
    assert response.json()["title"] == "Invalid JSON"
    assert "recursion" in response.json()["description"]


def _hostile(kind: str) -> bytes:
    """Bodies at (or just over) the bounds, each as costly to parse as its kind can be."""
    if kind == "review: 1.5 million files":
        return json.dumps({"input": "", "files": [{"path": ""}] * 1_500_000}).encode()
    if kind == "nested lists to the cap":
        return b'{"input": "", "pad": [' + b"[[]]," * ((CAP - 100) // 5) + b"[]]}"
    if kind == "1000 files of 48 KiB":
        content = base64.b64encode(os.urandom(48 * 1024)).decode()
        files = [{"path": f"f{i}", "content": content} for i in range(1000)]
        return json.dumps({"input": "print('big')", "files": files}).encode()
    if kind == "structure to the bound":
        pad = b"[[]]," * (MAX_JSON_STRUCTURE // 3 - 10)
        return b'{"input": "print(\'big\')", "pad": [' + pad + b"[]]}"
    if kind == "escapes to the cap":
        return json.dumps({"input": "print('big')", "pad": '"' * ((CAP - 100) // 2)}).encode()
    assert kind == "arguments to the bound"
    return json.dumps({"args": [0] * (MAX_JSON_STRUCTURE - 10)}).encode()


@pytest.mark.parametrize(
    ("kind", "status"),
    [
        ("review: 1.5 million files", 413),
        ("nested lists to the cap", 413),
        ("1000 files of 48 KiB", 200),
        ("structure to the bound", 200),
        ("escapes to the cap", 200),
        ("arguments to the bound", 400),
    ],
)
async def test_a_hostile_request_does_not_hold_a_trivial_run(
    client: httpx.AsyncClient, kind: str, status: int
) -> None:
    body = _hostile(kind)
    assert len(body) <= CAP
    hostile = asyncio.ensure_future(client.post("/eval", content=body, headers=_JSON))
    slowest = 0.0
    with anyio.fail_after(100):
        while True:  # trivial runs, one after the other, until the hostile request is answered
            started = time.monotonic()
            result = await run(client, "print(1)")
            slowest = max(slowest, time.monotonic() - started)
            assert result["stdout"] == "1\n"
            if hostile.done():
                break
        response = await hostile
    assert slowest < NOT_HELD, f"a trivial run took {slowest:.1f} s"
    assert response.status_code == status, response.text[:300]
    if status == 200:
        assert response.json()["stdout"] == "big\n"
