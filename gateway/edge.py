"""ASGI middleware at the gateway's edge: who may be served.

:class:`LoopbackGuard` refuses (403) every request that does not come from loopback, for a
gateway that has no token: however it was started (``python-mcp-server`` refuses a public
address without a token, but ``uvicorn ... --host 0.0.0.0`` cannot be stopped from inside), it
never runs code for the network unauthenticated. It decides from the addresses of the
connection in the ASGI scope, never from the ``Host`` header, which the client writes. How
slowly a client may send is bounded by the plumbing both services share (:mod:`serving`).
"""

from __future__ import annotations

import ipaddress
import logging
import time
from collections.abc import Collection, Sequence

from mcp.server.transport_security import TransportSecuritySettings
from starlette.types import ASGIApp, Receive, Scope, Send

from serving import send_text

__all__ = ["LoopbackGuard", "is_loopback", "transport_security"]

_LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")

logger = logging.getLogger(__name__)


def transport_security(
    allowed_hosts: Sequence[str], allowed_origins: Sequence[str]
) -> TransportSecuritySettings:
    """DNS-rebinding protection: loopback Hosts and Origins plus the configured extras."""
    hosts = [f"{h}:*" for h in _LOOPBACK_HOSTS] + list(allowed_hosts)
    origins = [f"http://{h}:*" for h in _LOOPBACK_HOSTS] + list(allowed_origins)
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True, allowed_hosts=hosts, allowed_origins=origins
    )


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
        await send_text(
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
