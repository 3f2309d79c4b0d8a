"""The call pipeline against a fake service, through an in-memory MCP client: no sandbox, no
process, no socket (the fast lane; the real parts are tested in the slow one)."""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

import anyio
import pytest
from jsonschema import Draft202012Validator  # type: ignore[import-untyped]
from mcp import Client
from mcp.types import CallToolResult, ImageContent

import plotting
from gateway import resident as gateway_resident
from gateway.app import create_server
from gateway.tool import Gateway
from python_mcp_server import Settings
from snekbox_client import EvaluatorRejected, EvaluatorUnavailable, File, Python, ServiceInfo
from tests.gateway.conftest import with_time_limit
from tests.gateway.fake_service import LIVE, FakeService, ok
from tests.support import text_of

pytestmark = pytest.mark.anyio


@asynccontextmanager
async def gateway(service: FakeService, **changes: Any) -> AsyncIterator[tuple[Gateway, Client]]:
    """A gateway on ``service`` (its settings changed as given), and a client of it."""
    settings = with_time_limit(Settings(), 5.0).model_copy(update=changes)
    with anyio.fail_after(60):
        async with Gateway(settings, service) as started, Client(create_server(started)) as c:
            yield started, c


async def call(client: Client, code: str = "print(1)", **arguments: Any) -> CallToolResult:
    with anyio.fail_after(60):
        return await client.call_tool("execute_python_code", {"code": code, **arguments})


def facts(result: CallToolResult) -> dict[str, Any]:
    assert not result.is_error, text_of(result)
    structured: dict[str, Any] | None = result.structured_content
    assert structured is not None
    return structured


def png(width: int = 2, height: int = 2) -> bytes:
    """A valid PNG of ``width`` x ``height`` grey pixels."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    pixels = zlib.compress(b"".join(b"\0" + b"\x80" * width for _ in range(height)))
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")
    )


async def test_a_call_runs_its_code_and_gets_its_output_and_a_session() -> None:
    service = FakeService(ok("42\n"))
    async with gateway(service) as (_, client):
        result = facts(await call(client, "print(6 * 7)"))
    assert service.codes == ["print(6 * 7)"]
    assert (result["stdout"], result["returncode"], result["status"]) == ("42\n", 0, "ok")
    assert result["session_id"]
    assert service.probes >= 1  # what the service offers was asked at start
    assert service.closed


async def test_the_prelude_is_compiled_at_start_not_by_the_first_call() -> None:
    plotting._parts.cache_clear()  # as in a new process
    async with gateway(FakeService()):
        assert plotting._parts.cache_info().currsize == 1


async def test_a_users_exception_is_a_result_not_a_tool_error() -> None:
    traceback = "Traceback (most recent call last):\nValueError: no\n"
    async with gateway(FakeService(ok(traceback, returncode=1))) as (_, client):
        result = facts(await call(client, "raise ValueError('no')"))
    assert (result["returncode"], result["status"]) == (1, "exception")


async def test_a_failure_of_the_service_is_a_tool_error_and_opens_no_session() -> None:
    service = FakeService(EvaluatorUnavailable("http://fake", "connection refused"))
    async with gateway(service) as (started, client):
        result = await call(client)
        metrics = started.metrics.render().decode()
    assert result.is_error
    assert "unreachable (connection refused); the code did not run" in text_of(result)
    assert 'mcp_tool_calls_total{outcome="unavailable"} 1.0' in metrics
    assert "mcp_code_sessions_open 0.0" in metrics


async def test_code_over_the_limit_never_reaches_the_service() -> None:
    service = FakeService()
    async with gateway(service, max_code_chars=10) as (_, client):
        result = await call(client, "print(1)\n" * 5)
    assert result.is_error and "45 characters long; the limit is 10" in text_of(result)
    assert service.requests == []


async def test_a_files_only_session_carries_its_files_into_each_run() -> None:
    service = FakeService(ok("", File("out.txt", b"kept")), ok("kept\n"))
    async with gateway(service) as (_, client):
        first = facts(await call(client, "open('out.txt', 'w').write('kept')"))
        session = first["session_id"]
        assert [f["path"] for f in first["files"]] == ["out.txt"]
        facts(await call(client, "print(open('out.txt').read())", session_id=session))
    second = service.requests[1]
    assert ("out.txt", b"kept") in [(f.path, f.content) for f in second.files]
    assert second.session is None and not second.session_resume


async def test_a_live_session_resumes_its_interpreter_without_the_files() -> None:
    service = FakeService(
        ok("", File("out.txt", b"kept"), session_ended=False), ok(session_ended=False), info=LIVE
    )
    async with gateway(service) as (_, client):
        session = facts(await call(client, "x = 1"))["session_id"]
        facts(await call(client, "print(x)", session_id=session))
    first, second = service.requests
    assert first.session == second.session is not None
    assert (first.session_resume, second.session_resume) == (False, True)
    assert "out.txt" not in [f.path for f in second.files]  # its sandbox holds them
    assert first.session_owner is None  # no client to tell apart in memory


async def test_a_lost_interpreter_is_said_and_the_next_call_starts_a_new_one() -> None:
    gone = EvaluatorRejected(404, "Session not found", "no such live session")
    service = FakeService(ok(session_ended=False), gone, ok(session_ended=False), info=LIVE)
    async with gateway(service) as (started, client):
        session = facts(await call(client))["session_id"]
        lost = await call(client, session_id=session)
        again = facts(await call(client, session_id=session))
        metrics = started.metrics.render().decode()
    assert lost.is_error and "The session's interpreter is gone" in text_of(lost)
    assert again["session_id"] == session
    assert [r.session_resume for r in service.requests] == [False, True, False]
    assert 'mcp_interpreters_lost_total{why="gone"} 1.0' in metrics


async def test_an_ended_session_is_refused_by_name_and_its_interpreter_ended() -> None:
    service = FakeService(ok(session_ended=False), info=LIVE)
    async with gateway(service) as (_, client):
        session = facts(await call(client))["session_id"]
        with anyio.fail_after(60):
            ended = await client.call_tool("end_session", {"session_id": session})
        refused = await call(client, session_id=session)
    assert not ended.is_error
    assert refused.is_error and "was ended on purpose" in text_of(refused)
    assert [name for name, _ in service.ended] == [service.requests[0].session]


async def test_at_the_cap_the_longest_idle_session_makes_room_and_is_said_evicted() -> None:
    service = FakeService(*(ok(session_ended=False) for _ in range(3)), info=LIVE)
    async with gateway(service, max_code_sessions=2) as (_, client):
        ids = [facts(await call(client))["session_id"] for _ in range(3)]
        refused = await call(client, session_id=ids[0])
    assert refused.is_error and "was closed to make room" in text_of(refused)
    # The evicted interpreter is ended by the request that needed its room.
    assert service.requests[2].end_sessions == (service.requests[0].session,)


async def test_a_time_limit_above_the_maximum_is_lowered_and_said() -> None:
    service = FakeService(info=LIVE)
    async with gateway(service) as (_, client):  # the evaluator's limit: 5 s
        result = await call(client, timeout_seconds=60)
    assert service.requests[0].time_limit == 5.0
    assert "timeout_seconds 60 is above the maximum, 5 s" in text_of(result)


async def test_a_python_not_offered_is_refused_before_any_run() -> None:
    service = FakeService()
    async with gateway(service) as (_, client):
        result = await call(client, python="2.7")
    assert result.is_error
    assert service.requests == []


async def test_figures_come_back_as_images_in_drawing_order() -> None:
    figures = [File(f"figure_{n:03d}.png", png(n + 1, 2)) for n in (1, 2)]
    async with gateway(FakeService(ok("", *figures))) as (_, client):
        result = await call(client, "plot twice")
    images = [c for c in result.content if isinstance(c, ImageContent)]
    assert len(images) == 2
    widths = [i["width"] for i in facts(result)["images"]]
    assert widths == [2, 3]


async def test_the_description_says_what_the_service_keeps() -> None:
    async with gateway(FakeService()) as (started, _):
        one_shot = started.tool_description()
    async with gateway(FakeService(info=LIVE)) as (started, _):
        live = started.tool_description()
    assert "variables and imports do NOT carry over" in one_shot
    assert "Sessions are like a notebook" in live
    assert "The evaluation service sets the limits" in live  # not in this process


async def test_readiness_follows_the_service_and_draining() -> None:
    service = FakeService()
    async with gateway(service) as (started, _):
        assert await started.readiness() is None
        service.down = True
        assert await started.readiness() == "the evaluation service is unreachable"
        started.draining = True
        assert await started.readiness() == "the gateway is shutting down"


async def test_a_draining_gateway_runs_nothing() -> None:
    service = FakeService(info=ServiceInfo.none())
    async with gateway(service) as (started, client):
        started.draining = True
        result = await call(client)
    assert result.is_error and "shutting down" in text_of(result)
    assert service.requests == []


async def test_an_interpreter_that_ended_with_its_call_is_said_and_the_next_starts_anew() -> None:
    service = FakeService(ok(session_ended=True), ok(session_ended=False), info=LIVE)
    async with gateway(service) as (_, client):
        ended = await call(client)
        again = await call(client, session_id=facts(ended)["session_id"])
    assert "the session's interpreter ended with this call" in text_of(ended)
    assert "interpreter ended" not in text_of(again)
    assert [r.session_resume for r in service.requests] == [False, False]


async def test_the_output_schema_takes_null_where_a_field_may_be_null() -> None:
    # Nullable fields are one schema each (a type list), not an anyOf of two: a validating
    # client descends into each once. Each admits null and its type, and nothing else.
    async with gateway(FakeService()) as (_, client):
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        result = facts(await call(client))
    schema = tools["execute_python_code"].output_schema
    assert schema is not None and "anyOf" not in json.dumps(schema)
    validator = Draft202012Validator(schema)
    assert validator.is_valid(result)
    image = {"path": "figure_001.png", "size": 3, "returned": True}
    written = {"path": "a.txt", "size": 1, "mime_type": "text/plain"}
    for field, good, bad in [
        ("returncode", None, "0"),
        ("session_id", None, 1),
        ("packages", ["numpy==2.0"], [1]),
        ("install_seconds", 1.5, "1.5"),
        ("images", [{**image, "width": None, "reason": None}], [{**image, "width": "2"}]),
        ("images", [{**image, "height": 2, "reason": "x"}], [{**image, "reason": 1}]),
        ("files", [{**written, "uri": None}], [{**written, "uri": 1}]),
    ]:
        assert validator.is_valid({**result, field: good}), field
        assert not validator.is_valid({**result, field: bad}), field
    for field in ("returncode", "packages", "install_seconds"):
        assert validator.is_valid({**result, field: None}), field


#: What a run sent without the prelude answers where neither its sandbox nor the service has it.
MISSING = ok(plotting._PRELUDE_MISSING_OUTPUT, returncode=121)


async def test_a_snekbox_without_the_resident_prelude_gets_it_in_every_run_after_one_check() -> (
    None
):
    service = FakeService(MISSING, MISSING, ok("1\n"))
    async with gateway(service) as (_, client):
        assert facts(await call(client))["stdout"] == "1\n"
        facts(await call(client))
    # The call's run, the check (a run of no code), the call's run again with the prelude, and
    # the next call's, with it from the start.
    assert service.codes == ["print(1)", "", "print(1)", "print(1)"]
    sent = [plotting.carries_prelude(request) for request in service.requests]
    assert sent == [False, False, True, True]


async def test_code_that_answers_as_a_missing_prelude_leaves_the_resident_one_in_use() -> None:
    service = FakeService(MISSING, ok(), ok("forged\n"))
    async with gateway(service) as (_, client):
        facts(await call(client, "forge()"))
        facts(await call(client))
    assert service.codes == ["forge()", "", "forge()", "print(1)"]
    sent = [plotting.carries_prelude(request) for request in service.requests]
    assert sent == [False, False, True, False]


async def test_a_run_with_another_python_than_the_default_carries_the_prelude() -> None:
    pythons = (Python("3.12.1", "/usr/bin/python3"), Python("3.13.0", "/opt/python3.13"))
    said = plotting.prelude_digest()
    service = FakeService(info=replace(LIVE, pythons=pythons, resident_prelude=said))
    async with gateway(service) as (_, client):
        facts(await call(client, python="3.13"))
        facts(await call(client))
    assert [r.executable_path for r in service.requests] == ["/opt/python3.13", None]
    # The service keeps it compiled for its default interpreter only.
    assert [plotting.carries_prelude(r) for r in service.requests] == [True, False]


async def test_the_built_in_evaluator_is_sent_runs_without_the_prelude_it_says_it_keeps() -> None:
    # A cell read later could not be sent again: only the evaluator's word counts there.
    cells = replace(LIVE, long_time_limit=3600.0)
    for said, carried in ((plotting.prelude_digest(), False), (None, True), ("0" * 32, True)):
        service = FakeService(info=replace(cells, resident_prelude=said))
        async with gateway(service) as (_, client):
            facts(await call(client, wait_seconds=0))
        assert [plotting.carries_prelude(r) for r in service.requests] == [carried], said


async def test_a_check_that_fails_leaves_the_resident_prelude_in_use() -> None:
    service = FakeService(MISSING, EvaluatorUnavailable("http://fake", "refused"), ok("1\n"))
    async with gateway(service) as (_, client):
        assert facts(await call(client))["stdout"] == "1\n"
        facts(await call(client))
    sent = [plotting.carries_prelude(request) for request in service.requests]
    assert sent == [False, False, True, False]


async def test_a_snekbox_found_without_it_is_tried_again_later(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    service = FakeService(MISSING, MISSING)
    async with gateway(service) as (_, client):
        facts(await call(client))
        facts(await call(client))
        monkeypatch.setattr(gateway_resident, "RETRY_SECONDS", 0.0)
        facts(await call(client))
    sent = [plotting.carries_prelude(request) for request in service.requests]
    assert sent == [False, False, True, True, False]


async def test_a_built_in_evaluator_found_without_what_it_said_gets_the_prelude_from_then_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cells = replace(LIVE, long_time_limit=3600.0, resident_prelude=plotting.prelude_digest())
    service = FakeService(MISSING, MISSING, ok("1\n"), info=cells)
    async with gateway(service) as (_, client):
        assert facts(await call(client))["stdout"] == "1\n"
        monkeypatch.setattr(gateway_resident, "RETRY_SECONDS", 0.0)
        facts(await call(client))  # a cell read later: never again on its word alone
    sent = [plotting.carries_prelude(request) for request in service.requests]
    assert sent == [False, False, True, True]
