"""The open code sessions of a gateway: created, found, ended, expired, and the fair rules by
which a new session makes room (see the package's docstring)."""

from __future__ import annotations

import secrets
from collections import OrderedDict
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge

from serving import BoundedTable, TableFull

from ..handles import SessionHandles
from .session import CodeSession, Ending, SessionGone, SessionsBusy

__all__ = ["CodeSessions"]

#: Ended sessions remembered, so that a call naming one says how it ended.
_REMEMBERED = 10_000


class CodeSessions:
    """The open sessions of this gateway, with their limits and metrics."""

    def __init__(
        self,
        *,
        max_sessions: int,
        per_client: int | None = None,
        idle_timeout: float,
        registry: CollectorRegistry,
        on_close: Callable[[CodeSession, Ending | None], None] | None = None,
        handles: SessionHandles | None = None,
        named_clients: bool = False,
    ) -> None:
        self._table: BoundedTable[CodeSession] = BoundedTable(max_sessions, _running)
        #: Sessions one client may hold (``None``: three quarters of the cap, rounded up).
        self.per_client = per_client
        self.handles = handles or SessionHandles()
        self.idle_timeout = idle_timeout
        #: Called with each session that closes and why (``None``: its first call failed):
        #: its interpreter is to end too.
        self.on_close = on_close
        self._ended: OrderedDict[str, Ending] = OrderedDict()
        self._open_gauge = Gauge(
            "mcp_code_sessions_open", "Code sessions open now", registry=registry
        )
        self._open_gauge.set_function(self._count_open)
        self.created = Counter(
            "mcp_code_sessions_created", "Code sessions started", registry=registry
        )
        #: Clients named by their tokens are counted by name (without tokens, MCP connections
        #: are not: there would be a label per connection).
        self.named_clients = named_clients
        self._by_client = Gauge(
            "mcp_code_sessions_open_by_client",
            "Code sessions open now, by the client's token name",
            ["client"],
            registry=registry,
        )
        self.ended = Counter(
            "mcp_code_sessions_closed",
            "Code sessions closed, by why: ended (by the client), expired (idle), evicted (cap)",
            ["why"],
            registry=registry,
        )
        for why in ("ended", "expired", "evicted"):
            self.ended.labels(why)

    def __iter__(self) -> Iterator[CodeSession]:
        """The open sessions, least recently used first."""
        return iter(self._table)

    def create(self, owner: str | None, client: str | None = None) -> CodeSession:
        """A new session of ``owner``, counted in ``client``'s share; at a cap, idle sessions
        close first to make room (see :meth:`_make_room`).

        Raises:
            SessionsBusy: no idle session can make room.
        """
        handle = self.handles.issue(owner, None)
        session = self._add(CodeSession(handle.text, owner, handle.name, client))
        self.created.inc()
        return session

    def get(
        self,
        session_id: str,
        owner: str | None,
        *,
        adopt: bool = False,
        client: str | None = None,
    ) -> CodeSession:
        """The open session ``session_id`` of ``owner``, now marked used. With ``adopt``, a
        session this gateway never saw whose handle is valid for ``owner`` (another gateway
        with the same secret started it) is taken on: live, on the replica it names.

        Raises:
            SessionGone: no such open session of this owner (another owner's is "unknown").
            SessionsBusy: adopting it needs room that no idle session can make.
        """
        self.expire()
        session = self._table.get(session_id)
        if session is None and adopt and session_id not in self._ended:
            handle = self.handles.verify(session_id, owner)
            if handle is not None:
                return self._add(
                    CodeSession(
                        handle.text,
                        owner,
                        handle.name,
                        client,
                        live=True,
                        replica=handle.replica,
                        adopted=True,
                    )
                )
        if session is None or not secrets.compare_digest(session.owner or "", owner or ""):
            why = self._ended.get(session_id, "unknown") if session is None else "unknown"
            raise SessionGone(session_id, why, self.idle_timeout)
        self.touch(session)
        return session

    def place(self, session: CodeSession, replica: str) -> None:
        """Say where the interpreter of ``session``, whose id nobody was told yet, lives: its
        id becomes a handle naming ``replica`` (chosen when its first call was sent)."""
        session.replica = replica
        if self.is_open(session):  # else closed meanwhile (evicted): its call finds that out
            self._table.pop(session.id)
            session.id = self.handles.issue(session.owner, replica, session.name).text
            self._table.add(session.id, session, session.client)

    def _add(self, session: CodeSession) -> CodeSession:
        """Open ``session``, once there is room for it (see :meth:`_make_room`)."""
        self.expire()
        self._make_room(session.client)
        self._table.add(session.id, session, session.client)
        self._count(session.client)
        return session

    @property
    def max_sessions(self) -> int:
        """Sessions open at once at most."""
        return self._table.limit

    @max_sessions.setter
    def max_sessions(self, limit: int) -> None:
        self._table.limit = limit

    def _count(self, client: str | None) -> None:
        """Publish how many sessions ``client`` holds now."""
        if self.named_clients and client is not None:
            self._by_client.labels(client).set(self._table.held(client))

    def _make_room(self, client: str | None) -> None:
        """Close idle sessions until ``client`` may open one more: first its own longest idle
        while it holds its share (``per_client``), then, while the gateway holds
        ``max_sessions``, the longest idle session of the client holding the most. A session
        whose call runs is never closed (it would be killed, and its result would blame the
        code).

        Raises:
            SessionsBusy: the sessions that would have to close are all running a call.
        """
        table = self._table
        table.share = self.per_client if self.per_client is not None else -(-table.limit * 3 // 4)
        try:
            while (victim := table.to_close(client)) is not None:
                self._close(victim, "evicted")
        except TableFull as full:
            raise SessionsBusy(full.held, own=full.own) from None

    def touch(self, session: CodeSession) -> None:
        """Mark ``session`` used now (a call began or ended)."""
        self._table.touch(session, session.id)

    def end(self, session_id: str, owner: str | None, *, adopt: bool = False) -> None:
        """End a session on its client's request. With ``adopt``, one that another gateway
        started (its handle valid for ``owner``) is ended too, without being taken on.

        Raises:
            SessionGone: no such open session of this owner.
        """
        if session_id not in self._table and adopt and session_id not in self._ended:
            handle = self.handles.verify(session_id, owner)
            if handle is not None:
                unseen = CodeSession(handle.text, owner, handle.name, live=True)
                unseen.replica = handle.replica
                self._table.add(session_id, unseen)  # closed at once: nothing else is evicted
        self.get(session_id, owner)
        self._close(session_id, "ended")

    def is_open(self, session: CodeSession) -> bool:
        """Whether ``session`` is still open (not ended, expired or evicted)."""
        return self._table.get(session.id) is session

    def gone(self, session_id: str) -> SessionGone:
        """The error for a call naming ``session_id``, now closed."""
        return SessionGone(session_id, self._ended.get(session_id, "unknown"), self.idle_timeout)

    def discard(self, session: CodeSession) -> None:
        """Forget a session whose id nobody was told (its first call failed)."""
        if self.is_open(session):
            self._table.pop(session.id)
            self._count(session.client)
            if self.on_close is not None:
                self.on_close(session, None)

    def expire(self) -> None:
        """Close the sessions idle for longer than ``idle_timeout`` (unless a call is running)."""
        for session_id in self._table.expired(self.idle_timeout):
            self._close(session_id, "expired")

    def _close(self, session_id: str, why: Ending) -> None:
        session = self._table.pop(session_id)
        self._count(session.client)
        session.files.clear()
        if self.on_close is not None:
            self.on_close(session, why)
        self._ended[session_id] = why
        while len(self._ended) > _REMEMBERED:
            self._ended.popitem(last=False)
        self.ended.labels(why).inc()

    def _count_open(self) -> int:
        self.expire()
        return len(self._table)


def _running(session: CodeSession) -> bool:
    """Whether a call holds ``session`` or waits for it, or its cell may run on after its
    call answered: such a session is never closed."""
    cell = session.cell
    return session.turns.busy or (cell is not None and not cell.surely_ended)
