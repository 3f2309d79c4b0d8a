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

The package's parts: :mod:`.session` (one session, its errors, what a result says of it),
:mod:`.table` (the open sessions and the rules of their room), :mod:`.files` (what a call's
files do to its session's).
"""

from __future__ import annotations

from .files import check_room, keep_files, remember
from .session import (
    URI_SCHEME,
    CodeSession,
    Ending,
    SessionGone,
    SessionsBusy,
    SessionView,
    file_uri,
    held_bytes,
)
from .table import CodeSessions

__all__ = [
    "URI_SCHEME",
    "CodeSession",
    "CodeSessions",
    "Ending",
    "SessionGone",
    "SessionView",
    "SessionsBusy",
    "check_room",
    "file_uri",
    "held_bytes",
    "keep_files",
    "remember",
]
