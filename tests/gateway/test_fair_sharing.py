"""Fair sharing between clients, through real gateways, evaluators and MCP clients.

A call refused for its arguments opens no session and closes none; a client flooding the
gateway with new sessions closes its own before anyone else's, whether the gateway's cap or the
evaluator's is the one reached; clients are told apart by their tokens' names (which the log
and the metrics show, never the tokens), or without tokens by their MCP connections.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import re
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from gateway.tokens import ClientTokens
from python_mcp_server import Settings, create_app
from tests.gateway.conftest import evaluator_service, gateway, with_time_limit
from tests.support import call_code, connect, facts, serve, text_of

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("transport", ["sse", "http"])]

ALICE = "alice-token-0123456789"
BOB = "bob-token-9876543210"
#: The evaluator's own time limit: a loaded machine starts a session slowly.
TIME_LIMIT = 20.0


def _tokens(tmp_path: Path) -> ClientTokens:
    path = tmp_path / "tokens"
    path.write_text(f"# the team\nalice {ALICE}\n\nbob {BOB}\n")
    return ClientTokens.read(path)


async def _metrics(url: str) -> str:
    async with httpx.AsyncClient() as http:
        return (await http.get(f"{url}/metrics")).text


def _value(metrics: str, name: str) -> float:
    found = re.search(rf"^{re.escape(name)} (\S+)$", metrics, re.M)
    return float(found[1]) if found else 0.0


@pytest.mark.parametrize("where", ["in-process", "over-http"])
async def test_a_call_refused_for_its_arguments_opens_and_closes_no_session(
    settings: Settings, transport: str, where: str
) -> None:
    small = settings.model_copy(update={"max_code_sessions": 2, "max_session_bytes": 64 * 1024})
    too_big = base64.b64encode(b"x" * 100_000).decode()
    refused_calls: list[dict[str, Any]] = [
        {"python": "0.1"},
        {"code": "# /// script\n# dependencies = [\n# ///\nprint(1)"},
        {"code": "# /// script\n# x = " + "[" * 3000 + "]" * 3000 + "\n# ///\nprint(1)"},
        {"files": [{"path": "big.bin", "content": too_big, "encoding": "base64"}]},
    ]
    with gateway(small, where) as url:
        async with connect(url, transport) as victim, connect(url, transport) as other:
            kept = facts(await call_code(victim, "x = 'kept'\nopen('a.txt', 'w').write('a')"))
            before = await _metrics(url)
            for _ in range(3):
                for arguments in refused_calls:
                    code = arguments.get("code", "open('ran', 'w')")
                    extra = {k: v for k, v in arguments.items() if k != "code"}
                    refused = await call_code(other, str(code), **extra)
                    assert refused.is_error, text_of(refused)
                    assert "failed in the gateway" not in text_of(refused)
            after = await _metrics(url)
            assert _value(after, "mcp_code_sessions_created_total") == _value(
                before, "mcp_code_sessions_created_total"
            )
            assert _value(after, "mcp_code_sessions_open") == 1
            assert _value(after, 'mcp_tool_calls_total{outcome="refused"}') >= 12
            again = await call_code(
                victim, "print(open('a.txt').read())", session_id=kept["session_id"]
            )
            assert text_of(again).startswith("a\n")


async def test_a_flooding_token_closes_its_own_sessions_not_anothers(
    settings: Settings, transport: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """At the gateway's cap (in-process, the evaluator's cap is never reached first)."""
    team = settings.model_copy(
        update={"max_code_sessions": 3, "auth_tokens_file": _tokens(tmp_path)}
    )
    caplog.set_level(logging.INFO, logger="python_mcp_server")
    with serve(create_app(team)) as url:
        async with (
            connect(url, transport, token=ALICE) as alice,
            connect(url, transport, token=BOB) as bob,
        ):
            mine = facts(await call_code(alice, "x = 'alice'"))["session_id"]
            flood = [facts(await call_code(bob, "1"))["session_id"] for _ in range(6)]
            still = await call_code(alice, "print(x)", session_id=mine)
            assert text_of(still).startswith("alice\n")
            evicted = await call_code(bob, "1", session_id=flood[0])
            assert evicted.is_error and "to make room" in text_of(evicted)
            metrics = await _metrics(url)
    assert _value(metrics, 'mcp_code_sessions_open_by_client{client="alice"}') == 1
    assert _value(metrics, 'mcp_code_sessions_open_by_client{client="bob"}') == 2
    assert _value(metrics, 'mcp_tool_calls_by_client_total{client="bob",outcome="ok"}') == 6
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert '"client": "bob"' in logged and '"client": "alice"' in logged
    assert ALICE not in logged + metrics and BOB not in logged + metrics


async def test_a_flood_through_another_gateway_spares_anothers_interpreter(
    settings: Settings, transport: str, tmp_path: Path
) -> None:
    """At the evaluator's cap (4 live sessions; the gateways keep up to 64 each): the
    evaluator ends the flooding client's interpreters, told who owns each by the gateways."""
    tokens = _tokens(tmp_path)
    team = with_time_limit(settings, TIME_LIMIT).model_copy(
        update={"auth_tokens_file": tokens, "session_secret": "one secret for both gateways"}
    )
    async with contextlib.AsyncExitStack() as stack:
        service = stack.enter_context(evaluator_service(TIME_LIMIT, sessions=True))
        remote = team.model_copy(update={"snekbox_url": service})
        first, second = (stack.enter_context(serve(create_app(remote))) for _ in range(2))
        alice = await stack.enter_async_context(connect(first, transport, token=ALICE))
        bob = await stack.enter_async_context(connect(second, transport, token=BOB))
        mine = facts(await call_code(alice, "x = 'alice'"))["session_id"]
        for _ in range(6):
            facts(await call_code(bob, "1"))
        still = await call_code(alice, "print(x)", session_id=mine)
        assert text_of(still).startswith("alice\n"), text_of(still)


async def test_without_tokens_each_connection_has_its_share(
    settings: Settings, transport: str
) -> None:
    """A connection is a transport session where the 2025-11-25 handshake ("legacy") opens
    one; a sessionless (2026-07-28, "auto" over HTTP) client's is its HTTP connection. Taken
    together, two sessionless clients would share one share: the flood would close the calm
    client's session."""
    small = settings.model_copy(update={"max_code_sessions": 3})
    with gateway(small, "in-process") as url:
        for mode in ["legacy", "auto"] if transport == "http" else ["legacy"]:
            async with (
                connect(url, transport, mode=mode) as calm,
                connect(url, transport, mode=mode) as flood,
            ):
                mine = facts(await call_code(calm, "x = 'calm'"))["session_id"]
                for _ in range(6):
                    facts(await call_code(flood, "1"))
                still = await call_code(calm, "print(x)", session_id=mine)
                assert text_of(still).startswith("calm\n"), (mode, text_of(still))


async def test_a_session_ended_for_memory_says_so_to_its_next_call(
    settings: Settings, transport: str
) -> None:
    """The evaluator's watchdog ends the largest live session while memory is short: with a
    reserve of 99% of the host's memory, it always is, so the one session here ends within a
    second or two, and its next call through the gateway is told why."""
    reserve = {"EVALUATOR_MEMORY_RESERVE": "0.99"}
    async with contextlib.AsyncExitStack() as stack:
        service = stack.enter_context(evaluator_service(TIME_LIMIT, sessions=True, env=reserve))
        remote = with_time_limit(settings, TIME_LIMIT).model_copy(update={"snekbox_url": service})
        url = stack.enter_context(serve(create_app(remote)))
        client = await stack.enter_async_context(connect(url, transport))
        session_id = facts(await call_code(client, "data = bytearray(64 << 20)"))["session_id"]
        with anyio.fail_after(60):
            while True:
                lost = await call_code(client, "print(len(data))", session_id=session_id)
                if lost.is_error:
                    break
                await anyio.sleep(0.5)
        assert "host was running out of memory (its processes held" in text_of(lost), text_of(lost)
        assert _value(await _metrics(url), 'mcp_interpreters_lost_total{why="memory"}') == 1


async def test_the_gateways_session_cap_behind_a_service_is_its_own(
    settings: Settings, transport: str
) -> None:
    """Behind SNEKBOX_URL one replica's GET /info (4 live sessions here) does not say how many
    replicas share the name: the gateway keeps its setting, or 64."""
    with evaluator_service(TIME_LIMIT, sessions=True) as service:
        remote = with_time_limit(settings, TIME_LIMIT).model_copy(update={"snekbox_url": service})
        for asked, kept in ((None, 64), (9, 9)):
            app = create_app(remote.model_copy(update={"max_code_sessions": asked}))
            with serve(app):
                assert app.state.gateway.sessions.max_sessions == kept
