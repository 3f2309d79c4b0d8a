"""What the benchmarks share: loopback ports, servers started as their own processes, percentiles,
the gateway or evaluator of another checkout (a "before"), process trees and their memory.

Imported as ``_common``: each benchmark runs as a script (``uv run python bench/<name>.py``),
so its own directory is first on ``sys.path``.
"""

from __future__ import annotations

import asyncio
import os
import random
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import httpx

#: The repository: the "after" of every before/after comparison.
ROOT = Path(__file__).resolve().parents[1]

T = TypeVar("T")


def free_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def percentile(samples: list[float], q: int) -> float:
    """The ``q``-th percentile (1 to 100; 100 is the maximum), interpolated between samples."""
    if q >= 100:
        return max(samples)
    if len(samples) == 1:  # statistics.quantiles needs two
        return samples[0]
    return statistics.quantiles(samples, n=100, method="inclusive")[q - 1]


def rounds(ways: Sequence[T], n: int) -> Iterator[list[T]]:
    """``n`` rounds of every way, each round in a new order (seeded: runs of one ``n`` alike).

    Not a rotation: with one, each way always follows the same other way, and a call's cost
    may depend on the call before it (a one-shot's sandbox is disposed of and made again as
    the next call runs), so that one way would pay for another.
    """
    order = random.Random(n)
    for _ in range(n):
        yield order.sample(ways, len(ways))


def wait_ready(process: subprocess.Popen[Any], probe: str, *, timeout: float = 60) -> None:
    """Poll ``probe`` ("METHOD URL") until it answers 200; fail if ``process`` exits or stalls."""
    method, url = probe.split(" ", 1)
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args!r} exited with {process.returncode}")
        try:
            if httpx.request(method, url, trust_env=False).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{process.args!r} did not answer {probe} within {timeout:g} s")
        time.sleep(0.05)


@contextmanager
def python_server(
    args: list[str],
    probe: str,
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    quiet: bool = False,
    timeout: float = 60,
    python: str | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """``python <args>`` (this interpreter) once ``probe`` answers 200; terminated on exit.

    ``env`` is the whole environment (default: this one's); ``quiet`` discards its output;
    ``python``: another interpreter (another environment's).
    """
    output = subprocess.DEVNULL if quiet else None
    process = subprocess.Popen(
        [python or sys.executable, *args],
        cwd=cwd,
        env=dict(os.environ if env is None else env),
        stdin=subprocess.DEVNULL,
        stdout=output,
        stderr=output,
    )
    try:
        wait_ready(process, probe, timeout=timeout)
        yield process
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextmanager
def service_of(
    checkout: Path,
    module: str,
    port: int,
    *,
    env: Mapping[str, str] | None = None,
    timeout: float = 90,
    python: str | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """``python -m <module>`` (``python_mcp_server`` or ``evaluator``) of ``checkout``, quiet.

    Its code comes first on ``sys.path`` (run from ``checkout``, with ``PYTHONPATH`` set), so a
    git worktree of an older commit (``git worktree add /tmp/bench-before <commit>``) runs its
    own code with this environment's interpreter and packages (``python``: another's). The
    gateway gets the built-in evaluator and no token (``SNEKBOX_URL``, ``MCP_AUTH_TOKEN*``
    cleared), ``MCP_LOG_LEVEL`` warning; ``env`` is added.
    Ready once ``/readyz`` (gateway) or ``OPTIONS /eval`` (evaluator) answers 200.
    """
    environ = {**os.environ, "PYTHONPATH": str(checkout), "MCP_LOG_LEVEL": "warning"}
    for name in ("SNEKBOX_URL", "MCP_AUTH_TOKEN", "MCP_AUTH_TOKEN_FILE"):
        environ.pop(name, None)
    environ |= env or {}
    url = f"http://127.0.0.1:{port}"
    if module == "evaluator":
        args = ["-m", "evaluator", "--port", str(port), "--log-level", "warning"]
        probe = f"OPTIONS {url}/eval"
    else:
        args = ["-m", module, "--host", "127.0.0.1", "--port", str(port)]
        probe = f"GET {url}/readyz"
    with python_server(
        args, probe, env=environ, cwd=checkout, quiet=True, timeout=timeout, python=python
    ) as p:
        yield p


def before_checkout(path: str | None) -> Path | None:
    """The "before" checkout given on the command line, checked to hold the project."""
    if path is None:
        return None
    checkout = Path(path).resolve()
    if not (checkout / "python_mcp_server.py").is_file():
        raise SystemExit(
            f"{checkout} is not a checkout of the project: make one with "
            f"`git worktree add {checkout} <commit>`"
        )
    return checkout


# --- Process trees ------------------------------------------------------------------------------


def status_kib(pid: int, field_name: str) -> int:
    """A ``/proc/<pid>/status`` field in KiB (``VmRSS``, ``VmHWM``); 0 once the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children of all its threads, recursively), at this moment."""
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        try:
            for task in os.listdir(f"/proc/{parent}/task"):
                with open(f"/proc/{parent}/task/{task}/children") as f:
                    children = [int(c) for c in f.read().split()]
                found += children
                todo += children
        except (FileNotFoundError, ProcessLookupError):
            continue
    return found


def cpu_ns(pid: int) -> int:
    """The CPU time all of ``pid``'s threads have used, in nanoseconds (alive ones): finer than
    :func:`cpu_ticks`, for a window of a few milliseconds."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


def cpu_ticks(pids: list[int]) -> int:
    """The CPU time (user + system, clock ticks) ``pids`` have used, those alive now."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return total


async def settle(*, below: float = 0.25, window: float = 0.5, most: float = 20.0) -> None:
    """Wait until the machine keeps fewer than ``below`` CPUs busy over a ``window`` (the
    evaluators have made their warm sandboxes again), ``most`` seconds at the most.

    A phase that starts while the previous one's sandboxes are still being made would pay for
    them: the plot benches call this before each phase or call, so that each way finds its
    service as the way before left it, refilled.
    """
    started = time.monotonic()
    while time.monotonic() - started < most:
        busy, at = machine_busy(), time.monotonic()
        await asyncio.sleep(window)
        if (machine_busy() - busy) / (time.monotonic() - at) < below:
            return


def machine_busy() -> float:
    """The CPU time the whole machine has been busy so far, in seconds (``/proc/stat``).

    Two readings give the CPUs kept busy between them: ``(busy2 - busy1) / elapsed``.
    """
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:8]]  # user .. softirq
    del values[3:5]  # idle, iowait
    return sum(values) / os.sysconf("SC_CLK_TCK")
