"""The code sessions' own rules, which the gateway tests cannot reach with one bearer token."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from gateway.code_sessions import CodeSessions, SessionGone


def store(**changes: float) -> CodeSessions:
    options = {"max_sessions": 4, "idle_timeout": 60.0, **changes}
    return CodeSessions(
        max_sessions=int(options["max_sessions"]),
        idle_timeout=options["idle_timeout"],
        registry=CollectorRegistry(),
    )


def test_a_session_is_found_only_by_its_owner() -> None:
    sessions = store()
    mine = sessions.create("token-a")
    assert sessions.get(mine.id, "token-a") is mine
    for other in ("token-b", None, ""):
        with pytest.raises(SessionGone) as gone:
            sessions.get(mine.id, other)
        assert gone.value.why == "unknown"  # another's session is not even said to exist
    anonymous = sessions.create(None)
    with pytest.raises(SessionGone):
        sessions.get(anonymous.id, "token-a")
    with pytest.raises(SessionGone):
        sessions.end(mine.id, "token-b")
    assert sessions.get(mine.id, "token-a") is mine


def test_ids_are_unguessable() -> None:
    sessions = store(max_sessions=1000)
    ids = {sessions.create(None).id for _ in range(1000)}
    assert len(ids) == 1000 and all(len(i) == 22 for i in ids)  # 128 bits, base64url
