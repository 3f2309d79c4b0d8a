"""The evaluator in its caller's process (the gateway's), called as :class:`SnekboxClient` is.

Through ``POST /eval`` on an in-memory transport, every call paid for the HTTP it never left
the process for: the request (its prelude bundle in base64) encoded as JSON and parsed and
validated again, the answer encoded and parsed back, each in a worker thread. This calls
:meth:`evaluator.Evaluator.run` itself, after the same checks as the API's
(:func:`snekbox_client.check_request`), and gives its failures as the client's errors, worded
by the API's own table (:mod:`evaluator.answers`), so the gateway tells both backends'
failures the same way.
"""

from __future__ import annotations

import asyncio

from snekbox_client import (
    EvalRequest,
    EvalResult,
    EvaluatorRejected,
    EvaluatorTimeout,
    EvaluatorUnavailable,
    ServiceInfo,
    check_request,
)

from .answers import refusal
from .api import RESERVED_DIRS
from .models import Limit
from .service import Evaluator

__all__ = ["InProcessClient"]

#: How the errors name the service (a URL, for the HTTP client's).
_NAME = "in-process"


class InProcessClient:
    """:class:`SnekboxClient`'s ``eval``, ``end_session``, ``choose_replica``, ``info``,
    ``ping`` and ``aclose`` for an evaluator in this process; there is one replica, so
    ``replica`` is ignored.

    Beyond the HTTP client's, what the evaluator in this process can tell: its limits in force
    on this host (:meth:`limits_in_force`) and its cap on live sessions (:attr:`session_limit`).

    Args:
        service: The evaluator.
        timeout: Seconds to wait for one answer, as the HTTP client's read timeout.
        owned: Whether the client starts the evaluator (:meth:`start`) and stops it
            (:meth:`aclose`); else its caller does.
    """

    def __init__(self, service: Evaluator, *, timeout: float, owned: bool = False) -> None:
        self._service = service
        self._timeout = timeout
        self._owned = owned
        self._closed = False

    async def start(self) -> None:
        """Start the evaluator, if the client owns it.

        Raises:
            SandboxUnavailable: it cannot isolate code here (the message says what to do).
        """
        if self._owned:
            await self._service.start()

    async def eval(
        self, request: EvalRequest, *, replica: str | None = None, extra_time: float = 0.0
    ) -> EvalResult:
        """Run ``request``, waiting ``extra_time`` seconds more than the timeout (packages).

        Raises:
            EvaluatorRejected: what the API would answer 400 (an invalid request), 404 (a
                resumed session is not live), 503 (the queue is full) or 500 (anything
                unexpected, logged).
            EvaluatorTimeout: no answer within the timeout.
            EvaluatorUnavailable: the client is closed.
        """
        self._check_open()
        # A cell read as it runs is answered within its wait, which the service spends first.
        waited = self._timeout + extra_time + (request.wait or 0.0)
        try:
            check_request(
                request, max_files=self._service.config.max_request_files, reserved=RESERVED_DIRS
            )
            async with asyncio.timeout(waited):
                return await self._service.run(request)
        except TimeoutError:
            raise EvaluatorTimeout(_NAME, waited) from None
        except Exception as exc:  # the API's table: 400, 404, 503, else a logged 500
            raise _rejected(exc) from exc

    async def read_output(
        self, session: str, *, wait: float, early: bool = False, replica: str | None = None
    ) -> EvalResult:
        """What ``POST /sessions/<id>/output`` would answer (see
        :meth:`snekbox_client.SnekboxClient.read_output`).

        Raises:
            EvaluatorRejected: 404 (the session is not live), 409 (no cell to read).
            EvaluatorUnavailable: the client is closed.
        """
        self._check_open()
        try:
            return await self._service.dispatcher.read_cell(session, wait, early=early)
        except Exception as exc:
            raise _rejected(exc) from exc

    async def interrupt(self, session: str, *, replica: str | None = None) -> None:
        """What ``POST /sessions/<id>/interrupt`` would do.

        Raises:
            EvaluatorRejected: 404 (the session is not live), 409 (no cell is running).
            EvaluatorUnavailable: the client is closed.
        """
        self._check_open()
        try:
            self._service.dispatcher.interrupt(session)
        except Exception as exc:
            raise _rejected(exc) from exc

    def _check_open(self) -> None:
        if self._closed:
            raise EvaluatorUnavailable(_NAME, "the client is closed")

    async def end_session(self, session: str, *, replica: str | None = None) -> None:
        """End a live session now; one the evaluator does not hold is no error."""
        await self._service.end_session(session)

    async def choose_replica(self) -> str | None:
        """One replica: there is nothing to choose."""
        return None

    async def info(self) -> ServiceInfo:
        """What ``GET /info`` would answer."""
        return self._service.info()

    async def ping(self) -> None:
        """Nothing to reach: it answers while the client is open.

        Raises:
            EvaluatorUnavailable: the client is closed.
        """
        if self._closed:
            raise EvaluatorUnavailable(_NAME, "the client is closed")

    @property
    def evaluator(self) -> Evaluator:
        """The evaluator it calls."""
        return self._service

    def limits_in_force(self) -> tuple[Limit, ...]:
        """Each limit and how this host enforces it (known once the evaluator started)."""
        return self._service.limits_in_force()

    @property
    def session_limit(self) -> int:
        """Live sessions the evaluator holds at once (derived at its start)."""
        return self._service.session_limit

    async def aclose(self) -> None:
        """Close the client (and stop the evaluator, if the client owns it)."""
        self._closed = True
        if self._owned:
            await self._service.aclose()


def _rejected(exc: Exception) -> EvaluatorRejected:
    """The HTTP client's error for what the API would answer ``exc`` with (its one table)."""
    answer = refusal(exc)
    return EvaluatorRejected(answer.status, answer.title, answer.description)
