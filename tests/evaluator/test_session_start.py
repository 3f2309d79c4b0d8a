"""A session's agent started cold is sent its first cell at once, without waiting for it to say
it started (evaluator/live.py): its WARM comes first on its output and is dropped, and an agent
that ends before it says it started is told apart from a cell that failed.

At the level of the process (unsandboxed: the launcher runs the command as it is), so that an
agent that cannot start is easy to make; test_live.py runs cold sessions in sandboxes."""

from __future__ import annotations

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
