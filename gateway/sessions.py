"""Bounded MCP sessions: at most ``limit`` open over both transports, the longest idle closed first.

A Streamable HTTP session lives in the mcp SDK's session manager until its client deletes it or
it has been idle for the idle timeout; an SSE session lives as long as its ``GET /sse`` stream.
Each holds memory (about 40 KiB), an SSE one also a connection. The SDK refuses new sessions
(503) once its cap is reached, so a flood of ``initialize`` requests would lock every new client
out until the flood's sessions expire. Here a new session instead closes the one that has been
idle the longest and has no call in flight; only when every open session is busy is it refused
(503). Busy sessions are few, since the gateway's admission bounds the calls at once. Who
goes is the shared bounded table's rule (:mod:`serving.table`), with every session in one group.

:class:`SessionTable` keeps the count; :class:`StreamableSessions` (around the SDK's session
manager) and :class:`~gateway.sse_sessions.SseSessions` (middleware on the SSE routes) report
to it.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from mcp.types.version import HANDSHAKE_PROTOCOL_VERSIONS
from prometheus_client import CollectorRegistry, Counter, Gauge
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from serving import BoundedTable, TableFull

if TYPE_CHECKING:
    from mcp.server.streamable_http import StreamableHTTPServerTransport
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

__all__ = ["Session", "SessionTable", "StreamableSessions", "too_many_sessions"]

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class Session:
    """One open session: how to close it, whether it still exists, and how busy it is."""

    key: str
    close: Callable[[], None]
    alive: Callable[[], bool]
    #: Streamable HTTP: POSTs whose body has arrived and whose answer is not finished.
    posts: int = 0
    #: SSE: ids of requests POSTed whose response has not yet been sent on the stream
    #: (:mod:`gateway.sse_sessions`).
    requests: set[str | int] = field(default_factory=set)
    last_used: float = field(default_factory=time.monotonic)
    #: Marks it used in its table (set by the table that admits it).
    _used: Callable[[], None] | None = field(default=None, repr=False)

    @property
    def busy(self) -> bool:
        return bool(self.posts or self.requests)

    def touch(self) -> None:
        if self._used is not None:
            self._used()
        else:
            self.last_used = time.monotonic()


class SessionTable:
    """The open sessions of both transports, at most ``limit``, and who goes when it is full."""

    def __init__(self, limit: int, registry: CollectorRegistry | None = None) -> None:
        if limit < 1:
            raise ValueError("the session limit must be at least 1")
        self.limit = limit
        self._sessions: BoundedTable[Session] = BoundedTable(limit, busy=lambda s: s.busy)
        self._last_warning = -float("inf")
        self._evicted: Counter | None = None
        if registry is not None:
            self._evicted = Counter(
                "mcp_sessions_evicted",
                "Idle sessions closed to make room for a new one "
                "(MCP_MAX_TRANSPORT_SESSIONS reached)",
                registry=registry,
            )
            open_sessions = Gauge(
                "mcp_sessions_open", "MCP sessions open, both transports", registry=registry
            )
            open_sessions.set_function(self.__len__)

    def __len__(self) -> int:
        self._prune()
        return len(self._sessions)

    def get(self, key: str) -> Session | None:
        return self._sessions.get(key)

    def admit(
        self, key: str, close: Callable[[], None], alive: Callable[[], bool]
    ) -> Session | None:
        """Count a new session, closing idle ones to make room; ``None``: all are busy."""
        self._prune()
        try:
            while (victim := self._sessions.to_close()) is not None:
                self._evict(victim)
        except TableFull:
            return None
        session = Session(key, close, alive)
        session._used = lambda: self._sessions.touch(session, key)
        self._sessions.add(key, session)
        return session

    def discard(self, session: Session) -> None:
        if self._sessions.get(session.key) is session:
            self._sessions.pop(session.key)

    def _prune(self) -> None:
        for key in [session.key for session in self._sessions if not session.alive()]:
            self._sessions.pop(key)

    def _evict(self, key: str) -> None:
        victim = self._sessions.pop(key)
        victim.close()
        if self._evicted is not None:
            self._evicted.inc()
        now = time.monotonic()
        log = logger.debug
        if now - self._last_warning > 60:  # a flood must not flood the log
            self._last_warning, log = now, logger.warning
        log(
            "%d sessions are open (the maximum): closed %s, idle for %.1f s, to make room",
            self.limit,
            victim.key,
            now - victim.last_used,
        )


def too_many_sessions(limit: int) -> list[Message]:
    """The 503 of a refused session: a JSON-RPC error, as the SDK words its own."""
    error = {
        "jsonrpc": "2.0",
        "id": None,
        "error": {
            "code": -32603,
            "message": f"Too many open sessions: all {limit} have a call in flight. "
            "Retry in a few seconds.",
        },
    }
    body = json.dumps(error).encode()
    return [
        {
            "type": "http.response.start",
            "status": 503,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"retry-after", b"1"),
            ],
        },
        {"type": "http.response.body", "body": body},
    ]


class StreamableSessions:
    """Wraps the SDK's session manager so that its sessions are counted in a :class:`SessionTable`.

    Install it with :meth:`install` after ``streamable_http_app()``; the SDK's own cap should
    then be above the table's (it counts evicted sessions until their tasks have wound down).
    A session is busy while a POST of it is being answered (once its body has arrived, so a slow
    sender does not make it busy); a standalone GET stream does not make it busy.
    """

    def __init__(
        self, manager: StreamableHTTPSessionManager, app: ASGIApp, table: SessionTable
    ) -> None:
        self._manager = manager
        self._app = app
        self._table = table

    @classmethod
    def install(cls, manager: StreamableHTTPSessionManager, table: SessionTable) -> None:
        """Count ``manager``'s sessions in ``table`` (the manager needs an idle timeout).

        Raises:
            ValueError: the manager has no idle timeout, so a session could not be closed.
        """
        if manager.session_idle_timeout is None:
            raise ValueError("bounded sessions need the session manager's idle timeout")
        # The manager's routes call ``manager.asgi_app``: the SDK's body limit, which reads the
        # whole body before it calls the manager. Inside it, a POST seen is one fully arrived.
        limit = manager.asgi_app
        limit.app = cls(manager, limit.app, table)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = Headers(scope=scope)
        session_id = headers.get("mcp-session-id")
        session = self._table.get(f"http:{session_id}") if session_id is not None else None
        if session is not None:
            await self._serve(session, scope, receive, send)
        elif session_id is None and _sessionless(headers.get("mcp-protocol-version")):
            await self._app(scope, receive, send)  # no session to count: nothing to watch for
        elif session_id is None:
            await self._open(scope, receive, send)
        else:  # unknown, or on its way out: the SDK answers
            await self._app(scope, receive, send)

    async def _serve(self, session: Session, scope: Scope, receive: Receive, send: Send) -> None:
        session.touch()
        if scope["method"] != "POST":
            await self._app(scope, receive, send)
            session.touch()
            return
        session.posts += 1
        try:
            await self._app(scope, receive, send)
        finally:
            session.posts -= 1
            session.touch()

    async def _open(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A request without a session id; if the SDK opens a session for it, count that one.

        It is counted when the SDK's answer starts (so only a request the SDK accepted can
        close anyone's session); if every counted session is busy, the new one is closed again
        and the answer replaced by a 503.
        """
        session: Session | None = None
        refused = False

        async def send_registering(message: Message) -> None:
            nonlocal session, refused
            if refused:
                return
            if message["type"] == "http.response.start" and message["status"] < 400:
                session_id = Headers(raw=message.get("headers", [])).get("mcp-session-id")
                # The SDK keeps no public map of its sessions: its transport is needed to
                # close one.
                transport = self._manager._server_instances.get(session_id or "")
                if session_id is not None and transport is not None:
                    key, close = f"http:{session_id}", _closer(transport)
                    session = self._table.admit(key, close, _liveness(self._manager, session_id))
                    if session is None:
                        refused = True
                        close()
                        logger.warning(
                            "refused a new session: all %d have a call in flight",
                            self._table.limit,
                        )
                        for answer in too_many_sessions(self._table.limit):
                            await send(answer)
                        return
                    session.posts += 1  # the opening request, until its answer is complete
            await send(message)

        try:
            await self._app(scope, receive, send_registering)
        finally:
            if session is not None:
                session.posts -= 1
                session.touch()


def _sessionless(protocol_version: str | None) -> bool:
    """Whether a request names a protocol revision without sessions (2026-07-28 and later).

    The SDK's own routing: a version it does not know as a handshake revision goes to its
    single-exchange entry, which never opens a session.
    """
    return protocol_version is not None and protocol_version not in HANDSHAKE_PROTOCOL_VERSIONS


def _closer(transport: StreamableHTTPServerTransport) -> Callable[[], None]:
    def close() -> None:
        # The same path as the SDK's idle timeout: the session's loop ends and the SDK
        # discards the session and terminates its transport (closing any GET stream).
        # (It exists: the manager has an idle timeout and the session's loop has started.)
        if transport.idle_scope is not None:
            transport.idle_scope.cancel()

    return close


def _liveness(manager: StreamableHTTPSessionManager, session_id: str) -> Callable[[], bool]:
    def alive() -> bool:
        transport = manager._server_instances.get(session_id)
        if transport is None or transport.is_terminated:
            return False
        return transport.idle_scope is None or not transport.idle_scope.cancel_called

    return alive
