"""Every way the service can fail is a SnekboxError, told apart by whether the code may have run.

Real servers on loopback: a Starlette app under uvicorn for answers HTTP can express (a body
whose gzip is broken), and raw sockets for what no HTTP server would do on purpose (hang up
after reading the request, or halfway through the answer).
"""

from __future__ import annotations

import socket
from collections.abc import Callable

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from snekbox_client import (
    ConnectionLost,
    EvalRequest,
    EvaluatorUnavailable,
    InvalidResponse,
    SnekboxClient,
)
from tests.support import closed_port, hang_up_after_reading, raw_server, read_request, serve

pytestmark = pytest.mark.anyio

REQUEST = EvalRequest(input="print(1)")


def hang_up_mid_answer(connection: socket.socket) -> None:
    connection.settimeout(10)
    read_request(connection)
    connection.sendall(
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n"
        b'{"stdout": "1\\n", "ret'
    )


@pytest.mark.parametrize("handle", [hang_up_after_reading, hang_up_mid_answer])
async def test_a_connection_lost_once_made_says_the_code_may_have_run(
    handle: Callable[[socket.socket], None],
) -> None:
    with raw_server(handle) as url:
        async with SnekboxClient(url) as client:
            with pytest.raises(ConnectionLost, match=r"^the connection to the evaluation service"):
                await client.eval(REQUEST)


async def test_nothing_listening_is_unavailable() -> None:
    async with SnekboxClient(f"http://127.0.0.1:{closed_port()}") as client:
        with pytest.raises(EvaluatorUnavailable):
            await client.eval(REQUEST)


async def test_an_answer_that_does_not_decode_is_invalid() -> None:
    """Asked for ``identity``, the service sends gzip anyway, and broken: httpx's DecodingError."""

    async def broken_gzip(request: Request) -> Response:
        return Response(b"not gzip at all", headers={"content-encoding": "gzip"})

    app = Starlette(routes=[Route("/eval", broken_gzip, methods=["POST"])])
    with serve(app) as url:
        async with SnekboxClient(url) as client:
            with pytest.raises(InvalidResponse, match=r"^the answer cannot be decoded: "):
                await client.eval(REQUEST)
