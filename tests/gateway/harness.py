"""Helpers of the hostile-input and fault suites: processes, raw JSON-RPC, the process tree.

(The MCP clients and ``text_of`` are shared with the other suites: :mod:`tests.support`.)
Everything here talks to real servers on loopback: a gateway or an evaluator run as its own
process (``python -m python_mcp_server`` / ``python -m evaluator``), and MCP spoken either by the
SDK's clients or, for inputs the SDK would never send, as raw JSON-RPC over HTTP with httpx.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from evaluator.commands import COMPILED_AGENT_IN_SANDBOX
from evaluator.procfs import status
from tests.support import closed_port

#: What a Streamable HTTP client must accept, and the protocol version of the classic handshake.
ACCEPT = "application/json, text/event-stream"
PROTOCOL_VERSION = "2025-11-25"


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``predicate`` every 20 ms until it holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:g} s")
        time.sleep(0.02)


def _answers(url: str, method: str = "GET", status: int = 200) -> bool:
    try:
        return httpx.request(method, url, timeout=2).status_code == status
    except httpx.TransportError:
        return False


class ServiceProcess:
    """A server run as ``python -m <module> --port P``, startable again on the same port."""

    def __init__(
        self,
        args: list[str],
        env: Mapping[str, str],
        probe: tuple[str, str],
        log: Path | None = None,
    ) -> None:
        self.port = closed_port()
        self.log = log
        self.url = f"http://127.0.0.1:{self.port}"
        self._args = [arg.format(port=self.port) for arg in args]
        self._env = {**os.environ, **env}
        self._probe_method, self._probe_path = probe
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60) -> None:
        assert self.process is None or self.process.poll() is not None, "already running"
        if self.log is None:
            self.process = subprocess.Popen([sys.executable, *self._args], env=self._env)
        else:
            with self.log.open("ab") as log:
                self.process = subprocess.Popen(
                    [sys.executable, *self._args], env=self._env, stdout=log, stderr=log
                )
        process = self.process

        def up() -> bool:
            assert process.poll() is None, f"{self._args} exited with {process.returncode}"
            return _answers(self.url + self._probe_path, self._probe_method)

        wait_for(up, timeout, f"{self._args} starting")

    def kill(self) -> None:
        """SIGKILL: the abrupt death of the service (a crash, an OOM kill), then reap it."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid


def evaluator_process(time_limit: float, *extra: str) -> ServiceProcess:
    """``python -m evaluator`` on a port of its own (not started yet)."""
    args = ["-m", "evaluator", "--port", "{port}", "--log-level", "warning"]
    args += ["--time-limit", str(time_limit), *extra]
    return ServiceProcess(args, {}, ("OPTIONS", "/eval"))


def gateway_process(env: Mapping[str, str], log: Path | None = None) -> ServiceProcess:
    """``python -m python_mcp_server`` configured by ``env`` (not started yet).

    Its stdout and stderr go to ``log`` when given, else to the test's own.
    """
    base = {"MCP_LOG_LEVEL": "warning", "SNEKBOX_URL": ""}
    return ServiceProcess(
        ["-m", "python_mcp_server", "--port", "{port}"], {**base, **env}, ("GET", "/readyz"), log
    )


@contextmanager
def running(service: ServiceProcess) -> Iterator[ServiceProcess]:
    service.start()
    try:
        yield service
    finally:
        service.stop()


# --- Raw JSON-RPC over Streamable HTTP ----------------------------------------------------------


def jsonrpc_messages(response: httpx.Response) -> list[Any]:
    """The JSON-RPC messages of an answer, whether sent as JSON or as an SSE stream."""
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        return [
            json.loads(line[len("data:") :])
            for line in response.text.splitlines()
            if line.startswith("data:") and line[len("data:") :].strip()
        ]
    return [response.json()] if response.content else []


class RawSession:
    """A Streamable HTTP session opened by hand, to send what no real client would."""

    def __init__(self, base_url: str, token: str | None = None, timeout: float = 60) -> None:
        self.headers = {"Accept": ACCEPT, "Content-Type": "application/json"}
        if token:
            self.headers["Authorization"] = f"Bearer {token}"
        self.http = httpx.Client(base_url=base_url, timeout=timeout, trust_env=False)
        self.session_id: str | None = None

    def initialize(self) -> RawSession:
        init = {
            "jsonrpc": "2.0",
            "id": 0,
            "method": "initialize",
            "params": {
                "protocolVersion": PROTOCOL_VERSION,
                "capabilities": {},
                "clientInfo": {"name": "hostile", "version": "0"},
            },
        }
        answer = self.http.post("/mcp", headers=self.headers, json=init)
        assert answer.status_code == 200, answer.text
        self.session_id = answer.headers["mcp-session-id"]
        self.headers |= {
            "mcp-session-id": self.session_id,
            "MCP-Protocol-Version": PROTOCOL_VERSION,
        }
        done = self.post(json={"jsonrpc": "2.0", "method": "notifications/initialized"})
        assert done.status_code == 202, done.text
        return self

    def post(self, headers: Mapping[str, str] | None = None, **kwargs: Any) -> httpx.Response:
        return self.http.post("/mcp", headers={**self.headers, **(headers or {})}, **kwargs)

    def call_tool(self, arguments: Any, request_id: int = 1) -> dict[str, Any]:
        """``tools/call`` of execute_python_code; the JSON-RPC answer with this id."""
        params = {"name": "execute_python_code", "arguments": arguments}
        response = self.post(
            json={"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}
        )
        assert response.status_code == 200, response.text
        (answer,) = [m for m in jsonrpc_messages(response) if m.get("id") == request_id]
        return dict(answer)

    def close(self) -> None:
        if self.session_id:
            self.http.delete("/mcp", headers=self.headers)
        self.http.close()


# --- The process tree ----------------------------------------------------------------------------


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found += [int(child) for child in f.read().split()]
    except (FileNotFoundError, ProcessLookupError):
        pass
    return found


def children(pid: int) -> dict[int, str]:
    """Every live child of ``pid``, as ``{pid: command name}`` (zombies left out)."""
    found: dict[int, str] = {}
    for child in _children(pid):
        process = status(child)
        if process is not None and process.state != "Z":
            found[child] = process.name
    return found


def descendants(pid: int) -> dict[int, str]:
    """Every live descendant of ``pid``, as ``{pid: command name}`` (zombies left out)."""
    found: dict[int, str] = {}
    todo = [pid]
    while todo:
        below = children(todo.pop())
        found |= below
        todo += below
    return found


def open_fds(pid: int) -> int:
    """How many file descriptors ``pid`` holds (sockets included)."""
    return len(os.listdir(f"/proc/{pid}/fd"))


#: Where the built-in evaluator binds its warm agent inside a sandbox: compiled for the default
#: interpreter, which is this one (evaluator/commands.py).
WARM_AGENT = COMPILED_AGENT_IN_SANDBOX


def only_warm_sandboxes(pid: int, count: int) -> bool:
    """Whether the sandboxes below ``pid`` are exactly ``count`` warm ones waiting for a run.

    A warm sandbox is bwrap, its init and the agent (see ``evaluator/_agent.py``); it waits
    while the agent still holds fd 5, its request pipe, which it closes before running code.
    A cold sandbox made ahead is a launcher waiting for its command line. Every other process
    below ``pid`` would be a run, or what a run left behind.
    """
    waiting = 0
    for child, name in descendants(pid).items():
        if name == "bwrap":
            continue
        try:
            argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
            idle = os.path.exists(f"/proc/{child}/fd/5")
        except OSError:
            return False
        if any(arg.endswith((b"/_launcher.py", b"/_launcher.pyc")) for arg in argv):
            continue
        if WARM_AGENT.encode() not in argv or not idle:
            return False
        waiting += 1
    bwraps = sum(name == "bwrap" for name in descendants(pid).values())
    return waiting == count and bwraps == 2 * count
