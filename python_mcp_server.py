"""The gateway: an MCP server whose tool ``execute_python_code`` runs Python in a sandbox.

One Starlette app, :data:`starlette_app`, serves MCP over SSE (``GET /sse`` + ``POST /messages/``)
and over Streamable HTTP (``/mcp``), plus ``/healthz``, ``/readyz`` and ``/metrics``. Every call
is forwarded as one ``POST /eval`` to the evaluation service, which the app is handed (or builds
from its settings): the Snekbox at ``SNEKBOX_URL``, through :mod:`snekbox_client`, or, when none
is set, the built-in :mod:`evaluator` in this process, behind the same small protocol.
:mod:`plotting` supplies the prelude that turns matplotlib figures into PNG files.

This module is the face: the code lives in the :mod:`gateway` package, one concern a module::

    python_mcp_server     this map; starlette_app (built on first look-up); main
    gateway.settings      every setting declared once (pydantic-settings), read at start-up
    gateway.cli           python-mcp-server: flags from the settings, uvicorn, drain on SIGTERM
    gateway.app           the Starlette app: routes, bearer auth, the MCP server and its tool
    gateway.edge          ASGI middleware: loopback only without a token
    serving               shared with the evaluator: the settings framework, uvicorn's protocol
                          with a header deadline and a connection cap, a request body deadline
    gateway.sessions      MCP sessions bounded in number, the longest idle closed first
    gateway.sse_sessions  the SSE transport's sessions in that count
    gateway.tool          Gateway: the MCP tools' signatures, handing each call on
    gateway.calls         one call's pipeline: limits, session, choices, result, its log line
    gateway.evaluation    one evaluation: a slot, the request, the service's failures in words
    gateway.connection    the evaluation service: its protocol, starting it, probing, readiness
    gateway.description   the tool's description, written for the model
    gateway.callers       who a call comes from: its owner, its client for fair sharing
    gateway.tokens        bearer tokens, one or several clients' named ones
    gateway.code_sessions a call's session: its files, its owner, fair room between clients
    gateway.admission     evaluations at once (the service's workers), shared fairly, bounded
    gateway.failures      the service's failures, worded for the model
    gateway.metrics       Prometheus metrics
    gateway.render        what the model sees: text, one image per figure, structured content
      gateway.facts       an answer read as hostile: output cleaned, figures checked, manifest
      gateway.status      how a run ended, in words
      gateway.text        cleaning, quoting names, cutting long text
      gateway.png         the PNG checks
      gateway.budget      the result's size on the wire, and what gives way
      gateway.schema      the published output schema

Run it with ``python-mcp-server`` (see ``--help``) or ``uvicorn python_mcp_server:starlette_app``;
the latter reads its settings from the environment when the attribute is first looked up.
"""

from __future__ import annotations

from typing import Any

from gateway import (
    Admission,
    Busy,
    DrainingServer,
    EvaluationService,
    ExecutionResult,
    FileInfo,
    Gateway,
    ImageInfo,
    Metrics,
    Settings,
    SettingsError,
    StaticTokenVerifier,
    create_app,
    create_server,
    describe_exit,
    evaluation_service,
    main,
    render_result,
)

__all__ = [
    "Admission",
    "Busy",
    "DrainingServer",
    "EvaluationService",
    "ExecutionResult",
    "FileInfo",
    "Gateway",
    "ImageInfo",
    "Metrics",
    "Settings",
    "SettingsError",
    "StaticTokenVerifier",
    "create_app",
    "create_server",
    "describe_exit",
    "evaluation_service",
    "main",
    "render_result",
]


def __getattr__(name: str) -> Any:
    # `uvicorn python_mcp_server:starlette_app` looks the app up; build it then, not at import,
    # so importing this module (tests, tools) reads no environment and starts nothing.
    if name == "starlette_app":
        try:
            app = create_app(Settings.from_env())
        except ValueError as exc:
            # This look-up is uvicorn's start-up: end it with the one line, as main() does.
            raise SystemExit(f"python-mcp-server: {exc}") from None
        globals()["starlette_app"] = app
        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if __name__ == "__main__":
    main()
