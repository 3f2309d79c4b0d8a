"""How both services are served: uvicorn's HTTP/1.1 protocol with a header deadline and a cap,
each answer written in one piece.

Left to itself, uvicorn waits forever for a request's headers (a client that sends half a
request line and stalls holds its socket for good) and accepts every connection, so enough slow
clients exhaust the process's file descriptors. :class:`GuardedH11Protocol` adds both bounds
at the protocol level, the only place where a request that never finishes its headers is seen:

- a connection must deliver a complete request head within ``header_timeout`` seconds of
  opening, and on a kept-alive connection, of the next request's first byte; otherwise it is
  answered 408 (or, if it sent nothing at all, just closed). The same holds for bytes of a body
  that trickle in after the answer (the app did not read them);
- while ``max_connections`` connections are open, a new one closes the one idle the longest
  (see :meth:`GuardedH11Protocol.idle`), or, with none, is answered 503 and closed at once.

An idle kept-alive connection is closed after :data:`KEEP_ALIVE_TIMEOUT` seconds by default
(uvicorn's ``timeout_keep_alive``). So that a client that leaves its idle connections open holds
no room a new client needs, one idle at least :data:`IDLE_BEFORE_ROOM` seconds is closed for it.

h11 bounds an unfinished request head too: past :data:`MAX_HEAD_BYTES` the request is answered
400 and its connection closed.

uvicorn writes an answer's head as soon as the app starts it and its body when the app sends
it: two writes, so a client in another process wakes for the head, reads it, sleeps, and wakes
again for the body. :class:`_OneWrite` joins the writes of one turn of the event loop into one
(0.15 ms less per answer, measured here on a bare Starlette app, requests 0.1 s apart).

The request body is bounded separately, by :class:`serving.deadline.RequestDeadline`, which works
however the app is served. Both services pass :func:`guarded_protocol` to uvicorn as ``http=``;
under the uvicorn CLI, ``--http serving.protocol:GuardedH11Protocol`` gives the defaults.

h11 rather than httptools, though httptools costs a quarter less CPU per request: under uvicorn
0.54 with httptools 0.9 (tried here), a request carrying ``Upgrade`` (as Java's HttpClient
sends for h2c) has its body skipped and then parsed as a request of its own, and chunked
trailers are not bounded. uvicorn's ``auto`` picks httptools when it is installed; naming the
class keeps h11 everywhere.

asyncio's own event loop rather than uvloop, which uvicorn's ``auto`` would pick if installed:
tried with uvloop 0.23, a gateway's CPU per ``print(1)`` call stayed the same (2.53 against 2.59
ms over Streamable HTTP, 2.70 against 2.73 over SSE, ``bench/bench_gateway_cpu.py`` with uvloop
hidden from one of two gateways, side by side in one run): the time is spent in the Python above
the loop, and a dependency that changes nothing is not worth carrying.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any, ClassVar, cast

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol, RequestResponseCycle

__all__ = [
    "IDLE_BEFORE_ROOM",
    "KEEP_ALIVE_TIMEOUT",
    "MAX_HEAD_BYTES",
    "GuardedH11Protocol",
    "guarded_protocol",
]

logger = logging.getLogger(__name__)

#: The longest unfinished request head (line and fields) read (h11's default too).
MAX_HEAD_BYTES = 16 * 1024
#: Seconds both services keep an idle kept-alive connection by default: longer than clients
#: keep theirs (httpx 5 s, a gateway 4 s), so that no request is sent on one being closed, which
#: with uvicorn's own 5 s failed now and then; and than a proxy's (ALB, ingress-nginx: 60 s).
KEEP_ALIVE_TIMEOUT = 75
#: Seconds a connection must have been idle to be closed for a new one at the cap: uvicorn's own
#: keep-alive, which no client reuses a connection past (httpx 5 s), so none is cut that the old
#: default would have kept, nor any a client is about to send on.
IDLE_BEFORE_ROOM = 5.0
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

    Everything else is the wrapped transport's; closing it, or ending its writing side, first
    writes what waits.
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

    def writelines(self, lines: Iterable[bytes]) -> None:
        for data in lines:
            self.write(data)

    def flush(self) -> None:
        if self._waiting:
            data = b"".join(self._waiting)
            self._waiting.clear()
            self._size = 0
            if not self._transport.is_closing():
                self._transport.write(data)

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

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


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol, bounding the wait for each request head and the open connections,
    writing each answer in one piece.

    The bounds are class attributes, so that uvicorn, which instantiates the class itself, can be
    given a configured subclass (see :func:`guarded_protocol`).
    """

    #: Seconds a connection may take to send a complete request head (line and headers).
    header_timeout: ClassVar[float] = 20.0
    #: Connections open at once; one more closes one idle, else is answered 503 and closed.
    max_connections: ClassVar[int] = 512

    _refused = False
    _deadline: asyncio.TimerHandle | None = None
    #: The request cycle current when the deadline was armed: a new one means a head arrived.
    _waiting_after: RequestResponseCycle | None = None
    _heard = False
    #: An answer is complete: the next request's deadline starts with its first byte (until
    #: then the connection is idle, and uvicorn's keep-alive timeout closes it).
    _kept_alive = False
    #: When the last answer was complete (the loop's clock).
    _answered_at = 0.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The bound on a head is this module's, whatever uvicorn was configured with.
        self.conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if len(self.connections) >= self.max_connections and not self._close_longest_idle():
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

    def on_response_complete(self) -> None:
        self._disarm()
        self._kept_alive = True
        self._answered_at = self.loop.time()
        super().on_response_complete()

    def idle(self, now: float) -> bool:
        """Whether the connection may be closed for a new one: its answer complete and sent at
        least :data:`IDLE_BEFORE_ROOM` seconds ago, nothing of another request received since
        (nor of one pipelined before), and the client not still sending a refused body."""
        return (
            self._kept_alive
            and now - self._answered_at >= IDLE_BEFORE_ROOM
            and self.cycle.response_complete
            and self.conn.their_state is h11.IDLE
            and not self.conn.trailing_data[0]
            # Unsent bytes would hold the socket open after close(), still counted.
            and not self.transport.get_write_buffer_size()
            and not self.transport.is_closing()
        )

    def _close_longest_idle(self) -> bool:
        """Close the connection idle the longest since its answer, to make room for this one;
        whether there was one."""
        now = self.loop.time()
        idle = [c for c in self.connections if isinstance(c, GuardedH11Protocol) and c.idle(now)]
        if not idle:
            return False
        longest = min(idle, key=lambda connection: connection._answered_at)
        logger.debug(
            "closing the connection idle the longest (%.1f s) for a new one: %d are open",
            now - longest._answered_at,
            len(self.connections),
        )
        longest.transport.close()
        return True

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


def guarded_protocol(*, header_timeout: float, max_connections: int) -> type[GuardedH11Protocol]:
    """A :class:`GuardedH11Protocol` subclass with these bounds, to pass as uvicorn's ``http=``.

    Raises:
        ValueError: a bound that is not positive.
    """
    if not header_timeout > 0 or max_connections < 1:
        raise ValueError("header_timeout must be positive and max_connections at least 1")
    attributes = {"header_timeout": header_timeout, "max_connections": max_connections}
    return cast(
        "type[GuardedH11Protocol]",
        type("GuardedH11Protocol", (GuardedH11Protocol,), attributes),
    )
