"""Who a call comes from (its token's client, its MCP connection), and its one log line."""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any

from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.mcpserver import Context
from starlette.requests import Request

__all__ = ["client_of", "log_call", "owner"]

# The name operators filter the per-call log lines by (it was the single module's name).
logger = logging.getLogger("python_mcp_server")


def owner() -> str | None:
    """Who the call comes from: its bearer token's client, ``None`` without authentication."""
    token = get_access_token()
    if token is None:
        return None
    return hashlib.sha256(f"{token.client_id}\0{token.token}".encode()).hexdigest()


def client_of(ctx: Context[Any, Any]) -> str | None:
    """Whose share of the slots and sessions a call takes: its token's client (a name), or
    without authentication its MCP connection: the transport session's id, or for a sessionless
    (2026-07-28) client, which has none, its HTTP connection (the peer's address and port, as
    the server sees it); ``None``: none of these (the in-memory transport, a Unix socket).

    Taken together as one client, sessionless clients would get a slot only while no other
    client had a call waiting: ten of them beside ten SSE clients waited seconds each."""
    token = get_access_token()
    if token is not None:
        return token.client_id
    request = ctx.request_context.request if ctx.request_context else None
    if not isinstance(request, Request):
        return None
    connection = request.headers.get("mcp-session-id") or request.query_params.get("session_id")
    if connection:
        return f"connection {connection}"
    peer = request.client
    return f"peer {peer.host}:{peer.port}" if peer is not None else None


def log_call(ctx: Context[Any, Any], outcome: str, duration: float, fields: dict[str, Any]) -> None:
    """One structured line per call; the code and output only when MCP_LOG_CODE asks.

    ``session`` is the SSE or Streamable HTTP session id; sessionless clients (the 2026-07-28
    protocol) have none, and their calls are told apart by ``request``.
    """
    if not logger.isEnabledFor(logging.INFO):
        return
    request = ctx.request_context.request if ctx.request_context else None
    transport, session = "memory", None
    if isinstance(request, Request):
        transport = "sse" if request.scope["path"].startswith("/messages") else "streamable-http"
        session = request.headers.get("mcp-session-id") or request.query_params.get("session_id")
    record = {
        "event": "tool_call",
        "session": session,
        "request": ctx.request_id,
        "transport": transport,
        "outcome": outcome,
        "duration_ms": round(duration * 1000, 1),
        **fields,
    }
    logger.info("%s", json.dumps(record, default=str))
