"""``python -m evaluator`` against slow and surplus clients: nothing holds a socket for good.

One real service on a loopback port, with a 3 s request timeout and a cap of 300 connections;
raw sockets send half a request (head or body) and stall, or trickle it a byte at a time.
"""

from __future__ import annotations

from collections.abc import Iterator

import anyio
import httpx
import pytest

from serving.protocol import MAX_HEAD_BYTES
from tests.gateway.harness import ServiceProcess, evaluator_process, running
from tests.slow_clients import (
    KEPT_PAST,
    MANY,
    SMALL_CAP,
    answered_after_a_pause,
    drop_many,
    head,
    padded,
    read_until_closed,
    refuse_beyond_cap,
    room_made_at_cap,
    stall,
    trickle,
)

pytestmark = pytest.mark.anyio

REQUEST_TIMEOUT = 3
MAX_CONNECTIONS = 300
BODY = b'{"input": "print(42)"}'


@pytest.fixture(scope="module")
def service() -> Iterator[ServiceProcess]:
    limits = ["--request-timeout", str(REQUEST_TIMEOUT), "--max-connections", str(MAX_CONNECTIONS)]
    with running(evaluator_process(30, *limits)) as started:
        yield started


def eval_head(service: ServiceProcess) -> bytes:
    return head(service.port, "POST", "/eval", len(BODY))


async def test_a_half_sent_head_is_dropped(service: ServiceProcess) -> None:
    async with await stall(service.port, eval_head(service)[:30]) as stream:
        answer = await read_until_closed(stream)
    assert answer.startswith(b"HTTP/1.1 408 Request Timeout\r\n"), answer
    assert answer.endswith(b"The request headers did not arrive within 3 s.\n")


async def test_a_head_sent_a_byte_at_a_time_is_dropped_too(service: ServiceProcess) -> None:
    async with await stall(service.port, b"") as stream, anyio.create_task_group() as group:
        group.start_soon(trickle, stream, eval_head(service))
        answer = await read_until_closed(stream)
    assert answer.startswith(b"HTTP/1.1 408 Request Timeout\r\n"), answer


async def test_a_half_sent_head_after_an_answer_is_dropped(service: ServiceProcess) -> None:
    """On a kept-alive connection, the next request's head is bounded from its first byte."""
    options = f"OPTIONS /eval HTTP/1.1\r\nHost: 127.0.0.1:{service.port}\r\n\r\n".encode()
    async with await stall(service.port, options) as stream:
        with anyio.fail_after(30):
            answer = b""
            while b"\r\n\r\n" not in answer:
                answer += await stream.receive()
        assert answer.startswith(b"HTTP/1.1 200 OK\r\n")
        await stream.send(eval_head(service)[:30])
        answer = await read_until_closed(stream)
    assert answer.startswith(b"HTTP/1.1 408 Request Timeout\r\n"), answer


async def test_a_head_past_its_bound_is_refused_at_once(service: ServiceProcess) -> None:
    """The parser holds an unfinished head whole: past the bound it is refused and closed, not
    held until the request timeout."""
    long_head = padded(eval_head(service), MAX_HEAD_BYTES, finished=False)
    async with await stall(service.port, long_head) as stream:
        answer = await read_until_closed(stream)
    assert answer.startswith(b"HTTP/1.1 400 Bad Request\r\n"), answer
    assert answer.endswith(b"Invalid HTTP request received.")


async def test_a_long_head_within_its_bound_is_served(service: ServiceProcess) -> None:
    long_head = padded(eval_head(service), MAX_HEAD_BYTES - 1024, finished=True)
    async with await stall(service.port, long_head + BODY) as stream:
        with anyio.fail_after(30):
            answer = b""
            while b'"returncode"' not in answer:
                answer += await stream.receive()
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n"), answer


async def test_a_connection_that_sends_nothing_is_closed(service: ServiceProcess) -> None:
    async with await stall(service.port, b"") as stream:
        assert await read_until_closed(stream) == b""


@pytest.mark.parametrize("send", ["stall", "trickle"])
async def test_a_half_sent_body_is_dropped(service: ServiceProcess, send: str) -> None:
    async with (
        await stall(service.port, eval_head(service) + BODY[:5]) as stream,
        anyio.create_task_group() as group,
    ):
        if send == "trickle":
            group.start_soon(trickle, stream, BODY[5:] * 20)
        answer = await read_until_closed(stream)
    assert answer.startswith(b"HTTP/1.1 408 Request Timeout\r\n"), answer
    assert answer.endswith(b"The request body did not arrive within 3 s.\n")


async def test_a_request_sent_in_time_is_answered(service: ServiceProcess) -> None:
    """The same raw request, sent whole, runs: the deadline drops only what is late."""
    async with await stall(service.port, eval_head(service) + BODY) as stream:
        with anyio.fail_after(60):
            answer = b""
            while b'"returncode":0' not in answer:
                answer += await stream.receive()
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and b'"stdout":"42\\n"' in answer


@pytest.mark.parametrize("part", ["head", "body"])
async def test_many_stalled_clients_are_all_dropped(service: ServiceProcess, part: str) -> None:
    data = eval_head(service)[:30] if part == "head" else eval_head(service) + BODY[:5]
    answers = await drop_many(service, data, ("OPTIONS", "/eval"))
    assert len(answers) == MANY
    assert all(answer.startswith(b"HTTP/1.1 408 ") for answer in answers)


async def test_a_connection_beyond_the_cap_is_refused(service: ServiceProcess) -> None:
    answer = await refuse_beyond_cap(service, MAX_CONNECTIONS, eval_head(service)[:30])
    assert answer.startswith(b"HTTP/1.1 503 Service Unavailable\r\n"), answer
    assert b"Too many connections (300 are open)" in answer
    # The held connections are gone (closed by the test): the service serves again.
    with anyio.fail_after(30):
        while True:
            try:
                async with httpx.AsyncClient(timeout=5) as http:
                    if (await http.options(f"{service.url}/eval")).status_code == 200:
                        break
            except httpx.TransportError:
                pass
            await anyio.sleep(0.1)


async def test_an_idle_connection_outlives_the_gateways_keep_alive(service: ServiceProcess) -> None:
    """Kept open past a gateway's 4 s (and uvicorn's own 5 s): the gateway never sends on a
    connection the evaluator is closing."""
    heads = await answered_after_a_pause(service.port, "/info", KEPT_PAST)
    assert [h.split(b"\r\n", 1)[0] for h in heads] == [b"HTTP/1.1 200 OK"] * 2, heads


async def test_at_the_cap_the_connection_idle_the_longest_makes_room() -> None:
    """Idle kept-alive connections (a gateway's pool, 75 s at most) lock out no one."""
    with running(evaluator_process(30, "--max-connections", str(SMALL_CAP))) as service:
        await room_made_at_cap(service, "/info")
