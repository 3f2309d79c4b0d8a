"""Errors of the wire format: the client's, one per way the evaluation service can fail, and the
service's, for a request that breaks the rules of ``/eval``.

    SnekboxError
    ├── EvaluatorUnavailable   nothing answered at the URL (connection refused, DNS): not run
    │   └── ReplicaGone        the service's name no longer resolves to the replica asked for
    ├── ConnectionLost         the connection broke once made: the code may have run
    ├── EvaluatorTimeout       the service accepted the request but did not answer in time
    ├── EvaluatorRejected      the service answered 4xx/5xx (``title`` / ``description`` kept)
    └── InvalidResponse        the answer is not an eval result (malformed, undecodable, too big)

    InvalidRequest             a request breaks the rules of ``/eval`` (a ValueError; a 400)
    └── InvalidRequestFile     a file's path or content is illegal

A user's code failing is not an error here: it is an :class:`EvalResult` with a non-zero
``returncode``.
"""

from __future__ import annotations

__all__ = [
    "ConnectionLost",
    "EvaluatorRejected",
    "EvaluatorTimeout",
    "EvaluatorUnavailable",
    "InvalidRequest",
    "InvalidRequestFile",
    "InvalidResponse",
    "ReplicaGone",
    "SnekboxError",
]


class SnekboxError(Exception):
    """Base class: the evaluation service could not evaluate the request."""


class EvaluatorUnavailable(SnekboxError):
    """Nothing answered at the service's URL."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"the evaluation service at {url} is unreachable: {reason}")
        self.url = url
        self.reason = reason


class ReplicaGone(EvaluatorUnavailable):
    """The replica a request was pinned to (where a live session is) is no longer one of the
    addresses the service's name resolves to: gone for good, with what it held."""


class ConnectionLost(SnekboxError):
    """The connection broke once made, before the whole answer came: the code may have run.

    (httpx cannot say whether the request had been sent whole: it reads the answer even when
    sending fails, since a server may answer early and close.)
    """

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"the connection to the evaluation service at {url} was lost: {reason}")
        self.url = url
        self.reason = reason


class EvaluatorTimeout(SnekboxError):
    """The service did not answer within the client's timeout."""

    def __init__(self, url: str, timeout: float) -> None:
        super().__init__(f"the evaluation service at {url} did not answer within {timeout:g} s")
        self.url = url
        self.timeout = timeout


class EvaluatorRejected(SnekboxError):
    """The service answered with an error status; ``title`` and ``description`` are its own."""

    #: The title of the built-in evaluator's 503 when no live session can make room for a new
    #: one (every one that could end runs a cell): nothing ran, and a retry may find room.
    SESSIONS_BUSY = "Live sessions are busy"

    def __init__(self, status_code: int, title: str, description: str | None = None) -> None:
        message = f"the evaluation service answered {status_code}: {title}"
        if description:
            message += f" ({description})"
        super().__init__(message)
        self.status_code = status_code
        self.title = title
        self.description = description

    @property
    def sessions_busy(self) -> bool:
        """Whether this is the built-in evaluator's :attr:`SESSIONS_BUSY`."""
        return self.status_code == 503 and self.title == self.SESSIONS_BUSY


class InvalidResponse(SnekboxError):
    """The service answered 200, but the body is not a valid eval result."""


class InvalidRequest(ValueError):
    """A request breaks the rules of ``/eval`` (see :func:`~snekbox_client.parse_request`);
    ``title`` and ``description`` are Snekbox's wording of its 400 answer."""

    #: The title of every refusal but a file's.
    TITLE = "Request data failed validation"

    def __init__(self, description: str, title: str = TITLE) -> None:
        super().__init__(f"{title}: {description}")
        self.title = title
        self.description = description


class InvalidRequestFile(InvalidRequest):
    """A request file has an illegal path or undecodable content."""

    #: The title of a file's refusal.
    TITLE = "Request file is invalid"

    def __init__(self, description: str) -> None:
        super().__init__(description, self.TITLE)
