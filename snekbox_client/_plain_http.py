"""A lean HTTP/1.1 transport for plain ``http`` to one address, on asyncio streams.

Each evaluation is one request on the gateway's critical path, and httpx's own transport
(httpcore, h11 and anyio, layer on layer) costs about 1.5 ms of CPU per request, more than the
rest of the gateway's call: Snekbox closes every connection after its answer, so each request
pays for opening one too. This transport does what those requests need and no more: one
``write`` per request, the answer's head parsed once, its body streamed (``Content-Length``,
chunked, or to the end of the connection), connections kept alive when the service allows
(the built-in evaluator under uvicorn) and dropped when it says ``Connection: close`` (Snekbox).

It raises httpx's own exceptions (``ConnectError``, ``ReadTimeout``, ``RemoteProtocolError``
...), so that :class:`~snekbox_client.BalancingTransport` and the client tell failures apart as
they do with httpx's transport; httpx still builds the requests and decodes the answers.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

import httpx

__all__ = ["PlainHTTPTransport"]

#: The largest answer head read (status line and headers).
_MAX_HEAD_BYTES = 64 * 1024
#: The most bytes read from the socket at once.
_READ_BYTES = 64 * 1024


class _Connection:
    """One TCP connection: its streams, and when it went idle."""

    __slots__ = ("idle_since", "reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.idle_since = 0.0

    def usable(self, now: float, expiry: float) -> bool:
        """Whether an idle connection may carry another request: not expired, and not closed
        by the server meanwhile (its end of file, or an error, arrived while it was idle)."""
        reader = self.reader
        return (
            now - self.idle_since < expiry
            and not self.writer.is_closing()
            and not reader.at_eof()
            and reader.exception() is None
            and not reader._buffer  # type: ignore[attr-defined]  # bytes nobody asked for
        )

    def close(self) -> None:
        self.writer.close()


class PlainHTTPTransport(httpx.AsyncBaseTransport):
    """HTTP/1.1 over plain TCP to the host and port of each request's URL (one address).

    Args:
        limits: ``max_connections`` open at once (more wait, up to the request's ``pool``
            timeout), ``max_keepalive_connections`` kept idle for ``keepalive_expiry`` seconds.
    """

    def __init__(self, limits: httpx.Limits | None = None) -> None:
        limits = limits or httpx.Limits()
        self._slots = asyncio.Semaphore(limits.max_connections or 2**31)
        self._max_idle = limits.max_keepalive_connections or 0
        expiry = limits.keepalive_expiry
        self._expiry = float("inf") if expiry is None else expiry
        self._idle: deque[_Connection] = deque()
        self._closed = False

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        timeouts: dict[str, float | None] = request.extensions.get("timeout", {})
        try:
            await _within(self._slots.acquire(), timeouts.get("pool"))
        except TimeoutError:
            raise httpx.PoolTimeout("no connection came free in time", request=request) from None
        try:
            return await self._exchange(request, timeouts)
        except BaseException:
            self._slots.release()
            raise

    async def _exchange(
        self, request: httpx.Request, timeouts: dict[str, float | None]
    ) -> httpx.Response:
        body = await request.aread()
        head = [b"%s %s HTTP/1.1\r\n" % (request.method.encode(), request.url.raw_path)]
        head += [b"%s: %s\r\n" % pair for pair in request.headers.raw]
        head.append(b"\r\n")
        data = b"".join(head) + body
        connection = self._idle_connection()
        if connection is None:
            connection = await self._connect(request, timeouts.get("connect"))
        doing = "write"
        try:
            connection.writer.write(data)
            await _within(connection.writer.drain(), timeouts.get("write"))
            doing = "read"
            status, reason, version, headers = await _read_head(
                connection.reader, timeouts.get("read"), request
            )
            read = timeouts.get("read")
            stream = _Body(self, connection, request, headers, status, version, read)
        except BaseException as exc:
            connection.close()
            error = _transport_error(exc, request, doing)
            if error is exc:
                raise
            raise error from exc
        return httpx.Response(
            status,
            headers=headers,
            stream=stream,
            extensions={"http_version": version, "reason_phrase": reason},
        )

    def _idle_connection(self) -> _Connection | None:
        now = time.monotonic()
        while self._idle:
            connection = self._idle.pop()  # the most recent: the least likely to have expired
            if connection.usable(now, self._expiry):
                return connection
            connection.close()
        return None

    async def _connect(self, request: httpx.Request, seconds: float | None) -> _Connection:
        url = request.url
        try:
            reader, writer = await _within(
                asyncio.open_connection(url.host, url.port or 80, limit=_MAX_HEAD_BYTES), seconds
            )
        except TimeoutError:
            raise httpx.ConnectTimeout("connection timed out", request=request) from None
        except OSError as exc:
            raise httpx.ConnectError(str(exc) or type(exc).__name__, request=request) from exc
        return _Connection(reader, writer)

    def _release(self, connection: _Connection, reusable: bool) -> None:
        """A response is closed: its connection goes back idle, or is closed."""
        self._slots.release()
        if reusable and not self._closed and len(self._idle) < self._max_idle:
            connection.idle_since = time.monotonic()
            self._idle.append(connection)
        else:
            connection.close()

    async def aclose(self) -> None:
        self._closed = True
        while self._idle:
            self._idle.pop().close()


class _Body(httpx.AsyncByteStream):
    """An answer's body as it arrives; closing it releases its connection."""

    def __init__(
        self,
        transport: PlainHTTPTransport,
        connection: _Connection,
        request: httpx.Request,
        headers: list[tuple[bytes, bytes]],
        status: int,
        version: bytes,
        timeout: float | None,
    ) -> None:
        self._transport = transport
        self._connection: _Connection | None = connection
        self._request = request
        self._timeout = timeout
        self._done = False
        length: int | None = None
        chunked = False
        close = version != b"HTTP/1.1"
        for name, value in headers:
            name = name.lower()
            if name == b"content-length":
                try:
                    length = int(value)
                except ValueError:
                    raise httpx.RemoteProtocolError(
                        f"invalid Content-Length {value!r}", request=request
                    ) from None
            elif name == b"transfer-encoding":
                chunked = value.strip().lower().endswith(b"chunked")
            elif name == b"connection":
                tokens = {t.strip().lower() for t in value.split(b",")}
                close = b"close" in tokens or (close and b"keep-alive" not in tokens)
        if request.method == "HEAD" or status in (204, 304):
            length, chunked = 0, False
        self._length = None if chunked else length
        self._chunked = chunked
        # Without a length, the body ends with the connection, which then cannot be reused.
        self._reusable = not close and (chunked or length is not None)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        connection = self._connection
        if connection is None or self._done:
            return
        reader = connection.reader
        try:
            if self._chunked:
                async for chunk in self._chunks(reader):
                    yield chunk
            elif self._length is not None:
                left = self._length
                while left:
                    data = await self._read(reader.read(min(left, _READ_BYTES)))
                    if not data:
                        raise httpx.RemoteProtocolError(
                            "peer closed connection without sending complete message body",
                            request=self._request,
                        )
                    left -= len(data)
                    yield data
            else:
                while data := await self._read(reader.read(_READ_BYTES)):
                    yield data
        except (httpx.TransportError, GeneratorExit):
            self._reusable = False
            raise
        except BaseException as exc:
            self._reusable = False
            error = _transport_error(exc, self._request, "read")
            if error is exc:
                raise
            raise error from exc
        self._done = True

    async def _chunks(self, reader: asyncio.StreamReader) -> AsyncIterator[bytes]:
        while True:
            line = await self._read(reader.readuntil(b"\r\n"))
            try:
                size = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise httpx.RemoteProtocolError(
                    f"invalid chunk size {line[:40]!r}", request=self._request
                ) from None
            if size == 0:
                while await self._read(reader.readuntil(b"\r\n")) != b"\r\n":
                    pass  # trailers: none is read
                return
            while size:
                data = await self._read(reader.read(min(size, _READ_BYTES)))
                if not data:
                    raise asyncio.IncompleteReadError(b"", size)
                size -= len(data)
                yield data
            if await self._read(reader.readexactly(2)) != b"\r\n":
                raise httpx.RemoteProtocolError("a chunk does not end", request=self._request)

    async def _read(self, reading: Any) -> Any:
        try:
            return await _within(reading, self._timeout)
        except TimeoutError:
            raise httpx.ReadTimeout(
                "the answer did not come in time", request=self._request
            ) from None

    async def aclose(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            self._transport._release(connection, self._reusable and self._done)


async def _within(awaitable: Any, seconds: float | None) -> Any:
    """``await awaitable``, raising ``TimeoutError`` after ``seconds`` (``None``: never)."""
    if seconds is None:
        return await awaitable
    async with asyncio.timeout(seconds):
        return await awaitable


async def _read_head(
    reader: asyncio.StreamReader, seconds: float | None, request: httpx.Request
) -> tuple[int, bytes, bytes, list[tuple[bytes, bytes]]]:
    """The status, reason, HTTP version and headers of the answer (informational ones skipped)."""
    while True:
        try:
            head = await _within(reader.readuntil(b"\r\n\r\n"), seconds)
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
                "the answer's head is too long", request=request
            ) from None
        lines = head[:-4].split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            line = lines[0][:80]
            raise httpx.RemoteProtocolError(f"not an HTTP answer: {line!r}", request=request)
        status = int(parts[1])
        if 100 <= status < 200:  # 100 Continue and the like: the answer follows
            continue
        headers = []
        for line in lines[1:]:
            name, colon, value = line.partition(b":")
            if not colon or not name or name != name.strip():
                raise httpx.RemoteProtocolError(f"invalid header {line[:80]!r}", request=request)
            headers.append((name, value.strip()))
        return status, parts[2] if len(parts) > 2 else b"", parts[0], headers


def _transport_error(exc: BaseException, request: httpx.Request, doing: str) -> BaseException:
    """``exc`` as httpx would raise it: its own errors and cancellations as they are."""
    if isinstance(exc, httpx.TransportError | asyncio.CancelledError) or not isinstance(
        exc, Exception
    ):
        return exc
    if isinstance(exc, TimeoutError):
        late = httpx.WriteTimeout if doing == "write" else httpx.ReadTimeout
        return late("timed out", request=request)
    if isinstance(exc, asyncio.IncompleteReadError | asyncio.LimitOverrunError):
        return httpx.RemoteProtocolError("the server broke off the answer", request=request)
    if isinstance(exc, OSError):
        broken = httpx.WriteError if doing == "write" else httpx.ReadError
        return broken(str(exc) or type(exc).__name__, request=request)
    return exc
