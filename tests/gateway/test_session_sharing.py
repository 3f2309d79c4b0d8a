"""Fair sharing between clients, without any server: the session table's rules and the slots'.

A client holding its share closes its own longest idle session for a new one; at the cap the
client holding the most gives one up; a session running a call is never closed. A slot that
comes free goes to the client running the fewest evaluations.
"""

from __future__ import annotations

import functools

import anyio
import pytest
from prometheus_client import CollectorRegistry

from gateway.admission import Admission, Busy
from gateway.code_sessions import CodeSession, CodeSessions, SessionGone, SessionsBusy


def _table(max_sessions: int, per_client: int | None = None) -> CodeSessions:
    return CodeSessions(
        max_sessions=max_sessions,
        per_client=per_client,
        idle_timeout=600,
        registry=CollectorRegistry(),
        named_clients=True,
    )


def _open(table: CodeSessions, client: str | None, count: int) -> list[CodeSession]:
    return [table.create(None, client) for _ in range(count)]


def _why(table: CodeSessions, session: CodeSession) -> str:
    with pytest.raises(SessionGone) as gone:
        table.get(session.id, None)
    return gone.value.why


def test_at_the_cap_the_client_holding_the_most_gives_one_up() -> None:
    table = _table(4, per_client=4)
    victim = _open(table, "victim", 1)[0]  # the longest idle of all
    flood = _open(table, "flood", 3)
    newest = table.create(None, "flood")
    assert table.is_open(victim)
    assert _why(table, flood[0]) == "evicted"
    assert all(table.is_open(s) for s in (*flood[1:], newest))


def test_a_flood_past_the_cap_never_reaches_another_clients_session() -> None:
    table = _table(4, per_client=4)
    victim = _open(table, "victim", 1)[0]
    for _ in range(40):
        table.create(None, "flood")
    assert table.is_open(victim)


def test_a_client_at_its_share_closes_its_own_longest_idle() -> None:
    table = _table(8, per_client=2)
    other = _open(table, "other", 1)[0]
    first, second = _open(table, "mine", 2)
    third = table.create(None, "mine")
    assert _why(table, first) == "evicted"
    assert table.is_open(second) and table.is_open(third) and table.is_open(other)


def test_the_default_share_is_three_quarters_of_the_cap() -> None:
    table = _table(8)
    mine = _open(table, "mine", 7)
    assert _why(table, mine[0]) == "evicted"  # the seventh closed the first: six is the share
    assert sum(table.is_open(s) for s in mine) == 6


def test_between_equal_holders_the_oldest_idle_session_goes() -> None:
    table = _table(4, per_client=4)
    a_old, b_old = table.create(None, "a"), table.create(None, "b")
    table.create(None, "a"), table.create(None, "b")
    table.create(None, "c")
    assert _why(table, a_old) == "evicted"
    assert table.is_open(b_old)


def test_a_session_running_a_call_is_spared_and_a_full_share_of_them_refuses() -> None:
    table = _table(8, per_client=2)
    first, second = _open(table, "mine", 2)
    first.turns.calls, second.turns.calls = 1, 1
    with pytest.raises(SessionsBusy) as busy:
        table.create(None, "mine")
    assert busy.value.own
    assert "All 2 of your sessions" in str(busy.value)
    assert table.is_open(first) and table.is_open(second)
    table.create(None, "other")  # another client has room


def test_sessions_of_clients_that_cannot_be_told_apart_share_one_share() -> None:
    table = _table(4, per_client=2)
    anonymous = _open(table, None, 3)
    assert _why(table, anonymous[0]) == "evicted"


# --- evaluation slots ---------------------------------------------------------------------------
# The rule itself is serving.FairSlots' (tests/serving/test_slots.py): here, the gateway's use.


@pytest.mark.anyio
async def test_a_free_slot_goes_to_the_client_running_the_fewest() -> None:
    admission = Admission(limit=1, max_waiting=8, max_wait=30)
    order: list[str] = []
    release = anyio.Event()

    async def call(client: str, hold: bool = False) -> None:
        async with admission.slot(client):
            order.append(client)
            if hold:
                await release.wait()

    async with anyio.create_task_group() as calls:
        calls.start_soon(call, "flood", True)
        await anyio.wait_all_tasks_blocked()
        for _ in range(3):
            calls.start_soon(call, "flood")
        await anyio.wait_all_tasks_blocked()
        calls.start_soon(call, "calm")  # last in line
        await anyio.wait_all_tasks_blocked()
        assert admission.waiting == 4
        release.set()
    assert order == ["flood", "calm", "flood", "flood", "flood"]
    assert (admission.in_flight, admission.waiting) == (0, 0)


async def _hold_a_slot(admission: Admission, release: anyio.Event, client: str) -> None:
    """A call of ``client`` that holds its slot until ``release``."""
    async with admission.slot(client):
        await release.wait()


@pytest.mark.anyio
async def test_one_client_may_fill_three_quarters_of_the_wait_queue_beside_another() -> None:
    admission = Admission(limit=1, max_waiting=4, max_wait=30)
    release = anyio.Event()
    call = functools.partial(_hold_a_slot, admission, release)
    async with anyio.create_task_group() as calls:
        calls.start_soon(call, "calm")  # runs
        await anyio.wait_all_tasks_blocked()
        for _ in range(3):  # the flood's share of the wait queue
            calls.start_soon(call, "flood")
        await anyio.wait_all_tasks_blocked()
        with pytest.raises(Busy, match="3 of this client's calls are waiting"):
            async with admission.slot("flood"):
                pass
        calls.start_soon(call, "calm")  # the last place is another client's
        await anyio.wait_all_tasks_blocked()
        assert admission.waiting == 4
        release.set()
    assert (admission.in_flight, admission.waiting) == (0, 0)
