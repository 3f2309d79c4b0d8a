"""The tool: :class:`Gateway` owns the connection to the evaluation service and runs each call.

A call belongs to a code session (:mod:`gateway.code_sessions`: a new one, or the one it names),
whose files, with those it sends in (:mod:`gateway.uploads`), go into its run. It is admitted
(:mod:`gateway.admission`), sent as one ``POST /eval`` through :mod:`snekbox_client` (or run
by the built-in evaluator in this process, :mod:`gateway.inprocess`), and rendered
(:mod:`gateway.render`); the files it wrote stay with the session. Failures of the service
become tool errors worded by :mod:`gateway.failures`; a user's exception is a normal result.
Each call is counted (:mod:`gateway.metrics`) and logged in one JSON line.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
import time
from dataclasses import replace
from typing import Annotated, Any

import anyio
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, ImageContent
from pydantic import Field
from starlette.requests import Request

import evaluator
import plotting
from snekbox_client import (
    ConnectionLost,
    ContentWanted,
    EvalResult,
    EvaluatorRejected,
    EvaluatorTimeout,
    EvaluatorUnavailable,
    File,
    ReplicaGone,
    ServiceInfo,
    SnekboxClient,
    SnekboxError,
)

from .admission import Admission, Busy
from .backend import START_PROBE_TIMEOUT, Backend
from .budget import INLINE_FILE_BYTES
from .choices import MAX_PACKAGES, ChoiceRefused, Choices, Offer, choose, script_metadata
from .code_sessions import CodeSession, CodeSessions, SessionGone, SessionsBusy, held_bytes
from .environment import CORE, ENVIRONMENT_URI, Environment
from .failures import GATEWAY_FAILED, ServiceFailure, explain, failure_kind
from .handles import SessionHandles
from .inprocess import InProcessClient
from .metrics import Metrics
from .render import SessionView, render_result
from .schema import ExecutionResult
from .settings import Settings
from .status import inputs_written
from .text import duration
from .uploads import InputFile, UploadRefused, decode_files

__all__ = ["END_TOOL_NAME", "TOOL_NAME", "Gateway"]

TOOL_NAME = "execute_python_code"
END_TOOL_NAME = "end_session"

# The name operators filter the per-call log lines by (it was the single module's name).
logger = logging.getLogger("python_mcp_server")

#: How much of a figure beyond the budget an evaluation returns: a PNG's signature and size.
#: Every file's content comes back (within the budget): the session keeps what it wrote.
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
        self.sessions = CodeSessions(
            max_sessions=settings.max_code_sessions,
            per_client=settings.max_code_sessions_per_client,
            idle_timeout=settings.code_session_idle_timeout,
            registry=self.metrics.registry,
            named_clients=settings.authenticated,
            on_close=self._end_live_session,
            handles=SessionHandles(
                settings.session_secret.encode() if settings.session_secret else None
            ),
        )
        self._endings: set[asyncio.Task[None]] = set()
        # Interpreters (name, replica) of sessions closed to make room for a new session: the
        # next request to their replica ends them first (see _evaluate), else a DELETE does
        # once the call that closed them ends.
        self._evicted: list[tuple[str, str | None]] = []
        self._client: SnekboxClient | InProcessClient | None = None
        self._builtin: evaluator.Evaluator | None = None
        #: What the service offers, as it says (see :mod:`gateway.backend`).
        self.backend: Backend | None = None
        #: Set on shutdown: calls in flight finish, new ones are turned away.
        self.draining = False
        #: Tool calls between arrival and answer (admission counts only the evaluations).
        self.active_calls = 0
        # Set, and replaced, whenever a call ends: for drained(), and for calls waiting for a
        # session to end its call and make room (see _session).
        self._call_ended = asyncio.Event()

    async def __aenter__(self) -> Gateway:
        settings = self.settings
        if settings.snekbox_url:
            self._client = SnekboxClient(settings.snekbox_url, timeout=settings.timeout)
        else:
            # The gateway ends its sessions' interpreters itself (idle, evicted, ended): the
            # evaluator's own idle limit must not come first and leave a session without one.
            idle = max(
                settings.evaluator_config.session_idle_timeout,
                settings.code_session_idle_timeout + 60,
            )
            self._builtin = evaluator.Evaluator(
                settings.evaluator_config.model_copy(update={"session_idle_timeout": idle})
            )
            await self._builtin.start()
            # The gateway closes sessions first (and ends their interpreters): the evaluator
            # never drops one that the gateway still holds.
            limit = self._builtin.session_limit  # derived at start from what it enforces
            self.sessions.max_sessions = max(1, min(self.sessions.max_sessions, limit))
            self._client = InProcessClient(self._builtin, timeout=settings.timeout)
        self.backend = Backend(self._client, interval=settings.probe_interval)
        await self.backend.probe(START_PROBE_TIMEOUT)
        self.backend.start(self.tool_description)
        return self

    @property
    def service_info(self) -> ServiceInfo:
        """What the service offers beyond Snekbox's API (nothing until it says)."""
        return self.backend.info if self.backend is not None else ServiceInfo.none()

    @property
    def live_backend(self) -> bool:
        """Whether the service keeps a live interpreter per session."""
        return self.backend is not None and self.backend.live_sessions

    async def __aexit__(self, *exc_info: object) -> None:
        if self.backend is not None:
            await self.backend.aclose()
        if self._endings:
            await asyncio.gather(*self._endings, return_exceptions=True)
        if self._client is not None:
            await self._client.aclose()
        if self._builtin is not None:
            await self._builtin.aclose()

    @property
    def client(self) -> SnekboxClient | InProcessClient:
        if self._client is None:
            raise RuntimeError("the gateway is not started: use it as an async context manager")
        return self._client

    def tool_description(self) -> str:
        """The tool's description, written for the model that calls it: what the backend was
        found to offer (its Python, packages, sessions, limits), never more."""
        environment = self.backend.environment if self.backend is not None else None
        if self.settings.snekbox_url:
            limits = (
                "The evaluation service sets the limits on time, memory, processes and output; "
                "a run that exceeds the time or memory limit is killed (exit code 137)."
            )
        else:
            cfg = self.settings.evaluator_config
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
        settings = self.settings
        python = f"Python {environment.python}" if environment is not None else "Python 3"
        plots = environment is None or "matplotlib" in environment.packages
        figures = (
            "- Figures: every matplotlib figure comes back as a PNG image, in drawing order, with "
            "no extra step: plt.show() or simply leaving the figure open is enough. At most "
            f"{self.settings.max_image_side:,} pixels a side are returned.\n"
            if plots
            else ""
        )
        return (
            f"Run {python} code in an isolated sandbox and return what it prints.\n\n"
            f"{self._sessions_description()}\n"
            f"- `files`: at most {settings.max_upload_files} files, "
            f"{settings.max_upload_bytes:,} bytes in all, each with a relative path; `encoding` "
            "'base64' for bytes that are not text.\n"
            f"- `timeout_seconds`: this call's time limit, at most {settings.max_time_limit:g} "
            "s (more is lowered to that).\n"
            f"- {self._packages_description(environment)}\n"
            f"{self._installs_description()}"
            f"{self._pythons_description()}"
            "- The result is stdout and stderr together, in order (terminal control sequences "
            "removed), then a line [end of output] (numbered, [end of output #2], if the output "
            "holds that text), then the gateway's own lines: the exit status in words, figures "
            "not returned, files written. As in a notebook, when the last statement is an "
            "expression its value's repr follows the output (not for None, matplotlib objects or "
            "a line ending in ';'). There is no stdin: input() gets EOF. Output must be UTF-8: "
            "bytes that are not, written straight to a file descriptor, lose the whole output.\n"
            f"{figures}"
            "- Files the code writes in its working directory are listed with their sizes, "
            "their names in double quotes with JSON-style escapes; each can be read with "
            "resources/read at its files[].uri while the session lives, and small text files "
            f"(up to {INLINE_FILE_BYTES:,} bytes) also come inline, as embedded resources.\n"
            f"- {limits} Output longer than {self.settings.max_output_chars:,} characters is cut "
            "in the middle, keeping its start and end."
        )

    def environment_report(self) -> dict[str, Any]:
        """What :data:`ENVIRONMENT_URI` answers: the probe's findings and the sessions' kind."""
        backend = self.backend
        environment = backend.environment if backend is not None else None
        found: dict[str, Any] = (
            environment.to_json()
            if environment is not None
            else {"python": None, "packages": None, "unknown_because": self._unknown_why()}
        )
        info = self.service_info
        return {
            **found,
            "sessions": "live interpreters" if self.live_backend else "files only",
            "package_installs": (
                {"policy": info.packages, "allowed": list(info.allowed) or None}
                if info.packages in ("any", "allow-list")
                else {"policy": "none", "why": self._why_no_installs()}
            ),
            "pythons": [offer.version for offer in self.offers()] or None,
        }

    def _installs_description(self) -> str:
        info = self.service_info
        if info.packages not in ("any", "allow-list"):
            return (
                "- The sandbox has no network: pip install and downloads do not work, and no "
                f"package can be added ({self._why_no_installs()}).\n"
            )
        which = "any project" if info.packages == "any" else "only " + ", ".join(info.allowed)
        return (
            '- `packages`: PEP 508 requirements (e.g. ["tabulate==0.9.0"]) installed for the '
            f"call before its code runs, outside the sandbox, wheels only ({which}); the install "
            "time is not counted in the time limit, and a set used before is ready at once. A "
            "session keeps them for its later calls. A PEP 723 '# /// script' block in the code "
            "(dependencies, requires-python) is honoured the same way; arguments win over it. "
            "The sandbox itself has no network: pip install and downloads in the code fail.\n"
        )

    def _pythons_description(self) -> str:
        offers = self.offers()
        if len(offers) < 2:
            return ""
        versions = [f"{offers[0].version} (the default)", *(o.version for o in offers[1:])]
        return (
            f"- `python`: the Python version to run, one of {', '.join(versions)}; the "
            "preinstalled packages listed above are the default's.\n"
        )

    def _unknown_why(self) -> str:
        return self.backend.unknown_why if self.backend is not None else "not asked yet"

    def _packages_description(self, environment: Environment | None) -> str:
        if environment is None:
            return (
                f"Installed packages are not known ({self._unknown_why()}); the standard "
                "library is there."
            )
        notable = environment.notable()
        others = len(environment.packages) - len(notable)
        missing = [name for name in CORE if name not in environment.packages]
        text = f"Preinstalled: {', '.join([*notable, 'the standard library'])}"
        if others:
            plural = "s" if others != 1 else ""
            text += f", and {others} more package{plural} listed by the resource {ENVIRONMENT_URI}"
        if missing:
            text += f"; NOT installed: {', '.join(missing)}"
        return text + "."

    def _sessions_description(self) -> str:
        settings = self.settings
        idle = settings.code_session_idle_timeout
        if self.live_backend and self.service_info.session_idle_timeout is not None:
            idle = min(idle, self.service_info.session_idle_timeout)  # the interpreter's end
        ending = (
            f"A session ends after {duration(idle)} without a call, or when end_session ends it."
        )
        if self.live_backend:
            return (
                "- Sessions are like a notebook: a call without session_id starts a new session, "
                "and every result gives its session_id; pass it to later calls to run in the "
                "same interpreter, with the variables, imports and files of the calls before "
                "(files sent with `files` and files the code wrote). Each call's code runs like "
                "a notebook cell; sys.exit() ends the cell, not the session. A call past its "
                "time limit is interrupted (KeyboardInterrupt) and the session goes on; if the "
                "code does not stop, on a memory kill, or past the output limit, the interpreter "
                "ends: its variables are lost, its files kept (the result says so). " + ending
            )
        return (
            "- Sessions keep files, not variables. A call without session_id starts a new "
            "session, and every result gives its session_id: pass it to later calls to find the "
            "files sent with `files` and the files the code wrote (up to "
            f"{settings.max_session_bytes:,} bytes; names starting with '_' or '.' are not "
            "kept). Each call is a fresh interpreter: variables and imports do NOT carry over, "
            "so save what later calls need to a file (df.to_pickle('df.pkl'), json.dump). " + ending
        )

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
    ) -> Annotated[CallToolResult, ExecutionResult]:
        """Run ``code`` in a session; service failures become tool errors, user errors do not.

        Raises:
            ToolError: the code is too long, the files break a rule, the session is gone, the
                service failed, or the gateway itself did.
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
            client = _client(ctx)
            if client is not None and self.settings.authenticated:
                log["client"] = client
            try:
                uploads = decode_files(
                    files or [],
                    max_files=self.settings.max_upload_files,
                    max_bytes=self.settings.max_upload_bytes,
                )
                if session_id is None:  # refused for its arguments, a call opens no session
                    unopened = CodeSession("", _owner(), "", client)
                    self._check_room(unopened, uploads)
                    choices = await self._choices(code, python, packages, unopened)
                session = await self._session(session_id, client)
                self._check_room(session, uploads)
            except (UploadRefused, SessionGone, ChoiceRefused) as exc:
                outcome = "refused"
                raise ToolError(str(exc)) from exc
            except SessionsBusy as exc:
                outcome = "busy"
                raise ToolError(str(exc)) from exc
            log.update(session_id=session.id, files_sent=len(uploads))
            time_limit, lowered = self._time_limit(timeout_seconds)
            try:
                async with self.admission.turn(session.turns):
                    if not self.sessions.is_open(session):  # closed while this call waited
                        outcome = "refused"
                        raise ToolError(str(self.sessions.gone(session.id)))
                    try:  # in its turn: as the call before left the session
                        self._check_room(session, uploads)
                        if session_id is not None:  # a new one's were chosen before it opened
                            choices = await self._choices(code, python, packages, session)
                    except (UploadRefused, ChoiceRefused) as exc:
                        outcome = "refused"
                        raise ToolError(str(exc)) from exc
                    self.sessions.touch(session)
                    try:
                        result = await self._evaluate_with_progress(
                            code, ctx, started, session, uploads, time_limit, choices
                        )
                    except (ServiceFailure, asyncio.CancelledError):
                        if session_id is None:  # nobody learns its id: it would only wait to expire
                            self.sessions.discard(session)
                        raise
                    self._remember(session, choices, result)
                    view = self._keep_files(session, uploads, result)
                    self.sessions.touch(session)
                    log["session_id"] = session.id
                    if not self.sessions.is_open(session):  # evicted while it ran: end its new
                        self._end_live_session(session, None)  # interpreter, which nothing holds
            except Busy as exc:  # raised only before the turn came: nothing of it ran
                outcome = "busy"
                raise ToolError(
                    f"The session is running another call, and this one cannot wait for it "
                    f"({exc}); this code did not run. Call again once that call has answered."
                ) from exc
            view.time_limit_lowered = lowered
            rendered = render_result(
                result,
                duration=time.monotonic() - started,
                settings=self.settings,
                session=view,
                notes=choices.notes,
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
            while self._evicted:  # no request carried them (refused, or another replica)
                self._end_in_background(*self._evicted.pop())
            self.active_calls -= 1
            self._wake()
            duration = time.monotonic() - started
            self.metrics.calls.labels(outcome).inc()
            if "client" in log:
                self.metrics.calls_by_client.labels(log["client"], outcome).inc()
            self.metrics.duration.observe(duration)
            _log_call(ctx, outcome, duration, log)

    async def end_session(
        self,
        session_id: Annotated[str, Field(description="the session to end")],
    ) -> str:
        """End a session now: its files are dropped and its id answers that it was ended.

        Raises:
            ToolError: no such open session.
        """
        try:
            self.sessions.end(session_id, _owner(), adopt=self.live_backend)
        except SessionGone as exc:
            raise ToolError(f"{exc.fate}: there is nothing to end.") from exc
        self._wake()  # its room is free
        return f"The session {session_id!r} is ended; its files are gone."

    def _end_live_session(self, session: CodeSession, why: str | None) -> None:
        """A closed session's interpreter ends too, in the background: whoever closed it does
        not wait. Gateways sharing a secret leave idle and evicted ones to the evaluator's own
        idle timeout and cap: another gateway may be serving the session."""
        if self._client is None or not (session.live or self._builtin is not None):
            return
        if self.settings.session_secret and why in ("expired", "evicted"):
            return
        if why == "evicted":  # by a call starting a session, whose request will carry it
            self._evicted.append((session.name, session.replica))
            return
        self._end_in_background(session.name, session.replica)

    def _abandon_interpreter(self, session: CodeSession) -> None:
        """A call sent to ``session``'s interpreter ended without its answer (cancelled: its
        client went away; or timed out, or its connection cut): the evaluator ends such an
        interpreter, and is told to here as well (one it already ended is no error), so that
        the next call starts a new one with the session's files rather than finding it gone,
        and its result says why."""
        self._end_in_background(session.name, session.replica)
        session.live = session.prelude_loaded = False
        session.abandoned = True

    def _end_in_background(self, name: str, replica: str | None) -> None:
        """End a session's interpreter without waiting; the next evaluation waits for it."""
        task = asyncio.ensure_future(self._end_in_evaluator(name, replica))
        self._endings.add(task)
        task.add_done_callback(self._endings.discard)

    async def _end_in_evaluator(self, name: str, replica: str | None) -> None:
        try:
            await self.client.end_session(name, replica=replica)
        except SnekboxError as exc:  # it ends by itself once idle
            logger.warning("could not end the evaluator's session: %s", exc)

    def read_session_file(self, session_id: str, path: str) -> bytes:
        """A file of an open session of this client (``resources/read``).

        Raises:
            SessionGone: no such open session.
            KeyError: the session has no such file.
        """
        session = self.sessions.get(session_id, _owner())
        return session.files[path]

    def offers(self) -> tuple[Offer, ...]:
        """The Pythons a call may choose, the default first (empty: one, not named): the
        service's, or for Snekbox the operator's table (``MCP_SNEKBOX_PYTHONS``)."""
        table = self.settings.snekbox_pythons or {}
        environment = self.backend.environment if self.backend is not None else None
        if self.settings.snekbox_url and table:
            default = [Offer(environment.python, None)] if environment is not None else []
            return (*default, *(Offer(v, p) for v, p in table.items()))
        pythons = self.service_info.pythons
        if not pythons:
            return ()
        return (
            Offer(pythons[0].version, None),
            *(Offer(p.version, p.executable_path) for p in pythons[1:]),
        )

    def _why_no_installs(self) -> str:
        policy = self.service_info.packages
        if policy == "off":
            return self.service_info.packages_why or "the operator turned package installs off"
        if policy is None:
            return "the evaluation service installs none; its operator adds packages to its image"
        return ""

    async def _choices(
        self, code: str, python: str | None, packages: list[str] | None, session: CodeSession
    ) -> Choices:
        """The Python and packages of this call (see :mod:`gateway.choices`); in a live
        session, its interpreter's Python, and every package its calls asked for (the session
        takes them on once the call ran: see :meth:`_remember`).

        Raises:
            ChoiceRefused: they cannot be had here, or the session runs another Python.
        """
        offers = self.offers()
        current = next((o for o in offers if o.executable_path == session.python), None)
        kept = session.calls > 0  # a session keeps the Python its first call ran
        choices = choose(
            python=python,
            packages=packages,
            script=await script_metadata(code),  # in a worker thread when there is a block
            offers=offers,
            # Turned off, the evaluator refuses them itself: a result, as any other refusal.
            installs=self.service_info.packages in ("any", "allow-list", "off"),
            why_no_installs=self._why_no_installs(),
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

    def _install_time(self, choices: Choices) -> float:
        """Seconds a call may wait beyond the usual for what it runs with to be installed: its
        packages, and the preinstalled set of a Python other than the default (each resolved,
        then installed, within the service's package timeout)."""
        other = choices.python is not None and choices.python.executable_path is not None
        timeout = self.service_info.install_timeout
        if timeout is None or not (choices.packages or other):
            return 0.0
        return 2 * timeout * (int(bool(choices.packages)) + int(other))

    @staticmethod
    def _remember(session: CodeSession, choices: Choices, result: EvalResult) -> None:
        """The session's Python and packages, once a call ran with them (a refused package is
        not asked for again)."""
        if result.ended_by == "packages_refused":
            return
        session.python = choices.python.executable_path if choices.python else None
        session.packages = choices.packages

    async def _session(self, session_id: str | None, client: str | None) -> CodeSession:
        """The call's session: the one it names, or a new one. At the cap, with every session
        running a call, the call waits as for an evaluation slot (among ``max_waiting``, at
        most ``max_wait`` seconds) for a call to end, whose session then makes room.

        Raises:
            SessionGone: the one it names is not open.
            SessionsBusy: no session ended its call within the wait, or the queue is full.
        """
        owner = _owner()

        def attempt() -> CodeSession:
            if session_id is not None:
                return self.sessions.get(session_id, owner, adopt=self.live_backend, client=client)
            return self.sessions.create(owner, client)

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

    async def _choose_replica(self) -> str | None:
        """Where a new live interpreter is to start, among several replicas (else ``None``)."""
        if not self.live_backend:
            return None
        try:
            return await self.client.choose_replica()
        except SnekboxError as exc:
            raise ServiceFailure(failure_kind(exc), explain(exc)) from exc

    def _check_room(self, session: CodeSession, uploads: dict[str, bytes]) -> None:
        """Refuse files that would make the session hold more than it may.

        Raises:
            UploadRefused: they would.
        """
        limit = self.settings.max_session_bytes
        replaced = sum(map(session.held, uploads))
        added = sum(held_bytes(path, len(content)) for path, content in uploads.items())
        after = session.size - replaced + added
        if uploads and after > limit:
            raise UploadRefused(
                f"With these files the session would hold {after:,} bytes of files (their names "
                f"included); it may hold {limit:,}. Send smaller files, or start a new session."
            )

    def _time_limit(self, asked: float | None) -> tuple[float | None, float | None]:
        """The call's time limit (``None``: the service's own) and, if lowered, what was asked."""
        maximum = self.settings.max_time_limit
        if asked is None:
            return None, None
        if asked > maximum:
            return maximum, asked
        return asked, None

    def _keep_files(
        self, session: CodeSession, uploads: dict[str, bytes], result: EvalResult
    ) -> SessionView:
        """Keep what the run wrote in the session, within its bytes; say what was kept."""
        if result.ended_by != "packages_refused":  # it did not run: no call of the session
            session.calls += 1
        resumed, session.live = session.live, result.session_ended is False
        # A call that was interrupted or killed in a new interpreter may have stopped before
        # the prelude was kept there.
        session.prelude_loaded = session.live and (
            (resumed and session.prelude_loaded) or result.ended_by == "exit"
        )
        if inputs_written(result.returncode, result.stdout, result.ended_by):
            for path, content in uploads.items():
                session.keep(path, content)
        returned = plotting.sort_files(result.files)
        if returned.manifest is not None:  # the code's word, about its own session's files
            for path in returned.manifest.gone:
                session.files.pop(path, None)
        kept: dict[str, bool] = {}
        size = session.size  # kept up to date here: summing every file for each would cost n x m
        for file in returned.others:
            after = size - session.held(file.path) + held_bytes(file.path, file.size)
            if file.complete and after <= self.settings.max_session_bytes:
                size += session.keep(file.path, file.content)
                kept[file.path] = True
            else:  # an older content is not this file any more
                size -= session.held(file.path)
                session.files.pop(file.path, None)
                kept[file.path] = False
        abandoned, session.abandoned = session.abandoned, False
        return SessionView(
            session.id,
            kept,
            self.settings.max_session_bytes,
            interpreter_ended=bool(result.session_ended),
            after_abandoned_call=abandoned,
        )

    def _wake(self) -> None:
        """Tell drained() and the calls waiting for room that a call ended."""
        self._call_ended.set()
        self._call_ended = asyncio.Event()

    async def drained(self) -> None:
        """Return once no tool call is in progress (set ``draining`` first, or it may never)."""
        while self.active_calls:
            await self._call_ended.wait()

    async def _evaluate_with_progress(
        self,
        code: str,
        ctx: Context[Any, Any],
        started: float,
        session: CodeSession,
        uploads: dict[str, bytes],
        time_limit: float | None,
        choices: Choices,
    ) -> EvalResult:
        # Most calls end before the first report is due, so a timer starts the reports rather
        # than a task per call (and a plain task rather than a task group, so the evaluation's
        # errors come back unwrapped).
        loop = asyncio.get_running_loop()
        reports: list[asyncio.Task[None]] = []
        timer = loop.call_later(
            self.settings.progress_interval,
            lambda: reports.append(loop.create_task(self._report_progress(ctx, started))),
        )
        try:
            return await self._evaluate(code, session, uploads, time_limit, choices)
        finally:
            timer.cancel()
            for task in reports:
                task.cancel()

    async def _evaluate(
        self,
        code: str,
        session: CodeSession,
        uploads: dict[str, bytes],
        time_limit: float | None,
        choices: Choices,
    ) -> EvalResult:
        if self.draining:
            raise ServiceFailure(
                "shutting_down",
                "The gateway is shutting down; the code did not run. Retry in a few seconds.",
            )
        running = 0
        # Interpreters being ended go first: an abandoned one before its session starts another,
        # a closed one (ended, expired) before this call may need its room.
        if self._endings:
            await asyncio.gather(*self._endings, return_exceptions=True)
        try:
            async with self.admission.slot():
                running = self.admission.in_flight
                wanted = ContentWanted(
                    ("*",),
                    self.settings.max_image_bytes
                    + plotting.MANIFEST_MAX_BYTES
                    + self.settings.max_session_bytes,
                    _PNG_HEAD_BYTES,
                )
                # A live interpreter's sandbox holds the session's files already.
                carried = {**({} if session.live else session.files), **uploads}
                live = self.live_backend
                if live and session.replica is None:
                    # Chosen now that the call is admitted, when the replicas' calls in flight
                    # are those being run (a new session's, or after its replica went away).
                    replica = await self._choose_replica()
                    if replica is not None and not (session.calls or session.adopted):
                        self.sessions.place(session, replica)  # its handle names the replica
                    session.replica = replica
                later = live and session.live and session.prelude_loaded
                ending = self._take_evicted(session.replica) if live else ()
                sent = tuple(File(p, c) for p, c in carried.items())
                request = plotting.build_request(code, later_cell=later)
                request = replace(
                    request,
                    files=(*request.files, *sent),
                    content_wanted=wanted,
                    time_limit=time_limit if self._limits_time else None,
                    session=session.name if live else None,
                    session_resume=live and session.live,
                    end_sessions=ending,
                    session_owner=_owner_name(session.client) if live else None,
                    executable_path=choices.python.executable_path if choices.python else None,
                    packages=choices.packages,
                )
                if time_limit is None or self._limits_time:
                    extra_time = self._install_time(choices)
                    try:
                        result = await self.client.eval(
                            request, replica=session.replica, extra_time=extra_time
                        )
                        if later and plotting.prelude_missing(result):
                            # The interpreter has no prelude of this gateway's (the code
                            # removed it, another gateway's runs there): the code did not run.
                            whole = plotting.build_request(code)
                            request = replace(request, files=(*whole.files, *sent))
                            result = await self.client.eval(
                                request, replica=session.replica, extra_time=extra_time
                            )
                    except BaseException as exc:
                        # Whether the service ended them is unknown: the call's end does.
                        self._evicted += ((name, session.replica) for name in ending)
                        if live and isinstance(exc, asyncio.CancelledError):
                            self._abandon_interpreter(session)
                        raise
                    return result
                # Snekbox applies its own limit: a shorter one is how long the gateway waits.
                try:
                    with anyio.fail_after(time_limit):
                        return await self.client.eval(request)
                except TimeoutError:
                    raise ServiceFailure(
                        "timeout",
                        f"No answer within the call's time limit ({time_limit:g} s): the "
                        "evaluation service applies its own, longer limit, and its output is "
                        "lost. Ask for more time, or make the code faster.",
                    ) from None
        except Busy as exc:
            raise ServiceFailure(
                "busy",
                f"The gateway is busy ({exc}); the code did not run. Retry in a few seconds.",
            ) from exc
        except SnekboxError as exc:
            lost = _interpreter_lost(exc, session) if session.live else None
            if self.live_backend and isinstance(exc, EvaluatorTimeout | ConnectionLost):
                self._abandon_interpreter(session)  # the evaluator stops a cell left so
            elif lost is not None:
                self.metrics.interpreters_lost.labels(
                    "memory" if "out of memory" in lost else "gone"
                ).inc()
                session.live = session.prelude_loaded = False
                if isinstance(exc, ReplicaGone):
                    session.replica = None  # the next call starts one elsewhere
                raise ServiceFailure("session_lost", lost) from exc
            kind = failure_kind(exc)
            self.metrics.evaluator_errors.labels(kind).inc()
            message = explain(exc, running=running, workers=self.settings.backend_workers)
            raise ServiceFailure(kind, message) from exc

    def _take_evicted(self, replica: str | None) -> tuple[str, ...]:
        """The interpreters of closed sessions on ``replica`` that a request there is to end
        before its own run (``end_sessions``): no round trip of their own, and the service,
        at its cap, ends those rather than another to make room for the new session."""
        taken = tuple(name for name, where in self._evicted if where == replica)
        self._evicted = [(name, where) for name, where in self._evicted if where != replica]
        return taken

    async def _report_progress(self, ctx: Context[Any, Any], started: float) -> None:
        """Tell a client that asked for progress that the call is alive (a no-op otherwise)."""
        if self._builtin is not None:
            total: float | None = self.settings.evaluator_config.time_limit
        else:
            total = None
        while True:
            elapsed = round(time.monotonic() - started, 1)
            await ctx.report_progress(elapsed, total, f"running for {elapsed:g} s")
            await anyio.sleep(self.settings.progress_interval)

    @property
    def _limits_time(self) -> bool:
        """Whether the service honours a call's own time limit (the built-in evaluator, which
        says its own limit in ``GET /info``; Snekbox applies its fixed one)."""
        return self.service_info.time_limit is not None

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
        """``None`` when the evaluation service answers, else why not (safe to show anyone).

        Draining, the gateway is not ready: a load balancer stops sending it calls it would
        refuse."""
        if self.draining:
            return "the gateway is shutting down"
        try:
            await self.client.ping()
        except EvaluatorUnavailable:
            return "the evaluation service is unreachable"
        except SnekboxError as exc:
            return f"the evaluation service is unhealthy ({type(exc).__name__})"
        return None


#: How the built-in evaluator's 404 says that its memory watchdog ended a session (the number
#: alone is taken from the service's text).
_MEMORY_SHORT = re.compile(r"running out of memory \(its processes held (\d{1,9}) MiB")


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


def _owner() -> str | None:
    """Who the call comes from: its bearer token's client, ``None`` without authentication."""
    token = get_access_token()
    if token is None:
        return None
    return hashlib.sha256(f"{token.client_id}\0{token.token}".encode()).hexdigest()


def _client(ctx: Context[Any, Any]) -> str | None:
    """Whose share of the sessions a call takes: its token's client (a name), or without
    authentication its MCP connection (the transport session's id); ``None`` for a
    sessionless client, which cannot be told from another."""
    token = get_access_token()
    if token is not None:
        return token.client_id
    request = ctx.request_context.request if ctx.request_context else None
    if isinstance(request, Request):
        connection = request.headers.get("mcp-session-id") or request.query_params.get("session_id")
        return f"connection {connection}" if connection else None
    return None


def _owner_name(client: str | None) -> str | None:
    """``client`` as the evaluator's ``session_owner``: a digest, which names no one."""
    if client is None:
        return None
    return hashlib.sha256(client.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def _log_call(
    ctx: Context[Any, Any], outcome: str, duration: float, fields: dict[str, Any]
) -> None:
    """One structured line per call; the code and output only when MCP_LOG_CODE asks.

    ``session`` is the SSE or Streamable HTTP session id; sessionless clients (the 2026-07-28
    protocol) have none, and their calls are told apart by ``request``.
    """
    if not logger.isEnabledFor(logging.INFO):
        return
    request = ctx.request_context.request if ctx.request_context else None
    transport, session = "memory", None
    if isinstance(request, Request):
        transport = "sse" if request.scope["path"].startswith("/messages") else "streamable-http"
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
