"""Typed request and result of ``POST /eval``, and their JSON form."""

from __future__ import annotations

import base64
import binascii
import fnmatch
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from ._exceptions import InvalidResponse

__all__ = [
    "CONTENT_WANTED_FIELD",
    "ENDED_BY_FIELD",
    "END_SESSIONS_FIELD",
    "INSTALLED_FIELD",
    "INSTALL_SECONDS_FIELD",
    "PACKAGES_FIELD",
    "SESSION_ENDED_FIELD",
    "SESSION_FIELD",
    "SESSION_RESUME_FIELD",
    "TIME_LIMIT_FIELD",
    "ContentWanted",
    "EndedBy",
    "EvalRequest",
    "EvalResult",
    "File",
    "Python",
    "ServiceInfo",
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

#: The answer field of :data:`EndedBy`: this project's extension of Snekbox's answer, which the
#: built-in evaluator sends and Snekbox does not.
ENDED_BY_FIELD = "ended_by"

#: What ended a run: the code itself (``"exit"``: it exited, or died of a signal that no limit
#: sent), or the limit named. A 137 is ``"time_limit"`` or ``"memory_limit"``, a 143
#: ``"output_limit"``, unless the code killed itself with that signal. ``"packages_refused"``:
#: it never started, a requested package could not be installed (``stdout`` says which, why).
EndedBy = Literal["exit", "time_limit", "memory_limit", "output_limit", "packages_refused"]
_ENDED_BY: tuple[EndedBy, ...] = get_args(EndedBy)


@dataclass(frozen=True)
class File:
    """A file in the working directory: sent before the run, or returned after it.

    ``path`` is relative to the working directory. Snekbox never returns files whose name starts
    with ``_`` or ``.``, so such names are the place for helper files sent with a request.

    ``size`` is the file's size; it defaults to ``len(content)``. A returned file whose content
    was left out (see :class:`ContentWanted`) has a larger ``size`` than ``content``, which then
    holds only the file's first bytes, or none: :attr:`complete` tells.
    """

    path: str
    content: bytes = b""
    size: int = -1

    def __post_init__(self) -> None:
        if self.size < 0:
            object.__setattr__(self, "size", len(self.content))

    @property
    def complete(self) -> bool:
        """Whether ``content`` is the whole file."""
        return len(self.content) == self.size

    def to_json(self) -> dict[str, str]:
        """The file as a request sends it."""
        return {"path": self.path, "content": _base64(self.content)}


@dataclass(frozen=True)
class ContentWanted:
    """Which returned files' contents a client wants; the others come back as path and size.

    The request field ``content_wanted``, an extension of Snekbox's API that the built-in
    evaluator honours and Snekbox ignores (the client then applies the same rule to Snekbox's
    full answer while reading it, so the result is the same from both)::

        "content_wanted": {"paths": ["figure_*.png"], "max_bytes": 524288, "head_bytes": 24}

    Taken in the answer's order, a file whose path matches one of ``paths`` (``fnmatch``
    patterns, case-sensitive, ``*`` crossing ``/``) comes back whole while the whole contents
    returned add up to at most ``max_bytes``; a matching file that does not fit comes back with
    its first ``head_bytes`` bytes (a PNG's signature and size fit in 24), and later, smaller
    ones may still fit. Every other file comes back with an empty ``content``. ``size`` is
    always the file's real size.
    """

    paths: tuple[str, ...] = ()
    max_bytes: int = 0
    head_bytes: int = 0

    def __post_init__(self) -> None:
        # Integers only: a NaN would pass any comparison with 0 and bound nothing.
        for value in (self.max_bytes, self.head_bytes):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError("max_bytes and head_bytes must be non-negative integers")

    def matches(self, path: str) -> bool:
        return any(fnmatch.fnmatchcase(path, pattern) for pattern in self.paths)

    def to_json(self) -> dict[str, Any]:
        return {
            "paths": list(self.paths),
            "max_bytes": self.max_bytes,
            "head_bytes": self.head_bytes,
        }

    @classmethod
    def from_json(cls, data: Any) -> ContentWanted:
        """Parse the request field (the evaluator's side).

        Raises:
            ValueError: ``data`` is not an object of the shape above (the message says why).
        """
        if not isinstance(data, dict):
            raise ValueError(f"'{CONTENT_WANTED_FIELD}' is not an object")
        paths = data.get("paths", [])
        if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
            raise ValueError(f"'{CONTENT_WANTED_FIELD}.paths' is not a list of strings")
        numbers = {name: data.get(name, 0) for name in ("max_bytes", "head_bytes")}
        for name, value in numbers.items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"'{CONTENT_WANTED_FIELD}.{name}' is not a non-negative integer")
        return cls(tuple(paths), numbers["max_bytes"], numbers["head_bytes"])


@dataclass(frozen=True)
class EvalRequest:
    """What to run.

    ``input`` is code; when it is given and ``args`` is not, Snekbox runs ``python -c input``.
    When both are given, ``input`` is appended to ``args``. ``executable_path`` selects another
    interpreter inside the service (``None``: the service's default). ``content_wanted`` bounds
    the file contents that come back (``None``: all of them, as Snekbox returns them).
    ``time_limit``: seconds this run may take, when fewer than the service's own limit (the
    built-in evaluator honours it; Snekbox ignores it and applies its own). ``session``: run it
    in the live interpreter of this session (the built-in evaluator starts one for an id it
    does not hold; Snekbox ignores the field and runs it one-shot). ``session_resume``: the
    session must be live already: the built-in evaluator answers 404 "Session not found"
    rather than start a fresh interpreter, so that lost variables are never a surprise.
    ``end_sessions``: live sessions the built-in evaluator ends before it runs this (unknown
    ones are no error): a caller that closed them to make room for this one's session has them
    ended first, in the same request, so that the service does not make room itself by ending
    another; Snekbox ignores the field. ``session_owner``: whom a new session counts against
    (an opaque name, e.g. a hash of the caller's client): at its cap, the built-in evaluator
    makes room by ending the longest idle session of the owner holding the most, so that one
    owner's flood ends its own sessions first; Snekbox ignores the field. ``packages``: PEP 508
    requirements the built-in evaluator installs outside the sandbox and puts on ``sys.path``
    (in a session, for the rest of it); Snekbox ignores the field.
    """

    input: str | None = None
    args: Sequence[str] | None = None
    files: Sequence[File] = field(default_factory=tuple)
    executable_path: str | None = None
    content_wanted: ContentWanted | None = None
    time_limit: float | None = None
    session: str | None = None
    session_resume: bool = False
    end_sessions: Sequence[str] = ()
    session_owner: str | None = None
    packages: Sequence[str] = ()

    def __post_init__(self) -> None:
        if self.input is None and self.args is None:
            raise ValueError("an EvalRequest needs input or args")
        # Finite: Infinity would reach the JSON body (which has no such literal), NaN the clock.
        if self.time_limit is not None and not 0 < self.time_limit < math.inf:
            raise ValueError("time_limit must be a positive, finite number of seconds")

    @property
    def argv(self) -> tuple[str, ...]:
        """The interpreter's arguments, as Snekbox builds them: ``args`` (``["-c"]`` when only
        ``input`` is given), then ``input``."""
        args = tuple(self.args if self.args is not None else ["-c"])
        return args if self.input is None else (*args, self.input)

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {}
        if self.input is not None:
            body["input"] = self.input
        if self.args is not None:
            body["args"] = list(self.args)
        if self.files:
            body["files"] = [f.to_json() for f in self.files]
        if self.executable_path is not None:
            body["executable_path"] = self.executable_path
        if self.content_wanted is not None:
            body[CONTENT_WANTED_FIELD] = self.content_wanted.to_json()
        if self.time_limit is not None:
            body[TIME_LIMIT_FIELD] = self.time_limit
        if self.session is not None:
            body[SESSION_FIELD] = self.session
        if self.session_resume:
            body[SESSION_RESUME_FIELD] = True
        if self.end_sessions:
            body[END_SESSIONS_FIELD] = list(self.end_sessions)
        if self.session_owner is not None:
            body[SESSION_OWNER_FIELD] = self.session_owner
        if self.packages:
            body[PACKAGES_FIELD] = list(self.packages)
        return body


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
        if returncode is not None and not _is_int(returncode):
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
        )

    def to_json(self) -> dict[str, Any]:
        """The 200 answer (the evaluator's side); ``ended_by`` only when known."""
        body: dict[str, Any] = {
            "stdout": self.stdout,
            "returncode": self.returncode,
            "files": [
                {"path": f.path, "size": f.size, "content": _base64(f.content)} for f in self.files
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
        return body


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
    if not _is_number(value) or not 0 <= value <= 86_400:
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


def _base64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


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
    if not _is_int(size) or size < len(data):
        raise InvalidResponse(f"file {path!r} has an invalid 'size'")
    return File(path, data, size)


@dataclass(frozen=True)
class Python:
    """An interpreter a service offers: ``executable_path`` runs Python ``version``."""

    version: str
    executable_path: str


#: Interpreters and allowed package names a ``GET /info`` answer may list, and their length.
_MAX_PYTHONS, _MAX_ALLOWED, _MAX_NAME = 32, 1000, 200
_VERSION = re.compile(r"[0-9]+\.[0-9]+(\.[0-9]+)?[A-Za-z0-9+.]*")
_PROJECT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_PIN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9!+._-]+")


@dataclass(frozen=True)
class ServiceInfo:
    """What a service offers beyond Snekbox's API, from the built-in evaluator's ``GET /info``
    (Snekbox has none: :meth:`none`).

    ``max_sessions``: the live sessions one replica holds (0: none, every run is one-shot);
    ``session_idle_timeout``: seconds after which it ends an idle one; ``time_limit``: its
    longest run, in seconds (``None``: not said). ``pythons``: the interpreters a request may
    name in ``executable_path``, the default first (empty: not said). ``packages``: whether it
    installs requested packages, ``"off"``, ``"any"`` or ``"allow-list"`` (``None``: not said,
    as Snekbox: it installs none); ``allowed``: the allow-list's names; ``packages_why``: why
    it installs none, when ``off``.
    """

    max_sessions: int = 0
    session_idle_timeout: float | None = None
    time_limit: float | None = None
    pythons: tuple[Python, ...] = ()
    packages: Literal["off", "any", "allow-list"] | None = None
    allowed: tuple[str, ...] = ()
    packages_why: str | None = None
    #: Seconds one resolution, or one install, of a set may take there (``None``: not said).
    install_timeout: float | None = None

    @classmethod
    def none(cls) -> ServiceInfo:
        """A service that says nothing (Snekbox): one-shot runs, its own limits."""
        return cls()

    def to_json(self) -> dict[str, Any]:
        """The ``GET /info`` answer (the evaluator's side)."""
        body: dict[str, Any] = {
            "sessions": {"max": self.max_sessions, "idle_timeout": self.session_idle_timeout},
            "time_limit": self.time_limit,
            "pythons": [
                {"version": p.version, "executable_path": p.executable_path} for p in self.pythons
            ],
        }
        if self.packages is not None:
            body["packages"] = {"policy": self.packages, "allowed": list(self.allowed)}
            if self.packages_why is not None:
                body["packages"]["why"] = self.packages_why
            if self.install_timeout is not None:
                body["packages"]["timeout"] = self.install_timeout
        return body

    @classmethod
    def from_json(cls, data: Any) -> ServiceInfo:
        """Parse a decoded ``GET /info`` body, raising :class:`InvalidResponse` when malformed."""
        if not isinstance(data, dict) or not isinstance(data.get("sessions"), dict):
            raise InvalidResponse("'sessions' is missing or not an object")
        sessions = data["sessions"]
        max_sessions, idle, time_limit = (
            sessions.get("max"),
            sessions.get("idle_timeout"),
            data.get("time_limit"),
        )
        if not _is_int(max_sessions) or max_sessions < 0:
            raise InvalidResponse("'sessions.max' is not a non-negative integer")
        for name, value in (("sessions.idle_timeout", idle), ("time_limit", time_limit)):
            if value is not None and not (_is_number(value) and value > 0):
                raise InvalidResponse(f"'{name}' is not a positive number")
        packages, allowed, why, install_timeout = _packages_from_info(data.get("packages"))
        return cls(
            max_sessions,
            None if idle is None else float(idle),
            None if time_limit is None else float(time_limit),
            _pythons_from_info(data.get("pythons", [])),
            packages,
            allowed,
            why,
            install_timeout,
        )


def _pythons_from_info(value: Any) -> tuple[Python, ...]:
    if not isinstance(value, list) or len(value) > _MAX_PYTHONS:
        raise InvalidResponse(f"'pythons' is not a list of at most {_MAX_PYTHONS}")
    pythons = []
    for item in value:
        version = item.get("version") if isinstance(item, dict) else None
        path = item.get("executable_path") if isinstance(item, dict) else None
        if not isinstance(version, str) or len(version) > 32 or not _VERSION.fullmatch(version):
            raise InvalidResponse("a 'pythons' entry has no valid 'version'")
        if not isinstance(path, str) or not path.startswith("/") or len(path) > 4096:
            raise InvalidResponse("a 'pythons' entry has no absolute 'executable_path'")
        if not path.isprintable():
            raise InvalidResponse("a 'pythons' entry has an unprintable 'executable_path'")
        pythons.append(Python(version, path))
    return tuple(pythons)


def _packages_from_info(
    value: Any,
) -> tuple[Literal["off", "any", "allow-list"] | None, tuple[str, ...], str | None, float | None]:
    if value is None:
        return None, (), None, None
    policy = value.get("policy") if isinstance(value, dict) else None
    if policy not in ("off", "any", "allow-list"):
        raise InvalidResponse("'packages.policy' is not one of off, any, allow-list")
    allowed = value.get("allowed", [])
    if (
        not isinstance(allowed, list)
        or len(allowed) > _MAX_ALLOWED
        or not all(
            isinstance(n, str) and len(n) <= _MAX_NAME and _PROJECT.fullmatch(n) for n in allowed
        )
    ):
        raise InvalidResponse("'packages.allowed' is not a list of project names")
    why = value.get("why")
    if why is not None and not (isinstance(why, str) and len(why) <= 500 and why.isprintable()):
        raise InvalidResponse("'packages.why' is not a short line of text")
    timeout = value.get("timeout")
    if timeout is not None and not (_is_number(timeout) and 0 < timeout <= 86_400):
        raise InvalidResponse("'packages.timeout' is not a number of seconds")
    return policy, tuple(allowed), why, None if timeout is None else float(timeout)
