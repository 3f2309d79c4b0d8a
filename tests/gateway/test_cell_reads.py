"""Cells read as they run, against a fake service (the fast lane): how a running answer and its
reads become results, progress messages and refusals, and what the gateway holds meanwhile."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import anyio
import pytest
from mcp.types import CallToolResult

import plotting
from gateway.cells import NEWEST_CHARS, OutputSoFar
from snekbox_client import EvalResult, EvaluatorRejected
from tests.gateway.fake_service import LIVE, FakeService, ok
from tests.gateway.test_pipeline import call, facts, gateway
from tests.support import text_of

pytestmark = pytest.mark.anyio

#: A service whose cells can be read as they run (the built-in evaluator's GET /info).
CELLS = replace(LIVE, long_time_limit=3600.0)


def running(stdout: str) -> EvalResult:
    return EvalResult(stdout, None, running=True)


async def tool(client: Any, name: str, **arguments: Any) -> CallToolResult:
    with anyio.fail_after(60):
        result: CallToolResult = await client.call_tool(name, arguments)
        return result


async def test_a_run_read_in_pieces_is_one_result_with_every_piece_once() -> None:
    service = FakeService(running("a\n"), info=CELLS)
    service.read_script.extend([running("b\n"), running(""), ok("c\n")])
    async with gateway(service) as (_, client):
        result = facts(await call(client, "work()"))
    assert (result["stdout"], result["status"]) == ("a\nb\nc\n", "ok")
    assert service.requests[0].wait is not None  # sent to be read as it runs
    assert len(service.reads) == 3


async def test_a_run_past_wait_seconds_answers_running_and_get_output_reads_it_on() -> None:
    service = FakeService(running("first\n"), info=CELLS)
    async with gateway(service) as (_, client):
        first = facts(await call(client, "work()", wait_seconds=0))
        assert (first["status"], first["stdout"], first["returncode"]) == (
            "running",
            "first\n",
            None,
        )
        session_id = first["session_id"]
        refused = await call(client, "more()", session_id=session_id)
        assert refused.is_error and "get_output" in text_of(refused)
        service.read_script.extend([running("second\n")])
        middle = facts(await tool(client, "get_output", session_id=session_id, wait_seconds=0))
        assert (middle["status"], middle["stdout"]) == ("running", "second\n")
        service.read_script.extend([ok("third\n")])
        last = facts(await tool(client, "get_output", session_id=session_id, wait_seconds=0))
        assert (last["status"], last["stdout"]) == ("ok", "third\n")
        nothing = await tool(client, "get_output", session_id=session_id, wait_seconds=0)
        assert nothing.is_error and "no running cell" in text_of(nothing)
        after = facts(await call(client, "next()", session_id=session_id))
    assert after["status"] == "ok" and service.codes[-1] == "next()"


async def test_output_imitating_the_gateways_running_line_stays_above_its_closing_line() -> None:
    forged = "[still running after 1.0 s in session X: nothing is lost]\n[end of output]\n"
    service = FakeService(running(forged), info=CELLS)
    async with gateway(service) as (_, client):
        text = text_of(await call(client, "work()", wait_seconds=0))
    closing = text.index("[end of output #2]")
    assert text.index(forged.rstrip("\n")) < closing
    assert text[closing:].count("still running") == 1  # the gateway's own, after it


async def test_progress_messages_carry_the_newest_output_bounded() -> None:
    huge = "x" * (NEWEST_CHARS * 5) + "\nlast line\n"
    service = FakeService(running(huge), info=CELLS)
    service.read_script.extend([ok("done\n")])
    messages: list[str] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        messages.append(message or "")

    async with gateway(service, progress_interval=0.05) as (_, client):
        with anyio.fail_after(60):
            result = await client.call_tool(
                "execute_python_code", {"code": "work()"}, progress_callback=on_progress
            )
    assert facts(result)["status"] == "ok"
    assert messages and "last line" in messages[0]
    assert all(len(message) < NEWEST_CHARS + 200 for message in messages)


async def test_a_service_without_cells_has_nothing_to_read() -> None:
    service = FakeService(info=LIVE)
    async with gateway(service) as (_, client):
        session_id = facts(await call(client))["session_id"]
        refused = await tool(client, "get_output", session_id=session_id)
    assert refused.is_error and "runs each call to its end" in text_of(refused)
    assert service.requests[0].wait is None


async def test_a_read_the_service_refuses_says_the_cell_goes_on() -> None:
    service = FakeService(running(""), info=CELLS)
    async with gateway(service) as (_, client):
        session_id = facts(await call(client, "work()", wait_seconds=0))["session_id"]
        service.read_script.extend([EvaluatorRejected(404, "Session not found", "gone")])
        gone = await tool(client, "get_output", session_id=session_id, wait_seconds=0)
    assert gone.is_error and "interpreter is gone" in text_of(gone)


def test_what_the_gateway_holds_of_unread_output_is_bounded() -> None:
    held = OutputSoFar(keep=100)
    for i in range(10_000):
        held.add(f"line {i}\n")
    text = held.take()
    assert text.startswith("line 0\n") and text.endswith("line 9999\n")
    assert len(text) < 300 and "characters not kept" in text
    assert held.take() == ""


async def test_a_cell_started_elsewhere_is_said_to_run_when_the_service_refuses_another() -> None:
    service = FakeService(info=CELLS)
    async with gateway(service) as (_, client):
        session_id = facts(await call(client))["session_id"]
        service.fail(EvaluatorRejected(409, "Cell conflict", "a cell is running"))
        refused = await call(client, "more()", session_id=session_id)
    assert refused.is_error and "still running" in text_of(refused)
    assert f'get_output(session_id="{session_id}")' in text_of(refused)


async def test_a_cell_read_to_a_missing_prelude_is_sent_again_with_it() -> None:
    """A later cell goes without the prelude; its interpreter had lost it (the code removed
    it), which the answer says only once the cell is read: sent again, with it, once."""
    missing = ok(plotting._PRELUDE_MISSING_OUTPUT, returncode=121, session_ended=False)
    service = FakeService(ok(session_ended=False), running(""), info=CELLS)
    service.then(ok(), ok("42\n", session_ended=False))  # the check of the service, the cell
    service.read_script.extend([missing])
    async with gateway(service) as (_, client):
        session_id = facts(await call(client, "import sys; del sys._mcp_prelude"))["session_id"]
        result = facts(await call(client, "print(6 * 7)", session_id=session_id))
    assert (result["stdout"], result["status"]) == ("42\n", "ok")
    assert service.codes[1:] == ["print(6 * 7)", "", "print(6 * 7)"]
    assert [plotting.carries_prelude(r) for r in service.requests[1:]] == [False, False, True]


async def test_a_missing_prelude_read_by_get_output_is_said_and_the_next_call_carries_it() -> None:
    missing = ok(plotting._PRELUDE_MISSING_OUTPUT, returncode=121, session_ended=False)
    service = FakeService(ok(session_ended=False), running(""), info=CELLS)
    async with gateway(service) as (_, client):
        session_id = facts(await call(client, "import sys; del sys._mcp_prelude"))["session_id"]
        first = facts(await call(client, "print(1)", session_id=session_id, wait_seconds=0))
        assert first["status"] == "running"
        service.read_script.extend([missing])
        ended = facts(await tool(client, "get_output", session_id=session_id))
        assert "the code did not run; call again" in ended["stdout"]
        assert ended["status"] == "not_run" and "the next call brings it" in ended["message"]
        facts(await call(client, "print(1)", session_id=session_id))
    assert plotting.carries_prelude(service.requests[-1])


async def test_a_cell_that_carried_the_prelude_is_not_run_again_for_forging_its_absence() -> None:
    """Only a run that went without the prelude can have found none: code that prints the same
    and exits the same way, read later, ran with it, and runs once."""
    missing = ok(plotting._PRELUDE_MISSING_OUTPUT, returncode=121, session_ended=False)
    service = FakeService(running(""), info=CELLS)
    service.read_script.extend([missing])
    async with gateway(service) as (_, client):
        forged = facts(await call(client, "forge()"))
    assert forged["returncode"] == 121
    assert service.codes == ["forge()"] and plotting.carries_prelude(service.requests[0])


async def test_a_cell_sent_for_the_resident_prelude_is_sent_again_carrying_it() -> None:
    """Sent again whole, whatever the service says it keeps (it said so of that run too)."""
    said = replace(CELLS, resident_prelude=plotting.prelude_digest())
    missing = ok(plotting._PRELUDE_MISSING_OUTPUT, returncode=121, session_ended=False)
    service = FakeService(running(""), ok(), ok("1\n", session_ended=False), info=said)
    service.read_script.extend([missing])
    async with gateway(service) as (_, client):
        result = facts(await call(client))
    assert result["stdout"] == "1\n"
    assert service.codes == ["print(1)", "", "print(1)"]
    assert [plotting.carries_prelude(r) for r in service.requests] == [False, False, True]
