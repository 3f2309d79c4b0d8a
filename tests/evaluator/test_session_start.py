"""A session's agent started cold is sent its first cell at once, without waiting for it to say
it started (evaluator/live.py): its WARM comes first on its output and is dropped, and an agent
that ends before it says it started is told apart from a cell that failed.

At the level of the process (unsandboxed: the launcher runs the command as it is), so that an
agent that cannot start is easy to make; test_live.py runs cold sessions in sandboxes."""

from __future__ import annotations

import contextlib
import os
import select
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

import evaluator
from evaluator.jail import JailedProcess, LaunchSpec

pytestmark = pytest.mark.anyio

AGENT = str(Path(evaluator.__file__).with_name("_agent.py"))


@pytest.fixture
async def process() -> AsyncIterator[JailedProcess]:
    started = JailedProcess.spawn(LaunchSpec(), cgroup=None, warm=True, session=True)
    try:
        yield started
    finally:
        await started.aclose()


async def cell(process: JailedProcess, code: str, *, starting: bool = False) -> bytes:
    with anyio.fail_after(60):
        outcome = await process.run_cell(
            ["-c", code], time_limit=30, output_limit=10_000, grace=1, starting=starting
        )
    assert outcome.returncode == 0, outcome
    return outcome.output


async def test_the_first_cell_goes_with_the_start_and_its_output_is_the_cells(
    process: JailedProcess,
) -> None:
    process.release([sys.executable, AGENT, "--session"], None)
    assert await cell(process, "x = 6\nprint('first')", starting=True) == b"first\n"
    assert await cell(process, "print(x * 7)") == b"42\n", "the session lives on"


async def test_an_agent_that_ends_before_it_starts_says_why(process: JailedProcess) -> None:
    process.release(["/bin/sh", "-c", "echo 'no interpreter here' >&2; exit 3"], None)
    with pytest.raises(RuntimeError, match="did not start: no interpreter here"):
        await cell(process, "print('never')", starting=True)


class BareAgent:
    """A session's agent run as a plain process, its cells framed on a pipe as the service
    frames them. Never send it an interrupt: an interrupted cell ends with ``kill(-1, 9)``,
    which outside a sandbox (as root) reaches every process of the host."""

    def __init__(self) -> None:
        cells_r, self.cells = os.pipe()
        self.statuses, status_w = os.pipe()
        command = f'exec "$0" "$1" --session 5<&{cells_r} 6>&{status_w}'
        self.process = subprocess.Popen(
            ["bash", "-c", command, sys.executable, AGENT],
            pass_fds=(cells_r, status_w),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        os.close(cells_r)
        os.close(status_w)

    def send(self, code: str, *, last: bool = False) -> None:
        """A cell of ``code``; ``last``: the end of the pipe written at once after it."""
        payload = f"-c\0{code}\0".encode()
        os.write(self.cells, b"c" + len(payload).to_bytes(4, "big") + payload)
        if last:
            os.close(self.cells)

    def status(self) -> int | None:
        """The next cell's status; ``None``: the agent wrote none within a minute. (The masks
        of the modules it watches follow: none are watched here.)"""
        ready, _, _ = select.select([self.statuses], [], [], 60)
        data = os.read(self.statuses, 8) if ready else b""
        return int.from_bytes(data[:4], "big", signed=True) if len(data) == 8 else None

    def end(self) -> tuple[int | None, bytes]:
        """Its exit status (``None``: it did not exit within a minute) and all it printed."""
        with contextlib.suppress(OSError):
            os.close(self.cells)
        try:
            out, _ = self.process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return None, self.process.communicate()[0]
        finally:
            os.close(self.statuses)
        return self.process.returncode, out


def test_a_last_cell_sent_with_the_end_runs_and_the_agent_exits() -> None:
    """The frame of a cell and the end of fd 5, read at once by the agent's reader: the cell
    runs, its status is written, then the agent exits. (An agent that woke its main thread once
    for both would run the cell and wait for ever.) Ten times: the main thread may or may not
    wake between the two."""
    for _ in range(10):
        agent = BareAgent()
        agent.send("print('last')", last=True)
        assert agent.status() == 0
        assert agent.end() == (0, b"\x07last\n")


def test_a_cells_exit_status_is_pythons_and_any_keeps_the_session() -> None:
    """``sys.exit(n)`` ends a cell with the status ``python -c`` would end with (``n`` modulo
    256), whatever ``n``: one too large for the status pipe's four bytes once ended the
    interpreter, and the session with it."""
    agent = BareAgent()
    statuses = []
    for code in (-1, 300, 2**40, 3):
        agent.send(f"import sys; sys.exit({code})")
        statuses.append(agent.status())
    assert statuses == [255, 44, 0, 3]
    assert agent.end() == (0, b"\x07")
