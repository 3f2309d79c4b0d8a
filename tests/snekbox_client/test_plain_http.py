"""The lean HTTP/1.1 transport under the client: how answers are framed, when a connection is
kept for the next request, and what a misbehaving server becomes.

Raw servers on loopback (each connection handled in turn by the test's function), since what
matters is the bytes on the wire: ``Connection: close`` as Snekbox sends it, keep-alive as
uvicorn does, chunked bodies, a body that ends with the connection, a broken status line.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Callable

import anyio
import pytest

from snekbox_client import (
    ConnectionLost,
    EvalRequest,
    EvaluatorTimeout,
    SnekboxClient,
)
from tests.support import raw_server

pytestmark = pytest.mark.anyio

REQUEST = EvalRequest(input="print(1)")
ANSWER = json.dumps({"stdout": "1\n", "returncode": 0, "files": []}).encode()


def read_request(connection: socket.socket) -> bytes:
    """One whole request (head and ``Content-Length`` body), or ``b""`` if the client left."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = connection.recv(65536)
        if not chunk:
            return b""
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        body += connection.recv(65536)
    return head


def answering(
    answer: Callable[[bytes], bytes], *, requests_per_connection: int = 1
) -> tuple[Callable[[socket.socket], None], list[int]]:
    """A raw server's handler that answers each request with ``answer(head)``; the list
    counts the requests of each connection."""
    served: list[int] = []

    def handle(connection: socket.socket) -> None:
        served.append(0)
        connection.settimeout(10)
        for _ in range(requests_per_connection):
            with contextlib.suppress(OSError):
                if not read_request(connection):
                    return
                connection.sendall(answer(b""))
                served[-1] += 1

    return handle, served


def head(status: bytes = b"200 OK", *headers: bytes) -> bytes:
    return b"HTTP/1.1 " + status + b"\r\n" + b"".join(h + b"\r\n" for h in headers) + b"\r\n"


async def test_a_connection_the_server_closes_is_not_reused() -> None:
    """Snekbox (gunicorn's sync workers) answers ``Connection: close``: a new one each time."""
    answer = head(b"200 OK", b"Connection: close", b"Content-Length: %d" % len(ANSWER)) + ANSWER
    handle, served = answering(lambda _: answer)
    with raw_server(handle) as url:
        async with SnekboxClient(url) as client:
            for _ in range(3):
                assert (await client.eval(REQUEST)).stdout == "1\n"
    assert served == [1, 1, 1]


async def test_a_kept_alive_connection_carries_the_next_request() -> None:
    answer = head(b"200 OK", b"Content-Length: %d" % len(ANSWER)) + ANSWER
    handle, served = answering(lambda _: answer, requests_per_connection=3)
    with raw_server(handle) as url:
        async with SnekboxClient(url) as client:
            for _ in range(3):
                assert (await client.eval(REQUEST)).stdout == "1\n"
    assert served == [3]


async def test_an_idle_connection_the_server_closed_is_not_reused() -> None:
    """The server keeps it alive, then closes it (its keep-alive timeout) before the next."""
    answer = head(b"200 OK", b"Content-Length: %d" % len(ANSWER)) + ANSWER
    closed = threading.Event()

    def handle(connection: socket.socket) -> None:
        if read_request(connection):
            connection.sendall(answer)
        connection.shutdown(socket.SHUT_RDWR)
        closed.set()

    with raw_server(handle) as url:
        async with SnekboxClient(url) as client:
            assert (await client.eval(REQUEST)).stdout == "1\n"
            assert closed.wait(10)
            await anyio.sleep(0.2)  # the client's side sees the end of the connection
            assert (await client.eval(REQUEST)).stdout == "1\n"


async def test_a_chunked_answer_is_read_whole() -> None:
    pieces = [ANSWER[:10], ANSWER[10:11], ANSWER[11:]]
    body = b"".join(b"%x;ext=1\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\nX-T: 1\r\n\r\n"
    answer = head(b"200 OK", b"Transfer-Encoding: chunked") + body
    handle, served = answering(lambda _: answer, requests_per_connection=2)
    with raw_server(handle) as url:
        async with SnekboxClient(url) as client:
            for _ in range(2):
                assert (await client.eval(REQUEST)).stdout == "1\n"
    assert served == [2]  # the connection was kept: the chunked body ended where it said


async def test_an_answer_without_length_ends_with_its_connection() -> None:
    answer = head(b"200 OK", b"Content-Type: application/json") + ANSWER
    handle, served = answering(lambda _: answer)
    with raw_server(handle) as url:
        async with SnekboxClient(url) as client:
            for _ in range(2):
                assert (await client.eval(REQUEST)).stdout == "1\n"
    assert served == [1, 1]


async def test_an_informational_answer_is_skipped() -> None:
    answer = head(b"100 Continue") + head(b"200 OK", b"Content-Length: %d" % len(ANSWER))
    handle, _ = answering(lambda _: answer + ANSWER)
    with raw_server(handle) as url:
        async with SnekboxClient(url) as client:
            assert (await client.eval(REQUEST)).stdout == "1\n"


@pytest.mark.parametrize(
    "answer",
    [
        b"SPDY/3 200 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: many\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{}",
    ],
    ids=["not-http", "bad-header", "bad-length", "bad-chunk", "short-body"],
)
async def test_a_broken_answer_is_a_lost_connection(answer: bytes) -> None:
    handle, _ = answering(lambda _: answer)
    with raw_server(handle) as url:
        async with SnekboxClient(url) as client:
            with pytest.raises(ConnectionLost):
                await client.eval(REQUEST)


async def test_no_answer_in_time_is_a_timeout() -> None:
    with raw_server() as url:  # holds each connection, silent
        async with SnekboxClient(url, timeout=0.5) as client:
            with pytest.raises(EvaluatorTimeout):
                await client.eval(REQUEST)


async def test_the_request_is_what_httpx_would_send() -> None:
    """The head names the path, the Host, the JSON body's type and length; identity only."""
    heads: list[bytes] = []

    def handle(connection: socket.socket) -> None:
        heads.append(read_request(connection))
        connection.sendall(
            head(b"200 OK", b"Connection: close", b"Content-Length: %d" % len(ANSWER)) + ANSWER
        )

    with raw_server(handle) as url:
        async with SnekboxClient(url) as client:
            await client.eval(REQUEST)
    lines = heads[0].split(b"\r\n")
    assert lines[0] == b"POST /eval HTTP/1.1"
    fields = {k.lower(): v.strip() for k, _, v in (line.partition(b":") for line in lines[1:])}
    assert fields[b"host"] == url.removeprefix("http://").encode()
    assert fields[b"content-type"] == b"application/json"
    assert fields[b"accept-encoding"] == b"identity"
    assert int(fields[b"content-length"]) == len(
        json.dumps(REQUEST.to_json(), separators=(",", ":")).encode()
    )
