"""The typed result of ``POST /eval`` (its 200 answer) and its JSON form."""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass
from typing import Any, Literal, get_args

from ._exceptions import InvalidResponse
from ._fields import (
    ENDED_BY_FIELD,
    INSTALL_SECONDS_FIELD,
    INSTALLED_FIELD,
    RUNNING_FIELD,
    SESSION_ENDED_FIELD,
    base64_text,
    is_int,
    is_number,
)
from ._request import File

__all__ = [
    "EndedBy",
    "EvalResult",
    "ended_by_from_answer",
    "file_from_answer",
    "install_seconds_from_answer",
    "installed_from_answer",
    "running_from_answer",
    "session_ended_from_answer",
]

#: What ended a run: the code itself (``"exit"``: it exited, or died of a signal that no limit
#: sent), or the limit named. A 137 is ``"time_limit"`` or ``"memory_limit"``, a 143
#: ``"output_limit"``, unless the code killed itself with that signal. ``"packages_refused"``:
#: it never started, a requested package could not be installed (``stdout`` says which, why).
#: ``"interrupted"``: a session's cell its caller interrupted (``POST /sessions/<id>/interrupt``).
EndedBy = Literal[
    "exit", "time_limit", "memory_limit", "output_limit", "packages_refused", "interrupted"
]
_ENDED_BY: tuple[EndedBy, ...] = get_args(EndedBy)


@dataclass(frozen=True)
class EvalResult:
    """The outcome of one evaluation.

    ``returncode`` is the process's exit status (0 ok, 1 uncaught exception, 137 killed at the
    time or memory limit, 143 output cap, 128+N killed by signal N), or ``None`` when the service
    itself failed to run the code; ``stdout`` then carries its message.

    ``ended_by`` says which, when the service knows (see :data:`EndedBy`); ``None``: it did not
    say (Snekbox never does, and the built-in evaluator cannot tell a memory kill without a
    memory cgroup).
    """

    stdout: str
    returncode: int | None
    files: tuple[File, ...] = ()
    ended_by: EndedBy | None = None
    #: For a run in a session: whether its interpreter ended with it (``None``: not a session).
    session_ended: bool | None = None
    #: The pins of the packages installed for it (``None``: it asked for none).
    installed: tuple[str, ...] | None = None
    #: Seconds the install took, outside the run's time limit (``None``: none asked for).
    install_seconds: float | None = None
    #: A session's cell still running (see :attr:`EvalRequest.wait`): ``stdout`` is its output
    #: so far (since the last read), ``returncode`` ``None``, and no files yet.
    running: bool = False

    @classmethod
    def from_json(cls, data: Any) -> EvalResult:
        """Parse a decoded 200 body, raising :class:`InvalidResponse` for anything malformed.

        (:class:`~snekbox_client.SnekboxClient` reads answers incrementally instead; this is for
        bodies already in memory.)
        """
        if not isinstance(data, dict):
            raise InvalidResponse(f"expected a JSON object, got {type(data).__name__}")
        stdout = data.get("stdout")
        returncode = data.get("returncode")
        if not isinstance(stdout, str):
            raise InvalidResponse("'stdout' is missing or not a string")
        if returncode is not None and not is_int(returncode):
            raise InvalidResponse("'returncode' is neither an integer nor null")
        raw_files = data.get("files", [])
        if not isinstance(raw_files, list):
            raise InvalidResponse("'files' is not a list")
        return cls(
            stdout=stdout,
            returncode=returncode,
            files=tuple(map(_parse_file, raw_files)),
            ended_by=ended_by_from_answer(data.get(ENDED_BY_FIELD)),
            session_ended=session_ended_from_answer(data.get(SESSION_ENDED_FIELD)),
            installed=installed_from_answer(data.get(INSTALLED_FIELD)),
            install_seconds=install_seconds_from_answer(data.get(INSTALL_SECONDS_FIELD)),
            running=running_from_answer(data.get(RUNNING_FIELD)),
        )

    def to_json(self) -> dict[str, Any]:
        """The 200 answer (the evaluator's side); ``ended_by`` only when known."""
        body: dict[str, Any] = {
            "stdout": self.stdout,
            "returncode": self.returncode,
            "files": [
                {"path": f.path, "size": f.size, "content": base64_text(f.content)}
                for f in self.files
            ],
        }
        if self.ended_by is not None:
            body[ENDED_BY_FIELD] = self.ended_by
        if self.session_ended is not None:
            body[SESSION_ENDED_FIELD] = self.session_ended
        if self.installed is not None:
            body[INSTALLED_FIELD] = " ".join(self.installed)
        if self.install_seconds is not None:
            body[INSTALL_SECONDS_FIELD] = self.install_seconds
        if self.running:
            body[RUNNING_FIELD] = True
        return body


#: One pin of ``installed``: ``name==version``.
_PIN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9!+._-]+")
#: Pins an answer's ``installed`` may list, and the characters of one.
_MAX_PINS, _MAX_PIN_CHARS = 200, 120


def installed_from_answer(value: Any) -> tuple[str, ...] | None:
    """The answer's ``installed``: pins separated by spaces (absent or null: ``None``).

    Raises:
        InvalidResponse: it is not a string of at most 500 pins of ``name==version``.
    """
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidResponse(f"'{INSTALLED_FIELD}' is neither a string nor null")
    pins = tuple(value.split())
    if len(pins) > _MAX_PINS or not all(
        len(pin) <= _MAX_PIN_CHARS and _PIN.fullmatch(pin) for pin in pins
    ):
        raise InvalidResponse(f"'{INSTALLED_FIELD}' is not a list of name==version pins")
    return pins


def install_seconds_from_answer(value: Any) -> float | None:
    """The answer's ``install_seconds`` (absent or null: ``None``).

    Raises:
        InvalidResponse: it is not a non-negative number.
    """
    if value is None:
        return None
    if not is_number(value) or not 0 <= value <= 86_400:
        raise InvalidResponse(f"'{INSTALL_SECONDS_FIELD}' is not a non-negative number")
    return float(value)


def session_ended_from_answer(value: Any) -> bool | None:
    """The answer's ``session_ended`` (absent or null: ``None``).

    Raises:
        InvalidResponse: it is neither a boolean nor null.
    """
    if value is None or isinstance(value, bool):
        return value
    raise InvalidResponse(f"'{SESSION_ENDED_FIELD}' is neither a boolean nor null")


def running_from_answer(value: Any) -> bool:
    """The answer's ``running`` (absent or null: ``False``).

    Raises:
        InvalidResponse: it is neither a boolean nor null.
    """
    if value is None or isinstance(value, bool):
        return bool(value)
    raise InvalidResponse(f"'{RUNNING_FIELD}' is neither a boolean nor null")


def ended_by_from_answer(value: Any) -> EndedBy | None:
    """The answer's ``ended_by`` (absent or null: ``None``).

    Raises:
        InvalidResponse: it is something else than one of :data:`EndedBy`'s values.
    """
    if value is None:
        return None
    if isinstance(value, str) and value in _ENDED_BY:
        return value
    raise InvalidResponse(f"'{ENDED_BY_FIELD}' is not one of {', '.join(_ENDED_BY)} or null")


def _parse_file(item: Any) -> File:
    if not isinstance(item, dict):
        raise InvalidResponse("a file entry is not an object")
    path, content, size = item.get("path"), item.get("content", ""), item.get("size")
    if not isinstance(path, str) or not isinstance(content, str):
        raise InvalidResponse("a file entry lacks a string 'path' or 'content'")
    return file_from_answer(path, content, size)


def file_from_answer(path: str, content: str, size: Any) -> File:
    """A returned file from its JSON fields (``content`` base64, ``size`` an int or absent).

    Raises:
        InvalidResponse: the content is not base64, or ``size`` is not a plausible size.
    """
    try:
        data = base64.b64decode(content, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidResponse(f"file {path!r} has invalid base64 content") from exc
    if size is None:
        return File(path, data)
    if not is_int(size) or size < len(data):
        raise InvalidResponse(f"file {path!r} has an invalid 'size'")
    return File(path, data, size)
