"""What a run's output files cost the gateway: memory and event-loop stalls, before and after.

A run that writes big files used to cost the gateway their whole content: read by the
evaluator, base64-encoded, JSON-encoded, parsed and decoded on the event loop, though the
gateway only lists such files by name and size. This starts the gateway as its own process
(built-in evaluator in-process, or ``python -m evaluator`` behind ``SNEKBOX_URL``, or that
evaluator made to ignore the ``content_wanted`` request field, as the real Snekbox does), runs
the hostile calls through MCP, and prints, per call, the growth of the gateway's peak RSS
(VmHWM, reset before each call) and the worst ``/healthz`` latency seen while it ran (polled
every 10 ms). ``--against REV`` runs the same against a git revision (``git archive``, the
working tree untouched) and prints both side by side.

    uv run python bench/bench_output_files.py [--against HEAD] [--repeat 2]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from _common import free_port, python_server
from mcp import Client

ROOT = Path(__file__).resolve().parents[1]

#: The calls: (name, code).
CALLS = [
    ("print(1)", "print(1)"),
    (
        "4 sparse 11 MiB files",
        "for i in range(4):\n"
        "    with open(f'sparse_{i}.bin', 'wb') as f:\n"
        "        f.truncate(11 * 2**20)\n",
    ),
    (
        "47 MiB of random files",
        "import os\n"
        "for i in range(4):\n"
        "    with open(f'data_{i}.bin', 'wb') as f:\n"
        "        for _ in range(47):\n"
        "            f.write(os.urandom(1 << 18))\n",
    ),
]


def kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def reset_peak(pid: int) -> None:
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := VmRSS


@contextmanager
def started(args: list[str], tree: Path, env: dict[str, str], probe: str) -> Iterator[int]:
    """``python <args>`` run from ``tree`` (its code first on sys.path); yields its pid."""
    environ = {**os.environ, **env, "PYTHONPATH": str(tree)}
    with python_server(args, probe, env=environ, cwd=tree, timeout=90) as process:
        yield process.pid


@contextmanager
def stack(tree: Path, setup: str) -> Iterator[tuple[str, int, int | None]]:
    """The gateway of ``setup``; yields its URL, its pid and its evaluator's pid (if its own)."""
    limits = {"EVALUATOR_TIME_LIMIT": "60", "MCP_LOG_LEVEL": "warning", "MCP_EVAL_TIMEOUT": "90"}
    gateway_port = free_port()
    gateway_url = f"http://127.0.0.1:{gateway_port}"
    gateway_args = ["-m", "python_mcp_server", "--port", str(gateway_port)]
    if setup == "in-process":
        env = {**limits, "SNEKBOX_URL": ""}
        with started(gateway_args, tree, env, f"GET {gateway_url}/readyz") as pid:
            yield gateway_url, pid, None
        return
    port = free_port()
    module = "evaluator" if setup == "over HTTP" else "tests.snekbox_client.snekbox_like"
    evaluator_args = ["-m", module, "--port", str(port), "--log-level", "warning"]
    probe = f"OPTIONS http://127.0.0.1:{port}/eval"
    with started(evaluator_args, tree if setup == "over HTTP" else ROOT, limits, probe) as epid:
        env = {**limits, "SNEKBOX_URL": f"http://127.0.0.1:{port}"}
        with started(gateway_args, tree, env, f"GET {gateway_url}/readyz") as pid:
            yield gateway_url, pid, epid


class HealthPoller:
    """GET /healthz every 10 ms in a thread; the worst latency seen."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.worst = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> HealthPoller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        with httpx.Client(trust_env=False, timeout=60) as http:
            while not self._stop.is_set():
                started = time.perf_counter()
                http.get(f"{self.url}/healthz").raise_for_status()
                self.worst = max(self.worst, time.perf_counter() - started)
                self._stop.wait(0.01)


async def call(url: str, code: str) -> str:
    async with Client(f"{url}/mcp") as client:
        result = await client.call_tool("execute_python_code", {"code": code})
    first = result.content[0]
    return str(getattr(first, "text", ""))


def measure(tree: Path, setup: str, repeat: int) -> dict[str, tuple[float, float, float | None]]:
    """Per call: (peak RSS growth MiB, worst /healthz s, evaluator peak growth MiB or None)."""
    figures: dict[str, tuple[float, float, float | None]] = {}
    with stack(tree, setup) as (url, pid, evaluator_pid):
        asyncio.run(call(url, "print('warm-up')"))
        for name, code in CALLS:
            worst: tuple[float, float, float | None] = (0.0, 0.0, None)
            for _ in range(repeat):
                for p in (pid, evaluator_pid):
                    if p is not None:
                        reset_peak(p)
                base = kib(pid, "VmRSS")
                ebase = kib(evaluator_pid, "VmRSS") if evaluator_pid else 0
                with HealthPoller(url) as poller:
                    text = asyncio.run(call(url, code))
                growth = (kib(pid, "VmHWM") - base) / 1024
                egrowth = (kib(evaluator_pid, "VmHWM") - ebase) / 1024 if evaluator_pid else None
                worst = (
                    max(worst[0], growth),
                    max(worst[1], poller.worst),
                    None if egrowth is None else max(worst[2] or 0.0, egrowth),
                )
                if "exit code 0" not in text:
                    raise RuntimeError(f"{name} in {tree} ({setup}) did not succeed: {text[:500]}")
            figures[name] = worst
    return figures


def archive(rev: str, into: Path) -> Path:
    """The tree of ``rev``, extracted with ``git archive`` (the working tree is not touched)."""
    tar = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=tar, check=True)
    return into


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", help="a git revision to compare with (e.g. HEAD)")
    parser.add_argument("--repeat", type=int, default=1, help="calls of each kind (worst kept)")
    args = parser.parse_args()
    setups = ["in-process", "over HTTP", "Snekbox-like"]
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"now": ROOT}
        if args.against:
            trees = {args.against: archive(args.against, Path(tmp)), "now": ROOT}
        results = {
            (label, setup): measure(tree, setup, args.repeat)
            for label, tree in trees.items()
            for setup in setups
            # Before the change, the Snekbox-like evaluator is the plain one: nothing to ignore.
            if not (label != "now" and setup == "Snekbox-like")
        }
    print()
    print("gateway peak RSS growth (MiB) | worst /healthz latency (ms) | evaluator peak growth")
    notes = {
        "in-process": "the gateway with the built-in evaluator inside it",
        "over HTTP": "the gateway, SNEKBOX_URL: python -m evaluator",
        "Snekbox-like": "the same evaluator ignoring content_wanted, as Snekbox does"
        + ("; before: = over HTTP" if args.against else ""),
    }
    for setup in setups:
        print(f"\n{setup} ({notes[setup]}):")
        for name, _ in CALLS:
            cells = []
            for label in trees:
                key = (label, setup if (label == "now" or setup != "Snekbox-like") else "")
                if key not in results:
                    key = (label, "over HTTP")
                rss, latency, evaluator = results[key][name]
                extra = "" if evaluator is None else f", evaluator +{evaluator:.0f} MiB"
                cells.append(f"{label}: +{rss:5.1f} MiB, {latency * 1000:6.0f} ms{extra}")
            print(f"  {name:24} " + "   |   ".join(cells))


if __name__ == "__main__":
    main()
