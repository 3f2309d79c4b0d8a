"""A lean HTTP/1.1 transport for plain ``http`` to one address, on asyncio streams.

Each evaluation is one request on the gateway's critical path, and httpx's own transport
(httpcore, h11 and anyio, layer on layer) costs about 1.5 ms of CPU per request, more than the
rest of the gateway's call: Snekbox closes every connection after its answer, so each request
pays for opening one too. This transport does what those requests need and no more: one
``write`` per request, the answer's head parsed once, its body streamed (``Content-Length``,
chunked, or to the end of the connection), connections kept alive when the service allows
(the built-in evaluator under uvicorn) and dropped when it says ``Connection: close`` (Snekbox).
(h11 would parse the same answers for about 90 µs more per request: the framing rules it
enforces are enforced here, see :mod:`._http_head`.)

The service's answer is untrusted: its head is read and checked by :mod:`._http_head` (bounded
in size, fields and informational answers before it); its framing must be unambiguous (one
``Content-Length``, or ``Transfer-Encoding: chunked`` alone, which wins over a
``Content-Length`` but then the connection is not reused); its body reaches the caller in
pieces of at most :data:`_READ_BYTES`, each read within the request's ``read`` timeout (per
read, as httpx's: a server trickling bytes is bounded by the caller's own size and time
limits). A connection goes back to the pool only when its answer was read to its last byte,
nothing more came, and the server allows it; anything else (an error, a cancellation, a caller
that stops reading) closes it.

It raises httpx's own exceptions (``ConnectError``, ``ReadTimeout``, ``RemoteProtocolError``
...), so that :class:`~snekbox_client.BalancingTransport` and the client tell failures apart as
they do with httpx's transport; httpx still builds the requests and decodes the answers.
"""

from __future__ import annotations

import asyncio
import re
import select
import time
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

import httpx

from ._http_head import MAX_HEAD_BYTES, framing, read_head, within

__all__ = ["PlainHTTPTransport"]

#: The most bytes read from the socket at once.
_READ_BYTES = 64 * 1024

#: A chunk's size line: hex digits only (below 16**15), extensions after ``;`` ignored.
_CHUNK_SIZE = re.compile(rb"([0-9A-Fa-f]{1,15})[ \t]*(?:;[^\r\n]*)?\r\n")


def _buffered(reader: asyncio.StreamReader) -> bool:
    """Whether bytes nobody asked for wait in ``reader``.

    asyncio offers no public way to ask, so its buffer (a ``bytearray`` from 3.4 to 3.14) is
    read; should another Python not have it, the answer is yes: a connection is then never
    reused, which is slower but never hands a stray byte to the next request.
    """
    buffer = getattr(reader, "_buffer", None)
    return not isinstance(buffer, bytearray | bytes) or len(buffer) > 0


def _readable(writer: asyncio.StreamWriter) -> bool:
    """Whether the socket has something to read now: bytes, an end of file or an error."""
    sock = writer.get_extra_info("socket")
    if sock is None:  # not a socket's: the loop's own view has to do
        return False
    poller = select.poll()  # not select.select: a busy gateway's descriptors pass 1024
    poller.register(sock.fileno(), select.POLLIN)
    return bool(poller.poll(0))


class _Stale(Exception):
    """A kept-alive connection turned out closed before the request reached the service."""


class ResetUnread(httpx.ConnectError):
    """A new connection was reset before any byte of an answer: the service did not read the
    request (see :meth:`PlainHTTPTransport._send`). A proxy that resets its clients'
    connections itself could have forwarded it all the same, so it is not sent elsewhere."""


class _Connection:
    """One TCP connection: its streams, and when it went idle."""

    __slots__ = ("idle_since", "reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.idle_since = 0.0

    def usable(self, now: float, expiry: float) -> bool:
        """Whether an idle connection may carry another request: not expired, and not closed
        by the server meanwhile (its end of file, or an error, arrived while it was idle), and
        nothing came on it since its last answer.

        The socket itself is asked too: the event loop learns of an end of file only when it
        next polls, and a request written after the server died would be answered by a reset
        (see :meth:`PlainHTTPTransport._send` for the case no check can see).
        """
        reader = self.reader
        return (
            now - self.idle_since < expiry
            and not self.writer.is_closing()
            and not reader.at_eof()
            and reader.exception() is None
            and not _buffered(reader)
            and not _readable(self.writer)
        )

    def close(self) -> None:
        self.writer.close()


class PlainHTTPTransport(httpx.AsyncBaseTransport):
    """HTTP/1.1 over plain TCP to the host and port of each request's URL (one address).

    Args:
        limits: ``max_connections`` in use at once (more wait, up to the request's ``pool``
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
            await within(self._slots.acquire(), timeouts.get("pool"))
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
        if connection is not None:
            try:
                return await self._send(connection, request, data, timeouts, kept=True)
            except _Stale:
                pass  # the request never reached the service: sent once more, as a new one's
        connection = await self._connect(request, timeouts.get("connect"))
        return await self._send(connection, request, data, timeouts, kept=False)

    async def _send(
        self,
        connection: _Connection,
        request: httpx.Request,
        data: bytes,
        timeouts: dict[str, float | None],
        *,
        kept: bool,
    ) -> httpx.Response:
        """Write ``data`` on ``connection`` and read the answer's head.

        A reset before any byte of an answer means the server's socket closed with the
        request unread (a server that read the whole request and then died closes with an end
        of file: "the code may have run"). On a kept-alive connection, the server had left
        while the idle check could not yet tell (its end of file not yet through the kernel,
        or its socket briefly held by a child being spawned). On a new one, the listening
        socket outlived the server for a moment, held the same way by a child not yet
        exec'd, and took the connection into its backlog. This holds for the server's own
        socket, or a proxy that passes closes on as they come, not one that resets its
        clients' connections itself (see docs/operations.md).

        Raises:
            _Stale: ``kept``, and the connection was reset before any byte of an answer came.
            ResetUnread: not ``kept``, and the same: the request did not reach the service,
                as if the connection had been refused.
        """
        doing = "write"
        try:
            connection.writer.write(data)
            await within(connection.writer.drain(), timeouts.get("write"))
            doing = "read"
            read = timeouts.get("read")
            status, reason, version, headers = await read_head(connection.reader, read, request)
            length, chunked, reusable = framing(request, status, version, headers)
            stream = _Body(self, connection, request, length, chunked, reusable, read)
            return httpx.Response(
                status,
                headers=headers,
                stream=stream,
                extensions={"http_version": version, "reason_phrase": reason},
            )
        except BaseException as exc:
            connection.close()
            if isinstance(exc, ConnectionResetError | BrokenPipeError) and not _buffered(
                connection.reader
            ):
                if kept:
                    raise _Stale from exc
                unread = f"the connection was reset with the request unread: {exc}"
                raise ResetUnread(unread, request=request) from exc
            error = _transport_error(exc, request, doing)
            if error is exc:
                raise
            raise error from exc

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
            reader, writer = await within(
                asyncio.open_connection(url.host, url.port or 80, limit=MAX_HEAD_BYTES), seconds
            )
        except TimeoutError:
            raise httpx.ConnectTimeout("connection timed out", request=request) from None
        except OSError as exc:
            raise httpx.ConnectError(str(exc) or type(exc).__name__, request=request) from exc
        return _Connection(reader, writer)

    def _release(self, connection: _Connection, reusable: bool) -> None:
        """A response is closed: its connection goes back idle, or is closed."""
        self._slots.release()
        if (
            reusable
            and not self._closed
            and len(self._idle) < self._max_idle
            and not _buffered(connection.reader)  # more than the answer came: not HTTP
        ):
            connection.idle_since = time.monotonic()
            self._idle.append(connection)
        else:
            connection.close()

    async def aclose(self) -> None:
        self._closed = True
        while self._idle:
            self._idle.pop().close()


class _Body(httpx.AsyncByteStream):
    """An answer's body as it arrives; closing it releases its connection, kept only if the
    body was read to its end (``_done``) and the server allows it."""

    def __init__(
        self,
        transport: PlainHTTPTransport,
        connection: _Connection,
        request: httpx.Request,
        length: int | None,
        chunked: bool,
        reusable: bool,
        timeout: float | None,
    ) -> None:
        self._transport = transport
        self._connection: _Connection | None = connection
        self._request = request
        self._length = length
        self._chunked = chunked
        self._reusable = reusable
        self._timeout = timeout
        self._done = length == 0

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
                            "peer closed connection without sending complete message body "
                            f"(received {self._length - left} bytes, expected {self._length})",
                            request=self._request,
                        )
                    left -= len(data)
                    # Every byte read: the connection may carry another request even if the
                    # caller stops here.
                    self._done = not left
                    yield data
            else:
                while data := await self._read(reader.read(_READ_BYTES)):
                    yield data
        except BaseException as exc:
            error = _transport_error(exc, self._request, "read")
            if error is exc:
                raise
            raise error from exc
        self._done = True

    async def _chunks(self, reader: asyncio.StreamReader) -> AsyncIterator[bytes]:
        while True:
            line = await self._read(reader.readuntil(b"\r\n"))
            match = _CHUNK_SIZE.fullmatch(line)
            if match is None:
                raise httpx.RemoteProtocolError(
                    f"invalid chunk size line {line[:40]!r}", request=self._request
                )
            size = int(match[1], 16)
            if size == 0:
                break
            while size:
                data = await self._read(reader.read(min(size, _READ_BYTES)))
                if not data:
                    raise httpx.RemoteProtocolError(
                        "peer closed connection without sending complete message body "
                        "(incomplete chunked read)",
                        request=self._request,
                    )
                size -= len(data)
                yield data
            if await self._read(reader.readexactly(2)) != b"\r\n":
                raise httpx.RemoteProtocolError(
                    "a chunk does not end with CRLF", request=self._request
                )
        trailers = 0  # read and dropped, within the bounds of a head
        while (line := await self._read(reader.readuntil(b"\r\n"))) != b"\r\n":
            trailers += len(line)
            if trailers > MAX_HEAD_BYTES:
                raise httpx.RemoteProtocolError(
                    f"the answer's trailers are longer than {MAX_HEAD_BYTES} bytes",
                    request=self._request,
                )

    async def _read(self, reading: Any) -> Any:
        try:
            return await within(reading, self._timeout)
        except TimeoutError:
            raise httpx.ReadTimeout(
                "the answer did not come in time", request=self._request
            ) from None

    async def aclose(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            self._transport._release(connection, self._reusable and self._done)


def _transport_error(exc: BaseException, request: httpx.Request, doing: str) -> BaseException:
    """``exc`` as httpx would raise it: its own errors and cancellations as they are."""
    if isinstance(exc, httpx.TransportError | asyncio.CancelledError) or not isinstance(
        exc, Exception
    ):
        return exc
    if isinstance(exc, TimeoutError):
        late = httpx.WriteTimeout if doing == "write" else httpx.ReadTimeout
        return late("timed out", request=request)
    if isinstance(exc, asyncio.IncompleteReadError):
        return httpx.RemoteProtocolError(
            "peer closed connection without sending complete message body", request=request
        )
    if isinstance(exc, asyncio.LimitOverrunError):
        return httpx.RemoteProtocolError(
            f"a line of the answer is longer than {MAX_HEAD_BYTES} bytes", request=request
        )
    if isinstance(exc, OSError):
        broken = httpx.WriteError if doing == "write" else httpx.ReadError
        return broken(str(exc) or type(exc).__name__, request=request)
    return exc
