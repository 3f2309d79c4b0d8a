"""What the prelude costs a run that does not use matplotlib: ``print(1)`` with and without it.

Each mode interleaves three ways in one run (the order rotates round by round, so drift, caches
and noisy neighbours hit all alike) and prints p50, p95 and each prelude way's difference: no
prelude; the prelude carried by the request (``build_request("print(1)")``, 37 KB); and the
prelude the service keeps resident (``build_request("print(1)", resident=True)``: the request
carries the code alone), left out where the service keeps none.

* local (default): the interpreter as the sandbox starts it, ``<python> -E -s -c "print(1)"``
  against ``<python> -E -s _mcp_prelude.py`` with the request's files freshly written into a
  temporary working directory before each run (the writing is not timed: the service does it in
  each case), and the resident way, ``-c LAUNCHER print(1)`` with no file (the resident prelude
  is written once, in a directory the launcher is pointed at). Only the process is timed, from
  spawn to exit.
* ``--url URL``: a running evaluation service (the built-in evaluator or Snekbox); ``POST /eval``
  with ``EvalRequest(input="print(1)")`` against the prelude's requests, end to end.
* ``--evaluator``: the same through the project's own evaluator, started here configured like
  Snekbox: every run in a sandbox made for it (no sandbox prepared ahead, none kept warm with
  modules imported), so that each run starts a fresh interpreter that compiles the prelude.

Target: the prelude adds at most 2 ms at p50 (the resident one, where the service keeps it).

    uv run python bench/bench_prelude.py [-n 100] [--python PATH]
        [--url http://127.0.0.1:8060 | --evaluator]
"""

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from _common import free_port, percentile, python_server

import plotting
from plotting import PRELUDE_NAME, RESIDENT_DIR, build_request, prelude_missing
from snekbox_client import EvalRequest, File, SnekboxClient

CODE = "print(1)"
EXPECTED = "1\n"
TARGET_MS = 2.0
# The flags a sandbox is likely to start the interpreter with.
FLAGS = ("-E", "-s")
# The built-in evaluator as Snekbox runs: no sandbox made ahead of its run, none kept warm.
SNEKBOX_LIKE = {"EVALUATOR_PREWARM": "false", "EVALUATOR_WARM_SANDBOXES": "0"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=100, help="pairs of runs (default 100)")
    parser.add_argument(
        "--python",
        default=os.path.realpath(sys.executable),
        help="interpreter for the local mode (default: the real path of this one, not a shim)",
    )
    where_to = parser.add_mutually_exclusive_group()
    where_to.add_argument("--url", help="benchmark POST /eval of the evaluation service there")
    where_to.add_argument(
        "--evaluator",
        action="store_true",
        help="start the built-in evaluator configured like Snekbox and benchmark its POST /eval",
    )
    parser.add_argument("--warmup", type=int, default=5, help="untimed pairs first (default 5)")
    args = parser.parse_args()
    python = os.path.abspath(args.python)  # runs are in a temp dir: a relative path would break
    if args.evaluator:
        url = f"http://127.0.0.1:{free_port()}"
        command = ["-m", "evaluator", "--port", url.rsplit(":", 1)[1], "--log-level", "warning"]
        env = {**os.environ, **SNEKBOX_LIKE}
        with python_server(command, f"OPTIONS {url}/eval", env=env, timeout=60):
            times = asyncio.run(bench_service(url, args.n, args.warmup))
        settings = " ".join(f"{name}={value}" for name, value in SNEKBOX_LIKE.items())
        where = f"POST /eval of the built-in evaluator started with {settings}"
    elif args.url:
        times = asyncio.run(bench_service(args.url, args.n, args.warmup))
        where = f"POST {args.url.rstrip('/')}/eval"
    else:
        times = bench_local(python, args.n, args.warmup)
        where = f"{python} {' '.join(FLAGS)}"
    report(where, times)


#: The ways, in the report's order: the first is the baseline.
BARE, CARRIED, RESIDENT = "without prelude", "prelude carried", "prelude resident"


def bench_local(python: str, n: int, warmup: int) -> dict[str, list[float]]:
    """Seconds per run of ``-c print(1)`` and of the prelude's ways running ``print(1)``."""
    with tempfile.TemporaryDirectory(prefix="bench-prelude-") as tmp:
        workdir, resident = Path(tmp) / "work", Path(tmp) / "resident"
        workdir.mkdir()
        # Compiled by the interpreter itself, as the image and the evaluator write it.
        script = Path(plotting.__file__).parent / "_bundle.py"
        subprocess.run(
            [python, "-I", str(script), str(resident), str(resident)],
            check=True,
            capture_output=True,
        )
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}

        def run(argv: list[str]) -> float:
            start = time.perf_counter()
            proc = subprocess.run(
                argv, cwd=workdir, env=env, capture_output=True, text=True, check=False
            )
            elapsed = time.perf_counter() - start
            check(proc.stdout + proc.stderr, proc.returncode)
            return elapsed

        def with_prelude(request: EvalRequest) -> Callable[[], float]:
            def way() -> float:
                for file in request.files:
                    (workdir / file.path).write_bytes(file.content)
                return run([python, *FLAGS, *(request.args or ())])

            return way

        ways = {
            BARE: lambda: run([python, *FLAGS, "-c", CODE]),
            CARRIED: with_prelude(build_request(CODE)),
            RESIDENT: with_prelude(pointed_at(build_request(CODE, resident=True), resident)),
        }
        return interleave(ways, n, warmup)


def pointed_at(request: EvalRequest, resident: Path) -> EvalRequest:
    """``request`` with its launcher (or its first file) looking for the resident prelude in
    ``resident``."""
    here, there = RESIDENT_DIR, str(resident)
    files = [
        File(f.path, f.content.replace(here.encode(), there.encode()))
        if f.path == PRELUDE_NAME
        else f
        for f in request.files
    ]
    return EvalRequest(args=[arg.replace(here, there) for arg in request.args or ()], files=files)


async def bench_service(url: str, n: int, warmup: int) -> dict[str, list[float]]:
    """Seconds per ``POST /eval`` with ``input`` and with the prelude's requests."""
    requests = {
        BARE: EvalRequest(input=CODE),
        CARRIED: build_request(CODE),
        RESIDENT: build_request(CODE, resident=True),
    }
    times: dict[str, list[float]] = {way: [] for way in requests}
    async with SnekboxClient(url) as client:
        if prelude_missing(await client.eval(requests[RESIDENT])):
            print(f"the service keeps no resident prelude of this checkout's: {RESIDENT} left out")
            del requests[RESIDENT], times[RESIDENT]
        ways = list(requests)
        for i in range(warmup + n):
            shift = i % len(ways)
            for way in ways[shift:] + ways[:shift]:
                start = time.perf_counter()
                result = await client.eval(requests[way])
                elapsed = time.perf_counter() - start
                check(result.stdout, result.returncode)
                if i >= warmup:
                    times[way].append(elapsed)
    return times


def interleave(ways: dict[str, Callable[[], float]], n: int, warmup: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {way: [] for way in ways}
    names = list(ways)
    for i in range(warmup + n):
        shift = i % len(names)
        for way in names[shift:] + names[:shift]:
            elapsed = ways[way]()
            if i >= warmup:
                times[way].append(elapsed)
    return times


def check(output: str, returncode: int | None) -> None:
    if (output, returncode) != (EXPECTED, 0):
        raise SystemExit(f"unexpected result: returncode {returncode}, output {output!r}")


def report(where: str, times: dict[str, list[float]]) -> None:
    ms = 1000.0
    bare = times[BARE]
    print(f"{where}: print(1), {len(bare)} interleaved rounds")
    print(f"{'':18}{'p50 ms':>10}{'p95 ms':>10}")
    for name, values in times.items():
        print(f"{name:18}{percentile(values, 50) * ms:10.2f}{percentile(values, 95) * ms:10.2f}")
    for name, values in times.items():
        if name == BARE:
            continue
        added = (percentile(values, 50) - percentile(bare, 50)) * ms
        paired = statistics.median(p - b for p, b in zip(values, bare, strict=True)) * ms
        ratio = percentile(values, 50) / percentile(bare, 50)
        verdict = "ok" if added <= TARGET_MS else "over target"
        print(
            f"{name} adds {added:.2f} ms at p50 (median of pairwise differences {paired:.2f} "
            f"ms, ratio {ratio:.3f}); target <= {TARGET_MS:.0f} ms: {verdict}"
        )


if __name__ == "__main__":
    main()
