"""The built-in evaluator in the gateway's own process, called as :class:`SnekboxClient` is.

Through ``POST /eval`` on an in-memory transport, every call paid for the HTTP it never left
the process for: the request (its prelude bundle in base64) encoded as JSON and parsed and
validated again, the answer encoded and parsed back, each in a worker thread. This calls
:meth:`evaluator.Evaluator.run` itself, after the same checks as the API's
(:func:`evaluator.api.check_request`), and gives its failures as the client's errors, worded
as the API would answer them, so the gateway tells both backends' failures the same way.
"""

from __future__ import annotations

import asyncio
import logging

import evaluator
from evaluator.api import QUEUE_FULL, check_request, queue_full_description
from snekbox_client import (
    EvalRequest,
    EvalResult,
    EvaluatorRejected,
    EvaluatorTimeout,
    EvaluatorUnavailable,
    ServiceInfo,
)

__all__ = ["InProcessClient"]

log = logging.getLogger(__name__)

#: How the errors name the service (a URL, for the HTTP client's).
_NAME = "in-process"


class InProcessClient:
    """:class:`SnekboxClient`'s ``eval``, ``end_session``, ``info``, ``ping`` and ``aclose``
    for an evaluator started in this process (which the caller starts and stops); there is
    one replica, so ``replica`` is ignored.

    Args:
        service: The evaluator.
        timeout: Seconds to wait for one answer, as the HTTP client's read timeout.
    """

    def __init__(self, service: evaluator.Evaluator, *, timeout: float) -> None:
        self._service = service
        self._timeout = timeout
        self._closed = False

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
        if self._closed:
            raise EvaluatorUnavailable(_NAME, "the client is closed")
        try:
            check_request(request, max_files=self._service.config.max_request_files)
            async with asyncio.timeout(self._timeout + extra_time):
                return await self._service.run(request)
        except TimeoutError:
            raise EvaluatorTimeout(_NAME, self._timeout + extra_time) from None
        except evaluator.RequestInvalid as exc:
            raise EvaluatorRejected(400, exc.title, exc.description) from exc
        except evaluator.SessionNotFound as exc:
            raise EvaluatorRejected(404, exc.title, str(exc)) from exc
        except evaluator.QueueFull as exc:
            raise EvaluatorRejected(503, QUEUE_FULL, queue_full_description(exc)) from exc
        except Exception as exc:
            log.exception("An exception occurred while trying to process the request")
            raise EvaluatorRejected(500, "500 Internal Server Error") from exc

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

    async def aclose(self) -> None:
        self._closed = True
