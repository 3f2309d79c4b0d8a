"""The HTTP/1.1 protocol both services are served with (:mod:`serving.protocol`), under uvicorn on
loopback: what reaches the client's socket, and when.

Its bounds on slow and surplus clients are tested against each service, in
``tests/gateway/test_edge.py`` and ``tests/evaluator/test_slow_clients.py``.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from collections.abc import AsyncIterator

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.support import serve

BODY = b"x" * 1000


async def answer(request: Request) -> Response:
    return PlainTextResponse(BODY)


#: Set by the client once it has the stream's first piece (the server's own loop runs in
#: another thread).
FIRST_PIECE_READ = threading.Event()


async def stream(request: Request) -> Response:
    async def events() -> AsyncIterator[bytes]:
        yield b"first\n"
        # Not written until the client read the first piece: a write held back fails here.
        for _ in range(3000):
            if FIRST_PIECE_READ.is_set():
                yield b"second\n"
                return
            await asyncio.sleep(0.01)
        yield b"the first piece did not reach the client within 30 s\n"

    return StreamingResponse(events(), media_type="text/plain")


APP = Starlette(routes=[Route("/", answer), Route("/stream", stream)])


#: A client of its own process (this one's GIL would hold it until the server's writes are
#: done): five requests, each answer's first read printed.
FIRST_READS = """
import socket, sys
with socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=30) as client:
    for _ in range(5):
        client.sendall(b"GET / HTTP/1.1\\r\\nHost: 127.0.0.1\\r\\n\\r\\n")
        print(len(client.recv(65536)), flush=True)
"""


def test_an_answer_reaches_the_client_in_one_piece() -> None:
    """The head and the body go out in one write: the client wakes once, not once for each.
    The client waits in ``recv`` when they are written, so its first read is all it is sent."""
    with serve(APP) as url:
        port = httpx.URL(url).port
        reads = subprocess.run(
            [sys.executable, "-c", FIRST_READS, str(port)],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout.split()
    whole = len(b"HTTP/1.1 200 OK\r\n") + 1000  # at least: a head and the body
    assert len(reads) == 5
    assert all(int(read) > whole for read in reads), reads


@pytest.mark.anyio
async def test_a_streamed_answer_goes_out_as_it_is_written() -> None:
    """Joining waits for nothing: a piece of a stream is sent in the turn it was written."""
    FIRST_PIECE_READ.clear()
    pieces = []
    with serve(APP) as url:
        async with httpx.AsyncClient() as client, client.stream("GET", url + "/stream") as reply:
            async for piece in reply.aiter_raw():
                pieces.append(piece)
                FIRST_PIECE_READ.set()
    assert b"".join(pieces) == b"first\nsecond\n"
