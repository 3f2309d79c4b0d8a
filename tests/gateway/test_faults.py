"""Faults around the gateway: the evaluator dies, hangs or talks nonsense; clients walk away.

The evaluator is a real ``python -m evaluator`` process that the tests kill and start again on
the same port, or the built-in one in this very process (to watch its sandboxes in ``/proc``).
Fake evaluators exist only for failures a real one cannot produce on demand: one that never
answers, one that answers garbage, one that hangs up.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from python_mcp_server import Settings, create_app
from tests.gateway.conftest import with_evaluator
from tests.gateway.harness import (
    ACCEPT,
    PROTOCOL_VERSION,
    RawSession,
    ServiceProcess,
    children,
    evaluator_process,
    wait_for,
)
from tests.support import (
    TIME_LIMIT,
    connect,
    hang_up_after_reading,
    raw_server,
    serve,
    sse_endpoint,
    text_of,
)

pytestmark = pytest.mark.anyio

TRANSPORTS = pytest.mark.parametrize("transport", ["sse", "http"])
UNREACHABLE = "The Python evaluation service is unreachable ("
DID_NOT_RUN = "the code did not run. Retry in a few seconds"
#: The connection broke once made: the gateway cannot know whether the code ran.
LOST = "The connection to the evaluation service was lost before its answer came ("
MAY_HAVE_RUN = "the code may have run, but its result is lost. Retry if running it again does"


@pytest.fixture(scope="module")
def evaluator() -> Iterator[ServiceProcess]:
    service = evaluator_process(TIME_LIMIT)
    service.start()
    try:
        yield service
    finally:
        service.stop()


async def call(mcp: Any, code: str) -> Any:
    with anyio.fail_after(30):
        return await mcp.call_tool("execute_python_code", {"code": code})


async def readyz(url: str) -> tuple[int, Any]:
    async with httpx.AsyncClient() as http:
        answer = await http.get(f"{url}/readyz")
    return answer.status_code, answer.json()


# --- The evaluator goes down and comes back ----------------------------------------------------


@TRANSPORTS
async def test_evaluator_down_then_back(
    settings: Settings, evaluator: ServiceProcess, transport: str
) -> None:
    """Killed: a specific error within 2 s and /readyz 503. Restarted: served again, no restart."""
    with serve(create_app(settings.model_copy(update={"snekbox_url": evaluator.url}))) as url:
        async with connect(url, transport) as mcp:
            assert text_of(await call(mcp, "print('before')")).startswith("before\n")

            evaluator.kill()
            started = time.monotonic()
            result = await call(mcp, "print('during')")
            elapsed = time.monotonic() - started
            assert result.is_error
            assert UNREACHABLE in text_of(result) and DID_NOT_RUN in text_of(result)
            # Connection refused answers at once; the bound is far below the 30 s eval timeout.
            assert elapsed < 10, f"the error took {elapsed:.1f} s"
            reason = "the evaluation service is unreachable"
            assert await readyz(url) == (503, {"status": "unavailable", "reason": reason})

            await anyio.to_thread.run_sync(evaluator.start)
            assert await readyz(url) == (200, {"status": "ready"})
            result = await call(mcp, "print('after')")
            assert not result.is_error
            assert text_of(result).startswith("after\n")


# --- Fake evaluators: silent, talking nonsense, hanging up -------------------------------------


def fake_evaluator(status: int, body: bytes, content_type: str = "application/json") -> Starlette:
    """An evaluator answering every request with this status and body."""

    async def answer(request: Request) -> Response:
        return Response(body, status_code=status, media_type=content_type)

    return Starlette(routes=[Route("/eval", answer, methods=["POST", "OPTIONS"])])


@TRANSPORTS
async def test_evaluator_that_never_answers(
    settings: Settings, silent_server: str, transport: str
) -> None:
    """Bounded by eval_timeout, then a specific error; /readyz says the service is unhealthy."""
    gateway = settings.model_copy(update={"snekbox_url": silent_server, "eval_timeout": 1.5})
    with serve(create_app(gateway)) as url:
        async with connect(url, transport) as mcp:
            started = time.monotonic()
            result = await call(mcp, "print(1)")
            elapsed = time.monotonic() - started
        with anyio.fail_after(60):
            ready = await readyz(url)
    assert result.is_error
    assert text_of(result) == (
        "Error executing tool execute_python_code: The evaluation service did not answer "
        "within 1.5 s; the result is lost. Retry, and if the code is slow, make it faster "
        "or smaller."
    )
    assert 1.5 <= elapsed < 10, f"answered after {elapsed:.1f} s"
    reason = "the evaluation service is unhealthy (EvaluatorTimeout)"
    assert ready == (503, {"status": "unavailable", "reason": reason})


NOT_A_RESULT = "The evaluation service answered something that is not a result ("


@pytest.mark.parametrize(
    ("status", "body", "content_type", "message"),
    [
        pytest.param(
            200,
            b"hello",
            "text/plain",
            NOT_A_RESULT + "the answer is not JSON: Expecting value: line 1 column 1 (char 0)"
            "). Retry.",
            id="200-not-json",
        ),
        pytest.param(
            200,
            b'{"result": "ok"}',
            "application/json",
            NOT_A_RESULT + "'stdout' is missing or not a string). Retry.",
            id="200-json-wrong-shape",
        ),
        pytest.param(
            200,
            b'["stdout", "returncode"]',
            "application/json",
            NOT_A_RESULT + "expected a JSON object, got list). Retry.",
            id="200-json-list",
        ),
        pytest.param(
            200,
            b'{"stdout": "", "returncode": "0"}',
            "application/json",
            NOT_A_RESULT + "'returncode' is neither an integer nor null). Retry.",
            id="200-returncode-string",
        ),
        pytest.param(
            200,
            b'{"stdout": "", "returncode": 0, "files": [{"path": "x", "content": "%%%"}]}',
            "application/json",
            NOT_A_RESULT + "file 'x' has invalid base64 content). Retry.",
            id="200-bad-base64-file",
        ),
        pytest.param(
            500,
            b"<html><body>Internal Server Error</body></html>",
            "text/html",
            "The evaluation service rejected the request (500 HTTP 500: "
            "<html><body>Internal Server Error</body></html>).",
            id="500-html",
        ),
        pytest.param(
            503,
            b'{"title": "Busy"}',
            "application/json",
            "The evaluation service is busy (every slot is running and the queue is full); "
            "the code did not run. Retry in a few seconds.",
            id="503-busy",
        ),
        pytest.param(
            400,
            b'{"title": "Request body failed validation", "description": "args: too many"}',
            "application/json",
            "The evaluation service rejected the request (400 Request body failed validation: "
            "args: too many).",
            id="400-with-title",
        ),
    ],
)
async def test_evaluator_answering_garbage(
    settings: Settings, status: int, body: bytes, content_type: str, message: str
) -> None:
    fake = fake_evaluator(status, body, content_type)
    with serve(fake) as fake_url:
        gateway = settings.model_copy(update={"snekbox_url": fake_url})
        with serve(create_app(gateway)) as url:
            async with connect(url, "http") as mcp:
                result = await call(mcp, "print(1)")
                assert result.is_error
                assert text_of(result) == f"Error executing tool execute_python_code: {message}"
                # The gateway itself is fine: the next call gets the same clear answer.
                assert text_of(await call(mcp, "print(2)")) == text_of(result)


@pytest.fixture
def hang_up_server() -> Iterator[str]:
    """Reads each request whole and closes its connection without a word: a service that died
    running it. (Closed with the request unread, the connection would be reset, which tells the
    gateway the code did not run: ``tests/snekbox_client/test_plain_http.py`` tests that.)"""
    with raw_server(hang_up_after_reading) as url:
        yield url


@pytest.fixture
def silent_server() -> Iterator[str]:
    """Accepts every connection and never answers."""
    with raw_server() as url:
        yield url


async def test_evaluator_that_hangs_up(settings: Settings, hang_up_server: str) -> None:
    """Not "unreachable": a connection was made, and the gateway cannot know what ran."""
    with serve(create_app(settings.model_copy(update={"snekbox_url": hang_up_server}))) as url:
        async with connect(url, "sse") as mcp:
            result = await call(mcp, "print(1)")
    assert result.is_error
    text = text_of(result)
    assert text.startswith(f"Error executing tool execute_python_code: {LOST}"), text
    assert MAY_HAVE_RUN in text


# --- Clients that walk away: the sandbox must go with them ------------------------------------

SPIN = "print('spinning', flush=True)\nwhile True: pass"


def sandboxes() -> set[int]:
    """The running sandboxes of the built-in evaluator in this test process: the bwrap processes
    it started itself, not those of an evaluator it started as a process of its own (a
    session-scoped fixture's, whose pool may refill during a test and would never end)."""
    return {pid for pid, name in children(os.getpid()).items() if name == "bwrap"}


@pytest.fixture
def builtin_gateway(settings: Settings) -> Iterator[str]:
    """The gateway with the built-in evaluator in this process, and a 60 s time limit.

    No warm sandboxes: they are processes waiting by design, which the checks of what a test
    leaves would count (a cancelled warm run is tested in tests/evaluator/test_warm.py).
    """
    # A time limit far beyond what a kill takes on a loaded machine: a sandbox that the
    # cancellation did not reach lives on until it, and assert_gone tells the two apart.
    slow = with_evaluator(settings, time_limit=60, warm_sandboxes=0)
    before = sandboxes()
    with serve(create_app(slow)) as url:
        yield url
    # Whatever the test's verdict, leave no sandbox behind for the next test (the sessions'
    # live interpreters end with the gateway). The bound is the time limit's, past which no
    # sandbox lives whatever else happened: a loaded host took over 15 s to tear some down.
    wait_for(lambda: not (sandboxes() - before), 90, "sandboxes of the test end")


async def wait_for_sandbox(before: set[int]) -> set[int]:
    with anyio.fail_after(60):
        for _ in range(500):
            started = sandboxes() - before
            if started:
                return started
            await anyio.sleep(0.02)
    raise AssertionError("no sandbox started")


async def assert_gone(started: set[int], within: float = 20.0) -> None:
    deadline = time.monotonic() + within
    while started & sandboxes():
        assert time.monotonic() < deadline, (
            f"sandbox processes {sorted(started & sandboxes())} still run {within:g} s after "
            "the client went away"
        )
        await anyio.sleep(0.05)


async def still_serves(url: str) -> None:
    async with connect(url, "http") as mcp:
        result = await call(mcp, "print('still here')")
    assert text_of(result).startswith("still here\n")


@TRANSPORTS
async def test_cancelled_call_kills_the_sandbox(builtin_gateway: str, transport: str) -> None:
    """MCP cancellation: the SDK client sends notifications/cancelled when cancelled."""
    before = sandboxes()
    async with connect(builtin_gateway, transport) as mcp:
        async with anyio.create_task_group() as group:

            async def spin() -> None:
                await mcp.call_tool("execute_python_code", {"code": SPIN})

            group.start_soon(spin)
            started = await wait_for_sandbox(before)
            await anyio.sleep(0.5)
            group.cancel_scope.cancel()
        await assert_gone(started)
    await still_serves(builtin_gateway)


@pytest.mark.parametrize("transport", ["sse", "http-session-deleted"])
async def test_disconnected_client_kills_the_sandbox(builtin_gateway: str, transport: str) -> None:
    """The client's connection drops mid-evaluation, without any cancellation message.

    SSE: the stream closes, which ends the session. Streamable HTTP, 2025 era: the POST's
    response stream closes and the session ends with DELETE /mcp. A dropped POST stream alone
    does not cancel in that era: the spec says a disconnect is not a cancellation (the session
    lives on; the run ends at its time limit). In the 2026-07-28 era closing the stream is the
    cancellation, which test_cancelled_call_kills_the_sandbox[http] covers through the SDK.
    """
    before = sandboxes()
    tools_call = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "execute_python_code", "arguments": {"code": SPIN}},
    }
    async with httpx.AsyncClient(base_url=builtin_gateway, timeout=30) as http:
        if transport.startswith("http"):
            session = await anyio.to_thread.run_sync(lambda: RawSession(builtin_gateway))
            await anyio.to_thread.run_sync(session.initialize)
            headers = {
                "Accept": ACCEPT,
                "mcp-session-id": str(session.session_id),
                "MCP-Protocol-Version": PROTOCOL_VERSION,
            }
            async with http.stream("POST", "/mcp", headers=headers, json=tools_call) as answer:
                assert answer.status_code == 200
                started = await wait_for_sandbox(before)
                await anyio.sleep(0.5)
            # Leaving the block closed the response: the connection is gone.
            if transport == "http-session-deleted":
                assert (await http.delete("/mcp", headers=headers)).status_code == 200
        else:
            async with http.stream("GET", "/sse") as stream:
                lines = stream.aiter_lines()
                endpoint = await sse_endpoint(lines)
                for message in (
                    {
                        "jsonrpc": "2.0",
                        "id": 0,
                        "method": "initialize",
                        "params": {
                            "protocolVersion": PROTOCOL_VERSION,
                            "capabilities": {},
                            "clientInfo": {"name": "faults", "version": "0"},
                        },
                    },
                    {"jsonrpc": "2.0", "method": "notifications/initialized"},
                    tools_call,
                ):
                    assert (await http.post(endpoint, json=message)).status_code == 202
                started = await wait_for_sandbox(before)
                await anyio.sleep(0.5)
            # Leaving the block closed the SSE stream: the session is gone.
    await assert_gone(started)
    await still_serves(builtin_gateway)


# --- Kill and restart the evaluator during a load run ------------------------------------------

SESSIONS = 4
CALLS = 12


async def test_kill_and_restart_evaluator_under_load(
    settings: Settings, evaluator: ServiceProcess
) -> None:
    """4 sessions (2 SSE, 2 Streamable HTTP) call while the evaluator is killed and restarted.

    Every call either succeeds with its own token in its output or gets the "unreachable" tool
    error, or, for a call in flight when the evaluator died, "the connection was lost"; each
    session succeeds again after the restart. The gateway is never restarted.
    """
    outcomes: list[tuple[int, str, str, float]] = []  # session, token, outcome, time
    restarted_at = float("inf")
    restarted = anyio.Event()

    async def session(number: int, url: str) -> None:
        transport = "sse" if number % 2 else "http"
        successes_after_restart = 0
        async with connect(url, transport) as mcp:
            i = 0
            while i < CALLS or successes_after_restart < 2:
                i += 1
                token = f"s{number}-c{i}-{time.monotonic_ns()}"
                sent = time.monotonic()
                result = await call(mcp, f"print({token!r})")
                text = text_of(result)
                if result.is_error:
                    assert (UNREACHABLE in text and DID_NOT_RUN in text) or (
                        LOST in text and MAY_HAVE_RUN in text
                    ), text
                    outcomes.append((number, token, "unreachable", sent))
                    await anyio.sleep(0.05)
                else:
                    assert result.structured_content["stdout"] == token + "\n", (token, text)
                    outcomes.append((number, token, "ok", sent))
                    if restarted.is_set() and sent > restarted_at:
                        successes_after_restart += 1

    async def kill_and_restart() -> None:
        nonlocal restarted_at
        await anyio.sleep(1.0)
        evaluator.kill()
        await anyio.sleep(1.0)
        await anyio.to_thread.run_sync(evaluator.start)
        restarted_at = time.monotonic()
        restarted.set()

    with serve(create_app(settings.model_copy(update={"snekbox_url": evaluator.url}))) as url:
        with anyio.fail_after(60):
            async with anyio.create_task_group() as group:
                group.start_soon(kill_and_restart)
                for number in range(SESSIONS):
                    group.start_soon(session, number, url)

    by_outcome = {kind: [o for o in outcomes if o[2] == kind] for kind in ("ok", "unreachable")}
    assert by_outcome["unreachable"], "the kill was not seen by any call"
    assert len({token for _, token, _, _ in outcomes}) == len(outcomes)
    for number in range(SESSIONS):
        mine = [o for o in outcomes if o[0] == number]
        assert len(mine) >= CALLS
        assert any(o[2] == "ok" and o[3] > restarted_at for o in mine)
