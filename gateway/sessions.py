"""Bounded MCP sessions: at most ``limit`` open over both transports, the longest idle closed first.

A Streamable HTTP session lives in the mcp SDK's session manager until its client deletes it or
it has been idle for the idle timeout; an SSE session lives as long as its ``GET /sse`` stream.
Each holds memory (about 40 KiB), an SSE one also a connection. The SDK refuses new sessions
(503) once its cap is reached, so a flood of ``initialize`` requests would lock every new client
out until the flood's sessions expire. Here a new session instead closes the one that has been
idle the longest and has no call in flight; only when every open session is busy is it refused
(503). Busy sessions are few, since the gateway's admission bounds the calls at once.

:class:`SessionTable` keeps the count; :class:`StreamableSessions` (around the SDK's session
manager) and :class:`SseSessions` (middleware on the SSE routes) report to it.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
from prometheus_client import CollectorRegistry, Counter, Gauge
from starlette.datastructures import Headers, QueryParams
from starlette.types import ASGIApp, Message, Receive, Scope, Send

if TYPE_CHECKING:
    from mcp.server.streamable_http import StreamableHTTPServerTransport
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

__all__ = ["SessionTable", "SseSessions", "StreamableSessions"]

logger = logging.getLogger(__name__)

#: Requests an SSE session may have outstanding that are tracked; more are not counted (a client
#: that keeps that many unanswered is busy anyway).
_MAX_TRACKED_REQUESTS = 256


@dataclass(eq=False)
class _Session:
    """One open session: how to close it, whether it still exists, and how busy it is."""

    key: str
    close: Callable[[], None]
    alive: Callable[[], bool]
    #: Streamable HTTP: POSTs whose body has arrived and whose answer is not finished.
    posts: int = 0
    #: SSE: ids of requests POSTed whose response has not yet been sent on the stream.
    requests: set[str | int] = field(default_factory=set)
    last_active: float = field(default_factory=time.monotonic)

    @property
    def busy(self) -> bool:
        return bool(self.posts or self.requests)

    def touch(self) -> None:
        self.last_active = time.monotonic()


class SessionTable:
    """The open sessions of both transports, at most ``limit``, and who goes when it is full."""

    def __init__(self, limit: int, registry: CollectorRegistry | None = None) -> None:
        if limit < 1:
            raise ValueError("the session limit must be at least 1")
        self.limit = limit
        self._sessions: dict[str, _Session] = {}
        self._last_warning = -float("inf")
        self._evicted: Counter | None = None
        if registry is not None:
            self._evicted = Counter(
                "mcp_sessions_evicted",
                "Idle sessions closed to make room for a new one (MCP_MAX_SESSIONS reached)",
                registry=registry,
            )
            open_sessions = Gauge(
                "mcp_sessions_open", "MCP sessions open, both transports", registry=registry
            )
            open_sessions.set_function(self.__len__)

    def __len__(self) -> int:
        self._prune()
        return len(self._sessions)

    def get(self, key: str) -> _Session | None:
        return self._sessions.get(key)

    def admit(
        self, key: str, close: Callable[[], None], alive: Callable[[], bool]
    ) -> _Session | None:
        """Count a new session, closing idle ones to make room; ``None``: all are busy."""
        self._prune()
        while len(self._sessions) >= self.limit:
            if not self._evict_one():
                return None
        session = _Session(key, close, alive)
        self._sessions[key] = session
        return session

    def discard(self, session: _Session) -> None:
        if self._sessions.get(session.key) is session:
            del self._sessions[session.key]

    def _prune(self) -> None:
        for key in [key for key, session in self._sessions.items() if not session.alive()]:
            del self._sessions[key]

    def _evict_one(self) -> bool:
        idle = [session for session in self._sessions.values() if not session.busy]
        if not idle:
            return False
        victim = min(idle, key=lambda session: session.last_active)
        del self._sessions[victim.key]
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
            now - victim.last_active,
        )
        return True


def _too_many_sessions(limit: int) -> list[Message]:
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
        session_id = Headers(scope=scope).get("mcp-session-id")
        session = self._table.get(f"http:{session_id}") if session_id is not None else None
        if session is not None:
            await self._serve(session, scope, receive, send)
        elif session_id is None:
            await self._open(scope, receive, send)
        else:  # unknown, or on its way out: the SDK answers
            await self._app(scope, receive, send)

    async def _serve(self, session: _Session, scope: Scope, receive: Receive, send: Send) -> None:
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
        session: _Session | None = None
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
                        for answer in _too_many_sessions(self._table.limit):
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


_SESSION_ID = re.compile(rb"session_id=([0-9a-f]{32})")


class SseSessions:
    """Middleware counting the SSE sessions (one per ``GET sse_path`` stream) in the table.

    A stream is admitted when it sends its endpoint event (by then the request has passed the
    authentication and Host checks, so a refused request never closes anyone's session); if the
    table is full of busy sessions, it is answered 503 instead. A session is busy while a request
    it POSTed to ``message_path`` has not been answered on its stream. Closing a session ends
    its stream, as the client's own disconnection would.
    """

    def __init__(
        self,
        app: ASGIApp,
        table: SessionTable,
        sse_path: str = "/sse",
        message_path: str = "/messages/",
    ) -> None:
        self.app = app
        self._table = table
        self._sse_path = sse_path
        self._message_path = message_path

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == self._sse_path and scope["method"] == "GET":
            await self._stream(scope, receive, send)
        elif scope["type"] == "http" and scope["path"] == self._message_path:
            await self._message(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    async def _stream(self, scope: Scope, receive: Receive, send: Send) -> None:
        session: _Session | None = None
        start: Message | None = None
        refused = ended = False

        with anyio.CancelScope() as scope_of_stream:

            async def send_watching(message: Message) -> None:
                nonlocal session, start, refused, ended
                if refused:
                    return
                if message["type"] == "http.response.start" and message["status"] == 200:
                    start = message  # held back until the endpoint event says which session
                    return
                if start is not None and session is None:
                    found = _SESSION_ID.search(message.get("body", b""))
                    if found is not None:
                        session = self._admit(found.group(1).decode(), scope_of_stream)
                        if session is None:
                            refused = True
                            for answer in _too_many_sessions(self._table.limit):
                                await send(answer)
                            scope_of_stream.cancel()
                            return
                    await send(start)
                    start = None
                if session is not None and message["type"] == "http.response.body":
                    _answered(session, message.get("body", b""))
                    ended = not message.get("more_body", False)
                await send(message)

            try:
                await self.app(scope, receive, send_watching)
            finally:
                if session is not None:
                    self._table.discard(session)
        if scope_of_stream.cancelled_caught and session is not None and not refused and not ended:
            # Closed to make room: end the stream cleanly, so the client sees it finish.
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    def _admit(self, session_id: str, stream: anyio.CancelScope) -> _Session | None:
        session = self._table.admit(f"sse:{session_id}", stream.cancel, lambda: True)
        if session is None:
            logger.warning("refused a new session: all %d have a call in flight", self._table.limit)
        return session

    async def _message(self, scope: Scope, receive: Receive, send: Send) -> None:
        session_id = QueryParams(scope.get("query_string", b"").decode("latin-1")).get("session_id")
        session = self._table.get(f"sse:{session_id}") if session_id else None
        if session is None:
            await self.app(scope, receive, send)
            return
        session.touch()
        body = bytearray()
        noted: str | int | None = None
        accepted = False

        async def receive_noting() -> Message:
            nonlocal noted
            message = await receive()
            if message["type"] == "http.request":
                body.extend(message.get("body", b""))
                if not message.get("more_body", False):
                    # Noted before the SDK sees it: its answer may reach the stream before
                    # this POST's handler returns.
                    noted = _posted(session, bytes(body))
            return message

        async def send_watching(message: Message) -> None:
            nonlocal accepted
            if message["type"] == "http.response.start":
                accepted = message["status"] == 202
            await send(message)

        await self.app(scope, receive_noting, send_watching)
        if noted is not None and not accepted:  # refused: no answer will come
            session.requests.discard(noted)


def _posted(session: _Session, body: bytes) -> str | int | None:
    """Note a request the session POSTed (busy until answered), or forget a cancelled one.

    Returns the id of the request noted, if any.
    """
    try:
        message: Any = json.loads(body)
    except ValueError:
        return None
    if not isinstance(message, dict):
        return None
    if message.get("method") == "notifications/cancelled":
        params = message.get("params")
        if isinstance(params, dict) and isinstance(params.get("requestId"), str | int):
            session.requests.discard(params["requestId"])
        return None
    request_id = message.get("id")
    if "method" not in message or not isinstance(request_id, str | int):
        return None  # a notification, or a response to the server
    if len(session.requests) >= _MAX_TRACKED_REQUESTS:
        return None
    session.requests.add(request_id)
    return request_id


def _answered(session: _Session, chunk: bytes) -> None:
    """Forget the requests a chunk of the SSE stream answers."""
    if not session.requests:
        return
    for line in chunk.splitlines():
        if not line.startswith(b"data:"):
            continue
        try:
            message: Any = json.loads(line[len(b"data:") :])
        except ValueError:
            continue
        if isinstance(message, dict) and ("result" in message or "error" in message):
            answered = message.get("id")
            if isinstance(answered, str | int):
                session.requests.discard(answered)
                session.touch()
