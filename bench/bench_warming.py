"""What a warm sandbox's imports cost in CPU: with matplotlib's artist tables or without, with
OpenBLAS's threads spinning or sleeping.

Every call without ``session_id`` takes a warm sandbox, and making one is mostly importing
``EVALUATOR_PREIMPORT``: under four agents calling at once on two cores, that CPU is what runs
short (issue 31). The evaluator builds matplotlib's artist tables once at start
(``evaluator/_artist_docs.py``) and each warm sandbox reads them instead of building them; and
every run's environment has OpenBLAS's idle threads sleep within a millisecond
(``OPENBLAS_THREAD_TIMEOUT``), where by default they spin a tenth of a second after numpy's import.

This builds the tables as the start-up run does, then times, in a fresh interpreter each,
interleaved: importing ``--modules`` as a warm agent before the tables and OpenBLAS's timeout
(``plain``), the same after running the tables' script as the agent does (``tables``), and that
in the sandboxes' own environment (``tables, BLAS asleep``: ``evaluator.host.environment``, the
timeout included). The interpreter sleeps 0.2 s after the imports (a warm sandbox then waits for
its call), so that spinning threads are counted; the CPU time is its own (user + system, all its
threads) as it reports it at the end. The numeric libraries get the sandboxes' threads
(``EVALUATOR_THREADS``), matplotlib its Agg backend. Outside a sandbox: the imports are the same
work inside one.

    uv run python bench/bench_warming.py [-n 20] [--modules numpy,matplotlib.pyplot]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import ROOT, percentile, rounds

from evaluator import host
from evaluator.config import EvaluatorConfig

SCRIPT = ROOT / "evaluator" / "_artist_docs.py"
#: Imports argv[2] (comma-separated) as the agent does, after the tables' script if argv[1]
#: names it; prints the CPU seconds the interpreter used.
IMPORTS = r"""
import os, resource, sys, time
script, modules = sys.argv[1], sys.argv[2].split(",")
scope = {"__file__": script, "__name__": "__warm__"}
if script:
    with open(script, "rb") as file:
        exec(compile(file.read(), script, "exec"), scope)
for name in modules:
    if name.split(".")[0] == "matplotlib" and "matplotlib" not in sys.modules:
        __import__("matplotlib").use("Agg")
    __import__(name)
scope.get("after_imports", lambda: None)()
time.sleep(0.2)
usage = resource.getrusage(resource.RUSAGE_SELF)
print(usage.ru_utime + usage.ru_stime)
"""


def cpu_seconds(script: str, env: dict[str, str], modules: str) -> float:
    ran = subprocess.run(
        [sys.executable, "-c", IMPORTS, script, modules],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return float(ran.stdout.split()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=20, help="rounds (20)")
    parser.add_argument("--modules", default="numpy,matplotlib.pyplot", help="what is imported")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as place:
        script = os.path.join(place, "artist_docs.py")
        shutil.copyfile(SCRIPT, script)
        asleep = {
            **host.environment(EvaluatorConfig(), home=place),
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        }
        os.makedirs(asleep["TMPDIR"])
        spinning = {k: v for k, v in asleep.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
        tables = Path(place, "artist-docs.json")
        subprocess.run([sys.executable, script, str(tables)], env=spinning, check=True)
        print(f"tables: {tables.stat().st_size} bytes, built by {sys.executable}")
        ways = {
            "plain": ("", spinning),
            "tables": (script, spinning),
            "tables, BLAS asleep": (script, asleep),
        }
        samples: dict[str, list[float]] = {way: [] for way in ways}
        for order in rounds(list(ways), args.n):
            for way in order:
                samples[way].append(cpu_seconds(*ways[way], args.modules))
    print(f"import {args.modules}, then 0.2 s of sleep: CPU seconds, {args.n} interleaved rounds")
    print(f"{'way':<22}{'p25':>8}{'p50':>8}{'p75':>8}{'/ plain p50':>13}{'pairwise':>10}")
    plain = samples["plain"]
    for way, values in samples.items():
        quartiles = [percentile(values, q) for q in (25, 50, 75)]
        ratio = statistics.median(values) / statistics.median(plain)
        pairwise = statistics.median(v / p for v, p in zip(values, plain, strict=True))
        print(f"{way:<22}" + "".join(f"{q:8.3f}" for q in quartiles), end="")
        print(f"{ratio:13.2f}{pairwise:10.2f}")


if __name__ == "__main__":
    main()
