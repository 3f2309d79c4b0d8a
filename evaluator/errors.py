"""Errors of the evaluator, one per way a request or the service can fail.

    EvaluatorError
    ├── SandboxUnavailable   the sandbox cannot be built on this machine (raised by ``start``)
    ├── RequestInvalid       the request cannot be run as given (an HTTP 400 at the edge)
    │   ├── InvalidFile          a file's path or content is illegal
    │   └── InvalidExecutable    ``executable_path`` does not exist, is not a file or not executable
    ├── SessionNotFound      a run resumes a live session this service does not hold (an HTTP 404)
    └── QueueFull            too many runs are already waiting for a slot (an HTTP 503 at the edge)

A user's code failing is not an error: it is an ``EvalResult`` with a non-zero ``returncode``.
"""

from __future__ import annotations

__all__ = [
    "EvaluatorError",
    "InvalidExecutable",
    "InvalidFile",
    "QueueFull",
    "RequestInvalid",
    "SandboxUnavailable",
    "SessionNotFound",
]


class EvaluatorError(Exception):
    """Base class of the evaluator's errors."""


class SandboxUnavailable(EvaluatorError):
    """The sandbox cannot be built here; the message says what is missing and what to do."""


class RequestInvalid(EvaluatorError):
    """The request cannot be run; ``title`` and ``description`` are Snekbox's wording."""

    def __init__(self, title: str, description: str | None = None) -> None:
        super().__init__(title if description is None else f"{title}: {description}")
        self.title = title
        self.description = description


class InvalidFile(RequestInvalid):
    """A request file has an illegal path or undecodable content."""

    def __init__(self, description: str) -> None:
        super().__init__("Request file is invalid", description)


class InvalidExecutable(RequestInvalid):
    """``executable_path`` cannot be run inside the sandbox."""


class SessionNotFound(EvaluatorError):
    """A run asked to resume a live session that this service does not hold (it never did,
    ended it, or restarted): nothing ran."""

    title = "Session not found"

    def __init__(self, session: str, reason: str | None = None) -> None:
        """``reason``: why the service ended it, when it knows (the memory watchdog)."""
        why = reason or "it ended, expired, was evicted, or this service restarted"
        super().__init__(f"No live session {session!r} is held here ({why}): nothing ran")
        self.session = session
        self.reason = reason


class QueueFull(EvaluatorError):
    """Every slot is busy and the wait queue is full."""

    def __init__(self, running: int, waiting: int) -> None:
        super().__init__(f"{running} evaluations are running and {waiting} are waiting")
        self.running = running
        self.waiting = waiting
