"""Calls the service could not answer, in words the model can act on.

Each failure says what happened, whether the code ran (or may have), and what to do. It reaches
the model as a tool error (``isError``); ``kind`` is its outcome in the metrics and the log.
"""

from __future__ import annotations

from snekbox_client import (
    ConnectionLost,
    EvaluatorRejected,
    EvaluatorTimeout,
    EvaluatorUnavailable,
    InvalidResponse,
    SnekboxError,
)

__all__ = ["GATEWAY_FAILED", "ServiceFailure", "explain", "failure_kind"]

#: What the model is told when the gateway itself fails (the details go to the log).
GATEWAY_FAILED = (
    "The gateway failed while handling this call (an internal error, logged for the operator); "
    "whether the code ran is not known. Retry; if this persists, the gateway needs an operator."
)

_KINDS: dict[type[SnekboxError], str] = {
    EvaluatorUnavailable: "unavailable",
    ConnectionLost: "connection_lost",
    EvaluatorTimeout: "timeout",
    EvaluatorRejected: "rejected",
    InvalidResponse: "invalid_response",
}


class ServiceFailure(Exception):
    """A call the service could not answer: ``kind`` for metrics, ``message`` for the model."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


def failure_kind(exc: SnekboxError) -> str:
    """The metrics' name of a failure of the evaluation service."""
    return _KINDS.get(type(exc), "evaluator_error")


def explain(exc: SnekboxError, *, running: int = 1, workers: int = 1) -> str:
    """A tool error the model can act on: what failed, whether the code ran, what to do.

    ``running`` is how many evaluations the gateway had sent when this one was, and
    ``workers`` how many the service runs at once: with more running than workers, a call that
    timed out may have waited for a free worker in the service's own queue rather than run.
    """
    if isinstance(exc, EvaluatorUnavailable):
        return (
            f"The Python evaluation service is unreachable ({exc.reason}); the code did not run. "
            "Retry in a few seconds; if this persists, the service is down and needs an operator."
        )
    if isinstance(exc, ConnectionLost):
        return (
            "The connection to the evaluation service was lost before its answer came "
            f"({exc.reason}); the code may have run, but its result is lost. Retry if running "
            "it again does no harm."
        )
    if isinstance(exc, EvaluatorTimeout):
        if running > workers:
            return (
                f"The evaluation service did not answer within {exc.timeout:g} s; the result "
                f"is lost. {running} evaluations were running when this one was sent, more "
                f"than the service's {workers} workers, so it may have waited for a free "
                "worker rather than run that long. Retry in a few seconds."
            )
        return (
            f"The evaluation service did not answer within {exc.timeout:g} s; the result is lost. "
            "Retry, and if the code is slow, make it faster or smaller."
        )
    if isinstance(exc, EvaluatorRejected):
        if exc.sessions_busy:
            return (
                "The evaluation service holds as many live sessions as it can and every one is "
                "running code, so no new session can start; the code did not run. Retry in a "
                "few seconds, or continue one of your sessions once its code has ended."
            )
        if exc.status_code == 503:
            return (
                "The evaluation service is busy (every slot is running and the queue is full); "
                "the code did not run. Retry in a few seconds."
            )
        detail = f": {exc.description}" if exc.description else ""
        return (
            f"The evaluation service rejected the request ({exc.status_code} {exc.title}{detail})."
        )
    if isinstance(exc, InvalidResponse):
        return f"The evaluation service answered something that is not a result ({exc}). Retry."
    return f"The evaluation service failed: {exc}"
