"""SSE sessions counted in the :class:`~gateway.sessions.SessionTable`: one per ``GET /sse``.

An SSE session lives as long as its stream. :class:`SseSessions` admits it to the table when
the stream announces its endpoint, notes the requests it POSTs (busy until answered on the
stream), and ends the stream when the table closes the session to make room.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

import anyio
from starlette.datastructures import QueryParams
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .sessions import Session, SessionTable, too_many_sessions

__all__ = ["SseSessions"]

logger = logging.getLogger(__name__)

#: Requests an SSE session may have outstanding that are tracked; more are not counted (a client
#: that keeps that many unanswered is busy anyway).
_MAX_TRACKED_REQUESTS = 256
_SESSION_ID = re.compile(rb"session_id=([0-9a-f]{32})")
#: The SDK's answer to a message for a session it does not have.
_GONE = "Could not find session"


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
        session: Session | None = None
        start: Message | None = None
        refused = ended = False
        status: int | None = None

        with anyio.CancelScope() as scope_of_stream:

            async def send_watching(message: Message) -> None:
                nonlocal session, start, refused, ended, status
                if refused:
                    return
                if message["type"] == "http.response.start":
                    status = message["status"]
                if message["type"] == "http.response.start" and message["status"] == 200:
                    start = message  # held back until the endpoint event says which session
                    return
                if start is not None and session is None:
                    found = _SESSION_ID.search(message.get("body", b""))
                    if found is not None:
                        session = self._admit(found.group(1).decode(), scope_of_stream)
                        if session is None:
                            refused = True
                            for answer in too_many_sessions(self._table.limit):
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
            except ValueError:
                # The SDK answers a refused Host or Origin (421, 403), then raises, which would
                # log a traceback at ERROR for each such request: the client has its answer.
                if status not in (403, 421):
                    raise
            finally:
                if session is not None:
                    self._table.discard(session)
        if scope_of_stream.cancelled_caught and session is not None and not refused and not ended:
            # Closed to make room: end the stream cleanly, so the client sees it finish.
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    def _admit(self, session_id: str, stream: anyio.CancelScope) -> Session | None:
        session = self._table.admit(f"sse:{session_id}", stream.cancel, lambda: True)
        if session is None:
            logger.warning("refused a new session: all %d have a call in flight", self._table.limit)
        return session

    async def _message(self, scope: Scope, receive: Receive, send: Send) -> None:
        session_id = QueryParams(scope.get("query_string", b"").decode("latin-1")).get("session_id")
        session = self._table.get(f"sse:{session_id}") if session_id else None
        if session is None:
            await self._hand_over(scope, receive, send)
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

        await self._hand_over(scope, receive_noting, send_watching)
        if noted is not None and not accepted:  # refused: no answer will come
            session.requests.discard(noted)

    async def _hand_over(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The SDK's handling of a POSTed message, which ends by handing it to the session's
        stream, after the 202. A stream that ended meanwhile (its client closed it as it posted)
        is a closed channel: the message has nowhere to go. Raised out of the app, that would
        make uvicorn drop the connection, and with it the client's next request on it, and log
        the race as a server error; instead the POST is answered 404, as for any session that
        no longer exists, or, if its 202 has gone, left at that."""
        started = False

        async def send_noting(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, send_noting)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            logger.info("a message to an SSE session whose stream had just ended was dropped")
            if not started:
                await Response(_GONE, status_code=404)(scope, receive, send)


def _posted(session: Session, body: bytes) -> str | int | None:
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


def _answered(session: Session, chunk: bytes) -> None:
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
