"""Cells read as they run: a session's cell answered early with ``wait``, read in pieces over
HTTP (``POST /sessions/<id>/output``), interrupted (``/interrupt``), and left by its client."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
import pytest

from evaluator import Evaluator, create_app

from .conftest import config

pytestmark = pytest.mark.xdist_group("cells")

# Far above what any cell here needs: a loaded host must never make a test's cell a kill.
TIME_LIMIT = 60.0
#: An evaluator that runs one thing at a time: the others queue for its slot.
ONE_SLOT: dict[str, Any] = {"concurrency": 1, "max_queue": 8, "time_limit": TIME_LIMIT}


@contextlib.asynccontextmanager
async def serving(**settings: Any) -> AsyncIterator[tuple[Evaluator, httpx.AsyncClient]]:
    """An evaluator of its own (``settings``, nothing imported ahead) and a client of its API."""
    async with Evaluator(config(**{"preimport": (), **settings})) as evaluator:
        transport = httpx.ASGITransport(create_app(evaluator))
        async with httpx.AsyncClient(
            transport=transport, base_url="http://evaluator", timeout=120
        ) as client:
            yield evaluator, client


@pytest.fixture(scope="module")
async def evaluator() -> AsyncIterator[Evaluator]:
    async with Evaluator(
        config(time_limit=TIME_LIMIT, long_time_limit=600, preimport=(), max_sessions=4)
    ) as started:
        yield started


@pytest.fixture(scope="module")
def http(client: httpx.AsyncClient) -> httpx.AsyncClient:
    """The API of this module's evaluator (conftest's client, on the evaluator above)."""
    return client


async def start(http: httpx.AsyncClient, session: str, code: str, **body: Any) -> dict[str, Any]:
    response = await http.post(
        "/eval", json={"input": code, "session": session, "wait": 0.5, **body}
    )
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


async def read(
    http: httpx.AsyncClient, session: str, wait: float = 5, **body: Any
) -> httpx.Response:
    return await http.post(f"/sessions/{session}/output", json={"wait": wait, **body})


async def read_to_end(http: httpx.AsyncClient, session: str) -> tuple[str, dict[str, Any]]:
    """Every piece until the result: the text read, and the result's answer."""
    text = ""
    for _ in range(200):
        response = await read(http, session)
        assert response.status_code == 200, response.text
        answer = response.json()
        text += answer["stdout"]
        if not answer.get("running"):
            return text, answer
    raise AssertionError("the cell never ended")


async def test_a_cell_past_its_wait_answers_running_and_is_read_to_its_end_once(
    http: httpx.AsyncClient,
) -> None:
    code = (
        "import time\n"
        "for i in range(30):\n"
        "    print(f'line {i}', flush=True)\n"
        "    time.sleep(0.1)\n"
        "open('out.txt', 'w').write('done')\n"
        "x = 42\n"
    )
    first = await start(http, "reads", code)
    assert first["running"] is True and first["returncode"] is None
    rest, final = await read_to_end(http, "reads")
    lines = (first["stdout"] + rest).splitlines()
    assert lines == [f"line {i}" for i in range(30)]  # nothing lost, nothing twice
    assert final["returncode"] == 0 and final["session_ended"] is False
    assert [f["path"] for f in final["files"]] == ["out.txt"]
    # Read once: there is nothing more to read, and the session goes on with its variables.
    again = await read(http, "reads", wait=0)
    assert again.status_code == 409, again.text
    follow = await start(http, "reads", "print(x)", session_resume=True)
    assert (follow["stdout"], follow["returncode"]) == ("42\n", 0)


async def test_a_cell_that_ends_within_its_wait_answers_as_any_run(
    http: httpx.AsyncClient,
) -> None:
    answer = await start(http, "quick", "print('hi')", wait=30)
    assert answer["stdout"] == "hi\n" and answer["returncode"] == 0
    assert "running" not in answer


async def test_a_read_with_early_answers_at_the_first_output(http: httpx.AsyncClient) -> None:
    await start(
        http, "early", "import time\ntime.sleep(1)\nprint('now', flush=True)\ntime.sleep(30)"
    )
    response = await read(http, "early", wait=60, early=True)
    answer = response.json()
    assert answer["running"] is True and "now" in answer["stdout"]
    await http.post("/sessions/early/interrupt")
    _, final = await read_to_end(http, "early")
    assert final["ended_by"] == "interrupted"


async def test_an_interrupt_stops_a_loop_and_keeps_the_variables(
    http: httpx.AsyncClient,
) -> None:
    first = await start(http, "stop", "y = 7\nwhile True:\n    pass")
    assert first["running"] is True
    response = await http.post("/sessions/stop/interrupt")
    assert response.status_code == 204, response.text
    _, final = await read_to_end(http, "stop")
    assert final["ended_by"] == "interrupted" and final["session_ended"] is False
    assert "KeyboardInterrupt" in final["stdout"]
    after = await start(http, "stop", "print(y)", session_resume=True)
    assert after["stdout"] == "7\n"


async def test_an_interrupt_the_code_ignores_ends_the_interpreter(
    http: httpx.AsyncClient,
) -> None:
    code = (
        "import time\n"
        "while True:\n"
        "    try:\n"
        "        time.sleep(1)\n"
        "    except BaseException:\n"
        "        pass"
    )
    await start(http, "stubborn", code)
    await http.post("/sessions/stubborn/interrupt")
    _, final = await read_to_end(http, "stubborn")
    assert final["ended_by"] == "interrupted" and final["session_ended"] is True
    assert final["returncode"] == 137


async def test_a_second_cell_while_one_runs_is_refused_at_once(http: httpx.AsyncClient) -> None:
    await start(http, "busy", "import time\ntime.sleep(30)")
    second = await http.post("/eval", json={"input": "print(1)", "session": "busy", "wait": 0.5})
    assert second.status_code == 409, second.text
    assert "running" in second.json()["description"]
    await http.post("/sessions/busy/interrupt")
    await read_to_end(http, "busy")


async def test_reads_and_interrupts_without_a_cell_say_so(http: httpx.AsyncClient) -> None:
    assert (await read(http, "nobody", wait=0)).status_code == 404
    assert (await http.post("/sessions/nobody/interrupt")).status_code == 404
    await start(http, "idle", "z = 1", wait=30)
    assert (await read(http, "idle", wait=0)).status_code == 409
    assert (await http.post("/sessions/idle/interrupt")).status_code == 409
    for bad in ({"wait": -1}, {"wait": 1e9}, {"wait": "1"}, {"early": 1}):
        assert (await read(http, "idle", **bad)).status_code == 400


async def test_a_client_that_leaves_loses_nothing_it_can_read_later(
    evaluator: Evaluator, http: httpx.AsyncClient
) -> None:
    code = "import time\nprint('before', flush=True)\ntime.sleep(2)\nprint('after')"
    request = asyncio.ensure_future(
        http.post("/eval", json={"input": code, "session": "left", "wait": 30})
    )
    await asyncio.sleep(1)
    request.cancel()  # the client goes away while it waits
    with pytest.raises(asyncio.CancelledError):
        await request
    text, final = await read_to_end(http, "left")
    assert text.splitlines() == ["before", "after"] and final["returncode"] == 0


async def test_a_cell_read_as_it_runs_may_ask_for_the_long_time_limit() -> None:
    async with serving(time_limit=1, long_time_limit=120, max_sessions=2) as (_, client):
        code = "import time\ntime.sleep(3)\nprint('ok')"
        body = {"input": code, "time_limit": 100}
        plain = await client.post("/eval", json={**body, "session": "plain"})
        assert plain.json()["ended_by"] == "time_limit"  # capped at the short limit
        await start(client, "long", code, time_limit=100)
        text, final = await read_to_end(client, "long")
        assert (text, final["returncode"]) == ("ok\n", 0)
        info = (await client.get("/info")).json()
        assert (info["time_limit"], info["long_time_limit"]) == (1, 120)


async def test_a_flood_from_one_owner_does_not_queue_another_owners_run_behind_it() -> None:
    """The run slots are shared between owners (``session_owner``): the slot a cell gives back
    goes to the run of the owner running none, not to the first in line. Each run prints when
    it started (one slot: one run after another), so the order of service is read, not times."""
    async with serving(**ONE_SLOT, max_sessions=2) as (evaluator, client):
        # The flood's cell holds the only slot until it is interrupted.
        hold = "import time\nwhile True:\n    time.sleep(0.05)"
        assert (await start(client, "hold", hold, session_owner="flood"))["running"]
        stamp = {"input": "import time; print(time.monotonic_ns())"}
        runs = []
        for owner in ("flood", "flood", "flood", "calm"):  # the other owner's run comes last
            body = {**stamp, "session_owner": owner}
            runs.append(asyncio.ensure_future(client.post("/eval", json=body)))
            with anyio.fail_after(60):
                while evaluator._slots.waiting < len(runs):  # noqa: ASYNC110 - its own state
                    await asyncio.sleep(0.01)
        assert (await client.post("/sessions/hold/interrupt")).status_code == 204
        with anyio.fail_after(120):
            answers = await asyncio.gather(*runs)
        _, final = await read_to_end(client, "hold")
    assert final["ended_by"] == "interrupted"
    assert [a.status_code for a in answers] == [200] * 4, [a.text for a in answers]
    started = {
        int(a.json()["stdout"]): owner
        for a, owner in zip(answers, ("f1", "f2", "f3", "calm"), strict=True)
    }
    assert [started[at] for at in sorted(started)] == ["calm", "f1", "f2", "f3"]


async def test_a_cell_interrupted_while_it_waits_for_a_slot_starts_interrupted() -> None:
    """An interrupt asked for before the cell runs (it waits for the only slot) reaches the
    agent with the cell, or just after it: the cell ends interrupted at once and its session
    goes on. An agent that dropped an interrupt coming before its cell started let the cell
    run on until the service killed the interpreter, ending the session. Three times: the
    frames' order against the agent's start is a race."""
    async with serving(**ONE_SLOT, max_sessions=4) as (evaluator, client):
        loop = "import time\nwhile True:\n    time.sleep(0.05)"
        for trial in range(3):
            queued = f"queued{trial}"
            for session in ("hold", queued):  # both live: the queued one's agent waits
                assert (await start(client, session, "x = 7", wait=60))["returncode"] == 0
            assert (await start(client, "hold", loop))["running"]
            body = {"input": loop, "session": queued, "wait": 60}
            waiting = asyncio.ensure_future(client.post("/eval", json=body))
            with anyio.fail_after(60):
                while evaluator._slots.waiting < 1:  # noqa: ASYNC110 - its own state
                    await asyncio.sleep(0.01)
            interrupt = await client.post(f"/sessions/{queued}/interrupt")
            assert interrupt.status_code == 204, interrupt.text
            assert (await client.post("/sessions/hold/interrupt")).status_code == 204
            with anyio.fail_after(120):
                answer = (await waiting).json()
            _, held = await read_to_end(client, "hold")
            assert held["ended_by"] == "interrupted" and held["session_ended"] is False
            assert (answer["ended_by"], answer["returncode"]) == ("interrupted", 130), answer
            assert answer["session_ended"] is False, answer
            assert "KeyboardInterrupt" in answer["stdout"], answer  # started or not
            follow = await start(client, queued, "print(x)", wait=60, session_resume=True)
            assert (follow["stdout"], follow["returncode"]) == ("7\n", 0)
