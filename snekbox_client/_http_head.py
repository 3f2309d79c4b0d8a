"""The head of an HTTP/1.1 answer, read and checked, and the framing of its body (RFC 9112).

What :mod:`._plain_http` trusts of a service's answer: a head of at most :data:`MAX_HEAD_BYTES`
with at most :data:`_MAX_FIELDS` fields, after at most :data:`_MAX_INTERIM` informational
answers (skipped); one ``Content-Length``, or ``Transfer-Encoding: chunked`` alone. Anything
else is an ``httpx.RemoteProtocolError`` at once.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import httpx

__all__ = ["MAX_HEAD_BYTES", "framing", "read_head", "within"]

#: The largest answer head read (status line and headers), and the most bytes of trailers; also
#: the longest line (a chunk's size) read.
MAX_HEAD_BYTES = 64 * 1024
#: The most fields in an answer's head.
_MAX_FIELDS = 256
#: The most informational (1xx) answers before the final one.
_MAX_INTERIM = 8
#: A field name (RFC 9110, 5.1: a token).
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
#: A ``Content-Length`` (decimal digits only: no sign, no spaces, no ``_``), below 10**18.
_LENGTH = re.compile(rb"[0-9]{1,18}")


async def within(awaitable: Any, seconds: float | None) -> Any:
    """``await awaitable``, raising ``TimeoutError`` after ``seconds`` (``None``: never)."""
    if seconds is None:
        return await awaitable
    async with asyncio.timeout(seconds):
        return await awaitable


async def read_head(
    reader: asyncio.StreamReader, seconds: float | None, request: httpx.Request
) -> tuple[int, bytes, bytes, list[tuple[bytes, bytes]]]:
    """The status, reason, HTTP version and headers of the answer, after at most
    :data:`_MAX_INTERIM` informational ones (skipped); each head within ``seconds``."""
    for _ in range(_MAX_INTERIM + 1):
        try:
            head = await within(reader.readuntil(b"\r\n\r\n"), seconds)
        except TimeoutError:
            raise httpx.ReadTimeout("no answer came in time", request=request) from None
        except asyncio.IncompleteReadError as exc:
            message = (
                "Server disconnected without sending a response."
                if not exc.partial
                else "the server closed the connection in the middle of the answer's head"
            )
            raise httpx.RemoteProtocolError(message, request=request) from None
        except asyncio.LimitOverrunError:
            raise httpx.RemoteProtocolError(
                f"the answer's head is longer than {MAX_HEAD_BYTES} bytes", request=request
            ) from None
        status, reason, version, headers = _parse_head(head, request)
        if status == 101:
            raise httpx.RemoteProtocolError("the server switched protocols", request=request)
        if status >= 200:
            return status, reason, version, headers
    raise httpx.RemoteProtocolError(
        f"more than {_MAX_INTERIM} informational answers", request=request
    )


def _parse_head(
    head: bytes, request: httpx.Request
) -> tuple[int, bytes, bytes, list[tuple[bytes, bytes]]]:
    """The status, reason, version and fields of a head (ending with its blank line)."""
    lines = head.count(b"\n")
    if head.count(b"\r") != lines or head.count(b"\r\n") != lines or b"\0" in head:
        raise httpx.RemoteProtocolError(
            "a bare CR or LF, or a NUL, in the answer's head", request=request
        )
    if lines - 2 > _MAX_FIELDS:
        raise httpx.RemoteProtocolError(
            f"more than {_MAX_FIELDS} fields in the answer's head", request=request
        )
    status_line, *fields = head[:-4].split(b"\r\n")
    version, _, rest = status_line.partition(b" ")
    code, _, reason = rest.partition(b" ")
    if (
        len(version) != 8
        or not version.startswith(b"HTTP/1.")
        or not version[7:].isdigit()
        or len(code) != 3
        or not code.isdigit()
        or code < b"100"
    ):
        line = status_line[:80]
        raise httpx.RemoteProtocolError(f"not an HTTP/1.1 answer: {line!r}", request=request)
    headers: list[tuple[bytes, bytes]] = []
    for line in fields:
        if line[:1] in (b" ", b"\t"):
            # obs-fold: the previous field's value goes on, after a space (RFC 9112, 5.2).
            if not headers:
                raise httpx.RemoteProtocolError(
                    f"the answer's fields start with a continuation {line[:80]!r}",
                    request=request,
                )
            name, value = headers[-1]
            headers[-1] = (name, (value + b" " + line.strip(b" \t")).strip(b" \t"))
            continue
        name, colon, value = line.partition(b":")
        if not colon or _TOKEN.fullmatch(name) is None:
            raise httpx.RemoteProtocolError(f"invalid header {line[:80]!r}", request=request)
        headers.append((name, value.strip(b" \t")))
    return int(code), reason, version, headers


def framing(
    request: httpx.Request, status: int, version: bytes, headers: list[tuple[bytes, bytes]]
) -> tuple[int | None, bool, bool]:
    """How the answer's body ends (RFC 9112, 6.3): its length (``None``: chunked, or at the
    end of the connection), whether it is chunked, and whether its connection may be reused.

    Raises:
        httpx.RemoteProtocolError: the framing is not one the answer can be trusted with: an
            invalid or conflicting ``Content-Length``, a transfer coding other than chunked.
    """
    length: int | None = None
    codings: list[bytes] = []
    close = keep_alive = False
    for name, value in headers:
        name = name.lower()
        if name == b"content-length":
            for item in value.split(b","):  # "5, 5": one length, repeated (RFC 9110, 8.6)
                item = item.strip(b" \t")
                if _LENGTH.fullmatch(item) is None:
                    raise httpx.RemoteProtocolError(
                        f"invalid Content-Length {value[:40]!r}", request=request
                    )
                if length is not None and int(item) != length:
                    raise httpx.RemoteProtocolError(
                        f"conflicting Content-Length values ({length}, {int(item)})",
                        request=request,
                    )
                length = int(item)
        elif name == b"transfer-encoding":
            codings += [c.strip(b" \t").lower() for c in value.split(b",")]
        elif name == b"connection":
            tokens = {t.strip(b" \t").lower() for t in value.split(b",")}
            close = close or b"close" in tokens
            keep_alive = keep_alive or b"keep-alive" in tokens
    http11 = version != b"HTTP/1.0"
    reusable = not close and (http11 or keep_alive)
    if request.method == "HEAD" or status in (204, 304):
        return 0, False, reusable
    if codings:
        if codings != [b"chunked"]:
            shown = b", ".join(codings)[:80]
            raise httpx.RemoteProtocolError(
                f"unsupported Transfer-Encoding {shown!r}", request=request
            )
        # Chunked wins over a Content-Length, but such an answer (or a chunked one to HTTP/1.0)
        # may be an attempt at smuggling: its connection is not reused (RFC 9112, 6.1 and 6.3).
        return None, True, reusable and http11 and length is None
    if length is None:
        return None, False, False  # the body ends with the connection
    return length, False, reusable
