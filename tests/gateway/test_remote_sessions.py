"""Live sessions behind ``SNEKBOX_URL``: the built-in evaluator as a service of its own.

The gateway learns from the service's ``GET /info`` that it keeps live interpreters (Snekbox,
and the evaluator started one-shot, do not: test_code_sessions.py), then runs a session's
calls in one interpreter there. When the service no longer holds it (here: it restarted), the
call says that the variables are lost and that it did not run, and the next call runs in a new
interpreter that has the session's files.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import anyio
import pytest
from mcp import Client, MCPError

from python_mcp_server import Settings, create_app
from snekbox_client import EvalRequest, SnekboxClient
from tests.gateway.conftest import evaluator_service, gateway, with_time_limit
from tests.support import call_code, closed_port, connect, facts, serve, text_of

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("transport", ["sse", "http"])]

#: The evaluator's own time limit: a loaded machine starts a session slowly.
TIME_LIMIT = 20.0


@pytest.fixture(scope="module")
def remote_gateway(settings: Settings) -> Iterator[str]:
    with gateway(with_time_limit(settings, TIME_LIMIT), "live-over-http") as url:
        yield url


async def test_variables_last_and_an_interrupt_keeps_them(
    remote_gateway: str, transport: str
) -> None:
    async with connect(remote_gateway, transport) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        description = tools["execute_python_code"].description or ""
        assert "run in the same interpreter" in description
        assert "do NOT carry over" not in description
        session_id = facts(await call_code(client, "import os\nx = 41\npid = os.getpid()"))[
            "session_id"
        ]
        same = await call_code(client, "print(x + 1, os.getpid() == pid)", session_id=session_id)
        assert text_of(same).startswith("42 True\n")
        # The call's own time limit reaches the service, which interrupts the cell.
        slow = "import time\ntime.sleep(60)"
        interrupted = await call_code(client, slow, session_id=session_id, timeout_seconds=1)
        assert "interrupted after" in text_of(interrupted)
        assert "variables are kept" in text_of(interrupted)
        after = await call_code(client, "print(x)", session_id=session_id)
        assert text_of(after).startswith("41\n")
        await client.call_tool("end_session", {"session_id": session_id})


@contextlib.contextmanager
def gateway_at(settings: Settings, url: str) -> Iterator[str]:
    remote = with_time_limit(settings, TIME_LIMIT).model_copy(update={"snekbox_url": url})
    with serve(create_app(remote)) as gateway_url:
        yield gateway_url


async def test_a_service_restart_loses_the_interpreter_not_the_files(
    settings: Settings, transport: str
) -> None:
    port = closed_port()
    async with contextlib.AsyncExitStack() as stack:
        with evaluator_service(TIME_LIMIT, sessions=True, port=port) as url:
            gateway_url = stack.enter_context(gateway_at(settings, url))
            client = await stack.enter_async_context(connect(gateway_url, transport))
            first = await call_code(client, "x = 1\nopen('notes.txt', 'w').write('kept')")
            session_id = facts(first)["session_id"]
        # The service is gone and back: it holds no session.
        with evaluator_service(TIME_LIMIT, sessions=True, port=port):
            lost = await call_code(client, "open('ran.txt', 'w')", session_id=session_id)
            assert lost.is_error
            assert "The session's interpreter is gone" in text_of(lost)
            assert "variables and imports are lost" in text_of(lost)
            assert "this code did not run" in text_of(lost)
            again = await call_code(
                client, "print(open('notes.txt').read(), 'x' in globals())", session_id=session_id
            )
            assert text_of(again).startswith("kept False\n")
            assert facts(again)["session_id"] == session_id
            listed = await call_code(
                client, "import os\nprint(sorted(os.listdir()))", session_id=session_id
            )
            assert "ran.txt" not in text_of(listed)


async def test_a_session_closed_for_a_new_one_ends_before_the_new_one_starts(
    settings: Settings, transport: str
) -> None:
    """At its cap the gateway closes its longest idle session for a new one, whose request to
    the service ends that interpreter first: the service (cap 4), full, then ends no other to
    make room. Here the other would have been another client's, the longest idle there."""
    small = settings.model_copy(update={"max_code_sessions": 3})
    async with contextlib.AsyncExitStack() as stack:
        url = stack.enter_context(evaluator_service(TIME_LIMIT, sessions=True))
        other = await stack.enter_async_context(SnekboxClient(url))
        mine = EvalRequest(input="x = 'mine'", session="another-client")
        assert (await other.eval(mine)).returncode == 0
        client = await stack.enter_async_context(
            connect(stack.enter_context(gateway_at(small, url)), transport)
        )
        ids = [facts(await call_code(client, f"n = {n}"))["session_id"] for n in range(4)]
        evicted = await call_code(client, "print(n)", session_id=ids[0])
        assert evicted.is_error and "to make room" in text_of(evicted)
        for n, session_id in list(enumerate(ids))[1:]:
            assert text_of(await call_code(client, "print(n)", session_id=session_id)).startswith(
                f"{n}\n"
            )
        resumed = EvalRequest(input="print(x)", session="another-client", session_resume=True)
        assert (await other.eval(resumed)).stdout == "mine\n"


async def test_gateway_replicas_with_one_secret_serve_each_others_sessions(
    settings: Settings, transport: str
) -> None:
    shared = settings.model_copy(update={"session_secret": "one secret for every replica"})
    async with contextlib.AsyncExitStack() as stack:
        url = stack.enter_context(evaluator_service(TIME_LIMIT, sessions=True))
        first, second = (stack.enter_context(gateway_at(shared, url)) for _ in range(2))
        stranger = stack.enter_context(gateway_at(settings, url))  # its own secret
        a = await stack.enter_async_context(connect(first, transport))
        b = await stack.enter_async_context(connect(second, transport))
        c = await stack.enter_async_context(connect(stranger, transport))
        session_id = facts(await call_code(a, "x = 'set through the first gateway'"))["session_id"]
        continued = await call_code(b, "print(x)", session_id=session_id)
        assert text_of(continued).startswith("set through the first gateway\n")
        refused = await call_code(c, "print(x)", session_id=session_id)
        assert refused.is_error and "does not exist" in text_of(refused)
        # One the second gateway never served: ended there, without being taken on.
        other = facts(await call_code(a, "y = 1\nopen('f.txt', 'w').write('f')"))
        with pytest.raises(MCPError, match="does not exist"):  # it holds none of its files
            await b.read_resource(other["files"][0]["uri"])
        assert not (await b.call_tool("end_session", {"session_id": other["session_id"]})).is_error
        await ended_in_the_background(a, other["session_id"])
        ended = await b.call_tool("end_session", {"session_id": session_id})
        assert not ended.is_error
        await ended_in_the_background(a, session_id)


async def ended_in_the_background(client: Client, session_id: str) -> None:
    """Return once a call of ``session_id`` finds its interpreter ended by another gateway:
    gone before the call (a tool error), or ended while the call ran (its result says so)."""
    with anyio.fail_after(30):
        while True:
            result = await call_code(client, "import time; time.sleep(0.1)", session_id=session_id)
            if result.is_error:
                assert "The session's interpreter is gone" in text_of(result)
                return
            if "interpreter ended with this call" in text_of(result):
                return
