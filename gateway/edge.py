"""ASGI middleware at the edge of both services: who may be served, and how slowly.

- :class:`RequestDeadline` drops a request whose body has not fully arrived within a bound (408),
  so a client that sends its headers and then trickles or stalls cannot hold a request open.
  It works however the app is served; the headers themselves are bounded by the protocol
  (:mod:`gateway.serving`), since no ASGI app is called before they are complete.
- :class:`LoopbackGuard` refuses (403) every request that does not come from loopback, for a
  gateway that has no token: however it was started (``python-mcp-server`` refuses a public
  address without a token, but ``uvicorn ... --host 0.0.0.0`` cannot be stopped from inside),
  it never runs code for the network unauthenticated. It decides from the addresses of the
  connection in the ASGI scope, never from the ``Host`` header, which the client writes.
"""

from __future__ import annotations

import ipaddress
import logging
import time
from collections.abc import Collection

import anyio
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["LoopbackGuard", "RequestDeadline", "is_loopback"]

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
                await _send_text(
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


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback IP address (IPv4-mapped IPv6 included); names are not."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


class LoopbackGuard:
    """Serve only connections between loopback addresses (or over a Unix socket); 403 others.

    Install it when no token is configured and no one opted out of authentication. ``open_paths``
    stay reachable from anywhere: the health and metrics routes, which need no token either.
    """

    def __init__(self, app: ASGIApp, open_paths: Collection[str] = ()) -> None:
        self.app = app
        self.open_paths = frozenset(open_paths)
        self._last_warning = -float("inf")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.open_paths or _local(scope):
            await self.app(scope, receive, send)
            return
        client = (scope.get("client") or ("an unknown address",))[0]
        server = (scope.get("server") or ("an unknown address",))[0]
        now = time.monotonic()
        if now - self._last_warning > 60:  # a scan must not flood the log
            self._last_warning = now
            logger.warning(
                "refused a request from %s to %s: no token is set, so only loopback is served "
                "(set MCP_AUTH_TOKEN, or MCP_ALLOW_UNAUTHENTICATED=true behind an "
                "authenticating proxy)",
                client,
                server,
            )
        await _send_text(
            send,
            403,
            f"This MCP gateway has no authentication token, so it serves only clients on "
            f"loopback, and this request came from {client} (to {server}). To serve the "
            "network, set MCP_AUTH_TOKEN (or MCP_AUTH_TOKEN_FILE) and send it as "
            "'Authorization: Bearer <token>'; if a proxy in front authenticates, set "
            "MCP_ALLOW_UNAUTHENTICATED=true.\n",
        )


def _local(scope: Scope) -> bool:
    client, server = scope.get("client"), scope.get("server")
    if client is None and server is not None and server[1] is None:
        return True  # a Unix socket: who may connect is decided by the file's permissions
    return (
        client is not None
        and server is not None
        and is_loopback(str(client[0]))
        and is_loopback(str(server[0]))
    )


async def _send_text(send: Send, status: int, text: str) -> None:
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
