"""Typed request and result of ``POST /eval``, and their JSON form."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ._exceptions import InvalidResponse

__all__ = ["EvalRequest", "EvalResult", "File"]


@dataclass(frozen=True)
class File:
    """A file in the working directory: sent before the run, or returned after it.

    ``path`` is relative to the working directory. Snekbox never returns files whose name starts
    with ``_`` or ``.``, so such names are the place for helper files sent with a request.
    """

    path: str
    content: bytes = b""

    @property
    def size(self) -> int:
        return len(self.content)

    def to_json(self) -> dict[str, str]:
        return {"path": self.path, "content": base64.b64encode(self.content).decode("ascii")}


@dataclass(frozen=True)
class EvalRequest:
    """What to run.

    ``input`` is code; when it is given and ``args`` is not, Snekbox runs ``python -c input``.
    When both are given, ``input`` is appended to ``args``. ``executable_path`` selects another
    interpreter inside the service (``None``: the service's default).
    """

    input: str | None = None
    args: Sequence[str] | None = None
    files: Sequence[File] = field(default_factory=tuple)
    executable_path: str | None = None

    def __post_init__(self) -> None:
        if self.input is None and self.args is None:
            raise ValueError("an EvalRequest needs input or args")

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
        return body


@dataclass(frozen=True)
class EvalResult:
    """The outcome of one evaluation.

    ``returncode`` is the process's exit status (0 ok, 1 uncaught exception, 137 killed at the
    time or memory limit, 143 output cap, 128+N killed by signal N), or ``None`` when the service
    itself failed to run the code; ``stdout`` then carries its message.
    """

    stdout: str
    returncode: int | None
    files: tuple[File, ...] = ()

    @classmethod
    def from_json(cls, data: Any) -> EvalResult:
        """Parse a 200 body, raising :class:`InvalidResponse` for anything malformed."""
        if not isinstance(data, dict):
            raise InvalidResponse(f"expected a JSON object, got {type(data).__name__}")
        stdout = data.get("stdout")
        returncode = data.get("returncode")
        if not isinstance(stdout, str):
            raise InvalidResponse("'stdout' is missing or not a string")
        if returncode is not None and (
            not isinstance(returncode, int) or isinstance(returncode, bool)
        ):
            raise InvalidResponse("'returncode' is neither an integer nor null")
        raw_files = data.get("files", [])
        if not isinstance(raw_files, list):
            raise InvalidResponse("'files' is not a list")
        return cls(stdout=stdout, returncode=returncode, files=tuple(map(_parse_file, raw_files)))


def _parse_file(item: Any) -> File:
    if not isinstance(item, dict):
        raise InvalidResponse("a file entry is not an object")
    path, content = item.get("path"), item.get("content", "")
    if not isinstance(path, str) or not isinstance(content, str):
        raise InvalidResponse("a file entry lacks a string 'path' or 'content'")
    try:
        data = base64.b64decode(content, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidResponse(f"file {path!r} has invalid base64 content") from exc
    return File(path=path, content=data)
