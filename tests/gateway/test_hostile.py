"""Hostile input at the gateway: a table of attacks, each with the exact answer it must get.

One gateway serves the whole module, as its own process (``python -m python_mcp_server``) with
bearer authentication on (``MCP_AUTH_TOKEN`` in its environment, where the sandbox must not find
it), the built-in evaluator, a 2 s time limit and a 100,000-character code limit. Requests go
out as raw JSON-RPC over Streamable HTTP (an initialized session, the token and the protocol
version header sent unless a row says otherwise), so that the table can send what no real client
would; the answers are what the mcp SDK and the gateway really say, pinned exactly. The last
test checks that after all this the gateway still serves both transports and leaked nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import struct
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from serving.protocol import KEEP_ALIVE_TIMEOUT
from tests.gateway.harness import (
    ACCEPT,
    PROTOCOL_VERSION,
    RawSession,
    ServiceProcess,
    gateway_process,
    jsonrpc_messages,
    only_warm_sandboxes,
    open_fds,
    wait_for,
)
from tests.support import assert_all_enforced_as_root, connect, memory_is_a_cgroup, text_of

pytestmark = pytest.mark.anyio

TOKEN = "hostile-" + secrets.token_hex(16)
#: Far above what the calls that must finish need (a 100-inch figure: ~1 s idle), so a loaded
#: machine never turns one into a kill; only code that never ends meets it.
TIME_LIMIT = 15
#: Warm sandboxes: the default's, set so that the checks of what is left can count them.
WARM = 2
MAX_CODE = 100_000
MiB = 1024 * 1024
#: A marker only the code of the table carries: it must never reach the gateway's log.
CODE_MARKER = "marker-" + secrets.token_hex(8)


@dataclass
class Gateway:
    service: ServiceProcess
    session_id: str
    log: Path
    fds_at_start: int

    @property
    def url(self) -> str:
        return self.service.url

    def headers(self) -> dict[str, str]:
        return {
            "Accept": ACCEPT,
            "Content-Type": "application/json",
            "Authorization": f"Bearer {TOKEN}",
            "mcp-session-id": self.session_id,
            "MCP-Protocol-Version": PROTOCOL_VERSION,
        }


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    log = tmp_path_factory.mktemp("hostile") / "gateway.log"
    env = {
        "MCP_AUTH_TOKEN": TOKEN,
        "MCP_LOG_LEVEL": "info",
        "MCP_MAX_CODE_CHARS": str(MAX_CODE),
        "EVALUATOR_TIME_LIMIT": str(TIME_LIMIT),
        "EVALUATOR_WARM_SANDBOXES": str(WARM),
        # Not more as calls come: the checks after a flood count the warm sandboxes exactly.
        "EVALUATOR_WARM_SANDBOXES_MAX": str(WARM),
    }
    service = gateway_process(env, log)
    service.start()
    try:
        session = RawSession(service.url, TOKEN).initialize()
        assert session.session_id is not None
        # The baseline: the warm sandboxes made (their descriptors are the gateway's too).
        wait_for(lambda: only_warm_sandboxes(service.pid, WARM), 240, "the warm sandboxes")
        yield Gateway(service, session.session_id, log, open_fds(service.pid))
    finally:
        service.stop()


# --- What is sent --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Post:
    """One POST. ``body`` is sent as JSON; ``raw`` as bytes. ``drop`` leaves headers out."""

    body: Any = None
    raw: bytes | None = None
    path: str = "/mcp"
    headers: Mapping[str, str] = field(default_factory=dict)
    drop: tuple[str, ...] = ()


def call(arguments: Any, request_id: int = 7) -> dict[str, Any]:
    """A ``tools/call`` of execute_python_code with these arguments."""
    params = {"name": "execute_python_code", "arguments": arguments}
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}


def run(code: str) -> Post:
    return Post(call({"code": code}))


def raw_call(code_json: str) -> bytes:
    """A tools/call body whose code is the JSON string text ``code_json``, byte for byte."""
    prefix = '{"jsonrpc":"2.0","id":7,"method":"tools/call","params":'
    return (
        f'{prefix}{{"name":"execute_python_code","arguments":{{"code":"{code_json}"}}}}}}'.encode(
            "utf-8", "surrogatepass"
        )
    )


# --- What must come back ------------------------------------------------------------------------


@dataclass(frozen=True)
class Http:
    """A plain HTTP answer: status, exact body (text, or JSON when a dict), some headers."""

    status: int
    body: str | dict[str, Any]
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class RpcError:
    """A JSON-RPC error: the HTTP status, the code, the exact message (or its start + parts)."""

    status: int
    code: int
    message: str
    exact: bool = True
    parts: tuple[str, ...] = ()
    id: Any = None


@dataclass(frozen=True)
class ToolError:
    """A tool result with isError: its one text block contains ``text``."""

    text: str


@dataclass(frozen=True)
class Result:
    """A normal tool result: status, returncode, text fragments, images; the answer's size."""

    status: str
    returncode: int | None
    text: tuple[str, ...] = ()
    returned: int = 0
    dropped: int = 0
    check: Callable[[dict[str, Any]], None] | None = None
    #: Other (status, returncode) pairs that are as right.
    also: tuple[tuple[str, int], ...] = ()
    #: The limit the case needs enforced: skipped where /readyz says this host cannot.
    needs: str | None = None


Flow = Callable[[Gateway], Awaitable[None]]
Expected = Http | RpcError | ToolError | Result | int


AUTH_REQUIRED = Http(
    401,
    {"error": "invalid_token", "error_description": "Authentication required"},
    {
        "www-authenticate": 'Bearer error="invalid_token", '
        'error_description="Authentication required"'
    },
)
NO_ANSWER = 202  # accepted as a notification: no JSON-RPC answer at all


def validation(*parts: str) -> RpcError:
    return RpcError(400, -32602, "Validation error: ", exact=False, parts=parts)


def wrong_type(value: str, kind: str) -> ToolError:
    return ToolError(
        "Error executing tool execute_python_code: 1 validation error for "
        "execute_python_codeArguments\ncode\n  Input should be a valid string "
        f"[type=string_type, input_value={value}, input_type={kind}]"
    )


# --- The sandbox-side attacks -----------------------------------------------------------------

FORK_COUNT = """
import os, time
n = 0
try:
    while True:
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
        n += 1
except OSError as exc:
    print('refused after', n, 'forks:', type(exc).__name__)
"""

FORK_SPIN = """
import os
while True:
    try:
        os.fork()
    except OSError:
        pass
"""

FIGURES_100 = """
import matplotlib.pyplot as plt
for i in range(100):
    plt.figure(figsize=(1, 1), dpi=10)
print('drawn')
"""

HUGE_FIGURE = """
import matplotlib.pyplot as plt, numpy as np
fig = plt.figure(figsize=(100, 100))  # 10,000 x 10,000 pixels at the default 100 dpi
fig.figimage(np.random.default_rng(0).integers(0, 256, (600, 600, 3), dtype=np.uint8))
print('drawn')
"""


def png_file(mib: int) -> str:
    """Code writing ``figure_001.png``: a PNG header claiming 20,000 x 20,000, then noise."""
    header = b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR"
    header += struct.pack(">II", 20000, 20000) + b"\x08\x06\x00\x00\x00"
    return (
        "import os\n"
        "with open('figure_001.png', 'wb') as f:\n"
        f"    f.write({header!r})\n"
        f"    for _ in range({mib}):\n"
        "        f.write(os.urandom(1 << 20))\n"
        "print('written')\n"
    )


NEEDLE = f"needle = bytes.fromhex({TOKEN.encode().hex()!r})\n"  # the token, never spelled out

TOKEN_IN_ENVIRON = NEEDLE + (
    "import os\n"
    "print(sorted(os.environ))\n"
    "print('found:', [k for k, v in os.environ.items() if needle in (k + v).encode()])\n"
)

TOKEN_IN_OWN_PROC = NEEDLE + (
    "for path in ('/proc/self/environ', '/proc/1/environ', '/proc/self/cmdline'):\n"
    "    data = open(path, 'rb').read()\n"
    "    print(path, len(data), needle in data)\n"
)

TOKEN_IN_ANY_PROC = NEEDLE + (
    "import glob, os\n"
    "paths = glob.glob('/proc/*/environ') + glob.glob('/proc/*/cmdline')\n"
    "paths += glob.glob('/proc/*/task/*/environ')\n"
    "hits, read = [], 0\n"
    "for path in paths:\n"
    "    try:\n"
    "        data = open(path, 'rb').read()\n"
    "    except OSError:\n"
    "        continue\n"
    "    read += 1\n"
    "    if needle in data:\n"
    "        hits.append(path)\n"
    "print('pids:', sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))\n"
    "print('read', read > 0, 'hits', hits)\n"
)


def _token_nowhere(structured: dict[str, Any]) -> None:
    assert TOKEN not in json.dumps(structured)


def _own_proc(structured: dict[str, Any]) -> None:
    lines = [line.split() for line in structured["stdout"].splitlines()]
    assert [path for path, _, _ in lines] == [
        "/proc/self/environ",
        "/proc/1/environ",
        "/proc/self/cmdline",
    ]
    assert [found for _, _, found in lines] == ["False"] * 3
    assert lines[1][1] == "0", "the sandbox's init has an empty environment"
    _token_nowhere(structured)


#: A memory bomb's end without a memory cgroup (an ordinary user's address-space rlimit): the
#: allocation fails, and the code ends with the exception.
_MEMORY_ERROR = Result("exception", 1, ("MemoryError",))


def _fd_targets(pid: int) -> list[str]:
    """What ``pid``'s file descriptors point at (sockets, pipes, files), for a failure's message."""
    targets = []
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):  # closed meanwhile
            targets.append(os.readlink(fd))
    return sorted(targets)


def _few_forks(structured: dict[str, Any]) -> None:
    forks = re.fullmatch(r"refused after (\d+) forks: BlockingIOError\n", structured["stdout"])
    assert forks and int(forks.group(1)) < 64, structured["stdout"]


def _huge_figure(structured: dict[str, Any]) -> None:
    (image,) = structured["images"]
    assert (image["path"], image["width"], image["height"]) == ("figure_001.png", 2000, 2000)
    assert image["size"] > 512 * 1024 and image["returned"] is False


def _png_file(structured: dict[str, Any]) -> None:
    (image,) = structured["images"]
    assert (image["path"], image["width"], image["returned"]) == ("figure_001.png", 20000, False)
    assert image["size"] > 40 * MiB


# --- Flows: attacks that take more than one request --------------------------------------------


class SseStream:
    """``GET /sse`` held open: its endpoint for POSTs, and the stream to close to drop it."""

    def __init__(self, http: httpx.AsyncClient, gateway: Gateway) -> None:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        self._stream = http.stream("GET", f"{gateway.url}/sse", headers=headers)
        self.endpoint = ""

    async def __aenter__(self) -> SseStream:
        response = await self._stream.__aenter__()
        assert response.status_code == 200
        # Kept referenced: an abandoned line iterator, once collected, would close the stream.
        self.lines = response.aiter_lines()
        async for line in self.lines:
            if line.startswith("data:"):
                self.endpoint = line[len("data:") :].strip()
                return self
        raise AssertionError("the SSE stream ended without an endpoint event")

    async def __aexit__(self, *exc_info: Any) -> None:
        await self._stream.__aexit__(*exc_info)


async def expired_sse_session(gateway: Gateway) -> None:
    """A session id whose SSE stream was closed: 404, as for one that never existed."""
    headers = {"Authorization": f"Bearer {TOKEN}"}
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    async with httpx.AsyncClient(timeout=10) as http:
        async with SseStream(http, gateway) as sse:
            url = f"{gateway.url}{sse.endpoint}"
        with anyio.fail_after(60):
            for _ in range(100):  # the stream's end reaches the server a moment later
                answer = await http.post(url, headers=headers, json=body)
                if answer.status_code != 202:
                    break
                await anyio.sleep(0.02)
    assert (answer.status_code, answer.text) == (404, "Could not find session")


async def sse_garbage_keeps_session(gateway: Gateway) -> None:
    """Unparseable or oversized messages on a live SSE session: refused, the session lives on."""
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    async with httpx.AsyncClient(timeout=10) as http, SseStream(http, gateway) as sse:
        url = f"{gateway.url}{sse.endpoint}"
        for body in (b"{not json", b"42", b"[]", b'{"jsonrpc": "2.0"}'):
            answer = await http.post(url, headers=headers, content=body)
            assert (answer.status_code, answer.text) == (400, "Could not parse message")
        big = await http.post(url, headers=headers, content=b" " * (7 * MiB))
        assert (big.status_code, big.text) == (413, "Request body too large")
        answer = await http.post(
            url, headers=headers, json={"jsonrpc": "2.0", "id": 9, "method": "ping"}
        )
        assert (answer.status_code, answer.text) == (202, "Accepted")
        with anyio.fail_after(60):
            async for line in sse.lines:
                if line.startswith("data:"):
                    assert json.loads(line[len("data:") :]) == {
                        "jsonrpc": "2.0",
                        "id": 9,
                        "result": {},
                    }
                    break


SSE_CONNECTIONS = 2000


async def sse_flood(gateway: Gateway) -> None:
    """2,000 SSE connections opened and dropped, half before the server could even answer.

    Afterwards every session they opened is gone (its id answers 404), the gateway holds no more
    sockets than before, and its memory has not grown by more than a little.
    """
    port, pid = gateway.service.port, gateway.service.pid
    request = (
        f"GET /sse HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAccept: text/event-stream\r\n"
        f"Authorization: Bearer {TOKEN}\r\n\r\n"
    ).encode()
    session_ids: list[str] = []
    limit = anyio.Semaphore(64)

    async def connect_and_drop(read_endpoint: bool) -> None:
        async with limit, await anyio.connect_tcp("127.0.0.1", port) as sock:
            await sock.send(request)
            if read_endpoint:
                received = b""
                while not (found := re.search(rb"session_id=([0-9a-f]{32})\r?\n", received)):
                    received += await sock.receive()
                session_ids.append(found.group(1).decode())

    rss_before = _rss_kib(pid)
    with anyio.fail_after(60):
        async with anyio.create_task_group() as group:
            for i in range(SSE_CONNECTIONS):
                group.start_soon(connect_and_drop, i % 2 == 0)
    assert len(session_ids) == SSE_CONNECTIONS // 2

    headers = {"Authorization": f"Bearer {TOKEN}"}
    ping = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    async with httpx.AsyncClient(base_url=gateway.url, headers=headers, timeout=10) as http:
        with anyio.fail_after(60):
            for session_id in session_ids[:: len(session_ids) // 100]:  # 100 of them
                while True:
                    answer = await http.post(f"/messages/?session_id={session_id}", json=ping)
                    if answer.status_code != 202:
                        break
                    await anyio.sleep(0.05)
                assert (answer.status_code, answer.text) == (404, "Could not find session")
    await anyio.to_thread.run_sync(
        wait_for,
        # Once the warm sandboxes are all made again, as they were at the start.
        lambda: only_warm_sandboxes(pid, WARM) and open_fds(pid) <= gateway.fds_at_start + 2,
        240,
        "the gateway's file descriptors return to their number before the flood",
    )
    assert _rss_kib(pid) - rss_before < 64 * 1024, "the gateway's memory grew by over 64 MiB"


def _rss_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1))  # type: ignore[union-attr]


# --- The table ----------------------------------------------------------------------------------

TOOLS_LIST = {"jsonrpc": "2.0", "id": 3, "method": "tools/list"}
SESSION = ("mcp-session-id",)
AUTH = ("Authorization",)

CASES: list[Any] = [
    # Malformed JSON-RPC
    pytest.param(
        Post(raw=b"{not json"),
        RpcError(400, -32700, "Parse error: key must be a string at line 1 column 2"),
        id="not-json",
    ),
    pytest.param(
        Post(raw=b""),
        RpcError(400, -32700, "Parse error: EOF while parsing a value at line 1 column 0"),
        id="empty-body",
    ),
    pytest.param(
        Post(raw=b"[" * 100_000 + b"]" * 100_000),
        RpcError(400, -32700, "Parse error: recursion limit exceeded at line 1 column 202"),
        id="json-nested-100k-deep",
    ),
    pytest.param(Post(42), validation("input_value=42, input_type=int"), id="json-number"),
    pytest.param(Post("hi"), validation("input_value='hi', input_type=str"), id="json-string"),
    pytest.param(Post(None), validation("input_value=None, input_type=NoneType"), id="json-null"),
    pytest.param(
        Post([TOOLS_LIST, {**TOOLS_LIST, "id": 4}]),
        validation("JSONRPCRequest\n  Input should be a valid dictionary", "input_type=list"),
        id="batch-is-refused",
    ),
    pytest.param(Post([]), validation("input_value=[], input_type=list"), id="empty-batch"),
    pytest.param(
        Post({"id": 3, "method": "tools/list"}),
        validation("JSONRPCRequest.jsonrpc\n  Field required"),
        id="missing-jsonrpc",
    ),
    pytest.param(
        Post({**TOOLS_LIST, "jsonrpc": "1.0"}),
        validation("JSONRPCRequest.jsonrpc\n  Input should be '2.0'"),
        id="jsonrpc-1.0",
    ),
    pytest.param(
        Post({"jsonrpc": "2.0", "id": 3}),
        validation("JSONRPCRequest.method\n  Field required"),
        id="missing-method",
    ),
    # An id that is not a string or an integer makes the SDK read the message as a notification:
    # it is accepted and never answered (the code does not run: checked in the final test).
    pytest.param(Post({**call({"code": "print(1)"}), "id": {"a": 1}}), NO_ANSWER, id="id-object"),
    pytest.param(Post({**call({"code": "print(1)"}), "id": 1.5}), NO_ANSWER, id="id-float"),
    pytest.param(Post({**call({"code": "print(1)"}), "id": None}), NO_ANSWER, id="id-null"),
    pytest.param(
        Post({"jsonrpc": "2.0", "id": 3, "method": "foo/bar"}),
        Http(
            200,
            {
                "jsonrpc": "2.0",
                "id": 3,
                "error": {"code": -32601, "message": "Method not found", "data": "foo/bar"},
            },
        ),
        id="unknown-method",
    ),
    # Tool calls the tool must refuse
    pytest.param(
        Post({**call({}), "params": {"name": "nope", "arguments": {}}}),
        ToolError("Unknown tool: nope"),
        id="unknown-tool",
    ),
    pytest.param(Post(call({"code": 42})), wrong_type("42", "int"), id="code-int"),
    pytest.param(
        Post(call({"code": ["print(1)"]})), wrong_type("['print(1)']", "list"), id="code-list"
    ),
    pytest.param(Post(call({"code": None})), wrong_type("None", "NoneType"), id="code-null"),
    pytest.param(
        Post(call({"code": {"source": "print(1)"}})),
        wrong_type("{'source': 'print(1)'}", "dict"),
        id="code-object",
    ),
    pytest.param(
        Post(call({})),
        ToolError("code\n  Field required [type=missing, input_value={}, input_type=dict]"),
        id="code-missing",
    ),
    pytest.param(
        Post({**call({}), "params": {"name": "execute_python_code"}}),
        ToolError("code\n  Field required [type=missing, input_value={}, input_type=dict]"),
        id="arguments-missing",
    ),
    # Extra arguments are ignored, including one named like the tool's hidden Context parameter.
    pytest.param(
        Post(call({"code": f"print(6 * 7)  # {CODE_MARKER}", "timeout": 9, "sandbox": False})),
        Result("ok", 0, ("42\n[end of output]\n[exit code 0: ok]",)),
        id="extra-arguments-ignored",
    ),
    pytest.param(
        Post(call({"code": "print(6 * 7)", "ctx": {"request_context": None}})),
        Result("ok", 0, ("42\n[end of output]\n[exit code 0: ok]",)),
        id="ctx-argument-ignored",
    ),
    # Sizes and encodings
    pytest.param(
        run("#" * (10 * 1000 * 1000)), Http(413, "Request body too large"), id="code-10MB"
    ),
    pytest.param(
        run("#" * (MAX_CODE + 1)),
        ToolError(
            "The code is 100,001 characters long; the limit is 100,000. Send less code, or "
            "generate the data inside the code instead of pasting it."
        ),
        id="code-over-max-chars",
    ),
    pytest.param(run("#" * MAX_CODE), Result("ok", 0, ("(no output)",)), id="code-at-max-chars"),
    pytest.param(
        run("print('a')\x00print('b')"),
        # SyntaxError, or ValueError on the Pythons before the parser said so (Debian's 3.11.2).
        Result("exception", 1, ("Error: source code string cannot contain null bytes",)),
        id="nul-byte-in-code",
    ),
    pytest.param(
        Post(raw=raw_call(r"print('\ud800')")),
        RpcError(400, -32700, "Parse error: unexpected end of hex escape at line 1 column 120"),
        id="lone-surrogate-escape",
    ),
    pytest.param(
        Post(raw=raw_call(r"print('\ud83d\ude00')")),
        Result("ok", 0, ("\U0001f600\n",)),
        id="surrogate-pair-escape-is-fine",
    ),
    pytest.param(
        Post(raw=raw_call("print('@')").replace(b"@", b"\xff\xfe")),
        RpcError(400, -32700, "Parse error: invalid unicode code point at line 1 column 114"),
        id="invalid-utf8-bytes",
    ),
    pytest.param(
        run("print(" * 300 + ")" * 300),
        Result("exception", 1, ("SyntaxError: too many nested parentheses",)),
        id="code-nested-300-deep",
    ),
    # Headers: DNS rebinding, content negotiation, sessions
    pytest.param(
        Post(TOOLS_LIST, headers={"Host": "evil.example:80"}),
        Http(421, "Invalid Host header"),
        id="bad-host",
    ),
    pytest.param(
        Post(TOOLS_LIST, headers={"Origin": "http://evil.example"}),
        Http(403, "Invalid Origin header"),
        id="bad-origin",
    ),
    pytest.param(
        Post(TOOLS_LIST, headers={"Origin": "http://localhost:5173"}),
        Http(200, {"jsonrpc": "2.0", "id": 3, "result": "<tools>"}),
        id="loopback-origin-is-fine",
    ),
    pytest.param(
        Post(TOOLS_LIST, headers={"Accept": "text/html"}),
        RpcError(
            406,
            -32600,
            "Not Acceptable: Client must accept both application/json and text/event-stream",
        ),
        id="accept-html",
    ),
    pytest.param(
        Post(TOOLS_LIST, headers={"Content-Type": "text/plain"}),
        Http(400, "Invalid Content-Type header"),
        id="content-type-text",
    ),
    pytest.param(
        Post(TOOLS_LIST, headers={"mcp-session-id": uuid.uuid4().hex}),
        RpcError(404, -32600, "Session not found"),
        id="unknown-http-session",
    ),
    pytest.param(
        Post(TOOLS_LIST, drop=SESSION),
        RpcError(400, -32600, "Bad Request: Missing session ID"),
        id="no-http-session",
    ),
    # Authentication
    pytest.param(Post(TOOLS_LIST, drop=AUTH), AUTH_REQUIRED, id="no-token"),
    pytest.param(
        Post(TOOLS_LIST, headers={"Authorization": "Bearer wrong"}), AUTH_REQUIRED, id="wrong-token"
    ),
    pytest.param(
        Post(TOOLS_LIST, headers={"Authorization": f"Bearer {TOKEN[:-1]}"}),
        AUTH_REQUIRED,
        id="token-prefix",
    ),
    pytest.param(
        Post(TOOLS_LIST, headers={"Authorization": f"Basic {TOKEN}"}),
        AUTH_REQUIRED,
        id="token-as-basic",
    ),
    pytest.param(
        Post(TOOLS_LIST, path=f"/mcp?access_token={TOKEN}", drop=AUTH),
        AUTH_REQUIRED,
        id="token-in-query",
    ),
    pytest.param(
        Post(TOOLS_LIST, path=f"/messages/?session_id={uuid.uuid4().hex}", drop=AUTH),
        AUTH_REQUIRED,
        id="sse-post-no-token",
    ),
    pytest.param(
        Post(TOOLS_LIST, headers={"Authorization": f"Bearer {TOKEN}"}),
        Http(200, {"jsonrpc": "2.0", "id": 3, "result": "<tools>"}),
        id="right-token",
    ),
    # SSE sessions
    pytest.param(
        Post(TOOLS_LIST, path=f"/messages/?session_id={uuid.uuid4().hex}"),
        Http(404, "Could not find session"),
        id="unknown-sse-session",
    ),
    pytest.param(
        Post(TOOLS_LIST, path="/messages/?session_id=../../etc/passwd"),
        Http(400, "Invalid session ID"),
        id="malformed-sse-session",
    ),
    pytest.param(
        Post(TOOLS_LIST, path="/messages/"),
        Http(400, "session_id is required"),
        id="no-sse-session",
    ),
    pytest.param(
        Post(raw=b"#" * (10 * MiB), path=f"/messages/?session_id={uuid.uuid4().hex}"),
        Http(413, "Request body too large"),
        id="sse-post-10MB",
    ),
    pytest.param(expired_sse_session, None, id="expired-sse-session"),
    pytest.param(sse_garbage_keeps_session, None, id="sse-garbage-keeps-session"),
    pytest.param(sse_flood, None, id="sse-2000-connections-dropped"),
    # The sandbox side, through the tool
    pytest.param(
        run(FORK_COUNT),
        Result("ok", 0, check=_few_forks, needs="processes"),
        id="fork-bomb-stops-at-pids-limit",
    ),
    pytest.param(
        run(FORK_SPIN),
        # Interrupted at the time limit, the session's interpreter kills every other process of
        # its sandbox and lives on; or, as the interrupt mostly lands in the callbacks around
        # os.fork (which only report it), the interpreter is killed after the grace.
        Result("interrupted", 130, ("the time limit was reached",), also=(("killed", 137),)),
        id="fork-bomb-spinning-killed",
    ),
    pytest.param(
        run("x = b'x' * (1 << 30)\nprint('survived')"),
        Result("killed", 137, ("(no output)", "the memory limit"))
        if memory_is_a_cgroup()
        else _MEMORY_ERROR,
        id="memory-bomb-1GiB",
    ),
    pytest.param(
        run("chunks = []\nwhile True:\n    chunks.append(b'x' * 10**7)"),
        Result("killed", 137, ("(no output)",)) if memory_is_a_cgroup() else _MEMORY_ERROR,
        id="memory-bomb-growing",
    ),
    pytest.param(
        run("while True:\n    print('x' * 999)"),
        Result("output_limit", 143, ("[... output cut:", "the output limit was reached")),
        id="stdout-flood",
    ),
    pytest.param(
        run("import sys\nwhile True:\n    sys.stderr.write('e' * 999)"),
        Result("output_limit", 143, ("[... output cut:",)),
        id="stderr-flood",
    ),
    pytest.param(
        run(FIGURES_100),
        Result(
            "ok",
            0,
            (
                "drawn\n",
                "[83 of 100 figures not returned: figure_017.png (",
                "at most 16 images",
                # The manifest takes one of the evaluator's 100 places.
                "[1 of 100 figures not returned by the evaluator",
            ),
            returned=16,
            dropped=84,
        ),
        id="100-figures",
    ),
    pytest.param(
        run(HUGE_FIGURE),
        Result("ok", 0, ("1 of 1 figures not returned",), dropped=1, check=_huge_figure),
        id="figure-100-inches-square",
    ),
    pytest.param(
        run(png_file(40)),
        Result("ok", 0, ("written", "(41,943,069 bytes)"), dropped=1, check=_png_file),
        id="png-file-40MB",
    ),
    pytest.param(
        run(png_file(50)),
        Result("exception", 1, ("No space left on device",), dropped=1, check=_png_file),
        id="png-file-50MB",
    ),
    pytest.param(
        run("import os, signal\nos.kill(1, signal.SIGKILL)\nprint('still here')"),
        Result("ok", 0, ("still here\n",)),
        id="kill-sandbox-init",
    ),
    pytest.param(
        run(
            "import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), 1)\n"
            "except OSError as exc:\n    print(type(exc).__name__, exc.errno)"
        ),
        Result("ok", 0, ("ConnectionRefusedError 111\n",)),
        id="connect-to-the-gateway",
    ),
    pytest.param(
        run(TOKEN_IN_ENVIRON),
        Result("ok", 0, ("found: []", "'HOME', 'LANG'"), check=_token_nowhere),
        id="token-in-os-environ",
    ),
    pytest.param(
        run(TOKEN_IN_OWN_PROC),
        Result("ok", 0, check=_own_proc),
        id="token-in-proc-1-and-self",
    ),
    pytest.param(
        run(TOKEN_IN_ANY_PROC),
        Result("ok", 0, ("read True hits []",), check=_token_nowhere),
        id="token-in-any-proc",
    ),
]


@pytest.mark.parametrize(("send", "expected"), CASES)
async def test_hostile_input(gateway: Gateway, send: Post | Flow, expected: Expected) -> None:
    if not isinstance(send, Post):
        with anyio.fail_after(90):
            await send(gateway)
        return
    if isinstance(expected, Result) and expected.needs is not None:
        await skip_unless_enforced(gateway, expected.needs)
    headers = {**gateway.headers(), **send.headers}
    for name in send.drop:
        headers.pop(name)
    if send.raw is not None:
        kwargs: dict[str, Any] = {"content": send.raw}
    else:  # "{port}" in a body stands for the gateway's port
        body = json.dumps(send.body).replace("{port}", str(gateway.service.port))
        kwargs = {"content": body.encode()}
    async with httpx.AsyncClient(base_url=gateway.url, timeout=60, trust_env=False) as http:
        with anyio.fail_after(60):
            answer = await http.post(send.path, headers=headers, **kwargs)
            session_id = _session_started(answer)
            if session_id is not None:  # its live interpreter would outlast the case
                ended = await http.post(
                    "/mcp", headers=gateway.headers(), json=_end_session(session_id)
                )
                assert ended.status_code == 200, ended.text
    check_answer(answer, expected)


def _session_started(answer: httpx.Response) -> str | None:
    """The session a tool call started, if its answer names one."""
    try:
        (message,) = jsonrpc_messages(answer)
        session_id = message["result"]["structuredContent"]["session_id"]
    except (AssertionError, KeyError, TypeError, ValueError):
        return None
    return session_id if isinstance(session_id, str) else None


def _end_session(session_id: str) -> dict[str, Any]:
    arguments = {"session_id": session_id}
    params = {"name": "end_session", "arguments": arguments}
    return {"jsonrpc": "2.0", "id": 99, "method": "tools/call", "params": params}


async def skip_unless_enforced(gateway: Gateway, limit: str) -> None:
    """Skip a case whose limit this host cannot enforce, as the gateway's /readyz says."""
    async with httpx.AsyncClient(base_url=gateway.url, timeout=60, trust_env=False) as http:
        ready = (await http.get("/readyz")).json()
    weaker = {item["limit"]: item["how"] for item in ready.get("not_enforced", [])}
    if limit in weaker:
        pytest.skip(f"{limit} not enforced here: {weaker[limit]}")


def check_answer(answer: httpx.Response, expected: Expected) -> None:
    if isinstance(expected, int):
        assert (answer.status_code, answer.content) == (expected, b"")
        return
    if isinstance(expected, Http):
        assert answer.status_code == expected.status, answer.text
        for name, value in expected.headers.items():
            assert answer.headers.get(name) == value
        if isinstance(expected.body, str):
            assert answer.text == expected.body
            return
        (message,) = jsonrpc_messages(answer)
        if expected.body.get("result") == "<tools>":
            assert sorted(t["name"] for t in message["result"]["tools"]) == [
                "end_session",
                "execute_python_code",
                "get_output",
                "interrupt",
            ]
            message["result"] = "<tools>"
        assert message == expected.body
        return
    if isinstance(expected, RpcError):
        assert answer.status_code == expected.status, answer.text
        (message,) = jsonrpc_messages(answer)
        assert (message["jsonrpc"], message["id"]) == ("2.0", expected.id)
        error = message["error"]
        assert error["code"] == expected.code
        if expected.exact:
            assert error["message"] == expected.message
        else:
            assert error["message"].startswith(expected.message), error["message"]
            for part in expected.parts:
                assert part in error["message"], (part, error["message"])
        return
    assert answer.status_code == 200, answer.text
    assert len(answer.content) < MiB, "a tool result stays under 1 MiB"
    (message,) = jsonrpc_messages(answer)
    result = message["result"]
    if isinstance(expected, ToolError):
        assert result["isError"] is True
        (block,) = result["content"]
        assert expected.text in block["text"], block["text"]
        return
    assert result["isError"] is False, result
    structured = result["structuredContent"]
    allowed = [(expected.status, expected.returncode), *expected.also]
    assert (structured["status"], structured["returncode"]) in allowed, structured
    text = result["content"][0]["text"]
    for fragment in expected.text:
        assert fragment in text, (fragment, text[:2000])
    images = [block for block in result["content"] if block["type"] == "image"]
    assert len(images) == expected.returned
    assert [i["returned"] for i in structured["images"]].count(False) == expected.dropped
    if expected.check is not None:
        expected.check(structured)


def test_the_table_is_big_enough() -> None:
    assert len(CASES) >= 30


def test_a_token_sent_in_the_url_is_not_logged(gateway: Gateway) -> None:
    """The token-in-query row sends the real token in the URL (and gets 401): not in the log.

    Clients that cannot set headers (browsers' EventSource) put tokens in the URL; the gateway
    refuses them, and must not write them down either.
    """
    lines = [line for line in gateway.log.read_text(errors="replace").splitlines() if TOKEN in line]
    assert lines == []


async def test_after_the_suite_the_gateway_still_serves(gateway: Gateway) -> None:
    """Last in the module: both transports still work, and nothing leaked.

    Nothing of the table is left: no sandbox process, no open socket beyond the start's, no
    session of the SSE flood. The token and the code never reached the log, and the calls
    whose id was not a valid JSON-RPC id never ran.
    """
    for transport in ("sse", "http"):
        with anyio.fail_after(60):
            async with connect(gateway.url, transport, token=TOKEN) as mcp:
                result = await mcp.call_tool("execute_python_code", {"code": "print(6 * 7)"})
                session_id = result.structured_content["session_id"]
                # Its live interpreter goes too, as the check below wants no sandbox left.
                ended = await mcp.call_tool("end_session", {"session_id": session_id})
        assert not result.is_error and not ended.is_error
        assert text_of(result) == (
            "42\n[end of output]\n[exit code 0: ok]\n"
            f'[session_id: "{session_id}" (pass it to continue this session)]'
        )
    async with httpx.AsyncClient(base_url=gateway.url) as http:
        ready = await http.get("/readyz")
        metrics = (await http.get("/metrics")).text
    assert ready.status_code == 200
    assert_all_enforced_as_root(ready.json())
    assert gateway.service.process is not None and gateway.service.process.poll() is None

    pid = gateway.service.pid
    await anyio.to_thread.run_sync(
        wait_for,
        lambda: only_warm_sandboxes(pid, WARM),
        240,
        "no sandbox left running but the warm ones waiting for a run",
    )
    # A connection an earlier test's client left open and idle is the server's to close, at
    # its keep-alive timeout: a CI run on a loaded host still had one 10 s after.
    try:
        await anyio.to_thread.run_sync(
            wait_for,
            lambda: open_fds(pid) <= gateway.fds_at_start + 2,
            KEEP_ALIVE_TIMEOUT + 30,
            "no socket left open",
        )
    except TimeoutError as exc:
        raise AssertionError(f"{exc}; held: {_fd_targets(pid)}") from exc
    assert "mcp_evaluations_in_flight 0.0" in metrics

    log = gateway.log.read_text(errors="replace")
    leaks = [line for line in log.splitlines() if TOKEN in line and "access_token=" not in line]
    assert leaks == [], "the token reached the gateway's log (the URL case is tested below)"
    assert CODE_MARKER not in log
    marker = '{"event": "tool_call"'
    calls = [json.loads(line[line.index(marker) :]) for line in log.splitlines() if marker in line]
    assert calls, "one JSON line per call"
    ran = [c for c in calls if c.get("code_chars") == len("print(1)")]
    assert ran == [], "a call whose id is not a valid JSON-RPC id must not run"
