"""Warm sandboxes: the interpreter started and the modules imported before the code arrives.

A run in a warm sandbox must be what a run in a cold one is: the same isolation and limits, the
same ``__main__``, arguments, exit statuses and tracebacks; only faster. Each test waits until
the sandboxes are warm (they warm up with the least CPU weight, so a loaded machine only makes
that slower) and checks which kind of sandbox ran the code.
"""

from __future__ import annotations

import asyncio
import marshal
import os
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import pytest

import plotting
from evaluator import Evaluator, pool, startup, warming
from evaluator import preimports as preimports_module
from evaluator.cgroups import Cgroups
from evaluator.config import EvaluatorConfig, MiB
from evaluator.jail import JailedProcess
from evaluator.limits import ADDRESS_SPACE_HEADROOM
from evaluator.sandbox import SandboxMaker
from snekbox_client import EvalRequest, EvalResult, File
from tests.gateway.harness import WARM_AGENT, descendants
from tests.support import C_BUFFERED, sandbox_home

from . import isolation
from .conftest import config

PREIMPORT = ("numpy", "pandas", "matplotlib.pyplot")
#: Prints whether this run's interpreter had the warm agent's modules before its first line.
WARM_PROBE = "import sys; print(all(m in sys.modules for m in ('numpy', 'pandas', 'matplotlib')))"


def importing(sandboxes: pool.SandboxPool) -> list[pool.Sandbox]:
    """The warm sandboxes still importing (not the started ones, which import nothing)."""
    return sandboxes._full.warming if sandboxes._full is not None else []


async def until_warm(evaluator: Evaluator, count: int = 1) -> None:
    """Wait until ``count`` warm sandboxes wait (minutes at most, on a loaded machine)."""
    with anyio.fail_after(240):
        while evaluator.warm_sandboxes < count:  # noqa: ASYNC110 - nothing to wait on
            await asyncio.sleep(0.05)


async def until_idle(evaluator: Evaluator) -> None:
    """Wait until the pool does nothing in the background: the start-up check run's sandbox
    disposed of and made again (nothing else waited for that where matplotlib's caches were
    built earlier in the process: seconds on a busy host), every sandbox asked for made."""
    assert evaluator._pool is not None
    with anyio.fail_after(240):
        while evaluator._pool._tasks:  # noqa: ASYNC110 - the pool's background work
            await asyncio.sleep(0.01)
    await evaluator._pool.settled()


@pytest.fixture(scope="module")
async def evaluator() -> AsyncIterator[Evaluator]:
    async with Evaluator(
        config(time_limit=10, warm_sandboxes=2, preimport=PREIMPORT, memory_limit=384)
    ) as started:
        yield started


async def warm_request(evaluator: Evaluator, request: EvalRequest) -> EvalResult:
    """Run ``request`` (or start its session) in a warm sandbox (checked)."""
    await until_warm(evaluator)
    taken = evaluator.warm_runs
    result = await evaluator.run(request)
    assert evaluator.warm_runs == taken + 1, "the run did not take a warm sandbox"
    return result


async def warm_run(evaluator: Evaluator, *args: str, files: tuple[File, ...] = ()) -> EvalResult:
    """Run ``args`` in a warm sandbox (checked)."""
    return await warm_request(evaluator, EvalRequest(args=args, files=files))


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
        ("import sys; sys.exit(-2)", 254, ""),  # not the agent's own "killed by SIGINT"
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


async def test_what_c_code_printed_is_kept(evaluator: Evaluator) -> None:
    # What C code buffers goes out at C's exit(), which the run's end must not skip, with the
    # prelude or without; ctypes, which it ends by, is imported ahead with the C modules.
    ahead = await warm_run(evaluator, "-c", "import sys; print('ctypes' in sys.modules)")
    assert ahead.stdout == "True\n"
    code = C_BUFFERED + "print('python')"
    for request in (EvalRequest(args=("-c", code)), plotting.build_request(code)):
        result = await warm_request(evaluator, request)
        assert (result.returncode, result.stdout) == (0, "python\nfrom C\n")


async def test_the_time_limit_starts_when_the_code_arrives() -> None:
    """Warm for longer than the time limit: a clock started before the code would have killed."""
    # 5 s: the probe's interpreter, numpy and pandas loaded, must also exit within it.
    async with Evaluator(config(time_limit=5, warm_sandboxes=1, preimport=PREIMPORT)) as warm:
        await until_warm(warm)
        await asyncio.sleep(5.5)
        started = time.monotonic()
        result = await warm.run(EvalRequest(args=("-c", WARM_PROBE)))
        assert (result.returncode, result.stdout) == (0, "True\n")
        spin = await warm_run(warm, "-c", "print('spinning', flush=True)\nwhile True: pass")
        assert (spin.returncode, spin.ended_by, spin.stdout) == (137, "time_limit", "spinning\n")
        assert time.monotonic() - started >= 5


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


#: Multiplies matrices big enough for OpenBLAS to share the work with its threads (numpy was
#: imported in the warm sandbox), then prints the CPU seconds each of the interpreter's other
#: threads (OpenBLAS's) used in the 0.2 s after, a line each.
BLAS_THREADS_AFTER_A_CALL = """
import os, threading, time
import numpy
def cpu():
    ticks, spent = os.sysconf("SC_CLK_TCK"), {}
    for task in os.listdir("/proc/self/task"):
        if int(task) != threading.get_native_id():
            with open(f"/proc/self/task/{task}/stat") as stat:
                fields = stat.read().rpartition(")")[2].split()
            spent[task] = (int(fields[11]) + int(fields[12])) / ticks  # utime + stime
    return spent
matrix = numpy.ones((512, 512))
matrix @ matrix
before = cpu()
time.sleep(0.2)
for task, seconds in cpu().items():
    print(seconds - before[task])
"""


async def test_openblas_threads_sleep_rather_than_spin(evaluator: Evaluator) -> None:
    """By default an OpenBLAS thread left with nothing to do spins for 2**28 time-stamp ticks
    (a tenth of a second here) before it sleeps, in the run at its full CPU weight: taken from
    every other sandbox. A busy host can only lower what they used, never raise it."""
    if min(evaluator.config.threads, len(os.sched_getaffinity(0))) < 2:
        pytest.skip("one thread or one CPU: OpenBLAS starts no thread beside the caller's")
    result = await warm_run(evaluator, "-c", BLAS_THREADS_AFTER_A_CALL)
    assert result.returncode == 0, result.stdout
    spent = [float(line) for line in result.stdout.split()]
    # One thread a CPU at most, up to EVALUATOR_THREADS (4): the caller's and at least one more.
    assert spent, result.stdout
    assert max(spent) <= 0.02, spent


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


async def test_what_the_warm_agent_imported_is_out_of_the_collectors_reach(
    evaluator: Evaluator,
) -> None:
    """The warm agent freezes what its imports made (``gc.freeze()``), so that a full collection
    in the code, tens of milliseconds over all of pandas and matplotlib, skips it; what the code
    itself makes is collected as ever."""
    code = (
        "import gc\nclass C: pass\nc = C(); c.me = c; del c\n"
        "print(gc.get_freeze_count() > 10_000, gc.collect() > 0)"
    )
    assert (await warm_run(evaluator, "-c", code)).stdout == "True True\n"


async def test_a_run_without_the_prelude_runs_the_one_loaded_ahead(evaluator: Evaluator) -> None:
    """A one-shot run sent without the prelude (the gateway's, to a service keeping it
    resident) runs the one its warm interpreter loaded, as the resident one would run: its
    figure comes back, its traceback shows none of the prelude's frames."""
    code = "import matplotlib.pyplot as plt\nplt.plot([1, 2])\nprint(__name__)\n1 / 0"
    request = plotting.build_request(code, resident=True)
    result = await warm_request(evaluator, request)
    assert result.returncode == 1, result
    assert result.stdout.startswith("__main__\nTraceback"), result.stdout
    assert "line 4, in <module>" in result.stdout and "_mcp" not in result.stdout
    assert [f.path for f in plotting.sort_files(result.files).figures] == ["figure_001.png"]


async def test_code_no_argument_can_carry_runs_the_prelude_loaded_ahead(
    evaluator: Evaluator,
) -> None:
    """A one-shot run whose code cannot be the launcher's argument (over 64 KiB) goes as the
    first file and the bundle's head, and runs the prelude its warm interpreter loaded."""
    code = "# " + "x" * 70_000 + "\nimport sys\nprint(sys._mcp_prelude['_loaded_ahead'], sys.argv)"
    request = plotting.build_request(code, resident=True)
    assert request.args == [plotting.PRELUDE_NAME] and not plotting.carries_prelude(request)
    result = await warm_request(evaluator, request)
    assert (result.stdout, result.returncode) == ("True ['<string>']\n", 0), result


async def test_a_warm_sandbox_has_loaded_the_resident_prelude_ahead(evaluator: Evaluator) -> None:
    """A warm interpreter loads the prelude the evaluator keeps resident, and its support module,
    before any run, so that a session's first cell loads nothing, as its later cells; it draws,
    keeps its names and shows a value as any first cell. A first cell that carries another
    prelude whole (another gateway's) makes its own support module, not the one loaded ahead."""
    code = "import sys, matplotlib.pyplot as plt\nplt.plot([1, 2])\nx = 3\n"
    code += "sys._mcp_prelude['_loaded_ahead']"
    resident = plotting.build_request(code, resident=True)
    first = await warm_request(evaluator, replace(resident, session="ahead"))
    assert first.stdout == "True\n", first
    assert [f.path for f in plotting.sort_files(first.files).figures] == ["figure_001.png"]
    later = plotting.build_request("x + 1", later_cell=True)
    assert (await evaluator.run(replace(later, session="ahead"))).stdout == "4\n"
    shown = "import sys\nsys.modules['_mcp_support']._mcp_digest.hex()"
    boot, bundle = plotting.build_request(shown).files
    fields = marshal.loads(bundle.content)
    head = marshal.dumps((*fields[:5], bytes(16)), 4)
    other = head + b"\0" * (-len(head) % 3) + bundle.content[-fields[4] :]
    request = EvalRequest(args=[boot.path], files=[boot, File(bundle.path, other)])
    own = await warm_request(evaluator, replace(request, session="other"))
    assert own.stdout == f"'{bytes(16).hex()}'\n", own


async def test_warming_that_fails_turns_itself_off_and_runs_go_on() -> None:
    """A memory limit the imports do not fit in: the agent is killed, runs are cold."""
    async with Evaluator(config(warm_sandboxes=1, preimport=PREIMPORT, memory_limit=24)) as ev:
        with anyio.fail_after(240):
            while ev._pool is not None and ev._pool.warm_target:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
        result = await ev.run(EvalRequest(args=("-c", "print('cold')")))
        assert (result.returncode, result.stdout, ev.warm_sandboxes) == (0, "cold\n", 0)


async def test_a_taken_sandbox_is_warmed_again_while_runs_go_on() -> None:
    """Calls that come steadily find a warm sandbox: one taken is made again while another run
    is in progress, not only once the service is idle. With a cpu controller it warms at the
    least weight; without one, because a CPU is spare (one run of two slots, two CPUs)."""
    async with Evaluator(config(time_limit=300, warm_sandboxes=1, preimport=("json",))) as warm:
        await until_warm(warm)
        code = "import time\ntime.sleep(300)"
        holding = asyncio.ensure_future(warm.run(EvalRequest(args=("-c", code))))
        try:
            with anyio.fail_after(240):  # the warm one took the long run: one more warms
                while warm.warm_runs < 1:  # noqa: ASYNC110 - nothing to wait on
                    await asyncio.sleep(0.05)
                await until_warm(warm)
            assert not holding.done(), "the service was idle: this tests nothing"
        finally:
            holding.cancel()


def without_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Evaluators started from now on see no cpu hierarchy (as root without one, or an ordinary
    user without a delegated cpu controller)."""
    detect = startup.detect_cgroups

    def detect_without_cpu(config: EvaluatorConfig) -> Cgroups:
        found = detect(config)
        kept = {k: v for k, v in found._hierarchies.items() if k != "cpu"}
        return Cgroups(kept, found.version if kept else None)

    monkeypatch.setattr(startup, "detect_cgroups", detect_without_cpu)


@pytest.mark.parametrize("cpu", [True, False], ids=["cpu controller", "no cpu controller"])
async def test_saturated_a_sandbox_warms_only_at_the_least_weight(
    cpu: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every slot running a run: a sandbox warms only at the least CPU weight (cpu controller),
    never as an equal of the runs (without one)."""
    if not cpu:
        without_cpu(monkeypatch)
    settings = config(time_limit=300, warm_sandboxes=1, preimport=("json",), concurrency=1)
    async with Evaluator(settings) as ev:
        assert ev._pool is not None
        if cpu and ev._cgroups.cpu is None:
            pytest.skip("no cpu controller here (the other case runs)")
        assert (ev._cgroups.cpu is not None) == cpu
        await until_warm(ev)
        code = "import time\ntime.sleep(300)"
        holding = asyncio.ensure_future(ev.run(EvalRequest(args=("-c", code))))
        try:
            with anyio.fail_after(240):
                while ev.warm_runs < 1:  # noqa: ASYNC110 - nothing to wait on
                    await asyncio.sleep(0.05)
                if cpu:
                    await until_warm(ev)
                else:
                    await asyncio.sleep(1)  # past the refill during the run
                    assert ev.warm_sandboxes == 0 and not importing(ev._pool)
            assert not holding.done()
        finally:
            holding.cancel()
        if not cpu:  # its slot back: a CPU is spare, and the sandbox warms
            await until_warm(ev)


@pytest.mark.parametrize("cpu", [True, False], ids=["cpu controller", "no cpu controller"])
async def test_no_more_sandboxes_warm_at_a_time_than_the_service_has_cpus(
    cpu: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Warming more at once than there are CPUs would only share the spare time among them, and
    make each ready later: one slot (one CPU), three to warm, one at a time."""
    if not cpu:
        without_cpu(monkeypatch)
    settings = config(warm_sandboxes=3, preimport=("numpy", "pandas"), concurrency=1)
    async with Evaluator(settings) as ev:
        assert ev._pool is not None
        if cpu and ev._cgroups.cpu is None:
            pytest.skip("no cpu controller here (the other case runs)")
        most = 0
        with anyio.fail_after(600):
            while ev.warm_sandboxes < 3:
                most = max(most, len(importing(ev._pool)))
                await asyncio.sleep(0.01)
        assert most == 1


async def test_a_run_that_finds_no_warm_sandbox_takes_a_started_one() -> None:
    """Runs that come faster than sandboxes warm still skip the interpreter's start: the pool
    keeps started sandboxes too (the agent up, nothing imported), taken after the warm ones."""
    probe = "import sys; print('fractions' in sys.modules)"
    async with Evaluator(config(warm_sandboxes=1, preimport=("fractions",))) as ev:
        assert ev._pool is not None
        await until_warm(ev)
        with anyio.fail_after(240):
            while ev._pool.started_count < 1:  # noqa: ASYNC110 - nothing to wait on
                await asyncio.sleep(0.05)
        both = await asyncio.gather(
            ev.run(EvalRequest(args=("-c", probe))), ev.run(EvalRequest(args=("-c", probe)))
        )
        assert sorted(r.stdout for r in both) == ["False\n", "True\n"], both
        assert ev.warm_runs == 2, "one run started cold"


async def test_a_session_that_finds_no_warm_sandbox_starts_in_a_started_one() -> None:
    """A session in a started sandbox is a session as any: its cells share their state, and its
    agent imports what its code asks for."""
    probe = "import sys; imported = 'fractions' in sys.modules; import fractions"
    settings = config(warm_sandboxes=1, preimport=("fractions",), max_sessions=4)
    async with Evaluator(settings) as ev:
        assert ev._pool is not None
        await until_warm(ev)
        with anyio.fail_after(240):
            while ev._pool.started_count < 1:  # noqa: ASYNC110 - nothing to wait on
                await asyncio.sleep(0.05)
        await asyncio.gather(
            *(ev.run(EvalRequest(args=("-c", probe), session=name)) for name in ("a", "b"))
        )
        assert ev.warm_runs == 2, "one session started cold"
        again = "print(imported, fractions.Fraction(1, 3))"
        later = [await ev.run(EvalRequest(args=("-c", again), session=n)) for n in ("a", "b")]
        assert sorted(r.stdout for r in later) == ["False 1/3\n", "True 1/3\n"], later


async def test_warm_sandboxes_import_only_what_first_cells_use() -> None:
    """Sessions that start cold (no warm sandbox left, none started kept) import only fractions:
    the warm sandboxes made next leave colorsys out. First cells importing it bring it back,
    and the warm sandboxes waiting without it are made again."""
    probe = "import sys; print('colorsys' in sys.modules, 'fractions' in sys.modules)"
    settings = config(
        warm_sandboxes=2, warm_sandboxes_max=2, preimport=("fractions", "colorsys"), max_sessions=16
    )
    async with Evaluator(settings) as ev:
        await until_warm(ev, 2)
        assert ev._commands is not None and ev._pool is not None and ev._pool._full is not None
        preimports, pool, waiting = ev._commands.preimports, ev._pool, ev._pool._full.waiting
        first = "import fractions"
        cells = [ev.run(EvalRequest(args=("-c", first), session=f"a{i}")) for i in range(4)]
        assert [r.returncode for r in await asyncio.gather(*cells)] == [0] * 4
        assert ev.warm_runs == 2, "a session found a warm sandbox it should not have"
        assert preimports.current() == ("fractions",)
        # Those warming while the cells ran import colorsys still; those made after do not.
        seen = []
        for i in range(3):
            probed = await warm_request(ev, EvalRequest(args=("-c", probe), session=f"b{i}"))
            seen.append(probed.stdout)
        assert "False True\n" in seen, seen

        for i in range(preimports_module.BACK):
            await until_warm(ev, 2)  # made without colorsys
            cell = EvalRequest(args=("-c", probe + "; import colorsys"), session=f"c{i}")
            assert (await warm_request(ev, cell)).stdout == "False True\n"
        assert preimports.current() == ("fractions", "colorsys")
        await until_warm(ev, 2)  # both made before the last cell ended: without colorsys
        taken = await pool.take_warm()
        assert taken is not None
        assert all("colorsys" in s.imports for s in waiting), "one without colorsys still waits"
        pool.retire(taken)
        seen = []
        for i in range(3):
            probed = await warm_request(ev, EvalRequest(args=("-c", probe), session=f"d{i}"))
            seen.append(probed.stdout)
        assert "True True\n" in seen, seen


async def test_a_pool_asked_for_exactly_its_count_keeps_no_started_sandbox() -> None:
    """``EVALUATOR_WARM_SANDBOXES_MAX`` equal to the count: that many wait, all warm."""
    async with Evaluator(config(warm_sandboxes=1, warm_sandboxes_max=1, preimport=("json",))) as ev:
        assert ev._pool is not None
        await until_warm(ev)
        await ev._pool.settled()
        assert (ev._pool.started_count, ev._pool._started) == (0, None)


async def test_the_pool_follows_demand_and_gives_the_memory_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run that finds no warm sandbox makes the pool keep one more (up to DEMAND_FACTOR
    times the setting); without such a miss for SHRINK_AFTER seconds, one fewer, the surplus
    disposed of."""
    monkeypatch.setattr(warming, "SHRINK_AFTER", 3600.0)  # until both are warm (a loaded host)
    async with Evaluator(config(warm_sandboxes=1, preimport=("json",))) as ev:
        assert ev._pool is not None
        await until_warm(ev)
        for _ in range(20):  # again if a host slow to start the second made one meanwhile
            both = await asyncio.gather(  # one takes the warm sandbox, the other finds none
                ev.run(EvalRequest(args=("-c", "pass"))), ev.run(EvalRequest(args=("-c", "pass")))
            )
            assert [r.returncode for r in both] == [0, 0]
            if ev._pool.warm_target > 1:
                break
        grown = ev._pool.warm_target
        assert 2 <= grown <= warming.DEMAND_FACTOR
        await until_warm(ev, grown)
        monkeypatch.setattr(warming, "SHRINK_AFTER", 0.2)
        await asyncio.sleep(0.3)
        ev._pool._shrink()  # as its timer (set an hour ahead above) or the next run would
        assert (ev._pool.warm_target, ev.warm_sandboxes) == (grown - 1, grown - 1)


async def test_runs_that_start_cold_make_the_pool_keep_more_started_sandboxes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Calls back to back outrun the warm sandboxes (tenths of a CPU-second each) but not the
    started ones (hundredths): each run that found neither makes the pool keep one more started
    one, and those are made first; without such a run for SHRINK_AFTER seconds, one fewer."""
    monkeypatch.setattr(warming, "SHRINK_AFTER", 3600.0)  # until they are made (a loaded host)
    async with Evaluator(config(warm_sandboxes=1, preimport=("json",))) as ev:
        assert ev._pool is not None
        await until_warm(ev)
        assert ev._pool.started_target == 1
        for _ in range(20):  # again if a host slow to start them made one meanwhile
            # One takes the warm sandbox, one the started one, the third finds neither.
            runs = await asyncio.gather(*(ev.run(EvalRequest(args=("-c", "pass"))) for _ in "abc"))
            assert [r.returncode for r in runs] == [0, 0, 0]
            if ev._pool.started_target > 1:
                break
        grown = ev._pool.started_target
        assert 2 <= grown <= warming.DEMAND_FACTOR
        with anyio.fail_after(240):
            while ev._pool.started_count < grown:  # noqa: ASYNC110 - nothing to wait on
                await asyncio.sleep(0.05)
        monkeypatch.setattr(warming, "SHRINK_AFTER", 0.0)
        ev._pool._shrink()  # as its timer or the next refill would, at once: no other one can
        assert (ev._pool.started_target, ev._pool.started_count) == (grown - 1, grown - 1)


async def test_a_warm_sandbox_a_session_took_is_made_again_once_its_cell_ended() -> None:
    """A session's cell retires no sandbox (whose disposal refills the pool after a one-shot
    run): the end of the cell itself must."""
    async with Evaluator(config(warm_sandboxes=1, preimport=("json",), max_sessions=2)) as warm:
        await until_warm(warm)
        await until_idle(warm)
        cell = await warm.run(EvalRequest(args=("-c", "x = 1"), session="takes-the-warm-one"))
        assert cell.returncode == 0 and warm.warm_sandboxes == 0
        with anyio.fail_after(60):  # nothing else happens: no run, no disposal
            while warm.warm_sandboxes < 1:  # noqa: ASYNC110 - nothing to wait on
                await asyncio.sleep(0.05)


@pytest.mark.parametrize("session", [None, "new"], ids=["one-shot", "new session"])
async def test_a_runs_answer_goes_before_the_warm_sandbox_it_took_is_made_again(
    session: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Making a sandbox holds the GIL for milliseconds at a time: begun when the run gives its
    slot back, it would hold up the answer. The run is awaited as the API awaits it (a task),
    so a refill begun with the slot's release would be noted before the answer is."""
    events: list[str] = []
    make_in_thread = SandboxMaker.make_in_thread

    async def noting_make(self: SandboxMaker, **kwargs: bool) -> pool.Sandbox:
        events.append("make")
        return await make_in_thread(self, **kwargs)

    # One warm sandbox and nothing else to make; however slow the run, no refill during it.
    settings = config(warm_sandboxes=1, warm_sandboxes_max=1, preimport=("json",), max_sessions=2)
    monkeypatch.setattr(pool, "_REFILL_DURING", 3600)
    async with Evaluator(settings) as ev:
        await until_warm(ev)
        await until_idle(ev)
        monkeypatch.setattr(SandboxMaker, "make_in_thread", noting_make)
        run = asyncio.ensure_future(ev.run(EvalRequest(args=("-c", "print(1)"), session=session)))
        await asyncio.wait({run})
        events.append("answered")
        assert run.result().stdout == "1\n", run.result()
        await until_warm(ev)
    assert events[:2] == ["answered", "make"], events


async def test_a_cold_sessions_first_cell_goes_before_any_sandbox_is_made_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The sandbox a new session took is made again after its first cell, not before it: the
    cell would wait for that (a directory, mounts, cgroups, a process)."""
    events: list[str] = []
    make, run_cell = SandboxMaker.make, JailedProcess.run_cell

    def noting_make(self: SandboxMaker, **kwargs: bool) -> pool.Sandbox:
        events.append("make")
        return make(self, **kwargs)

    async def noting_run_cell(self: JailedProcess, *args: Any, **kwargs: Any) -> Any:
        events.append("cell")
        return await run_cell(self, *args, **kwargs)

    monkeypatch.setattr(SandboxMaker, "make", noting_make)
    monkeypatch.setattr(JailedProcess, "run_cell", noting_run_cell)
    async with Evaluator(config(warm_sandboxes=0, max_sessions=2)) as ev:
        assert ev._pool is not None
        if ev._matplotlib_task is not None:  # it makes a sandbox of its own
            await ev._matplotlib_task
        await until_idle(ev)
        events.clear()
        result = await ev.run(EvalRequest(args=("-c", "print(1)"), session="cold"))
        assert result.stdout == "1\n", result
        with anyio.fail_after(60):
            await ev._pool.settled()
            while "make" not in events:
                await asyncio.sleep(0.01)
                await ev._pool.settled()
    assert events[0] == "cell", events


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
    with anyio.fail_after(60):
        while running & set(descendants(os.getpid())):  # noqa: ASYNC110
            await asyncio.sleep(0.01)
