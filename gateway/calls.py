"""The call pipeline: one ``execute_python_code`` call from its arrival to its answer.

A call belongs to a code session (:mod:`gateway.code_sessions`: a new one, or the one it names),
whose files, with those it sends in (:mod:`gateway.uploads`), go into its run. It waits for its
session's turn (:mod:`gateway.admission`), has its Python and packages chosen
(:mod:`gateway.choices`), is evaluated (:mod:`gateway.evaluation`), and rendered
(:mod:`gateway.render`); the files it wrote stay with the session. Failures of the service
become tool errors worded by :mod:`gateway.failures`; a user's exception is a normal result.
Each call is counted (:mod:`gateway.metrics`) and logged in one JSON line.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field, replace
from typing import Any

import anyio
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, ImageContent

from snekbox_client import EvalResult

from .admission import Admission, Busy
from .callers import client_of, log_call, owner
from .choices import MAX_PACKAGES, ChoiceRefused, Choices, choose, script_metadata
from .code_sessions import (
    CodeSession,
    CodeSessions,
    SessionGone,
    SessionsBusy,
    SessionView,
    check_room,
    keep_files,
    remember,
)
from .connection import Connection
from .evaluation import Evaluations, Run
from .failures import GATEWAY_FAILED, ServiceFailure
from .metrics import Metrics
from .render import RenderLimits, render_result
from .settings import Settings
from .uploads import InputFile, UploadRefused, decode_files

__all__ = ["TOOL_NAME", "Arguments", "Calls"]

TOOL_NAME = "execute_python_code"

#: The name operators filter the gateway's log lines by (it was the single module's name).
logger = logging.getLogger("python_mcp_server")


@dataclass(frozen=True)
class Arguments:
    """A call's arguments, as the tool received them."""

    code: str
    session_id: str | None = None
    files: list[InputFile] | None = None
    timeout_seconds: float | None = None
    packages: list[str] | None = None
    python: str | None = None


@dataclass
class _Call:
    """One call in progress: its context, start, outcome so far and log line's fields."""

    ctx: Context[Any, Any]
    started: float = field(default_factory=time.monotonic)
    outcome: str = "cancelled"  # unless the call gets further: only a cancellation stays so
    log: dict[str, Any] = field(default_factory=dict)

    def refuse(self, outcome: str, message: str) -> ToolError:
        """The tool error of a call refused with ``outcome``."""
        self.outcome = outcome
        return ToolError(message)


class Calls:
    """Runs each call (see the module's docstring), and knows how many are in progress."""

    def __init__(
        self,
        settings: Settings,
        connection: Connection,
        sessions: CodeSessions,
        admission: Admission,
        metrics: Metrics,
    ) -> None:
        self.settings = settings
        self.limits = RenderLimits.of(settings)
        self.connection = connection
        self.sessions = sessions
        self.admission = admission
        self.metrics = metrics
        self.evaluations = Evaluations(settings, connection, sessions, admission, metrics)
        #: Set on shutdown: calls in flight finish, new ones are turned away.
        self.draining = False
        #: Tool calls between arrival and answer (admission counts only the evaluations).
        self.active_calls = 0
        # Set, and replaced, whenever a call ends: for drained(), and for calls waiting for a
        # session to end its call and make room (see _session).
        self._call_ended = asyncio.Event()

    async def run(self, args: Arguments, ctx: Context[Any, Any]) -> CallToolResult:
        """Run one call; service failures become tool errors, user errors do not.

        Raises:
            ToolError: the code is too long, the files break a rule, the session is gone, the
                service failed, or the gateway itself did.
        """
        call = _Call(ctx, log={"code_chars": len(args.code)})
        self.active_calls += 1
        try:
            return await self._run(args, call)
        except ServiceFailure as failure:
            call.outcome = failure.kind
            raise ToolError(failure.message) from failure
        except ToolError:
            raise
        except Exception as exc:  # the one catch-all: a bug here, not the service's failure
            call.outcome = "gateway_error"
            logger.exception("%s failed in the gateway itself", TOOL_NAME)
            raise ToolError(GATEWAY_FAILED) from exc
        finally:
            self._finish(call)

    async def _run(self, args: Arguments, call: _Call) -> CallToolResult:
        """The steps of :meth:`run`: opened, run in its session's turn, rendered."""
        limit = self.settings.max_code_chars
        if len(args.code) > limit:
            raise call.refuse(
                "refused",
                f"The code is {len(args.code):,} characters long; the limit is {limit:,}. "
                "Send less code, or generate the data inside the code instead of pasting it.",
            )
        client = client_of(call.ctx)
        if client is not None and self.settings.authenticated:
            call.log["client"] = client
        session, uploads, choices = await self._open(args, call, client)
        call.log.update(session_id=session.id, files_sent=len(uploads))
        time_limit, lowered = self._time_limit(args.timeout_seconds)
        try:
            async with self.admission.turn(session.turns):
                run = await self._in_turn(args, call, session, uploads, time_limit, choices)
                result, view = await self._evaluate(call, run, new=args.session_id is None)
        except Busy as exc:  # raised only before the turn came: nothing of it ran
            raise call.refuse(
                "busy",
                f"The session is running another call, and this one cannot wait for it "
                f"({exc}); this code did not run. Call again once that call has answered.",
            ) from exc
        view.time_limit_lowered = lowered
        return self._render(args, call, result, view, run.choices)

    async def _open(
        self, args: Arguments, call: _Call, client: str | None
    ) -> tuple[CodeSession, dict[str, bytes], Choices | None]:
        """The call's session, uploads, and for a new session its choices: refused for its
        arguments, a call opens no session."""
        room = self.settings.max_session_bytes
        choices = None
        try:
            uploads = decode_files(
                args.files or [],
                max_files=self.settings.max_upload_files,
                max_bytes=self.settings.max_upload_bytes,
            )
            if args.session_id is None:
                unopened = CodeSession("", owner(), "", client)
                check_room(unopened, uploads, room)
                choices = await self._choices(args, unopened)
            session = await self._session(args.session_id, client)
            check_room(session, uploads, room)
        except (UploadRefused, SessionGone, ChoiceRefused) as exc:
            raise call.refuse("refused", str(exc)) from exc
        except SessionsBusy as exc:
            raise call.refuse("busy", str(exc)) from exc
        return session, uploads, choices

    async def _in_turn(
        self,
        args: Arguments,
        call: _Call,
        session: CodeSession,
        uploads: dict[str, bytes],
        time_limit: float | None,
        choices: Choices | None,
    ) -> Run:
        """What the call runs, checked once its session's turn came, as the call before left
        the session (``choices``: a new session's, made before it opened)."""
        if not self.sessions.is_open(session):  # closed while this call waited
            raise call.refuse("refused", str(self.sessions.gone(session.id)))
        try:
            check_room(session, uploads, self.settings.max_session_bytes)
            if choices is None:
                choices = await self._choices(args, session)
        except (UploadRefused, ChoiceRefused) as exc:
            raise call.refuse("refused", str(exc)) from exc
        self.sessions.touch(session)
        return Run(args.code, session, uploads, time_limit, choices)

    async def _evaluate(
        self, call: _Call, run: Run, *, new: bool
    ) -> tuple[EvalResult, SessionView]:
        """Evaluate ``run``, and keep in its session (``new``: opened by this call) what it
        wrote and ran with.

        Raises:
            ServiceFailure: the gateway is shutting down, or the evaluation failed.
        """
        session = run.session
        try:
            if self.draining:
                raise ServiceFailure(
                    "shutting_down",
                    "The gateway is shutting down; the code did not run. Retry in a few seconds.",
                )
            result = await self.evaluations.evaluate(run, call.ctx, call.started)
        except (ServiceFailure, asyncio.CancelledError):
            if new:  # nobody learns its id: it would only wait to expire
                self.sessions.discard(session)
            raise
        remember(session, run.choices, result)
        view = keep_files(session, run.uploads, result, self.settings.max_session_bytes)
        self.sessions.touch(session)
        call.log["session_id"] = session.id
        if not self.sessions.is_open(session):  # evicted while it ran: end its new
            self.connection.session_closed(session, None)  # interpreter, which nothing holds
        return result, view

    def _render(
        self,
        args: Arguments,
        call: _Call,
        result: EvalResult,
        view: SessionView,
        choices: Choices,
    ) -> CallToolResult:
        """What the model sees of ``result``; the call's outcome and log fields from it."""
        rendered = render_result(
            result,
            duration=time.monotonic() - call.started,
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
            call.log.update(code=args.code, stdout=result.stdout)
        return rendered

    def _finish(self, call: _Call) -> None:
        """The call's end: its closed sessions' interpreters ended, it is counted and logged."""
        self.connection.end_evicted()  # no request carried them (refused, or another replica)
        self.active_calls -= 1
        self.wake()
        duration = time.monotonic() - call.started
        self.metrics.calls.labels(call.outcome).inc()
        if "client" in call.log:
            self.metrics.calls_by_client.labels(call.log["client"], call.outcome).inc()
        self.metrics.duration.observe(duration)
        log_call(call.ctx, call.outcome, duration, call.log)

    def wake(self) -> None:
        """Tell drained() and the calls waiting for room that a call ended (or a session)."""
        self._call_ended.set()
        self._call_ended = asyncio.Event()

    async def drained(self) -> None:
        """Return once no tool call is in progress (set ``draining`` first, or it may never)."""
        while self.active_calls:
            await self._call_ended.wait()

    async def _choices(self, args: Arguments, session: CodeSession) -> Choices:
        """The Python and packages of this call (see :mod:`gateway.choices`); in a live
        session, its interpreter's Python, and every package its calls asked for (the session
        takes them on once the call ran: see :func:`~gateway.code_sessions.remember`).

        Raises:
            ChoiceRefused: they cannot be had here, or the session runs another Python.
        """
        offers = self.connection.offers()
        current = next((o for o in offers if o.executable_path == session.python), None)
        kept = session.calls > 0  # a session keeps the Python its first call ran
        choices = choose(
            python=args.python,
            packages=args.packages,
            script=await script_metadata(args.code),  # in a worker thread when there is a block
            offers=offers,
            # Turned off, the evaluator refuses them itself: a result, as any other refusal.
            installs=self.connection.info.packages in ("any", "allow-list", "off"),
            why_no_installs=self.connection.why_no_installs(),
            prefer=current if session.calls else None,
        )
        chosen = choices.python.executable_path if choices.python is not None else None
        if kept and choices.python is not None and chosen != session.python:
            running = current.version if current is not None else "another version"
            raise ChoiceRefused(
                f"This session runs Python {running}; a session keeps the Python it started "
                "with. Omit session_id to start a new session with another Python."
            )
        if choices.python is None and session.calls:
            chosen = session.python  # unasked: the session's own
        packages_all = tuple(dict.fromkeys((*session.packages, *choices.packages)))
        if len(packages_all) > MAX_PACKAGES:
            raise ChoiceRefused(
                f"This session would have {len(packages_all)} packages; at most {MAX_PACKAGES} "
                "are kept for a session. Start a new session for other packages."
            )
        python_offer = next((o for o in offers if o.executable_path == chosen), None)
        return replace(choices, python=python_offer, packages=packages_all)

    async def _session(self, session_id: str | None, client: str | None) -> CodeSession:
        """The call's session: the one it names, or a new one. At the cap, with every session
        running a call, the call waits as for an evaluation slot (among ``max_waiting``, at
        most ``max_wait`` seconds) for a call to end, whose session then makes room.

        Raises:
            SessionGone: the one it names is not open.
            SessionsBusy: no session ended its call within the wait, or the queue is full.
        """
        caller = owner()

        def attempt() -> CodeSession:
            if session_id is not None:
                live = self.connection.live_sessions
                return self.sessions.get(session_id, caller, adopt=live, client=client)
            return self.sessions.create(caller, client)

        try:
            return attempt()
        except SessionsBusy:
            pass
        try:
            with self.admission.queued() as deadline:
                while True:
                    ended = self._call_ended
                    with anyio.move_on_after(max(deadline - anyio.current_time(), 0)):
                        await ended.wait()
                    try:
                        return attempt()
                    except SessionsBusy as exc:
                        if anyio.current_time() >= deadline:
                            waited = f"none ended it within {self.admission.max_wait:g} s"
                            raise SessionsBusy(exc.count, waited, own=exc.own) from None
        except Busy as exc:
            raise SessionsBusy(self.sessions.max_sessions, str(exc)) from None

    def _time_limit(self, asked: float | None) -> tuple[float | None, float | None]:
        """The call's time limit (``None``: the service's own) and, if lowered, what was asked."""
        maximum = self.settings.max_time_limit
        if asked is None:
            return None, None
        if asked > maximum:
            return maximum, asked
        return asked, None
