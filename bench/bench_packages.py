"""What a package set costs: first install, the same set again, and disk, through PackageCache;
then what a run with a cached set costs, against the same run without packages.

Uses the index uv is configured with (PyPI here), a fresh cache each run, for a small
pure-Python package (tabulate) and one with a compiled extension (markupsafe), and prints the
ratio of the cached call to the first one, measured side by side in one run. The second part
runs a numpy + matplotlib plot through the built-in evaluator, interleaved, each once the warm
sandboxes are back (as between an agent's calls): without packages, with a cached set (its
layer linked into a warm sandbox: tabulate is not in the environment), and as a session's cell
that adds the set (the layer linked into its running interpreter).

    uv run python bench/bench_packages.py [--python PATH] [-n RUNS]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from _common import percentile

from evaluator import Evaluator, EvaluatorConfig
from evaluator.packages import PackageCache, Policy
from snekbox_client import EvalRequest

SETS = {
    "pure (tabulate==0.9.0)": ["tabulate==0.9.0"],
    "compiled (markupsafe==3.0.2)": ["markupsafe==3.0.2"],
}


def size_of(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("-n", type=int, default=15, help="runs of each kind")
    args = parser.parse_args()
    uv = shutil.which("uv")
    assert uv, "uv is not on PATH"
    with tempfile.TemporaryDirectory() as root:
        cache = PackageCache(Path(root), uv=uv, policy=Policy.parse("any"))
        print(f"{'set':<30}{'first s':>9}{'cached ms':>11}{'ratio':>8}{'disk KiB':>10}")
        for name, requirements in SETS.items():
            first = await cache.layer(requirements, args.python)
            started = time.perf_counter()
            again = await cache.layer(requirements, args.python)
            cached = time.perf_counter() - started
            assert again.cached and again.key == first.key
            ratio = cached / first.seconds
            print(
                f"{name:<30}{first.seconds:9.2f}{cached * 1000:11.2f}{ratio:8.4f}"
                f"{size_of(first.path) / 1024:10.0f}"
            )

    await through_runs(args.n)


async def until_warm(evaluator: Evaluator) -> None:
    """Until the warm sandboxes are back (they warm while the evaluator is idle)."""
    deadline = time.monotonic() + 30
    while evaluator.warm_sandboxes < evaluator.config.warm_sandboxes:
        assert time.monotonic() < deadline, "the warm sandboxes did not come back"
        await asyncio.sleep(0.05)


PLOT = (
    "import numpy as np, matplotlib.pyplot as plt\n"
    "plt.plot(np.arange(1000)); plt.savefig('p.png'); print('ok')"
)


async def through_runs(n: int) -> None:
    """The plot without packages, with a cached set, and as a session cell adding it."""
    with tempfile.TemporaryDirectory() as root:
        os.chmod(root, 0o755)  # the runs' users traverse it to their layers
        config = EvaluatorConfig(package_cache=root, pythons=(), concurrency=2)
        async with Evaluator(config) as evaluator:
            await evaluator.run(EvalRequest(input="print(1)", packages=("tabulate==0.9.0",)))
            kinds: dict[str, list[float]] = {"no packages": [], "cached set": [], "cell": []}
            for i in range(n):
                for kind, times in kinds.items():
                    request = EvalRequest(
                        input=PLOT,
                        packages=() if kind == "no packages" else ("tabulate==0.9.0",),
                        session=f"bench-{i}" if kind == "cell" else None,
                    )
                    if kind == "cell":  # the session exists, its interpreter warm
                        await until_warm(evaluator)
                        await evaluator.run(EvalRequest(input="x = 1", session=f"bench-{i}"))
                    await until_warm(evaluator)  # as between an agent's calls
                    started = time.perf_counter()
                    result = await evaluator.run(request)
                    times.append(time.perf_counter() - started)
                    assert result.returncode == 0, result.stdout
                    if kind == "cell":
                        await evaluator.end_session(f"bench-{i}")
            base = percentile(kinds["no packages"], 50)
            print(f"\n{'plot, p50 of ' + str(n):<30}{'seconds':>9}{'ratio':>8}")
            for kind, times in kinds.items():
                p50 = percentile(times, 50)
                print(f"{kind:<30}{p50:9.3f}{p50 / base:8.2f}")


if __name__ == "__main__":
    asyncio.run(main())
