"""CPU fairness: a CPU-bound call beside idle live sessions whose code left threads spinning.

Issue 27, finding 3. Starts the built-in evaluator of this tree in-process (real sandboxes; its
interpreter is this environment's, a symlink to the real binary, not a pyenv shim), opens
``--sessions`` live sessions whose first cell starts a thread that spins while the session's
``go`` event is set, and times one CPU-bound one-shot call (a loop calibrated to about
``--seconds``, timed inside the sandbox, and end to end) in three states, interleaved round by
round (the order rotating), so that all see the same machine:

- ``alone``: the spinners paused (a cell of each session clears its ``go``): the reference;
- ``held``: spinning, each session held between cells as the evaluator does (the least CPU
  weight of its cgroup, or stopped where there is no cpu controller; ``--hold stop`` forces the
  fallback where a cpu cgroup exists);
- ``free``: spinning, the hold turned off: the evaluator before it.

Prints each state's p50 and its slowdown against ``alone`` (the target: ``held`` within 1.25),
and the CPUs the machine kept busy while no call ran (the spinners' own use, held or free).

    uv run python bench/bench_fairness_cpu.py [--sessions 4] [--rounds 10] [--seconds 0.25]
        [--hold auto|stop]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections.abc import Callable

from _common import machine_busy, percentile

from evaluator import Evaluator, EvaluatorConfig
from evaluator.cgroups import RunCgroup
from evaluator.idle import IdleHold
from snekbox_client import EvalRequest

SPINNER = (
    "import threading\n"
    "go = threading.Event()\n"
    "def _spin():\n"
    "    while True:\n"
    "        go.wait()\n"
    "        for _ in range(100_000):\n"
    "            pass\n"
    "threading.Thread(target=_spin, daemon=True).start()\n"
)
LOOP = (
    "import time\nstart = time.perf_counter()\nfor _ in range({n}):\n    pass\n"
    "print(time.perf_counter() - start)"
)
STATES = ("alone", "held", "free")
#: Seconds after a change of state before a call is timed: the spinners start or stop.
SETTLE = 0.5

#: Whether sessions are held between cells (``free`` turns it off).
holding = True
_hold: Callable[[IdleHold], None] = IdleHold.hold


def _maybe_hold(self: IdleHold) -> None:
    if holding:
        _hold(self)


async def cell(evaluator: Evaluator, session: str, code: str) -> None:
    result = await evaluator.run(EvalRequest(args=("-c", code), session=session))
    if result.returncode != 0:
        raise RuntimeError(f"session {session}: {result.stdout}")


async def timed(evaluator: Evaluator, n: int) -> tuple[float, float]:
    """The loop's seconds inside the sandbox, and the call's end to end."""
    start = time.perf_counter()
    result = await evaluator.run(EvalRequest(args=("-c", LOOP.format(n=n))))
    wall = time.perf_counter() - start
    if result.returncode != 0:
        raise RuntimeError(result.stdout)
    return float(result.stdout), wall


async def enter(evaluator: Evaluator, sessions: list[str], state: str) -> None:
    """Put the spinners in ``state``: paused, or spinning and held, or spinning and free."""
    global holding
    holding = state != "free"
    for session in sessions:
        await cell(evaluator, session, "go.clear()" if state == "alone" else "go.set()")
    live = evaluator._live
    assert live is not None
    for session in sessions:  # their last cell held them (or not): the same for all states
        held = live._table.get(session)
        assert held is not None
        if state == "free":
            await held.idle.release()
    await asyncio.sleep(SETTLE)


async def busy_cpus(seconds: float = 1.0) -> float:
    """CPUs the machine keeps busy for ``seconds`` while no call runs."""
    before, start = machine_busy(), time.monotonic()
    await asyncio.sleep(seconds)
    return (machine_busy() - before) / (time.monotonic() - start)


async def main(args: argparse.Namespace) -> None:
    if args.hold == "stop":  # as where no cpu controller weighs a sandbox (an ordinary user's)
        RunCgroup.weighs_cpu = property(lambda self: False)  # type: ignore[method-assign,assignment]
    IdleHold.hold = _maybe_hold  # type: ignore[method-assign]
    config = EvaluatorConfig(
        time_limit=60,
        max_sessions=args.sessions + 1,
        warm_sandboxes=0,
        preimport=(),
    )
    async with Evaluator(config) as evaluator:
        print(f"interpreter: {args.interpreter}   CPUs: {os.cpu_count()}")
        print(f"CPU sharing: {evaluator._cgroups.cpu or 'no cpu cgroup'}")
        sessions = [f"spinner-{i}" for i in range(args.sessions)]
        for session in sessions:
            await cell(evaluator, session, SPINNER)
        live = evaluator._live
        assert live is not None
        first = live._table.get(sessions[0])
        assert first is not None
        print(f"idle sessions held by: {first.idle.how} (--hold {args.hold})")
        await enter(evaluator, sessions, "alone")
        probe = min([(await timed(evaluator, 2_000_000))[0] for _ in range(3)])
        n = max(100_000, round(2_000_000 * args.seconds / probe))
        loops: dict[str, list[float]] = {s: [] for s in STATES}
        walls: dict[str, list[float]] = {s: [] for s in STATES}
        idle: dict[str, list[float]] = {s: [] for s in STATES}
        for round_ in range(args.rounds):
            for state in STATES[round_ % 3 :] + STATES[: round_ % 3]:
                await enter(evaluator, sessions, state)
                idle[state].append(await busy_cpus())
                loop, wall = await timed(evaluator, n)
                loops[state].append(loop)
                walls[state].append(wall)
        await enter(evaluator, sessions, "alone")
    print(
        f"{args.sessions} idle sessions spinning a thread each, one CPU-bound call of {n} "
        f"iterations, {args.rounds} rounds, interleaved"
    )
    print(f"{'state':<7}{'loop p50':>10}{'call p50':>10}{'call p90':>10}{'slowdown':>10}"
          f"{'idle CPUs':>11}")  # fmt: skip
    reference = statistics.median(loops["alone"])
    for state in STATES:
        p50 = statistics.median(loops[state])
        print(
            f"{state:<7}{p50:>9.3f}s{statistics.median(walls[state]):>9.3f}s"
            f"{percentile(walls[state], 90):>9.3f}s{p50 / reference:>9.2f}x"
            f"{statistics.median(idle[state]):>11.2f}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=0.25)
    parser.add_argument("--hold", choices=("auto", "stop"), default="auto")
    arguments = parser.parse_args()
    # The default interpreter (this one, a venv's symlink), as the real binary it runs.
    arguments.interpreter = os.path.realpath(sys.executable)
    asyncio.run(main(arguments))
    sys.exit(0)
