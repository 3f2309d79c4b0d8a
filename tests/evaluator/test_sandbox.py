"""What code inside the sandbox can and cannot do: each test is a real run."""

from __future__ import annotations

import ast
import base64
import json
import os
import socket
import sys
import time
from pathlib import Path

import httpx
import pytest

import plotting
from evaluator import Evaluator, create_app, startup
from evaluator.launch import LAUNCHER
from tests.support import memory_is_a_cgroup, offered_v2_controllers, sandbox_home

from . import isolation
from .conftest import KILL_LIMIT, TIME_LIMIT, b64, config, run


async def test_runs_as_nobody_without_capabilities(client: httpx.AsyncClient) -> None:
    code = (
        "import os\n"
        "caps = [l.split()[1] for l in open('/proc/self/status') if l.startswith('Cap')]\n"
        "print(os.getuid(), os.getgid(), caps)"
    )
    result = await run(client, code)
    assert result["stdout"] == f"65534 65534 {['0000000000000000'] * 5}\n"


async def test_stdout_and_stderr_are_merged_in_order(client: httpx.AsyncClient) -> None:
    code = "import sys\nfor i in range(3):\n print(i)\n print(-i, file=sys.stderr)"
    result = await run(client, code)
    assert result["stdout"] == "0\n0\n1\n-1\n2\n-2\n"


async def test_exception_is_1(client: httpx.AsyncClient) -> None:
    result = await run(client, "1/0")
    assert result["returncode"] == 1
    assert result["stdout"].endswith("ZeroDivisionError: division by zero\n")


async def test_segfault_is_139(client: httpx.AsyncClient) -> None:
    result = await run(client, "import ctypes; ctypes.string_at(0)")
    assert result["returncode"] == 139


async def test_signal_is_128_plus_n(client: httpx.AsyncClient) -> None:
    result = await run(client, "import os, signal; os.kill(os.getpid(), signal.SIGUSR1)")
    assert result["returncode"] == 128 + 10


async def test_infinite_loop_is_killed_at_the_time_limit(client: httpx.AsyncClient) -> None:
    started = time.monotonic()
    code = "print('started', flush=True)\nwhile True: pass"
    result = await run(client, code, time_limit=KILL_LIMIT)
    elapsed = time.monotonic() - started
    assert result["returncode"] == 137
    assert result["stdout"] == "started\n"
    # Killed at its own limit, not left running to the service's.
    assert KILL_LIMIT <= elapsed < TIME_LIMIT


async def test_memory_bomb_is_137(client: httpx.AsyncClient) -> None:
    result = await run(client, "x = bytearray(1024 * 1024 * 1024)\nprint('survived')")
    if memory_is_a_cgroup():
        assert (result["returncode"], result["stdout"]) == (137, "")
    else:  # an ordinary user's address-space rlimit: refused, never survived
        assert result["returncode"] == 1 and "MemoryError" in str(result["stdout"])


@pytest.mark.parametrize(
    ("code", "returncode", "ended_by"),
    [
        ("print('started', flush=True)\nwhile True: pass", 137, "time_limit"),
        ("x = bytearray(2 * 1024**3)", 137, "memory_limit"),
        ("while True: print('x' * 1000)", 143, "output_limit"),
        # The same signals sent by the code itself: no limit ended it.
        ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", 137, "exit"),
        ("import os, signal; os.kill(os.getpid(), signal.SIGTERM)", 143, "exit"),
        ("1/0", 1, "exit"),
    ],
)
async def test_the_answer_says_which_limit_ended_the_run(
    client: httpx.AsyncClient, code: str, returncode: int, ended_by: str
) -> None:
    # Only the time limit's case asks for the short limit: on a loaded machine a memory bomb
    # took over 2 s to reach its cgroup's limit, and was ended by the time limit first.
    short = {"time_limit": KILL_LIMIT} if ended_by == "time_limit" else {}
    started = time.monotonic()
    result = await run(client, code, **short)
    if short:  # at its own limit, not the service's
        assert time.monotonic() - started < TIME_LIMIT
    if ended_by == "memory_limit" and not memory_is_a_cgroup():
        returncode, ended_by = 1, "exit"  # MemoryError: the code ends, no limit kills it
    if returncode == 137 and ended_by == "exit" and not memory_is_a_cgroup():
        # A SIGKILL the jail did not send may be the kernel's OOM killer's there, or the
        # code's own: the answer does not say (test_unprivileged.py).
        assert (result["returncode"], result.get("ended_by")) == (137, None), result
        return
    assert (result["returncode"], result["ended_by"]) == (returncode, ended_by)


def skip_unless_processes_are_bounded(evaluator: Evaluator) -> None:
    """The fork and thread bombs need each run's processes bounded, which an ordinary user's
    runs are not on every host (the limits in force, /readyz, say so and why)."""
    (processes,) = [limit for limit in evaluator.limits_in_force() if limit.name == "processes"]
    if not processes.enforced:
        pytest.skip(f"processes are not bounded per run here: {processes.how}")


async def test_fork_bomb_stops_at_the_pids_limit(
    evaluator: Evaluator, client: httpx.AsyncClient
) -> None:
    skip_unless_processes_are_bounded(evaluator)
    code = (
        "import os, time\n"
        "n = 0\n"
        "try:\n"
        "    while True:\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(3600); os._exit(0)\n"
        "        n += 1\n"
        "except OSError as e:\n"
        "    print(n, e.errno)"
    )
    started = time.monotonic()
    result = await run(client, code)
    forks, errno_ = map(int, result["stdout"].split())
    assert 10 < forks < 64
    assert errno_ == 11  # EAGAIN
    assert result["returncode"] == 0
    assert time.monotonic() - started < TIME_LIMIT  # the run ends, the children die with it


async def test_thread_bomb_stops_at_the_pids_limit(
    evaluator: Evaluator, client: httpx.AsyncClient
) -> None:
    skip_unless_processes_are_bounded(evaluator)
    code = (
        "import threading, time\n"
        "n = 0\n"
        "try:\n"
        "    while True:\n"
        "        threading.Thread(target=time.sleep, args=(30,), daemon=True).start(); n += 1\n"
        "except RuntimeError as e:\n"
        "    print(n, e)"
    )
    result = await run(client, code)
    count, message = result["stdout"].split(" ", 1)
    assert 10 < int(count) < 64
    assert message == "can't start new thread\n"


async def test_double_forked_daemon_is_gone_after_the_run(client: httpx.AsyncClient) -> None:
    marker = f"daemon-marker-{os.getpid()}-{time.monotonic_ns()}"
    code = (
        "import os, signal, sys, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):\n"
        "            signal.signal(s, signal.SIG_IGN)\n"
        "        os.execv(sys.executable,\n"
        f"                 [sys.executable, '-c', 'import time; time.sleep(60)', '{marker}'])\n"
        "    os._exit(0)\n"
        "time.sleep(0.5)\n"
        "print('parent done')"
    )
    result = await run(client, code)
    assert result["stdout"] == "parent done\n"
    assert not list(isolation.processes_with(marker))


async def test_output_flood_is_143(client: httpx.AsyncClient) -> None:
    result = await run(client, "while True: print('x' * 1000)")
    assert result["returncode"] == 143
    assert len(result["stdout"]) == 1_000_000


async def test_invalid_utf8_output(client: httpx.AsyncClient) -> None:
    result = await run(client, "import sys; sys.stdout.buffer.write(b'ok\\xff\\xfe')")
    assert result == {
        "stdout": "UnicodeDecodeError: invalid Unicode in output pipe",
        "returncode": None,
        "files": [],
    }


async def test_network_is_unreachable(client: httpx.AsyncClient) -> None:
    with socket.socket() as listener:  # a port of this host that is listening
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        code = (
            "import socket, time\n"
            f"for host, port in [('127.0.0.1', {port}), ('127.0.0.1', 8060), ('192.0.2.1', 80),"
            " ('10.0.0.1', 53), ('::1', 80)]:\n"
            "    t = time.monotonic()\n"
            "    try:\n"
            "        socket.create_connection((host, port), timeout=5).close()\n"
            "        print('CONNECTED')\n"
            "    except OSError as e:\n"
            "        print(host, e.errno, round(time.monotonic() - t) == 0)\n"
            "try:\n"
            "    socket.getaddrinfo('example.com', 80); print('RESOLVED')\n"
            "except socket.gaierror as e:\n"
            "    print('dns', e.errno)\n"
            "print(sorted(name for _, name in socket.if_nameindex()))"
        )
        result = await run(client, code)
    lines = result["stdout"].splitlines()
    assert "CONNECTED" not in result["stdout"] and "RESOLVED" not in result["stdout"]
    assert lines[:2] == ["127.0.0.1 111 True", "127.0.0.1 111 True"]  # ECONNREFUSED: lo is down
    assert lines[2:5] == ["192.0.2.1 101 True", "10.0.0.1 101 True", "::1 111 True"]
    assert lines[5] == "dns -3"
    assert lines[6] == "['lo']"


PROJECT = Path(__file__).resolve().parents[2]


async def test_host_files_are_invisible(client: httpx.AsyncClient) -> None:
    """Only the paths leading to the read-only binds exist; nothing else of the host shows."""
    # The interpreter, and the prelude the evaluator keeps resident.
    binds = [Path(sys.prefix), Path(sys.base_prefix), Path(plotting.RESIDENT_DIR)]
    # Every ancestor of a bind must list exactly the next component(s) towards the binds.
    expected: dict[str, set[str]] = {}
    for bind in binds:
        for parent, child in zip(bind.parents, [bind, *bind.parents], strict=False):
            if parent != Path("/"):
                expected.setdefault(str(parent), set()).add(child.name)
    hidden = [
        "/etc/shadow",
        "/etc/passwd",
        str(PROJECT / "pyproject.toml"),
        "/root/.bashrc",
        "/home/../etc",
        "/sys/fs/cgroup",
        "/usr/bin/python3",
        "/bin/sh",
    ]
    # Unless the checkout (and so the environment) lives below them.
    hidden += [top for top in ("/tmp", "/var") if top not in expected]
    # Nor what a bind holds (Debian's own interpreter: its prefix is /usr, bound whole).
    hidden = [path for path in hidden if not any(Path(path).is_relative_to(b) for b in binds)]
    code = (
        "import json, os\n"
        f"hidden = {hidden!r}\n"
        f"dirs = {sorted(expected)!r}\n"
        "print(json.dumps({'exists': [p for p in hidden if os.path.exists(p)],"
        " 'root': sorted(os.listdir('/')),"
        " 'dirs': {d: sorted(os.listdir(d)) for d in dirs}}))"
    )
    result = await run(client, code)
    seen = json.loads(result["stdout"])
    assert seen["exists"] == []
    # The working directory too: /sandbox where the environment lies under /home.
    tops = {bind.parts[1] for bind in binds} | {Path(sandbox_home()).parts[1]}
    assert seen["root"] == sorted({"dev", "home", "lib", "lib64", "proc", "usr"} | tops)
    assert seen["dirs"] == {d: sorted(children) for d, children in expected.items()}


async def test_host_environment_is_invisible(
    client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GATEWAY_SECRET_TOKEN", "s3cr3t-value")
    code = (
        "import os\n"
        "print(sorted(os.environ))\n"
        "print(b's3cr3t' in open('/proc/1/environ', 'rb').read(),"
        " b's3cr3t' in open('/proc/self/environ', 'rb').read())"
    )
    result = await run(client, code)
    names, proc = result["stdout"].splitlines()
    assert set(ast.literal_eval(names)) == {
        "HOME", "PATH", "PWD", "LANG", "PYTHONUNBUFFERED", "PYTHONIOENCODING",
        "PYTHONDONTWRITEBYTECODE", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
        "NUMEXPR_NUM_THREADS", "VECLIB_MAXIMUM_THREADS", "OPENBLAS_THREAD_TIMEOUT", "MPLBACKEND",
        "MPLCONFIGDIR", "TMPDIR",
    }  # fmt: skip
    assert proc == "False False"


async def test_host_processes_are_invisible(client: httpx.AsyncClient) -> None:
    code = "import os\nprint(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))"
    result = await run(client, code)
    assert result["stdout"] == "[1, 2]\n"  # bwrap's init and the code itself


async def test_writes_outside_the_working_directory_fail(client: httpx.AsyncClient) -> None:
    code = (
        "import os\n"
        f"for d in ['/', '/usr/lib/x86_64-linux-gnu', {sys.prefix!r}, {sys.base_prefix!r}, '/dev',"
        " '/proc', '/tmp', '/lib']:\n"
        "    try:\n"
        "        open(os.path.join(d, 'x'), 'w').close(); print(d, 'WRITTEN')\n"
        "    except OSError as e:\n"
        "        print(d, 'refused')\n"
        f"open('{sandbox_home()}/ok', 'w').close(); open('/dev/shm/ok', 'w').close()\n"
        "print('home ok')"
    )
    result = await run(client, code)
    assert "WRITTEN" not in result["stdout"]
    assert result["stdout"].endswith("home ok\n")


async def test_working_directory_size_is_bounded(client: httpx.AsyncClient) -> None:
    result = await run(client, isolation.DISK)
    isolation.check_disk(result["stdout"])


async def test_seccomp_denies_namespaces_mount_and_ptrace(client: httpx.AsyncClient) -> None:
    code = (
        "import ctypes, errno\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "print(libc.unshare(0x10000000), errno.errorcode[ctypes.get_errno()])\n"
        "print(libc.mount(b'none', b'/home', b'tmpfs', 0, None),\n"
        "      errno.errorcode[ctypes.get_errno()])\n"
        "print(libc.ptrace(0, 0, 0, 0), errno.errorcode[ctypes.get_errno()])"
    )
    result = await run(client, code)
    assert result["stdout"] == "-1 EPERM\n-1 EPERM\n-1 EPERM\n"


async def test_multiprocessing_works(client: httpx.AsyncClient) -> None:
    code = (
        "import multiprocessing as mp\n"
        "if __name__ == '__main__':\n"
        "    with mp.Pool(2) as pool: print(pool.map(abs, [-1, -2, -3]))"
    )
    result = await run(client, code)
    assert (result["stdout"], result["returncode"]) == ("[1, 2, 3]\n", 0)


async def test_numpy_pandas_matplotlib_savefig(client: httpx.AsyncClient) -> None:
    result = await run(client, _PLOT)
    assert (result["stdout"], result["returncode"]) == ("30\n", 0)
    [png] = result["files"]
    assert png["path"] == "plot.png"
    assert base64.b64decode(png["content"]).startswith(b"\x89PNG\r\n\x1a\n")


_PLOT = (
    "import numpy as np, pandas as pd, matplotlib.pyplot as plt\n"
    "df = pd.DataFrame({'x': np.arange(5), 'y': np.arange(5) ** 2})\n"
    "df.plot(x='x', y='y')\n"
    "plt.savefig('plot.png')\n"
    "print(df['y'].sum())"
)


async def test_output_files_follow_snekbox_rules(client: httpx.AsyncClient) -> None:
    code = (
        "import os\n"
        "os.makedirs('out/deep', exist_ok=True); os.makedirs('.hidden'); os.makedirs('_private')\n"
        "for p in ['a.txt', 'out/deep/b.txt', '_skipped', '.skipped', '.hidden/c', '_private/d',"
        " 'modified.txt']:\n"
        "    open(p, 'w').write(p)\n"
    )
    files = [
        {"path": "unchanged.txt", "content": b64(b"same")},
        {"path": "modified.txt", "content": b64(b"before")},
    ]
    result = await run(client, code, files=files)
    returned = {f["path"]: base64.b64decode(f["content"]) for f in result["files"]}
    assert returned == {
        "_private/d": b"_private/d",
        "a.txt": b"a.txt",
        "modified.txt": b"modified.txt",
        "out/deep/b.txt": b"out/deep/b.txt",
    }
    assert [f["path"] for f in result["files"]] == sorted(returned)
    assert all(f["size"] == len(returned[f["path"]]) for f in result["files"])


async def test_symlinks_and_fifos_never_leak(client: httpx.AsyncClient) -> None:
    code = (
        "import os\n"
        "os.symlink('/etc/shadow', 'shadow'); os.symlink('/etc/passwd', 'passwd')\n"
        f"os.symlink('/', 'root'); os.symlink({str(PROJECT / 'pyproject.toml')!r}, 'project')\n"
        "os.mkfifo('fifo'); open('real.txt', 'w').write('real')"
    )
    result = await run(client, code)
    assert [(f["path"], f["content"]) for f in result["files"]] == [("real.txt", b64(b"real"))]


async def test_at_most_100_files(client: httpx.AsyncClient) -> None:
    result = await run(client, "for i in range(150): open(f'f{i:03}', 'w').write(str(i))")
    assert [f["path"] for f in result["files"]] == [f"f{i:03}" for i in range(100)]


async def test_huge_and_sparse_files(client: httpx.AsyncClient) -> None:
    code = (
        "open('a.bin', 'wb').write(b'\\1' * 5_000_000)\n"
        "with open('b.bin', 'wb') as f: f.truncate(10**9)  # sparse: takes no space\n"
        "open('c.txt', 'w').write('c')"
    )
    result = await run(client, code)
    # In path order, until the total exceeds the working directory's size.
    assert [(f["path"], f["size"]) for f in result["files"]] == [("a.bin", 5_000_000)]


async def test_a_run_gets_only_stdin_stdout_and_stderr(client: httpx.AsyncClient) -> None:
    """Sandboxes made ahead carry a session agent's pipes (fds 5 and 6): a plain run's
    launcher closes them, so no run holds a descriptor of the service's."""
    code = "import os\nprint(sorted(int(fd) for fd in os.listdir('/proc/self/fd')))"
    for _ in range(3):  # the first may be made on demand; the next ones were made ahead
        result = await run(client, code)
        assert (result["returncode"], result["stdout"]) == (0, "[0, 1, 2, 3]\n"), result


def launcher_denied_mounts(directory: Path) -> str:
    """The launcher, its first mount in its own namespace (``_mount_workdir``'s) denied."""
    source = Path(LAUNCHER).read_text()
    first_mount = '    libc.mount("none", "/", None, _MS_REC | _MS_SLAVE, None)\n'
    assert source.index(first_mount) < source.index("def _expose")
    denied = "    raise PermissionError(1, 'mount: Operation not permitted')\n"
    launcher = directory / "_launcher.py"
    launcher.write_text(source.replace(first_mount, denied, 1))
    return str(launcher)


@pytest.mark.skipif(
    os.geteuid() == 0, reason="root mounts each tmpfs itself: no launcher enters a namespace"
)
async def test_where_a_launcher_cannot_mount_runs_go_on_and_the_limits_say_what_is_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Some hosts let bubblewrap make user namespaces but deny another program's namespace
    its mounts (an AppArmor policy on unprivileged user namespaces, say): the launchers then
    fail at their first mount, here made to. The service goes on with plain working directories,
    and its limits in force say that the working directory's size is not bounded, nor each
    run's processes where that namespace bounded them (no pids cgroup)."""
    launcher = launcher_denied_mounts(tmp_path)
    monkeypatch.setattr(startup, "place_launcher", lambda root: launcher)
    async with Evaluator(config()) as evaluator:
        transport = httpx.ASGITransport(create_app(evaluator))
        async with httpx.AsyncClient(transport=transport, base_url="http://evaluator") as http:
            result = await run(http, "print(1)")
        limits = {limit.name: limit for limit in evaluator.limits_in_force()}
    assert (result["stdout"], result["returncode"]) == ("1\n", 0), result
    assert not limits["working directory"].enforced, limits["working directory"]
    assert "plain directory" in limits["working directory"].how
    # A delegated pids cgroup bounds the processes without the launcher's namespace.
    pids = "pids" in offered_v2_controllers().split()
    assert limits["processes"].enforced is pids, limits["processes"]
    lost = "size" if pids else "size and processes"
    (said,) = [r.getMessage() for r in caplog.records if "cannot be mounted" in r.getMessage()]
    assert "Operation not permitted" in said, said
    assert f"runs go on in plain directories, their {lost} not bounded per run" in said, said
    assert "install bubblewrap" not in said, said  # they run: no advice on making them
