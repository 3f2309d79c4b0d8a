"""The connection to the evaluation service: what the gateway calls on it, and what it knows.

The gateway is handed its service (:class:`EvaluationService`) rather than building it: the
HTTP client :class:`~snekbox_client.SnekboxClient` in front of Snekbox or a remote evaluator,
the built-in evaluator in this process (:class:`evaluator.inprocess.InProcessClient`, a
:class:`LocalService`), or a test's fake. :func:`evaluation_service` builds the real one the
settings name; it is the only place the gateway names the evaluator.

:class:`Connection` starts a local service, asks what the service offers (:mod:`gateway.backend`)
and keeps asking, says whether it is ready, and ends the interpreters of closed sessions in the
background.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

import plotting
from evaluator import Evaluator, InProcessClient
from snekbox_client import (
    EvalRequest,
    EvalResult,
    EvaluatorUnavailable,
    ServiceInfo,
    SnekboxClient,
    SnekboxError,
)

from .backend import START_PROBE_TIMEOUT, Backend
from .choices import Offer
from .code_sessions import CodeSession, Ending
from .failures import ServiceFailure, explain, failure_kind
from .resident import ResidentPrelude
from .settings import Settings

__all__ = [
    "Connection",
    "EnforcedLimit",
    "EvaluationService",
    "LocalService",
    "evaluation_service",
]

logger = logging.getLogger("python_mcp_server")


class EvaluationService(Protocol):
    """What the gateway calls on its evaluation service (Snekbox's ``/eval`` and the built-in
    evaluator's additions); the errors are :mod:`snekbox_client`'s."""

    async def eval(
        self, request: EvalRequest, *, replica: str | None = None, extra_time: float = 0.0
    ) -> EvalResult: ...

    async def end_session(self, session: str, *, replica: str | None = None) -> None: ...

    async def read_output(
        self, session: str, *, wait: float, early: bool = False, replica: str | None = None
    ) -> EvalResult: ...

    async def interrupt(self, session: str, *, replica: str | None = None) -> None: ...

    async def choose_replica(self) -> str | None: ...

    async def info(self) -> ServiceInfo: ...

    async def ping(self) -> None: ...

    async def aclose(self) -> None: ...


class EnforcedLimit(Protocol):
    """One limit of a local evaluator, and whether and how this host enforces it."""

    @property
    def name(self) -> str: ...

    @property
    def enforced(self) -> bool: ...

    @property
    def how(self) -> str: ...

    @property
    def value(self) -> int | None: ...


@runtime_checkable
class LocalService(EvaluationService, Protocol):
    """An evaluator in this process: the gateway starts it, and it says what this host
    enforces of its limits and how many live sessions it holds."""

    async def start(self) -> None: ...

    def limits_in_force(self) -> Sequence[EnforcedLimit]: ...

    @property
    def session_limit(self) -> int: ...


def evaluation_service(settings: Settings) -> EvaluationService:
    """The service ``settings`` name, not started: the HTTP client for ``snekbox_url``, else the
    built-in evaluator in this process (started and stopped by its :class:`Connection`)."""
    if settings.snekbox_url:
        return SnekboxClient(settings.snekbox_url, timeout=settings.timeout)
    # The gateway ends its sessions' interpreters itself (idle, evicted, ended): the
    # evaluator's own idle limit must not come first and leave a session without one.
    config = settings.evaluator_config
    idle = max(config.session_idle_timeout, settings.code_session_idle_timeout + 60)
    builtin = Evaluator(config.model_copy(update={"session_idle_timeout": idle}))
    return InProcessClient(builtin, timeout=settings.timeout, owned=True)


class Connection:
    """The gateway's side of its service (see the module's docstring)."""

    def __init__(self, settings: Settings, service: EvaluationService) -> None:
        self.settings = settings
        self.service = service
        #: The service when it runs in this process (it can say more), else ``None``.
        self.local = service if isinstance(service, LocalService) else None
        #: What the service offers, as it says; ``None`` until started.
        self.backend: Backend | None = None
        self._endings: set[asyncio.Task[None]] = set()
        # Interpreters (name, replica) of sessions closed to make room for a new session: the
        # next request to their replica ends them first (see take_evicted), else a DELETE
        # does once the call that closed them ends (end_evicted).
        self._evicted: list[tuple[str, str | None]] = []
        #: Whether the service keeps the prelude resident, as runs found.
        self.resident = ResidentPrelude()

    async def start(self, describe: Callable[[], str]) -> None:
        """Start a local service, ask what the service offers, and keep asking in the
        background (``describe``: the description those answers shape).

        Raises:
            SandboxUnavailable: a local evaluator cannot isolate code here.
        """
        # The prelude is compiled now (tens of milliseconds), not by the first call.
        plotting.prelude_digest()
        if self.local is not None:
            await self.local.start()
        self.backend = Backend(self.service, interval=self.settings.probe_interval)
        await self.backend.probe(START_PROBE_TIMEOUT)
        self.backend.start(describe)

    async def aclose(self) -> None:
        """Stop asking, let the interpreters being ended end, and close the service."""
        if self.backend is not None:
            await self.backend.aclose()
        await self.settle()
        await self.service.aclose()

    @property
    def info(self) -> ServiceInfo:
        """What the service offers beyond Snekbox's API (nothing until it says)."""
        return self.backend.info if self.backend is not None else ServiceInfo.none()

    @property
    def live_sessions(self) -> bool:
        """Whether the service keeps a live interpreter per session."""
        return self.backend is not None and self.backend.live_sessions

    def sends_resident(self, *, resent: bool) -> bool:
        """Whether a run with the default interpreter goes without the prelude, for the one the
        service keeps resident (``plotting.prelude_files``): as the built-in evaluator says in
        ``GET /info``; as runs found, where the service says nothing (Snekbox, whose image
        built from ``docker/snekbox/Dockerfile`` keeps it), for a run that can be ``resent``
        whole should it keep none."""
        if self.limits_time:  # the built-in evaluator, which says it
            said = self.info.resident_prelude == plotting.prelude_digest()
            return said and self.resident.usable(resent=resent, said=True)
        return self.resident.usable(resent=resent)

    @property
    def reads_cells(self) -> bool:
        """Whether a session's cell can be read as it runs and outlive its call (the built-in
        evaluator's ``wait``, ``/sessions/<id>/output`` and ``/interrupt``)."""
        return self.live_sessions and self.info.long_time_limit is not None

    def max_time_limit(self) -> float:
        """The most a call's ``timeout_seconds`` may ask: the built-in evaluator's long-run
        limit where cells are read as they run, else the settings' maximum."""
        if self.reads_cells and self.info.long_time_limit is not None:
            return self.info.long_time_limit
        return self.settings.max_time_limit

    @property
    def limits_time(self) -> bool:
        """Whether the service honours a call's own time limit (the built-in evaluator, which
        says its own limit in ``GET /info``; Snekbox applies its fixed one)."""
        return self.info.time_limit is not None

    def unknown_why(self) -> str:
        """Why the service's Python and packages are not known."""
        return self.backend.unknown_why if self.backend is not None else "not asked yet"

    def limits_not_enforced(self) -> list[dict[str, str]]:
        """A local evaluator's limits this machine cannot enforce, and why (else none).

        Known only after start; a remote service's limits are its own.
        """
        if self.local is None:
            return []
        return [
            {"limit": limit.name, "how": limit.how}
            for limit in self.local.limits_in_force()
            if not limit.enforced
        ]

    def offers(self) -> tuple[Offer, ...]:
        """The Pythons a call may choose, the default first (empty: one, not named): the
        service's, or for Snekbox the operator's table (``MCP_SNEKBOX_PYTHONS``)."""
        table = self.settings.snekbox_pythons or {}
        environment = self.backend.environment if self.backend is not None else None
        if self.settings.snekbox_url and table:
            default = [Offer(environment.python, None)] if environment is not None else []
            return (*default, *(Offer(v, p) for v, p in table.items()))
        pythons = self.info.pythons
        if not pythons:
            return ()
        return (
            Offer(pythons[0].version, None),
            *(Offer(p.version, p.executable_path) for p in pythons[1:]),
        )

    def why_no_installs(self) -> str:
        """Why a call cannot have packages installed ("" when it can)."""
        policy = self.info.packages
        if policy == "off":
            return self.info.packages_why or "the operator turned package installs off"
        if policy is None:
            return "the evaluation service installs none; its operator adds packages to its image"
        return ""

    async def readiness(self) -> str | None:
        """``None`` when the service answers, else why not (safe to show anyone)."""
        try:
            await self.service.ping()
        except EvaluatorUnavailable:
            return "the evaluation service is unreachable"
        except SnekboxError as exc:
            return f"the evaluation service is unhealthy ({type(exc).__name__})"
        return None

    async def choose_replica(self) -> str | None:
        """Where a new live interpreter is to start, among several replicas (else ``None``).

        Raises:
            ServiceFailure: the service could not say.
        """
        if not self.live_sessions:
            return None
        try:
            return await self.service.choose_replica()
        except SnekboxError as exc:
            raise ServiceFailure(failure_kind(exc), explain(exc)) from exc

    def session_closed(self, session: CodeSession, why: Ending | None) -> None:
        """A closed session's interpreter ends too, in the background: whoever closed it does
        not wait. Gateways sharing a secret leave idle and evicted ones to the evaluator's own
        idle timeout and cap: another gateway may be serving the session."""
        if self.backend is None or not (session.live or self.local is not None):
            return
        if self.settings.session_secret and why in ("expired", "evicted"):
            return
        if why == "evicted":  # by a call starting a session, whose request will carry it
            self._evicted.append((session.name, session.replica))
            return
        self.end_in_background(session.name, session.replica)

    def abandon(self, session: CodeSession) -> None:
        """A call sent to ``session``'s interpreter ended without its answer (cancelled: its
        client went away; or timed out, or its connection cut): the evaluator ends such an
        interpreter, and is told to here as well (one it already ended is no error), so that
        the next call starts a new one with the session's files rather than finding it gone,
        and its result says why."""
        self.end_in_background(session.name, session.replica)
        session.live = session.prelude_loaded = False
        session.abandoned = True

    def take_evicted(self, replica: str | None) -> tuple[str, ...]:
        """The interpreters of closed sessions on ``replica`` that a request there is to end
        before its own run (``end_sessions``): no round trip of their own, and the service,
        at its cap, ends those rather than another to make room for the new session."""
        taken = tuple(name for name, where in self._evicted if where == replica)
        self._evicted = [(name, where) for name, where in self._evicted if where != replica]
        return taken

    def evicted_again(self, names: Sequence[str], replica: str | None) -> None:
        """Interpreters a request was to end, whose ending is unknown: the call's end does."""
        self._evicted += ((name, replica) for name in names)

    def end_evicted(self) -> None:
        """End the interpreters no request carried (refused, or another replica)."""
        while self._evicted:
            self.end_in_background(*self._evicted.pop())

    def end_in_background(self, name: str, replica: str | None) -> None:
        """End a session's interpreter without waiting; the next evaluation waits for it."""
        task = asyncio.ensure_future(self._end(name, replica))
        self._endings.add(task)
        task.add_done_callback(self._endings.discard)

    async def settle(self) -> None:
        """Wait for the interpreters being ended."""
        if self._endings:
            await asyncio.gather(*self._endings, return_exceptions=True)

    async def _end(self, name: str, replica: str | None) -> None:
        try:
            await self.service.end_session(name, replica=replica)
        except SnekboxError as exc:  # it ends by itself once idle
            logger.warning("could not end the evaluator's session: %s", exc)
