"""The one table from the evaluator's errors to ``POST /eval``'s answers.

Both ways in use it: the API (:mod:`evaluator.api`) answers with it over HTTP, and the
in-process client (:mod:`evaluator.inprocess`) raises the HTTP client's errors from it, so the
gateway tells both backends' failures the same way.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from snekbox_client import InvalidRequest

from .errors import CellConflict, QueueFull, RequestInvalid, SessionNotFound, SessionsFull

__all__ = ["QUEUE_FULL", "Refusal", "queue_full_description", "refusal"]

log = logging.getLogger(__name__)

#: The title of the 503 answer to a request that finds the queue full.
QUEUE_FULL = "Evaluation queue is full"


@dataclass(frozen=True)
class Refusal:
    """An answer other than 200: its status, and Falcon's body (title, description)."""

    status: int
    title: str
    description: str | None = None
    headers: dict[str, str] | None = None


def queue_full_description(exc: QueueFull) -> str:
    """The description of the answer to a request that finds the queue full."""
    return (
        f"All {exc.running} evaluation slots are busy and {exc.waiting} evaluations are "
        "waiting; try again later."
    )


def refusal(exc: Exception) -> Refusal:
    """The answer to a request that failed with ``exc``: 400 (invalid: refused by the wire
    format's check, :func:`snekbox_client.parse_request`, or by the evaluator), 404 (a resumed
    session is not live), 409 (its cell is running, or there is none to read), 503 (the queue
    is full, or a new session finds every live session running a cell: retry); anything else
    is unexpected, logged here with its traceback, and a bare 500."""
    if isinstance(exc, InvalidRequest | RequestInvalid):
        return Refusal(400, exc.title, exc.description)
    if isinstance(exc, SessionNotFound):
        return Refusal(404, exc.title, str(exc))
    if isinstance(exc, CellConflict):
        return Refusal(409, exc.title, str(exc))
    if isinstance(exc, QueueFull):
        return Refusal(503, QUEUE_FULL, queue_full_description(exc), {"Retry-After": "1"})
    if isinstance(exc, SessionsFull):
        return Refusal(503, exc.title, str(exc), {"Retry-After": "1"})
    log.error("An exception occurred while trying to process the request", exc_info=exc)
    return Refusal(500, "500 Internal Server Error")
