"""What a warm sandbox's imports cost in CPU, with matplotlib's artist tables and without.

Every call without ``session_id`` takes a warm sandbox, and making one is mostly importing
``EVALUATOR_PREIMPORT``: under four agents calling at once on two cores, that CPU is what runs
short (issue 31). The evaluator builds matplotlib's artist tables once at start
(``evaluator/_artist_docs.py``) and each warm sandbox reads them instead of building them.

This builds the tables as the start-up run does, then times, in a fresh interpreter each,
interleaved: importing ``--modules`` as a warm agent before the tables (``plain``), and the same
after running the tables' script as the agent does (``tables``). The CPU time is the
interpreter's own (user + system, all its threads) as it reports it at the end; the numeric
libraries get the sandboxes' threads (``EVALUATOR_THREADS``), matplotlib its Agg backend. Outside
a sandbox: the imports are the same work inside one.

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

from evaluator.config import EvaluatorConfig

SCRIPT = ROOT / "evaluator" / "_artist_docs.py"
#: Imports argv[2] (comma-separated) as the agent does, after the tables' script if argv[1]
#: names it; prints the CPU seconds the interpreter used.
IMPORTS = r"""
import os, resource, sys
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
usage = resource.getrusage(resource.RUSAGE_SELF)
print(usage.ru_utime + usage.ru_stime)
"""


def cpu_seconds(script: str, modules: str, env: dict[str, str]) -> float:
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
    threads = str(EvaluatorConfig().threads)
    with tempfile.TemporaryDirectory() as place:
        script = os.path.join(place, "artist_docs.py")
        shutil.copyfile(SCRIPT, script)
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "MPLCONFIGDIR": place,
            "MPLBACKEND": "Agg",
            **{f"{lib}_NUM_THREADS": threads for lib in ("OMP", "OPENBLAS", "MKL", "NUMEXPR")},
        }
        tables = Path(place, "artist-docs.json")
        subprocess.run([sys.executable, script, str(tables)], env=env, check=True)
        print(f"tables: {tables.stat().st_size} bytes, built by {sys.executable}")
        samples: dict[str, list[float]] = {"plain": [], "tables": []}
        for order in rounds(list(samples), args.n):
            for way in order:
                samples[way].append(
                    cpu_seconds(script if way == "tables" else "", args.modules, env)
                )
    print(f"import {args.modules}: CPU seconds, {args.n} interleaved rounds")
    print(f"{'way':<8}{'p25':>8}{'p50':>8}{'p75':>8}")
    for way, values in samples.items():
        quartiles = [percentile(values, q) for q in (25, 50, 75)]
        print(f"{way:<8}" + "".join(f"{q:8.3f}" for q in quartiles))
    ratio = statistics.median(samples["tables"]) / statistics.median(samples["plain"])
    pairwise = statistics.median(
        t / p for t, p in zip(samples["tables"], samples["plain"], strict=True)
    )
    print(f"tables / plain: {ratio:.2f} of the p50, {pairwise:.2f} pairwise (median)")


if __name__ == "__main__":
    main()
