"""The gateway's parts, one concern per module (``python_mcp_server`` is their face).

Configuration and start-up:

- :mod:`gateway.settings`: every setting, declared once, validated, read once at start-up.
- :mod:`gateway.cli`: ``python-mcp-server``: flags, logging, uvicorn, draining on SIGTERM.

Serving:

- :mod:`gateway.app`: the Starlette app, its routes and bearer auth; the MCP server.
- :mod:`gateway.edge`: ASGI middleware at the edge (loopback only without a token); the
  deadlines for each request's headers and body and the cap on connections are the plumbing
  both services share (:mod:`serving`).
- :mod:`gateway.sessions`: MCP sessions bounded in number, the longest idle closed first;
  :mod:`gateway.sse_sessions`: the SSE transport's sessions in that count.

The tool:

- :mod:`gateway.tool`: :class:`Gateway`, the MCP tools' signatures, handing each call on.
- :mod:`gateway.calls`: one call's pipeline; :mod:`gateway.evaluation`: one evaluation.
- :mod:`gateway.connection`: the evaluation service it is handed (the protocol both the HTTP
  client and the in-process evaluator meet), its start, probing and readiness.
- :mod:`gateway.description`: the tool's description, written for the model.
- :mod:`gateway.code_sessions`: code sessions, their files, fair room between clients;
  :mod:`gateway.callers`: who a call comes from; :mod:`gateway.tokens`: bearer tokens.
- :mod:`gateway.admission`: evaluations at once, shared fairly, and the bounded wait for a slot.
- :mod:`gateway.failures`: the service's failures in words the model can act on.
- :mod:`gateway.metrics`: the Prometheus metrics.

What the model sees:

- :mod:`gateway.render`: the result: text, images, structured content (the modules below are
  its parts, imported from where they live).
- :mod:`gateway.facts`: what an answer says, cleaned and checked; :mod:`gateway.status`: how a
  run ended, in words; :mod:`gateway.text`: cleaning, quoting, cutting; :mod:`gateway.png`: the
  PNG checks; :mod:`gateway.budget`: the result's size and what gives way;
  :mod:`gateway.schema`: the published output schema.
"""

from __future__ import annotations

from .admission import Admission, Busy
from .app import StaticTokenVerifier, create_app, create_server
from .cli import DrainingServer, main
from .connection import EvaluationService, evaluation_service
from .edge import LoopbackGuard, is_loopback
from .metrics import Metrics
from .render import render_result
from .schema import ExecutionResult, FileInfo, ImageInfo
from .sessions import SessionTable, StreamableSessions
from .settings import Settings, SettingsError
from .sse_sessions import SseSessions
from .status import Status, describe_exit
from .tool import TOOL_NAME, Gateway

__all__ = [
    "TOOL_NAME",
    "Admission",
    "Busy",
    "DrainingServer",
    "EvaluationService",
    "ExecutionResult",
    "FileInfo",
    "Gateway",
    "ImageInfo",
    "LoopbackGuard",
    "Metrics",
    "SessionTable",
    "Settings",
    "SettingsError",
    "SseSessions",
    "StaticTokenVerifier",
    "Status",
    "StreamableSessions",
    "create_app",
    "create_server",
    "describe_exit",
    "evaluation_service",
    "is_loopback",
    "main",
    "render_result",
]
