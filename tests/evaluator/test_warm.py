"""Warm sandboxes: the interpreter started and the modules imported before the code arrives.

A run in a warm sandbox must be what a run in a cold one is: the same isolation and limits, the
same ``__main__``, arguments, exit statuses and tracebacks; only faster. Each test waits until
the sandboxes are warm (they warm up with the least CPU weight, so a loaded machine only makes
that slower) and checks which kind of sandbox ran the code.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from evaluator import Evaluator
from evaluator.config import MiB
from evaluator.limits import ADDRESS_SPACE_HEADROOM
from evaluator.pool import WARM_AFTER_IDLE
from snekbox_client import EvalRequest, EvalResult, File
from tests.gateway.harness import WARM_AGENT, descendants
from tests.support import sandbox_home

from . import isolation
from .conftest import config

PREIMPORT = ("numpy", "pandas", "matplotlib.pyplot")
#: Prints whether this run's interpreter had the warm agent's modules before its first line.
WARM_PROBE = "import sys; print(all(m in sys.modules for m in ('numpy', 'pandas', 'matplotlib')))"


async def until_warm(evaluator: Evaluator, count: int = 1) -> None:
    """Wait until ``count`` warm sandboxes wait (minutes at most, on a loaded machine)."""
    with anyio.fail_after(240):
        while evaluator.warm_sandboxes < count:  # noqa: ASYNC110 - nothing to wait on
            await asyncio.sleep(0.05)


@pytest.fixture(scope="module")
async def evaluator() -> AsyncIterator[Evaluator]:
    async with Evaluator(
        config(time_limit=10, warm_sandboxes=2, preimport=PREIMPORT, memory_limit=384)
    ) as started:
        yield started


async def warm_run(evaluator: Evaluator, *args: str, files: tuple[File, ...] = ()) -> EvalResult:
    """Run ``args`` in a warm sandbox (checked)."""
    await until_warm(evaluator)
    taken = evaluator.warm_runs
    result = await evaluator.run(EvalRequest(args=args, files=files))
    assert evaluator.warm_runs == taken + 1, "the run did not take a warm sandbox"
    return result


async def test_the_code_runs_in_the_warm_interpreter(evaluator: Evaluator) -> None:
    result = await warm_run(evaluator, "-c", WARM_PROBE)
    assert (result.returncode, result.stdout) == (0, "True\n")


async def test_options_and_other_interpreters_run_cold(evaluator: Evaluator) -> None:
    await until_warm(evaluator, 2)
    taken = evaluator.warm_runs
    for args in (("-I", "-c", WARM_PROBE), ("-m", "this")):
        result = await evaluator.run(EvalRequest(args=args))
        assert result.returncode == 0, result.stdout
        assert "True" not in result.stdout
    assert evaluator.warm_runs == taken, "a cold run took a warm sandbox"


#: What a run learns of its own ``__main__``, arguments and paths.
MAIN_PROBE = (
    "import sys\n"
    "print(__name__, sys.argv, repr(sys.path[0]), sorted(globals()))\n"
    "print(type(__loader__).__name__, __spec__, globals().get('__file__'))\n"
)


async def test_main_argv_and_path_are_those_of_a_cold_run(evaluator: Evaluator) -> None:
    script = File("main.py", MAIN_PROBE.encode())
    requests = (("-c", MAIN_PROBE, "a", "b"), ("main.py", "x"))
    async with Evaluator(config()) as cold:
        for args in requests:
            expected = await cold.run(EvalRequest(args=args, files=(script,)))
            result = await warm_run(evaluator, *args, files=(script,))
            assert result.stdout == expected.stdout
    assert f"__main__ ['main.py', 'x'] '{sandbox_home()}'" in expected.stdout


@pytest.mark.parametrize(
    ("code", "returncode", "stdout"),
    [
        ("raise SystemExit(3)", 3, ""),
        ("import sys; sys.exit('bye')", 1, "bye\n"),
        ("import sys; sys.exit(None)", 0, ""),
        ("import sys; sys.exit(256 + 7)", 7, ""),
        ("raise KeyboardInterrupt", 130, "KeyboardInterrupt"),
        ("x = (", 1, "SyntaxError: '(' was never closed\n"),
    ],
)
async def test_exit_statuses_are_those_of_python(
    evaluator: Evaluator, code: str, returncode: int, stdout: str
) -> None:
    result = await warm_run(evaluator, "-c", code)
    assert result.returncode == returncode, result.stdout
    assert stdout in result.stdout


async def test_a_traceback_shows_only_the_codes_frames(evaluator: Evaluator) -> None:
    result = await warm_run(evaluator, "-c", "def f():\n    1 / 0\nf()")
    assert result.returncode == 1
    assert result.stdout == (
        "Traceback (most recent call last):\n"
        '  File "<string>", line 3, in <module>\n'
        '  File "<string>", line 2, in f\n'
        "ZeroDivisionError: division by zero\n"
    )


async def test_what_the_code_leaves_open_is_flushed_and_atexit_runs(evaluator: Evaluator) -> None:
    code = (
        "import atexit, threading, time\n"
        "f = open('left-open.txt', 'w'); f.write('flushed')\n"
        "atexit.register(print, 'atexit ran')\n"
        "threading.Thread(target=lambda: (time.sleep(0.3), print('thread done'))).start()\n"
        "print('end of code')\n"
    )
    result = await warm_run(evaluator, "-c", code)
    assert result.returncode == 0
    assert result.stdout == "end of code\nthread done\natexit ran\n"
    assert [(f.path, f.content) for f in result.files] == [("left-open.txt", b"flushed")]


async def test_the_time_limit_starts_when_the_code_arrives() -> None:
    """Warm for longer than the time limit: a clock started before the code would have killed."""
    async with Evaluator(config(time_limit=1, warm_sandboxes=1, preimport=PREIMPORT)) as warm:
        await until_warm(warm)
        await asyncio.sleep(1.5)
        started = time.monotonic()
        result = await warm.run(EvalRequest(args=("-c", WARM_PROBE)))
        assert (result.returncode, result.stdout) == (0, "True\n")
        spin = await warm_run(warm, "-c", "print('spinning', flush=True)\nwhile True: pass")
        assert (spin.returncode, spin.ended_by, spin.stdout) == (137, "time_limit", "spinning\n")
        assert time.monotonic() - started >= 1


async def test_what_the_imports_print_is_not_the_runs_output() -> None:
    # The Zen of Python is printed by "import this".
    async with Evaluator(config(warm_sandboxes=1, preimport=("this",))) as warm:
        result = await warm_run(warm, "-c", "import sys; print('this' in sys.modules)")
    assert result.stdout == "True\n"


async def test_the_memory_limit_counts_the_preimported_modules(evaluator: Evaluator) -> None:
    memory = {limit.name: limit for limit in evaluator.limits_in_force()}["memory"]
    by_rlimit = "address-space rlimit" in memory.how  # an ordinary user without a cgroup
    # The rlimit is the limit plus headroom (the libraries' reserved address space).
    size = evaluator.config.memory_limit + (ADDRESS_SPACE_HEADROOM // MiB if by_rlimit else 16)
    code = (
        "rss = int([l for l in open('/proc/self/status') if l.startswith('VmRSS')][0].split()[1])\n"
        "print(rss // 1024 > 40)\n"
        f"x = bytearray({size} * 1024 * 1024)\n"
        "print('survived')\n"
    )
    result = await warm_run(evaluator, "-c", code)
    assert result.stdout.startswith("True\n")
    if by_rlimit:
        assert result.returncode == 1 and "MemoryError" in result.stdout
    else:
        assert (result.returncode, result.ended_by) == (137, "memory_limit")


async def test_isolation_holds_in_a_warm_sandbox(evaluator: Evaluator) -> None:
    for code, check in (
        (isolation.IDENTITY, isolation.check_identity),
        (isolation.SOCKETS, isolation.check_sockets),
        (isolation.DISK, isolation.check_disk),
    ):
        result = await warm_run(evaluator, "-c", "import sys\n" + code)
        assert result.returncode == 0, result.stdout
        check(result.stdout)


async def test_the_request_pipe_is_closed_before_the_code_runs(evaluator: Evaluator) -> None:
    code = "import os\ntry:\n    os.fstat(5); print('open')\nexcept OSError:\n    print('closed')"
    result = await warm_run(evaluator, "-c", code)
    assert result.stdout == "closed\n"


async def test_a_figure_saves_through_the_preimported_pyplot(evaluator: Evaluator) -> None:
    code = "import matplotlib.pyplot as plt\nplt.plot([1, 2]); plt.savefig('f.png')"
    result = await warm_run(evaluator, "-c", code)
    assert result.returncode == 0, result.stdout
    (png,) = result.files
    assert png.content.startswith(b"\x89PNG\r\n\x1a\n")


async def test_warming_that_fails_turns_itself_off_and_runs_go_on() -> None:
    """A memory limit the imports do not fit in: the agent is killed, runs are cold."""
    async with Evaluator(config(warm_sandboxes=1, preimport=PREIMPORT, memory_limit=24)) as ev:
        with anyio.fail_after(240):
            while ev._pool is not None and ev._pool._warm_target:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
        result = await ev.run(EvalRequest(args=("-c", "print('cold')")))
        assert (result.returncode, result.stdout, ev.warm_sandboxes) == (0, "cold\n", 0)


async def test_warming_waits_until_runs_stop_coming() -> None:
    """Under a steady stream of runs no sandbox is warmed (it would take the service's CPU)."""
    async with Evaluator(config(warm_sandboxes=1, preimport=("json",))) as warm:
        await until_warm(warm)
        await warm.run(EvalRequest(args=("-c", "pass")))
        assert (warm.warm_runs, warm.warm_sandboxes) == (1, 0)
        # Runs a client's round trip apart for several times the idle delay: nothing warms.
        stream_ends = time.monotonic() + 6 * WARM_AFTER_IDLE
        while time.monotonic() < stream_ends:
            result = await warm.run(EvalRequest(args=("-c", "pass")))
            assert result.returncode == 0, result.stdout
            await asyncio.sleep(WARM_AFTER_IDLE / 10)
        assert (warm.warm_runs, warm.warm_sandboxes) == (1, 0)
        await until_warm(warm)  # and once they stop, it does


async def test_a_warm_sandbox_a_session_took_is_made_again_once_its_cell_ended() -> None:
    """A session's cell retires no sandbox (whose disposal refills the pool after a one-shot
    run): the end of the cell itself must."""
    async with Evaluator(config(warm_sandboxes=1, preimport=("json",), max_sessions=2)) as warm:
        await until_warm(warm)
        cell = await warm.run(EvalRequest(args=("-c", "x = 1"), session="takes-the-warm-one"))
        assert cell.returncode == 0 and warm.warm_sandboxes == 0
        with anyio.fail_after(60):  # nothing else happens: no run, no disposal
            while warm.warm_sandboxes < 1:  # noqa: ASYNC110 - nothing to wait on
                await asyncio.sleep(0.05)


def running_agents() -> set[int]:
    """The warm agents of this process's evaluators that were handed a run (fd 5 closed)."""
    found = set()
    for pid, name in descendants(os.getpid()).items():
        if name == "bwrap":  # its init has the agent's path on its command line too
            continue
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if WARM_AGENT.encode() in argv and not os.path.exists(f"/proc/{pid}/fd/5"):
            found.add(pid)
    return found


async def test_a_cancelled_warm_run_is_killed_at_once(evaluator: Evaluator) -> None:
    await until_warm(evaluator)
    code = "import time\nwhile True: time.sleep(1)"
    run = asyncio.ensure_future(evaluator.run(EvalRequest(args=("-c", code))))
    with anyio.fail_after(60):
        while not (running := running_agents()):  # noqa: ASYNC110 - nothing to wait on
            await asyncio.sleep(0.01)
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    with anyio.fail_after(10):
        while running & set(descendants(os.getpid())):  # noqa: ASYNC110
            await asyncio.sleep(0.01)
