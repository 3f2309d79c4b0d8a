"""Code sessions: the working directory a model's calls share, named by an unguessable id.

A call without ``session_id`` starts a session; the result names it, and a later call that
passes it continues it. What a session keeps here is its files: those sent in and those its
runs wrote, readable with MCP ``resources/read`` (:func:`file_uri`) while the session lives.
The built-in evaluator keeps a live interpreter per session (its variables, imports and files);
in front of Snekbox, which keeps nothing between runs, the files are carried into every run
through the ``files`` of ``POST /eval``, and into a new interpreter when one ended.

A session ends when its client ends it, after ``idle_timeout`` seconds without a call, or when
a new one needs its room. Room is shared fairly between clients (a token's name; without
tokens, an MCP connection): a client holding ``per_client`` sessions makes room for its next
one by closing its own longest idle; at ``max_sessions`` the longest idle session of the
client holding the most is closed, so that a client flooding the gateway closes its own
sessions before anyone else's. A session running a call is never closed. A call naming an
ended session is told which of these happened (:class:`SessionGone`), never given a fresh
one silently. A session belongs to the client that started it: with a bearer token, another
token's calls do not find it.

Its id is a handle (:mod:`gateway.handles`) naming the evaluator replica that holds its live
interpreter: another gateway with the same secret that is asked for a session it never saw
takes it on (:meth:`CodeSessions.get` with ``adopt``), without its files.
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import quote

from prometheus_client import CollectorRegistry, Counter, Gauge

from .admission import Turns
from .handles import SessionHandles
from .text import duration

__all__ = [
    "URI_SCHEME",
    "CodeSession",
    "CodeSessions",
    "SessionGone",
    "SessionsBusy",
    "file_uri",
    "held_bytes",
]

#: The scheme of the files' resource URIs: ``session://<session id>/<path, percent-encoded>``.
URI_SCHEME = "session"
#: Ended sessions remembered, so that a call naming one says how it ended.
_REMEMBERED = 10_000
#: Characters of an unknown session id repeated in a message at most.
_SHOWN_ID_CHARS = 128

Ending = Literal["unknown", "ended", "expired", "evicted"]


class SessionGone(Exception):
    """The session a call names does not exist (any more); ``why`` says what became of it."""

    def __init__(self, session_id: str, why: Ending, idle_timeout: float) -> None:
        self.session_id = session_id
        self.why = why
        if len(session_id) > _SHOWN_ID_CHARS:  # the caller's text, echoed: bounded
            session_id = session_id[:_SHOWN_ID_CHARS] + "…"
        reason = {
            "unknown": "does not exist (it never did here, or this gateway restarted since)",
            "ended": "was ended on purpose",
            "expired": f"expired after {duration(idle_timeout)} without a call",
            "evicted": "was closed to make room for newer sessions (too many were open)",
        }[why]
        #: What became of it, as a sentence's start, for what is not a call (a file's read).
        self.fate = f"The session {session_id!r} {reason}"
        super().__init__(
            f"The session {session_id!r} {reason}: its files and state are lost, and the code "
            "did not run. Call again without session_id to start a new session, sending with "
            "`files` whatever the code needs."
        )


class SessionsBusy(Exception):
    """No session can start: every open one is running a call, and none is closed for it.
    ``why``: what the call did about it (it waited in vain, or could not wait); ``own``: the
    sessions counted are the client's own, at its share of the cap."""

    def __init__(self, count: int, why: str = "", *, own: bool = False) -> None:
        self.count = count
        self.own = own
        during = f" ({why})" if why else ""
        whose = (
            "of your sessions (your share of this gateway's)"
            if own
            else "sessions this gateway keeps"
        )
        super().__init__(
            f"All {count} {whose} are running a call{during}, so no new "
            "session can start now; the code did not run. Retry in a few seconds, or continue "
            "a session with its session_id once its call has answered."
        )


@dataclass(eq=False)
class CodeSession:
    """One session: its id (the client's handle), its owner, its name in the evaluator, and its
    working directory's files as last known."""

    id: str
    owner: str | None
    name: str
    #: Whose share of the sessions it takes (a token's name, an MCP connection; ``None``:
    #: a client that cannot be told apart): see :class:`CodeSessions`.
    client: str | None = None
    files: dict[str, bytes] = field(default_factory=dict)
    last_used: float = field(default_factory=time.monotonic)
    calls: int = 0
    #: Whether the evaluator holds a live interpreter for it (the built-in evaluator's
    #: sessions): its files are then in that sandbox already, and not sent again.
    live: bool = False
    #: Whether that interpreter has run the prelude (a call through this gateway ended by
    #: itself there), so that later calls are sent without it (``plotting.build_request``).
    prelude_loaded: bool = False
    #: A call sent to its interpreter ended without an answer (cancelled, timed out, cut off),
    #: and that interpreter was ended: the next result says why the variables are gone.
    abandoned: bool = False
    #: The address of the evaluator replica holding that interpreter (several replicas behind
    #: one name), where its calls go; ``None``: anywhere (one service, or not live).
    replica: str | None = None
    #: Started by another gateway: this one knows only the files of the calls it served.
    adopted: bool = False
    #: The interpreter its live interpreter runs (``executable_path``; ``None``: the default),
    #: once a call chose it.
    python: str | None = None
    #: Every package its calls asked for: sent with each call, so that a new interpreter (or
    #: a files-only session's next run) has them too.
    packages: tuple[str, ...] = ()
    #: One call at a time: a second one waits, as a notebook runs one cell at a time.
    turns: Turns = field(default_factory=Turns)

    @property
    def size(self) -> int:
        """The bytes its files take of its room (see :func:`held_bytes`)."""
        return sum(held_bytes(path, len(content)) for path, content in self.files.items())

    def held(self, path: str) -> int:
        """The bytes the file at ``path`` takes now (0: there is none)."""
        content = self.files.get(path)
        return 0 if content is None else held_bytes(path, len(content))

    def keep(self, path: str, content: bytes) -> int:
        """Hold ``path``'s content. A file there now means that none of its folders is a file
        and that it is no folder: a file kept from before at either place is dropped, or every
        later run would fail to write the session's files (a file where a folder must be).

        Returns how many more bytes (see :attr:`size`) the session holds now: fewer if negative.
        """
        parts = path.split("/")
        beneath = path + "/"
        dropped = [
            *("/".join(parts[:end]) for end in range(1, len(parts) + 1)),
            *(name for name in self.files if name.startswith(beneath)),
        ]
        freed = 0
        for name in dropped:
            freed += self.held(name)
            self.files.pop(name, None)
        self.files[path] = content
        return held_bytes(path, len(content)) - freed


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
        self.max_sessions = max_sessions
        #: Sessions one client may hold (``None``: three quarters of the cap, rounded up).
        self.per_client = per_client
        self.handles = handles or SessionHandles()
        self.idle_timeout = idle_timeout
        #: Called with each session that closes and why (``None``: its first call failed):
        #: its interpreter is to end too.
        self.on_close = on_close
        self._open: OrderedDict[str, CodeSession] = OrderedDict()  # least recently used first
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
        session = self._open.get(session_id)
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
            del self._open[session.id]
            session.id = self.handles.issue(session.owner, replica, session.name).text
            self._open[session.id] = session

    def _add(self, session: CodeSession) -> CodeSession:
        """Open ``session``, once there is room for it (see :meth:`_make_room`)."""
        self.expire()
        self._make_room(session.client)
        self._open[session.id] = session
        self._count(session.client)
        return session

    def _count(self, client: str | None) -> None:
        """Publish how many sessions ``client`` holds now."""
        if self.named_clients and client is not None:
            held = sum(s.client == client for s in self._open.values())
            self._by_client.labels(client).set(held)

    def _make_room(self, client: str | None) -> None:
        """Close idle sessions until ``client`` may open one more: first its own longest idle
        while it holds its share (``per_client``), then, while the gateway holds
        ``max_sessions``, the longest idle session of the client holding the most. A session
        whose call runs is never closed (it would be killed, and its result would blame the
        code).

        Raises:
            SessionsBusy: the sessions that would have to close are all running a call.
        """
        share = self.per_client if self.per_client is not None else -(-self.max_sessions * 3 // 4)
        own = [s for s in self._open.values() if s.client == client]
        while share < self.max_sessions and len(own) >= share:
            idle = [s for s in own if not s.turns.busy]
            if not idle:
                raise SessionsBusy(len(own), own=True)
            self._close(idle[0].id, "evicted")
            own.remove(idle[0])
        while len(self._open) >= self.max_sessions:
            victim = self._fairest_victim()
            if victim is None:
                raise SessionsBusy(len(self._open))
            self._close(victim.id, "evicted")

    def _fairest_victim(self) -> CodeSession | None:
        """The longest idle session of the client holding the most sessions (among those with
        one idle; a tie goes to the client whose idle session is the oldest)."""
        held: dict[str | None, int] = {}
        oldest_idle: dict[str | None, CodeSession] = {}
        for session in self._open.values():  # least recently used first
            held[session.client] = held.get(session.client, 0) + 1
            if not session.turns.busy:
                oldest_idle.setdefault(session.client, session)
        if not oldest_idle:
            return None
        client = max(oldest_idle, key=lambda c: (held[c], -oldest_idle[c].last_used))
        return oldest_idle[client]

    def touch(self, session: CodeSession) -> None:
        """Mark ``session`` used now (a call began or ended)."""
        session.last_used = time.monotonic()
        if session.id in self._open:
            self._open.move_to_end(session.id)

    def end(self, session_id: str, owner: str | None, *, adopt: bool = False) -> None:
        """End a session on its client's request. With ``adopt``, one that another gateway
        started (its handle valid for ``owner``) is ended too, without being taken on.

        Raises:
            SessionGone: no such open session of this owner.
        """
        if session_id not in self._open and adopt and session_id not in self._ended:
            handle = self.handles.verify(session_id, owner)
            if handle is not None:
                unseen = CodeSession(handle.text, owner, handle.name, live=True)
                unseen.replica = handle.replica
                self._open[session_id] = unseen  # closed at once: nothing else is evicted
        self.get(session_id, owner)
        self._close(session_id, "ended")

    def is_open(self, session: CodeSession) -> bool:
        """Whether ``session`` is still open (not ended, expired or evicted)."""
        return self._open.get(session.id) is session

    def gone(self, session_id: str) -> SessionGone:
        """The error for a call naming ``session_id``, now closed."""
        return SessionGone(session_id, self._ended.get(session_id, "unknown"), self.idle_timeout)

    def discard(self, session: CodeSession) -> None:
        """Forget a session whose id nobody was told (its first call failed)."""
        if self.is_open(session):
            del self._open[session.id]
            self._count(session.client)
            if self.on_close is not None:
                self.on_close(session, None)

    def expire(self) -> None:
        """Close the sessions idle for longer than ``idle_timeout`` (unless a call is running)."""
        deadline = time.monotonic() - self.idle_timeout
        for session in list(self._open.values()):
            if session.last_used > deadline:
                break  # the rest were used later
            if not session.turns.busy:
                self._close(session.id, "expired")

    def _close(self, session_id: str, why: Ending) -> None:
        session = self._open.pop(session_id)
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
        return len(self._open)


def held_bytes(path: str, size: int) -> int:
    """What a file of ``size`` bytes at ``path`` takes of a session's room: its name counts too,
    or code could have the gateway keep thousands of long names of empty files."""
    return len(path.encode("utf-8", "surrogatepass")) + size


def file_uri(session_id: str, path: str) -> str:
    """The resource URI of a session's file."""
    return f"{URI_SCHEME}://{session_id}/{quote(path, safe='/')}"
