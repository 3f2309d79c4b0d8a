"""The HTTP app: the MCP server over SSE and Streamable HTTP, health routes, bearer auth.

:func:`create_server` is the MCP server with its one tool; :func:`create_app` the Starlette app
around it, whose lifespan starts the :class:`~gateway.tool.Gateway` and the Streamable HTTP
session manager.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
from collections.abc import AsyncIterator, Mapping
from importlib import metadata
from typing import Any

from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ResourceNotFoundError
from mcp.server.mcpserver.resources import ResourceSecurity
from mcp.shared.uri_template import UriTemplate
from mcp.types import ToolAnnotations
from opentelemetry import trace
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from serving import RequestDeadline

from .code_sessions import URI_SCHEME, SessionGone
from .connection import EvaluationService, evaluation_service
from .edge import LoopbackGuard, transport_security
from .environment import ENVIRONMENT_URI
from .render import mime_type
from .sessions import SessionTable, StreamableSessions
from .settings import Settings
from .sse_sessions import SseSessions
from .tasks import CellTasks
from .tool import END_TOOL_NAME, INTERRUPT_TOOL_NAME, READ_TOOL_NAME, TOOL_NAME, Gateway

__all__ = ["StaticTokenVerifier", "create_app", "create_server"]

#: The distribution whose version the server announces (``serverInfo.version``).
_DISTRIBUTION = "python-mcp-server"
#: Routes that need no token and are served to any address: they reveal nothing secret.
_OPEN_PATHS = ("/healthz", "/readyz", "/metrics")


class StaticTokenVerifier:
    """Accepts the bearer tokens it is given, each naming its client (``client_id``).

    Every token is compared, in constant time, whichever matches: how long a check takes does
    not tell how much of a guess was right, nor which client's token it was near.
    """

    def __init__(self, tokens: Mapping[str, str]) -> None:
        self._tokens = [(token.encode(), name) for token, name in tokens.items()]

    async def verify_token(self, token: str) -> AccessToken | None:
        given = token.encode()
        found = None
        for known, name in self._tokens:
            if hmac.compare_digest(given, known):
                found = name
        return None if found is None else AccessToken(token=token, client_id=found, scopes=[])

    def __repr__(self) -> str:
        return f"StaticTokenVerifier(clients={sorted(n for _, n in self._tokens)})"


def create_server(gateway: Gateway) -> MCPServer[Any]:
    """The MCP server with its one tool, bound to ``gateway``; bearer auth when a token is set."""
    settings = gateway.settings
    auth: dict[str, Any] = {}
    if settings.authenticated:
        auth = {
            "token_verifier": StaticTokenVerifier(settings.client_tokens),
            # The SDK's resource-server mode: it checks bearer tokens and answers 401 with
            # WWW-Authenticate; the issuer is only advertised, never contacted.
            "auth": AuthSettings(
                issuer_url=settings.url,  # type: ignore[arg-type]
                resource_server_url=None,
            ),
        }
    server: MCPServer[Any] = MCPServer(
        name="python-mcp-server",
        version=metadata.version(_DISTRIBUTION),
        instructions="Use execute_python_code to run Python: computations, data, charts.",
        extensions=[CellTasks(gateway)],
        **auth,
    )
    if not tracing_configured():
        # The SDK's span per message costs every call a span that nothing records.
        # Named, not imported: the SDK keeps the class in a private module.
        server.middleware[:] = [
            m for m in server.middleware if type(m).__name__ != "OpenTelemetryMiddleware"
        ]
    _add_tool(server, gateway)
    server.add_tool(
        gateway.end_session,
        name=END_TOOL_NAME,
        title="End a Python session",
        description="End a session of execute_python_code now, when its work is done: its "
        "files are dropped, and calls naming it are told it was ended. Sessions also end by "
        "themselves after a while without a call.",
        annotations=ToolAnnotations(
            read_only_hint=False,
            destructive_hint=True,
            idempotent_hint=False,
            open_world_hint=False,
        ),
    )
    server.add_tool(
        gateway.get_output,
        name=READ_TOOL_NAME,
        title="Read running Python",
        description="Read code that execute_python_code left running (its result said status "
        "'running'): what it printed since the last read, each line once, waiting up to "
        "wait_seconds for more; once it has ended, its whole result as execute_python_code "
        "gives it (exit status, figures, files). Only the session's own client may read it.",
        annotations=ToolAnnotations(
            read_only_hint=True,
            destructive_hint=False,
            idempotent_hint=False,
            open_world_hint=False,
        ),
    )
    server.add_tool(
        gateway.interrupt,
        name=INTERRUPT_TOOL_NAME,
        title="Interrupt running Python",
        description="Stop code that execute_python_code left running, as Ctrl-C would: a "
        "KeyboardInterrupt in it; the session and its variables are kept (if the code does not "
        "stop within a few seconds, its interpreter is ended and its variables are lost). "
        "Answers with its result, what it printed since the last read first.",
        annotations=ToolAnnotations(
            read_only_hint=False,
            destructive_hint=True,
            idempotent_hint=False,
            open_world_hint=False,
        ),
    )
    _add_session_files(server, gateway)
    _add_environment(server, gateway)
    return server


def tracing_configured() -> bool:
    """Whether an OpenTelemetry tracer provider is installed (``opentelemetry-instrument``, or
    the hosting code's own), so that the SDK's spans are recorded: until one is, the default
    provider is a proxy that records nothing."""
    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


def _add_tool(server: MCPServer[Any], gateway: Gateway) -> None:
    """Register ``execute_python_code``, described as ``gateway`` knows it now."""
    server.add_tool(
        gateway.execute_python_code,
        name=TOOL_NAME,
        title="Run Python",
        description=gateway.tool_description(),
        # A call changes its session (files, and state where the backend keeps it).
        annotations=ToolAnnotations(
            read_only_hint=False,
            destructive_hint=False,
            idempotent_hint=False,
            open_world_hint=False,
        ),
    )


def _add_session_files(server: MCPServer[Any], gateway: Gateway) -> None:
    """The files of the open sessions as resources: ``session://<id>/<path>`` (see the tool's
    ``files[].uri``); text as text, other bytes as a base64 blob, each read with the MIME type
    ``files[]`` gives it."""
    template = f"{URI_SCHEME}://{{session_id}}/{{+path}}"
    files = UriTemplate.parse(template)

    async def typed(ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        # The SDK reads every file with the template's one MIME type (text/plain); the chain
        # passes the result in its wire form.
        result = await call_next(ctx)
        if ctx.method == "resources/read" and isinstance(result, dict):
            for content in result.get("contents", ()):
                if (found := files.match(str(content.get("uri")))) is not None:
                    content["mimeType"] = mime_type(str(found["path"]))
        return result

    server.middleware.append(typed)

    @server.resource(
        template,
        name="session file",
        title="A file of a Python session",
        description="A file in the working directory of an open execute_python_code session.",
        # ``path`` is a key of the session's own files, never a host path: a file the code
        # named ``a:b`` (a "drive letter" to the SDK's default checks) must be readable too.
        security=ResourceSecurity(exempt_params={"path"}),
    )
    def session_file(session_id: str, path: str) -> str | bytes:
        try:
            content = gateway.read_session_file(session_id, path)
        except SessionGone as exc:  # a file of a session that is no more does not exist
            raise ResourceNotFoundError(f"{exc.fate}: its files are gone.") from None
        except KeyError:
            raise ResourceNotFoundError(
                f"The session {session_id!r} has no file {path!r} (files it was sent or wrote)."
            ) from None
        try:
            return content.decode("utf-8")
        except UnicodeDecodeError:
            return content


def _add_environment(server: MCPServer[Any], gateway: Gateway) -> None:
    """What the evaluation service offers, as the gateway last found it (JSON)."""

    @server.resource(
        ENVIRONMENT_URI,
        name="python environment",
        title="What the Python sandbox offers",
        description="The Python version and every installed package (name: version) of the "
        "execute_python_code sandbox, as probed, and whether sessions keep variables.",
        mime_type="application/json",
    )
    def environment() -> str:
        return json.dumps(gateway.environment_report(), indent=1)


def _unparsable_messages_as_warnings(record: logging.LogRecord) -> bool:
    """The SDK logs a ``POST /messages/`` body that is not JSON-RPC at ERROR, with a traceback,
    and answers it 400: a client's mistake (anyone's on loopback), not the server's, so one
    line at WARNING."""
    if record.msg == "Failed to parse message":
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        record.exc_info, record.exc_text = None, None
    return True


def create_app(settings: Settings, service: EvaluationService | None = None) -> Starlette:
    """The Starlette app serving SSE, Streamable HTTP, ``/healthz``, ``/readyz`` and ``/metrics``.

    The gateway (its evaluation service: ``service``, else the one the settings name) and the
    Streamable HTTP session manager live in the app's lifespan, so the app must be run by a
    server that runs lifespans (uvicorn does).

    Raises:
        ValueError: the settings are unsafe (see :meth:`Settings.check`).
    """
    settings.check()
    logging.getLogger("mcp.server.sse").addFilter(_unparsable_messages_as_warnings)
    gateway = Gateway(settings, service if service is not None else evaluation_service(settings))
    server = create_server(gateway)
    security = transport_security(settings.allowed_hosts, settings.allowed_origins)
    body_limit = settings.request_bytes_limit
    sse = server.sse_app(transport_security=security, max_request_body_size=body_limit)
    streamable = server.streamable_http_app(
        transport_security=security,
        max_request_body_size=body_limit,
        session_idle_timeout=settings.transport_session_idle_timeout,
        # A backstop only: the table below keeps the count, closing idle sessions.
        max_sessions=2 * settings.max_transport_sessions,
    )
    sessions = SessionTable(settings.max_transport_sessions, registry=gateway.metrics.registry)
    StreamableSessions.install(server.session_manager, sessions)

    async def healthz(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> JSONResponse:
        reason = await gateway.readiness()
        if reason is None:
            # An operator sees here, as in the start-up log, what this host cannot enforce.
            weaker = gateway.limits_not_enforced()
            return JSONResponse({"status": "ready", **({"not_enforced": weaker} if weaker else {})})
        return JSONResponse({"status": "unavailable", "reason": reason}, status_code=503)

    async def metrics(request: Request) -> Response:
        return Response(gateway.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        def describe_again() -> None:
            server.remove_tool(TOOL_NAME)
            _add_tool(server, gateway)

        async with gateway, server.session_manager.run():
            if gateway.backend is not None:
                gateway.backend.on_change = describe_again
            # Once the evaluator has started (or the remote service said what it offers), the
            # description claims only what it enforces.
            describe_again()
            yield

    routes: list[BaseRoute] = [
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        *sse.routes,
        *streamable.routes,
    ]
    middleware = [Middleware(RequestDeadline, timeout=settings.request_timeout)]
    if not settings.authenticated and not settings.allow_unauthenticated:
        middleware.append(Middleware(LoopbackGuard, open_paths=_OPEN_PATHS))
    # Both sub-apps carry the same authentication middleware (none without a token).
    middleware += [*streamable.user_middleware, Middleware(SseSessions, table=sessions)]
    app = Starlette(routes=routes, middleware=middleware, lifespan=lifespan)
    app.state.gateway = gateway
    return app
