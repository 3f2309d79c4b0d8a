"""The code sessions' own rules, which the gateway tests cannot reach with one bearer token."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from gateway.code_sessions import CodeSessions, SessionGone
from gateway.handles import SessionHandles


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
    created = [sessions.create(None) for _ in range(1000)]
    assert len({s.id for s in created}) == len({s.name for s in created}) == 1000
    assert all(len(s.name) == 22 and s.id.startswith(s.name + ".") for s in created)  # 128 bits


def test_another_gateway_with_the_secret_takes_a_session_on_for_its_owner_only() -> None:
    handles = SessionHandles(b"the deployment's shared secret")
    first, second = store(), store()
    first.handles = second.handles = handles
    started = first.create("token-a")
    name = started.name
    first.place(started, "10.0.3.7")  # its first call went there: its id says so
    assert started.name == name and started.replica == "10.0.3.7"
    assert first.get(started.id, "token-a") is started
    with pytest.raises(SessionGone):
        second.get(started.id, "token-a")  # not asked to adopt: a files-only backend
    with pytest.raises(SessionGone):
        second.get(started.id, "token-b", adopt=True)
    adopted = second.get(started.id, "token-a", adopt=True)
    assert (adopted.name, adopted.replica, adopted.live, adopted.adopted) == (
        started.name,
        "10.0.3.7",
        True,
        True,
    )
    assert second.get(started.id, "token-a", adopt=True) is adopted
    second.end(started.id, "token-a")
    with pytest.raises(SessionGone) as gone:  # ended here: not taken on again
        second.get(started.id, "token-a", adopt=True)
    assert gone.value.why == "ended"
    with pytest.raises(SessionGone):
        store().get(started.id, "token-a", adopt=True)  # another secret
