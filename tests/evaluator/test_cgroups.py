"""Cgroup detection: only hierarchies where this process can really make run cgroups are used."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from evaluator import EvaluatorConfig
from evaluator.cgroups import Cgroups, _cgroup_mounts, _own_v1_cgroup

#: Some tests run code as nobody: under pytest-xdist, beside test_unprivileged's (see there).
pytestmark = pytest.mark.xdist_group("uid-nobody")

_NOBODY = 65534


@pytest.fixture
def roots_parent() -> Iterator[tuple[str, list[Path]]]:
    """A cgroup parent directory made by root in every writable v1 memory/pids hierarchy,
    below this process's own cgroup, where the evaluator makes its runs' cgroups."""
    if os.geteuid() != 0:
        pytest.skip("needs root, to make a cgroup directory another user cannot write")
    name = f"evaluator-test-{os.getpid()}"
    mounts = _cgroup_mounts()
    made = []
    for controller in ("memory", "pids"):
        own = _own_v1_cgroup(controller)
        if controller in mounts and own is not None:
            parent = mounts[controller] / own.lstrip("/") / name
            try:
                parent.mkdir()
            except OSError:
                continue
            made.append(parent)
    if not made:
        pytest.skip("no writable cgroup v1 memory or pids hierarchy here")
    try:
        yield name, made
    finally:
        for directory in made:
            directory.rmdir()


def _detect_as_nobody(name: str) -> dict[str, object]:
    """Cgroups.detect, then create(), in a child that dropped to uid and gid 65534."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report through the pipe, never return
        try:
            os.close(read_end)
            os.setgroups([])
            os.setresgid(_NOBODY, _NOBODY, _NOBODY)
            os.setresuid(_NOBODY, _NOBODY, _NOBODY)
            report: dict[str, object] = {}
            try:
                cgroups = Cgroups.detect(name, 256 * 1024 * 1024, 64, 1.0)
                report.update(version=cgroups.version, memory=cgroups.memory, pids=cgroups.pids)
                report["created"] = cgroups.create() is not None
            except Exception as exc:
                report["error"] = repr(exc)
            os.write(write_end, json.dumps(report).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        data = pipe.read()
    os.waitpid(pid, 0)
    result: dict[str, object] = json.loads(data)
    return result


def test_a_parent_cgroup_made_by_root_is_not_used_by_another_user(
    roots_parent: tuple[str, list[Path]],
) -> None:
    """Was: detect accepted the existing directory, and the first run failed (PermissionError)."""
    name, _ = roots_parent
    assert _detect_as_nobody(name) == {
        "version": None,
        "memory": None,
        "pids": None,
        "created": False,
    }


def test_a_usable_hierarchy_leaves_no_trial_cgroup(roots_parent: tuple[str, list[Path]]) -> None:
    name, made = roots_parent
    cgroups = Cgroups.detect(name, 256 * 1024 * 1024, 64, 1.0)
    assert cgroups.memory is not None or cgroups.pids is not None
    assert not [p for directory in made for p in directory.iterdir() if p.is_dir()]


def test_run_cgroups_nest_below_the_services_own_cgroup() -> None:
    """So that a limit on the service's container or unit covers its sandboxes."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the cgroup v1 hierarchies here are root's")
    cgroups = Cgroups.detect(f"evaluator-test-{os.getpid()}", 256 * 1024 * 1024, 64, 1.0)
    run = cgroups.create()
    if run is None:
        pytest.skip("no writable cgroup hierarchy here")
    try:
        mounts = _cgroup_mounts()
        for directory in run.dirs:
            controller = next(
                c for c in ("memory", "pids", "cpu") if mounts.get(c) in directory.parents
            )
            own = mounts[controller] / (_own_v1_cgroup(controller) or "/").lstrip("/")
            assert directory.parent.parent == own, (directory, own)
    finally:
        run.remove()
        for directory in run.dirs:
            directory.parent.rmdir()


def test_the_session_cap_follows_a_memory_limit_on_the_services_own_cgroup() -> None:
    """A container's ``mem_limit`` (here: a v1 memory cgroup limited to 1 GiB, the service
    moved into it) caps the default number of live sessions, not the machine's memory."""
    if os.geteuid() != 0:
        pytest.skip("needs root, to make a memory cgroup")
    mounts, own = _cgroup_mounts(), _own_v1_cgroup("memory")
    if "memory" not in mounts or own is None:
        pytest.skip(
            "no cgroup v1 memory hierarchy here; on cgroup v2 the same function reads memory.max, "
            "which no test here limits"
        )
    limited = mounts["memory"] / own.lstrip("/") / f"evaluator-test-limit-{os.getpid()}"
    limited.mkdir()
    try:
        (limited / "memory.limit_in_bytes").write_text(str(1024 * 1024 * 1024))
        code = (
            "import os, sys\n"
            "open(sys.argv[1], 'w').write(str(os.getpid()))\n"
            "from evaluator import EvaluatorConfig\n"
            "print(EvaluatorConfig(memory_limit=128).session_limit)"
        )
        procs = str(limited / "cgroup.procs")
        inside = subprocess.run(
            [sys.executable, "-c", code, procs], capture_output=True, text=True, check=True
        )
        outside = EvaluatorConfig(memory_limit=128).session_limit
    finally:
        limited.rmdir()
    assert inside.stdout == "4\n"  # half of 1 GiB over 128 MiB
    assert outside > 4
