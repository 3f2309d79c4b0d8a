"""One evaluator replica killed (SIGKILL, `docker kill`) while two gateways are under load.

What is promised: no call hangs (each ends within load.CALL_LIMIT), no result carries another
call's output, a call that fails is a tool error that says what happened, and each client's
last call succeeds (the gateways go on with the replicas left). What it costs (the calls that
failed, and what they were told) is printed.

It leaves the stack short of a replica, so .ci/compose-test runs it alone, after the others,
with COMPOSE_TEST_KILL=1; without it, it is skipped.
"""

from __future__ import annotations

import os

import anyio
import pytest

from tests.compose import load
from tests.compose.live import (
    NO_STACK,
    REPLICAS,
    STACK,
    URL,
    URL_B,
    docker,
    replica_containers,
)

pytestmark = [
    pytest.mark.skipif(not URL, reason=NO_STACK),
    pytest.mark.skipif(not URL_B, reason="no second gateway (COMPOSE_TEST_URL_B is unset)"),
    pytest.mark.skipif(
        os.environ.get("COMPOSE_TEST_KILL") != "1",
        reason="kills a replica: .ci/compose-test runs it last, with COMPOSE_TEST_KILL=1",
    ),
]

CLIENTS, CALLS = 12, 10


@pytest.mark.anyio
async def test_a_replica_killed_under_load() -> None:
    if REPLICAS < 2:
        pytest.skip("one replica: killing it stops the service")
    victims = replica_containers()
    assert len(victims) == REPLICAS, victims
    victim = victims[-1]
    killed_at: list[int] = []

    async def kill(tally: load.Tally) -> None:
        await tally.reached.wait()
        killed_at.append(tally.done)
        await anyio.to_thread.run_sync(docker, "kill", victim)

    # Killed once a quarter of the calls are done: the load is on.
    milestone = CLIENTS * CALLS // 4
    tally = await load.run([URL, URL_B], CLIENTS, CALLS, meanwhile=kill, milestone=milestone)
    failed = sum(tally.errors.values())
    print(
        f"{STACK}, 2 gateways, {REPLICAS} replicas, {CLIENTS} clients; {victim} killed after "
        f"{killed_at[0] if killed_at else '?'} calls: {tally.summary()}"
    )
    for message, count in tally.errors.most_common():
        print(f"  {count} x {message}")
    assert killed_at, "the load ended before the replica was killed"
    assert replica_containers() == victims[:-1]
    assert tally.done == CLIENTS * CALLS
    assert tally.hung == 0, "a call hung"
    assert not tally.mixed_up, tally.mixed_up
    assert tally.ok + failed == tally.done
    assert all(tally.last_ok.values()), "a client's last call failed: the gateways did not recover"
    # What failing calls say: the evaluation service failed them (never an empty message).
    assert all(message.strip() for message in tally.errors), tally.errors
