"""What of a warm sandbox's or live session's memory could be shared (issue 31), and how.

``bench_memory.py --only at-rest`` says what one sandbox holds at rest: its file-backed pages
(shared libraries) are shared already, through the page cache; its anonymous pages (the
objects its imports made, ~2/3 of it) are its own. This measures what would change that, with
``--count`` processes side by side:

- imports: one interpreter at rest (this environment's, the sandbox's environment variables,
  no sandbox) by what it imported first (none; numpy; numpy + matplotlib.pyplot; numpy +
  pandas; the default three), and the default three with ``PYTHONMALLOC=malloc``, with
  ``malloc_trim(0)`` after the imports, with ``gc.freeze()``;
- fork server: one parent imports the default three and forks ``--count`` children (as a
  zygote would hand each sandbox its interpreter), with and without ``gc.freeze()`` before the
  fork; each child's USS at rest, then after the first cell of ``bench_memory.py`` (imports and
  a plot), against as many interpreters each started on its own (as warm sandboxes are);
- KSM (``--ksm``; root, Linux >= 6.7: ``PR_SET_MEMORY_MERGE`` set on this process is inherited
  by what it forks and execs): an evaluator service (this tree's, ``--count`` warm sandboxes)
  started from here, so every sandbox's pages may be merged; ``--count`` live sessions started
  (a first cell each); ksmd run (``/sys/kernel/mm/ksm/run`` = 1, ``pages_to_scan`` 1000) until
  a full scan merges nothing more, or :data:`KSM_TIMEOUT`; the pages merged per sandbox, USS
  before and after, the CPU time ksmd took; then everything unmerged (``run`` = 2) and every
  KSM setting put back as it was.

    uv run python bench/bench_memory_sharing.py [--count 4] [--ksm]
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
from _common import ROOT, free_port, service_of
from bench_memory import (
    FIRST_CELL,
    Usage,
    mean,
    rollup,
    settle,
    start_session,
)

from evaluator import EvaluatorConfig
from evaluator.host import environment

DEFAULT = ("numpy", "pandas", "matplotlib.pyplot")
#: What each interpreter of the first experiment imports, and how it is started.
VARIANTS: tuple[tuple[str, tuple[str, ...], dict[str, str], tuple[str, ...]], ...] = (
    ("bare interpreter (no import)", (), {}, ()),
    ("numpy", ("numpy",), {}, ()),
    ("numpy + matplotlib.pyplot", ("numpy", "matplotlib.pyplot"), {}, ()),
    ("numpy + pandas", ("numpy", "pandas"), {}, ()),
    ("numpy + pandas + matplotlib.pyplot (the default)", DEFAULT, {}, ()),
    ("  the default, PYTHONMALLOC=malloc", DEFAULT, {"PYTHONMALLOC": "malloc"}, ()),
    ("  the default, then malloc_trim(0)", DEFAULT, {}, ("trim",)),
    ("  the default, then gc.collect() + gc.freeze()", DEFAULT, {}, ("freeze",)),
)
#: The interpreter each process runs: imports, then waits for commands on stdin ("cell": run
#: the first cell, in each child if it forked; EOF: end). It says "ready <pids>" once imported.
HOLDER = r"""
import ctypes, gc, os, sys
options, modules, children = sys.argv[1].split(","), sys.argv[2].split(","), int(sys.argv[3])
cell_code = sys.argv[4]
libc = ctypes.CDLL(None, use_errno=True)
if "matplotlib.pyplot" in modules:
    import matplotlib
    matplotlib.use("Agg")
for name in modules:
    if name:
        __import__(name)
if "trim" in options:
    libc.malloc_trim(0)
if "freeze" in options:
    gc.collect()
    gc.freeze()

def run_cell():
    import contextlib, io
    with contextlib.redirect_stdout(io.StringIO()):  # stdout is for answers
        exec(compile(cell_code, "<cell>", "exec"), {"__name__": "__main__"})

def serve(commands, answers):
    try:
        while os.read(commands, 16):
            run_cell()
            os.write(answers, b"done")
    except BaseException:
        import traceback
        traceback.print_exc()
    finally:  # a failed cell ends the child: its parent reads EOF
        os._exit(0)

links = []
for _ in range(children):
    down, up = os.pipe(), os.pipe()
    pid = os.fork()
    if pid == 0:
        for fd in (down[1], up[0], *(fd for _, *ends in links for fd in ends)):
            os.close(fd)
        serve(down[0], up[1])
    os.close(down[0])
    os.close(up[1])
    links.append((pid, down[1], up[0]))
print("ready", *([pid for pid, _, _ in links] or [os.getpid()]), flush=True)
for line in sys.stdin:
    if not links:
        run_cell()
    for _, commands, answers in links:
        os.write(commands, b"cell")
    answered = [os.read(answers, 16) for _, _, answers in links]
    print("done" if all(answered) else "failed", flush=True)
"""
#: Seconds ksmd may take to merge what it can.
KSM_TIMEOUT = 120.0
KSM = Path("/sys/kernel/mm/ksm")
PR_SET_MEMORY_MERGE = 67


class Holder:
    """A holder interpreter (:data:`HOLDER`) and the pids of the processes it holds."""

    def __init__(
        self,
        env: dict[str, str],
        cwd: str,
        modules: tuple[str, ...],
        *,
        options: tuple[str, ...] = (),
        children: int = 0,
        prefix: tuple[str, ...] = (),
    ) -> None:
        args = [",".join(options) or "-", ",".join(modules), str(children), FIRST_CELL]
        self.process = subprocess.Popen(
            [*prefix, sys.executable, "-c", HOLDER, *args],
            env=env,
            cwd=cwd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        words = self.process.stdout.readline().split()
        if not words or words[0] != "ready":
            self.close()
            raise SystemExit(f"an interpreter importing {modules} failed")
        self.pids = [int(word) for word in words[1:]]

    def cell(self) -> None:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write("cell\n")
        self.process.stdin.flush()
        if self.process.stdout.readline().strip() != "done":
            raise SystemExit("the first cell failed")

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        for pid in self.pids:  # forked children end with their parent's pipes; if not, now
            if pid != self.process.pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def sandbox_environment(home: str) -> dict[str, str]:
    """The variables a sandbox's interpreter has (numeric libraries' threads, matplotlib's
    backend and directory), with ``home`` for its working directory; its font list built."""
    env = environment(EvaluatorConfig(), home=home)
    env["PATH"] = os.pathsep.join([env["PATH"], os.environ.get("PATH", "")])
    os.makedirs(env["MPLCONFIGDIR"], exist_ok=True)
    os.makedirs(env["TMPDIR"], exist_ok=True)
    subprocess.run(
        [sys.executable, "-c", "import matplotlib.pyplot"], env=env, cwd=home, check=True
    )
    return env


def anonymous_kib(pid: int) -> int:
    with open(f"/proc/{pid}/smaps_rollup") as f:
        return next((int(line.split()[1]) for line in f if line.startswith("Anonymous:")), 0)


def imports(env: dict[str, str], home: str) -> None:
    print("one interpreter at rest, by what it imported (no sandbox; MiB)")
    print(f"{'':<52}{'RSS':>8}{'anon':>8}{'files':>8}")
    for label, modules, extra, options in VARIANTS:
        holder = Holder({**env, **extra}, home, modules, options=options)
        try:
            time.sleep(0.3)
            pid = holder.pids[0]
            usage, anonymous = rollup(pid), anonymous_kib(pid)
        finally:
            holder.close()
        files = usage.rss - anonymous
        print(f"{label:<52}{usage.rss / 1024:8.1f}{anonymous / 1024:8.1f}{files / 1024:8.1f}")


def columns(usage: Usage) -> str:
    return f"{usage.rss / 1024:8.1f}{usage.pss / 1024:8.1f}{usage.uss / 1024:8.1f}"


def fork_server(env: dict[str, str], home: str, count: int) -> None:
    print(
        f"fork server: {count} children of one parent that imported the default three, against "
        f"{count} interpreters each on its own (MiB, the mean of a process)"
    )
    print(f"{'':<44}{'at rest':>24}{'after the first cell':>24}")
    print(f"{'':<44}" + f"{'RSS':>8}{'PSS':>8}{'USS':>8}" * 2)
    ways: tuple[tuple[str, tuple[str, ...], int], ...] = (
        ("each its own interpreter (today)", (), 0),
        ("children of a fork server", (), count),
        ("children of a fork server, gc.freeze()", ("freeze",), count),
    )
    for label, options, children in ways:
        with ExitStack() as stack:
            holders = [
                Holder(env, home, DEFAULT, options=options, children=children)
                for _ in range(1 if children else count)
            ]
            for holder in holders:
                stack.callback(holder.close)
            pids = [pid for holder in holders for pid in holder.pids]
            time.sleep(0.5)
            at_rest = mean([rollup(pid) for pid in pids])
            for holder in holders:
                holder.cell()
            time.sleep(0.5)
            after = mean([rollup(pid) for pid in pids])
            parent = rollup(holders[0].process.pid) if children else None
        print(f"{label:<44}{columns(at_rest)}{columns(after)}")
        if parent is not None:
            print(f"{'  (the parent itself, at the end)':<44}{columns(parent)}")


@contextmanager
def ksm_running() -> Iterator[None]:
    """ksmd running, fast; afterwards every page unmerged and its settings as they were."""
    names = ("run", "pages_to_scan", "sleep_millisecs")
    saved = {name: (KSM / name).read_text().strip() for name in names}
    try:
        (KSM / "pages_to_scan").write_text("1000")
        (KSM / "sleep_millisecs").write_text("20")
        (KSM / "run").write_text("1")
        yield
    finally:
        (KSM / "run").write_text("2")  # unmerge everything it merged
        deadline = time.monotonic() + 30
        while ksm_value("pages_sharing") and time.monotonic() < deadline:
            time.sleep(0.2)
        for name in ("pages_to_scan", "sleep_millisecs", "run"):
            (KSM / name).write_text(saved[name])


def ksm_value(name: str) -> int:
    return int((KSM / name).read_text())


def ksmd_ticks() -> int:
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if Path(f"/proc/{pid}/comm").read_text().strip() == "ksmd":
                    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                    return int(fields[11]) + int(fields[12])
            except OSError:
                continue
    return 0


def merging_kib(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/ksm_merging_pages").read_text()) * (
            os.sysconf("SC_PAGE_SIZE") // 1024
        )
    except (OSError, ValueError):
        return 0


@dataclass
class KsmResult:
    kind: str
    before: Usage
    after: Usage
    merged: int  # KiB


def ksm(count: int, env: dict[str, str], home: str) -> None:
    if os.geteuid() != 0 or not (KSM / "run").exists():
        raise SystemExit("--ksm needs root and /sys/kernel/mm/ksm")
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_MEMORY_MERGE, 1, 0, 0, 0) != 0:
        raise SystemExit(f"prctl(PR_SET_MEMORY_MERGE): {os.strerror(ctypes.get_errno())}")
    print(
        f"KSM: {count} warm sandboxes and {count} live sessions of an evaluator, {count} plain "
        f"interpreters importing the default three, {count} more without ASLR and with a fixed "
        "hash seed; every page mergeable (MiB, the mean of a python process)"
    )
    port = free_port()
    with ExitStack() as stack:
        p = stack.enter_context(
            service_of(ROOT, "evaluator", port, env={"EVALUATOR_WARM_SANDBOXES": str(count)})
        )
        url = f"http://127.0.0.1:{port}"
        httpx.post(f"{url}/eval", json={"input": "print(1)"}, timeout=60, trust_env=False)
        settle(p.pid, count, 0)
        for i in range(count):
            start_session(url, f"bench-memory-ksm-{i}")
        warm, live = settle(p.pid, count, count)
        if "ksm_merge_any: yes" not in Path(f"/proc/{warm[0]}/ksm_stat").read_text():
            raise SystemExit("the sandboxes did not inherit PR_SET_MEMORY_MERGE")
        groups = {"warm sandbox": warm, "live session": live}
        for label, prefix, extra in (
            ("plain interpreter", (), {}),
            ("  setarch -R, PYTHONHASHSEED=0", ("setarch", "-R"), {"PYTHONHASHSEED": "0"}),
        ):
            holders = [Holder({**env, **extra}, home, DEFAULT, prefix=prefix) for _ in range(count)]
            for holder in holders:
                stack.callback(holder.close)
            groups[label] = [pid for holder in holders for pid in holder.pids]
        pids = [pid for group in groups.values() for pid in group]
        before = {pid: rollup(pid) for pid in pids}
        ticks, started = ksmd_ticks(), time.monotonic()
        with ksm_running():
            scans, sharing = ksm_value("full_scans"), -1
            while time.monotonic() - started < KSM_TIMEOUT:
                time.sleep(0.5)
                if ksm_value("full_scans") >= scans + 2:  # a scan that merged nothing more
                    now = ksm_value("pages_sharing")
                    if now == sharing:
                        break
                    scans, sharing = ksm_value("full_scans"), now
            seconds = time.monotonic() - started
            after = {pid: rollup(pid) for pid in pids}
            merged = {pid: merging_kib(pid) for pid in pids}
            profit = ksm_value("general_profit") if (KSM / "general_profit").exists() else 0
            cpu = (ksmd_ticks() - ticks) / os.sysconf("SC_CLK_TCK")
    print(f"{'':<36}{'USS before':>11}{'USS after':>11}{'PSS after':>11}{'merged':>9}")
    for kind, group in groups.items():
        b = mean([before[pid] for pid in group])
        a = mean([after[pid] for pid in group])
        m = sum(merged[pid] for pid in group) / len(group) / 1024
        print(f"{kind:<36}{b.uss / 1024:11.1f}{a.uss / 1024:11.1f}{a.pss / 1024:11.1f}{m:9.1f}")
    print(
        f"  ksmd: {seconds:.0f} s, {cpu:.1f} s of CPU; general_profit {profit / 2**20:.1f} MiB; "
        "everything unmerged and the KSM settings restored after"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=4, help="processes side by side (4)")
    parser.add_argument("--ksm", action="store_true", help="also the KSM experiment (root)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-memory-sharing-") as home:
        env = sandbox_environment(home)
        imports(env, home)
        fork_server(env, home, args.count)
        if args.ksm:
            ksm(args.count, env, home)


if __name__ == "__main__":
    main()
