"""What a package set costs: first install, the same set again, and disk, through PackageCache.

Uses the index uv is configured with (PyPI here), a fresh cache each run, for a small
pure-Python package (tabulate) and one with a compiled extension (markupsafe), and prints the
ratio of the cached call to the first one, measured side by side in one run.

    uv run python bench/bench_packages.py [--python PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from pathlib import Path

from evaluator.packages import PackageCache, Policy

SETS = {
    "pure (tabulate==0.9.0)": ["tabulate==0.9.0"],
    "compiled (markupsafe==3.0.2)": ["markupsafe==3.0.2"],
}


def size_of(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=sys.executable)
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


if __name__ == "__main__":
    asyncio.run(main())
