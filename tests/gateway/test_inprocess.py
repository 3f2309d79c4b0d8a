"""The in-process client: the API's checks and answers, without the HTTP.

Each request that ``POST /eval`` refuses is refused the same way when the gateway hands it to
its own evaluator: the same status, title and description, and the code does not run.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import anyio
import httpx
import pytest

from evaluator import Evaluator, EvaluatorConfig, create_app
from evaluator.inprocess import InProcessClient
from snekbox_client import EvalRequest, EvaluatorRejected, EvaluatorUnavailable, File

pytestmark = pytest.mark.anyio

MARKER = "ran.txt"


@pytest.fixture(scope="module")
async def service() -> AsyncIterator[Evaluator]:
    config = EvaluatorConfig(time_limit=10, concurrency=1, max_queue=1, warm_sandboxes=0)
    async with Evaluator(config) as started:
        yield started


def writes_marker(**changes: object) -> EvalRequest:
    fields: dict[str, object] = {"args": ("-c", f"open('{MARKER}', 'w')"), **changes}
    return EvalRequest(**fields)  # type: ignore[arg-type]


REFUSED = {
    "traversal": writes_marker(files=(File("../x", b""),)),
    "absolute": writes_marker(files=(File("/etc/x", b""),)),
    "reserved": writes_marker(files=(File(".tmp/x", b""),)),
    "too-many-files": writes_marker(files=tuple(File(f"f{i}", b"") for i in range(1001))),
    "bad-session-id": writes_marker(session="../../x"),
    "missing-executable": writes_marker(executable_path="/nonexistent/python"),
}


@pytest.mark.parametrize("name", REFUSED)
async def test_a_request_the_api_refuses_is_refused_alike(service: Evaluator, name: str) -> None:
    request = REFUSED[name]
    transport = httpx.ASGITransport(create_app(service))
    async with httpx.AsyncClient(transport=transport, base_url="http://evaluator") as http:
        answer = await http.post("/eval", json=request.to_json())
    assert answer.status_code == 400, answer.text
    with pytest.raises(EvaluatorRejected) as refused:
        await InProcessClient(service, timeout=30).eval(request)
    body = answer.json()
    assert (refused.value.status_code, refused.value.title) == (400, body["title"])
    assert refused.value.description == body.get("description")


async def test_a_full_queue_is_a_503(service: Evaluator) -> None:
    client = InProcessClient(service, timeout=30)
    sleeper = EvalRequest(args=("-c", "import time; time.sleep(2)"))
    running = [asyncio.ensure_future(client.eval(sleeper)) for _ in range(2)]
    try:
        with anyio.fail_after(60):
            while service._slots.waiting < 1:  # noqa: ASYNC110 - the queue's own state is tested
                await asyncio.sleep(0.01)
        with pytest.raises(EvaluatorRejected) as refused:
            await client.eval(EvalRequest(input="print(1)"))
        assert (refused.value.status_code, refused.value.title) == (503, "Evaluation queue is full")
    finally:
        results = await asyncio.gather(*running)
    assert [r.returncode for r in results] == [0, 0]


async def test_an_unexpected_failure_is_a_500_and_a_closed_client_is_unavailable(
    service: Evaluator,
) -> None:
    class Broken(Evaluator):
        async def run(self, request: object) -> object:  # type: ignore[override]
            raise OSError("disk on fire")

    broken = InProcessClient(Broken(service.config), timeout=30)
    with pytest.raises(EvaluatorRejected) as failed:
        await broken.eval(EvalRequest(input="print(1)"))
    assert (failed.value.status_code, failed.value.title) == (500, "500 Internal Server Error")
    await broken.ping()
    await broken.aclose()
    with pytest.raises(EvaluatorUnavailable):
        await broken.ping()


async def test_a_valid_request_runs(service: Evaluator) -> None:
    result = await InProcessClient(service, timeout=30).eval(
        writes_marker(files=(File("data/in.txt", b"x"),))
    )
    assert result.returncode == 0
    assert [f.path for f in result.files] == [MARKER]
