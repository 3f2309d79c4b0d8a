"""What the benchmarks share: loopback ports, servers started as their own processes, percentiles.

Imported as ``_common``: each benchmark runs as a script (``uv run python bench/<name>.py``),
so its own directory is first on ``sys.path``.
"""

from __future__ import annotations

import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx


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
) -> Iterator[subprocess.Popen[bytes]]:
    """``python <args>`` (this interpreter) once ``probe`` answers 200; terminated on exit.

    ``env`` is the whole environment (default: this one's); ``quiet`` discards its output.
    """
    output = subprocess.DEVNULL if quiet else None
    process = subprocess.Popen(
        [sys.executable, *args],
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
