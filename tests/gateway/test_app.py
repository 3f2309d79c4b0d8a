"""The HTTP app around the MCP server: health routes, start-up, the README's commands."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import replace

import httpx
import pytest

from evaluator import SandboxUnavailable
from python_mcp_server import Gateway, Settings
from tests.support import closed_port


def test_healthz_and_readyz(gateway_url: str) -> None:
    assert httpx.get(f"{gateway_url}/healthz").json() == {"status": "ok"}
    ready = httpx.get(f"{gateway_url}/readyz")
    assert (ready.status_code, ready.json()) == (200, {"status": "ready"})


def test_bad_host_header_is_refused(gateway_url: str) -> None:
    response = httpx.post(
        f"{gateway_url}/mcp", headers={"Host": "evil.example:80"}, json={"jsonrpc": "2.0"}
    )
    assert response.status_code == 421


@pytest.mark.anyio
async def test_no_sandbox_means_no_start(settings: Settings) -> None:
    broken = replace(
        settings, evaluator_config=replace(settings.evaluator_config, bwrap="/nonexistent/bwrap")
    )
    with pytest.raises(SandboxUnavailable, match="SNEKBOX_URL"):
        async with Gateway(broken):
            pass


def wait_ready(url: str, process: subprocess.Popen[bytes]) -> httpx.Response:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert process.poll() is None, "the gateway exited during startup"
        try:
            return httpx.get(f"{url}/readyz")
        except httpx.TransportError:
            time.sleep(0.1)
    raise TimeoutError("the gateway did not answer within 60 s")


@pytest.mark.parametrize(
    "command",
    [
        ["-c", "from python_mcp_server import main; main()", "--port", "{port}"],
        ["-m", "uvicorn", "python_mcp_server:starlette_app", "--port", "{port}"],
    ],
    ids=["python-mcp-server", "uvicorn"],
)
def test_readme_commands_serve_and_stop_cleanly(command: list[str]) -> None:
    port = closed_port()
    args = [arg.format(port=port) for arg in command]
    env = {**os.environ, "MCP_PORT": str(port), "MCP_LOG_LEVEL": "warning"}
    env.pop("SNEKBOX_URL", None)
    process = subprocess.Popen([sys.executable, *args], env=env)
    try:
        ready = wait_ready(f"http://127.0.0.1:{port}", process)
        assert (ready.status_code, ready.json()) == (200, {"status": "ready"})
    finally:
        process.send_signal(signal.SIGTERM)
        # uvicorn shuts down gracefully, then re-raises the signal it caught.
        assert process.wait(timeout=30) in (0, -signal.SIGTERM)
