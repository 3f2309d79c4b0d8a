"""How both services are served: uvicorn's HTTP/1.1 protocol on httptools, bounded, each answer
written in one piece.

Left to itself, uvicorn waits forever for a request's headers (a client that sends half a
request line and stalls holds its socket for good) and accepts every connection, so enough slow
clients exhaust the process's file descriptors. :class:`GuardedHttpProtocol` adds both bounds
at the protocol level, the only place where a request that never finishes its headers is seen:

- a connection must deliver a complete request head within ``header_timeout`` seconds of
  opening, and on a kept-alive connection, of the next request's first byte; otherwise it is
  answered 408 (or, if it sent nothing at all, just closed). The same holds for bytes of a body
  that trickle in after the answer (the app did not read them);
- a request head (its line and fields) still unfinished after :data:`MAX_HEAD_BYTES` have
  arrived is answered 431 and its connection closed: the parser holds an unfinished head whole
  (as h11 did, a longer head that arrives whole in one read, at most 256 KiB, is parsed);
- while ``max_connections`` connections are open, a new one is answered 503 and closed at once.

httptools (llhttp, in C) rather than h11 (pure Python): on these machines a request served
after an idle pause cost the server 1.1 ms of CPU with h11 and 0.86 ms with httptools, and
every call of the gateway is one such request, and one more to the evaluator behind it.

uvicorn writes an answer's head as soon as the app starts it and its body when the app sends
it: two writes, so the client wakes for the head, reads it, sleeps, and wakes again for the
body. :class:`_OneWrite` joins the writes of one turn of the event loop into one (0.15 ms less
per answer here).

The request body is bounded separately, by :class:`serving.deadline.RequestDeadline`, which works
however the app is served. Both services pass :func:`guarded_protocol` to uvicorn as ``http=``;
under the uvicorn CLI, ``--http serving.protocol:GuardedHttpProtocol`` gives the defaults.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, ClassVar, cast

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = ["MAX_HEAD_BYTES", "GuardedHttpProtocol", "guarded_protocol"]

logger = logging.getLogger(__name__)

#: The longest request head (line and fields) read; h11, uvicorn's other parser, allows as much.
MAX_HEAD_BYTES = 16 * 1024
#: Bytes waiting to be joined with the next write of the same turn, at most: more go at once,
#: so that an app writing without pause meets the transport's own flow control.
_JOINED_BYTES = 64 * 1024


def _plain_response(status: bytes, text: str, extra: bytes = b"") -> bytes:
    body = text.encode()
    return (
        b"HTTP/1.1 "
        + status
        + b"\r\ncontent-type: text/plain; charset=utf-8\r\n"
        + extra
        + b"connection: close\r\ncontent-length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )


class _OneWrite:
    """A transport whose writes within one turn of the event loop go out as one.

    Everything else is the wrapped transport's; closing it first writes what waits.
    """

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._waiting: list[bytes] = []
        self._size = 0

    def write(self, data: bytes) -> None:
        if not self._waiting:
            self._loop.call_soon(self.flush)
        self._waiting.append(data)
        self._size += len(data)
        if self._size >= _JOINED_BYTES:
            self.flush()

    def flush(self) -> None:
        if self._waiting:
            data = b"".join(self._waiting)
            self._waiting.clear()
            self._size = 0
            if not self._transport.is_closing():
                self._transport.write(data)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._waiting.clear()
        self._size = 0
        self._transport.abort()

    def get_write_buffer_size(self) -> int:
        return self._size + self._transport.get_write_buffer_size()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class GuardedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, bounding the wait for each request head, its length and
    the open connections, and writing each answer in one piece.

    The bounds are class attributes, so that uvicorn, which instantiates the class itself, can be
    given a configured subclass (see :func:`guarded_protocol`).
    """

    #: Seconds a connection may take to send a complete request head (line and headers).
    header_timeout: ClassVar[float] = 20.0
    #: Connections open at once; one more is answered 503 and closed.
    max_connections: ClassVar[int] = 512

    _refused = False
    _deadline: asyncio.TimerHandle | None = None
    #: The request cycle current when the deadline was armed: a new one means a head arrived.
    _waiting_after: object = None
    _heard = False
    #: An answer is complete: the next request's deadline starts with its first byte (until
    #: then the connection is idle, and uvicorn's keep-alive timeout closes it).
    _kept_alive = False
    #: Bytes received while a request head is incomplete (``None``: no head is being read).
    #: Whole reads are counted, so a read that ends one request and starts the next counts
    #: the end of the first too: more than the head, never less.
    _head_bytes: int | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if len(self.connections) >= self.max_connections:
            self._refused = True
            self.transport = transport
            logger.warning(
                "refusing a connection: %d are open (the maximum)", len(self.connections)
            )
            transport.write(
                _plain_response(
                    b"503 Service Unavailable",
                    f"Too many connections ({self.max_connections} are open); retry shortly.\n",
                    b"retry-after: 1\r\n",
                )
            )
            transport.close()
            return
        super().connection_made(cast("asyncio.Transport", _OneWrite(transport, self.loop)))
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._refused:
            return
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if self._kept_alive:
            self._kept_alive = False
            self._arm()
        self._heard = True
        super().data_received(data)
        if self._head_bytes is None:
            return
        self._head_bytes += len(data)
        if self._head_bytes > MAX_HEAD_BYTES and not self.transport.is_closing():
            self._disarm()
            self.transport.write(
                _plain_response(
                    b"431 Request Header Fields Too Large",
                    f"The request head is longer than {MAX_HEAD_BYTES} bytes.\n",
                )
            )
            self.transport.close()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_bytes = 0

    def on_headers_complete(self) -> None:
        self._head_bytes = None
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        self._disarm()
        self._kept_alive = True
        super().on_response_complete()

    def _arm(self) -> None:
        self._disarm()
        self._waiting_after = self.cycle
        self._heard = False
        self._deadline = self.loop.call_later(self.header_timeout, self._head_is_late)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _head_is_late(self) -> None:
        self._deadline = None
        if self.cycle is not self._waiting_after or self.transport.is_closing():
            return  # a request head arrived in time
        if self._heard:
            self.transport.write(
                _plain_response(
                    b"408 Request Timeout",
                    f"The request headers did not arrive within {self.header_timeout:g} s.\n",
                )
            )
        self.transport.close()


def guarded_protocol(*, header_timeout: float, max_connections: int) -> type[GuardedHttpProtocol]:
    """A :class:`GuardedHttpProtocol` subclass with these bounds, to pass as uvicorn's ``http=``.

    Raises:
        ValueError: a bound that is not positive.
    """
    if not header_timeout > 0 or max_connections < 1:
        raise ValueError("header_timeout must be positive and max_connections at least 1")
    attributes = {"header_timeout": header_timeout, "max_connections": max_connections}
    return cast(
        "type[GuardedHttpProtocol]",
        type("GuardedHttpProtocol", (GuardedHttpProtocol,), attributes),
    )
