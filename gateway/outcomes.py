"""What a call answers: its session's files kept, its result rendered for the model.

Both the call that ran a cell and a later ``get_output`` or ``interrupt`` that read its end
(:mod:`gateway.follow_ups`) conclude it the same way: the session keeps what the cell wrote and
ran with (:mod:`gateway.code_sessions`), and :mod:`gateway.render` writes the result; a cell
that runs on is answered with its output so far (:func:`~gateway.cells.render_running`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, ImageContent

from snekbox_client import EvalResult

from .cells import render_running
from .choices import Choices
from .code_sessions import CodeSession, CodeSessions, SessionView, keep_files, remember
from .connection import Connection
from .render import RenderLimits, render_result
from .settings import Settings

__all__ = ["Call", "Outcomes"]


@dataclass
class Call:
    """One call in progress: its context, start, outcome so far and log line's fields."""

    ctx: Context[Any, Any]
    started: float = field(default_factory=time.monotonic)
    outcome: str = "cancelled"  # unless the call gets further: only a cancellation stays so
    log: dict[str, Any] = field(default_factory=dict)

    def refuse(self, outcome: str, message: str) -> ToolError:
        """The tool error of a call refused with ``outcome``."""
        self.outcome = outcome
        return ToolError(message)


class Outcomes:
    """Concludes calls (see the module's docstring), within the render limits of ``settings``
    (:attr:`limits`, whose time limit follows what the service says)."""

    def __init__(self, settings: Settings, connection: Connection, sessions: CodeSessions) -> None:
        self.settings = settings
        self.connection = connection
        self.sessions = sessions
        self.limits = RenderLimits.of(settings)

    def conclude(
        self,
        call: Call,
        session: CodeSession,
        choices: Choices,
        uploads: dict[str, bytes],
        result: EvalResult,
    ) -> SessionView:
        """Keep in ``session`` what its cell wrote and ran with; what the result says of it."""
        remember(session, choices, result)
        view = keep_files(session, uploads, result, self.settings.max_session_bytes)
        self.sessions.touch(session)
        call.log["session_id"] = session.id
        if not self.sessions.is_open(session):  # evicted while it ran: end its new
            self.connection.session_closed(session, None)  # interpreter, which nothing holds
        return view

    def render(
        self,
        call: Call,
        result: EvalResult,
        view: SessionView,
        choices: Choices,
        *,
        code: str | None = None,
        started: float | None = None,
    ) -> CallToolResult:
        """What the model sees of ``result`` (its run ``started`` then, by default with the
        call); the call's outcome and log fields from it."""
        rendered = render_result(
            result,
            duration=time.monotonic() - (call.started if started is None else started),
            limits=self.limits,
            session=view,
            notes=choices.notes,
        )
        structured = rendered.structured_content or {}
        call.outcome = structured.get("status", "ok")
        call.log.update(
            returncode=result.returncode,
            stdout_chars=len(result.stdout),
            images=sum(isinstance(c, ImageContent) for c in rendered.content),
            files=len(structured.get("files", ())),
        )
        if self.settings.log_code:
            call.log.update(code=code, stdout=result.stdout)
        return rendered

    def running(self, call: Call, session: CodeSession, result: EvalResult) -> CallToolResult:
        """The answer of a call whose cell runs on: its output so far, and how to go on."""
        call.outcome = "running"
        call.log.update(stdout_chars=len(result.stdout))
        cell = session.cell
        started = cell.started if cell is not None else call.started
        elapsed = time.monotonic() - started
        return render_running(result.stdout, session.id, elapsed, self.limits)
