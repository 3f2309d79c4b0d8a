"""Live sessions of the built-in evaluator: cells in one interpreter, and how sessions end."""

from __future__ import annotations

import asyncio
import contextlib
import marshal
import os
import select
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import anyio
import httpx
import pytest

import plotting
from evaluator import Evaluator, SessionNotFound, _agent, create_app
from evaluator.cgroups import RunCgroup
from evaluator.errors import SessionsFull
from evaluator.jail import read_what_the_pipe_holds
from evaluator.live import LiveSessions
from evaluator.pool import Sandbox
from snekbox_client import EvalRequest, EvalResult, File

from . import isolation
from .conftest import config

T = TypeVar("T")


@pytest.fixture
async def evaluator() -> AsyncIterator[Evaluator]:
    async with Evaluator(
        config(time_limit=10, preimport=(), max_sessions=2, output_limit=10_000)
    ) as started:
        yield started


def running_in(live: LiveSessions, session: str) -> bool:
    """Whether a cell of ``session`` runs (its lock is taken)."""
    held = live._table.get(session)
    return held is not None and held.lock.locked()


async def cell_running(evaluator: Evaluator, session: str) -> None:
    """Return once a cell of ``session`` runs (its lock is taken), and a moment more."""
    live = evaluator._live
    assert live is not None
    with anyio.fail_after(60):
        while not running_in(live, session):  # noqa: ASYNC110 - nothing to wait on
            await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)


async def cell(evaluator: Evaluator, session: str, code: str, **changes: object) -> EvalResult:
    with anyio.fail_after(120):
        request = EvalRequest(args=("-c", code), session=session)
        for name, value in changes.items():
            request = EvalRequest(**{**request.__dict__, name: value})
        return await evaluator.run(request)


async def test_cells_share_one_interpreter_and_sessions_share_nothing(
    evaluator: Evaluator,
) -> None:
    first = await cell(evaluator, "a", "x = 'a'\nopen('a.txt', 'w').write('a')\nimport os")
    assert (first.returncode, first.session_ended) == (0, False)
    assert [f.path for f in first.files] == ["a.txt"]
    await cell(evaluator, "b", "x = 'b'")
    probe = "print(x, sorted(f for f in os.listdir() if not f.startswith('.')))"
    assert (await cell(evaluator, "a", probe)).stdout == "a ['a.txt']\n"
    seen_by_b = await cell(evaluator, "b", "import os\n" + probe)
    assert seen_by_b.stdout == "b []\n"
    # Only what a cell changes comes back; files sent in land in the session's directory.
    unchanged = await cell(evaluator, "a", "print('no writes')", files=(File("in.txt", b"1"),))
    assert unchanged.files == ()
    assert (await cell(evaluator, "a", "print(open('in.txt').read())")).stdout == "1\n"
    assert evaluator.live_sessions == 2


async def test_a_sessions_later_cells_write_their_files_in_a_thread(
    evaluator: Evaluator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first cell's few small files go into a directory no code has run in, on the event
    loop; a later cell's in a worker thread: its code may have left anything in the way."""
    hops: list[object] = []
    to_thread = asyncio.to_thread

    async def counted(function: Callable[..., T], *args: object, **kwargs: object) -> T:
        if getattr(function, "__name__", "") == "write_files":
            hops.append(function)
        return await to_thread(function, *args, **kwargs)

    monkeypatch.setattr(asyncio, "to_thread", counted)
    note = (File("note.txt", b"hi"),)
    assert (
        await cell(evaluator, "w", "print(open('note.txt').read())", files=note)
    ).stdout == "hi\n"
    assert hops == []
    assert (
        await cell(evaluator, "w", "print(open('note.txt').read())", files=note)
    ).stdout == "hi\n"
    assert len(hops) == 1


async def test_a_flood_ends_the_interpreter_as_it_ends_a_run(evaluator: Evaluator) -> None:
    await cell(evaluator, "flood", "kept = True")
    flood = await cell(evaluator, "flood", "while True:\n    print('x' * 100)")
    assert (flood.returncode, flood.ended_by, flood.session_ended) == (143, "output_limit", True)
    assert len(flood.stdout) <= 10_000
    assert (await cell(evaluator, "flood", "print('kept' in globals())")).stdout == "False\n"


async def test_a_time_limit_stops_the_cells_processes_and_keeps_the_session(
    evaluator: Evaluator,
) -> None:
    await cell(evaluator, "bomb", "kept = True")
    spin = (
        "import os, time\nfor _ in range(5):\n    if os.fork() == 0:\n        while True: pass\n"
        "time.sleep(60)"
    )
    stopped = await cell(evaluator, "bomb", spin, time_limit=1.0)
    assert (stopped.ended_by, stopped.session_ended) == ("time_limit", False)
    count = "import os\nprint(kept, len([p for p in os.listdir('/proc') if p.isdigit()]))"
    assert (await cell(evaluator, "bomb", count)).stdout == "True 2\n"


async def test_an_interrupt_the_code_swallows_is_sent_again(evaluator: Evaluator) -> None:
    await cell(evaluator, "stubborn", "kept = True")
    stubborn = (
        "import time\ntry:\n    time.sleep(60)\nexcept KeyboardInterrupt:\n    print('once')\n"
        "time.sleep(60)"
    )
    stopped = await cell(evaluator, "stubborn", stubborn, time_limit=1.0)
    assert (stopped.returncode, stopped.session_ended) == (130, False)
    assert stopped.stdout.startswith("once\n") and "KeyboardInterrupt" in stopped.stdout
    assert (await cell(evaluator, "stubborn", "print(kept)")).stdout == "True\n"


async def test_a_child_the_cell_forked_ends_with_the_cell(evaluator: Evaluator) -> None:
    fork = (
        "import os\npid = os.fork()\nif pid == 0:\n    os.write(1, b'child\\n')\n"
        "else:\n    os.waitpid(pid, 0)\n    os.write(1, b'parent\\n')"
    )
    assert (await cell(evaluator, "fork", fork)).stdout == "child\nparent\n"
    # Had the child gone on serving cells, its status would answer for a later cell.
    for n in range(3):
        later = await cell(evaluator, "fork", f"print({n})\nimport sys\nsys.exit({n})")
        assert (later.stdout, later.returncode, later.session_ended) == (f"{n}\n", n, False)


async def test_an_agent_that_does_not_read_holds_up_only_its_own_session(
    evaluator: Evaluator,
) -> None:
    # Half a second after its cell ends, a thread takes the GIL for good (re does not let go).
    hog = (
        "import re, threading, time\n"
        "def hog():\n    time.sleep(0.5)\n    re.match(r'(a+)+$', 'a' * 64 + 'b')\n"
        "threading.Thread(target=hog, daemon=True).start()"
    )
    assert (await cell(evaluator, "hog", hog)).returncode == 0
    await asyncio.sleep(3)  # the thread's 0.5 s, with room for a loaded machine
    # A cell bigger than the pipe: written within its time limit, or the session ends. Its
    # 10 s (and 2 s of grace) leave a loaded machine room for the run beside it.
    big = "pass\n" + "#" * 300_000
    stuck = asyncio.create_task(cell(evaluator, "hog", big, time_limit=10.0))
    with anyio.fail_after(60):
        other = await evaluator.run(EvalRequest(args=("-c", "print('free')")))
    assert other.stdout == "free\n" and not stuck.done()
    ended = await stuck
    assert (ended.returncode, ended.ended_by, ended.session_ended) == (137, "time_limit", True)


async def test_an_interpreter_that_exits_ends_its_session(evaluator: Evaluator) -> None:
    await cell(evaluator, "exit", "x = 1")
    gone = await cell(evaluator, "exit", "import os\nos._exit(7)")
    assert (gone.returncode, gone.session_ended) == (7, True)
    fresh = await cell(evaluator, "exit", "print('x' in globals())")
    assert (fresh.stdout, fresh.session_ended) == ("False\n", False)


async def test_ended_evicted_and_idle_sessions_start_afresh() -> None:
    async with Evaluator(
        config(time_limit=10, preimport=(), max_sessions=1, session_idle_timeout=1.0)
    ) as evaluator:
        await cell(evaluator, "one", "x = 1")
        await cell(evaluator, "two", "x = 2")  # the cap is one: "one" made room
        assert evaluator.live_sessions == 1
        assert (await cell(evaluator, "one", "print('x' in globals())")).stdout == "False\n"
        await asyncio.sleep(1.2)
        assert (await cell(evaluator, "one", "print('x' in globals())")).stdout == "False\n"
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(create_app(evaluator)), base_url="http://evaluator"
        ) as http:
            await cell(evaluator, "one", "x = 3")
            assert (await http.delete("/sessions/one")).status_code == 204
            assert (await http.delete("/sessions/never-was")).status_code == 204
            refused = await http.post("/eval", json={"input": "1", "session": "bad id!"})
            assert refused.status_code == 400
        assert (await cell(evaluator, "one", "print('x' in globals())")).stdout == "False\n"


async def test_an_idle_session_ends_on_time_without_a_request() -> None:
    """Its interpreter, and a process its code left running, end once it has been idle for
    the timeout (and the quarter of it between looks), though no request comes."""
    async with Evaluator(
        config(time_limit=60, preimport=(), session_idle_timeout=2.0)
    ) as evaluator:
        marker = f"left-running-{os.getpid()}"
        # The cell ends once the child runs its own code: Popen returns when exec begins,
        # before the kernel shows the new command line in /proc (seen once on a busy CI).
        spin = (
            "import os, subprocess, sys, time\n"
            "child = \"open('spinning', 'w').close()\\nwhile 1: pass\"\n"
            f"subprocess.Popen([sys.executable, '-c', child, {marker!r}])\n"
            "while not os.path.exists('spinning'):\n"
            "    time.sleep(0.01)"
        )
        assert (await cell(evaluator, "idle", spin)).returncode == 0
        assert evaluator.live_sessions == 1 and isolation.processes_with(marker)
        with anyio.fail_after(30):
            while evaluator.live_sessions or isolation.processes_with(marker):  # noqa: ASYNC110
                await asyncio.sleep(0.1)


async def test_files_that_break_the_rules_never_stop_the_cells_after(
    evaluator: Evaluator,
) -> None:
    """Too deep, or named with bytes that are not UTF-8: left out of a cell's files (where a
    one-shot run loses them all, as Snekbox's does), and the next cells run and return theirs.
    """
    breaks = (
        "import os\nos.makedirs('d/' * 120)\nopen('d/' * 120 + 'f', 'w').close()\n"
        "open(b'bad\\xff', 'w').close()\nopen('ok.txt', 'w').write('ok')\nprint('made')"
    )
    made = await cell(evaluator, "rules", breaks)
    assert (made.stdout, made.returncode, [f.path for f in made.files]) == ("made\n", 0, ["ok.txt"])
    later = await cell(evaluator, "rules", "open('later.txt', 'w').close()\nprint('ran')")
    assert (later.stdout, later.returncode) == ("ran\n", 0)
    assert [f.path for f in later.files] == ["later.txt"]
    one_shot = await evaluator.run(EvalRequest(args=("-c", breaks)))
    assert one_shot.returncode is None and "FileParsingError" in one_shot.stdout


async def test_a_resumed_session_that_is_not_held_is_not_started_afresh(
    evaluator: Evaluator,
) -> None:
    """``session_resume``: a session the service does not hold (ended, expired, evicted, or
    never started here) is refused, 404 over HTTP, and nothing runs: a caller that expects
    its variables is never handed a fresh interpreter."""
    await cell(evaluator, "held", "x = 1")
    kept = await cell(evaluator, "held", "print(x)", session_resume=True)
    assert (kept.stdout, kept.session_ended) == ("1\n", False)
    await evaluator.end_session("held")
    with pytest.raises(SessionNotFound, match="'held'"):
        await cell(evaluator, "held", "open('ran', 'w')", session_resume=True)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(create_app(evaluator)), base_url="http://evaluator"
    ) as http:
        body = {"input": "open('ran', 'w')", "session": "never", "session_resume": True}
        refused = await http.post("/eval", json=body)
        assert refused.status_code == 404
        assert refused.json()["title"] == "Session not found"
        assert "nothing ran" in refused.json()["description"]
        bad = await http.post("/eval", json={**body, "session_resume": "yes"})
        assert bad.status_code == 400
        info = (await http.get("/info")).json()
    assert info["sessions"] == {"max": 2, "idle_timeout": 900.0} and info["time_limit"] == 10.0
    assert [p["executable_path"] for p in info["pythons"]][:1] == [evaluator.config.executable]
    assert evaluator.live_sessions == 0  # neither refusal started one


async def test_a_request_ends_the_sessions_it_names_before_it_runs(evaluator: Evaluator) -> None:
    """``end_sessions``: a caller that closed sessions to make room for a new one has them
    ended by the new one's request, first: at its cap of two, the service then needs to end no
    other (here the longest idle, which its own choice would have been)."""
    await cell(evaluator, "kept", "x = 'kept'")
    await cell(evaluator, "closed", "x = 'closed'")
    new = await cell(evaluator, "new", "print('new')", end_sessions=("closed", "never-held"))
    assert (new.stdout, new.returncode) == ("new\n", 0)
    assert (await cell(evaluator, "kept", "print(x)", session_resume=True)).stdout == "kept\n"
    with pytest.raises(SessionNotFound, match="'closed'"):
        await cell(evaluator, "closed", "print(x)", session_resume=True)
    # Ended whatever becomes of the run: here, one refused because its session is not held.
    with pytest.raises(SessionNotFound):
        await cell(evaluator, "gone", "1", session_resume=True, end_sessions=("kept",))
    assert evaluator.live_sessions == 1
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(create_app(evaluator)), base_url="http://evaluator"
    ) as http:
        body = {"input": "print(1)", "session": "new", "end_sessions": ["new"]}
        over_http = await http.post("/eval", json=body)  # ended, then started afresh
        assert over_http.status_code == 200 and over_http.json()["stdout"] == "1\n"
        for bad in ("new", ["../x"], [1], ["a"] * 65):
            refused = await http.post("/eval", json={**body, "end_sessions": bad})
            assert refused.status_code == 400, bad
    assert evaluator.live_sessions == 1


async def test_a_resumed_session_that_ends_while_its_run_waits_is_not_started_afresh() -> None:
    """The check is made again once the run has its slot: a session ended (evicted, expired)
    while its run queued is refused, not replaced by an empty interpreter."""
    async with Evaluator(config(time_limit=10, preimport=(), max_sessions=2, concurrency=1)) as ev:
        await cell(ev, "a", "x = 1")
        busy = asyncio.ensure_future(ev.run(EvalRequest(input="import time; time.sleep(3)")))
        await asyncio.sleep(0.5)  # the one slot is taken
        resumed = asyncio.ensure_future(cell(ev, "a", "print(x)", session_resume=True))
        await asyncio.sleep(0.5)  # it waits for the slot, the session still live
        await ev.end_session("a")
        with pytest.raises(SessionNotFound):
            await resumed
        assert (await busy).returncode == 0
        assert ev.live_sessions == 0


async def test_a_cancelled_cell_ends_its_session(evaluator: Evaluator) -> None:
    await cell(evaluator, "cancel", "x = 1")
    running = asyncio.ensure_future(cell(evaluator, "cancel", "import time\ntime.sleep(60)"))
    await cell_running(evaluator, "cancel")
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert (await cell(evaluator, "cancel", "print('x' in globals())")).stdout == "False\n"


async def test_a_new_session_takes_a_warm_interpreter() -> None:
    async with Evaluator(config(time_limit=10, warm_sandboxes=1, preimport=("json",))) as warm:
        with anyio.fail_after(240):
            while warm.warm_sandboxes < 1:  # noqa: ASYNC110 - nothing to wait on
                await asyncio.sleep(0.05)
        first = await cell(warm, "w", "import sys\nx = 'json' in sys.modules")
        assert (first.returncode, warm.warm_runs) == (0, 1)
        assert (await cell(warm, "w", "print(x)")).stdout == "True\n"


async def test_stopping_ends_the_sessions_and_their_running_cells() -> None:
    evaluator = Evaluator(config(time_limit=60, preimport=()))
    await evaluator.start()
    try:
        await cell(evaluator, "idle", "x = 1")
        await cell(evaluator, "busy", "x = 1")
        running = asyncio.create_task(cell(evaluator, "busy", "import time\ntime.sleep(60)"))
        await cell_running(evaluator, "busy")
    finally:
        with anyio.fail_after(60):
            await evaluator.aclose()  # raises when a sandbox's mount or cgroup is left
    ended = await running
    assert ended.session_ended is True and evaluator.live_sessions == 0


def test_a_warm_agent_told_to_become_a_session_finds_its_first_cell_behind() -> None:
    """The marker and the first cell can both be in the pipe when a busy agent reads it."""
    request_r, request_w = os.pipe()
    status_r, status_w = os.pipe()
    cell = b"-c\0print('first')\0"
    os.write(request_w, _agent.SESSION + _agent.CELL + len(cell).to_bytes(4, "big") + cell)

    def as_fd_5_and_6() -> None:
        os.dup2(request_r, _agent.REQUEST_FD)
        os.dup2(status_w, _agent.STATUS_FD)

    agent = subprocess.Popen(
        [sys.executable, _agent.__file__],
        stdout=subprocess.PIPE,
        preexec_fn=as_fd_5_and_6,
        pass_fds=(request_r, status_w, _agent.REQUEST_FD, _agent.STATUS_FD),
    )
    os.close(request_r)
    os.close(status_w)
    try:
        assert agent.stdout is not None
        with select_timeout(agent.stdout.fileno(), 60):
            assert agent.stdout.read(len(_agent.WARM) + 6) == _agent.WARM + b"first\n"
        with select_timeout(status_r, 60):
            assert os.read(status_r, 8) == bytes(8)  # status 0; nothing watched
    finally:
        os.close(request_w)  # EOF: the agent exits
        assert agent.wait(60) == 0
        os.close(status_r)
        if agent.stdout is not None:
            agent.stdout.close()


async def test_a_cell_that_writes_its_own_status_and_floods_holds_up_nothing(
    evaluator: Evaluator,
) -> None:
    """Code can write a status of its own (the agent's pipe is its process's) and go on
    writing without end: the cell is answered, at that status or at the output limit (whichever
    the service reads first), and other sessions are served meanwhile. The output that follows
    a status is the next cell's, which it takes past the limit, ending the interpreter as a
    flood does: a cell after that runs in a new one."""
    spoof = (
        "import os, threading\nos.write(6, bytes(8))\n"
        "def flood():\n    while True:\n        os.write(1, b'x' * 65536)\n"
        "for _ in range(3):\n    threading.Thread(target=flood, daemon=True).start()\nflood()"
    )
    answered = await cell(evaluator, "spoof", spoof)
    assert answered.returncode in (0, 143)
    assert (await cell(evaluator, "other", "print('served')")).stdout == "served\n"
    later = [await cell(evaluator, "spoof", "print('next')") for _ in range(2)]
    assert (later[-1].stdout, later[-1].returncode) == ("next\n", 0)


def test_what_is_read_after_a_cells_status_is_a_pipes_worth_at_most(tmp_path: Path) -> None:
    """After a cell's status, its output pipe is read until empty, not for as long as a writer
    keeps it full (which a loop can lose to several writers): here a 64 MiB file, which never
    runs dry, stands for that writer."""
    data = os.urandom(50_000)
    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)
    os.write(write_end, data)
    output = bytearray()
    read_what_the_pipe_holds(read_end, output, 1_000_000)
    assert output == data  # what the cell wrote before its status: all of it
    os.close(read_end)
    os.close(write_end)
    endless = tmp_path / "endless"
    with endless.open("wb") as file:
        file.truncate(64 << 20)
    fd = os.open(endless, os.O_RDONLY)
    try:
        output.clear()
        read_what_the_pipe_holds(fd, output, 1000)
        assert len(output) == 1000
        assert os.lseek(fd, 0, os.SEEK_CUR) <= (1 << 20) + 65536
    finally:
        os.close(fd)


@contextlib.contextmanager
def select_timeout(fd: int, seconds: float) -> Iterator[None]:
    """Fail unless ``fd`` is readable within ``seconds`` (rather than block the test)."""
    assert select.select([fd], [], [], seconds)[0], f"nothing to read within {seconds} s"
    yield


async def test_a_later_cell_without_the_prelude_runs_as_a_full_one(evaluator: Evaluator) -> None:
    """The gateway sends a live session's later cells without the prelude (``later_cell``): the
    interpreter's own, kept by the first cell, shows values, guards the output, hides its
    frames, captures figures and removes its files as it did in that cell."""

    async def run(code: str, *, later_cell: bool = True) -> EvalResult:
        request = plotting.build_request(code, later_cell=later_cell)
        with anyio.fail_after(120):
            return await evaluator.run(EvalRequest(**{**request.__dict__, "session": "s"}))

    later = plotting.build_request("x", later_cell=True)
    assert sum(len(f.content) for f in later.files) < 2048
    assert (await run("x = 2", later_cell=False)).returncode == 0
    assert (await run("x + 1")).stdout == "3\n"
    # The prelude the first cell kept, not the one the evaluator keeps resident.
    assert (await run("import sys\nkept = sys._mcp_prelude")).returncode == 0
    assert (await run("print(sys._mcp_prelude is kept)")).stdout == "True\n"
    guarded = await run("import sys\nsys.stdout.write('a\\udcff\\n')")
    assert guarded.stdout.startswith("a\ufffd\n"), guarded
    failed = await run("y = 1\n1 / 0")
    assert failed.returncode == 1 and 'File "<string>", line 2' in failed.stdout, failed
    assert "_mcp" not in failed.stdout and "prelude" not in failed.stdout
    drawn = await run("import matplotlib.pyplot as plt\nplt.plot([1, x])")
    assert [f.path for f in plotting.sort_files(drawn.files).figures] == ["figure_001.png"]
    listed = await run("import os\nprint([f for f in sorted(os.listdir()) if f[0] != '.'])")
    assert listed.stdout == "['figure_001.png']\n", listed
    # An interpreter without this prelude (removed, or another gateway's) runs the one the
    # evaluator keeps resident, in the same namespace.
    gone = await run("import sys\nsys._mcp_prelude = dict(sys._mcp_prelude, _digest=b'other')")
    assert gone.returncode == 0
    assert (await run("print(x)")).stdout == "2\n"
    # A prelude the evaluator does not keep either (another gateway's): the code does not run.
    boot, bundle = plotting.build_request("print('ran')", later_cell=True).files
    other = marshal.dumps((*marshal.loads(bundle.content)[:5], bytes(16)), 4)
    missing = await evaluator.run(
        EvalRequest(args=[boot.path], files=[boot, File(bundle.path, other)], session="s")
    )
    assert plotting.prelude_missing(missing), missing
    assert (await run("print(x)", later_cell=False)).stdout == "2\n"
    assert (await run("print(x)")).stdout == "2\n"


async def test_a_run_without_the_prelude_runs_the_one_the_evaluator_keeps(
    evaluator: Evaluator,
) -> None:
    """The gateway sends its runs without the prelude (``resident``): the evaluator keeps it
    where each sandbox reads it and no code can change it."""
    code = (
        "import matplotlib.pyplot as plt, os\n"
        "plt.plot([1, 2])\n"
        f"for name in [*os.listdir({plotting.RESIDENT_DIR!r}), 'new']:\n"
        "    try:\n"
        f"        open(os.path.join({plotting.RESIDENT_DIR!r}, name), 'a')\n"
        "    except OSError as error:\n"
        "        print(error.strerror)\n"
    )
    request = plotting.build_request(code, resident=True)
    assert not plotting.carries_prelude(request)
    assert evaluator.info().resident_prelude == plotting.prelude_digest()  # as GET /info says
    with anyio.fail_after(120):
        result = await evaluator.run(request)
    assert result.returncode == 0, result
    refused = result.stdout.splitlines()
    # The prelude, its first file compiled, its warm.py and a new file: none can be written.
    assert len(refused) == 4 and set(refused) <= {"Read-only file system", "Permission denied"}
    assert [f.path for f in plotting.sort_files(result.files).figures] == ["figure_001.png"]


#: Code that makes the next call of ``name`` in the support module (``<mcp-support>``; its
#: ``<module>``: its making) raise KeyboardInterrupt, as a time limit coming there would.
INTERRUPT_IN_SUPPORT = """
import sys
def trap(frame, event, arg):
    code = frame.f_code
    if event == "call" and (code.co_filename, code.co_name) == ("<mcp-support>", {name!r}):
        sys.settrace(None)
        raise KeyboardInterrupt
    return None
sys.settrace(trap)
"""


async def test_an_interrupt_in_the_preludes_own_work_ends_the_cell_and_nothing_more(
    evaluator: Evaluator,
) -> None:
    """A time limit shorter than the prelude's work (a tiny ``timeout_seconds``) interrupts it,
    not the code: the cell ends interrupted, saying so in one line with none of the prelude's
    frames, and the session's next cells run (a support module made halfway is not kept)."""

    async def run(code: str) -> EvalResult:
        request = plotting.build_request(code)
        with anyio.fail_after(120):
            return await evaluator.run(EvalRequest(**{**request.__dict__, "session": "trap"}))

    assert (await run("x = 1")).returncode == 0
    # The support module is made again in the next cell, and interrupted as it is made.
    remake = "import sys\ndel sys.modules['_mcp_support']\n" + INTERRUPT_IN_SUPPORT.format(
        name="<module>"
    )
    assert (await run(remake)).returncode == 0
    before = await run("print('ran')")
    assert (before.returncode, before.stdout) == (
        130,
        "KeyboardInterrupt: the time limit came before the code started\n",
    )
    assert (await run("print(x)")).stdout == "1\n"
    # As the code ends: what it printed stays.
    after = await run(INTERRUPT_IN_SUPPORT.format(name="finish") + "print('ran')")
    assert (after.returncode, after.stdout) == (
        130,
        "ran\nKeyboardInterrupt: the time limit came as the code ended\n",
    )
    assert (await run("print(x + 1)")).stdout == "2\n"


#: The CPU weight files of a cgroup, each with a run's weight and the least.
WEIGHTS = {"cpu.shares": ("1024", "2"), "cpu.weight": ("100", "1")}


def cpu_weight(sandbox: Sandbox) -> tuple[str, str]:
    """The CPU weight file (v1 ``cpu.shares``, v2 ``cpu.weight``) of a sandbox's cgroup, and
    the weight read there."""
    for directory in sandbox.cgroup.dirs if sandbox.cgroup is not None else ():
        for name in WEIGHTS:
            if (directory / name).exists():
                return name, (directory / name).read_text().strip()
    pytest.skip("no cpu controller here: the stop fallback's test covers this machine")


async def test_an_idle_session_has_the_least_cpu_weight_until_its_next_cell(
    evaluator: Evaluator,
) -> None:
    """Between cells, what a cell left spinning gets only CPU time no run wants (the least
    weight of its cgroup); its next cell has the weight of every run from its start, and finds
    the spinning thread and child process alive and running."""
    live = evaluator._live
    assert live is not None
    marker = f"idle-spinner-{os.getpid()}-weight"
    assert (await cell(evaluator, "spin", isolation.idle_spinners(marker))).returncode == 0
    sandbox = live.sandbox_of("spin")
    assert sandbox is not None
    file, weight = cpu_weight(sandbox)
    normal, least = WEIGHTS[file]
    assert weight == least
    again = asyncio.create_task(cell(evaluator, "spin", isolation.spinners_again("go")))
    with anyio.fail_after(60):
        while not running_in(live, "spin"):  # noqa: ASYNC110 - nothing to wait on
            await asyncio.sleep(0.05)
    assert cpu_weight(sandbox)[1] == normal  # before its code was sent, and while it runs
    (sandbox.workdir.path / "go").touch()
    assert (await again).stdout == "True None R\n"
    assert cpu_weight(sandbox)[1] == least


async def test_an_idle_session_without_a_cpu_controller_is_stopped_until_its_next_cell(
    evaluator: Evaluator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fallback where no cpu controller weighs the sandbox (an ordinary user's; here made
    so): between cells every process of the session's tree is stopped, the outer bwrap, its
    init, the interpreter with its spinning thread and the child it started; the next cell
    finds them running again."""
    monkeypatch.setattr(RunCgroup, "weighs_cpu", property(lambda self: False))
    live = evaluator._live
    assert live is not None
    marker = f"idle-spinner-{os.getpid()}-stop"
    assert (await cell(evaluator, "stop", isolation.idle_spinners(marker))).returncode == 0
    sandbox = live.sandbox_of("stop")
    assert sandbox is not None
    with anyio.fail_after(60):
        while set((states := isolation.tree_states(sandbox.process.pid)).values()) != {"T"}:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
    (child,) = isolation.processes_with(marker)
    assert child in states  # with bwrap, its init and the interpreter
    assert (await cell(evaluator, "stop", isolation.spinners_again())).stdout == "True None R\n"
    # Ending it ends its stopped processes, as any kill does.
    with anyio.fail_after(60):
        while set(isolation.tree_states(sandbox.process.pid).values()) != {"T"}:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
    await evaluator.end_session("stop")
    with anyio.fail_after(60):
        while isolation.processes_with(marker):  # noqa: ASYNC110 - nothing to wait on
            await asyncio.sleep(0.05)


async def test_room_is_made_from_the_owner_holding_the_most_sessions() -> None:
    """At the cap, a new session of an owner holding the most ends that owner's longest idle
    session, not the longest idle of all (another owner's, older)."""
    async with Evaluator(config(time_limit=10, preimport=(), max_sessions=3)) as evaluator:
        for session, owner in (("b1", "B"), ("a1", "A"), ("a2", "A"), ("a3", "A")):
            started = await cell(evaluator, session, f"x = {session!r}", session_owner=owner)
            assert (started.returncode, started.session_ended) == (0, False)
        assert evaluator.live_sessions == 3
        kept = await cell(evaluator, "b1", "print(x)", session_resume=True)
        assert kept.stdout == "b1\n"
        with pytest.raises(SessionNotFound, match="'a1'"):
            await cell(evaluator, "a1", "print(x)", session_resume=True)
        assert (await cell(evaluator, "a2", "print(x)", session_resume=True)).stdout == "a2\n"


async def test_a_new_session_never_ends_one_whose_cell_runs() -> None:
    """At the cap, with every session running a cell, a new session is refused (503, retry;
    nothing ran) rather than kill a running cell; once the cell ended, the new one makes room.
    A session whose cell runs past the idle timeout does not expire either."""
    async with Evaluator(
        config(time_limit=30, preimport=(), max_sessions=1, session_idle_timeout=1.0)
    ) as evaluator:
        await cell(evaluator, "busy", "import time\nx = 1", session_owner="A")
        running = asyncio.create_task(cell(evaluator, "busy", "time.sleep(3)\nprint(x)"))
        await cell_running(evaluator, "busy")
        with pytest.raises(SessionsFull, match="'new'"):
            await cell(evaluator, "new", "open('ran', 'w')", session_owner="B")
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(create_app(evaluator)), base_url="http://evaluator"
        ) as http:
            refused = await http.post("/eval", json={"input": "1", "session": "other"})
        assert (refused.status_code, refused.headers["retry-after"]) == (503, "1")
        assert refused.json()["title"] == "Live sessions are busy"
        assert "nothing ran" in refused.json()["description"]
        done = await running  # idle for over a second before its cell ended: not expired
        assert (done.stdout, done.session_ended) == ("1\n", False)
        assert evaluator.live_sessions == 1
        new = await cell(evaluator, "new", "print('new')", session_owner="B")
        assert (new.stdout, evaluator.live_sessions) == ("new\n", 1)
        with pytest.raises(SessionNotFound, match="'busy'"):
            await cell(evaluator, "busy", "print(x)", session_resume=True)


async def test_a_session_started_cold_runs_the_agent_compiled(evaluator: Evaluator) -> None:
    """A sandbox writes no bytecode: the agent from source would be compiled at each start."""
    code = "print(open('/proc/self/cmdline', 'rb').read().split(b'\\0')[1].decode())"
    first = await cell(evaluator, "compiled", code)
    assert (first.returncode, first.stdout) == (0, "/run/evaluator/agent.pyc\n"), first.stdout
