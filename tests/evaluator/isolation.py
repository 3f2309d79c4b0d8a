"""What a run may know and do of its host: checks shared by the root and unprivileged suites.

Each check is the code a run executes and a function asserting on its stdout, so that the same
promise is tested whichever user starts the evaluator (in-process as root in
``test_isolation.py``, as uid 65534 over HTTP in ``test_unprivileged.py``).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import stat
from pathlib import Path
from typing import Any

#: Files of /proc that only host root may read.
ROOT_ONLY = ("/proc/timer_list", "/proc/slabinfo", "/proc/pagetypeinfo", "/proc/vmallocinfo")

IDENTITY = r"""
import json, os
out = {"uid_map": open("/proc/self/uid_map").read().split(),
       "gid_map": open("/proc/self/gid_map").read().split()}
status = dict(line.split(":", 1) for line in open("/proc/self/status"))
out["caps"] = {k: int(status[k], 16) for k in ("CapInh", "CapPrm", "CapEff", "CapAmb")}
writable = []
for directory, _, files in os.walk("/proc/sys"):
    for name in files:
        path = os.path.join(directory, name)
        try:
            os.close(os.open(path, os.O_WRONLY))  # the permission check; nothing is written
            writable.append(path)
        except OSError:
            pass
for path in ("/proc/sysrq-trigger", "/proc/sys/kernel/core_pattern", "/proc/sys/vm/drop_caches"):
    try:
        os.close(os.open(path, os.O_WRONLY))
        writable.append(path)
    except OSError:
        pass
out["writable"] = writable
out["readable"] = []
for path in ROOT_ONLY:
    try:
        with open(path, "rb") as f:
            f.read(1)
        out["readable"].append(path)
    except OSError:
        pass
out["cmdline"] = open("/proc/cmdline").read()
out["hostname"] = os.uname().nodename
print(json.dumps(out))
""".replace("ROOT_ONLY", repr(ROOT_ONLY))


def check_identity(stdout: str) -> None:
    """No map to host uid 0, no capability, no writable sysctl, no root-only file, no cmdline."""
    out: dict[str, Any] = json.loads(stdout)
    for name in ("uid_map", "gid_map"):
        inside, outside, count = out[name]
        assert (inside, count) == ("65534", "1"), out[name]
        assert outside != "0", f"{name} maps the sandbox user to uid 0: {out[name]}"
    assert out["caps"] == {"CapInh": 0, "CapPrm": 0, "CapEff": 0, "CapAmb": 0}, out["caps"]
    assert out["writable"] == [], out["writable"]
    assert out["readable"] == [], out["readable"]
    assert out["cmdline"] == "", "the host's kernel command line is hidden"
    assert re.fullmatch(r"sandbox-[0-9a-f]{6}", out["hostname"]), "the host's name is hidden"


#: Families a run may not create a socket of, with the protocol tried (raw netlink: audit and
#: kobject uevents; everything with a network-namespace-blind path to the host).
REFUSED_SOCKETS = {
    "AF_VSOCK": (40, 1, 0),
    "AF_PACKET": (17, 3, 0),
    "AF_NETLINK audit": (16, 3, 9),
    "AF_NETLINK uevent": (16, 2, 15),
    "AF_ALG": (38, 5, 0),
    "AF_BLUETOOTH": (31, 3, 1),
    "AF_KEY": (15, 3, 2),
    "AF_CAN": (29, 3, 1),
    "AF_TIPC": (30, 2, 0),
    "AF_XDP": (44, 3, 0),
    "AF_APPLETALK": (5, 2, 0),
    "AF_VSOCK with high bits set": ((1 << 32) | 40, 1, 0),
}
ALLOWED_SOCKETS = {
    "AF_UNIX": (1, 1, 0),
    "AF_INET": (2, 1, 0),
    "AF_INET6": (10, 1, 0),
    "AF_NETLINK route": (16, 3, 0),
}

SOCKETS = r"""
import ctypes, json
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
result = {}
for name, (family, kind, proto) in CASES.items():
    # The raw syscall, so that no library check stands in the way and all 64 bits get through.
    fd = libc.syscall(41, ctypes.c_long(family), ctypes.c_long(kind), ctypes.c_long(proto))
    result[name] = "created" if fd >= 0 else ctypes.get_errno()
print(json.dumps(result))
""".replace("CASES", repr({**REFUSED_SOCKETS, **ALLOWED_SOCKETS}))


def check_sockets(stdout: str) -> None:
    """Every refused family answers EAFNOSUPPORT (or EPERM); the needed ones work."""
    result = json.loads(stdout)
    refused = {name: result[name] for name in REFUSED_SOCKETS}
    assert all(value in (errno.EAFNOSUPPORT, errno.EPERM) for value in refused.values()), refused
    assert all(result[name] == "created" for name in ALLOWED_SOCKETS), result


def inotify_hog(hold: float) -> str:
    """Code that takes every inotify instance it can, says how many, and holds them."""
    return (
        "import ctypes, time\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "fds = []\n"
        "while len(fds) < 10000 and (fd := libc.inotify_init1(0)) >= 0:\n"
        "    fds.append(fd)\n"
        "print(len(fds), ctypes.get_errno(), flush=True)\n"
        f"time.sleep({hold})\n"
    )


def inotify_probe(delay: float) -> str:
    """Code that waits, then creates one inotify instance: ``ok`` or the errno."""
    return (
        "import ctypes, time\n"
        f"time.sleep({delay})\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "print('ok' if libc.inotify_init1(0) >= 0 else ctypes.get_errno())\n"
    )


#: Writes past the working directory's size (the tests' 48 MiB default), then past its inodes.
DISK = r"""
import errno, os
try:
    with open('big', 'wb') as f:
        for _ in range(60): f.write(b'x' * 1024 * 1024)
except OSError as e:
    print(errno.errorcode[e.errno])
os.remove('big')
try:
    for i in range(5000): open(f'_f{i}', 'w').close()
except OSError as e:
    print(errno.errorcode[e.errno], i < 4096)
"""


def check_disk(stdout: str) -> None:
    """The working directory is a tmpfs of bounded size and inodes: both end in ENOSPC."""
    assert stdout == "ENOSPC\nENOSPC True\n", stdout


def processes_with(marker: str) -> list[int]:
    """Pids of the host whose command line holds ``marker``, in ascending order."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return sorted(found)


def status(pid: int) -> dict[str, str]:
    """The fields of ``/proc/<pid>/status``."""
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return dict(line.split(":\t", 1) for line in lines if ":\t" in line)


def session_traps(host: Path) -> str:
    """Code that leaves, in its session's working directory, traps for the next call's files.

    Symlinks to a host file and a host directory (the evaluator writes input files as its own
    user: root, or the user who started it), a FIFO (opening it to write would wait for a reader
    for good) and one a thread of the session holds open to read (opening it succeeds).
    """
    return (
        "import os, threading\n"
        f"os.symlink({str(host / 'victim')!r}, 'link.txt')\n"
        f"os.symlink({str(host)!r}, 'linked')\n"
        "os.mkfifo('fifo.txt')\n"
        "os.mkfifo('held.txt')\n"
        "threading.Thread(target=lambda: open('held.txt', 'rb').read(), daemon=True).start()\n"
        "os.mkdir('sub')\n"
        "print('set')\n"
    )


#: Where a later call sends a file, each into one of :func:`session_traps`'s traps.
TRAPPED_PATHS = ("link.txt", "linked/new/evil.txt", "fifo.txt", "held.txt")


def make_victim(host: Path, owner: int) -> None:
    """A host file of ``owner``'s, in a directory of theirs, that a followed symlink would reach."""
    host.mkdir(mode=0o755)
    (host / "victim").write_text("original")
    (host / "victim").chmod(0o644)
    for path in (host, host / "victim"):
        os.chown(path, owner, owner)


def check_trap_refused(path: str, answer: dict[str, Any]) -> None:
    """The call did not run: the file could not be created (Snekbox's wording)."""
    assert answer["returncode"] is None, answer
    expected = rf"\w+: Failed to create file '{re.escape(path)}'\."
    assert re.fullmatch(expected, answer["stdout"]), answer


def check_victim_untouched(host: Path, owner: int) -> None:
    """Nothing of the host changed: the file's content, mode and owner, the directory's entries."""
    info = (host / "victim").stat()
    assert (host / "victim").read_text() == "original"
    assert (stat.S_IMODE(info.st_mode), info.st_uid) == (0o644, owner)
    assert sorted(os.listdir(host)) == ["victim"]
    assert host.stat().st_uid == owner


def idle_spinners(marker: str) -> str:
    """A live session's cell that leaves a spinning thread (counting in ``ticks``) and a spinning
    child process (``child``, ``marker`` in its command line) behind, and returns once both
    spin: what an idle session may not keep burning the CPU with."""
    return (
        "import os, subprocess, sys, threading, time\n"
        "ticks = [0]\n"
        "def _spin():\n    while True:\n        ticks[0] += 1\n"
        "spinner = threading.Thread(target=_spin, daemon=True)\nspinner.start()\n"
        "code = \"open('spinning', 'w').close()\\nwhile 1: pass\"\n"
        f"child = subprocess.Popen([sys.executable, '-c', code, {marker!r}])\n"
        "while not os.path.exists('spinning') or not ticks[0]:\n    time.sleep(0.01)\n"
    )


def spinners_again(wait_for: str | None = None) -> str:
    """The next cell of :func:`idle_spinners`: once the thread counts again, whether it lives,
    the child's exit status and state (``R``: running; ``T``: stopped), ``True None R`` when
    both run again; then, with ``wait_for``, it waits for that file to be there."""
    return (
        "import os, time\n"
        "seen = ticks[0]\n"
        "while ticks[0] == seen:\n    time.sleep(0.01)\n"
        "state = open(f'/proc/{child.pid}/stat').read().rsplit(')', 1)[1].split()[0]\n"
        "print(spinner.is_alive(), child.poll(), state, flush=True)\n"
        f"while {wait_for!r} and not os.path.exists({wait_for!r}):\n    time.sleep(0.01)\n"
    )


def tree_states(pid: int) -> dict[int, str]:
    """The state (``/proc/<pid>/stat``: ``R``, ``S``, ``T``...) of ``pid`` and of every
    process below it, as far as they are there."""
    states: dict[int, str] = {}
    todo = [pid]
    while todo:
        parent = todo.pop()
        try:
            stat = Path(f"/proc/{parent}/stat").read_text()
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        states[parent] = stat.rsplit(")", 1)[1].split()[0]
        for task in tasks:
            with contextlib.suppress(OSError):
                todo += map(int, Path(f"/proc/{parent}/task/{task}/children").read_text().split())
    return states
