"""The evaluator on a cgroup v2 host: limits by a delegated cgroup v2 subtree, and isolation.

The machines this suite usually runs on are cgroup v1, so it skips there. ``.ci/vm-test`` boots a
cgroup v2 VM and runs it with ``EVALUATOR_REQUIRE_CGROUP_V2=1`` twice: as an ordinary user in a
delegated ``systemd-run --user --scope``, and as root in a delegated system scope (the container
case); a missing delegation then fails instead of skipping.

The VM is emulated (qemu TCG, about 12 times slower than the host, on a shared machine), so the
limits here are generous: only the time-limit test has a short one. The checks are the promises
of the README: memory (137, not MemoryError), processes, the working directory's size, time;
no host root, capability, network or file; and one gateway call returning a figure.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import secrets
import socket
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest
from mcp.types import ImageContent
from PIL import Image

import plotting
from evaluator import Evaluator, procfs, run_cgroup
from evaluator.config import MiB
from python_mcp_server import Settings, create_app
from snekbox_client import EvalRequest, EvalResult
from tests.gateway.conftest import with_time_limit
from tests.support import connect, offered_v2_controllers, serve, text_of

from . import isolation
from .conftest import config

REQUIRED = os.environ.get("EVALUATOR_REQUIRE_CGROUP_V2") == "1"
CGROUP_ROOT = Path("/sys/fs/cgroup")
OFFERED = offered_v2_controllers()


pytestmark = [
    pytest.mark.anyio,
    pytest.mark.timeout(600),
    pytest.mark.skipif(
        not REQUIRED and not {"memory", "pids"} <= set(OFFERED.split()),
        reason=f"no delegated cgroup v2 with memory and pids here (offered: {OFFERED!r})",
    ),
]
PROJECT = Path(__file__).resolve().parents[2]
#: Far above what any run here needs, even emulated.
TIME_LIMIT = 60.0
#: The time-limit test's limits, tried in turn until one gave the emulated interpreter time
#: to start and fork: about a second on a quiet host, but 10 s was once not enough with the
#: host's cores busy (a CPU hog, under TCG). A fixed 30 s made each mode wait 30 s.
KILL_LIMITS = (5.0, 15.0, 45.0)


@pytest.fixture(scope="module")
async def evaluator() -> AsyncIterator[Evaluator]:
    async with Evaluator(config(time_limit=TIME_LIMIT)) as started:
        yield started


async def run(evaluator: Evaluator, code: str, *args: str) -> EvalResult:
    return await evaluator.run(EvalRequest(args=("-c", code, *args)))


# --- limits ------------------------------------------------------------------------------------


async def test_memory_and_processes_are_cgroup_v2_limits(evaluator: Evaluator) -> None:
    limits = {limit.name: limit for limit in evaluator.limits_in_force()}
    assert limits["memory"].enforced
    assert limits["memory"].how == "384 MiB: cgroup v2 memory.max, memory.swap.max=0"
    assert limits["processes"].enforced
    assert limits["processes"].how.startswith("64: cgroup v2 pids.max"), limits["processes"]


async def test_a_run_has_its_own_cgroup_below_the_service_and_an_unprivileged_uid(
    evaluator: Evaluator,
) -> None:
    marker = "marker-" + secrets.token_hex(8)
    task = asyncio.ensure_future(run(evaluator, "import time; time.sleep(50)", marker))
    try:
        with anyio.fail_after(30):
            while len(pids := isolation.processes_with(marker)) < 3:  # noqa: ASYNC110 - bwrap, init, code
                await asyncio.sleep(0.05)
        code = pids[-1]
        cgroup = _cgroup_of(code)
        assert (cgroup / "memory.max").read_text() == f"{evaluator.config.memory_limit * MiB}\n"
        assert (cgroup / "memory.swap.max").read_text() == "0\n"
        assert (cgroup / "pids.max").read_text() == "64\n"
        assert cgroup.parent.name == evaluator.config.cgroup_name
        assert cgroup.parent.parent == _service_cgroup(), cgroup
        status = isolation.status(code)
        uids = {int(u) for u in status["Uid"].split()}
        if os.geteuid() == 0:  # a host uid of its own
            assert len(uids) == 1 and min(uids) >= evaluator.config.sandbox_uid, status["Uid"]
        else:  # the service's own uid, never more
            assert uids == {os.getuid()}, status["Uid"]
        assert int(status["CapEff"], 16) == 0 and int(status["CapPrm"], 16) == 0
        assert status["NoNewPrivs"].strip() == "1"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_memory_bomb_is_killed_by_the_cgroup_oom_killer(evaluator: Evaluator) -> None:
    """137 (SIGKILL by the OOM killer of the run's cgroup), not a MemoryError."""
    runs = _service_cgroup() / evaluator.config.cgroup_name
    before = _oom_kills(runs)
    result = await run(evaluator, "x = bytearray(1024**3)\nprint('survived')")
    assert (result.returncode, result.stdout, result.ended_by) == (137, "", "memory_limit")
    assert _oom_kills(runs) > before, "the kill was not the cgroup's OOM killer"


async def test_a_fork_bomb_stops_at_pids_max(evaluator: Evaluator) -> None:
    code = (
        "import os, time\n"
        "n = 0\n"
        "try:\n"
        "    while True:\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(30); os._exit(0)\n"
        "        n += 1\n"
        "except OSError as e:\n"
        "    print(n, e.errno)"
    )
    result = await run(evaluator, code)
    assert result.returncode == 0, result.stdout
    forks, errno_ = map(int, result.stdout.split())
    assert 10 < forks < 64
    assert errno_ == 11  # EAGAIN


async def test_the_working_directory_is_a_bounded_tmpfs(evaluator: Evaluator) -> None:
    """Mounted by the service as root, by the run's launcher in a user namespace otherwise."""
    limits = {limit.name: limit for limit in evaluator.limits_in_force()}
    assert limits["working directory"].enforced, limits["working directory"]
    result = await run(evaluator, isolation.DISK)
    assert result.returncode == 0, result.stdout
    isolation.check_disk(result.stdout)


async def test_a_run_is_killed_at_the_time_limit() -> None:
    """The whole tree, a child that ignores signals included: "started" is printed only once
    the child ignores SIGTERM, so a limit that ended the run before is tried again longer."""
    code = (
        "import os, signal, time\n"
        "r, w = os.pipe()\n"
        "if os.fork() == 0:\n"
        "    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "    os.write(w, b'1')\n"
        "    time.sleep(1000)\n"
        "os.close(w)\n"
        "if os.read(r, 1):\n"
        "    print('started', flush=True)\n"
        "time.sleep(1000)\n"
    )
    for limit in KILL_LIMITS:
        async with Evaluator(config(time_limit=limit, concurrency=1)) as short:
            started = time.monotonic()
            result = await run(short, code)
            elapsed = time.monotonic() - started
        if "started" in result.stdout:
            break
    assert (result.returncode, result.stdout, result.ended_by) == (137, "started\n", "time_limit")
    assert limit <= elapsed < limit + 30


async def test_a_sandbox_made_ahead_waits_idle_and_its_run_does_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where the service may undo it (root, with the cpu controller), a warm sandbox waits
    under SCHED_IDLE (see evaluator.run_cgroup); every thread of the code runs under
    SCHED_OTHER, read from cgroup.threads here."""
    monkeypatch.setattr(run_cgroup, "IDLE_AT_MOST", 3600.0)  # however slow the emulation
    code = (
        "import os\n"
        "print(sorted({os.sched_getscheduler(int(t)) for t in os.listdir('/proc/self/task')}))"
    )
    settings = config(time_limit=TIME_LIMIT, warm_sandboxes=1, preimport=("json",))
    async with Evaluator(settings) as ev:
        with anyio.fail_after(500):  # warming starts once the service has started
            while ev.warm_sandboxes < 1:  # noqa: ASYNC110 - nothing to wait on
                await asyncio.sleep(0.1)
        assert ev._pool is not None and ev._pool._full is not None
        idle = ev._cgroups.cpu is not None and procfs.may_leave_idle()
        waiting = ev._pool._full.waiting[0]
        assert waiting.cgroup is not None
        policies = {os.sched_getscheduler(pid) for pid in waiting.cgroup.pids()}
        assert policies == {os.SCHED_IDLE if idle else os.SCHED_OTHER}, (idle, policies)
        result = await run(ev, code)
        assert ev.warm_runs == 1
    assert result.stdout == f"[{os.SCHED_OTHER}]\n", result


# --- isolation ---------------------------------------------------------------------------------


async def test_no_host_root_capability_sysctl_or_root_only_file(evaluator: Evaluator) -> None:
    result = await run(evaluator, isolation.IDENTITY)
    assert result.returncode == 0, result.stdout
    isolation.check_identity(result.stdout)


async def test_only_the_needed_socket_families(evaluator: Evaluator) -> None:
    result = await run(evaluator, isolation.SOCKETS)
    assert result.returncode == 0, result.stdout
    isolation.check_sockets(result.stdout)


async def test_no_network(evaluator: Evaluator) -> None:
    with socket.socket() as listener:  # a port of this host that is listening
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        code = (
            "import socket\n"
            f"for host, port in [('127.0.0.1', {port}), ('192.0.2.1', 80), ('::1', 80)]:\n"
            "    try:\n"
            "        socket.create_connection((host, port), timeout=5).close()\n"
            "        print('CONNECTED')\n"
            "    except OSError as e:\n"
            "        print(host, e.errno)\n"
            "try:\n"
            "    socket.getaddrinfo('example.com', 80); print('RESOLVED')\n"
            "except socket.gaierror as e:\n"
            "    print('dns', e.errno)\n"
            "print(sorted(name for _, name in socket.if_nameindex()))"
        )
        result = await run(evaluator, code)
    assert result.stdout.splitlines() == [
        "127.0.0.1 111",  # ECONNREFUSED: the sandbox's own loopback, down
        "192.0.2.1 101",  # ENETUNREACH
        "::1 111",
        "dns -3",
        "['lo']",
    ]


async def test_no_host_files(evaluator: Evaluator) -> None:
    """Nothing of the host but the interpreter, its environment and the system libraries (and
    the prelude the evaluator keeps resident)."""
    binds = [Path(sys.prefix), Path(sys.base_prefix), Path(plotting.RESIDENT_DIR)]
    # The directories on the way to a bind hold only the next step towards it.
    on_the_way: dict[str, set[str]] = {}
    for bind in binds:
        for parent, child in zip(bind.parents, [bind, *bind.parents], strict=False):
            if parent != Path("/"):
                on_the_way.setdefault(str(parent), set()).add(child.name)
    hidden = [
        "/etc",
        "/root",
        "/var",
        "/tmp",
        "/run",
        "/sys/fs/cgroup",
        "/mnt",
        str(PROJECT / "pyproject.toml"),
        str(Path.home()),
        # The rest of /usr: programs, shells, data.
        "/usr/bin/sh",
        "/usr/bin/bash",
        "/usr/bin/env",
        "/usr/sbin",
        "/usr/share",
        "/usr/local/bin",
    ]
    hidden = [p for p in hidden if p not in on_the_way and not any(b == Path(p) for b in binds)]
    code = (
        "import json, os\n"
        f"hidden = {hidden!r}\n"
        f"dirs = {sorted(on_the_way)!r}\n"
        "print(json.dumps({'exists': [p for p in hidden if os.path.lexists(p)],"
        " 'root': sorted(os.listdir('/')),"
        " 'dirs': {d: sorted(os.listdir(d)) for d in dirs}}))"
    )
    result = await run(evaluator, code)
    assert result.returncode == 0, result.stdout
    seen = json.loads(result.stdout)
    tops = {bind.parts[1] for bind in binds}
    assert seen["root"] == sorted({"dev", "home", "lib", "lib64", "proc", "usr"} | tops)
    assert seen["dirs"] == {d: sorted(children) for d, children in on_the_way.items()}
    assert seen["exists"] == [], f"host paths visible in the sandbox: {seen['exists']}"


# --- the gateway -------------------------------------------------------------------------------

FIGURE = """
import matplotlib.pyplot as plt
plt.figure(figsize=(3, 2)); plt.plot([1, 3, 2])
print("drawn")
"""


async def test_the_gateway_returns_a_figure() -> None:
    """One tool call through the mcp SDK's client over Streamable HTTP, the gateway under
    uvicorn with the built-in evaluator in-process."""
    settings = with_time_limit(Settings(), 240)
    with serve(create_app(settings)) as url:
        with anyio.fail_after(300):
            async with connect(url, "http") as client:
                result = await client.call_tool("execute_python_code", {"code": FIGURE})
    text = text_of(result)
    assert not result.is_error, text
    # "in", not "startswith": a call made while the evaluator still builds its matplotlib font
    # list (emulated, for half a minute after start) gets matplotlib's "building the font cache"
    # line first.
    assert "drawn\n" in text, text
    [image] = [c for c in result.content if isinstance(c, ImageContent)]
    data = base64.b64decode(image.data)
    with Image.open(io.BytesIO(data)) as png:
        png.verify()
        assert png.size == (300, 200)
    assert result.structured_content["status"] == "ok"


# --- helpers -----------------------------------------------------------------------------------


def _cgroup_of(pid: int) -> Path:
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        if line.startswith("0::"):
            return CGROUP_ROOT / line[3:].lstrip("/")
    raise AssertionError(f"process {pid} is in no cgroup v2")


def _service_cgroup() -> Path:
    """The delegated cgroup the evaluator uses: its own, or the parent of the leaf it moved to."""
    own = _cgroup_of(os.getpid())
    return own.parent if own.name == "service" else own


def _oom_kills(cgroup: Path) -> int:
    """The ``oom_kill`` count of ``memory.events``: hierarchical, so the runs' are included."""
    events = dict(line.split() for line in (cgroup / "memory.events").read_text().splitlines())
    return int(events["oom_kill"])
