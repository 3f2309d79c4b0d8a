"""The names of the fields this project adds to Snekbox's ``/eval`` request and answer, and
the checks of JSON values the models share."""

from __future__ import annotations

import base64
import json
import math
from typing import Any

__all__ = [
    "CONTENT_WANTED_FIELD",
    "ENDED_BY_FIELD",
    "END_SESSIONS_FIELD",
    "INSTALLED_FIELD",
    "INSTALL_SECONDS_FIELD",
    "PACKAGES_FIELD",
    "RUNNING_FIELD",
    "SESSION_ENDED_FIELD",
    "SESSION_FIELD",
    "SESSION_OWNER_FIELD",
    "SESSION_RESUME_FIELD",
    "TIME_LIMIT_FIELD",
    "WAIT_FIELD",
    "base64_text",
    "is_int",
    "is_number",
    "json_body",
]

#: The request field of :class:`ContentWanted`: this project's extension of Snekbox's request.
#: Snekbox's schema ignores unknown fields, so a request carrying it is valid for both services.
CONTENT_WANTED_FIELD = "content_wanted"
#: The request field of :attr:`EvalRequest.time_limit`, the same kind of extension.
TIME_LIMIT_FIELD = "time_limit"
#: The request field of :attr:`EvalRequest.session`, and the answer's of
#: :attr:`EvalResult.session_ended`: the built-in evaluator's live sessions (Snekbox, one-shot
#: by design, ignores the one and never sends the other).
SESSION_FIELD = "session"
SESSION_ENDED_FIELD = "session_ended"
#: The request field of :attr:`EvalRequest.session_resume`.
SESSION_RESUME_FIELD = "session_resume"
#: The request field of :attr:`EvalRequest.end_sessions`.
END_SESSIONS_FIELD = "end_sessions"
#: The request field of :attr:`EvalRequest.session_owner`.
SESSION_OWNER_FIELD = "session_owner"

#: The request field of :attr:`EvalRequest.packages`, and the answer's of
#: :attr:`EvalResult.installed` (the pins, space-separated) and :attr:`EvalResult.install_seconds`:
#: packages installed outside the sandbox by the built-in evaluator (Snekbox has no such thing).
PACKAGES_FIELD = "packages"
INSTALLED_FIELD = "installed"
INSTALL_SECONDS_FIELD = "install_seconds"

#: The request field of :attr:`EvalRequest.wait`, and the answer's of :attr:`EvalResult.running`:
#: a live session's cell that goes on after its answer (the built-in evaluator's; Snekbox runs
#: every request to its end, ignores the one and never sends the other).
WAIT_FIELD = "wait"
RUNNING_FIELD = "running"

#: The answer field of :data:`EndedBy`: this project's extension of Snekbox's answer, which the
#: built-in evaluator sends and Snekbox does not.
ENDED_BY_FIELD = "ended_by"


def json_body(value: Any) -> bytes:
    """``value`` as a request's JSON body, encoded as httpx encodes ``json=``."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


def base64_text(data: bytes) -> str:
    """``data`` as a JSON body carries it."""
    return base64.b64encode(data).decode("ascii")


def is_int(value: Any) -> bool:
    """Whether a decoded JSON value is an integer (not a boolean)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """Whether a decoded JSON value is a finite number (not a boolean)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
