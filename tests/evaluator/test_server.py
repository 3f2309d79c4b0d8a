"""``python -m evaluator`` as a real uvicorn server on a loopback port, reached over HTTP."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest

from snekbox_client import EvalRequest, SnekboxClient
from tests.support import closed_port


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    port = closed_port()
    env = {**os.environ, "EVALUATOR_TIME_LIMIT": "30", "EVALUATOR_CONCURRENCY": "1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "evaluator", "--port", str(port), "--log-level", "info"],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stderr is not None
    log = []
    deadline = time.monotonic() + 30
    # uvicorn says "Uvicorn running on" once it listens; "Application startup complete" comes
    # before the socket is bound (a busy host showed a connection refused between the two).
    for line in process.stderr:
        log.append(line)
        if "Uvicorn running on" in line:
            break
        if time.monotonic() > deadline or process.poll() is not None:
            process.kill()
            pytest.fail("the evaluator did not start:\n" + "".join(log))
    assert any("limit memory: 384 MiB" in line for line in log), log
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 0
        process.stderr.close()


async def test_eval_over_http(server: str) -> None:
    async with SnekboxClient(server) as client:
        await client.ping()
        result = await client.eval(EvalRequest(input="print('hello')"))
        assert (result.stdout, result.returncode) == ("hello\n", 0)


async def test_time_limit_from_the_environment(server: str) -> None:
    async with SnekboxClient(server) as client:
        assert (await client.info()).time_limit == 30.0
        # A run asks for less, over HTTP: it is killed at its own limit, not the service's.
        started = time.monotonic()
        result = await client.eval(EvalRequest(input="while True: pass", time_limit=2.0))
        assert (result.returncode, result.ended_by) == (137, "time_limit")
        assert time.monotonic() - started < 30


async def test_the_evaluators_own_port_is_unreachable(server: str) -> None:
    port = server.rsplit(":", 1)[1]
    code = (
        "import socket\n"
        "try:\n"
        f"    socket.create_connection(('127.0.0.1', {port}), timeout=2); print('CONNECTED')\n"
        "except OSError as e:\n"
        "    print(e.errno)"
    )
    async with httpx.AsyncClient(base_url=server, trust_env=False) as http:
        response = await http.post("/eval", json={"input": code})
    assert response.json()["stdout"] == "111\n"  # ECONNREFUSED: loopback inside is another one
