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
import math
import time
from dataclasses import dataclass, replace
from typing import Any

import anyio
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult

import plotting
from snekbox_client import EvalResult

from .admission import Admission, Busy
from .callers import client_of, log_call, owner
from .cells import CellReads, PendingCell, cell_running, progress_wanted
from .choices import ChoiceRefused, Choices
from .code_sessions import (
    CodeSession,
    CodeSessions,
    SessionGone,
    SessionsBusy,
    check_room,
)
from .connection import Connection
from .evaluation import Evaluations, Run
from .failures import GATEWAY_FAILED, ServiceFailure
from .follow_ups import follow_up
from .metrics import Metrics
from .outcomes import Call, Outcomes
from .session_choices import call_choices
from .session_choices import time_limit as session_time_limit
from .settings import Settings
from .tasks import task_wait
from .uploads import InputFile, UploadRefused, decode_files

__all__ = ["TOOL_NAME", "Arguments", "Calls"]

TOOL_NAME = "execute_python_code"

#: Seconds the service waits for a cell before it answers ``running``, when nobody asked for
#: progress nor for a shorter wait: its answer then carries the result of most cells.
_FIRST_WAIT = 10.0

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
    wait_seconds: float | None = None


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
        self.outcomes = Outcomes(settings, connection, sessions)
        self.connection = connection
        self.sessions = sessions
        self.admission = admission
        self.metrics = metrics
        self.evaluations = Evaluations(settings, connection, sessions, admission, metrics)
        self.reads = CellReads(settings.progress_interval)
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
        call = Call(ctx, log={"code_chars": len(args.code)})
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

    async def _run(self, args: Arguments, call: Call) -> CallToolResult:
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
        if session.cell is not None:
            raise call.refuse("busy", cell_running(session))
        tasked = args.wait_seconds is None and (wait := task_wait()) is not None
        if tasked:  # it may become a task (gateway.tasks)
            args = replace(args, wait_seconds=wait)
        time_limit, lowered = session_time_limit(
            self.connection, args.timeout_seconds, args.wait_seconds
        )
        limits = self.outcomes.limits
        self.outcomes.limits = replace(limits, max_time_limit=self.connection.max_time_limit())
        try:
            async with self.admission.turn(session.turns):
                run = await self._in_turn(
                    args, call, session, uploads, (time_limit, lowered), choices
                )
                result = await self._evaluate(call, run, new=args.session_id is None)
        except Busy as exc:  # raised only before the turn came: nothing of it ran
            raise call.refuse(
                "busy",
                f"The session is running another call, and this one cannot wait for it "
                f"({exc}); this code did not run. Call again once that call has answered.",
            ) from exc
        if result.running:
            if tasked and session.cell is not None:  # a task's result holds all its output
                session.cell.unread.add(result.stdout)
            return self.outcomes.running(call, session, result)
        view = self.outcomes.conclude(call, session, run.choices, run.uploads, result)
        view.time_limit_lowered = run.lowered
        return self.outcomes.render(call, result, view, run.choices, code=args.code)

    async def _open(
        self, args: Arguments, call: Call, client: str | None
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
        call: Call,
        session: CodeSession,
        uploads: dict[str, bytes],
        limits: tuple[float | None, float | None],
        choices: Choices | None,
    ) -> Run:
        """What the call runs, checked once its session's turn came, as the call before left
        the session (``limits``: its time limit and what was asked, if lowered; ``choices``: a
        new session's, made before it opened)."""
        time_limit, lowered = limits
        if not self.sessions.is_open(session):  # closed while this call waited
            raise call.refuse("refused", str(self.sessions.gone(session.id)))
        try:
            check_room(session, uploads, self.settings.max_session_bytes)
            if choices is None:
                choices = await self._choices(args, session)
        except (UploadRefused, ChoiceRefused) as exc:
            raise call.refuse("refused", str(exc)) from exc
        self.sessions.touch(session)
        wait = None
        if self.connection.reads_cells:
            wait = self.settings.progress_interval if progress_wanted(call.ctx) else _FIRST_WAIT
            if args.wait_seconds is not None:
                wait = min(wait, args.wait_seconds)
        return Run(
            args.code, session, uploads, time_limit, choices, wait, args.wait_seconds, lowered
        )

    async def _evaluate(self, call: Call, run: Run, *, new: bool) -> EvalResult:
        """Evaluate ``run`` (``new``: its session opened by this call); a cell that runs on
        is read (:mod:`gateway.cells`) until it ends or the call's ``wait_seconds`` pass.
        Sent without the prelude to a sandbox that had none, it is sent once more, whole.

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
        except asyncio.CancelledError:
            if run.wait is not None and not new:  # the cell may run on: it is read later
                session.cell = self._pending(run, call)
            elif new:  # nobody learns its id: it would only wait to expire
                self.sessions.discard(session)
            raise
        except ServiceFailure:
            if new:
                self.sessions.discard(session)
            raise
        if result.running:
            session.live = True  # the evaluator holds its interpreter, running the cell
            session.cell = cell = self._pending(run, call)
            until = call.started + (run.wait_seconds if run.wait_seconds is not None else math.inf)
            result = await self.read_cell(session, cell, result, call, until)
        if run.whole or not session.bare or not plotting.prelude_missing(result):
            return result
        # Sent without the prelude (for the interpreter's, or the service's resident one) to a
        # sandbox that had none: the code did not run. Sent again, whole.
        session.live = result.session_ended is False
        session.prelude_loaded = False
        return await self._evaluate(call, replace(run, whole=True), new=new)

    def _pending(self, run: Run, call: Call) -> PendingCell:
        limit = run.time_limit or self.connection.info.time_limit or self.settings.timeout
        keep = self.settings.max_output_chars
        return PendingCell.start(run.choices, run.uploads, limit, run.lowered, keep, call.started)

    async def read_cell(
        self, session: CodeSession, cell: PendingCell, result: EvalResult, call: Call, until: float
    ) -> EvalResult:
        """Read ``session``'s running ``cell`` on from ``result`` until it ends (its session
        then forgets it) or ``until``."""
        result = await self.reads.follow(
            result,
            cell,
            lambda wait, early: self.evaluations.read(session, wait, early),
            ctx=call.ctx,
            until=until,
            session_id=session.id,
        )
        if not result.running:
            session.cell = None
        return result

    async def follow_up(
        self,
        session_id: str,
        ctx: Context[Any, Any],
        *,
        wait: float,
        interrupt: bool,
        keep_output: bool = False,
    ) -> CallToolResult:
        """``get_output`` (read ``session_id``'s running cell for up to ``wait`` seconds) or,
        with ``interrupt``, ``interrupt`` (stop it, and read it to its end); ``keep_output``:
        what a running cell printed stays for its result (a task's poll).

        Raises:
            ToolError: no such session of this client, no cell to read, the service failed.
        """
        call = Call(ctx, log={"tool": "interrupt" if interrupt else "get_output"})
        self.active_calls += 1
        try:
            return await follow_up(
                self, call, session_id, wait=wait, interrupt=interrupt, keep_output=keep_output
            )
        except ServiceFailure as failure:
            call.outcome = failure.kind
            raise ToolError(failure.message) from failure
        except ToolError:
            raise
        except Exception as exc:  # a bug here, not the service's failure
            call.outcome = "gateway_error"
            logger.exception("%s failed in the gateway itself", call.log["tool"])
            raise ToolError(GATEWAY_FAILED) from exc
        finally:
            self._finish(call)

    def _finish(self, call: Call) -> None:
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
        """See :func:`~gateway.session_choices.call_choices`."""
        return await call_choices(
            self.connection, session, python=args.python, packages=args.packages, code=args.code
        )

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
