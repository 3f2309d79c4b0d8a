"""The gateway's edge: bounded sessions, slow and surplus clients, loopback only without a token.

The gateway runs as its own process (``python -m python_mcp_server``) with small bounds: 50
sessions, a 3 s request timeout, 300 connections. Floods and stalls go out on real loopback
sockets; the loopback guard is tested with the uvicorn CLI inside network namespaces, against a
client whose source address is not loopback.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp import Client

from serving.protocol import MAX_HEAD_BYTES
from tests.gateway.harness import (
    ACCEPT,
    PROTOCOL_VERSION,
    RawSession,
    ServiceProcess,
    gateway_process,
    running,
    wait_for,
)
from tests.slow_clients import (
    KEPT_PAST,
    MANY,
    SMALL_CAP,
    answered_after_a_pause,
    drop_many,
    head,
    padded,
    read_until_closed,
    refuse_beyond_cap,
    room_made_at_cap,
    stall,
    trickle,
)
from tests.support import closed_port, connect, text_of

pytestmark = pytest.mark.anyio

MAX_SESSIONS = 50
REQUEST_TIMEOUT = 3
MAX_CONNECTIONS = 300
#: initialize requests of the flood: 20 times the cap (the SDK's own cap is 10,000).
FLOOD = 1000
#: How much the gateway's memory may grow over the flood: keeping its sessions would take ~36 MiB
#: (measured: 35-40 KiB each); with the cap, it grows by about 3 MiB.
GROWTH_KIB = 16 * 1024
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {
        "protocolVersion": PROTOCOL_VERSION,
        "capabilities": {},
        "clientInfo": {"name": "flood", "version": "0"},
    },
}
SIX_TIMES_SEVEN = {"code": "print(6 * 7)"}


@pytest.fixture(scope="module")
def gateway() -> Iterator[ServiceProcess]:
    """The gateway of the floods: the default request deadline (20 s), since a loaded machine
    may take seconds between opening a flood's connection and sending its request."""
    env = {
        "MCP_MAX_TRANSPORT_SESSIONS": str(MAX_SESSIONS),
        "MCP_MAX_CONNECTIONS": str(MAX_CONNECTIONS),
        "EVALUATOR_TIME_LIMIT": "30",
    }
    with running(gateway_process(env)) as service:
        yield service


@pytest.fixture(scope="module")
def guarded() -> Iterator[ServiceProcess]:
    """The gateway of the slow clients: a short request deadline, so that they are dropped fast."""
    env = {
        "MCP_REQUEST_TIMEOUT": str(REQUEST_TIMEOUT),
        "MCP_MAX_CONNECTIONS": str(MAX_CONNECTIONS),
        "EVALUATOR_TIME_LIMIT": "30",
    }
    with running(gateway_process(env)) as service:
        yield service


def session_client(base_url: str, transport: str) -> Client:
    """An SDK client that opens a session: SSE, or Streamable HTTP with the classic handshake.

    (In its default mode the client first tries the sessionless 2026 protocol, which a session
    bound cannot affect.)
    """
    return connect(base_url, transport, mode="auto" if transport == "sse" else "legacy")


async def flood(base_url: str, count: int) -> list[str]:
    """``count`` initialize POSTs, 16 at a time, each opening a session never used again."""
    session_ids: list[str] = []
    limit = anyio.Semaphore(16)
    headers = {"Accept": ACCEPT, "Content-Type": "application/json"}

    async def initialize(http: httpx.AsyncClient) -> None:
        async with limit:
            answer = await http.post("/mcp", json=INITIALIZE, headers=headers)
        assert answer.status_code == 200, answer.text
        session_ids.append(answer.headers["mcp-session-id"])

    limits = httpx.Limits(max_connections=16)
    async with httpx.AsyncClient(base_url=base_url, timeout=30, limits=limits) as http:
        with anyio.fail_after(120):
            async with anyio.create_task_group() as group:
                for _ in range(count):
                    group.start_soon(initialize, http)
    return session_ids


def assert_ran(result: Any) -> None:
    """The result of ``print(6 * 7)``: it ran, and printed 42."""
    assert not result.is_error and text_of(result).startswith("42\n"), result


def rss_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1))  # type: ignore[union-attr]


def metric(base_url: str, name: str) -> float:
    text = httpx.get(f"{base_url}/metrics").text
    return float(re.search(rf"^{name} (\S+)$", text, re.MULTILINE).group(1))  # type: ignore[union-attr]


def session_answers(base_url: str, session_id: str) -> int:
    """The status a ping in session ``session_id`` gets (404 once the session is gone)."""
    headers = {
        "Accept": ACCEPT,
        "mcp-session-id": session_id,
        "MCP-Protocol-Version": PROTOCOL_VERSION,
    }
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    return httpx.post(f"{base_url}/mcp", json=ping, headers=headers).status_code


# --- sessions -----------------------------------------------------------------------------------


async def test_a_session_flood_does_not_lock_out_new_clients(gateway: ServiceProcess) -> None:
    async with session_client(gateway.url, "http") as warm:  # the baseline includes a real call
        await warm.call_tool("execute_python_code", SIX_TIMES_SEVEN)
    rss_before = rss_kib(gateway.pid)

    session_ids = await flood(gateway.url, FLOOD)
    assert len(session_ids) == FLOOD, "every initialize of the flood was answered 200"

    with anyio.fail_after(30):  # a new client connects and calls within seconds
        async with session_client(gateway.url, "http") as client:
            result = await client.call_tool("execute_python_code", SIX_TIMES_SEVEN)
    assert_ran(result)

    assert metric(gateway.url, "mcp_sessions_open") <= MAX_SESSIONS
    assert metric(gateway.url, "mcp_sessions_evicted_total") >= FLOOD - MAX_SESSIONS
    # The oldest are gone: 20 of those made before the last 2 x MAX_SESSIONS (the flood sends
    # 16 at once, so which of the newest few survive depends on the order the answers came in).
    for session_id in session_ids[: FLOOD - 2 * MAX_SESSIONS : FLOOD // 20]:
        assert session_answers(gateway.url, session_id) == 404
    assert session_answers(gateway.url, session_ids[-1]) == 200, "the newest live on"
    grown = rss_kib(gateway.pid) - rss_before
    assert grown < GROWTH_KIB, f"the gateway's memory grew by {grown} KiB"


SSE_FLOOD = 3 * MAX_SESSIONS


async def test_an_sse_flood_does_not_lock_out_new_clients(gateway: ServiceProcess) -> None:
    """Held-open SSE streams count as sessions: beyond the cap, the oldest idle are ended."""
    request = f"GET /sse HTTP/1.1\r\nHost: 127.0.0.1:{gateway.port}\r\nAccept: text/event-stream"
    streams, tails = [], []
    with anyio.fail_after(60):
        for _ in range(SSE_FLOOD):
            stream = await stall(gateway.port, f"{request}\r\n\r\n".encode())
            received = b""
            while b"session_id=" not in received:
                received += await stream.receive()
            streams.append(stream)
            tails.append(received[-8:])  # the end of the last chunk: the terminator's start
    ended = [False] * SSE_FLOOD
    enough_ended = anyio.Event()

    async def watch(index: int) -> None:
        received = tails[index]
        try:
            while b"\r\n0\r\n\r\n" not in received:  # the end of the chunked stream
                received = received[-8:] + await streams[index].receive()
        except (anyio.EndOfStream, anyio.BrokenResourceError):
            pass
        ended[index] = True
        if sum(ended) >= SSE_FLOOD - MAX_SESSIONS:
            enough_ended.set()

    try:
        async with anyio.create_task_group() as group:
            for index in range(SSE_FLOOD):
                group.start_soon(watch, index)
            with anyio.fail_after(30):
                await enough_ended.wait()
            assert ended == [True] * (SSE_FLOOD - MAX_SESSIONS) + [False] * MAX_SESSIONS, (
                "the oldest streams were ended, the newest live on"
            )
            with anyio.fail_after(30):
                async with session_client(gateway.url, "sse") as client:
                    result = await client.call_tool("execute_python_code", SIX_TIMES_SEVEN)
            assert_ran(result)
            assert sum(not e for e in ended) <= MAX_SESSIONS
            group.cancel_scope.cancel()
    finally:
        for stream in streams:
            await stream.aclose()


async def test_an_sse_session_whose_requests_were_answered_is_idle(
    gateway: ServiceProcess,
) -> None:
    """A ping POSTed and answered leaves the SSE session idle: a flood then ends its stream."""
    request = f"GET /sse HTTP/1.1\r\nHost: 127.0.0.1:{gateway.port}\r\nAccept: text/event-stream"
    async with await stall(gateway.port, f"{request}\r\n\r\n".encode()) as stream:
        with anyio.fail_after(30):
            received = b""
            while not (found := re.search(rb"data: (/messages/\?session_id=\w+)\r\n", received)):
                received += await stream.receive()
            ping = {"jsonrpc": "2.0", "id": 5, "method": "ping"}
            async with httpx.AsyncClient(base_url=gateway.url) as http:
                answer = await http.post(found.group(1).decode(), json=ping)
            assert answer.status_code == 202
            while b'{"jsonrpc":"2.0","id":5,"result":{}}' not in received:
                received += await stream.receive()
        await flood(gateway.url, 2 * MAX_SESSIONS)
        with anyio.fail_after(30):
            while b"\r\n0\r\n\r\n" not in received:  # the end of the chunked stream
                received += await stream.receive()


@pytest.mark.parametrize("transport", ["sse", "http"])
async def test_a_session_with_a_call_in_flight_is_not_closed(
    gateway: ServiceProcess, transport: str
) -> None:
    """The session with a call running is the oldest, yet a flood closes only idle ones.

    The call runs until the test interrupts it (a flood on a loaded host may take longer than
    any sleep), then answers over the session the flood left open."""
    slow = "import time\ntry:\n    time.sleep(3000)\nexcept KeyboardInterrupt:\n    print('done')"
    results: list[Any] = []
    async with session_client(gateway.url, transport) as client:
        first = await client.call_tool("execute_python_code", {"code": "x = 1"})
        session_id = first.structured_content["session_id"]
        arguments = {"code": slow, "session_id": session_id, "wait_seconds": 3000}

        async def call() -> None:
            results.append(await client.call_tool("execute_python_code", arguments))

        with anyio.fail_after(300):
            async with anyio.create_task_group() as group:
                group.start_soon(call)
                await anyio.to_thread.run_sync(
                    wait_for,
                    lambda: metric(gateway.url, "mcp_running_cells") == 1,
                    60,
                    "the call is running",
                )
                await flood(gateway.url, 3 * MAX_SESSIONS)
                assert results == [], "the call ended before it was interrupted"
                async with connect(gateway.url, "http") as other:
                    await other.call_tool("interrupt", {"session_id": session_id})
            assert not results[0].is_error and text_of(results[0]).startswith("done\n"), results
            again = await client.call_tool("execute_python_code", SIX_TIMES_SEVEN)
        assert_ran(again)


def test_an_idle_session_expires() -> None:
    with running(gateway_process({"MCP_TRANSPORT_SESSION_IDLE_TIMEOUT": "1"})) as service:
        session = RawSession(service.url).initialize()
        assert session.session_id is not None
        assert metric(service.url, "mcp_sessions_open") == 1
        # Watched through the metric: a request in the session would keep it active.
        wait_for(lambda: metric(service.url, "mcp_sessions_open") == 0, 30, "the session closes")
        assert session_answers(service.url, session.session_id) == 404


# --- slow and surplus clients -------------------------------------------------------------------

BODY = json.dumps(INITIALIZE).encode()


def mcp_head(guarded: ServiceProcess) -> bytes:
    return head(guarded.port, "POST", "/mcp", len(BODY))


async def test_a_half_sent_head_is_dropped(guarded: ServiceProcess) -> None:
    async with await stall(guarded.port, mcp_head(guarded)[:40]) as stream:
        answer = await read_until_closed(stream)
    assert answer.startswith(b"HTTP/1.1 408 Request Timeout\r\n"), answer
    assert answer.endswith(b"The request headers did not arrive within 3 s.\n")


async def test_a_head_sent_a_byte_at_a_time_is_dropped_too(guarded: ServiceProcess) -> None:
    async with await stall(guarded.port, b"") as stream, anyio.create_task_group() as group:
        group.start_soon(trickle, stream, mcp_head(guarded))
        answer = await read_until_closed(stream)
    assert answer.startswith(b"HTTP/1.1 408 Request Timeout\r\n"), answer


async def test_a_connection_that_sends_nothing_is_closed(guarded: ServiceProcess) -> None:
    async with await stall(guarded.port, b"") as stream:
        assert await read_until_closed(stream) == b""


@pytest.mark.parametrize("send", ["stall", "trickle"])
async def test_a_half_sent_body_is_dropped(guarded: ServiceProcess, send: str) -> None:
    async with (
        await stall(guarded.port, mcp_head(guarded) + BODY[:10]) as stream,
        anyio.create_task_group() as group,
    ):
        if send == "trickle":
            group.start_soon(trickle, stream, BODY[10:])
        answer = await read_until_closed(stream)
    assert answer.startswith(b"HTTP/1.1 408 Request Timeout\r\n"), answer
    assert answer.endswith(b"The request body did not arrive within 3 s.\n")


async def test_a_request_sent_in_time_is_answered(guarded: ServiceProcess) -> None:
    async with await stall(guarded.port, mcp_head(guarded) + BODY) as stream:
        with anyio.fail_after(30):
            answer = b""
            while b'"serverInfo"' not in answer:
                answer += await stream.receive()
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n")


async def test_a_head_past_its_bound_is_refused_at_once(guarded: ServiceProcess) -> None:
    long_head = padded(mcp_head(guarded), MAX_HEAD_BYTES, finished=False)
    async with await stall(guarded.port, long_head) as stream:
        answer = await read_until_closed(stream)
    assert answer.startswith(b"HTTP/1.1 400 Bad Request\r\n"), answer


async def test_an_idle_connection_outlives_the_clients_keep_alive(guarded: ServiceProcess) -> None:
    """Kept open past httpx's 5 s (uvicorn's own timeout too): the client never sends on a
    connection the gateway is closing."""
    heads = await answered_after_a_pause(guarded.port, "/healthz", KEPT_PAST)
    assert [h.split(b"\r\n", 1)[0] for h in heads] == [b"HTTP/1.1 200 OK"] * 2, heads


@pytest.mark.parametrize("part", ["head", "body"])
async def test_many_stalled_clients_are_all_dropped(guarded: ServiceProcess, part: str) -> None:
    data = mcp_head(guarded)[:40] if part == "head" else mcp_head(guarded) + BODY[:10]
    answers = await drop_many(guarded, data, ("GET", "/readyz"))
    assert len(answers) == MANY
    assert all(answer.startswith(b"HTTP/1.1 408 ") for answer in answers)


async def test_a_connection_beyond_the_cap_is_refused(guarded: ServiceProcess) -> None:
    answer = await refuse_beyond_cap(guarded, MAX_CONNECTIONS, mcp_head(guarded)[:40])
    assert answer.startswith(b"HTTP/1.1 503 Service Unavailable\r\n"), answer
    assert b"Too many connections (300 are open)" in answer
    with anyio.fail_after(30):
        async with session_client(guarded.url, "http") as client:
            result = await client.call_tool("execute_python_code", SIX_TIMES_SEVEN)
    assert_ran(result)


async def test_at_the_cap_the_connection_idle_the_longest_makes_room() -> None:
    """Idle kept-alive connections (clients that keep them, 75 s at most) lock out no one."""
    env = {"MCP_MAX_CONNECTIONS": str(SMALL_CAP), "EVALUATOR_WARM_SANDBOXES": "0"}
    with running(gateway_process(env)) as service:
        await room_made_at_cap(service, "/healthz")


# --- loopback only without a token --------------------------------------------------------------

SERVER_ADDRESS, CLIENT_ADDRESS = "198.18.0.1", "198.18.0.2"

#: Run inside a namespace: wait for the gateway, then send the requests given as JSON on argv[1]
#: and print each answer's status and text (JSON).
CLIENT = """
import json, sys, time, httpx
base, requests = sys.argv[1], json.loads(sys.argv[2])
deadline = time.monotonic() + 60
while True:
    try:
        httpx.get(base + "/healthz", timeout=2)
        break
    except httpx.TransportError:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.1)
answers = []
with httpx.Client(base_url=base, timeout=60, trust_env=False) as http:
    for method, path, headers, body in requests:
        with http.stream(method, path, headers=headers, json=body) as answer:
            # An SSE stream that was let in never ends: its status is the answer.
            text = "" if path == "/sse" and answer.status_code == 200 else answer.read().decode()
        answers.append([answer.status_code, text])
        if "mcp-session-id" in answer.headers:
            sid = {"mcp-session-id": answer.headers["mcp-session-id"],
                   "MCP-Protocol-Version": "2025-11-25"}
            http.headers.update(sid)
print(json.dumps(answers))
"""


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@pytest.fixture(scope="module")
def namespaces() -> Iterator[tuple[str, str]]:
    """Two network namespaces joined by a veth pair: the server's and a remote client's.

    The gateway listens on 0.0.0.0 inside its own namespace, so that it is reachable only
    through that namespace's loopback and the veth pair, never from the machine's network.
    """
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 to create network namespaces")
    tag = f"{os.getpid() % 100000}"
    server, client = f"mcpgw-s{tag}", f"mcpgw-c{tag}"
    try:
        _ip("netns", "add", server)
        _ip("netns", "add", client)
        _ip("link", "add", f"vs{tag}", "type", "veth", "peer", "name", f"vc{tag}")
        _ip("link", "set", f"vs{tag}", "netns", server)
        _ip("link", "set", f"vc{tag}", "netns", client)
        for namespace, device, address in (
            (server, f"vs{tag}", SERVER_ADDRESS),
            (client, f"vc{tag}", CLIENT_ADDRESS),
        ):
            _ip("-n", namespace, "addr", "add", f"{address}/30", "dev", device)
            _ip("-n", namespace, "link", "set", device, "up")
            _ip("-n", namespace, "link", "set", "lo", "up")
        yield server, client
    finally:
        for namespace in (server, client):  # deleting them deletes the veth pair too
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True, timeout=30)


def requests_from(namespace: str, base_url: str, *requests: Any) -> list[list[Any]]:
    """Send ``requests`` ([method, path, headers, body]) from inside ``namespace``."""
    command = ["ip", "netns", "exec", namespace, sys.executable, "-c", CLIENT]
    done = subprocess.run(
        [*command, base_url, json.dumps(requests)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    answers: list[list[Any]] = json.loads(done.stdout)
    return answers


def mcp_request(method: str, params: Any, headers: dict[str, str], request_id: int = 1) -> Any:
    body = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
    return ["POST", "/mcp", {"Accept": ACCEPT, **headers}, body]


def initialized(headers: dict[str, str]) -> Any:
    body = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    return ["POST", "/mcp", {"Accept": ACCEPT, **headers}, body]


def tool_call(headers: dict[str, str]) -> Any:
    params = {"name": "execute_python_code", "arguments": SIX_TIMES_SEVEN}
    return mcp_request("tools/call", params, headers, request_id=2)


@pytest.fixture(scope="module")
def uvicorn_cli() -> Path:
    return Path(sys.executable).parent / "uvicorn"


@pytest.mark.parametrize(
    ("env", "remote_status"),
    [({}, 403), ({"MCP_AUTH_TOKEN": "t0ken"}, 200), ({"MCP_ALLOW_UNAUTHENTICATED": "true"}, 200)],
    ids=["no-token", "token", "allow-unauthenticated"],
)
def test_the_uvicorn_command_serves_the_network_only_with_a_token_or_the_opt_out(
    namespaces: tuple[str, str], uvicorn_cli: Path, env: dict[str, str], remote_status: int
) -> None:
    server_ns, client_ns = namespaces
    port = closed_port()
    environ = {**os.environ, "MCP_LOG_LEVEL": "warning", "SNEKBOX_URL": "", **env}
    for name in ("MCP_AUTH_TOKEN", "MCP_AUTH_TOKEN_FILE", "MCP_ALLOW_UNAUTHENTICATED"):
        if name not in env:
            environ.pop(name, None)
    command = [str(uvicorn_cli), "python_mcp_server:starlette_app", "--host", "0.0.0.0"]
    command += ["--log-level", "warning"]
    process = subprocess.Popen(
        ["ip", "netns", "exec", server_ns, *command, "--port", str(port)], env=environ
    )
    try:
        # The Host header a remote attacker would send to pass the DNS-rebinding check.
        spoofed = {"Host": f"127.0.0.1:{port}", "X-Forwarded-For": "127.0.0.1"}
        if "MCP_AUTH_TOKEN" in env:
            spoofed["Authorization"] = f"Bearer {env['MCP_AUTH_TOKEN']}"
        remote = requests_from(
            client_ns,
            f"http://{SERVER_ADDRESS}:{port}",
            mcp_request("initialize", INITIALIZE["params"], spoofed, request_id=0),
            initialized(spoofed),
            tool_call(spoofed),
            ["GET", "/sse", spoofed, None],
            ["GET", "/healthz", spoofed, None],
        )
        (init_status, init_text), _, (call_status, call_text), (sse_status, _), health = remote
        assert health == [200, '{"status":"ok"}'], "the health routes answer anyone"
        if remote_status == 403:
            assert (init_status, call_status, sse_status) == (403, 403, 403)
            assert f"this request came from {CLIENT_ADDRESS} (to {SERVER_ADDRESS})" in init_text
            assert "set MCP_AUTH_TOKEN" in init_text
            assert "MCP_ALLOW_UNAUTHENTICATED=true" in init_text
        else:
            assert (init_status, call_status) == (200, 200), (init_text, call_text)
            assert '"text":"42\\n' in call_text
        if not env:  # and from loopback, the same gateway runs code
            local = requests_from(
                server_ns,
                f"http://127.0.0.1:{port}",
                mcp_request("initialize", INITIALIZE["params"], {}, request_id=0),
                initialized({}),
                tool_call({}),
            )
            assert [status for status, _ in local] == [200, 202, 200], local
            assert '"text":"42\\n' in local[2][1]
    finally:
        process.terminate()
        process.wait(timeout=30)
