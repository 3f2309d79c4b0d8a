"""The gateway's parts, one concern per module (``python_mcp_server`` composes them).

- :mod:`gateway.serving`: how both services are served by uvicorn (a deadline for each
  request's headers, a cap on connections).
- :mod:`gateway.edge`: ASGI middleware at the edge (a deadline for each request's body, loopback
  only without a token).
- :mod:`gateway.sessions`: MCP sessions bounded in number, the longest idle closed first.
"""

from __future__ import annotations

from .edge import LoopbackGuard, RequestDeadline, is_loopback
from .serving import GuardedH11Protocol, guarded_protocol
from .sessions import SessionTable, SseSessions, StreamableSessions

__all__ = [
    "GuardedH11Protocol",
    "LoopbackGuard",
    "RequestDeadline",
    "SessionTable",
    "SseSessions",
    "StreamableSessions",
    "guarded_protocol",
    "is_loopback",
]
