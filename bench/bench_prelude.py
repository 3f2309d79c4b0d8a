"""What the prelude costs a run that does not use matplotlib: ``print(1)`` with and without it.

Two modes, each interleaving the two variants in one run (the order alternates pair by pair, so
drift, caches and noisy neighbours hit both alike) and printing p50, p95 and the difference:

* local (default): the interpreter as the sandbox starts it, ``<python> -E -s -c "print(1)"``
  against ``<python> -E -s _mcp_prelude.py`` with the request's files freshly written into a
  temporary working directory before each run (the writing is not timed: the service does it in both
  cases). Only the process is timed, from spawn to exit.
* ``--url URL``: a running evaluation service (the built-in evaluator or Snekbox); ``POST /eval``
  with ``EvalRequest(input="print(1)")`` against ``build_request("print(1)")``, end to end.
* ``--evaluator``: the same through the project's own evaluator, started here configured like
  Snekbox: every run in a sandbox made for it (no sandbox prepared ahead, none kept warm with
  modules imported), so that each run starts a fresh interpreter that compiles the prelude.

Target: the prelude adds at most 2 ms at p50.

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

from plotting import build_request
from snekbox_client import EvalRequest, SnekboxClient

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
            bare, prelude = asyncio.run(bench_service(url, args.n, args.warmup))
        settings = " ".join(f"{name}={value}" for name, value in SNEKBOX_LIKE.items())
        where = f"POST /eval of the built-in evaluator started with {settings}"
    elif args.url:
        bare, prelude = asyncio.run(bench_service(args.url, args.n, args.warmup))
        where = f"POST {args.url.rstrip('/')}/eval"
    else:
        bare, prelude = bench_local(python, args.n, args.warmup)
        where = f"{python} {' '.join(FLAGS)}"
    report(where, bare, prelude)


def bench_local(python: str, n: int, warmup: int) -> tuple[list[float], list[float]]:
    """Seconds per run of ``-c print(1)`` and of the prelude running ``print(1)``."""
    request = build_request(CODE)
    with tempfile.TemporaryDirectory(prefix="bench-prelude-") as tmp:
        workdir = Path(tmp)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}

        def run(argv: list[str]) -> float:
            start = time.perf_counter()
            proc = subprocess.run(
                argv, cwd=workdir, env=env, capture_output=True, text=True, check=False
            )
            elapsed = time.perf_counter() - start
            check(proc.stdout + proc.stderr, proc.returncode)
            return elapsed

        def bare() -> float:
            return run([python, *FLAGS, "-c", CODE])

        def with_prelude() -> float:
            for file in request.files:
                (workdir / file.path).write_bytes(file.content)
            return run([python, *FLAGS, *(request.args or ())])

        return interleave(bare, with_prelude, n, warmup)


async def bench_service(url: str, n: int, warmup: int) -> tuple[list[float], list[float]]:
    """Seconds per ``POST /eval`` with ``input`` and with the prelude's request."""
    bare_request, prelude_request = EvalRequest(input=CODE), build_request(CODE)
    times: tuple[list[float], list[float]] = ([], [])
    async with SnekboxClient(url) as client:

        async def run(request: EvalRequest) -> float:
            start = time.perf_counter()
            result = await client.eval(request)
            elapsed = time.perf_counter() - start
            check(result.stdout, result.returncode)
            return elapsed

        for i in range(warmup + n):
            pair = [(0, bare_request), (1, prelude_request)]
            for which, request in pair if i % 2 == 0 else pair[::-1]:
                elapsed = await run(request)
                if i >= warmup:
                    times[which].append(elapsed)
    return times


def interleave(
    a: Callable[[], float], b: Callable[[], float], n: int, warmup: int
) -> tuple[list[float], list[float]]:
    times: tuple[list[float], list[float]] = ([], [])
    for i in range(warmup + n):
        pair = [(0, a), (1, b)]
        for which, run in pair if i % 2 == 0 else pair[::-1]:
            elapsed = run()
            if i >= warmup:
                times[which].append(elapsed)
    return times


def check(output: str, returncode: int | None) -> None:
    if (output, returncode) != (EXPECTED, 0):
        raise SystemExit(f"unexpected result: returncode {returncode}, output {output!r}")


def report(where: str, bare: list[float], prelude: list[float]) -> None:
    ms = 1000.0
    print(f"{where}: print(1), {len(bare)} interleaved pairs")
    print(f"{'':18}{'p50 ms':>10}{'p95 ms':>10}")
    for name, values in (("without prelude", bare), ("with prelude", prelude)):
        print(f"{name:18}{percentile(values, 50) * ms:10.2f}{percentile(values, 95) * ms:10.2f}")
    added = (percentile(prelude, 50) - percentile(bare, 50)) * ms
    paired = statistics.median(p - b for p, b in zip(prelude, bare, strict=True)) * ms
    ratio = percentile(prelude, 50) / percentile(bare, 50)
    verdict = "ok" if added <= TARGET_MS else "over target"
    print(
        f"prelude adds {added:.2f} ms at p50 (median of pairwise differences {paired:.2f} ms, "
        f"ratio {ratio:.3f}); target <= {TARGET_MS:.0f} ms: {verdict}"
    )


if __name__ == "__main__":
    main()
