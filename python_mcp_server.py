"""The gateway: an MCP server whose tool ``execute_python_code`` runs Python in a sandbox.

One Starlette app, :data:`starlette_app`, serves MCP over SSE (``GET /sse`` + ``POST /messages/``)
and over Streamable HTTP (``/mcp``), plus ``/healthz`` and ``/readyz``. Every call is forwarded as
one ``POST /eval`` through :mod:`snekbox_client` to the evaluation service: the Snekbox at
``SNEKBOX_URL``, or, when none is set, the built-in :mod:`evaluator` running in-process behind an
ASGI transport. :mod:`plotting` supplies the prelude that turns matplotlib figures into PNG files.

Run it with ``python-mcp-server`` (see ``--help``) or ``uvicorn python_mcp_server:starlette_app``;
the latter reads its settings from the environment when the attribute is first looked up.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import signal
import struct
import sys
import time
from base64 import b64encode
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Annotated, Any, Literal

import httpx
import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.transport_security import TransportSecuritySettings
from mcp.types import CallToolResult, ContentBlock, ImageContent, TextContent, ToolAnnotations
from pydantic import BaseModel, Field
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Route

import evaluator
import plotting
from snekbox_client import (
    EvalResult,
    EvaluatorRejected,
    EvaluatorTimeout,
    EvaluatorUnavailable,
    InvalidResponse,
    SnekboxClient,
    SnekboxError,
)

__all__ = [
    "ExecutionResult",
    "Gateway",
    "Settings",
    "create_app",
    "create_server",
    "main",
    "render_result",
]

logger = logging.getLogger("python_mcp_server")

TOOL_NAME = "execute_python_code"
_LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")


@dataclass(frozen=True)
class Settings:
    """Everything the gateway can be told; :meth:`from_env` reads the environment once.

    ``snekbox_url`` ``None`` selects the built-in evaluator, configured by ``evaluator_config``.
    """

    snekbox_url: str | None = None
    host: str = "127.0.0.1"
    port: int = 18080
    allowed_hosts: tuple[str, ...] = ()
    allowed_origins: tuple[str, ...] = ()
    eval_timeout: float = 60.0
    max_code_chars: int = 1_000_000
    max_output_chars: int = 20_000
    max_image_bytes: int = 512 * 1024
    max_images: int = 16
    log_level: str = "info"
    evaluator_config: evaluator.EvaluatorConfig = field(default_factory=evaluator.EvaluatorConfig)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> Settings:
        """Build settings from ``SNEKBOX_URL``, ``MCP_*`` and the built-in evaluator's variables."""
        defaults = cls()
        return cls(
            snekbox_url=environ.get("SNEKBOX_URL") or None,
            host=environ.get("MCP_HOST", defaults.host),
            port=int(environ.get("MCP_PORT", defaults.port)),
            allowed_hosts=_split(environ.get("MCP_ALLOWED_HOSTS", "")),
            allowed_origins=_split(environ.get("MCP_ALLOWED_ORIGINS", "")),
            eval_timeout=float(environ.get("MCP_EVAL_TIMEOUT", defaults.eval_timeout)),
            max_code_chars=int(environ.get("MCP_MAX_CODE_CHARS", defaults.max_code_chars)),
            max_output_chars=int(environ.get("MCP_MAX_OUTPUT_CHARS", defaults.max_output_chars)),
            max_image_bytes=int(environ.get("MCP_MAX_IMAGE_BYTES", defaults.max_image_bytes)),
            max_images=int(environ.get("MCP_MAX_IMAGES", defaults.max_images)),
            log_level=environ.get("MCP_LOG_LEVEL", defaults.log_level).lower(),
            evaluator_config=evaluator.EvaluatorConfig.from_env(environ),
        )

    def transport_security(self) -> TransportSecuritySettings:
        """DNS-rebinding protection: loopback Hosts and Origins plus the configured extras."""
        hosts = [f"{h}:*" for h in _LOOPBACK_HOSTS] + list(self.allowed_hosts)
        origins = [f"http://{h}:*" for h in _LOOPBACK_HOSTS] + list(self.allowed_origins)
        return TransportSecuritySettings(
            enable_dns_rebinding_protection=True, allowed_hosts=hosts, allowed_origins=origins
        )


def _split(value: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in value.split(",") if item.strip())


# --- The result the model sees ---------------------------------------------------------------

Status = Literal[
    "ok", "error", "exception", "killed", "output_limit", "signal", "sandbox_error", "not_run"
]


class ImageInfo(BaseModel):
    path: str
    size: int = Field(description="PNG size in bytes")
    width: int | None = None
    height: int | None = None
    returned: bool = Field(description="False when the image budget of the result was used up")


class FileInfo(BaseModel):
    path: str
    size: int = Field(description="size in bytes")


class ExecutionResult(BaseModel):
    """The structured form of a result: the same facts as the text and image content."""

    stdout: str = Field(description="stdout and stderr merged, possibly cut in the middle")
    stdout_truncated: bool
    returncode: int | None
    status: Status
    message: str = Field(description="the exit status in words")
    images: list[ImageInfo]
    files: list[FileInfo]


_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")


def render_result(result: EvalResult, *, duration: float, settings: Settings) -> CallToolResult:
    """Turn an evaluation into what the model reads: text, one image per figure, a file list."""
    stdout = _ANSI.sub("", result.stdout)
    shown, truncated = _cut_middle(stdout, settings.max_output_chars)
    status, message = describe_exit(result.returncode, stdout, duration)

    figures, others = plotting.split_figures(result.files)
    images: list[ImageInfo] = []
    image_blocks: list[ContentBlock] = []
    budget = settings.max_image_bytes
    for figure in figures:
        width, height = _png_size(figure.content)
        fits = len(image_blocks) < settings.max_images and figure.size <= budget
        if fits and width is not None:
            budget -= figure.size
            image_blocks.append(
                ImageContent(
                    type="image",
                    data=b64encode(figure.content).decode("ascii"),
                    mime_type="image/png",
                )
            )
        images.append(
            ImageInfo(
                path=figure.path,
                size=figure.size,
                width=width,
                height=height,
                returned=fits and width is not None,
            )
        )

    lines = [shown.rstrip("\n")] if shown.strip() else ["(no output)"]
    lines.append(f"[{message}]")
    dropped = [i for i in images if not i.returned]
    if dropped:
        names = ", ".join(f"{i.path} ({i.size:,} bytes)" for i in dropped)
        lines.append(
            f"[{len(dropped)} of {len(images)} figures not returned: {names}; a result holds at "
            f"most {settings.max_images} images and {settings.max_image_bytes:,} bytes of PNG. "
            "Draw fewer or smaller figures (figsize, dpi) to see them.]"
        )
    if others:
        listing = ", ".join(f"{f.path} ({f.size:,} bytes)" for f in others)
        lines.append(f"[files written: {listing}]")

    structured = ExecutionResult(
        stdout=shown,
        stdout_truncated=truncated,
        returncode=result.returncode,
        status=status,
        message=message,
        images=images,
        files=[FileInfo(path=f.path, size=f.size) for f in others],
    )
    return CallToolResult(
        content=[TextContent(type="text", text="\n".join(lines)), *image_blocks],
        structured_content=structured.model_dump(mode="json"),
    )


def describe_exit(returncode: int | None, stdout: str, duration: float) -> tuple[Status, str]:
    """Say in words how a run ended: the status line of every result."""
    if returncode is None:
        return "not_run", "the evaluator could not run the code; its message is above"
    if returncode == 0:
        return "ok", "exit code 0: ok"
    if returncode == 137:
        return "killed", (
            f"killed after {duration:.1f} s (exit code 137, SIGKILL): the time limit or the "
            "memory limit was reached"
        )
    if returncode == 143:
        return "output_limit", (
            "stopped (exit code 143, SIGTERM): the output limit was reached, the run was cut short"
        )
    if returncode == 255:
        return "sandbox_error", "exit code 255: the sandbox itself failed to run the code"
    if returncode > 128:
        name = _signal_name(returncode - 128)
        return "signal", f"crashed: killed by signal {name} (exit code {returncode})"
    if returncode == 1 and _looks_like_exception(stdout):
        return "exception", "exit code 1: an uncaught exception (traceback above)"
    return "error", f"exit code {returncode}"


def _looks_like_exception(stdout: str) -> bool:
    tail = stdout.rstrip().rsplit("\n", 1)[-1]
    return "Traceback (most recent call last):" in stdout or bool(
        re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b", tail)
    )


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"#{number}"


def _cut_middle(text: str, limit: int) -> tuple[str, bool]:
    """Keep the head and tail of ``text`` within ``limit`` characters, saying what was cut."""
    if len(text) <= limit:
        return text, False
    head = text[: limit * 3 // 5]
    tail = text[len(text) - limit * 2 // 5 :]
    cut = len(text) - len(head) - len(tail)
    note = (
        f"\n[... output cut: {cut:,} of {len(text):,} characters omitted; "
        f"the first {len(head):,} and the last {len(tail):,} are shown ...]\n"
    )
    return head + note + tail, True


def _png_size(data: bytes) -> tuple[int | None, int | None]:
    if len(data) < 24 or data[12:16] != b"IHDR":
        return None, None
    width, height = struct.unpack(">II", data[16:24])
    return width, height


# --- The tool ----------------------------------------------------------------------------------


class Gateway:
    """Owns the connection to the evaluation service and implements the tool.

    Use it as an async context manager: entering it starts the built-in evaluator when no
    ``snekbox_url`` is configured and opens the shared HTTP client; leaving it closes both.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._client: SnekboxClient | None = None
        self._builtin: evaluator.Evaluator | None = None

    async def __aenter__(self) -> Gateway:
        settings = self.settings
        if settings.snekbox_url:
            self._client = SnekboxClient(settings.snekbox_url, timeout=settings.eval_timeout)
        else:
            self._builtin = evaluator.Evaluator(settings.evaluator_config)
            await self._builtin.start()
            self._client = SnekboxClient(
                "http://builtin-evaluator",
                transport=httpx.ASGITransport(evaluator.create_app(self._builtin)),
                timeout=settings.eval_timeout,
            )
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._client is not None:
            await self._client.aclose()
        if self._builtin is not None:
            await self._builtin.aclose()

    @property
    def client(self) -> SnekboxClient:
        if self._client is None:
            raise RuntimeError("the gateway is not started: use it as an async context manager")
        return self._client

    def tool_description(self) -> str:
        """The tool's description, written for the model that calls it."""
        if self.settings.snekbox_url:
            python = "Python 3"
            limits = (
                "The evaluation service sets the limits on time, memory, processes and output; "
                "a run that exceeds the time or memory limit is killed (exit code 137)."
            )
        else:
            cfg = self.settings.evaluator_config
            python = f"Python {sys.version_info.major}.{sys.version_info.minor}"
            limits = (
                f"Limits: {cfg.time_limit:g} s wall-clock, {cfg.memory_limit} MiB of memory, "
                f"{cfg.pids_limit} processes and threads, {cfg.output_limit:,} bytes of output; "
                f"the working directory holds {cfg.workdir_size} MiB."
            )
        return (
            f"Run {python} code in a fresh, isolated sandbox and return what it prints.\n\n"
            "- Every call starts from scratch: no variables, imports or files carry over.\n"
            "- Preinstalled: numpy, pandas, matplotlib and the standard library. There is no "
            "network access, so pip install and downloads do not work.\n"
            "- The result is stdout and stderr together, in order, followed by the exit status "
            "in words. Print what you want to see: a bare expression is not echoed.\n"
            "- Figures: every matplotlib figure comes back as a PNG image, in drawing order, with "
            "no extra step: plt.show() or simply leaving the figure open is enough.\n"
            "- Files the code writes in its working directory are listed with their sizes.\n"
            f"- {limits} Output longer than {self.settings.max_output_chars:,} characters is cut "
            "in the middle, keeping its start and end."
        )

    async def execute_python_code(
        self, code: str, ctx: Context[Any, Any]
    ) -> Annotated[CallToolResult, ExecutionResult]:
        """Run ``code`` once; service failures become tool errors, user errors do not."""
        if len(code) > self.settings.max_code_chars:
            raise ToolError(
                f"The code is {len(code):,} characters long; the limit is "
                f"{self.settings.max_code_chars:,}. Send less code, or generate the data inside "
                "the code instead of pasting it."
            )
        started = time.monotonic()
        try:
            result = await self.client.eval(plotting.build_request(code))
        except SnekboxError as exc:
            logger.warning("call failed: %s", type(exc).__name__)
            raise ToolError(_explain(exc)) from exc
        duration = time.monotonic() - started
        rendered = render_result(result, duration=duration, settings=self.settings)
        logger.info(
            "call status=%s returncode=%s duration_ms=%d stdout_chars=%d files=%d",
            rendered.structured_content["status"] if rendered.structured_content else "?",
            result.returncode,
            duration * 1000,
            len(result.stdout),
            len(result.files),
        )
        return rendered

    async def readiness(self) -> str | None:
        """``None`` when the evaluation service answers, else why not (safe to show anyone)."""
        try:
            await self.client.ping()
        except EvaluatorUnavailable:
            return "the evaluation service is unreachable"
        except SnekboxError as exc:
            return f"the evaluation service is unhealthy ({type(exc).__name__})"
        return None


def _explain(exc: SnekboxError) -> str:
    """A tool error the model can act on: what failed, whether the code ran, what to do."""
    if isinstance(exc, EvaluatorUnavailable):
        return (
            f"The Python evaluation service is unreachable ({exc.reason}); the code did not run. "
            "Retry in a few seconds; if this persists, the service is down and needs an operator."
        )
    if isinstance(exc, EvaluatorTimeout):
        return (
            f"The evaluation service did not answer within {exc.timeout:g} s; the result is lost. "
            "Retry, and if the code is slow, make it faster or smaller."
        )
    if isinstance(exc, EvaluatorRejected):
        if exc.status_code == 503:
            return (
                "The evaluation service is busy (every slot is running and the queue is full); "
                "the code did not run. Retry in a few seconds."
            )
        detail = f": {exc.description}" if exc.description else ""
        return (
            f"The evaluation service rejected the request ({exc.status_code} {exc.title}{detail})."
        )
    if isinstance(exc, InvalidResponse):
        return f"The evaluation service answered something that is not a result ({exc}). Retry."
    return f"The evaluation service failed: {exc}"


def create_server(gateway: Gateway) -> MCPServer[Any]:
    """The MCP server with its one tool, bound to ``gateway``."""
    server: MCPServer[Any] = MCPServer(
        name="python-mcp-server",
        instructions="Use execute_python_code to run Python: computations, data, charts.",
    )
    server.add_tool(
        gateway.execute_python_code,
        name=TOOL_NAME,
        title="Run Python",
        description=gateway.tool_description(),
        annotations=ToolAnnotations(
            read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False
        ),
    )
    return server


# --- The HTTP app ------------------------------------------------------------------------------


def create_app(settings: Settings | None = None) -> Starlette:
    """The Starlette app serving SSE, Streamable HTTP, ``/healthz`` and ``/readyz``.

    The gateway (evaluator, HTTP client) and the Streamable HTTP session manager live in the
    app's lifespan, so the app must be run by a server that runs lifespans (uvicorn does).
    """
    settings = settings or Settings.from_env()
    gateway = Gateway(settings)
    server = create_server(gateway)
    security = settings.transport_security()
    sse = server.sse_app(transport_security=security)
    streamable = server.streamable_http_app(transport_security=security)

    async def healthz(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> JSONResponse:
        reason = await gateway.readiness()
        if reason is None:
            return JSONResponse({"status": "ready"})
        return JSONResponse({"status": "unavailable", "reason": reason}, status_code=503)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with gateway, server.session_manager.run():
            yield

    routes: list[BaseRoute] = [
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        *sse.routes,
        *streamable.routes,
    ]
    return Starlette(routes=routes, lifespan=lifespan)


def __getattr__(name: str) -> Any:
    # `uvicorn python_mcp_server:starlette_app` looks the app up; build it then, not at import,
    # so importing this module (tests, tools) reads no environment and starts nothing.
    if name == "starlette_app":
        app = create_app()
        globals()["starlette_app"] = app
        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _parse_args(argv: Sequence[str] | None, settings: Settings) -> Settings:
    parser = argparse.ArgumentParser(
        prog="python-mcp-server",
        description="Serve the execute_python_code MCP tool over SSE (/sse) and HTTP (/mcp).",
    )
    parser.add_argument("--host", default=settings.host, help="address to bind (MCP_HOST)")
    parser.add_argument("--port", type=int, default=settings.port, help="port (MCP_PORT)")
    parser.add_argument(
        "--snekbox-url",
        default=settings.snekbox_url,
        help="Snekbox to evaluate code with (SNEKBOX_URL); default: the built-in evaluator",
    )
    parser.add_argument("--log-level", default=settings.log_level, help="(MCP_LOG_LEVEL)")
    args = parser.parse_args(argv)
    return replace(
        settings,
        host=args.host,
        port=args.port,
        snekbox_url=args.snekbox_url or None,
        log_level=args.log_level.lower(),
    )


def main(argv: Sequence[str] | None = None) -> None:
    """Console entry point: ``python-mcp-server [--host H] [--port P] [--snekbox-url URL]``."""
    settings = _parse_args(argv, Settings.from_env())
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        timeout_graceful_shutdown=30,
    )


if __name__ == "__main__":
    main()
