"""The tool: :class:`Gateway` owns the connection to the evaluation service and runs each call.

A call is admitted (:mod:`gateway.admission`), sent as one ``POST /eval`` through
:mod:`snekbox_client`, and rendered (:mod:`gateway.render`). Failures of the service become tool
errors worded by :mod:`gateway.failures`; a user's exception is a normal result. Each call is
counted (:mod:`gateway.metrics`) and logged in one JSON line.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from dataclasses import replace
from typing import Annotated, Any

import anyio
import httpx
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, ImageContent
from starlette.requests import Request

import evaluator
import plotting
from snekbox_client import (
    ContentWanted,
    EvalResult,
    EvaluatorUnavailable,
    SnekboxClient,
    SnekboxError,
)

from .admission import Admission, Busy
from .failures import GATEWAY_FAILED, ServiceFailure, explain, failure_kind
from .metrics import Metrics
from .render import render_result
from .schema import ExecutionResult
from .settings import Settings

__all__ = ["TOOL_NAME", "Gateway"]

TOOL_NAME = "execute_python_code"

# The name operators filter the per-call log lines by (it was the single module's name).
logger = logging.getLogger("python_mcp_server")

#: The files whose contents an evaluation returns (a superset of plotting.FIGURE_PATTERN's
#: names, and the prelude's manifest), and how much of a figure beyond the image budget: a
#: PNG's signature and size.
_FIGURES = ("figure_[0-9][0-9][0-9]*.png", plotting.MANIFEST_NAME)
_PNG_HEAD_BYTES = 24


class Gateway:
    """Owns the connection to the evaluation service and implements the tool.

    Use it as an async context manager: entering it starts the built-in evaluator when no
    ``snekbox_url`` is configured and opens the shared HTTP client; leaving it closes both.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.admission = Admission(
            settings.in_flight_limit, settings.max_waiting, settings.max_wait
        )
        self.metrics = Metrics(self.admission)
        self._client: SnekboxClient | None = None
        self._builtin: evaluator.Evaluator | None = None
        #: Set on shutdown: calls in flight finish, new ones are turned away.
        self.draining = False
        #: Tool calls between arrival and answer (admission counts only the evaluations).
        self.active_calls = 0
        self._call_ended: anyio.Event | None = None

    async def __aenter__(self) -> Gateway:
        settings = self.settings
        if settings.snekbox_url:
            self._client = SnekboxClient(settings.snekbox_url, timeout=settings.timeout)
        else:
            self._builtin = evaluator.Evaluator(settings.evaluator_config)
            await self._builtin.start()
            # raise_app_exceptions=False: a failure inside the evaluator reaches the client as
            # the 500 it answers (a SnekboxError), not as the evaluator's own exception.
            transport = httpx.ASGITransport(
                evaluator.create_app(self._builtin), raise_app_exceptions=False
            )
            self._client = SnekboxClient(
                "http://builtin-evaluator", transport=transport, timeout=settings.timeout
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
            weaker = {item["limit"] for item in self.limits_not_enforced()}
            in_force = (
                {lim.name: lim for lim in self._builtin.limits_in_force()} if self._builtin else {}
            )
            memory = (
                f"about {cfg.memory_limit} MiB of memory (a MemoryError beyond, not a kill)"
                if "memory" in in_force and "rlimit" in in_force["memory"].how
                else f"{cfg.memory_limit} MiB of memory"
            )
            parts = [f"{cfg.time_limit:g} s wall-clock", memory]
            if "processes" not in weaker:
                parts.append(f"{cfg.pids_limit} processes and threads")
            parts.append(f"{cfg.output_limit:,} bytes of output")
            limits = "Limits: " + ", ".join(parts)
            # Claimed only where this host bounds it (see /readyz's not_enforced).
            if "working directory" not in weaker:
                limits += f"; the working directory holds {cfg.workdir_size} MiB"
            limits += "."
        return (
            f"Run {python} code in a fresh, isolated sandbox and return what it prints.\n\n"
            "- Every call starts from scratch: no variables, imports or files carry over.\n"
            "- Preinstalled: numpy, pandas, matplotlib and the standard library. There is no "
            "network access, so pip install and downloads do not work.\n"
            "- The result is stdout and stderr together, in order (terminal control sequences "
            "removed), then a line [end of output] (numbered, [end of output #2], if the output "
            "holds that text), then the gateway's own lines: the exit status in words, figures "
            "not returned, files written. Print what you want to see: a bare expression is not "
            "echoed. Output must be UTF-8: bytes that are not, written straight to a file "
            "descriptor, lose the whole output.\n"
            "- Figures: every matplotlib figure comes back as a PNG image, in drawing order, with "
            "no extra step: plt.show() or simply leaving the figure open is enough. At most "
            f"{self.settings.max_image_side:,} pixels a side are returned.\n"
            "- Files the code writes in its working directory are listed with their sizes, "
            "their names in double quotes with JSON-style escapes.\n"
            f"- {limits} Output longer than {self.settings.max_output_chars:,} characters is cut "
            "in the middle, keeping its start and end."
        )

    async def execute_python_code(
        self, code: str, ctx: Context[Any, Any]
    ) -> Annotated[CallToolResult, ExecutionResult]:
        """Run ``code`` once; service failures become tool errors, user errors do not.

        Raises:
            ToolError: the code is too long, the service failed, or the gateway itself did.
        """
        started = time.monotonic()
        outcome = "cancelled"  # unless the call gets further: only a cancellation stays so
        log: dict[str, Any] = {"code_chars": len(code)}
        self.active_calls += 1
        try:
            if len(code) > self.settings.max_code_chars:
                outcome = "refused"
                raise ToolError(
                    f"The code is {len(code):,} characters long; the limit is "
                    f"{self.settings.max_code_chars:,}. Send less code, or generate the data "
                    "inside the code instead of pasting it."
                )
            result = await self._evaluate_with_progress(code, ctx, started)
            rendered = render_result(
                result, duration=time.monotonic() - started, settings=self.settings
            )
            structured = rendered.structured_content or {}
            outcome = structured.get("status", "ok")
            log.update(
                returncode=result.returncode,
                stdout_chars=len(result.stdout),
                images=sum(isinstance(c, ImageContent) for c in rendered.content),
                files=len(structured.get("files", ())),
            )
            if self.settings.log_code:
                log.update(code=code, stdout=result.stdout)
            return rendered
        except ServiceFailure as failure:
            outcome = failure.kind
            raise ToolError(failure.message) from failure
        except ToolError:
            raise
        except Exception as exc:  # the one catch-all: a bug here, not the service's failure
            outcome = "gateway_error"
            logger.exception("%s failed in the gateway itself", TOOL_NAME)
            raise ToolError(GATEWAY_FAILED) from exc
        finally:
            self.active_calls -= 1
            if self._call_ended is not None:
                self._call_ended.set()
            duration = time.monotonic() - started
            self.metrics.calls.labels(outcome).inc()
            self.metrics.duration.observe(duration)
            _log_call(ctx, outcome, duration, log)

    async def drained(self) -> None:
        """Return once no tool call is in progress (set ``draining`` first, or it may never)."""
        while self.active_calls:
            self._call_ended = anyio.Event()
            await self._call_ended.wait()

    async def _evaluate_with_progress(
        self, code: str, ctx: Context[Any, Any], started: float
    ) -> EvalResult:
        # A plain task rather than a task group, so the evaluation's errors come back unwrapped.
        progress = asyncio.ensure_future(self._report_progress(ctx, started))
        try:
            return await self._evaluate(code)
        finally:
            progress.cancel()

    async def _evaluate(self, code: str) -> EvalResult:
        if self.draining:
            raise ServiceFailure(
                "shutting_down",
                "The gateway is shutting down; the code did not run. Retry in a few seconds.",
            )
        running = 0
        try:
            async with self.admission.slot():
                running = self.admission.in_flight
                # Only figures' contents come back (bounded); other files: names and sizes.
                wanted = ContentWanted(
                    _FIGURES,
                    self.settings.max_image_bytes + plotting.MANIFEST_MAX_BYTES,
                    _PNG_HEAD_BYTES,
                )
                request = replace(plotting.build_request(code), content_wanted=wanted)
                return await self.client.eval(request)
        except Busy as exc:
            raise ServiceFailure(
                "busy",
                f"The gateway is busy ({exc}); the code did not run. Retry in a few seconds.",
            ) from exc
        except SnekboxError as exc:
            kind = failure_kind(exc)
            self.metrics.evaluator_errors.labels(kind).inc()
            message = explain(exc, running=running, workers=self.settings.backend_workers)
            raise ServiceFailure(kind, message) from exc

    async def _report_progress(self, ctx: Context[Any, Any], started: float) -> None:
        """Tell a client that asked for progress that the call is alive (a no-op otherwise)."""
        if self._builtin is not None:
            total: float | None = self.settings.evaluator_config.time_limit
        else:
            total = None
        while True:
            await anyio.sleep(self.settings.progress_interval)
            elapsed = round(time.monotonic() - started, 1)
            await ctx.report_progress(elapsed, total, f"running for {elapsed:g} s")

    def limits_not_enforced(self) -> list[dict[str, str]]:
        """The built-in evaluator's limits this machine cannot enforce, and why (else none).

        Known only after start; a remote service's limits are its own.
        """
        if self._builtin is None:
            return []
        return [
            {"limit": limit.name, "how": limit.how}
            for limit in self._builtin.limits_in_force()
            if not limit.enforced
        ]

    async def readiness(self) -> str | None:
        """``None`` when the evaluation service answers, else why not (safe to show anyone)."""
        try:
            await self.client.ping()
        except EvaluatorUnavailable:
            return "the evaluation service is unreachable"
        except SnekboxError as exc:
            return f"the evaluation service is unhealthy ({type(exc).__name__})"
        return None


def _log_call(
    ctx: Context[Any, Any], outcome: str, duration: float, fields: dict[str, Any]
) -> None:
    """One structured line per call; the code and output only when MCP_LOG_CODE asks.

    ``session`` is the SSE or Streamable HTTP session id; sessionless clients (the 2026-07-28
    protocol) have none, and their calls are told apart by ``request``.
    """
    request = ctx.request_context.request if ctx.request_context else None
    transport, session = "memory", None
    if isinstance(request, Request):
        transport = "sse" if request.url.path.startswith("/messages") else "streamable-http"
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
