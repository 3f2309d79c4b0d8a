"""The typed request of ``POST /eval`` and its JSON form: what to run, and the files sent."""

from __future__ import annotations

import base64
import fnmatch
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ._fields import (
    CONTENT_WANTED_FIELD,
    END_SESSIONS_FIELD,
    PACKAGES_FIELD,
    SESSION_FIELD,
    SESSION_OWNER_FIELD,
    SESSION_RESUME_FIELD,
    TIME_LIMIT_FIELD,
    WAIT_FIELD,
    json_body,
)

__all__ = ["ContentWanted", "EvalRequest", "File"]


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

    @classmethod
    def encoded(cls, path: str, content: bytes, base64_content: bytes) -> File:
        """A file to send whose content's base64 form the caller has already (parts of it
        encoded once: the prelude's), so that it is not encoded again for each request.

        ``base64_content`` must be ``base64.b64encode(content)``.
        """
        file = cls(path, content)
        file.__dict__["base64"] = base64_content
        return file

    @functools.cached_property
    def base64(self) -> bytes:
        """The content in base64, as a request sends it (encoded once per file)."""
        return base64.b64encode(self.content)

    @property
    def complete(self) -> bool:
        """Whether ``content`` is the whole file."""
        return len(self.content) == self.size

    def to_json(self) -> dict[str, str]:
        """The file as a request sends it."""
        return {"path": self.path, "content": self.base64.decode("ascii")}


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
    (in a session, for the rest of it); Snekbox ignores the field. ``wait``: for a run in a
    session, the seconds the built-in evaluator waits for the cell before it answers with the
    output so far and ``running`` (:attr:`EvalResult.running`); the cell goes on, its client may
    leave, and its output and result are read with ``POST /sessions/<id>/output``. Such a cell
    may ask for a ``time_limit`` up to the service's long-run limit. Snekbox ignores the field.
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
    wait: float | None = None

    def __post_init__(self) -> None:
        if self.input is None and self.args is None:
            raise ValueError("an EvalRequest needs input or args")
        # Finite: Infinity would reach the JSON body (which has no such literal), NaN the clock.
        if self.time_limit is not None and not 0 < self.time_limit < math.inf:
            raise ValueError("time_limit must be a positive, finite number of seconds")
        if self.wait is not None and not 0 <= self.wait < math.inf:
            raise ValueError("wait must be a non-negative, finite number of seconds")

    @property
    def argv(self) -> tuple[str, ...]:
        """The interpreter's arguments, as Snekbox builds them: ``args`` (``["-c"]`` when only
        ``input`` is given), then ``input``."""
        args = tuple(self.args if self.args is not None else ["-c"])
        return args if self.input is None else (*args, self.input)

    def to_json(self) -> dict[str, Any]:
        body = self._fields()
        if self.files:
            body["files"] = [f.to_json() for f in self.files]
        return body

    def to_bytes(self) -> bytes:
        """The JSON body, encoded (as httpx encodes ``json=``): the files' base64, already
        JSON, spliced in rather than scanned again by the encoder (the prelude's 50 KB)."""
        fields = json_body(self._fields())
        if not self.files:
            return fields
        files = b",".join(
            b'{"path":%s,"content":"%s"}' % (json_body(f.path), f.base64) for f in self.files
        )
        comma = b"," if len(fields) > 2 else b""
        return b'%s%s"files":[%s]}' % (fields[:-1], comma, files)

    def _fields(self) -> dict[str, Any]:
        """The body's fields but ``files``."""
        body: dict[str, Any] = {}
        if self.input is not None:
            body["input"] = self.input
        if self.args is not None:
            body["args"] = list(self.args)
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
        if self.wait is not None:
            body[WAIT_FIELD] = self.wait
        return body
