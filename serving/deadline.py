"""An ASGI request deadline: a request's body must arrive within a bound, or it is answered 408.

:class:`RequestDeadline` drops a request whose body has not fully arrived within a bound, so a
client that sends its headers and then trickles or stalls cannot hold a request open. It works
however the app is served; the headers themselves are bounded by the protocol
(:mod:`serving.protocol`), since no ASGI app is called before they are complete.
"""

from __future__ import annotations

import logging

import anyio
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["RequestDeadline", "send_text"]

logger = logging.getLogger(__name__)


class RequestDeadline:
    """Answer 408 and close when a request's body is not complete ``timeout`` s after its head.

    Only the wait for the body is bounded: once it has arrived, ``receive`` is what an app
    awaits to learn of a disconnection (a long call, an SSE stream), and that may take any time.
    """

    def __init__(self, app: ASGIApp, timeout: float) -> None:
        if not timeout > 0:
            raise ValueError("the request timeout must be positive")
        self.app = app
        self.timeout = timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        deadline = anyio.current_time() + self.timeout
        arrived = False
        timed_out = False
        started = False

        async def receive_in_time() -> Message:
            nonlocal arrived, timed_out
            if arrived or timed_out:
                return await receive() if arrived else {"type": "http.disconnect"}
            with anyio.move_on_after(deadline - anyio.current_time()):
                message = await receive()
                if message["type"] != "http.request" or not message.get("more_body", False):
                    arrived = True
                return message
            timed_out = True
            logger.info("a request body did not arrive within %g s: dropped", self.timeout)
            if not started:
                await send_text(
                    send, 408, f"The request body did not arrive within {self.timeout:g} s.\n"
                )
            # The app sees the client go away, and whatever it answers is dropped.
            return {"type": "http.disconnect"}

        async def send_unless_timed_out(message: Message) -> None:
            nonlocal started
            if timed_out:
                return
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        await self.app(scope, receive_in_time, send_unless_timed_out)


async def send_text(send: Send, status: int, text: str) -> None:
    """Answer ``status`` with ``text`` as plain UTF-8, the connection to be closed."""
    body = text.encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
                # The connection is in an unknown state (a body half read): do not reuse it.
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
