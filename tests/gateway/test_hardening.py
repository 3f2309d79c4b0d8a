"""Who gets in, how many run at once, and what the gateway tells operators and clients."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from gateway.admission import Turns
from python_mcp_server import Admission, Busy, Settings, create_app
from tests.support import connect, serve, text_of

TOKEN = "s3cret-token-for-tests"
SLEEP = "import time\ntime.sleep({seconds})\nprint('slept')"


# --- authentication ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def authed_url(settings: Settings) -> Iterator[str]:
    with serve(create_app(settings.model_copy(update={"auth_token": TOKEN}))) as url:
        yield url


@pytest.mark.parametrize(
    ("method", "path"), [("GET", "/sse"), ("POST", "/messages/"), ("POST", "/mcp"), ("GET", "/mcp")]
)
@pytest.mark.parametrize(
    "authorization", [None, "Bearer wrong", "Basic czNjcmV0", f"bearer{TOKEN}"]
)
def test_mcp_routes_require_the_token(
    authed_url: str, method: str, path: str, authorization: str | None
) -> None:
    headers = {"Authorization": authorization} if authorization else {}
    response = httpx.request(method, f"{authed_url}{path}", headers=headers, json={})
    assert response.status_code == 401
    assert response.headers["www-authenticate"].startswith("Bearer")
    assert TOKEN not in response.text


def test_health_routes_stay_open_and_say_nothing_secret(authed_url: str) -> None:
    for path in ("/healthz", "/readyz", "/metrics"):
        response = httpx.get(f"{authed_url}{path}")
        assert response.status_code == 200, path
        assert TOKEN not in response.text


@pytest.mark.anyio
@pytest.mark.parametrize("transport", ["sse", "http"])
async def test_the_right_token_gets_in_and_is_never_logged(
    authed_url: str, transport: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with anyio.fail_after(60):
        async with connect(authed_url, transport, token=TOKEN) as client:
            result = await client.call_tool("execute_python_code", {"code": "print('in')"})
    assert text_of(result).startswith("in\n")
    assert TOKEN not in caplog.text


# --- safe by default -------------------------------------------------------------------------


def test_a_public_address_without_a_token_is_refused() -> None:
    with pytest.raises(ValueError, match="MCP_AUTH_TOKEN") as refused:
        Settings(host="0.0.0.0").check()
    assert "MCP_ALLOW_UNAUTHENTICATED=true" in str(refused.value)
    Settings(host="0.0.0.0", auth_token=TOKEN).check()
    Settings(host="0.0.0.0", allow_unauthenticated=True).check()
    Settings(host="127.0.0.2").check()


def test_the_command_refuses_to_start_and_says_why() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "python_mcp_server", "--host", "0.0.0.0"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert done.returncode == 1
    assert "refusing to listen on 0.0.0.0 without authentication" in done.stderr
    assert "Traceback" not in done.stderr


def test_token_file_is_read_and_a_missing_one_is_an_error(tmp_path: Path) -> None:
    secret = tmp_path / "token"
    secret.write_text(f"{TOKEN}\n")
    assert Settings.from_env({"MCP_AUTH_TOKEN_FILE": str(secret)}).auth_token == TOKEN
    missing = str(tmp_path / "missing")
    with pytest.raises(ValueError) as refused:
        Settings.from_env({"MCP_AUTH_TOKEN_FILE": missing})
    assert str(refused.value) == (
        f"MCP_AUTH_TOKEN_FILE={missing!r} is not allowed: the file cannot be read "
        "(No such file or directory)"
    )
    with pytest.raises(ValueError) as refused:
        Settings.from_env({"MCP_MAX_WAIT": "soon"})
    assert (
        str(refused.value) == "MCP_MAX_WAIT='soon' is not allowed: it must be a finite number >= 0"
    )


# --- admission ---------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_admission_refuses_at_once_when_the_queue_is_full() -> None:
    admission = Admission(limit=1, max_waiting=1, max_wait=10)
    release = anyio.Event()

    async def hold() -> None:
        async with admission.slot():
            await release.wait()

    async with anyio.create_task_group() as calls:
        calls.start_soon(hold)
        calls.start_soon(hold)
        await anyio.wait_all_tasks_blocked()
        assert (admission.in_flight, admission.waiting) == (1, 1)
        with anyio.fail_after(60), pytest.raises(Busy, match="1 calls are waiting"):
            async with admission.slot():
                pass
        release.set()
    assert (admission.in_flight, admission.waiting) == (0, 0)


@pytest.mark.anyio
async def test_admission_bounds_the_wait() -> None:
    admission = Admission(limit=1, max_waiting=5, max_wait=0.2)
    async with admission.slot():
        with anyio.fail_after(60), pytest.raises(Busy, match=r"within 0\.2 s"):
            async with admission.slot():
                pass
    assert (admission.in_flight, admission.waiting) == (0, 0)


@pytest.mark.anyio
async def test_a_sessions_turn_is_waited_for_as_a_slot_is() -> None:
    admission = Admission(limit=1, max_waiting=1, max_wait=0.5)
    turns = Turns()
    async with admission.turn(turns):
        assert turns.busy
        async with anyio.create_task_group() as calls:
            calls.start_soon(_wait_for_turn, admission, turns, "ran on for 0.5 s")
            await anyio.wait_all_tasks_blocked()
            assert admission.waiting == 1
            with anyio.fail_after(60), pytest.raises(Busy, match="1 calls are waiting already"):
                async with admission.turn(turns):
                    pass
    assert not turns.busy and admission.waiting == 0


@pytest.mark.anyio
async def test_a_call_arriving_as_the_turn_passes_on_waits_in_line() -> None:
    """The lock reads unlocked between one call's end and the next one's start: a call coming
    then is counted and bounded as any other waiting call."""
    admission = Admission(limit=1, max_waiting=1, max_wait=10)
    turns = Turns()
    async with anyio.create_task_group() as calls:
        async with admission.turn(turns):
            calls.start_soon(_hold_turn, admission, turns)
            await anyio.wait_all_tasks_blocked()
        # Released: the next call is woken, and has not run yet.
        assert not turns.lock.locked() and turns.busy
        with anyio.fail_after(60), pytest.raises(Busy, match="1 calls are waiting already"):
            async with admission.turn(turns):
                pass
    assert not turns.busy and admission.waiting == 0


async def _wait_for_turn(admission: Admission, turns: Turns, refused: str) -> None:
    with anyio.fail_after(60), pytest.raises(Busy, match=refused):
        async with admission.turn(turns):
            pass


async def _hold_turn(admission: Admission, turns: Turns) -> None:
    async with admission.turn(turns):
        await anyio.sleep(0.1)


@pytest.mark.anyio
@pytest.mark.parametrize("transport", ["sse", "http"])
async def test_calls_queued_on_one_session_are_bounded(settings: Settings, transport: str) -> None:
    """However many calls a client sends into one session, at most MCP_MAX_WAITING wait for
    its running call, each at most MCP_MAX_WAIT seconds; the others are refused at once."""
    bounded = settings.model_copy(update={"max_waiting": 1, "max_wait": 1.0})
    with serve(create_app(bounded)) as url, anyio.fail_after(90):
        async with connect(url, transport) as client:
            first = await client.call_tool("execute_python_code", {"code": "1"})
            session = {"session_id": (first.structured_content or {})["session_id"]}
            results: dict[str, Any] = {}

            async def call(name: str, code: str) -> None:
                arguments = {"code": code, **session}
                results[name] = await client.call_tool("execute_python_code", arguments)

            async with anyio.create_task_group() as calls:
                calls.start_soon(call, "running", SLEEP.format(seconds=60))
                await _until_metric(url, "mcp_evaluations_in_flight", 1)
                async with anyio.create_task_group() as queued:
                    queued.start_soon(call, "waiting", "print('waited')")
                    await _until_metric(url, "mcp_evaluations_waiting", 1)
                    await call("refused", "print('refused')")
                calls.cancel_scope.cancel()  # the running call: its wait was the point
        assert results["refused"].is_error
        assert "1 calls are waiting already" in text_of(results["refused"])
        assert results["waiting"].is_error, text_of(results["waiting"])
        assert "ran on for 1 s" in text_of(results["waiting"])
        assert "this code did not run" in text_of(results["waiting"])
        assert "running" not in results


async def _until_metric(url: str, name: str, value: float) -> None:
    async with httpx.AsyncClient() as http:
        while True:
            text = (await http.get(f"{url}/metrics")).text
            found = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
            if found and float(found[1]) >= value:
                return
            await anyio.sleep(0.05)


@pytest.mark.anyio
async def test_the_cap_holds_across_both_transports(settings: Settings) -> None:
    capped = settings.model_copy(update={"max_in_flight": 1, "max_waiting": 0})
    with serve(create_app(capped)) as url:
        busy_result = None
        with anyio.fail_after(60):
            async with connect(url, "sse") as first, connect(url, "http") as second:
                async with anyio.create_task_group() as calls:
                    calls.start_soon(
                        first.call_tool, "execute_python_code", {"code": SLEEP.format(seconds=1.5)}
                    )
                    await anyio.sleep(0.5)
                    busy_result = await second.call_tool(
                        "execute_python_code", {"code": "print(1)"}
                    )
                after = await second.call_tool("execute_python_code", {"code": "print(2)"})
        async with httpx.AsyncClient() as http:
            metrics = (await http.get(f"{url}/metrics")).text
    assert busy_result is not None and busy_result.is_error
    assert "The gateway is busy (all 1 slots are running" in text_of(busy_result)
    assert "Retry in a few seconds" in text_of(busy_result)
    assert text_of(after).startswith("2\n")
    assert 'mcp_tool_calls_total{outcome="busy"} 1.0' in metrics
    assert 'mcp_tool_calls_total{outcome="ok"} 2.0' in metrics


# --- progress, metrics and logs --------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("transport", ["sse", "http"])
async def test_progress_is_reported_while_a_call_runs(settings: Settings, transport: str) -> None:
    seen: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total, message))

    with serve(create_app(settings.model_copy(update={"progress_interval": 0.3}))) as url:
        with anyio.fail_after(60):
            async with connect(url, transport) as client:
                result = await client.call_tool(
                    "execute_python_code",
                    {"code": SLEEP.format(seconds=1.2)},
                    progress_callback=on_progress,
                )
    assert text_of(result).startswith("slept\n")
    assert len(seen) >= 2
    progress = [p for p, _, _ in seen]
    assert progress == sorted(progress) and progress[0] > 0
    assert seen[0][1] == settings.evaluator_config.time_limit
    assert seen[0][2] is not None and seen[0][2].startswith("running for")


@pytest.mark.anyio
async def test_one_log_line_per_call_without_code_or_output(
    gateway_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="python_mcp_server")
    with anyio.fail_after(60):
        for transport in ("sse", "http"):
            async with connect(gateway_url, transport) as client:
                await client.call_tool("execute_python_code", {"code": "print('private-output')"})
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "python_mcp_server"]
    calls = [line for line in lines if line.get("event") == "tool_call"]
    assert [c["transport"] for c in calls] == ["sse", "streamable-http"]
    assert calls[0]["session"], "an SSE call is logged with its session"
    assert all(c["request"] is not None for c in calls)
    call = calls[1]
    assert call["outcome"] == "ok" and call["returncode"] == 0
    assert call["code_chars"] == len("print('private-output')")
    assert call["duration_ms"] > 0
    assert "private-output" not in caplog.text


def test_metrics_are_prometheus_text(gateway_url: str) -> None:
    response = httpx.get(f"{gateway_url}/metrics")
    assert response.headers["content-type"].startswith("text/plain")
    for name in (
        "mcp_tool_calls_total",
        "mcp_tool_call_duration_seconds_bucket",
        "mcp_evaluations_in_flight",
        "mcp_evaluations_waiting",
    ):
        assert name in response.text, name
