"""Live sessions: the built-in evaluator keeps a session's interpreter between calls.

A real gateway under uvicorn with its evaluator in-process, the SDK's clients over both
transports: state kept like a notebook's, an interrupt that keeps it, a kill that ends it (its
files kept), a memory kill, isolation between sessions, and the interpreters ended with them.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp import Client

from python_mcp_server import Settings, create_app
from tests.gateway.conftest import with_evaluator
from tests.support import HAS_313, PY313, call_code, connect, facts, serve, text_of

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("transport", ["sse", "http"])]

#: Code that will not stop when interrupted: it is killed after the grace.
STUBBORN = (
    "import time\nwhile True:\n    try:\n        time.sleep(60)\n"
    "    except KeyboardInterrupt:\n        pass"
)


@pytest.fixture(scope="module")
def live_gateway(settings: Settings) -> Iterator[tuple[str, Any]]:
    """A gateway whose evaluator holds at most three live sessions; the app for its state."""
    live = with_evaluator(settings, time_limit=20.0, max_sessions=3).model_copy(
        update={"max_code_sessions": 8}
    )
    app = create_app(live)
    with serve(app) as url:
        yield url, app


def live_count(app: Any) -> int:
    return int(app.state.gateway.connection.service.evaluator.live_sessions)


async def end_all(client: Client, app: Any) -> None:
    """End every session the module's gateway holds, and wait for their interpreters."""
    for session in list(app.state.gateway.sessions):
        ended = await client.call_tool("end_session", {"session_id": session.id})
        assert not ended.is_error, text_of(ended)
    with anyio.fail_after(60):
        while live_count(app):  # noqa: ASYNC110 - ended in the background
            await anyio.sleep(0.05)


async def test_variables_imports_and_functions_last_like_a_notebooks(
    live_gateway: tuple[str, Any], transport: str
) -> None:
    url, _ = live_gateway
    async with connect(url, transport) as client:
        first = facts(
            await call_code(client, "import math\ndef area(r):\n    return math.pi * r * r\nn = 2")
        )
        session = {"session_id": first["session_id"]}
        assert (
            facts(await call_code(client, "round(area(n), 3)", **session))["stdout"] == "12.566\n"
        )
        exited = facts(await call_code(client, "n += 1\nimport sys\nsys.exit(3)", **session))
        assert exited["returncode"] == 3  # the cell ends, not the session
        assert facts(await call_code(client, "n", **session))["stdout"] == "3\n"
        failed = facts(await call_code(client, "n = 10\n1 / 0", **session))
        assert failed["status"] == "exception" and "ZeroDivisionError" in failed["stdout"]
        assert facts(await call_code(client, "print(n)", **session))["stdout"] == "10\n"
        drawn = await call_code(
            client, "import matplotlib.pyplot as plt\nplt.plot([1, n])\nprint('drawn')", **session
        )
        assert [c.type for c in drawn.content] == ["text", "image"]
        again = await call_code(client, "plt.figure(); plt.plot([n, 1]); print('again')", **session)
        assert [c.type for c in again.content] == ["text", "image"]  # only the new figure


async def test_a_time_limit_interrupts_and_the_session_goes_on(
    live_gateway: tuple[str, Any], transport: str
) -> None:
    url, _ = live_gateway
    async with connect(url, transport) as client:
        session = {"session_id": facts(await call_code(client, "kept = 'yes'"))["session_id"]}
        sleep = "import time\nprint('sleeping', flush=True)\ntime.sleep(60)"
        result = facts(await call_code(client, sleep, timeout_seconds=1, **session))
        assert result["status"] == "interrupted", result
        assert "KeyboardInterrupt" in result["stdout"] and "variables are kept" in result["message"]
        assert facts(await call_code(client, "kept", **session))["stdout"] == "'yes'\n"


async def test_code_that_will_not_stop_is_killed_and_only_its_files_survive(
    live_gateway: tuple[str, Any], transport: str
) -> None:
    url, _ = live_gateway
    async with connect(url, transport) as client:
        write = "lost = 1\nopen('kept.txt', 'w').write('file')"
        session = {"session_id": facts(await call_code(client, write))["session_id"]}
        killed = await call_code(client, STUBBORN, timeout_seconds=1, **session)
        assert facts(killed)["status"] == "killed"
        assert "interpreter ended with this call" in text_of(killed)
        after = facts(
            await call_code(
                client, "print(open('kept.txt').read(), 'lost' in globals())", **session
            )
        )
        assert after["stdout"] == "file False\n"


async def test_a_memory_kill_ends_the_interpreter(
    live_gateway: tuple[str, Any], transport: str
) -> None:
    url, _ = live_gateway
    async with connect(url, transport) as client:
        session = {"session_id": facts(await call_code(client, "x = 1"))["session_id"]}
        result = await call_code(client, "big = bytearray(4 * 1024**3)", **session)
        structured = facts(result)
        if structured["status"] == "exception":  # a machine with no memory cgroup: a MemoryError
            assert "MemoryError" in structured["stdout"]
            assert facts(await call_code(client, "x", **session))["stdout"] == "1\n"
            return
        assert structured["status"] == "killed" and "memory limit" in structured["message"]
        assert "interpreter ended with this call" in text_of(result)
        assert "NameError" in facts(await call_code(client, "x", **session))["stdout"]


async def test_sessions_see_nothing_of_each_other(
    live_gateway: tuple[str, Any], transport: str
) -> None:
    url, app = live_gateway
    async with connect(url, transport) as client:
        # Three sessions at once fill the cap only if no earlier test left one open: else the
        # client holding the most (this one, at its third) closes its own longest idle.
        await end_all(client, app)
        ids: dict[int, str] = {}

        async def one(n: int) -> None:
            code = f"secret = {n}\nopen('mine.txt', 'w').write('{n}')\nimport os\nos.getpid()"
            ids[n] = facts(await call_code(client, code))["session_id"]

        async with anyio.create_task_group() as group:
            for n in range(3):
                group.start_soon(one, n)
        probe = (
            "import os\nprint(secret, open('mine.txt').read(), "
            "sorted(f for f in os.listdir() if not f.startswith('.')), "
            "len([p for p in os.listdir('/proc') if p.isdigit()]))"
        )
        for n, session_id in ids.items():
            seen = facts(await call_code(client, probe, session_id=session_id))["stdout"]
            # Its own variable, its own file, and only its own processes (bwrap's and its own).
            assert seen == f"{n} {n} ['mine.txt'] 2\n", seen


async def test_an_ended_or_evicted_session_ends_its_interpreter(
    live_gateway: tuple[str, Any], transport: str
) -> None:
    url, app = live_gateway
    async with connect(url, transport) as client:
        session_id = facts(await call_code(client, "x = 1"))["session_id"]
        before = live_count(app)
        ended = await client.call_tool("end_session", {"session_id": session_id})
        assert not ended.is_error
        with anyio.fail_after(30):
            while live_count(app) >= before:  # noqa: ASYNC110 - ended in the background
                await anyio.sleep(0.05)
        # The evaluator holds at most three: the gateway evicts first, and ends each.
        for _ in range(5):
            facts(await call_code(client, "y = 2"))
        assert live_count(app) <= 3
        gateway = app.state.gateway
        assert gateway.sessions.max_sessions == 3


async def test_a_call_refused_for_its_arguments_at_the_cap_closes_no_interpreter(
    live_gateway: tuple[str, Any], transport: str
) -> None:
    """At the cap, a call that would start a session but is refused for its arguments is
    refused before its session opens: no session is closed for it, and every interpreter lives
    on (it used to close the longest idle one, then end its interpreter on its way out)."""
    url, app = live_gateway
    async with connect(url, transport) as client:
        ids = [facts(await call_code(client, f"n = {n}"))["session_id"] for n in range(3)]
        with anyio.fail_after(30):
            while live_count(app) < 3:  # noqa: ASYNC110 - those closed end in the background
                await anyio.sleep(0.05)
        evicted = await _evicted(url)
        refused = await call_code(client, "print(1)", python="0.1")
        assert refused.is_error and "is not offered here" in text_of(refused)
        assert await _evicted(url) == evicted
        assert live_count(app) == 3
        resumed = await call_code(client, "print(n)", session_id=ids[-1])
        assert text_of(resumed).startswith("2\n"), text_of(resumed)


async def _evicted(url: str) -> str:
    """The count of code sessions closed to make room, as the metrics say it."""
    async with httpx.AsyncClient() as http:
        metrics = (await http.get(f"{url}/metrics")).text
    line = 'mcp_code_sessions_closed_total{why="evicted"} '
    return next(x for x in metrics.splitlines() if x.startswith(line))


async def test_the_readmes_three_call_analysis(
    live_gateway: tuple[str, Any], transport: str
) -> None:
    url, _ = live_gateway
    csv = {"path": "sales.csv", "content": "month,amount\nJan,3\nFeb,5\n"}
    async with connect(url, transport) as client:
        load = "import pandas as pd\ndf = pd.read_csv('sales.csv')\ndf.shape"
        first = facts(await call_code(client, load, files=[csv]))
        assert first["stdout"] == "(2, 2)\n"
        session = {"session_id": first["session_id"]}
        described = facts(await call_code(client, "df.describe()", **session))
        assert "mean" in described["stdout"] and "4.0" in described["stdout"]
        plot = "df.plot(x='month')\nimport matplotlib.pyplot as plt\nplt.savefig('chart.png')"
        plotted = await call_code(client, plot, **session)
        assert [c.type for c in plotted.content] == ["text", "image"]
        (chart,) = facts(plotted)["files"]
        assert chart["path"] == "chart.png" and chart["mime_type"] == "image/png"
        read = await client.read_resource(chart["uri"])
        assert read.contents


async def test_a_prelude_the_code_removed_is_sent_again(
    live_gateway: tuple[str, Any], transport: str
) -> None:
    """Later calls come without the prelude; one the interpreter no longer holds is resent."""
    url, _ = live_gateway
    async with connect(url, transport) as client:
        session = {"session_id": facts(await call_code(client, "x = 1"))["session_id"]}
        await call_code(client, "import sys\ndel sys._mcp_prelude", **session)
        assert facts(await call_code(client, "print(x)", **session))["stdout"] == "1\n"
        assert facts(await call_code(client, "x + 1", **session))["stdout"] == "2\n"


@pytest.mark.skipif(not HAS_313, reason=f"needs {PY313}: another interpreter than the default")
async def test_a_prelude_found_missing_by_a_later_read_is_said_and_the_next_call_brings_it(
    settings: Settings, transport: str
) -> None:
    """Read later (``get_output``), the cell cannot be sent again: the model is told the code
    did not run, and its next call carries the prelude; answered at once, it is sent again.
    (Another Python than the default: the evaluator keeps no resident prelude for it, which
    would stand in for the one removed.)"""
    chosen = {"python": "3.13"}
    with serve(create_app(with_evaluator(settings, time_limit=20.0, pythons=(str(PY313),)))) as url:
        async with connect(url, transport) as client:
            first = facts(await call_code(client, "x = 1", **chosen))
            session = {"session_id": first["session_id"], **chosen}
            await call_code(client, "import sys\ndel sys._mcp_prelude", **session)
            read_later = {"session_id": first["session_id"], "wait_seconds": 30}
            again = facts(await call_code(client, "print(x)", wait_seconds=0, **session))
            if again["status"] == "running":  # as almost always: answered before it ended
                read = await client.call_tool("get_output", read_later)
                assert "the code did not run; call again" in facts(read)["stdout"], text_of(read)
                # The next call, read later too, carries the prelude: it runs.
                again = facts(await call_code(client, "print(x)", wait_seconds=0, **session))
                if again["status"] == "running":
                    again = facts(await client.call_tool("get_output", read_later))
            assert again["stdout"] == "1\n", again
            # Answered at once (the call waits for it), the same is sent again, whole.
            await call_code(client, "import sys\ndel sys._mcp_prelude", **session)
            assert facts(await call_code(client, "print(x + 1)", **session))["stdout"] == "2\n"


async def test_a_first_call_stopped_early_sends_the_prelude_again(
    live_gateway: tuple[str, Any], transport: str
) -> None:
    """A first call interrupted may not have left the prelude behind: the next one brings it."""
    url, _ = live_gateway
    stopped = "import sys, time\nx = 1\ndel sys._mcp_prelude\ntime.sleep(60)"
    async with connect(url, transport) as client:
        first = facts(await call_code(client, stopped, timeout_seconds=1))
        assert first["status"] == "interrupted", first
        session = {"session_id": first["session_id"]}
        assert facts(await call_code(client, "print(x)", **session))["stdout"] == "1\n"
        assert facts(await call_code(client, "print(x + 1)", **session))["stdout"] == "2\n"


async def test_files_sent_into_a_session_never_follow_or_wait_on_what_its_code_left(
    live_gateway: tuple[str, Any], transport: str, tmp_path: Path
) -> None:
    """A symlink to a host file and a FIFO, left where the next call's files go, are refused
    (written by the evaluator's user, a symlink would reach the host; a FIFO would wait)."""
    url, _ = live_gateway
    victim = tmp_path / "victim"
    victim.write_text("original")
    traps = f"import os\nos.symlink({str(victim)!r}, 'link.txt')\nos.mkfifo('fifo.txt')\nx = 1"
    async with connect(url, transport) as client:
        session = {"session_id": facts(await call_code(client, traps))["session_id"]}
        for path in ("link.txt", "fifo.txt"):
            files = [{"path": path, "content": "written"}]
            refused = facts(await call_code(client, "print('ran')", files=files, **session))
            assert refused["status"] == "not_run", refused
            assert f"Failed to create file '{path}'" in refused["message"], refused
        assert victim.read_text() == "original"
        assert facts(await call_code(client, "print(x)", **session))["stdout"] == "1\n"


async def test_files_the_evaluator_cannot_return_never_stop_the_sessions_next_calls(
    live_gateway: tuple[str, Any], transport: str
) -> None:
    """Too deep or not UTF-8 named: the call that made them is told what was not returned
    (what the prelude's own bounded walk saw); the calls after run and keep their output."""
    url, _ = live_gateway
    make = (
        "import os\nos.makedirs('d/' * 120)\nopen('d/' * 120 + 'f', 'w').close()\n"
        "open(b'bad\\xff', 'w').close()\nx = 1"
    )
    async with connect(url, transport) as client:
        made = await call_code(client, make)
        session = {"session_id": facts(made)["session_id"]}
        assert (facts(made)["status"], facts(made)["files_not_returned_count"]) == ("ok", 1)
        assert "named with bytes that are not UTF-8" in text_of(made)
        later = facts(await call_code(client, "print(x)", **session))
        assert (later["status"], later["stdout"]) == ("ok", "1\n")
        clear = "import os, shutil\nshutil.rmtree('d')\nos.remove(b'bad\\xff')\nprint('gone')"
        cleared = facts(await call_code(client, clear, **session))
        assert (cleared["status"], cleared["stdout"]) == ("ok", "gone\n")


async def test_a_cancelled_call_leaves_its_code_running_to_be_read_later(
    live_gateway: tuple[str, Any], transport: str
) -> None:
    """The client gives up on a call: its code goes on in the session's interpreter (issue
    29), a call on the session says so at once, and get_output reads its end; the variables
    and files are kept."""
    url, _ = live_gateway
    async with connect(url, transport) as client:
        first = "x = 42\nopen('data.txt', 'w').write('kept')"
        session = {"session_id": facts(await call_code(client, first))["session_id"]}
        slow = "import time\ntime.sleep(3)\nprint('slept')"
        async with anyio.create_task_group() as group:
            group.start_soon(functools.partial(call_code, client, slow, **session))
            await until_evaluating(url)
            group.cancel_scope.cancel()
        refused = await call_code(client, "print(x)", **session)
        assert refused.is_error and "get_output" in text_of(refused)
        with anyio.fail_after(60):
            ended = await client.call_tool("get_output", {**session, "wait_seconds": 30})
        assert (facts(ended)["status"], facts(ended)["stdout"]) == ("ok", "slept\n")
        after = await call_code(client, "print(open('data.txt').read(), x)", **session)
        assert facts(after)["stdout"] == "kept 42\n"


async def until_evaluating(url: str) -> None:
    """Return once an evaluation is under way (and a moment more, for its request to leave)."""
    async with httpx.AsyncClient() as http:
        with anyio.fail_after(60):
            while True:
                if "mcp_evaluations_in_flight 1.0" in (await http.get(f"{url}/metrics")).text:
                    break
                await anyio.sleep(0.05)
    await anyio.sleep(0.5)


async def test_the_gateways_wait_bounds_each_answer_not_a_cell_read_as_it_runs(
    settings: Settings, transport: str
) -> None:
    """MCP_EVAL_TIMEOUT (here below the time limit) bounds each answer of the service: a cell
    read as it runs (issue 29) is answered in pieces, each within it, and runs to its own time
    limit, which interrupts it and keeps the session's variables."""
    impatient = with_evaluator(settings, time_limit=8.0).model_copy(update={"eval_timeout": 3.0})
    with serve(create_app(impatient)) as url:
        async with connect(url, transport) as client:
            first = "x = 1\nopen('data.txt', 'w').write('kept')"
            session = {"session_id": facts(await call_code(client, first))["session_id"]}
            slow = await call_code(client, "import time\ntime.sleep(60)", **session)
            assert facts(slow)["status"] == "interrupted", text_of(slow)
            after = await call_code(
                client, "print(open('data.txt').read(), 'x' in globals())", **session
            )
            assert facts(after)["stdout"] == "kept True\n"
