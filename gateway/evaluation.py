"""One call's evaluation: admitted to a slot, sent as one ``POST /eval``, its failures worded.

The request carries the session's files (unless its live interpreter holds them), the call's
uploads, its Python and packages, and the interpreters of closed sessions the service is to
end first. A failure of the service becomes a :class:`~gateway.failures.ServiceFailure`; an
interpreter found gone says so, and the session goes on without it.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import time
from dataclasses import dataclass, replace
from typing import Any

import anyio
from mcp.server.mcpserver import Context

import plotting
from snekbox_client import (
    ConnectionLost,
    ContentWanted,
    EvalRequest,
    EvalResult,
    EvaluatorRejected,
    EvaluatorTimeout,
    File,
    ReplicaGone,
    SnekboxError,
)

from .admission import Admission, Busy
from .cells import how_to_go_on
from .choices import Choices
from .code_sessions import CodeSession, CodeSessions
from .connection import Connection
from .failures import ServiceFailure, explain, failure_kind
from .metrics import Metrics
from .settings import Settings

__all__ = ["Evaluations", "Run"]

#: How much of a figure beyond the budget an evaluation returns: a PNG's signature and size.
#: Every file's content comes back (within the budget): the session keeps what it wrote.
_PNG_HEAD_BYTES = 24

#: How the built-in evaluator's 404 says that its memory watchdog ended a session (the number
#: alone is taken from the service's text).
_MEMORY_SHORT = re.compile(r"running out of memory \(its processes held (\d{1,9}) MiB")


#: What a read or an interrupt is told when the evaluator holds no cell of the session.
_NO_CELL = (
    "The session has no running cell, and no result left unread: its last cell's result was "
    "read already (or it ended with its interpreter). Run code with execute_python_code."
)


@dataclass(frozen=True)
class Run:
    """What one call runs: its code in its session, with its uploads, time limit (``None``:
    the service's own) and choices."""

    code: str
    session: CodeSession
    uploads: dict[str, bytes]
    time_limit: float | None
    choices: Choices
    #: Seconds the service waits for the cell before it answers ``running`` (``None``: the
    #: service runs it to its end before answering: see :mod:`gateway.cells`).
    wait: float | None = None
    #: How long the call waits for the cell before it answers ``running`` (``None``: its end).
    wait_seconds: float | None = None
    #: The ``timeout_seconds`` asked, when it was lowered to the maximum.
    lowered: float | None = None
    #: Sent again with the prelude, whole: it went without, to a sandbox that had none (the
    #: code removed it, another gateway's runs there, the service keeps none of this gateway's).
    whole: bool = False


class Evaluations:
    """Sends each call's run to the service (see the module's docstring)."""

    def __init__(
        self,
        settings: Settings,
        connection: Connection,
        sessions: CodeSessions,
        admission: Admission,
        metrics: Metrics,
    ) -> None:
        self.settings = settings
        self.connection = connection
        self.sessions = sessions
        self.admission = admission
        self.metrics = metrics

    async def evaluate(self, run: Run, ctx: Context[Any, Any], started: float) -> EvalResult:
        """Evaluate ``run``, telling a client that asked for progress that the call is alive.

        Raises:
            ServiceFailure: the gateway is busy, or the service failed (the message says
                whether the code ran).
        """
        # Most calls end before the first report is due, so a timer starts the reports rather
        # than a task per call (and a plain task rather than a task group, so the evaluation's
        # errors come back unwrapped).
        if run.wait is not None:  # the cell's reads report its progress (gateway.cells)
            return await self._evaluate(run)
        loop = asyncio.get_running_loop()
        reports: list[asyncio.Task[None]] = []
        timer = loop.call_later(
            self.settings.progress_interval,
            lambda: reports.append(loop.create_task(self._report_progress(ctx, started))),
        )
        try:
            return await self._evaluate(run)
        finally:
            timer.cancel()
            for task in reports:
                task.cancel()

    async def _evaluate(self, run: Run) -> EvalResult:
        """Evaluate ``run`` once admitted (see :meth:`evaluate`)."""
        running = 0
        # Interpreters being ended go first: an abandoned one before its session starts another,
        # a closed one (ended, expired) before this call may need its room.
        await self.connection.settle()
        try:
            async with self.admission.slot(run.session.client):
                running = self.admission.in_flight
                if run.whole:  # whether the service keeps it (it may have been that one)
                    await self.check_resident(run.session.replica)
                request = await self._request(run)
                if run.time_limit is None or self.connection.limits_time:
                    return await self._send(run, request)
                return await self._send_within(run, request, run.time_limit)
        except Busy as exc:
            raise ServiceFailure(
                "busy",
                f"The gateway is busy ({exc}); the code did not run. Retry in a few seconds.",
            ) from exc
        except SnekboxError as exc:
            raise self._failure(exc, run.session, running) from exc

    async def _request(self, run: Run) -> EvalRequest:
        """The request of ``run``: the prelude and code, the files, the session's choices."""
        session, choices = run.session, run.choices
        live = self.connection.live_sessions
        if live and session.replica is None:
            # Chosen now that the call is admitted, when the replicas' calls in flight are
            # those being run (a new session's, or after its replica went away).
            replica = await self.connection.choose_replica()
            if replica is not None and not (session.calls or session.adopted):
                self.sessions.place(session, replica)  # its handle names the replica
            session.replica = replica
        executable_path = choices.python.executable_path if choices.python else None
        request = plotting.build_request(
            run.code,
            later_cell=self._later_cell(session) and not run.whole,
            # Kept compiled for its default interpreter by the built-in evaluator (for each by
            # the Snekbox image, whose runs answer at their end: each can be sent again at once).
            resident=executable_path is None
            and not run.whole
            and self.connection.sends_resident(resent=run.wait is None),
        )
        session.bare = not plotting.carries_prelude(request)
        return replace(
            request,
            files=(*request.files, *self._files(run)),
            content_wanted=ContentWanted(
                ("*",),
                self.settings.max_image_bytes
                + plotting.MANIFEST_MAX_BYTES
                + self.settings.max_session_bytes,
                _PNG_HEAD_BYTES,
            ),
            time_limit=run.time_limit if self.connection.limits_time else None,
            session=session.name if live else None,
            session_resume=live and session.live,
            end_sessions=self.connection.take_evicted(session.replica) if live else (),
            session_owner=owner_name(session.client) if live else None,
            executable_path=executable_path,
            packages=choices.packages,
            wait=run.wait,
        )

    def _later_cell(self, session: CodeSession) -> bool:
        """Whether the session's interpreter has run the prelude already."""
        return self.connection.live_sessions and session.live and session.prelude_loaded

    def _files(self, run: Run) -> tuple[File, ...]:
        """The files sent: the session's (a live interpreter's sandbox holds them already) and
        the call's uploads."""
        carried = {**({} if run.session.live else run.session.files), **run.uploads}
        return tuple(File(p, c) for p, c in carried.items())

    async def _send(self, run: Run, request: EvalRequest) -> EvalResult:
        """Send ``request`` to a service that honours the call's time limit (or for a call
        without one)."""
        session = run.session
        try:
            return await self._eval(run, request)
        except BaseException as exc:
            # Whether the service ended them is unknown: the call's end does.
            self.connection.evicted_again(request.end_sessions, session.replica)
            # A cell read as it runs goes on without its caller: it is read later.
            left = isinstance(exc, asyncio.CancelledError) and request.wait is None
            if self.connection.live_sessions and left:
                self.connection.abandon(session)
            raise

    async def _send_within(self, run: Run, request: EvalRequest, time_limit: float) -> EvalResult:
        """Send ``request`` to Snekbox, which applies its own limit: a shorter one is how long
        the gateway waits.

        Raises:
            ServiceFailure: no answer within ``time_limit``.
        """
        try:
            with anyio.fail_after(time_limit):
                return await self._eval(run, request)
        except TimeoutError:
            raise ServiceFailure(
                "timeout",
                f"No answer within the call's time limit ({time_limit:g} s): the "
                "evaluation service applies its own, longer limit, and its output is "
                "lost. Ask for more time, or make the code faster.",
            ) from None

    async def _eval(self, run: Run, request: EvalRequest) -> EvalResult:
        """``POST /eval`` of ``request`` (one sent without the prelude to a sandbox that has
        none is sent again whole by the call: see ``Run.whole``)."""
        replica, extra_time = run.session.replica, self._install_time(run.choices)
        return await self.connection.service.eval(request, replica=replica, extra_time=extra_time)

    async def check_resident(self, replica: str | None) -> None:
        """Whether the service keeps the prelude resident (while runs are sent without it),
        asked by a run of no code: a run's answer alone may be the code's own, which would make
        runs carry it for nothing."""
        if not self.connection.resident.usable(resent=True):
            return
        probe = plotting.build_request("", resident=True)
        try:
            answer = await self.connection.service.eval(probe, replica=replica)
        except SnekboxError:
            return  # not known: the next run's answer tells
        if plotting.prelude_missing(answer):
            self.connection.resident.missing()

    def _failure(self, exc: SnekboxError, session: CodeSession, running: int) -> ServiceFailure:
        """The tool error for the service's failure ``exc`` (``running``: evaluations in flight
        when it was sent); a live interpreter lost or abandoned is forgotten."""
        lost = _interpreter_lost(exc, session) if session.live else None
        if self.connection.live_sessions and isinstance(exc, EvaluatorTimeout | ConnectionLost):
            self.connection.abandon(session)  # the evaluator stops a cell left so
        elif lost is not None:
            self.metrics.interpreters_lost.labels(
                "memory" if "out of memory" in lost else "gone"
            ).inc()
            session.live = session.prelude_loaded = False
            if isinstance(exc, ReplicaGone):
                session.replica = None  # the next call starts one elsewhere
            return ServiceFailure("session_lost", lost)
        if isinstance(exc, EvaluatorRejected) and exc.status_code == 409:
            return ServiceFailure(  # started through another gateway, or a moment ago
                "busy",
                "A cell is still running in this session (or ended and its result was not read "
                f"yet); this code did not run. {how_to_go_on(session.id)}",
            )
        kind = failure_kind(exc)
        self.metrics.evaluator_errors.labels(kind).inc()
        message = explain(exc, running=running, workers=self.settings.backend_workers)
        return ServiceFailure(kind, message)

    async def read(self, session: CodeSession, wait: float, early: bool) -> EvalResult:
        """Read ``session``'s running cell once (see :mod:`gateway.cells`).

        Raises:
            ServiceFailure: the service failed, or holds no such cell (the message says so).
        """
        try:
            return await self.connection.service.read_output(
                session.name, wait=wait, early=early, replica=session.replica
            )
        except SnekboxError as exc:
            raise self._cell_failure(exc, session) from exc

    async def interrupt(self, session: CodeSession) -> None:
        """Interrupt ``session``'s running cell.

        Raises:
            ServiceFailure: as :meth:`read`.
        """
        try:
            await self.connection.service.interrupt(session.name, replica=session.replica)
        except SnekboxError as exc:
            raise self._cell_failure(exc, session) from exc

    def _cell_failure(self, exc: SnekboxError, session: CodeSession) -> ServiceFailure:
        """The tool error for a failed read or interrupt: the cell is unknown to the service
        (409), its interpreter is gone (404), or the service failed and the cell goes on."""
        if isinstance(exc, EvaluatorRejected) and exc.status_code == 409:
            return ServiceFailure("refused", _NO_CELL)
        if isinstance(exc, EvaluatorTimeout | ConnectionLost):
            kind = failure_kind(exc)
            self.metrics.evaluator_errors.labels(kind).inc()
            return ServiceFailure(
                kind,
                f"{explain(exc)} The cell goes on in its session: call get_output again.",
            )
        return self._failure(exc, session, 1)

    def _install_time(self, choices: Choices) -> float:
        """Seconds a call may wait beyond the usual for what it runs with to be installed: its
        packages, and the preinstalled set of a Python other than the default (each resolved,
        then installed, within the service's package timeout)."""
        other = choices.python is not None and choices.python.executable_path is not None
        timeout = self.connection.info.install_timeout
        if timeout is None or not (choices.packages or other):
            return 0.0
        return 2 * timeout * (int(bool(choices.packages)) + int(other))

    async def _report_progress(self, ctx: Context[Any, Any], started: float) -> None:
        """Tell a client that asked for progress that the call is alive (a no-op otherwise)."""
        if self.connection.local is not None:
            total: float | None = self.settings.evaluator_config.time_limit
        else:
            total = None
        while True:
            elapsed = round(time.monotonic() - started, 1)
            await ctx.report_progress(elapsed, total, f"running for {elapsed:g} s")
            await anyio.sleep(self.settings.progress_interval)


def owner_name(client: str | None) -> str | None:
    """``client`` as the evaluator's ``session_owner``: a digest, which names no one."""
    if client is None:
        return None
    return hashlib.sha256(client.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def _interpreter_lost(exc: SnekboxError, session: CodeSession) -> str | None:
    """The tool error for a call that resumed a live interpreter now gone, or ``None`` if
    ``exc`` is another failure: the evaluator no longer holds it (404), or the replica that
    did cannot be reached."""
    if isinstance(exc, EvaluatorRejected) and exc.status_code == 404:
        memory = _MEMORY_SHORT.search(exc.description or "")
        if memory is not None:
            why = (
                "the evaluation service ended it because the host was running out of memory "
                f"(its processes held {memory[1]} MiB, the most of any session)"
            )
        else:
            why = (
                "the evaluation service no longer holds it (it restarted, or ended the session "
                "after its idle time or to make room for others)"
            )
    elif isinstance(exc, ReplicaGone):
        why = f"the evaluation service's replica that held it is gone ({exc.reason})"
    else:  # unreachable for now, say: the interpreter may well be there still
        return None
    lost = (
        f"The session's interpreter is gone: {why}. Its variables and imports are lost, and "
        "this code did not run. "
    )
    if session.adopted and not session.files:
        return lost + (
            "The session goes on, but another gateway started it and this one holds none of "
            "its files: call again with the same session_id to run in a new, empty interpreter."
        )
    return lost + (
        "The session goes on with its files: call again with the same session_id to run in a "
        "new interpreter that has them (define the variables again first)."
    )
