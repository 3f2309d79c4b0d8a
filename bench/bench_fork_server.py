"""What a fork server would make a sandbox cost: a child of an imported parent, own namespaces.

Issue 31's four agents need a fresh interpreter with numpy, pandas and pyplot imported for each
call without ``session_id``; importing them is 1-1.5 CPU-seconds here, more than two CPUs can
give at that rate. A fork server would import once and fork each sandbox's interpreter. This
measures the shape ``docs/capacity.md`` describes (not built; its isolation needs its own
review), inside one bwrap sandbox as the evaluator would start it (``--unshare-user``, so as root
too), given ``CAP_SYS_ADMIN`` in that user namespace:

- ``fresh interpreter``: ``python -c "import <preimports>"`` in that sandbox, each run its own
  process: what warming a sandbox costs today (its CPU time, user + system, as it reports it;
  matplotlib's font cache made beforehand, as the evaluator's is);
- ``forked child``: the parent, inside the sandbox, has imported the same; each child unshares
  mount, PID, network, IPC and UTS namespaces, makes its mounts private, mounts its own tmpfs on
  ``/tmp`` and, as PID 1 of its namespace, its own ``/proc``; drops every capability, sets
  ``no_new_privs``, loads the evaluator's seccomp filter itself (``evaluator/seccomp.py``, as
  for runs sharing one uid; bwrap loads it today), checks that it sees only itself and its own
  ``/tmp`` and that the filter is in force (``memfd_create`` and ``inotify_init`` refused), and
  exits: the wall time from fork to its exit, as the parent sees it.

    uv run python bench/bench_fork_server.py [-n 20] [--modules numpy,pandas,matplotlib.pyplot]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from _common import percentile

from evaluator.config import default_bwrap
from evaluator.seccomp import compile_filter

#: The parent, run inside the sandbox: argv[1] the modules, argv[2] how many children, argv[3]
#: the seccomp program each child loads itself.
PARENT = r"""
import ctypes, json, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
NEWNS, NEWUTS, NEWIPC, NEWPID, NEWNET = 0x20000, 0x4000000, 0x8000000, 0x20000000, 0x40000000
REC, PRIVATE, NOSUID, NODEV = 0x4000, 0x40000, 2, 4

def ok(result, what):
    if result != 0:
        raise OSError(ctypes.get_errno(), what)

class Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

class Data(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]

class Program(ctypes.Structure):  # struct sock_fprog
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

def refused(result, error):
    return result == -1 and ctypes.get_errno() == error

with open(sys.argv[3], "rb") as f:
    FILTER = ctypes.create_string_buffer(f.read())  # the evaluator's, as bwrap would load it

def child():
    ok(libc.unshare(NEWNS | NEWUTS | NEWIPC | NEWPID | NEWNET), "unshare")
    ok(libc.mount(b"none", b"/", None, REC | PRIVATE, None), "private mounts")
    ok(libc.mount(b"tmpfs", b"/tmp", b"tmpfs", NOSUID | NODEV, b"size=16m"), "tmpfs")
    pid = os.fork()  # PID 1 of the new namespace
    if pid:
        os._exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
    ok(libc.mount(b"proc", b"/proc", b"proc", NOSUID | NODEV, None), "proc")
    for cap in range(64):
        libc.prctl(24, cap, 0, 0, 0)  # PR_CAPBSET_DROP
    ok(libc.prctl(38, 1, 0, 0, 0), "no_new_privs")  # PR_SET_NO_NEW_PRIVS
    ok(libc.capset(ctypes.byref(Header(0x20080522, 0)), (Data * 2)()), "capset")
    program = Program(len(FILTER.raw) // 8, ctypes.addressof(FILTER))
    ok(libc.prctl(22, 2, ctypes.byref(program), 0, 0), "seccomp")  # PR_SET_SECCOMP, FILTER
    processes = [p for p in os.listdir("/proc") if p.isdigit()]
    effective = [l for l in open("/proc/self/status") if l.startswith("CapEff")][0].split()[1]
    if os.getpid() != 1 or processes != ["1"] or os.listdir("/tmp") or int(effective, 16):
        os._exit(3)
    # Without the filter, memfd_create works and inotify has its quota; with it, ENOSYS, EMFILE.
    if not refused(libc.memfd_create(b"x", 0), 38) or not refused(libc.inotify_init(), 24):
        os._exit(4)
    os._exit(0)

for module in filter(None, sys.argv[1].split(",")):
    __import__(module)
with open("/tmp/parent-file", "w") as f:
    f.write("the parent's")
times = []
for _ in range(int(sys.argv[2])):
    started = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        try:
            child()
        finally:
            os._exit(2)
    status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    if status:
        sys.exit(f"a child failed: status {status}")
    times.append((time.perf_counter() - started) * 1000)
print(json.dumps(times))
"""


def jail(config: str, *, cap_sys_admin: bool) -> list[str]:
    """bwrap's command line for a sandbox like the evaluator's, the filesystem read-only but
    for ``config``, matplotlib's (``MPLCONFIGDIR``: it makes a new font cache in a directory it
    cannot write)."""
    caps = ["--cap-add", "CAP_SYS_ADMIN"] if cap_sys_admin else []
    return [
        default_bwrap(),
        *("--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts"),
        *("--die-with-parent", "--ro-bind", "/", "/", "--tmpfs", "/tmp"),
        *("--proc", "/proc", "--dev", "/dev", "--bind", config, config, *caps),
    ]


def fresh_cpu(modules: str, n: int, config: str) -> list[float]:
    """CPU milliseconds (as each reports its own) of ``n`` fresh interpreters importing
    ``modules`` in the sandbox."""
    imports = "".join(f"import {m}; " for m in modules.split(",") if m)
    code = imports + "import resource; r = resource.getrusage(0); print(r.ru_utime + r.ru_stime)"
    times = []
    for _ in range(n):
        argv = [*jail(config, cap_sys_admin=False), sys.executable, "-c", code]
        done = subprocess.run(argv, capture_output=True, text=True, check=True)
        times.append(float(done.stdout) * 1000)
    return times


def forked(modules: str, n: int, config: str) -> list[float]:
    """Wall milliseconds from fork to exit of ``n`` children of one imported parent."""
    program = os.path.join(config, "seccomp.bpf")
    with open(program, "wb") as f:
        f.write(compile_filter(shared_user=True))  # the children share one uid
    with tempfile.NamedTemporaryFile("w", suffix=".py", dir="/var/tmp") as script:
        script.write(PARENT)
        script.flush()
        os.chmod(script.name, 0o644)
        argv = [*jail(config, cap_sys_admin=True), sys.executable, script.name, modules, str(n)]
        done = subprocess.run([*argv, program], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"the parent failed ({done.returncode}): {done.stderr[-2000:]}")
    times: list[float] = json.loads(done.stdout)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=20, help="children, and fresh interpreters (20)")
    parser.add_argument("--modules", default="numpy,pandas,matplotlib.pyplot")
    args = parser.parse_args()
    env_note = f"uid {os.getuid()}, {os.cpu_count()} CPUs, {sys.executable}"
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(dir="/var/tmp") as config:
        # matplotlib's font cache, made once and bound into each sandbox (as the evaluator does).
        os.environ["MPLCONFIGDIR"] = config
        subprocess.run([sys.executable, "-c", "import matplotlib.pyplot"], check=True)
        fresh = fresh_cpu(args.modules, args.n, config)
        children = forked(args.modules, args.n, config)
    print(f"a sandbox's interpreter with {args.modules} imported, {args.n} each; {env_note}")
    print(f"{'way':<34}{'p50 ms':>9}{'p95 ms':>9}")
    for name, values in (
        ("fresh interpreter (CPU time)", fresh),
        ("forked child (wall, fork to exit)", children),
    ):
        print(f"{name:<34}{statistics.median(values):9.1f}{percentile(values, 95):9.1f}")
    ratio = statistics.median(fresh) / statistics.median(children)
    took = time.perf_counter() - started
    print(f"a forked child costs 1/{ratio:.0f} of a fresh import ({took:.0f} s in all)")


if __name__ == "__main__":
    main()
