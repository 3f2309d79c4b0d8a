"""Cancellation: a cancelled run, or a client that goes away, gets its sandbox killed at once."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import httpx
import pytest

from evaluator import Evaluator, create_app
from evaluator.procfs import status
from snekbox_client import EvalRequest
from tests.support import serve

from .conftest import config, run

# Far longer than any test waits: the run can only end by being killed.
_LONG = 120.0
# How long a killed run's processes may take to go: generous, since CI runs this beside a VM
# that takes a core (2 s was once too short on CPython 3.13), and far below _LONG.
_GONE_WITHIN = 30.0
_MARKER = "cancel-me-0f9a"
_LOOP = f"while True: pass  # {_MARKER}"


def _run_processes() -> set[int]:
    """This process's descendants running ``_LOOP``: both bwraps and the code, from /proc.

    (Matched by command line, so that other sandboxes, e.g. the font-list build, do not count.)
    """
    parents: dict[int, int] = {}
    marked: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        process = status(int(entry.name))
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if process is None:
            continue
        parents[int(entry.name)] = process.parent
        if _MARKER.encode() in cmdline:
            marked.add(int(entry.name))
    me = os.getpid()
    found = set()
    for pid in marked:
        ancestor, depth = parents[pid], 0
        while ancestor in parents and ancestor != me and depth < 64:
            ancestor, depth = parents[ancestor], depth + 1
        if ancestor == me:
            found.add(pid)
    return found


async def _until(condition: Callable[[], object], seconds: float) -> None:
    """Poll ``condition`` (a /proc scan: nothing to wait on) until it holds, for ``seconds``."""
    with anyio.fail_after(seconds):
        while True:
            if condition():
                return
            await anyio.sleep(0.02)


def _gone(pids: set[int]) -> bool:
    """Whether none of ``pids`` exists any more, not even as a zombie."""
    return not any(os.path.exists(f"/proc/{pid}") for pid in pids)


async def _until_gone(pids: set[int]) -> None:
    """Wait for ``pids`` to go; if they do not, fail saying what each one still is."""
    try:
        await _until(lambda: _gone(pids), _GONE_WITHIN)
    except TimeoutError:
        pytest.fail(f"still there after {_GONE_WITHIN} s: {_describe(pids)}")


def _describe(pids: set[int]) -> str:
    """Each of ``pids`` that exists: its name, state and parent (and which pid is ours)."""
    left = {pid: found for pid in pids if (found := status(pid)) is not None}
    return f"{left}; this process is {os.getpid()}"


async def _cancel_once_running(call: Callable[[], Awaitable[object]]) -> set[int]:
    """Start ``call``, cancel it ~0.5 s after its sandbox runs; return the sandbox's processes."""
    finished = False

    async def target() -> None:
        nonlocal finished
        await call()
        finished = True

    async with anyio.create_task_group() as group:
        group.start_soon(target)
        await _until(_run_processes, 10)
        await anyio.sleep(0.5)
        running = _run_processes()
        group.cancel_scope.cancel()
    assert not finished
    assert len(running) >= 2, running  # the outer bwrap and its init, at least
    return running


async def test_cancelling_run_kills_the_sandbox_and_propagates() -> None:
    async with Evaluator(config(time_limit=_LONG, concurrency=1)) as evaluator:
        task = asyncio.ensure_future(evaluator.run(EvalRequest(args=("-c", _LOOP))))
        await _until(_run_processes, 10)
        await anyio.sleep(0.5)
        running = _run_processes()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert task.cancelled()
        await _until_gone(running)
        assert not _run_processes()
        with anyio.fail_after(60):  # the slot was released
            result = await evaluator.run(EvalRequest(args=("-c", "print('again')")))
        assert (result.stdout, result.returncode) == ("again\n", 0)


async def test_cancelling_an_asgi_request_kills_the_sandbox() -> None:
    """The gateway's in-process path: a cancelled ``client.post`` through ASGITransport."""
    async with Evaluator(config(time_limit=_LONG, concurrency=1)) as evaluator:
        transport = httpx.ASGITransport(create_app(evaluator))
        async with httpx.AsyncClient(transport=transport, base_url="http://evaluator") as client:
            running = await _cancel_once_running(
                lambda: client.post("/eval", json={"input": _LOOP})
            )
            await _until_gone(running)
            assert not _run_processes()
            with anyio.fail_after(60):  # a bound, not a speed: a run may be slow under load
                assert (await run(client, "print('again')"))["stdout"] == "again\n"


async def test_a_client_that_disconnects_gets_its_sandbox_killed() -> None:
    """Over real HTTP: the cancelled httpx request closes its connection; the run is cancelled."""
    app = create_app(Evaluator(config(time_limit=_LONG, concurrency=1)), manage_evaluator=True)
    with serve(app) as url:
        async with httpx.AsyncClient(base_url=url, trust_env=False, timeout=10) as client:
            running = await _cancel_once_running(
                lambda: client.post("/eval", json={"input": _LOOP})
            )
            await _until_gone(running)
            assert not _run_processes()
            with anyio.fail_after(60):  # a bound, not a speed: a run may be slow under load
                assert (await run(client, "print('again')"))["stdout"] == "again\n"
