"""An incremental JSON tokenizer: the part of the answer reader that knows JSON, not the answer.

:class:`JsonScanner` is fed a body chunk by chunk and calls its subclass's hooks for what it
finds (a container opened or closed, a scalar, a string's start, bytes and end); a key's text
is kept for the next value (``_current_key``). The runs of a string's body and of whitespace
are matched at C speed, with a regular expression, so that a megabyte string costs one match.
A body that is not JSON raises :class:`InvalidResponse`, worded as ``json`` would word it when
the error is in the body's first bytes.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ._exceptions import InvalidResponse

__all__ = ["MAX_KEY", "JsonScanner", "decode_string"]

# A run of a JSON string's body: anything but a quote or a backslash, or an escape pair.
_STRING_BODY = re.compile(rb'(?:[^"\\]++|\\.)*+', re.DOTALL)
_WHITESPACE = re.compile(rb"[ \t\n\r]*+")
_LITERAL = re.compile(rb"[-+.0-9A-Za-z]*+")
_LITERAL_START = frozenset(b"-0123456789tfn")
_MAX_LITERAL = 64
#: Keys longer than this many bytes are no key the answer reads (``_current_key`` is ``None``).
MAX_KEY = 256
_HEAD_BYTES = 64 * 1024

# What the tokenizer expects next.
_VALUE, _VALUE_OR_CLOSE, _KEY, _KEY_OR_CLOSE, _COLON, _NEXT, _END = range(7)


class JsonScanner:
    """The tokenizer's state, and the hooks a reader of one JSON shape fills in.

    The subclass counts the bytes it is fed in ``_read`` before it hands them to :meth:`_scan`;
    its :meth:`_open` pushes ``(is an object, role)`` on ``_containers`` (the role is its own),
    and :meth:`_close` pops it.
    """

    def __init__(self) -> None:
        self._read = 0
        self._head = bytearray()  # the body's first bytes, for json's own error messages
        self._expect = _VALUE
        self._containers: list[tuple[bool, int]] = []  # (is an object, role)
        self._in_string = False
        self._string_is_key = False
        self._escape = False
        self._key = bytearray()
        self._literal = bytearray()
        self._current_key: str | None = None

    # -- the hooks -------------------------------------------------------------------------

    def _open(self, is_object: bool) -> None:
        raise NotImplementedError

    def _close(self) -> None:
        raise NotImplementedError

    def _scalar(self, value: Any) -> None:
        raise NotImplementedError

    def _begin_string(self) -> None:
        raise NotImplementedError

    def _string_bytes(self, chunk: bytes) -> None:
        """A part of the current string's raw body (escapes included): a key's when
        ``_string_is_key``, which the subclass appends to ``_key``."""
        raise NotImplementedError

    def _end_string(self) -> None:
        raise NotImplementedError

    # -- scanning --------------------------------------------------------------------------

    def _feed_scanner(self, data: bytes) -> None:
        """Scan the next chunk (already counted in ``_read``)."""
        if len(self._head) < _HEAD_BYTES:
            self._head += data[: _HEAD_BYTES - len(self._head)]
        try:
            self._scan(data)
        except _SyntaxError as exc:
            raise self._as_json_would_say(exc) from None

    def _end_of_body(self) -> None:
        """Check that the body fed so far is one whole JSON value."""
        try:
            if self._literal:
                self._end_literal()
            if self._in_string or self._expect != _END:
                raise _SyntaxError("the answer is not JSON: it ends too early")
        except _SyntaxError as exc:
            raise self._as_json_would_say(exc) from None

    def _scan(self, data: bytes) -> None:
        i, n = 0, len(data)
        while i < n:
            if self._in_string:
                i = self._string_part(data, i)
            elif self._literal:
                i = self._literal_part(data, i)
            else:
                i = _match_end(_WHITESPACE, data, i)
                if i < n:
                    i = self._structural(data, i)

    def _as_json_would_say(self, error: InvalidResponse) -> InvalidResponse:
        """``json``'s own message (line, column) when the error is in the body's first bytes."""
        try:
            json.loads(self._head.decode("utf-8", "replace"))
        except ValueError as exc:
            if self._read <= len(self._head):
                return InvalidResponse(f"the answer is not JSON: {exc}")
        return error

    def _structural(self, data: bytes, i: int) -> int:
        char = data[i]
        expect = self._expect
        if char == ord('"'):
            if expect in (_KEY, _KEY_OR_CLOSE):
                self._string_is_key = True
                self._key.clear()
            elif expect in (_VALUE, _VALUE_OR_CLOSE):
                self._string_is_key = False
                self._begin_string()
            else:
                raise _unexpected(char)
            self._in_string = True
        elif char in (ord("{"), ord("[")):
            if expect not in (_VALUE, _VALUE_OR_CLOSE):
                raise _unexpected(char)
            is_object = char == ord("{")
            self._open(is_object)
            self._expect = _KEY_OR_CLOSE if is_object else _VALUE_OR_CLOSE
        elif char in (ord("}"), ord("]")):
            is_object = char == ord("}")
            allowed = (_KEY_OR_CLOSE if is_object else _VALUE_OR_CLOSE, _NEXT)
            if expect not in allowed or not self._containers:
                raise _unexpected(char)
            if self._containers[-1][0] != is_object:
                raise _unexpected(char)
            self._close()
            self._after_value()
        elif char == ord(":"):
            if expect != _COLON:
                raise _unexpected(char)
            self._expect = _VALUE
        elif char == ord(","):
            if expect != _NEXT:
                raise _unexpected(char)
            self._expect = _KEY if self._containers[-1][0] else _VALUE
        elif char in _LITERAL_START and expect in (_VALUE, _VALUE_OR_CLOSE):
            return self._literal_part(data, i)
        else:
            raise _unexpected(char)
        return i + 1

    def _string_part(self, data: bytes, i: int) -> int:
        if self._escape:  # the previous chunk ended with a backslash
            self._escape = False
            self._string_bytes(b"\\" + data[i : i + 1])
            return i + 1
        end = _match_end(_STRING_BODY, data, i)
        if end > i:
            self._string_bytes(data[i:end])
        if end == len(data):
            return end
        if data[end] == ord('"'):
            self._in_string = False
            if self._string_is_key:
                self._end_key()
            else:
                self._end_string()
                self._after_value()
            return end + 1
        self._escape = True  # a backslash, the chunk's last byte
        return end + 1

    def _literal_part(self, data: bytes, i: int) -> int:
        end = _match_end(_LITERAL, data, i)
        self._literal += data[i:end]
        if len(self._literal) > _MAX_LITERAL:
            raise _SyntaxError("the answer is not JSON: a literal is too long")
        if end < len(data):
            self._end_literal()
        return end

    def _end_literal(self) -> None:
        try:
            value = json.loads(self._literal)
        except ValueError:
            raise _SyntaxError("the answer is not JSON: a malformed literal") from None
        self._literal.clear()
        self._scalar(value)
        self._after_value()

    def _after_value(self) -> None:
        self._expect = _NEXT if self._containers else _END

    def _end_key(self) -> None:
        self._current_key = decode_string(self._key) if len(self._key) <= MAX_KEY else None
        self._expect = _COLON


def decode_string(raw: bytes | bytearray) -> str:
    """A JSON string's body (escapes included) as text."""
    try:
        text: str = json.loads(b'"' + raw + b'"')
    except ValueError as exc:
        raise InvalidResponse(f"the answer is not JSON: {exc}") from None
    return text


def _match_end(pattern: re.Pattern[bytes], data: bytes, i: int) -> int:
    match = pattern.match(data, i)
    return i if match is None else match.end()


class _SyntaxError(InvalidResponse):
    """The body is not JSON; :meth:`JsonScanner._feed_scanner` words it as ``json`` would."""


def _unexpected(char: int) -> _SyntaxError:
    return _SyntaxError(f"the answer is not JSON: unexpected {chr(char)!r}")
