"""Memory where no cgroup bounds it: the derived cap on live sessions, and the memory watchdog
that ends the largest session before the host runs out (issue 27, finding 4).

The watchdog's reading of ``MemAvailable`` is injected (the host cannot be made short of memory
on demand); the sessions, their memory and their ending are real.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import pytest

from evaluator import Evaluator, EvaluatorConfig, SessionNotFound, create_app, limits
from evaluator.cgroups import Cgroups, _cgroup_mounts, _own_v1_cgroup
from evaluator.config import MiB
from evaluator.watchdog import MemInfo, MemoryEnded, read_meminfo
from snekbox_client import EvalRequest, EvalResult
from tests.support import closed_port

from .conftest import config

GiB = 1024 * MiB
#: Fills 200 MiB (a multiplication writes every page: bytearray(n) alone may stay unbacked),
#: plus 8 MiB in the working directory and 8 MiB in /dev/shm.
LARGE = (
    "held = bytearray(b'x') * (200 * 1024 * 1024)\n"
    "open('file', 'wb').write(b'y' * (8 << 20))\n"
    "open('/dev/shm/shm', 'wb').write(b'z' * (8 << 20))"
)


async def cell(
    evaluator: Evaluator, session: str, code: str, *, resume: bool = False
) -> EvalResult:
    with anyio.fail_after(120):
        request = EvalRequest(args=("-c", code), session=session, session_resume=resume)
        return await evaluator.run(request)


class ShortOfMemory:
    """A ``/proc/meminfo`` reading that is short of memory until the evaluator has ended a
    session for it, so that exactly one check finds it short."""

    def __init__(self) -> None:
        self.evaluator: Evaluator | None = None
        self.short = False

    def __call__(self) -> MemInfo:
        ended = self.evaluator is not None and self.evaluator.sessions_ended_for_memory > 0
        if self.short and not ended:
            return MemInfo(24 * GiB, GiB)  # 4%: below the 10% reserve
        return MemInfo(24 * GiB, 20 * GiB)


async def test_the_largest_session_ends_and_its_next_call_is_told_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    reading = ShortOfMemory()
    settings = config(time_limit=30, preimport=(), max_sessions=4, memory_reserve=0.1)
    async with Evaluator(settings, meminfo=reading) as evaluator:
        reading.evaluator = evaluator
        large = await cell(evaluator, "large", LARGE)
        assert (large.returncode, large.session_ended) == (0, False), large.stdout
        small = await cell(evaluator, "small", "kept = 'small'")
        assert small.returncode == 0
        caplog.set_level(logging.WARNING, logger="evaluator.watchdog")
        reading.short = True
        with anyio.fail_after(60):
            while evaluator.sessions_ended_for_memory == 0:  # noqa: ASYNC110 - a timer's work
                await asyncio.sleep(0.05)
        assert evaluator.sessions_ended_for_memory == 1
        survived = await cell(evaluator, "small", "print(kept)", resume=True)
        assert (survived.stdout, survived.session_ended) == ("small\n", False)
        with pytest.raises(SessionNotFound) as refused:
            await cell(evaluator, "large", "print(len(held))", resume=True)
        assert refused.value.reason is not None
        assert "host was running out of memory" in str(refused.value)
        held = int(str(refused.value).split("its processes held ")[1].split(" MiB")[0])
        assert held >= 216, str(refused.value)  # heap, working directory and /dev/shm
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(create_app(evaluator)), base_url="http://evaluator"
        ) as http:
            body = {"input": "print(1)", "session": "large", "session_resume": True}
            answer = await http.post("/eval", json=body)
        assert answer.status_code == 404
        assert (
            f"ended by the evaluator because the host was running out of memory (its "
            f"processes held {held} MiB, the most of any session)"
        ) in answer.json()["description"]
        # A new interpreter under the same id runs, and a later miss has another reason.
        again = await cell(evaluator, "large", "print(1)")
        assert (again.stdout, again.session_ended) == ("1\n", False)
        await evaluator.end_session("large")
        with pytest.raises(SessionNotFound) as ended:
            await cell(evaluator, "large", "print(1)", resume=True)
        assert ended.value.reason is None
    # The watchdog's own (the start-up log warns too, as an ordinary user, of what it cannot
    # enforce).
    warnings = [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and r.name == "evaluator.watchdog"
    ]
    assert len(warnings) == 1 and "session large" in warnings[0], warnings
    assert f"({held} MiB)" in warnings[0]


async def test_a_session_ended_during_its_cell_says_why_in_that_cells_answer() -> None:
    reading = ShortOfMemory()
    settings = config(time_limit=30, preimport=(), max_sessions=2, memory_reserve=0.1)
    async with Evaluator(settings, meminfo=reading) as evaluator:
        reading.evaluator = evaluator
        await cell(evaluator, "busy", "import time")
        running = asyncio.ensure_future(cell(evaluator, "busy", "time.sleep(60)"))
        await asyncio.sleep(0.5)
        reading.short = True
        result = await running
    assert result.session_ended is True
    assert "the session was ended by the evaluator because the host was running out" in (
        result.stdout
    )


def test_the_host_reading_is_whole() -> None:
    found = read_meminfo()
    assert 0 < found.available <= found.total


def test_ended_sessions_are_remembered_within_a_bound() -> None:
    ended = MemoryEnded(keep=2)
    for session in ("a", "b", "c"):
        ended.add(session, 300 * MiB)
    assert ended.count == 3
    assert ended.reason("a") is None and "held 300 MiB" in (ended.reason("c") or "")
    ended.forget("c")
    assert ended.reason("c") is None


def test_without_a_memory_cgroup_a_session_counts_at_what_the_rlimits_leave() -> None:
    settings = EvaluatorConfig()
    none = Cgroups({}, None)
    worst = limits.session_bytes(settings, none)
    assert worst == (384 + 512 + 48 + 40) * MiB  # address space, working directory, /dev/shm
    assert settings.sessions_within(worst) < settings.session_limit
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert settings.sessions_within(worst) * worst <= total // 2
    pinned = EvaluatorConfig(max_sessions=40)
    assert pinned.sessions_within(limits.session_bytes(pinned, none)) == 40


async def test_the_evaluator_reports_the_cap_it_derived() -> None:
    """Before start, the configuration's default; once started, the derived one (smaller
    where no memory cgroup enforces the limit), in ``session_limit`` and ``GET /info``."""
    settings = config(preimport=())
    evaluator = Evaluator(settings)
    assert evaluator.session_limit == settings.session_limit
    async with evaluator:
        has_memory_cgroup = evaluator._cgroups.memory is not None
        expected = settings.sessions_within(limits.session_bytes(settings, evaluator._cgroups))
        assert evaluator.session_limit == expected == evaluator.info().max_sessions
        assert evaluator._live is not None
        assert evaluator._live._config.session_limit == expected
    if has_memory_cgroup:
        assert expected == settings.session_limit
    else:
        assert expected < settings.session_limit
    pinned = config(preimport=(), max_sessions=3)
    async with Evaluator(pinned) as evaluator:
        assert evaluator.session_limit == 3 == evaluator.info().max_sessions


@pytest.fixture
def limited_cgroup() -> Iterator[Path]:
    """A v1 memory cgroup of 1 GiB below this process's, removed after the test."""
    mount, own = _cgroup_mounts().get("memory"), _own_v1_cgroup("memory")
    if os.geteuid() != 0 or mount is None or own is None:
        pytest.skip(
            "needs root and a cgroup v1 memory hierarchy (the fake trees of "
            "test_meminfo.py cover cgroup v2)"
        )
    path = mount / own.lstrip("/") / f"test-watchdog-{os.getpid()}"
    path.mkdir()
    try:
        (path / "memory.limit_in_bytes").write_text(str(GiB))
        yield path
    finally:
        # The evaluator leaves the cgroup it made its runs' in (empty); deepest first.
        for _ in range(100):  # its processes may still be leaving
            try:
                for cgroup in sorted(path.rglob("*"), key=lambda p: -len(p.parts)):
                    if cgroup.is_dir():
                        cgroup.rmdir()
                path.rmdir()
                break
            except OSError:
                for pid in (path / "cgroup.procs").read_text().split():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)
                time.sleep(0.1)
        assert not path.exists(), f"{path} is left"


def test_in_a_container_the_watchdog_acts_before_the_containers_limit(
    limited_cgroup: Path, tmp_path: Path
) -> None:
    """An evaluator in a memory cgroup of 1 GiB on a host of many: ``/proc/meminfo`` shows the
    host's memory, and only the cgroup's reading makes two sessions of 250 MiB cross a 50%
    reserve: one of them ends (its next call told why), the other keeps its state."""
    port = closed_port()
    env = {
        **os.environ,
        "EVALUATOR_WARM_SANDBOXES": "0",
        "EVALUATOR_PREIMPORT": "",
        "EVALUATOR_MEMORY_RESERVE": "0.5",
        "EVALUATOR_MAX_SESSIONS": "4",
    }
    command = [sys.executable, "-m", "evaluator", "--port", str(port), "--log-level", "info"]
    log = tmp_path / "evaluator.log"  # a file: a pipe nobody reads would fill and stall it
    join = ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(limited_cgroup / "cgroup.procs")]
    with log.open("w") as stderr:
        process = subprocess.Popen([*join, *command], env=env, stderr=stderr)
    try:
        deadline = time.monotonic() + 120
        while "Uvicorn running on" not in log.read_text():  # once it listens
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as http:
            fill = "held = bytearray(b'x') * (250 << 20)"  # writes every page
            for name in ("a", "b"):
                answer = http.post("/eval", json={"input": fill, "session": name})
                assert answer.status_code == 200 and answer.json()["returncode"] == 0, answer.text
            deadline = time.monotonic() + 120
            ended: list[str] = []
            while not ended and time.monotonic() < deadline:
                for name in ("a", "b"):
                    body = {"input": "print(len(held))", "session": name, "session_resume": True}
                    answer = http.post("/eval", json=body)
                    if answer.status_code == 404:
                        assert "running out of memory" in answer.json()["description"], answer.text
                        ended.append(name)
                    elif "running out of memory" in (stdout := answer.json()["stdout"]):
                        # Ended while this very call ran (a loaded host): what the cell printed
                        # before, if anything, then why.
                        printed = stdout.partition("\n[the session was ended")[0]
                        assert printed in ("", f"{250 << 20}\n"), answer.text
                        ended.append(name)
                    else:
                        assert stdout == f"{250 << 20}\n", answer.text
                time.sleep(0.2)
            assert len(ended) == 1, f"sessions ended for memory: {ended}"
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:  # a busy host: its cgroup must still be emptied
            process.kill()
            process.wait()
