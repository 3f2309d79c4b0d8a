"""Errors of the evaluator, one per way a request or the service can fail.

    EvaluatorError
    ├── SandboxUnavailable   the sandbox cannot be built on this machine (raised by ``start``)
    │   ├── SandboxNotMade       bubblewrap or the launcher failed before the interpreter
    │   └── HostTooBusy          the start-up check was killed at its time limit twice
    ├── RequestInvalid       the request cannot be run as given (an HTTP 400 at the edge)
    │   ├── InvalidFile          a file's path or content is illegal
    │   └── InvalidExecutable    ``executable_path`` does not exist, is not a file or not executable
    ├── SessionNotFound      a run resumes a live session this service does not hold (an HTTP 404)
    ├── CellConflict         a session's cell is running, or none is to read (an HTTP 409)
    ├── SessionsFull         a new session needs room and every live session runs a cell (a 503)
    ├── QueueFull            too many runs are already waiting for a slot (an HTTP 503 at the edge)
    └── RunAborted           a run stopped short: its message is the answer's output (an HTTP 200)
        ├── WriteError           an input file could not be written (nothing ran)
        ├── CollectError         the output files could not be collected (after the run)
        └── PackageRefused       a requirement cannot be installed (nothing ran)

A user's code failing is not an error: it is an ``EvalResult`` with a non-zero ``returncode``.
"""

from __future__ import annotations

from typing import Literal

from snekbox_client import EvaluatorRejected

__all__ = [
    "CellConflict",
    "CollectError",
    "EvaluatorError",
    "HostTooBusy",
    "InvalidExecutable",
    "InvalidFile",
    "PackageRefused",
    "QueueFull",
    "RequestInvalid",
    "RunAborted",
    "SandboxNotMade",
    "SandboxUnavailable",
    "SessionNotFound",
    "SessionsFull",
    "WriteError",
]


class EvaluatorError(Exception):
    """Base class of the evaluator's errors."""


class SandboxUnavailable(EvaluatorError):
    """The sandbox cannot be built here; the message says what is missing and what to do."""


class SandboxNotMade(SandboxUnavailable):
    """bubblewrap or the launcher failed before the interpreter started: the sandbox itself
    could not be made here. ``reason`` is how, without the advice on what to install."""

    def __init__(self, reason: str, advice: str) -> None:
        super().__init__(f"{reason}\n{advice}")
        self.reason = reason


class HostTooBusy(SandboxUnavailable):
    """The start-up check run was killed at its time limit twice: the host is too busy."""


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


class CellConflict(EvaluatorError):
    """A request about a live session's cell that its state does not allow: a new cell while
    one runs (or ended unread), or a read or interrupt with no cell to act on: nothing ran."""

    title = "Cell conflict"


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


class SessionsFull(EvaluatorError):
    """A new session needs room (``session_limit``), and every live session that could end
    to make it is running a cell: none is ended (its code would be killed), the request is
    refused and nothing ran; it may be retried once a cell ends."""

    title = EvaluatorRejected.SESSIONS_BUSY

    def __init__(self, session: str, held: int) -> None:
        super().__init__(
            f"No room for a new live session {session!r}: all {held} live sessions that could "
            "end to make room are running a cell: nothing ran; try again in a few seconds"
        )
        self.session = session
        self.held = held


class QueueFull(EvaluatorError):
    """Every slot is busy and the wait queue is full."""

    def __init__(self, running: int, waiting: int) -> None:
        super().__init__(f"{running} evaluations are running and {waiting} are waiting")
        self.running = running
        self.waiting = waiting


class RunAborted(EvaluatorError):
    """A run stopped short of its result; the message (or ``answer``) is the answer's output."""


class WriteError(RunAborted):
    """An input file could not be written; the message is the run's output (Snekbox's)."""


class CollectError(RunAborted):
    """Output files could not be collected; the message is the run's output (Snekbox's)."""


#: Why a package requirement (or set) is refused.
Why = Literal[
    "not allowed",
    "invalid",
    "not found",
    "no wheel",
    "conflict",
    "too large",
    "timed out",
    "busy",
    "failed",
]


class PackageRefused(RunAborted):
    """A requirement that cannot be installed; ``requirement`` is it (or ``None``: the set)."""

    def __init__(self, requirement: str | None, why: Why, detail: str) -> None:
        named = f"{requirement!r}: " if requirement is not None else ""
        super().__init__(f"{named}{why}: {detail}")
        self.requirement = requirement
        self.why = why
        self.detail = detail

    @property
    def answer(self) -> str:
        """The refusal as an answer's ``stdout`` says it."""
        if self.requirement is None:
            return (
                f"The packages could not be installed ({self.why}): {self.detail}. "
                "The code did not run."
            )
        return (
            f"The package requirement {self.requirement!r} was refused ({self.why}): "
            f"{self.detail}. The code did not run."
        )
