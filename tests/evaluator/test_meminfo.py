"""What the memory watchdog reads: the host's memory, or its cgroup's where that leaves less.

In a container or a pod the kernel enforces the cgroup's limit long before ``/proc/meminfo``
(the node's) runs short: a watchdog reading only the latter would let the OOM killer act first.
These build ``/proc/<pid>`` and cgroup trees as the kernel lays them out; the real hierarchy is
read in ``test_memory_watchdog.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from evaluator.cgroups import own_memory_limit
from evaluator.watchdog import MemInfo, cgroup_meminfo, read_meminfo

MiB = 1 << 20
GiB = 1 << 30
UNLIMITED_V1 = "9223372036854771712"


def fake_proc(
    tmp_path: Path, cgroup: str, mounts: list[tuple[str, str, str, str]]
) -> tuple[Path, Path]:
    """``/proc`` with ``self/cgroup`` and ``self/mountinfo`` (``(root, mount point below
    tmp_path, fstype, options)`` each), a host of 16 GiB with 12 available; and the cgroup
    mounts' base."""
    proc, base = tmp_path / "proc", tmp_path / "sys"
    (proc / "self").mkdir(parents=True)
    (proc / "meminfo").write_text(
        f"MemTotal: {16 * GiB // 1024} kB\nMemFree: 1 kB\nMemAvailable: {12 * GiB // 1024} kB\n"
    )
    (proc / "self" / "cgroup").write_text(cgroup)
    (proc / "self" / "mountinfo").write_text(
        "".join(
            f"{30 + i} 23 0:{40 + i} {root} {base / point} rw,relatime shared:9 - "
            f"{fstype} {fstype} rw,{options}\n"
            for i, (root, point, fstype, options) in enumerate(mounts)
        )
    )
    return proc, base


def cgroup_dir(path: Path, files: dict[str, str]) -> None:
    path.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (path / name).write_text(text + "\n")


def test_a_v2_pod_limit_above_the_container_is_the_one_read(tmp_path: Path) -> None:
    """kubelet's layout: the pod's cgroup limits, the container's inside it does not."""
    proc, base = fake_proc(
        tmp_path, "0::/kubepods/pod1/ctr\n", [("/", "fs/cgroup", "cgroup2", "nsdelegate")]
    )
    pod = base / "fs/cgroup/kubepods/pod1"
    cgroup_dir(
        pod,
        {
            "memory.max": str(4 * GiB),
            "memory.current": str(3 * GiB),
            "memory.stat": f"anon 1\ninactive_file {512 * MiB}\nactive_file 9",
        },
    )
    cgroup_dir(
        pod / "ctr",
        {"memory.max": "max", "memory.current": str(3 * GiB), "memory.stat": "inactive_file 0"},
    )
    expected = MemInfo(4 * GiB, 4 * GiB - (3 * GiB - 512 * MiB))
    assert cgroup_meminfo(proc / "self") == expected
    assert read_meminfo(proc) == expected


def test_a_v1_container_sees_its_own_cgroup_as_the_mounts_root(tmp_path: Path) -> None:
    """docker on cgroup v1 without a cgroup namespace: the mount's root is the container's
    cgroup, which ``/proc/self/cgroup`` names from the host's root."""
    proc, base = fake_proc(
        tmp_path,
        "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n0::/\n",
        [
            ("/docker/abc", "fs/cgroup/memory", "cgroup", "memory"),
            ("/docker/abc", "fs/cgroup/cpu,cpuacct", "cgroup", "cpu,cpuacct"),
        ],
    )
    cgroup_dir(
        base / "fs/cgroup/memory",
        {
            "memory.limit_in_bytes": str(GiB),
            "memory.usage_in_bytes": str(900 * MiB),
            "memory.stat": f"inactive_file 1\ntotal_inactive_file {100 * MiB}",
        },
    )
    assert read_meminfo(proc) == MemInfo(GiB, GiB - 800 * MiB)


@pytest.mark.parametrize(
    "files",
    [
        {"memory.max": "max", "memory.current": "5", "memory.stat": "inactive_file 0"},
        {"memory.max": str(64 * GiB), "memory.current": str(GiB), "memory.stat": ""},
        {"memory.max": "garbage", "memory.current": "1", "memory.stat": ""},
        {"memory.max": str(GiB)},  # no usage to read
    ],
    ids=["unlimited", "above the host", "unreadable", "incomplete"],
)
def test_without_a_tighter_cgroup_the_host_is_read(tmp_path: Path, files: dict[str, str]) -> None:
    proc, base = fake_proc(tmp_path, "0::/service\n", [("/", "fs/cgroup", "cgroup2", "")])
    cgroup_dir(base / "fs/cgroup/service", files)
    assert read_meminfo(proc) == MemInfo(16 * GiB, 12 * GiB)


def test_without_a_cgroup_mount_the_host_is_read(tmp_path: Path) -> None:
    proc, _ = fake_proc(tmp_path, "0::/service\n", [])
    assert cgroup_meminfo(proc / "self") is None
    assert read_meminfo(proc) == MemInfo(16 * GiB, 12 * GiB)


def test_usage_over_the_limit_leaves_nothing(tmp_path: Path) -> None:
    proc, base = fake_proc(tmp_path, "0::/a\n", [("/", "fs/cgroup", "cgroup2", "")])
    cgroup_dir(
        base / "fs/cgroup/a",
        {"memory.max": str(GiB), "memory.current": str(2 * GiB), "memory.stat": "inactive_file 0"},
    )
    assert read_meminfo(proc) == MemInfo(GiB, 0)


def test_the_tightest_limit_of_the_cgroup_and_its_ancestors_bounds_the_sessions(
    tmp_path: Path,
) -> None:
    """What the default cap on live sessions counts (a container's ``mem_limit``)."""
    proc, base = fake_proc(tmp_path, "0::/pod/ctr\n", [("/", "fs/cgroup", "cgroup2", "")])
    cgroup_dir(base / "fs/cgroup/pod", {"memory.max": str(2 * GiB)})
    cgroup_dir(base / "fs/cgroup/pod/ctr", {"memory.max": str(3 * GiB)})
    assert own_memory_limit(proc / "self") == 2 * GiB
    (base / "fs/cgroup/pod/memory.max").write_text("max\n")
    assert own_memory_limit(proc / "self") == 3 * GiB
    (base / "fs/cgroup/pod/ctr/memory.max").write_text("max\n")
    assert own_memory_limit(proc / "self") is None
