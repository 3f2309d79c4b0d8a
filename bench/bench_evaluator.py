"""The built-in evaluator: ``print(1)``'s latency over a bare interpreter, and its throughput.

Starts ``python -m evaluator`` as a real uvicorn server on a free loopback port and measures,
interleaved in one run so that both see the same machine load:

- the latency of ``print(1)`` through ``POST /eval`` (a plain httpx client, one at a time; with
  ``--before``, of both evaluators, alternating), and
- a bare ``<interpreter> -c 'print(1)'`` subprocess of the same interpreter (its real path:
  ``python3`` on PATH may be a slow pyenv shim);

then the saturated throughput (evaluations per second) with 1, 2, 4 and 8 concurrent clients,
each sending its runs back to back, of two scripts: ``print(1)`` (``--per-client`` runs each)
and the plot the gateway sends for :data:`PLOT` (``plotting.build_request``: the prelude, numpy,
matplotlib, one figure back as a PNG; enough runs that ``--plot-runs`` are counted). Every block
starts from an idle service (``--settle`` seconds after the last), and its rate is that of the
steady state: its first :data:`TRANSIENT` completions (the sandboxes made while idle) are left
out. ``--only print`` or ``--only plot`` runs the throughput of one script.

``--before DIR`` starts a second evaluator, of another checkout (``git worktree add
/tmp/bench-before 39914de``: the commit before warm sandboxes), and runs every throughput block
against both, one after the other, the order alternating from block to block, then prints
after/before per client count; ``--no-warm`` adds this tree's evaluator with warm sandboxes
turned off, to tell their share; ``--before-python`` runs the "before" evaluator with another
environment's interpreter (one made without bytecode, as environments were before
``compile-bytecode``: ``uv venv /tmp/venv-plain && VIRTUAL_ENV=/tmp/venv-plain uv pip install
--no-compile -r <(uv export --no-hashes)``); ``--repeat`` runs more blocks of each, their
rates pooled.
Target: after/before at least 0.9 for ``print(1)`` (the issue's reference: 31 / 60 / 64 / 62
evals/s at 1 / 2 / 4 / 8 clients) and above 1 for the plot. ``-n 0`` skips the latency part.
On 2 CPUs with ``--before``, the latency and ``print(1)`` take about 1.5 minutes and the plot
2-3; ``--only`` and ``--clients`` split them.

    uv run python bench/bench_evaluator.py [-n 100] [--per-client 25] [--plot-runs 6]
        [--settle 1] [--repeat 1] [--clients 1,2,4,8] [--only print|plot]
        [--before /tmp/bench-before] [--before-python /tmp/venv-plain/bin/python] [--no-warm]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
from _common import ROOT, before_checkout, free_port, percentile, service_of

TARGET_MS = 15.0
PLOT = (
    "import numpy as np, matplotlib.pyplot as plt; x = np.linspace(0, 10, 10000); "
    "plt.plot(x, np.sin(x)); plt.title('bench'); plt.show()"
)
TARGET_RATIO = {"print(1)": 0.9, "plot": 1.0}
#: Completions of a throughput block left out of its rate: the first runs take the sandboxes
#: made while idle (one per slot: EVALUATOR_CONCURRENCY, the CPU count, 2 here; and
#: EVALUATOR_WARM_SANDBOXES warm ones, 2 by default); the runs after them are as fast as the
#: service can make sandboxes.
TRANSIENT = 4
NO_WARM = "EVALUATOR_WARM_SANDBOXES=0"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=100, help="runs of each kind (default 100)")
    parser.add_argument("--per-client", type=int, default=25, help="print(1) runs per client")
    parser.add_argument("--plot-runs", type=int, default=6, help="plot runs counted per block")
    parser.add_argument("--only", choices=["print", "plot"], help="throughput of one script only")
    parser.add_argument("--settle", type=float, default=1.0, help="idle seconds before a block")
    parser.add_argument("--repeat", type=int, default=1, help="blocks per client count and service")
    parser.add_argument(
        "--clients",
        type=lambda text: [int(n) for n in text.split(",")],
        default=[1, 2, 4, 8],
        help="client counts of the throughput, comma-separated (default 1,2,4,8)",
    )
    parser.add_argument("--before", help="a checkout of the 'before' commit, for its evaluator")
    parser.add_argument(
        "--before-python",
        help="the interpreter of the 'before' evaluator (default: this one), e.g. of an "
        "environment made without bytecode, as before it was compiled",
    )
    parser.add_argument(
        "--no-warm",
        action="store_true",
        help=f"a third service in the throughput: this tree's evaluator with {NO_WARM}",
    )
    args = parser.parse_args()
    before = before_checkout(args.before)

    interpreter = os.path.realpath(sys.executable)
    checkouts = {"after": ROOT} | ({"no warm": ROOT} if args.no_warm else {})
    checkouts |= {"before": before} if before else {}
    with ExitStack() as stack:
        urls = {}
        for name, checkout in checkouts.items():
            port = free_port()
            env = dict([NO_WARM.split("=")]) if name == "no warm" else {}
            python = args.before_python if name == "before" else None
            stack.enter_context(
                service_of(checkout, "evaluator", port, env=env, timeout=30, python=python)
            )
            urls[name] = f"http://127.0.0.1:{port}"
        print(f"interpreter: {interpreter}   CPUs: {os.cpu_count()}   n={args.n}")
        for name, checkout in checkouts.items():
            settings = NO_WARM if name == "no warm" else "defaults"
            python = args.before_python if name == "before" and args.before_python else "this"
            print(f"  {name}: python -m evaluator of {checkout}, {settings}, {python} python")
        if args.n:
            _latency({k: v for k, v in urls.items() if k != "no warm"}, interpreter, args.n)
        scripts = (
            ["print(1)", "plot"]
            if args.only is None
            else [{"print": "print(1)"}.get(args.only, args.only)]
        )
        asyncio.run(
            _throughput(
                urls,
                checkouts,
                scripts,
                args.clients,
                args.per_client,
                args.plot_runs,
                args.settle,
                args.repeat,
            )
        )


def _latency(urls: dict[str, str], interpreter: str, n: int) -> None:
    evals: dict[str, list[float]] = {name: [] for name in urls}
    bares: list[float] = []
    venvs: list[float] = []
    clients = {
        name: httpx.Client(base_url=url, trust_env=False, timeout=30) for name, url in urls.items()
    }
    try:
        for client in clients.values():
            for _ in range(5):  # warm-up: connection, first sandboxes
                client.post("/eval", json={"input": "print(1)"})
        for i in range(n):
            names = list(clients) if i % 2 == 0 else list(clients)[::-1]
            for name in names:
                started = time.perf_counter()
                response = clients[name].post("/eval", json={"input": "print(1)"})
                evals[name].append(time.perf_counter() - started)
                answer = response.json()  # beyond these, the evaluator says how the run ended
                if [answer.get(key) for key in ("stdout", "returncode", "files")] != ["1\n", 0, []]:
                    raise SystemExit(f"unexpected answer: {response.text}")
            for command, samples in ((interpreter, bares), (sys.executable, venvs)):
                started = time.perf_counter()
                subprocess.run([command, "-c", "print(1)"], capture_output=True, check=True)
                samples.append(time.perf_counter() - started)
    finally:
        for client in clients.values():
            client.close()
    e50, e95 = _percentiles(evals["after"])
    print(f"{'':34}{'p50 ms':>8}{'p95 ms':>8}{'diff p50':>10}{'diff p95':>10}")
    print(f"{'POST /eval print(1)':34}{e50:8.1f}{e95:8.1f}")
    # The realpath'd binary is the brief's reference; the venv's python (a direct symlink to the
    # same binary, no shim) is exactly what the sandbox runs: same site-packages, same .pth files.
    print(f"  realpath python: {interpreter}\n  venv python:     {sys.executable}")
    for label, samples in (("bare realpath python -c", bares), ("bare venv python -c", venvs)):
        b50, b95 = _percentiles(samples)
        verdict = "within target" if e50 - b50 <= TARGET_MS else "OVER target"
        print(f"{label:34}{b50:8.1f}{b95:8.1f}{e50 - b50:10.1f}{e95 - b95:10.1f}  {verdict}")
    if "before" in evals:
        p50, p95 = _percentiles(evals["before"])
        v50, v95 = _percentiles(venvs)
        print(
            f"{'POST /eval print(1), before':34}{p50:8.1f}{p95:8.1f}{p50 - v50:10.1f}"
            f"{p95 - v95:10.1f}  (over bare venv python; after/before p50 {e50 / p50:.2f})"
        )
    print(f"(target: POST /eval at most {TARGET_MS:g} ms over the bare interpreter at p50)")


async def _throughput(
    urls: dict[str, str],
    checkouts: dict[str, Path],
    which: list[str],
    client_counts: list[int],
    per_client: int,
    plot_runs: int,
    settle: float,
    repeat: int,
) -> None:
    print(
        f"\nsaturated throughput, evals/s: each block from idle ({settle:g} s after the last), "
        f"its rate over the runs after the first {TRANSIENT} (the steady state); {repeat} "
        "block(s) per client count and service, the order rotating, their rates pooled"
    )
    # Each service gets the request its own checkout's gateway would send.
    scripts: dict[str, tuple[dict[str, dict[str, Any]], Any]] = {}
    if "print(1)" in which:
        scripts["print(1)"] = ({name: {"input": "print(1)"} for name in urls}, _printed_1)
    if "plot" in which:
        plots = {name: _gateway_request(checkouts[name], PLOT) for name in urls}
        scripts["plot"] = (plots, _one_figure)
    names = list(urls)
    compared = [name for name in names if name != "before"] if "before" in urls else []
    header = "".join(f"{name:>9}" for name in names)
    header += "".join(f"{name + '/before':>16}" for name in compared)
    clients_ = {
        name: httpx.AsyncClient(base_url=url, trust_env=False, timeout=120)
        for name, url in urls.items()
    }
    try:
        block = 0
        for script, (bodies, check) in scripts.items():
            runs = f"{per_client} per client" if script == "print(1)" else f"{plot_runs} counted"
            print(f"  {script} (runs per block: {runs})\n  {'clients':>9}{header}")
            for clients in client_counts:
                each = (
                    per_client
                    if script == "print(1)"
                    else math.ceil((plot_runs + TRANSIENT) / clients)
                )
                counted = dict.fromkeys(names, 0)
                seconds = dict.fromkeys(names, 0.0)
                notes: list[str] = []
                for _ in range(repeat):
                    shift = block % len(names)
                    block += 1
                    for name in names[shift:] + names[:shift]:
                        await asyncio.sleep(settle)
                        runs_, took, note = await _block(
                            clients_[name], clients, each, bodies[name], check
                        )
                        counted[name] += runs_
                        seconds[name] += took
                        notes += [f"{name}: {note}"] if note else []
                rates = {
                    name: counted[name] / seconds[name] if seconds[name] else math.nan
                    for name in names
                }
                line = f"  {clients:>9}" + "".join(f"{rates[name]:9.1f}" for name in names)
                for name in compared:
                    r = rates[name] / rates["before"]
                    verdict = " (under)" if r < TARGET_RATIO[script] else ""
                    line += f"{r:8.2f}{verdict:<8}"
                print((line + "".join(f"  ({n})" for n in dict.fromkeys(notes))).rstrip())
    finally:
        for client in clients_.values():
            await client.aclose()
    if compared:
        print(f"  (target after/before: >= {TARGET_RATIO['print(1)']:g} for print(1), "
              f"> {TARGET_RATIO['plot']:g} for the plot; '(under)': not met)")  # fmt: skip


async def _block(
    client: httpx.AsyncClient, clients: int, each: int, body: dict[str, Any], check: Any
) -> tuple[int, float, str]:
    """``clients`` workers sending ``each`` runs back to back: the runs counted, the seconds
    they took, and what went wrong.

    Counted are those of the steady state: the completions after the first :data:`TRANSIENT`,
    over the time since that one.
    """
    done: list[float] = []
    statuses: list[int] = []
    wrong: list[str] = []
    started = time.perf_counter()
    await asyncio.gather(
        *(_worker(client, each, body, check, done, statuses, wrong) for _ in range(clients))
    )
    ok, busy = statuses.count(200) - len(wrong), statuses.count(503)
    failed = len(statuses) - statuses.count(200) - busy
    note = ", ".join(
        text
        for text in (
            f"{busy} answered 503 busy" if busy else "",
            f"{failed} FAILED: HTTP {', '.join(map(str, sorted(set(statuses) - {200, 503})))}"
            if failed
            else "",
            f"{len(wrong)} WRONG: {wrong[0][:200]}" if wrong else "",
        )
        if text
    )
    skip = TRANSIENT
    if ok < len(done):
        return 0, 0.0, f"{note}; a block not counted"
    if len(done) <= skip:
        return 0, 0.0, f"only {len(done)} runs: the steady state needs > {skip}"
    done.sort()
    return len(done) - skip, done[-1] - (done[skip - 1] if skip else started), note


async def _worker(
    client: httpx.AsyncClient,
    runs: int,
    body: dict[str, Any],
    check: Any,
    done: list[float],
    statuses: list[int],
    wrong: list[str],
) -> None:
    for _ in range(runs):
        response = await client.post("/eval", json=body)
        done.append(time.perf_counter())
        statuses.append(response.status_code)
        if response.status_code == 200 and not check(response.json()):
            wrong.append(response.text)


def _gateway_request(checkout: Path, code: str) -> dict[str, Any]:
    """The ``POST /eval`` body the gateway of ``checkout`` sends for ``code`` (its prelude)."""
    build = (
        "import json, sys, plotting; "
        "json.dump(plotting.build_request(sys.argv[1]).to_json(), sys.stdout)"
    )
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    done = subprocess.run(
        [sys.executable, "-c", build, code], cwd=checkout, env=env, capture_output=True, check=True
    )
    body: dict[str, Any] = json.loads(done.stdout)
    return body


def _printed_1(answer: dict[str, Any]) -> bool:
    return [answer.get(key) for key in ("stdout", "returncode")] == ["1\n", 0]


def _one_figure(answer: dict[str, Any]) -> bool:
    files = [f.get("path", "") for f in answer.get("files") or []]
    return answer.get("returncode") == 0 and len([p for p in files if p.endswith(".png")]) == 1


def _percentiles(samples: list[float]) -> tuple[float, float]:
    """p50 and p95, in ms."""
    return statistics.median(samples) * 1000, percentile(samples, 95) * 1000


if __name__ == "__main__":
    main()
