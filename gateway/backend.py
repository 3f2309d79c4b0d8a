"""What the evaluation service offers, learned from the service itself, never assumed.

Two questions, asked at start and again every ``interval`` seconds: ``GET /info`` (whether it
keeps live sessions, and its limits: the built-in evaluator answers, Snekbox has no such route)
and the environment probe (:mod:`gateway.environment`: its Python and packages, from a short
run). Until a remote service answers, both are asked again every few seconds. ``on_change`` is
called when an answer changes what the tool's description says.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Protocol

from snekbox_client import EvalRequest, EvalResult, InvalidResponse, ServiceInfo, SnekboxError

from .environment import PROBE, Environment, ProbeFailed

__all__ = ["Backend"]

logger = logging.getLogger("python_mcp_server")

#: Seconds between attempts while the service does not answer, and the most one may take.
RETRY_INTERVAL = 5.0
#: Seconds the environment probe may take (a cold sandbox on a loaded machine); at start, when
#: the gateway waits for it, less (it is asked again in the background).
PROBE_TIMEOUT = 60.0
START_PROBE_TIMEOUT = 15.0


class _Service(Protocol):
    async def info(self) -> ServiceInfo: ...

    async def eval(self, request: EvalRequest, *, replica: str | None = None) -> EvalResult: ...


class Backend:
    """The answers of one service (see the module's docstring)."""

    def __init__(self, service: _Service, *, interval: float) -> None:
        self._service = service
        self._interval = interval
        #: What it offers beyond Snekbox's API: nothing until it says.
        self.info = ServiceInfo.none()
        #: Its Python and packages; ``None`` until the probe ran (see :attr:`unknown_why`).
        self.environment: Environment | None = None
        #: Why :attr:`environment` is not known.
        self.unknown_why = "the evaluation service has not answered the gateway's probe yet"
        self.on_change: Callable[[], None] | None = None
        #: Whether the last probe reached the service.
        self.answered = False
        self._task: asyncio.Task[None] | None = None

    @property
    def live_sessions(self) -> bool:
        """Whether the service keeps a live interpreter per session."""
        return self.info.max_sessions > 0

    async def probe(self, run_within: float = PROBE_TIMEOUT) -> bool:
        """Ask both questions (the probe's run given ``run_within`` seconds); ``False`` if the
        service could not be reached."""
        self.answered = await self._ask(run_within)
        return self.answered

    async def _ask(self, run_within: float) -> bool:
        try:
            async with asyncio.timeout(RETRY_INTERVAL):
                info = await self._service.info()
            if info != self.info:
                sessions = (
                    f"up to {info.max_sessions} live sessions"
                    if info.max_sessions
                    else ("no live sessions (they keep files only)")
                )
                logger.info("the evaluation service offers %s", sessions)
            self.info = info
        except InvalidResponse as exc:  # it answers, with nonsense: it offers nothing more
            logger.warning("the evaluation service's GET /info is not understood: %s", exc)
            self.info = ServiceInfo.none()
        except (SnekboxError, TimeoutError) as exc:
            logger.warning("the evaluation service did not say what it offers yet: %r", exc)
            return False
        try:
            async with asyncio.timeout(run_within):
                result = await self._service.eval(EvalRequest(input=PROBE))
        except (SnekboxError, TimeoutError) as exc:
            logger.warning("the evaluation service did not run the environment probe: %r", exc)
            return False
        if result.returncode != 0:
            self.environment = None
            self.unknown_why = "the probe of the evaluation service's Python failed there"
            logger.warning("the environment probe failed: %s", result.stdout[-500:])
            return True
        try:
            self.environment = Environment.parse(result.stdout)
        except ProbeFailed as exc:
            self.environment = None
            self.unknown_why = "the probe of the evaluation service's Python answered nonsense"
            logger.warning("the environment probe's answer is not understood: %s", exc)
        return True

    def start(self, describe: Callable[[], str]) -> None:
        """Keep the answers fresh in the background; ``describe`` gives the description that
        the answers shape, so that :attr:`on_change` is called only when it changes."""
        self._task = asyncio.ensure_future(self._keep_asking(describe))

    async def _keep_asking(self, describe: Callable[[], str]) -> None:
        while True:
            await asyncio.sleep(self._interval if self.answered else RETRY_INTERVAL)
            before = describe()
            await self.probe()
            if describe() != before and self.on_change is not None:
                self.on_change()

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
