"""The tools: :class:`Gateway`, whose ``execute_python_code`` and ``end_session`` the MCP server
publishes (their parameters, descriptions and annotations are a contract with clients).

The gateway is handed its evaluation service (:mod:`gateway.connection`); each call goes
through the call pipeline (:mod:`gateway.calls`); the description the model reads is written by
:mod:`gateway.description`.
"""

from __future__ import annotations

from typing import Annotated, Any

from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult
from pydantic import Field

from .admission import Admission
from .backend import Backend
from .callers import owner
from .calls import TOOL_NAME, Arguments, Calls
from .code_sessions import CodeSessions, SessionGone
from .connection import Connection, EvaluationService
from .description import environment_report, tool_description
from .handles import SessionHandles
from .metrics import Metrics
from .schema import ExecutionResult
from .settings import Settings
from .uploads import InputFile

__all__ = ["END_TOOL_NAME", "INTERRUPT_TOOL_NAME", "READ_TOOL_NAME", "TOOL_NAME", "Gateway"]

END_TOOL_NAME = "end_session"
READ_TOOL_NAME = "get_output"
INTERRUPT_TOOL_NAME = "interrupt"

#: Seconds ``get_output`` waits by default, and at most (a client's own timeout comes first).
DEFAULT_READ_WAIT, MAX_READ_WAIT = 10.0, 300.0
#: Seconds ``interrupt`` waits for the cell's end: the evaluator's grace, then its kill.
INTERRUPT_WAIT = 15.0


#: The code sessions kept when neither the settings nor the service say how many (Snekbox).
DEFAULT_CODE_SESSIONS = 64


class Gateway:
    """The tools, on the evaluation service it is handed.

    Use it as an async context manager: entering it starts the service when it runs in this
    process and asks what it offers; leaving it closes the service.

    Args:
        settings: The gateway's settings.
        service: Its evaluation service (:func:`~gateway.connection.evaluation_service` builds
            the one the settings name; a test may pass a fake).
    """

    def __init__(self, settings: Settings, service: EvaluationService) -> None:
        self.settings = settings
        self.connection = Connection(settings, service)
        self.admission = Admission(
            settings.in_flight_limit, settings.max_waiting, settings.max_wait
        )
        self.metrics = Metrics(self.admission)
        self.sessions = CodeSessions(
            max_sessions=settings.max_code_sessions or DEFAULT_CODE_SESSIONS,
            per_client=settings.max_code_sessions_per_client,
            idle_timeout=settings.code_session_idle_timeout,
            registry=self.metrics.registry,
            named_clients=settings.authenticated,
            on_close=self.connection.session_closed,
            handles=SessionHandles(
                settings.session_secret.encode() if settings.session_secret else None
            ),
        )
        self.calls = Calls(settings, self.connection, self.sessions, self.admission, self.metrics)
        self.metrics.count_running_cells(
            lambda: sum(session.cell is not None for session in self.sessions)
        )

    async def __aenter__(self) -> Gateway:
        await self.connection.start(self.tool_description)
        self.sessions.max_sessions = self._code_session_cap()
        return self

    def _code_session_cap(self) -> int:
        """The code sessions this gateway keeps: the setting, or the in-process evaluator's
        live-session cap, never more than that cap: the gateway closes sessions first (and
        ends their interpreters), so the evaluator never drops one it still holds. Behind
        ``SNEKBOX_URL`` one replica's ``GET /info`` says nothing of how many replicas share
        the name, so the setting (or 64) holds, and each replica applies its own cap fairly."""
        asked = self.settings.max_code_sessions
        if self.connection.local is not None:
            limit = self.connection.local.session_limit  # derived at its start
            return max(1, min(asked or limit, limit))
        return asked or DEFAULT_CODE_SESSIONS

    async def __aexit__(self, *exc_info: object) -> None:
        await self.connection.aclose()

    @property
    def backend(self) -> Backend | None:
        """What the service offers, as it says (``None`` until started)."""
        return self.connection.backend

    @property
    def draining(self) -> bool:
        """Set on shutdown: calls in flight finish, new ones are turned away."""
        return self.calls.draining

    @draining.setter
    def draining(self, value: bool) -> None:
        self.calls.draining = value

    @property
    def active_calls(self) -> int:
        """Tool calls between arrival and answer."""
        return self.calls.active_calls

    async def drained(self) -> None:
        """Return once no tool call is in progress (set ``draining`` first, or it may never)."""
        await self.calls.drained()

    def tool_description(self) -> str:
        """The tool's description, written for the model that calls it: what the backend was
        found to offer (its Python, packages, sessions, limits), never more."""
        return tool_description(self.settings, self.connection)

    def environment_report(self) -> dict[str, Any]:
        """What the environment resource answers: the probe's findings and the sessions' kind."""
        return environment_report(self.connection)

    def limits_not_enforced(self) -> list[dict[str, str]]:
        """The built-in evaluator's limits this machine cannot enforce, and why (else none)."""
        return self.connection.limits_not_enforced()

    async def readiness(self) -> str | None:
        """``None`` when the evaluation service answers, else why not (safe to show anyone).

        Draining, the gateway is not ready: a load balancer stops sending it calls it would
        refuse."""
        if self.draining:
            return "the gateway is shutting down"
        return await self.connection.readiness()

    async def execute_python_code(
        self,
        code: Annotated[str, Field(description="the Python source to run")],
        ctx: Context[Any, Any],
        session_id: Annotated[
            str | None,
            Field(
                description="continue this session (its files); omit it to start a new one. "
                "Every result gives the session's id."
            ),
        ] = None,
        files: Annotated[
            list[InputFile] | None,
            Field(
                description="files written into the working directory before the code runs "
                "(they stay in the session); paths relative, sub-folders allowed"
            ),
        ] = None,
        timeout_seconds: Annotated[
            float | None,
            Field(
                gt=0,
                allow_inf_nan=False,
                description="this call's time limit in seconds; more than the maximum (said in "
                "the tool's description) is lowered to it, and the result says so",
            ),
        ] = None,
        packages: Annotated[
            list[Annotated[str, Field(max_length=200)]] | None,
            Field(
                max_length=64,
                description="PEP 508 requirements to install for this call, e.g. "
                '["tabulate==0.9.0", "sympy>=1.12"] (in a session, kept for its later '
                "calls); wins over a '# /// script' block's dependencies",
            ),
        ] = None,
        python: Annotated[
            str | None,
            Field(
                max_length=32,
                description='the Python version to run, e.g. "3.12", among those the tool\'s '
                "description offers (a session keeps the one it started with)",
            ),
        ] = None,
        wait_seconds: Annotated[
            float | None,
            Field(
                ge=0,
                allow_inf_nan=False,
                description="answer after at most this many seconds even if the code is still "
                "running: the result then has status 'running', the output so far and the "
                "session's id, and the code goes on in its session (read it with get_output, "
                "stop it with interrupt); without timeout_seconds, such a run may take up to "
                "the long-run limit said in the tool's description. Omit it to wait for the end",
            ),
        ] = None,
    ) -> Annotated[CallToolResult, ExecutionResult]:
        """Run ``code`` in a session; service failures become tool errors, user errors do not.

        Raises:
            ToolError: the code is too long, the files break a rule, the session is gone, the
                service failed, or the gateway itself did.
        """
        arguments = Arguments(
            code, session_id, files, timeout_seconds, packages, python, wait_seconds
        )
        return await self.calls.run(arguments, ctx)

    async def get_output(
        self,
        session_id: Annotated[str, Field(description="the session whose code is running")],
        ctx: Context[Any, Any],
        wait_seconds: Annotated[
            float | None,
            Field(
                ge=0,
                allow_inf_nan=False,
                description="wait up to this many seconds for more output or for the end "
                f"(default {DEFAULT_READ_WAIT:g}, at most {MAX_READ_WAIT:g})",
            ),
        ] = None,
    ) -> Annotated[CallToolResult, ExecutionResult]:
        """Read a running cell: what it printed since the last read, or its whole result.

        Raises:
            ToolError: no such session of this client, no running cell, or the service failed.
        """
        wait = min(DEFAULT_READ_WAIT if wait_seconds is None else wait_seconds, MAX_READ_WAIT)
        return await self.calls.follow_up(session_id, ctx, wait=wait, interrupt=False)

    async def interrupt(
        self,
        session_id: Annotated[str, Field(description="the session whose code is running")],
        ctx: Context[Any, Any],
    ) -> Annotated[CallToolResult, ExecutionResult]:
        """Stop a running cell with a KeyboardInterrupt, keeping the session.

        Raises:
            ToolError: no such session of this client, no running cell, or the service failed.
        """
        return await self.calls.follow_up(session_id, ctx, wait=INTERRUPT_WAIT, interrupt=True)

    async def end_session(
        self,
        session_id: Annotated[str, Field(description="the session to end")],
    ) -> str:
        """End a session now: its files are dropped and its id answers that it was ended.

        Raises:
            ToolError: no such open session.
        """
        try:
            self.sessions.end(session_id, owner(), adopt=self.connection.live_sessions)
        except SessionGone as exc:
            raise ToolError(f"{exc.fate}: there is nothing to end.") from exc
        self.calls.wake()  # its room is free
        return f"The session {session_id!r} is ended; its files are gone."

    def read_session_file(self, session_id: str, path: str) -> bytes:
        """A file of an open session of this client (``resources/read``).

        Raises:
            SessionGone: no such open session.
            KeyError: the session has no such file.
        """
        session = self.sessions.get(session_id, owner())
        return session.files[path]
