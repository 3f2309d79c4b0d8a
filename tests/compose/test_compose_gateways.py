"""Two gateways in front of the stack's replicas (tests/compose/two-gateways.yaml), live: load
over both, and sessions that one gateway starts and the other continues.

Runs when .ci/compose-test has started the second gateway (COMPOSE_TEST_URL_B); both share
MCP_SESSION_SECRET. The figures are printed (the compose test's log; docs/deployment.md keeps
those of a reference run). A replica killed under load: test_compose_replica_killed.py.
"""

from __future__ import annotations

import uuid

import anyio
import pytest

from tests.compose import load
from tests.compose.live import NO_STACK, REPLICAS, STACK, URL, URL_B
from tests.support import connect, text_of

pytestmark = [
    pytest.mark.skipif(not URL, reason=NO_STACK),
    pytest.mark.skipif(not URL_B, reason="no second gateway (COMPOSE_TEST_URL_B is unset)"),
]

SESSIONS = 6
CLIENTS, CALLS = 12, 8

REPORT = (
    "import os\n"
    "try:\n"
    "    kept = mark\n"
    "except NameError:\n"
    "    kept = None\n"
    "print(repr(kept), repr(open('mark.txt').read() if os.path.exists('mark.txt') else None))\n"
)


@pytest.mark.anyio
async def test_sessions_continue_across_gateways() -> None:
    """A session started at gateway A, continued at gateway B, then at A again.

    Built-in evaluator: B takes the session on (the shared secret) and sends the call to the
    replica holding its interpreter, whose variables and files are there. Snekbox: there is no
    interpreter to reach, and the session's files live in the gateway that served its calls, so
    B does not take it on (docs/sessions.md: a session there stays with one gateway); B's answer
    is a tool error saying that the session does not exist there and the code did not run. A
    goes on serving it, files and all, in both stacks."""
    started: dict[str, str] = {}  # session id -> its mark
    accepted = variables = files = 0
    refusals: set[str] = set()
    back: set[str] = set()
    back_with_files = 0
    with anyio.fail_after(300):
        async with connect(URL, "http") as a, connect(URL_B, "sse") as b:
            for _ in range(SESSIONS):
                mark = uuid.uuid4().hex
                code = f"mark = {mark!r}\nopen('mark.txt', 'w').write(mark)\nprint('started')"
                first = await a.call_tool("execute_python_code", {"code": code})
                assert not first.is_error, first
                started[first.structured_content["session_id"]] = mark
            for session_id, mark in started.items():
                arguments = {"code": REPORT, "session_id": session_id}
                result = await b.call_tool("execute_python_code", arguments)
                if result.is_error:
                    refusals.add(text_of(result).replace(session_id, "<id>"))
                else:
                    accepted += 1
                    assert result.structured_content["session_id"] == session_id
                    assert result.structured_content["returncode"] == 0, text_of(result)
                    variable, file = result.structured_content["stdout"].split()
                    variables += variable == repr(mark)
                    files += file == repr(mark)
                again = await a.call_tool("execute_python_code", arguments)
                if again.is_error:
                    back.add(text_of(again).replace(session_id, "<id>"))
                else:
                    back_with_files += again.structured_content["stdout"].split()[1] == repr(mark)
    print(
        f"{STACK}: {SESSIONS} sessions started at gateway A, continued at gateway B: "
        f"{accepted} taken on, variables kept in {variables}, files kept in {files}; "
        f"then at A again: {back_with_files} with their files"
    )
    for message in refusals:
        print(f"  B answered: {message}")
    for message in back:
        print(f"  A answered: {message}")
    assert back_with_files == SESSIONS, back
    if STACK == "builtin":
        assert (accepted, variables, files) == (SESSIONS, SESSIONS, SESSIONS), refusals
    else:
        assert accepted == 0, "Snekbox sessions were not expected to move between gateways"
        assert len(refusals) == 1, refusals
        assert "does not exist" in next(iter(refusals)), refusals
        assert "the code did not run" in next(iter(refusals)), refusals


@pytest.mark.anyio
async def test_load_over_two_gateways() -> None:
    """12 clients (6 per gateway, SSE and Streamable HTTP), 8 calls each: every result carries
    exactly its own token, none is refused or lost."""
    tally = await load.run([URL, URL_B], CLIENTS, CALLS)
    print(f"{STACK}, 2 gateways, {REPLICAS} replicas, {CLIENTS} clients: {tally.summary()}")
    assert tally.done == CLIENTS * CALLS
    assert not tally.mixed_up and not tally.hung, (tally.summary(), tally.mixed_up)
    assert tally.ok == CLIENTS * CALLS, dict(tally.errors)
