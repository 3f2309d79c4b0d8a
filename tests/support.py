"""Shared by every suite: real servers on loopback, MCP clients of the gateway, their results.

Real servers: uvicorn on a free loopback port, a raw TCP server for misbehaviour, a port where
nothing listens, a process polled until it answers. Clients: :func:`connect` is the one factory
of the mcp SDK's clients over either transport; :func:`text_of` reads a tool result's text.
"""

from __future__ import annotations

import itertools
import os
import random
import select
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import uvicorn
from mcp import Client
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult

from evaluator.cgroups import _cgroup_mounts, _own_v2_cgroup
from evaluator.host import interpreter_paths, working_directory
from serving import guarded_protocol

#: The time limit of evaluators shared by many tests: far above what any call of the suite needs
#: (the heaviest, numpy + pandas + a figure, takes about 1 s on an idle machine), so that a
#: loaded machine never turns a normal call into a time-limit kill.
TIME_LIMIT = 30.0
#: Another interpreter than the default, where the machine has it (pyenv's; CI installs it).
PY313 = Path("/root/.pyenv/versions/3.13.0/bin/python3.13")
HAS_313 = os.path.exists(PY313)  # False, not PermissionError, where /root is closed


@contextmanager
def serve(app: Any, *, startup_timeout: float = 180.0) -> Iterator[str]:
    """Run an ASGI app under uvicorn in a thread on a free loopback port; yield its base URL.

    It is served as both services serve it (:func:`serving.guarded_protocol`), with bounds no
    test reaches.

    Waits on uvicorn's own ``started`` flag (set once the socket listens and the lifespan has
    started) rather than on a fixed delay, and fails the test if startup does not finish.
    ``startup_timeout`` only catches a start that hangs: a gateway's start includes its
    in-process evaluator's and the environment probe (up to 15 s), which took over 30 s in the
    emulated cgroup v2 VM on a slow host.
    """
    protocol = guarded_protocol(header_timeout=120, max_connections=4096)
    config = uvicorn.Config(
        app, host="127.0.0.1", port=0, log_level="warning", lifespan="on", http=protocol
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("the server exited during startup (see the log above)")
        if time.monotonic() > deadline:
            server.should_exit = True
            raise TimeoutError(f"the server did not start within {startup_timeout} s")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def read_request(connection: socket.socket) -> bytes:
    """One whole request (head and ``Content-Length`` body) from a raw server's connection, its
    head returned; ``b""`` if the client left."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = connection.recv(65536)
        if not chunk:
            return b""
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        (
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        ),
        0,  # a GET's
    )
    while len(body) < length:
        chunk = connection.recv(65536)
        if not chunk:
            return b""
        body += chunk
    return head


def hang_up_after_reading(connection: socket.socket) -> None:
    """A raw server's handler: reads the request whole, then closes without a word (a service
    that died running it): nothing left unread, so an end of file, not a reset."""
    connection.settimeout(10)
    read_request(connection)


def reset_unread(connection: socket.socket) -> bool:
    """A raw server's handler: once the request has come (whether it did, within 10 s), close
    with ``SO_LINGER`` 0 without reading it: a reset with the request unread."""
    came = bool(select.select([connection], [], [], 10)[0])
    connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    return came


@contextmanager
def raw_server(
    handle: Callable[[socket.socket], object] | None = None, host: str = "127.0.0.1", port: int = 0
) -> Iterator[str]:
    """A loopback TCP server for what no HTTP server does on purpose; yields its base URL.

    Each connection is passed to ``handle`` in the accepting thread, then closed; without a
    ``handle``, every connection is held open, silent, until the server stops.
    """
    listener = socket.create_server((host, port))
    listener.settimeout(0.05)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except TimeoutError:
                continue
            if handle is None:
                held.append(connection)
                continue
            with connection:
                handle(connection)

    thread = threading.Thread(target=accept, name="raw-server", daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(5)
        for connection in held:
            connection.close()
        listener.close()


def closed_port(address: str = "127.0.0.1") -> int:
    """A loopback port nothing listens on, for a server about to start there (or for none).

    Not the kernel's choice: between this answer and the server's ``bind``, the kernel may give
    the same port to an outgoing connection or, under pytest-xdist, to another worker asking the
    same. So it comes from below the ephemeral range, where no connection is given one, and from
    a slice of it for this worker alone; bound once, to skip ports something holds.
    """
    for _ in range(len(_PORT_SLICE)):
        port = next(_ports)
        with socket.socket() as sock:
            try:
                sock.bind((address, port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {_PORT_SLICE} on {address}")


def _port_slice() -> range:
    """This process's ports: ``[10000, ephemeral start)`` cut in one slice per xdist worker."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as ranges:
        ephemeral = int(ranges.read().split()[0])
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")  # gwN; unset without xdist
    index = int(worker.removeprefix("gw")) if worker.removeprefix("gw").isdigit() else 0
    workers = max(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")), index + 1)
    size = (ephemeral - 10000) // workers
    return range(10000 + index * size, 10000 + (index + 1) * size)


_PORT_SLICE = _port_slice()
#: Handed out in turn, so that a port is not handed out again while its last server may linger;
#: from a random start, so that two suites on one host (two checkouts) do not walk in step.
_start = random.randrange(len(_PORT_SLICE))
_ports: Iterator[int] = itertools.cycle([*_PORT_SLICE[_start:], *_PORT_SLICE[:_start]])


def wait_until_answers(
    url: str, process: subprocess.Popen[Any], *, method: str = "GET", timeout: float = 60
) -> httpx.Response:
    """Poll ``url`` until a server started as ``process`` answers; fail if it exits or stalls."""
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited during startup ({process.returncode})")
        try:
            return httpx.request(method, url)
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} did not answer within {timeout:g} s") from None
            time.sleep(0.05)


def connect(
    base_url: str, transport: str, *, token: str | None = None, mode: str = "auto"
) -> Client:
    """An mcp SDK client of the gateway over ``transport`` ("sse" or "http").

    ``token`` is sent as a bearer token; ``mode`` is the client's protocol negotiation
    ("legacy": the classic handshake, which opens a session). Reads may take 300 s, so a slow
    call fails on its test's own bound, not on the client's.
    """
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if transport == "sse":
        return Client(sse_client(f"{base_url}/sse", headers=headers), mode=mode)
    http = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=300))
    return Client(streamable_http_client(f"{base_url}/mcp", http_client=http), mode=mode)


def text_of(result: Any) -> str:
    """The text block of a tool result (the first content block)."""
    first = result.content[0]
    assert first.type == "text", result
    return str(first.text)


async def call_code(client: Client, code: str, **arguments: Any) -> CallToolResult:
    """One ``execute_python_code`` call, bounded generously: a session may start cold on a
    loaded machine."""
    with anyio.fail_after(90):
        return await client.call_tool("execute_python_code", {"code": code, **arguments})


def facts(result: CallToolResult) -> dict[str, Any]:
    """The structured content of a result that must not be an error."""
    assert not result.is_error, text_of(result)
    assert isinstance(result.structured_content, dict)
    return result.structured_content


async def sse_endpoint(lines: AsyncIterator[str]) -> str:
    """The endpoint (``/messages/?session_id=...``) a ``GET /sse`` stream names first.

    ``lines``: the stream's ``aiter_lines()``, which the caller keeps referenced while it uses
    the stream (an abandoned line iterator, once collected, closes it).
    """
    async for line in lines:
        if line.startswith("data:"):
            return line[len("data:") :].strip()
    raise AssertionError("the SSE stream ended without an endpoint event")


def assert_all_enforced_as_root(readiness: dict[str, object], *, local: bool = True) -> None:
    """As root this machine enforces every limit; an ordinary user's /readyz names those its
    ``local`` (in-process) evaluator cannot (no cgroups: CPU, its own uid). A
    remote service's limits are its own: /readyz does not name them."""
    if os.geteuid() == 0 or not local:
        assert readiness == {"status": "ready"}
    else:
        assert set(readiness) == {"status", "not_enforced"}


def memory_is_a_cgroup() -> bool:
    """Whether a run past its memory limit is killed here by a memory cgroup (137), rather
    than refused by the address-space rlimit an ordinary user gets without a delegated
    cgroup v2 (``MemoryError``, exit 1, at the limit plus the rlimit's headroom)."""
    if os.geteuid() == 0:
        mounts = _cgroup_mounts()
        return "memory" in mounts or "cgroup2" in mounts
    return "memory" in offered_v2_controllers().split()


def offered_v2_controllers() -> str:
    """The cgroup v2 controllers this process's cgroup offers (its parent's, once moved to a
    leaf by an evaluator)."""
    root, own = _cgroup_mounts().get("cgroup2"), _own_v2_cgroup()
    if root is None or own is None:
        return ""
    base = root / own.lstrip("/")
    if base.name == "service":
        base = base.parent
    try:
        return (base / "cgroup.controllers").read_text().strip()
    except OSError:
        return ""


#: Code that prints "from C" through C's stdio, made fully buffered (``python -u`` leaves it
#: unbuffered) in a buffer kept to the process's end: only C's ``exit()`` writes it out.
C_BUFFERED = (
    "import ctypes\nlibc = ctypes.CDLL(None)\nctypes.kept = ctypes.create_string_buffer(4096)\n"
    "libc.setvbuf(ctypes.c_void_p.in_dll(libc, 'stdout'), ctypes.kept, 0, 4096)\n"
    "libc.printf(b'from C\\n')\n"
)


def sandbox_home() -> str:
    """The working directory inside this environment's sandboxes: ``/home``, or ``/sandbox``
    when this interpreter lies under /home (a checkout in a home directory)."""
    return working_directory(interpreter_paths(sys.executable))
