"""Packages installed outside the sandbox: uv, wheels only, one layer per resolved set.

No outside index: the wheels are made here (a wheel is a zip of files and their RECORD), and
uv is pointed at their folder (``--no-index --find-links``). The layer is imported by a real
interpreter, as a run would with the layer on its ``sys.path``.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from evaluator.packages import PackageCache, PackageRefused, Policy
from tests.wheels import wheels

pytestmark = pytest.mark.anyio

UV = shutil.which("uv") or str(Path(sys.executable).parent / "uv")


@pytest.fixture
def index(tmp_path: Path) -> Path:
    return wheels(tmp_path / "wheels")


def cache(tmp_path: Path, index: Path, policy: str = "any", **changes: int) -> PackageCache:
    return PackageCache(
        tmp_path / "cache",
        uv=UV,
        policy=Policy.parse(policy),
        index_args=["--no-index", "--find-links", str(index)],
        **changes,
    )


def imported(layer_path: Path, code: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(layer_path)}
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    return run.stdout


async def test_a_set_is_resolved_installed_once_and_importable(tmp_path: Path, index: Path) -> None:
    packages = cache(tmp_path, index)
    first = await packages.layer(["withdep==2.0"], sys.executable)
    assert first.pins == ("tinypkg==1.1", "withdep==2.0") and not first.cached
    assert imported(first.path, "import withdep; print(withdep.VALUE)") == "11\n"
    again = await packages.layer(["WithDep == 2.0"], sys.executable)  # the same, written otherwise
    assert (again.key, again.cached, packages.installs) == (first.key, True, 1)
    # Read-only once installed: a run (or the service) cannot change what others import.
    module = next(first.path.glob("withdep/__init__.py"))
    assert not os.access(module, os.W_OK) or os.geteuid() == 0
    assert module.stat().st_mode & 0o222 == 0


async def test_concurrent_requests_for_one_set_install_it_once(tmp_path: Path, index: Path) -> None:
    packages = cache(tmp_path, index)
    layers = await asyncio.gather(*(packages.layer(["tinypkg"], sys.executable) for _ in range(5)))
    assert len({layer.key for layer in layers}) == 1
    assert packages.installs == 1


@pytest.mark.parametrize(
    ("requirement", "why"),
    [
        ("sourceonly", "no wheel"),
        ("nosuchpackage", "not found"),
        ("tinypkg>=5", "not found"),
        ("tinypkg @ https://example.org/tinypkg.whl", "invalid"),
        ("tiny pkg", "invalid"),
        ("", "invalid"),
    ],
)
async def test_a_refusal_names_the_requirement_and_why(
    tmp_path: Path, index: Path, requirement: str, why: str
) -> None:
    with pytest.raises(PackageRefused) as refused:
        await cache(tmp_path, index).layer([requirement], sys.executable)
    assert refused.value.why == why, refused.value
    if why != "invalid":
        assert refused.value.requirement == requirement


async def test_requirements_at_odds_are_a_conflict_named_by_the_later(
    tmp_path: Path, index: Path
) -> None:
    """The later of two alike: a call's own requirements come after its session's."""
    for order, wanted in enumerate(
        (["tinypkg==1.0", "tinypkg==1.1"], ["tinypkg==1.1", "tinypkg==1.0"])
    ):
        with pytest.raises(PackageRefused) as refused:  # a cache each: refusals are kept
            await cache(tmp_path / str(order), index).layer(wanted, sys.executable)
        assert (refused.value.why, refused.value.requirement) == ("conflict", wanted[-1])


async def test_the_policy_decides_what_may_be_asked_for(tmp_path: Path, index: Path) -> None:
    allow = cache(tmp_path, index, policy="tinypkg, other")
    assert (await allow.layer(["tinypkg"], sys.executable)).pins == ("tinypkg==1.1",)
    with pytest.raises(PackageRefused, match="allows only: other, tinypkg") as refused:
        await allow.layer(["withdep"], sys.executable)
    assert refused.value.why == "not allowed"
    with pytest.raises(PackageRefused, match="turned off") as off:
        await cache(tmp_path, index, policy="off").layer(["tinypkg"], sys.executable)
    assert off.value.why == "not allowed"
    with pytest.raises(ValueError, match="empty"):
        Policy.parse(" , ")


async def test_a_set_too_large_is_refused_and_the_cache_stays_bounded(
    tmp_path: Path, index: Path
) -> None:
    strict = cache(tmp_path, index, max_layer_bytes=100_000)
    with pytest.raises(PackageRefused, match="too large"):
        await strict.layer(["bulky"], sys.executable)
    assert not [p for p in strict.root.iterdir() if p.is_dir()], "nothing half-installed is left"
    scratch = cache(tmp_path / "scratch", index)
    sizes = [size_of((await scratch.layer([r], sys.executable)).path) for r in ("bulky", "tinypkg")]
    bound = sum(sizes) + 1  # bulky and tinypkg fit together, not with a third set
    bounded = cache(tmp_path, index, max_total_bytes=bound)
    first = await bounded.layer(["bulky"], sys.executable)
    small = await bounded.layer(["tinypkg"], sys.executable)
    assert first.path.exists() and small.path.exists()
    third = await bounded.layer(["withdep"], sys.executable)
    assert not first.path.exists(), "the least recently used goes first"
    assert small.path.exists() and third.path.exists()
    assert size_of(bounded.root) <= bound


def size_of(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
