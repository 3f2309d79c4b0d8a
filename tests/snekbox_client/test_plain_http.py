"""The lean HTTP/1.1 transport under the client: how answers are framed, when a connection is
kept for the next request, and what a misbehaving server becomes.

Raw servers on loopback (each connection handled in turn by the test's function), since what
matters is the bytes on the wire: ``Connection: close`` as Snekbox sends it, keep-alive as
uvicorn does, chunked bodies, a body that ends with the connection, a broken status line.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import select
import socket
import struct
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import httpx
import pytest

from snekbox_client import (
    ConnectionLost,
    EvalRequest,
    EvaluatorTimeout,
    EvaluatorUnavailable,
    SnekboxClient,
)
from snekbox_client._plain_http import PlainHTTPTransport, _Connection
from tests.support import raw_server, read_request, reset_unread

pytestmark = pytest.mark.anyio

REQUEST = EvalRequest(input="print(1)")
ANSWER = json.dumps({"stdout": "1\n", "returncode": 0, "files": []}).encode()


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


async def test_an_answer_trickled_past_its_time_is_a_timeout() -> None:
    """Each byte within the read timeout, the whole far beyond it: the call ends all the same,
    within its time and a few seconds more for the bytes (not after the 100 s of the answer)."""
    stop = threading.Event()

    def handle(connection: socket.socket) -> None:
        with contextlib.suppress(OSError):
            if read_request(connection):
                connection.sendall(head(b"200 OK", b"Content-Length: 1000") + b"{")
                while not stop.wait(0.1):
                    connection.sendall(b" ")

    with raw_server(handle) as url:
        try:
            async with SnekboxClient(url, timeout=0.5, connect_timeout=0.5) as client:
                with anyio.fail_after(60), pytest.raises(EvaluatorTimeout):
                    await client.eval(REQUEST)
        finally:
            stop.set()


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


# -- the transport itself, against answers no honest server sends ------------------------------


async def test_an_idle_connection_closed_before_the_loop_saw_it_is_not_reused() -> None:
    """The server's end of file is in the socket, but the event loop has not polled since: the
    socket itself says so (reused, the request would meet a reset: "the code may have run")."""
    answer = head(b"200 OK", b"Content-Length: %d" % len(ANSWER)) + ANSWER
    closed = threading.Event()

    def handle(connection: socket.socket) -> None:
        if read_request(connection):
            connection.sendall(answer)
        if not closed.is_set():  # the first connection only
            connection.shutdown(socket.SHUT_RDWR)
            closed.set()

    transport = keeping()
    async with serving(handle, transport) as url:
        await fetch(url, transport)
        assert closed.wait(10)  # blocking: the loop does not turn until the next request
        assert (await fetch(url, transport))[1] == ANSWER


def resetting(answer: bytes, then: str) -> tuple[Callable[[socket.socket], None], list[str]]:
    """A raw server's handler: its first connection answers one request and is kept alive;
    when the next request comes on it, the server ``then``: ``"resets"`` it unread (a server
    gone, its socket closed under the request), ``"resets-answering"`` after reading it and
    sending part of an answer, or ``"closes"`` after reading it (a server that died running
    the code). Later connections are answered. The list says what each connection saw."""
    seen: list[str] = []

    def handle(connection: socket.socket) -> None:
        connection.settimeout(10)
        with contextlib.suppress(OSError):
            if not read_request(connection):
                return
            connection.sendall(answer)
            if seen:  # a later connection
                seen.append("answered")
                return
            select.select([connection], [], [], 10)  # the next request has come
            if then != "resets":
                read_request(connection)
            if then == "resets-answering":
                connection.sendall(b"HTTP/1.1 200 OK\r\n")
            if then != "closes":  # closed with SO_LINGER 0: a reset, not an end of file
                connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            seen.append(then)

    return handle, seen


async def test_a_kept_connection_reset_under_an_unread_request_sends_it_again_once() -> None:
    """The service died while its connection was idle, and the idle check could not tell yet:
    the reset says the request was never read, so it goes once more on a new connection."""
    answer = head(b"200 OK", b"Content-Length: %d" % len(ANSWER)) + ANSWER
    handle, seen = resetting(answer, "resets")
    transport = keeping()
    async with serving(handle, transport) as url:
        await fetch(url, transport)
        assert (await fetch(url, transport))[1] == ANSWER
    assert seen == ["resets", "answered"]


@pytest.mark.parametrize("then", ["closes", "resets-answering"])
async def test_a_kept_connection_lost_after_its_request_was_read_is_not_sent_again(
    then: str,
) -> None:
    """The request was read (the code may have run): the loss is the caller's to report."""
    answer = head(b"200 OK", b"Content-Length: %d" % len(ANSWER)) + ANSWER
    handle, seen = resetting(answer, then)
    transport = keeping()
    async with serving(handle, transport) as url:
        await fetch(url, transport)
        with pytest.raises((httpx.ReadError, httpx.RemoteProtocolError)):
            await fetch(url, transport)
    assert seen == [then]


async def test_a_new_connection_reset_under_an_unread_request_is_one_never_made() -> None:
    """A listening socket that outlives its server for a moment (held by a child being
    spawned) takes the connection into its backlog, then resets it with the request unread:
    the code did not run, which the caller says as for a refused connection."""
    seen: list[bool] = []

    async with serving(lambda connection: seen.append(reset_unread(connection))) as url:
        with pytest.raises(httpx.ConnectError, match="reset with the request unread"):
            await fetch(url)
        async with SnekboxClient(url) as client:
            with pytest.raises(EvaluatorUnavailable, match="reset with the request unread"):
                await client.eval(REQUEST)
    assert seen == [True, True]


def holding(answer: bytes, *, closed: list[bool] | None = None) -> Callable[[socket.socket], None]:
    """A raw server's handler that answers the first request with ``answer`` and then holds
    the connection until the client leaves (``closed`` gets ``True`` when it does): an answer
    that does not frame itself would make the client wait for its read timeout."""

    def handle(connection: socket.socket) -> None:
        connection.settimeout(10)
        with contextlib.suppress(OSError):
            if read_request(connection):
                connection.sendall(answer)
            while connection.recv(65536):
                pass
            if closed is not None:
                closed.append(True)

    return handle


@contextlib.asynccontextmanager
async def serving(
    handle: Callable[[socket.socket], None], transport: PlainHTTPTransport | None = None
) -> AsyncIterator[str]:
    """A raw server for ``handle``; on the way out ``transport`` is closed and the loop turns
    once more, so that the sockets the client closed are closed for real (asyncio closes a
    socket on the next turn) before the server waits for its handler to end."""
    with raw_server(handle) as url:
        try:
            yield url
        finally:
            if transport is not None:
                await transport.aclose()
            await anyio.sleep(0.05)


async def fetch(
    url: str, transport: PlainHTTPTransport | None = None, *, seconds: float = 5.0
) -> tuple[httpx.Response, bytes]:
    """One POST through the transport, its body read whole."""
    own = transport is None
    transport = transport or PlainHTTPTransport()
    request = httpx.Request(
        "POST",
        url + "/eval",
        content=b"{}",
        extensions={"timeout": httpx.Timeout(seconds).as_dict()},
    )
    response = await transport.handle_async_request(request)
    try:
        body = b"".join([piece async for piece in stream_of(response)])
    finally:
        await response.aclose()
        if own:
            await transport.aclose()
    return response, body


def stream_of(response: httpx.Response) -> httpx.AsyncByteStream:
    assert isinstance(response.stream, httpx.AsyncByteStream)
    return response.stream


def keeping(**limits: Any) -> PlainHTTPTransport:
    return PlainHTTPTransport(httpx.Limits(max_keepalive_connections=4, **limits))


CHUNKED = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"


@pytest.mark.parametrize(
    "answer",
    [
        head(b"200 OK", b"Content-Length: -1") + b"{}",
        head(b"200 OK", b"Content-Length: +2") + b"{}",
        head(b"200 OK", b"Content-Length: 1_0") + b"{}",
        head(b"200 OK", b"Content-Length: 2", b"Content-Length: 3") + b"{}",
        head(b"200 OK", b"Content-Length: 2, 3") + b"{}",
        head(b"200 OK", b"Content-Length: 99999999999999999999") + b"{}",
        head(b"200 OK", b"Transfer-Encoding: gzip, chunked") + b"2\r\n{}\r\n0\r\n\r\n",
        head(b"200 OK", b"Transfer-Encoding: xchunked") + b"2\r\n{}\r\n0\r\n\r\n",
        head(b"200 OK", b"Transfer-Encoding: identity", b"Content-Length: 2") + b"{}",
        CHUNKED + b"-2\r\n{}\r\n0\r\n\r\n",
        CHUNKED + b"0x2\r\n{}\r\n0\r\n\r\n",
        CHUNKED + b" 2\r\n{}\r\n0\r\n\r\n",
        CHUNKED + b"1111111111111111\r\n{}",
        CHUNKED + b"2\r\n{}XX0\r\n\r\n",
        CHUNKED + b"1;" + b"e" * 70_000 + b"\r\n",
        CHUNKED + b"0\r\n" + b"X-Trailer: 1\r\n" * 10_000,
        head(b"200 OK", b"X-Long: " + b"a" * 70_000),
        head(b"200 OK", *[b"X-Many: 1"] * 300, b"Content-Length: 2") + b"{}",
        head(b"200 OK", b"X-A: a\rb", b"Content-Length: 2") + b"{}",
        head(b"200 OK", b"X-A: a\0b", b"Content-Length: 2") + b"{}",
        head(b"200 OK", b" X-A: folded first", b"Content-Length: 2") + b"{}",
        head(b"2000 OK", b"Content-Length: 2") + b"{}",
        b"HTTP/1.x 200 OK\r\nContent-Length: 2\r\n\r\n{}",
        head(b"100 Continue") * 50 + head(b"200 OK", b"Content-Length: 2") + b"{}",
        head(b"101 Switching Protocols", b"Upgrade: h2c"),
    ],
    ids=[
        "negative-length",
        "signed-length",
        "underscored-length",
        "two-lengths",
        "conflicting-list",
        "length-too-large",
        "gzip-then-chunked",
        "unknown-coding",
        "identity-coding",
        "negative-chunk",
        "hex-prefixed-chunk",
        "spaced-chunk",
        "chunk-too-large",
        "chunk-without-crlf",
        "chunk-line-too-long",
        "endless-trailers",
        "head-too-long",
        "too-many-fields",
        "bare-cr",
        "nul",
        "fold-first",
        "four-digit-status",
        "unknown-version",
        "endless-continue",
        "switching-protocols",
    ],
)
async def test_an_answer_whose_framing_cannot_be_trusted_is_refused_at_once(
    answer: bytes,
) -> None:
    """Each is a protocol error as soon as it is seen: never a read until the connection ends
    (a negative length read everything the server sent, into memory), never a wait for the
    read timeout, never an answer read in a framing the server did not mean."""
    async with serving(holding(answer)) as url:
        with anyio.fail_after(60), pytest.raises(httpx.RemoteProtocolError):
            await fetch(url, seconds=3)


@pytest.mark.parametrize(
    "fields",
    [(b"Content-Length: 2, 2",), (b"Content-Length: 2", b"Content-Length: 2")],
    ids=["list", "repeated"],
)
async def test_a_length_repeated_alike_is_one_length(fields: tuple[bytes, ...]) -> None:
    """RFC 9110, 8.6: a list of identical lengths is that length."""
    async with serving(holding(head(b"200 OK", *fields) + b"{}")) as url:
        _, body = await fetch(url)
    assert body == b"{}"


async def test_a_folded_field_is_unfolded() -> None:
    """RFC 9112, 5.2: a user agent replaces an obs-fold with a space."""
    answer = head(b"200 OK", b"X-A: one", b"\t two", b"Content-Length: 2") + b"{}"
    async with serving(holding(answer)) as url:
        response, body = await fetch(url)
    assert response.headers["x-a"] == "one two"
    assert body == b"{}"


async def test_a_chunked_answer_with_a_length_is_read_chunked_on_a_connection_not_reused() -> None:
    """RFC 9112, 6.3: Transfer-Encoding wins, and the connection is closed after."""
    answer = head(b"200 OK", b"Transfer-Encoding: chunked", b"Content-Length: 999")
    handle, served = answering(
        lambda _: answer + b"2\r\n{}\r\n0\r\n\r\n", requests_per_connection=2
    )
    transport = keeping()
    async with serving(handle, transport) as url:
        for _ in range(2):
            assert (await fetch(url, transport))[1] == b"{}"
    assert served == [1, 1]


@pytest.mark.parametrize(
    ("fields", "connections"),
    [((), [1, 1]), ((b"Connection: keep-alive",), [2])],
    ids=["close", "keep-alive"],
)
async def test_an_http_1_0_answer_keeps_its_connection_only_if_it_says_so(
    fields: tuple[bytes, ...], connections: list[int]
) -> None:
    answer = b"HTTP/1.0 200 OK\r\n" + b"".join(f + b"\r\n" for f in fields)
    answer += b"Content-Length: 2\r\n\r\n{}"
    handle, served = answering(lambda _: answer, requests_per_connection=2)
    transport = keeping()
    async with serving(handle, transport) as url:
        for _ in range(2):
            assert (await fetch(url, transport))[1] == b"{}"
    assert served == connections


@pytest.mark.parametrize("body", [b"{}", b""], ids=["last-byte-read", "empty"])
async def test_a_body_read_to_its_last_byte_frees_its_connection_for_the_next(body: bytes) -> None:
    """The caller that takes the last piece and closes (no further read to learn that the body
    ended), or never reads an empty body, leaves a clean connection: it is reused."""
    answer = head(b"200 OK", b"Content-Length: %d" % len(body)) + body
    handle, served = answering(lambda _: answer, requests_per_connection=2)
    transport = keeping()
    async with serving(handle, transport) as url:
        request = httpx.Request(
            "POST", url + "/eval", content=b"{}", extensions={"timeout": {"read": 5.0}}
        )
        response = await transport.handle_async_request(request)
        if body:
            assert await anext(aiter(stream_of(response))) == body
        await response.aclose()
        assert (await fetch(url, transport))[1] == body
    assert served == [2]


async def test_a_body_not_read_to_its_end_closes_its_connection() -> None:
    big = b"x" * 300_000
    answer = head(b"200 OK", b"Content-Length: %d" % len(big)) + big
    handle, served = answering(lambda _: answer, requests_per_connection=2)
    transport = keeping()
    async with serving(handle, transport) as url:
        request = httpx.Request(
            "POST", url + "/eval", content=b"{}", extensions={"timeout": {"read": 5.0}}
        )
        response = await transport.handle_async_request(request)
        assert len(await anext(aiter(stream_of(response)))) <= 64 * 1024
        await response.aclose()
        assert (await fetch(url, transport))[1] == big
    assert served[0] == 1  # the second request had a connection of its own


async def test_bytes_after_an_answer_never_reach_the_next_request() -> None:
    """A server that sends more than its answer framed: the excess is not the next answer."""
    fake = head(b"200 OK", b"Content-Length: 5") + b"fake!"
    answer = head(b"200 OK", b"Content-Length: 2") + b"{}"
    handle, served = answering(lambda _: answer + fake, requests_per_connection=2)
    transport = keeping()
    async with serving(handle, transport) as url:
        for _ in range(2):
            assert (await fetch(url, transport))[1] == b"{}"
    assert served == [1, 1]


async def test_the_idle_check_needs_no_private_buffer_to_be_safe() -> None:
    """Where asyncio's ``StreamReader`` has no ``_buffer`` (another Python), an idle connection
    is not reused rather than the check failing; where it has one, stray bytes are seen."""

    class Reader:
        def at_eof(self) -> bool:
            return False

        def exception(self) -> None:
            return None

    class Writer:
        def is_closing(self) -> bool:
            return False

        def get_extra_info(self, name: str) -> None:
            return None

    def usable(reader: object) -> bool:
        connection = _Connection(reader, Writer())  # type: ignore[arg-type]
        connection.idle_since = time.monotonic()
        return connection.usable(time.monotonic(), 60)

    assert not usable(Reader())
    reader = asyncio.StreamReader()
    assert usable(reader)
    reader.feed_data(b"x")
    assert not usable(reader)


@pytest.mark.parametrize("when", ["head", "body"])
async def test_a_cancelled_request_closes_its_connection_and_frees_its_slot(when: str) -> None:
    answer = b"" if when == "head" else head(b"200 OK", b"Content-Length: 10") + b"{}"
    closed: list[bool] = []
    transport = PlainHTTPTransport(httpx.Limits(max_connections=1, max_keepalive_connections=1))
    async with serving(holding(answer, closed=closed), transport) as url:
        with anyio.move_on_after(0.5) as scope:
            await fetch(url, transport, seconds=10)
        assert scope.cancelled_caught
        for _ in range(100):  # the server sees the connection end
            if closed:
                break
            await anyio.sleep(0.05)
        assert closed == [True]
        # The one slot is free again: a request gets a connection at once.
        with pytest.raises(httpx.ReadTimeout):
            await fetch(url, transport, seconds=0.3)


async def test_a_pool_full_of_answers_being_read_is_a_pool_timeout() -> None:
    transport = PlainHTTPTransport(httpx.Limits(max_connections=1))
    answer = head(b"200 OK", b"Content-Length: 10") + b"{}"
    async with serving(holding(answer), transport) as url:
        request = httpx.Request("POST", url + "/eval", content=b"{}")
        response = await transport.handle_async_request(request)
        try:
            with pytest.raises(httpx.PoolTimeout):
                await fetch(url, transport, seconds=0.3)
        finally:
            await response.aclose()


async def test_a_body_that_stops_coming_is_a_read_timeout() -> None:
    answer = head(b"200 OK", b"Content-Length: 10") + b"{}"
    async with serving(holding(answer)) as url:
        with anyio.fail_after(60), pytest.raises(httpx.ReadTimeout):
            await fetch(url, seconds=0.5)


async def test_a_server_that_reads_nothing_is_a_write_timeout() -> None:
    done = threading.Event()

    def handle(connection: socket.socket) -> None:
        done.wait(5)  # reads nothing, while the client's write fills the buffers

    transport = PlainHTTPTransport()
    async with serving(handle, transport) as url:
        request = httpx.Request(
            "POST",
            url + "/eval",
            content=b"x" * (64 * 1024 * 1024),
            extensions={"timeout": httpx.Timeout(10, write=0.5).as_dict()},
        )
        try:
            with anyio.fail_after(60), pytest.raises(httpx.WriteTimeout):
                await transport.handle_async_request(request)
        finally:
            done.set()


async def test_a_body_without_length_comes_in_bounded_pieces() -> None:
    big = b"x" * 1_000_000
    handle, _ = answering(lambda _: head(b"200 OK") + big)
    async with serving(handle) as url:
        request = httpx.Request(
            "POST", url + "/eval", content=b"{}", extensions={"timeout": {"read": 5.0}}
        )
        response = await PlainHTTPTransport().handle_async_request(request)
        pieces = [piece async for piece in stream_of(response)]
        await response.aclose()
    assert b"".join(pieces) == big
    assert max(map(len, pieces)) <= 64 * 1024
