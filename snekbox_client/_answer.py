"""Reading a ``POST /eval`` answer as it arrives, keeping only what the result needs.

A Snekbox answer can carry 48 MiB of files, 64 MiB once base64-encoded, and the client may want
none of it (the gateway returns only figures). :class:`AnswerReader` is an incremental JSON
parser for that one shape (the JSON itself is :class:`~._scanner.JsonScanner`'s): fed the body
chunk by chunk, it keeps ``stdout``, ``returncode``, ``ended_by``, each file's ``path`` and
``size``, and only the contents that :class:`ContentWanted` asks for; the rest is scanned (at C
speed, with a regular expression) and dropped. Memory is bounded by the caps given, whatever the
answer holds; feeding a chunk is cheap enough for the event loop, and
:meth:`AnswerReader.result`, which decodes what was kept, belongs in a thread.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass, field
from typing import Any

from ._exceptions import InvalidResponse
from ._fields import (
    ENDED_BY_FIELD,
    INSTALL_SECONDS_FIELD,
    INSTALLED_FIELD,
    RUNNING_FIELD,
    SESSION_ENDED_FIELD,
)
from ._request import ContentWanted, File
from ._result import (
    EvalResult,
    ended_by_from_answer,
    install_seconds_from_answer,
    installed_from_answer,
    running_from_answer,
    session_ended_from_answer,
)
from ._scanner import MAX_KEY, JsonScanner, decode_string

__all__ = ["AnswerReader"]

_MAX_DEPTH = 64
# Not base64 (a backslash may start a JSON escape such as "\/": checked when decoded).
_NOT_BASE64 = re.compile(rb"[^A-Za-z0-9+/=\\]")

# What a container is to the answer.
_TOP, _FILES, _FILE, _IGNORED = range(4)
# What happens to a file's content string.
_SKIP, _KEEP, _HEAD = range(3)


@dataclass
class _Entry:
    """A file entry as read so far: raw JSON string bodies, decoded by :meth:`result`."""

    path: bytearray | None = None
    size: Any = None
    content: bytearray = field(default_factory=bytearray)
    mode: int = _SKIP
    name: str = ""  # the path, decoded, once the content starts
    chars: int = 0  # characters of the content string, kept or not
    tail: bytes = b""  # its last two characters (padding)
    padded: bool = False  # an "=" was seen: only more may follow
    escaped: bool = False  # a JSON escape ("\\/") was seen: lengths are off


class AnswerReader(JsonScanner):
    """An incremental reader of one 200 answer of ``POST /eval``.

    Args:
        wanted: Which contents to keep (see :class:`ContentWanted`); the same rule the built-in
            evaluator applies, so its answers and Snekbox's full ones read the same.
        max_answer_bytes: The most body bytes accepted, kept or not.
        max_text_bytes: The most bytes of ``stdout``, paths and keys kept (JSON-escaped).
        max_files: The most file entries accepted.

    Every method raises :class:`InvalidResponse` for a body that is not JSON, not an eval
    result, or over a cap.
    """

    def __init__(
        self,
        wanted: ContentWanted,
        *,
        max_answer_bytes: int,
        max_text_bytes: int,
        max_files: int,
    ) -> None:
        super().__init__()
        self._wanted = wanted
        self._max_answer = max_answer_bytes
        self._max_text = max_text_bytes
        self._max_files = max_files
        self._text = 0
        self._budget = wanted.max_bytes
        self._head_chars = -(-wanted.head_bytes // 3) * 4
        self._string_target = ""
        self._stdout: bytearray | None = None
        self._returncode: Any = None
        # A scalar, a string's raw body (bytearray), or a container ([]): checked by result().
        self._ended_by: Any = None
        self._session_ended: Any = None  # a scalar; a string or container is "invalid"
        self._installed: Any = None  # like _ended_by
        self._install_seconds: Any = None  # like _session_ended
        self._running: Any = None  # like _session_ended
        self._entries: list[_Entry] = []

    # -- feeding ---------------------------------------------------------------------------

    @property
    def bytes_read(self) -> int:
        """How many bytes of the answer were fed so far."""
        return self._read

    def feed(self, data: bytes) -> None:
        """Take the next chunk of the body."""
        self._read += len(data)
        if self._read > self._max_answer:
            raise InvalidResponse(f"the answer is larger than {self._max_answer:,} bytes")
        self._feed_scanner(data)

    def result(self) -> EvalResult:
        """The result, once the whole body was fed: decodes what was kept (CPU: use a thread)."""
        self._end_of_body()
        if self._stdout is None:
            raise InvalidResponse("'stdout' is missing or not a string")
        stdout = decode_string(self._stdout)
        returncode = self._returncode
        if returncode is not None and (
            not isinstance(returncode, int) or isinstance(returncode, bool)
        ):
            raise InvalidResponse("'returncode' is neither an integer nor null")
        files = tuple(self._file(entry) for entry in self._entries)
        ended_by = self._ended_by
        if isinstance(ended_by, bytearray):
            ended_by = decode_string(ended_by)
        session_ended = session_ended_from_answer(self._session_ended)
        installed = self._installed
        if isinstance(installed, bytearray):
            installed = decode_string(installed)
        return EvalResult(
            stdout,
            returncode,
            files,
            ended_by_from_answer(ended_by),
            session_ended,
            installed_from_answer(installed),
            install_seconds_from_answer(self._install_seconds),
            running_from_answer(self._running),
        )

    # -- the answer ------------------------------------------------------------------------

    def _role(self) -> int | None:
        return self._containers[-1][1] if self._containers else None

    def _open(self, is_object: bool) -> None:
        parent, key = self._role(), self._current_key
        if parent is None:
            if not is_object:
                raise InvalidResponse("expected a JSON object, got list")
            role = _TOP
        elif parent == _TOP and key == "files":
            if is_object:
                raise InvalidResponse("'files' is not a list")
            role = _FILES
        elif parent == _TOP and key == "stdout":
            raise InvalidResponse("'stdout' is missing or not a string")
        elif parent == _TOP and key == "returncode":
            raise InvalidResponse("'returncode' is neither an integer nor null")
        elif parent == _TOP and key == ENDED_BY_FIELD:
            self._ended_by = []
            role = _IGNORED
        elif parent == _TOP and key == SESSION_ENDED_FIELD:
            self._session_ended = []
            role = _IGNORED
        elif parent == _TOP and key == INSTALLED_FIELD:
            self._installed = []
            role = _IGNORED
        elif parent == _TOP and key == INSTALL_SECONDS_FIELD:
            self._install_seconds = []
            role = _IGNORED
        elif parent == _TOP and key == RUNNING_FIELD:
            self._running = []
            role = _IGNORED
        elif parent == _FILES:
            if not is_object:
                raise InvalidResponse("a file entry is not an object")
            if len(self._entries) >= self._max_files:
                raise InvalidResponse(f"the answer lists more than {self._max_files} files")
            self._entries.append(_Entry())
            role = _FILE
        elif parent == _FILE and key in ("path", "content"):
            raise InvalidResponse("a file entry lacks a string 'path' or 'content'")
        elif parent == _FILE and key == "size":
            raise InvalidResponse("a file entry has an invalid 'size'")
        else:
            role = _IGNORED
        if len(self._containers) >= _MAX_DEPTH:
            raise InvalidResponse("the answer is nested too deep")
        self._containers.append((is_object, role))
        self._current_key = None

    def _close(self) -> None:
        self._containers.pop()
        self._current_key = None

    def _scalar(self, value: Any) -> None:
        role, key = self._role(), self._current_key
        if role is None:
            raise InvalidResponse(f"expected a JSON object, got {type(value).__name__}")
        if role == _TOP and key == "stdout":
            raise InvalidResponse("'stdout' is missing or not a string")
        if role == _TOP and key == "returncode":
            self._returncode = value
        elif role == _TOP and key == ENDED_BY_FIELD:
            self._ended_by = value
        elif role == _TOP and key == SESSION_ENDED_FIELD:
            self._session_ended = value
        elif role == _TOP and key == INSTALLED_FIELD:
            self._installed = value
        elif role == _TOP and key == INSTALL_SECONDS_FIELD:
            self._install_seconds = value
        elif role == _TOP and key == RUNNING_FIELD:
            self._running = value
        elif role == _TOP and key == "files":
            raise InvalidResponse("'files' is not a list")
        elif role == _FILES:
            raise InvalidResponse("a file entry is not an object")
        elif role == _FILE and key == "size":
            self._entries[-1].size = value
        elif role == _FILE and key in ("path", "content"):
            raise InvalidResponse("a file entry lacks a string 'path' or 'content'")

    def _begin_string(self) -> None:
        role, key = self._role(), self._current_key
        target = ""
        if role is None:
            raise InvalidResponse("expected a JSON object, got str")
        if role == _TOP and key == "stdout":
            target = "stdout"
            self._stdout = bytearray()
        elif role == _TOP and key == "returncode":
            raise InvalidResponse("'returncode' is neither an integer nor null")
        elif role == _TOP and key == ENDED_BY_FIELD:
            target = ENDED_BY_FIELD
            self._ended_by = bytearray()
        elif role == _TOP and key == SESSION_ENDED_FIELD:
            self._session_ended = ""  # a string: not a boolean
        elif role == _TOP and key == INSTALLED_FIELD:
            target = INSTALLED_FIELD
            self._installed = bytearray()
        elif role == _TOP and key == INSTALL_SECONDS_FIELD:
            self._install_seconds = ""  # a string: not a number
        elif role == _TOP and key == RUNNING_FIELD:
            self._running = ""  # a string: not a boolean
        elif role == _TOP and key == "files":
            raise InvalidResponse("'files' is not a list")
        elif role == _FILES:
            raise InvalidResponse("a file entry is not an object")
        elif role == _FILE and key == "size":
            raise InvalidResponse("a file entry has an invalid 'size'")
        elif role == _FILE and key == "path":
            target = "path"
            self._entries[-1].path = bytearray()
        elif role == _FILE and key == "content":
            target = "content"
            self._begin_content(self._entries[-1])
        self._string_target = target

    def _begin_content(self, entry: _Entry) -> None:
        entry.content.clear()
        entry.chars = 0
        entry.tail = b""
        entry.padded = entry.escaped = False
        path = None if entry.path is None else decode_string(entry.path)
        entry.name = path or ""
        if path is None or not self._wanted.matches(path):
            entry.mode = _SKIP
        elif isinstance(entry.size, int) and entry.size > self._budget:
            entry.mode = _HEAD
        else:
            entry.mode = _KEEP

    def _string_bytes(self, chunk: bytes) -> None:
        target = self._string_target
        if self._string_is_key:
            kept = chunk[: max(0, MAX_KEY + 1 - len(self._key))]
            self._count_text(len(kept))
            self._key += kept
        elif target == "stdout" and self._stdout is not None:
            self._count_text(len(chunk))
            self._stdout += chunk
        elif target == ENDED_BY_FIELD and isinstance(self._ended_by, bytearray):
            self._count_text(len(chunk))
            self._ended_by += chunk
        elif target == INSTALLED_FIELD and isinstance(self._installed, bytearray):
            self._count_text(len(chunk))
            self._installed += chunk
        elif target == "path" and (path := self._entries[-1].path) is not None:
            self._count_text(len(chunk))
            path += chunk
        elif target == "content":
            self._content_bytes(self._entries[-1], chunk)

    def _content_bytes(self, entry: _Entry, chunk: bytes) -> None:
        # Checked as it passes, kept or not: the alphabet, and "=" only at the end.
        padding = chunk.find(b"=") if not entry.padded else 0
        if _NOT_BASE64.search(chunk) or (padding >= 0 and chunk[padding:].strip(b"=")):
            raise InvalidResponse(f"file {entry.name!r} has invalid base64 content")
        entry.padded = padding >= 0
        entry.escaped = entry.escaped or b"\\" in chunk
        entry.chars += len(chunk)
        entry.tail = (entry.tail + chunk[-2:])[-2:]
        if entry.mode == _KEEP:
            entry.content += chunk
            if len(entry.content) > -(-self._budget // 3) * 4:
                entry.mode = _HEAD
                del entry.content[self._head_chars :]
        elif entry.mode == _HEAD and len(entry.content) < self._head_chars:
            entry.content += chunk[: self._head_chars - len(entry.content)]

    def _end_string(self) -> None:
        if self._string_target == "content":
            entry = self._entries[-1]
            if entry.chars % 4 and not entry.escaped:
                raise InvalidResponse(f"file {entry.name!r} has invalid base64 content")
            if entry.mode == _KEEP:
                decoded = _decoded_size(entry)
                if decoded > self._budget:
                    entry.mode = _HEAD
                    del entry.content[self._head_chars :]
                else:
                    self._budget -= decoded
        self._string_target = ""

    def _count_text(self, n: int) -> None:
        self._text += n
        if self._text > self._max_text:
            raise InvalidResponse(
                f"the answer's output and file names are larger than {self._max_text:,} bytes"
            )

    def _file(self, entry: _Entry) -> File:
        if entry.path is None:
            raise InvalidResponse("a file entry lacks a string 'path' or 'content'")
        path = decode_string(entry.path)
        size = entry.size
        if size is not None and (not isinstance(size, int) or isinstance(size, bool)):
            raise InvalidResponse(f"file {path!r} has an invalid 'size'")
        raw = bytes(entry.content)
        if b"\\" in raw:  # escapes: rare in base64 (a JSON encoder may write "\/")
            raw = decode_string(raw).encode("ascii", "replace")
        try:
            if entry.mode == _HEAD:
                data = base64.b64decode(raw[: self._head_chars])[: self._wanted.head_bytes]
            else:
                data = base64.b64decode(raw, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise InvalidResponse(f"file {path!r} has invalid base64 content") from exc
        if size is None:  # not sent: what the base64 string decodes to
            size = len(data) if entry.mode == _KEEP else _decoded_size(entry)
        sent = len(data) if entry.escaped else max(len(data), _decoded_size(entry))
        if size < sent:  # more content than the file holds
            raise InvalidResponse(f"file {path!r} has an invalid 'size'")
        return File(path, data, size)


def _decoded_size(entry: _Entry) -> int:
    return max(0, entry.chars * 3 // 4 - entry.tail.count(b"="))
