"""Cgroup detection: only hierarchies where this process can really make run cgroups are used."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from evaluator.cgroups import Cgroups, _cgroup_mounts

_NOBODY = 65534


@pytest.fixture
def roots_parent() -> Iterator[tuple[str, list[Path]]]:
    """A cgroup parent directory made by root in every writable v1 memory/pids hierarchy."""
    if os.geteuid() != 0:
        pytest.skip("needs root, to make a cgroup directory another user cannot write")
    name = f"evaluator-test-{os.getpid()}"
    mounts = _cgroup_mounts()
    made = []
    for controller in ("memory", "pids"):
        if controller in mounts:
            try:
                (mounts[controller] / name).mkdir()
            except OSError:
                continue
            made.append(mounts[controller] / name)
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
