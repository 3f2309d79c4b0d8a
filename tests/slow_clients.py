"""Slow and surplus clients on real sockets, shared by the gateway's and the evaluator's tests.

Each check opens raw TCP connections to a service on loopback, sends part of a request and
stalls (or trickles), and reads what the service answers before it closes the connection.
"""

from __future__ import annotations

import anyio
import httpx
from anyio.abc import SocketStream

from serving.protocol import IDLE_BEFORE_ROOM
from tests.gateway.harness import ServiceProcess, open_fds, wait_for

#: How long a stalled connection may stay open before the test fails: far above the services'
#: request timeout in these tests (2 s), only to prove that nothing is held forever.
HELD_AT_MOST = 30.0
#: Stalled connections opened at once by the "many" checks: a few hundred, under the cap.
MANY = 250
#: Seconds idle past uvicorn's keep-alive timeout (5 s), which httpx's is too.
KEPT_PAST = 6.0
#: The connection cap of the services :func:`room_made_at_cap` fills (each its own).
SMALL_CAP = 10


def head(port: int, method: str = "POST", path: str = "/", length: int = 100) -> bytes:
    """A complete request head announcing a JSON body of ``length`` bytes."""
    return (
        f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        "Accept: application/json, text/event-stream\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()


def get(port: int, path: str) -> bytes:
    """A whole ``GET path`` request, without a body."""
    return f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()


def padded(complete_head: bytes, pad: int, *, finished: bool) -> bytes:
    """``complete_head`` with a field of ``pad`` bytes more; ``finished``: ended by its blank
    line, else cut off before it (a head still being sent)."""
    padded_head = complete_head[:-2] + b"X-Pad: " + b"a" * pad + b"\r\n"
    return padded_head + b"\r\n" if finished else padded_head


async def stall(port: int, data: bytes) -> SocketStream:
    """A connection that sent ``data`` and then nothing more."""
    stream = await anyio.connect_tcp("127.0.0.1", port)
    if data:
        await stream.send(data)
    return stream


async def read_until_closed(stream: SocketStream, within: float = HELD_AT_MOST) -> bytes:
    """Everything the server sends until it closes the connection; fails after ``within`` s."""
    received = b""
    with anyio.fail_after(within):
        while True:
            try:
                received += await stream.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                return received


async def trickle(stream: SocketStream, data: bytes, interval: float = 0.3) -> None:
    """Send ``data`` one byte at a time until the server hangs up (or the data runs out)."""
    for byte in data:
        try:
            await stream.send(bytes([byte]))
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            return
        await anyio.sleep(interval)


async def drop_many(service: ServiceProcess, data: bytes, probe: tuple[str, str]) -> list[bytes]:
    """Open :data:`MANY` connections that send ``data`` and stall; meanwhile ``probe`` answers.

    Returns what each connection received before the server closed it, once the server's open
    file descriptors are back to about their number before.
    """
    fds_before = open_fds(service.pid)
    streams = [await stall(service.port, data) for _ in range(MANY)]
    method, path = probe
    async with httpx.AsyncClient(timeout=10) as http:
        answer = await http.request(method, f"{service.url}{path}")
    assert answer.status_code == 200, "a well-behaved client is served meanwhile"
    answers: list[bytes] = [b""] * MANY

    async def read(index: int) -> None:
        answers[index] = await read_until_closed(streams[index])

    async with anyio.create_task_group() as group:
        for index in range(MANY):
            group.start_soon(read, index)
    for stream in streams:
        await stream.aclose()
    await anyio.to_thread.run_sync(
        wait_for,
        # A little slack: the evaluator's pool opens and closes a few for its next sandbox.
        lambda: open_fds(service.pid) <= fds_before + 8,
        HELD_AT_MOST,
        "the service's file descriptors return to their number before",
    )
    return answers


async def refuse_beyond_cap(service: ServiceProcess, cap: int, data: bytes) -> bytes:
    """Hold ``cap`` stalled connections open; return what one more connection receives."""
    streams = [await stall(service.port, data) for _ in range(cap)]
    try:
        extra = await stall(service.port, b"")
        async with extra:
            return await read_until_closed(extra, within=10)
    finally:
        for stream in streams:
            await stream.aclose()


async def answered_after_a_pause(port: int, path: str, pause: float) -> list[bytes]:
    """Two ``GET path`` on one connection, ``pause`` seconds apart: each answer's head, or
    ``b""`` for the second when the server closed the idle connection meanwhile."""
    request = get(port, path)
    heads: list[bytes] = []
    async with await anyio.connect_tcp("127.0.0.1", port) as stream:
        for turn in range(2):
            await anyio.sleep(pause if turn else 0)
            try:
                await stream.send(request)
                heads.append((await read_answer(stream)).partition(b"\r\n\r\n")[0])
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                heads.append(b"")
    return heads


async def read_answer(stream: SocketStream) -> bytes:
    """One answer, head and body (of the length its ``Content-Length`` says), as received."""
    received = b""
    with anyio.fail_after(HELD_AT_MOST):
        while b"\r\n\r\n" not in received:
            received += await stream.receive()
        answer_head, _, body = received.partition(b"\r\n\r\n")
        lengths = [
            int(line.split(b":", 1)[1])
            for line in answer_head.lower().split(b"\r\n")
            if line.startswith(b"content-length:")
        ]
        assert len(lengths) == 1, f"not an answer of a known length: {answer_head!r}"
        while len(body) < lengths[0]:
            body += await stream.receive()
    return received[: len(answer_head) + 4] + body


async def room_made_at_cap(service: ServiceProcess, path: str) -> None:
    """Fill the cap (:data:`SMALL_CAP`, of a service no one else uses) with connections
    answered ``GET path``: the first has part of another request pipelined behind (a request
    in progress), the others are idle. Once they have been idle :data:`IDLE_BEFORE_ROOM`, one
    more is served: the second (idle the longest) is closed for it, without an answer; the
    first and the third are served on."""
    request = get(service.port, path)
    streams: list[SocketStream] = []
    try:
        for index in range(SMALL_CAP):
            streams.append(await anyio.connect_tcp("127.0.0.1", service.port))
            await streams[-1].send(request + (request[:20] if index == 0 else b""))
            answer = await read_answer(streams[-1])
            assert answer.startswith(b"HTTP/1.1 200 OK\r\n"), (index, answer)
        await anyio.sleep(IDLE_BEFORE_ROOM + 1)
        async with await anyio.connect_tcp("127.0.0.1", service.port) as extra:
            await extra.send(request)
            answer = await read_answer(extra)
        assert answer.startswith(b"HTTP/1.1 200 OK\r\n"), answer
        assert await read_until_closed(streams[1]) == b"", "closed for it, without an answer"
        for stream, rest in ((streams[0], request[20:]), (streams[2], request)):
            await stream.send(rest)
            answer = await read_answer(stream)
            assert answer.startswith(b"HTTP/1.1 200 OK\r\n"), answer
    finally:
        for stream in streams:
            await stream.aclose()
