"""One code session: its files and state, the errors that name it, what a result says of it."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal
from urllib.parse import quote

from ..admission import Turns
from ..text import duration

if TYPE_CHECKING:
    from ..cells import PendingCell

__all__ = [
    "URI_SCHEME",
    "CodeSession",
    "Ending",
    "SessionGone",
    "SessionView",
    "SessionsBusy",
    "file_uri",
    "held_bytes",
]

#: The scheme of the files' resource URIs: ``session://<session id>/<path, percent-encoded>``.
URI_SCHEME = "session"
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
    #: Whether its latest run went without the prelude (for the interpreter's, or the one the
    #: service keeps resident): an answer that it found none is then the boot file's.
    bare: bool = False
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
    #: Its cell that runs on after its call answered (or was left), until read to its end.
    cell: PendingCell | None = None

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


@dataclass
class SessionView:
    """What a result says of its session: its id, which written files it kept, its bytes, the
    ``timeout_seconds`` asked for when it was lowered to the maximum, whether its interpreter
    ended."""

    id: str
    kept: dict[str, bool]
    max_bytes: int
    time_limit_lowered: float | None = None
    #: The session's live interpreter ended with this call (its variables are gone).
    interpreter_ended: bool = False
    #: The call before ended without an answer, which ended the interpreter: this call ran in
    #: a new one.
    after_abandoned_call: bool = False


def held_bytes(path: str, size: int) -> int:
    """What a file of ``size`` bytes at ``path`` takes of a session's room: its name counts too,
    or code could have the gateway keep thousands of long names of empty files."""
    return len(path.encode("utf-8", "surrogatepass")) + size


def file_uri(session_id: str, path: str) -> str:
    """The resource URI of a session's file."""
    return f"{URI_SCHEME}://{session_id}/{quote(path, safe='/')}"
