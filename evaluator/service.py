"""The evaluation service: checks the sandbox, runs requests in it, a bounded number at once.

Each run takes a sandbox prepared ahead of time from the pool (see :mod:`.pool`), which disposes
of it after the answer is produced, always; :meth:`Evaluator.aclose` waits for all of it. A run
that is cancelled (its caller gave up, or its HTTP client went away) has its process tree killed
at once and its sandbox disposed of, and the cancellation goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import fcntl
import json
import logging
import os
import secrets
import shutil
import signal
import stat
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import replace
from pathlib import Path
from types import TracebackType

from snekbox_client import EndedBy, EvalRequest, EvalResult, Python, ServiceInfo

from . import bytecode, limits, seccomp
from .cgroups import Cgroups, RunCgroup
from .config import EvaluatorConfig, MiB
from .errors import InvalidExecutable, QueueFull, SandboxUnavailable, SessionNotFound
from .host import (
    HOME,
    MPLCONFIGDIR,
    WHAT_TO_DO,
    check_prerequisites,
    environment,
    interpreter_paths,
    sandbox_view,
)
from .jail import INVALID_UTF8, Outcome, SandboxView, decode_output
from .live import LiveSessions
from .models import Limit
from .packages import (
    IN_SANDBOX,
    MARKER,
    Layer,
    PackageCache,
    PackageRefused,
    Policy,
    default_root,
    link_layer,
    remove_tree,
)
from .pool import Sandbox, SandboxPool
from .pythons import Interpreter, find_uv, interpreters
from .users import RunUsers, covers
from .watchdog import MemInfo, MemoryEnded, MemoryWatchdog, read_meminfo
from .workdir import CollectError, Workdir, WorkdirRoot, WriteError

__all__ = ["Evaluator"]

log = logging.getLogger(__name__)

_PR_SET_CHILD_SUBREAPER = 36
# The warm agent, bound read-only into its sandbox: the sandbox binds only the interpreter's
# environment, where this package may not be (a checkout run with uv run).
_AGENT = Path(__file__).with_name("_agent.py")
_AGENT_IN_SANDBOX = "/run/evaluator/agent.py"
_PROBE = "import sys; print('ok')"
#: Seconds the start-up check run may take, whatever the runs' limit: it needs ~50 ms, but a
#: busy host (load 10-27 on 2 cores was seen) must not be taken for a missing sandbox.
_PROBE_TIME_LIMIT = 60.0
# How the launcher's own failures begin (_launcher.py).
_LAUNCH_FAILED = "the sandbox could not start"
# Builds matplotlib's font list once, so that runs do not rebuild it (~150 ms each).
_FONTLIST = "import matplotlib.font_manager"
# In the package cache: each evaluator's directory of its sandboxes' layer directories.
_SANDBOXES = ".sandboxes"


class _HostTooBusy(SandboxUnavailable):
    """The start-up check run was killed at its time limit twice: the host is too busy."""


class Evaluator:
    """Runs Python code in a bubblewrap sandbox, with Snekbox's semantics.

    Usage::

        evaluator = Evaluator(EvaluatorConfig())
        await evaluator.start()
        result = await evaluator.run(EvalRequest(args=("-c", "print(1)")))
        await evaluator.aclose()

    :meth:`start` makes this process a child subreaper (``PR_SET_CHILD_SUBREAPER``) so that it
    collects the sandbox processes orphaned by a kill.

    ``meminfo`` reads the host's memory for the memory watchdog (see :mod:`.watchdog`); tests
    inject a low reading through it.
    """

    def __init__(
        self,
        config: EvaluatorConfig | None = None,
        *,
        meminfo: Callable[[], MemInfo] = read_meminfo,
    ) -> None:
        self.config = config or EvaluatorConfig()
        # Live sessions at once, derived at start from what is enforced (see session_limit).
        self._session_limit: int | None = None
        self._meminfo = meminfo
        self._watchdog: MemoryWatchdog | None = None
        self._memory_ended = MemoryEnded()
        self._started = False
        self._closing = False
        self._slots = asyncio.Semaphore(self.config.concurrency)
        self._waiting = 0
        self._running = 0
        # When the last run ended (see SandboxPool.start_warming); none yet: idle since ever.
        self._idle_since = float("-inf")
        self._pool: SandboxPool | None = None
        self._live: LiveSessions | None = None
        self._fontlist_task: asyncio.Task[None] | None = None
        self._bytecode_task: asyncio.Future[None] | None = None
        self._root: WorkdirRoot | None = None
        self._cgroups = Cgroups({}, None)
        self._users = RunUsers(None, 0)
        self._seccomp: bytes | None = None
        self._seccomp_reason = "disabled by configuration"
        self._view: SandboxView | None = None
        self._nproc: int | None = None
        self._fontlist: tuple[str, str] | None = None
        self._empty_file: str | None = None
        self._agent_file = ""
        self._pythons: tuple[Interpreter, ...] = ()
        self._packages: PackageCache | None = None
        self._packages_off = "turned off by configuration (EVALUATOR_PACKAGES=off)"
        # The preinstalled set of each interpreter but the default (python_packages).
        self._preinstalls: list[asyncio.Task[Layer | None]] = []
        self._preinstalling: dict[str, asyncio.Task[Layer | None]] = {}
        self._sandbox_layers = Path("/nonexistent")  # this evaluator's, in the package cache
        self._sandbox_layers_lock: int | None = None  # held while it lives (see _sweep)
        # Top-level names the default interpreter can import (see _fits_warm), and the names
        # each layer provides.
        self._importable: frozenset[str] | None = None  # None: not known
        self._python_binds: dict[str, tuple[str, ...]] = {}  # the other interpreters' paths
        self._provided: dict[str, frozenset[str]] = {}

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
                in the sandbox failed, or did not finish twice (a busy host); the message
                names the cause and says what to do.
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
        uv = find_uv(config.uv)
        self._pythons = await asyncio.to_thread(interpreters, config.executable, config.pythons, uv)
        if not config.unsandboxed:
            check_prerequisites(config.bwrap)
            # Bound only into the sandboxes that run them: each sees its own interpreter.
            self._python_binds = {
                p.path: interpreter_paths(p.path) for p in self._pythons if not p.default
            }
            others = [path for paths in self._python_binds.values() for path in paths]
            self._view = sandbox_view(config, others)
            if self._view.home != HOME:
                log.info(
                    "the working directory inside the sandbox is %s: the interpreter lies "
                    "under %s, where it is bound read-only",
                    self._view.home,
                    HOME,
                )
        self._users = RunUsers.for_service(config.sandbox_uid, config.sandbox_uids)
        self._packages = self._package_cache(uv)
        if self._packages is not None:
            self._importable = await asyncio.to_thread(_importable, config.executable)
        self._cgroups = Cgroups.detect(
            config.cgroup_name, config.memory_limit * MiB, config.pids_limit, config.cpu_limit
        )
        swept = self._cgroups.sweep()
        if swept:
            log.info("removed %d cgroups left by a previous evaluator", swept)
        session_bytes = limits.session_bytes(config, self._cgroups)
        self._session_limit = min(config.sessions_within(session_bytes), 100_000)
        self._root = WorkdirRoot.create(config.workdir_root)
        # Not root: each run's launcher mounts its size-bounded tmpfs, in a user namespace.
        self._root.launchers_mount = not self._root.can_mount and not config.unsandboxed
        # In the private directory, which every sandbox user can reach (the package may lie
        # below one it cannot, /root).
        agent = self._root.path / "agent.py"
        agent.write_bytes(_AGENT.read_bytes())
        agent.chmod(0o444)
        self._agent_file = str(agent)
        empty = self._root.path / "empty"
        empty.touch(0o444)
        self._empty_file = str(empty)
        if config.seccomp and not config.unsandboxed:
            reason = seccomp.unavailable_reason()
            if reason is None:
                self._seccomp = seccomp.compile_filter(shared_user=not self._users.dropping)
            else:
                self._seccomp_reason = reason
        _libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        self._started = True
        try:
            pool = await self._start_pool()
        except BaseException:
            await self.aclose()
            raise
        for limit in self.limits_in_force():
            log.log(logging.INFO if limit.enforced else logging.WARNING, "limit %s", limit)
        log.info(
            "live sessions: at most %d%s, each counted at %d MiB (%s)",
            self.session_limit,
            " (EVALUATOR_MAX_SESSIONS)" if config.max_sessions is not None else "",
            session_bytes // MiB,
            "its memory limit"
            if self._cgroups.memory is not None
            else "no memory cgroup: its interpreter's address space, working directory and "
            "/dev/shm",
        )
        if config.memory_reserve > 0:
            self._watchdog = MemoryWatchdog(
                config.memory_reserve,
                self._live_sandboxes,
                self._end_for_memory,
                meminfo=self._meminfo,
            )
            self._watchdog.start()
        pool.refill()
        if self._packages is not None and config.python_packages:
            # Ahead of the first run on each, which would otherwise wait for it.
            for python in self._pythons[1:]:
                task = asyncio.ensure_future(self._base_layer(python))
                self._preinstalls.append(task)
                self._preinstalling[python.path] = task
        if not config.unsandboxed:
            self._fontlist_task = asyncio.ensure_future(self._build_fontlist(pool))
        self._bytecode_task = asyncio.ensure_future(asyncio.to_thread(self._check_bytecode))

    async def _start_pool(self) -> SandboxPool:
        """Make the pool and prove a first run works in it.

        Should the launchers fail to mount their working directories (user namespaces that
        cannot nest, say), the runs go on in plain directories, and the limit says so.
        """
        while True:
            pool = self._make_pool()
            try:
                await self._probe()
                return pool
            except _HostTooBusy:
                raise  # no other way of mounting would be faster
            except SandboxUnavailable as exc:
                root = self._root
                if root is None or not root.launchers_mount:
                    raise
                log.warning("a run's own tmpfs cannot be mounted here: %s", exc)
                root.launchers_mount = False
                await pool.aclose()

    def _package_cache(self, uv: str | None) -> PackageCache | None:
        """The cache of package layers, or ``None`` (and why, in ``_packages_off``)."""
        config = self.config
        policy = Policy.parse(config.packages)
        if not policy.enabled:
            return None
        if config.unsandboxed:
            self._packages_off = "the evaluator runs unsandboxed"
            return None
        if uv is None:
            self._packages_off = "uv is not found on the evaluator's host (set EVALUATOR_UV)"
            log.warning("no package can be installed: %s", self._packages_off)
            return None
        root = Path(config.package_cache) if config.package_cache else default_root()
        sandboxes = root / _SANDBOXES
        try:
            # The operator's directory is left as it is (it may be /var/cache, or shared); the
            # runs' users must be able to traverse it to their own layers.
            if not root.exists():
                root.mkdir(parents=True)
                root.chmod(0o755)
            if self._users.dropping and not root.stat().st_mode & stat.S_IXOTH:
                raise OSError(f"{root} is not searchable by others (the runs' users)")
            if not sandboxes.exists():
                sandboxes.mkdir()
            sandboxes.chmod(0o755)
            _sweep(sandboxes)
            own = sandboxes / f"{os.getpid()}-{secrets.token_hex(4)}"
            own.mkdir()
            own.chmod(0o755)
            self._sandbox_layers_lock = os.open(own, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            fcntl.flock(self._sandbox_layers_lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            self._packages_off = f"the package cache {root} cannot be used: {exc}"
            log.warning("no package can be installed: %s", self._packages_off)
            return None
        self._sandbox_layers = own
        index = config.package_index
        if index is None:
            index_args: list[str] = []
        elif os.path.isdir(index):
            index_args = ["--no-index", "--find-links", os.path.abspath(index)]
        else:
            index_args = ["--index-url", index]
        return PackageCache(
            root,
            uv=uv,
            policy=policy,
            index_args=index_args,
            max_layer_bytes=config.package_set_size * MiB,
            max_total_bytes=config.package_cache_size * MiB,
            timeout=config.package_timeout,
        )

    async def _base_layer(self, python: Interpreter) -> Layer | None:
        """``python_packages`` for ``python``, so that it offers what the default one does:
        asked for at every run on it (a few ms once installed; installed again if evicted)."""
        wanted, cache = self.config.python_packages, self._packages
        if cache is None or not wanted:
            return None
        try:
            layer = await cache.layer(wanted, python.path, tag=_tag(python), trusted=True)
        except PackageRefused as exc:
            log.warning(
                "Python %s is offered without %s: %s", python.version, ", ".join(wanted), exc
            )
            return None
        if not layer.cached:
            log.info(
                "Python %s has %s (%.1f s)", python.version, " ".join(layer.pins), layer.seconds
            )
        return layer

    def _make_pool(self) -> SandboxPool:
        # Every user of the cap (the shared RLIMIT_NPROC, the live sessions) sees the derived one.
        config = self.config.model_copy(update={"max_sessions": self.session_limit})
        root = self._root
        assert root is not None
        rlimits, self._nproc = limits.rlimits(
            config, self._cgroups, mounted=root.bounded, own_uid=self._users.dropping
        )
        blocked = self._covers(root) if self._users.dropping else ()
        pool = self._pool = SandboxPool(
            root,
            self._cgroups,
            self._users,
            covers=blocked,
            workdir_size=config.workdir_size * MiB,
            workdir_inodes=config.workdir_inodes,
            shm_size=None if config.unsandboxed else config.shm_size * MiB,
            rlimits=rlimits,
            seccomp_program=self._seccomp,
            host_env=environment(config) if config.unsandboxed else None,
            ready=config.concurrency if config.prewarm else 0,
            on_dispose=self._remove_packages_dir,
        )
        self._live = LiveSessions(pool, self._session_argv, config, _ended_by, self._add_layers)
        return pool

    async def run(self, request: EvalRequest) -> EvalResult:
        """Run one request and return its result.

        Raises:
            InvalidExecutable: ``executable_path`` does not exist in the sandbox, is not a file,
                or is not executable.
            QueueFull: every slot is busy and ``max_queue`` runs already wait.
            SessionNotFound: the request resumes a session that is not live here.
            RuntimeError: :meth:`start` was not called, or :meth:`aclose` was.

        The live sessions ``request.end_sessions`` names are ended first, whatever becomes of
        the run. When the awaiting task is cancelled, the run's process tree is SIGKILLed before
        the cancellation goes on; its sandbox is disposed of in the background, as after any run.
        """
        pool = self._pool
        if not self._started or self._closing or pool is None:
            raise RuntimeError("the evaluator is not running: call start() first")
        for closed in request.end_sessions:  # before anything else: they made room for this one
            await self.end_session(closed)
        command = [self._executable(request.executable_path), *_lstrip_empty(request.argv)]
        if any("\0" in arg for arg in command):
            return EvalResult("ValueError: embedded null byte", None)
        session = request.session
        if session is not None and request.session_resume and not self._live_touch(session):
            raise self._not_found(session)  # before any install: nothing runs
        try:
            asked, layers = await self._layers(request.packages, command[0], request.session)
        except PackageRefused as exc:
            # A live session's interpreter goes on; one not started yet was not started.
            ended = False if session is not None and self._live_touch(session) else None
            return EvalResult(exc.answer, None, ended_by="packages_refused", session_ended=ended)
        cache = self._packages
        with cache.holding(layers) if cache is not None else contextlib.nullcontext():
            result = await self._run_with(command, request, layers)
        if asked is None:
            return result
        return replace(result, installed=asked.pins, install_seconds=round(asked.seconds, 4))

    async def _run_with(
        self, command: list[str], request: EvalRequest, layers: list[Layer]
    ) -> EvalResult:
        pool = self._pool
        assert pool is not None
        if request.session is not None:
            return await self._run_in_session(request.session, command, request, layers)
        async with self._slot():
            # A warm agent has imported numpy and the rest already: a run whose packages
            # provide a module the environment has (maybe imported, maybe another version)
            # starts cold.
            warm = self._warm_eligible(command) and self._fits_warm(layers)
            sandbox = (pool.take_warm() if warm else None) or pool.take()
            try:
                return await self._run_in(sandbox, command, request, layers)
            except BaseException:
                # Cancelled, or failed: kill now rather than when the disposal gets its turn
                # (the event loop may be shutting down and never run it).
                sandbox.process.kill()
                raise
            finally:
                pool.retire(sandbox)

    def _fits_warm(self, layers: Sequence[Layer]) -> bool:
        """Whether a warm agent can run with ``layers``: none provides a module the default
        interpreter can import already (the agent may have imported it, as another version)."""
        if layers and self._importable is None:
            return False
        for layer in layers:
            provided = self._provided.get(layer.key)
            if provided is None:
                try:
                    entries = os.listdir(layer.path)
                except OSError:
                    return False
                provided = frozenset(
                    entry.split(".")[0]
                    for entry in entries
                    if not entry.startswith(".") and not entry.endswith(".dist-info")
                )
                self._provided[layer.key] = provided
            if provided & (self._importable or frozenset()):
                return False
        return True

    def _live_touch(self, session: str) -> bool:
        return self._live is not None and self._live.touch(session)

    async def _layers(
        self, packages: Sequence[str], executable: str, session: str | None
    ) -> tuple[Layer | None, list[Layer]]:
        """The set a run of ``executable`` asks for (``None``: none), and the layers it gets:
        that set, then its interpreter's preinstalled set if it is not the default one (only
        those with packages: a set that resolves to nothing has nothing to bind). In a live
        session, the set keeps the versions its interpreter has already (they may be
        imported).

        Raises:
            PackageRefused: the asked-for set cannot be installed.
        """
        python = next((p for p in self._pythons if p.path == executable), None)
        asked = None
        layers = []
        if packages:
            if self._packages is None:
                raise PackageRefused(", ".join(packages), "not allowed", self._packages_off)
            if python is None:
                # uv would run that program on the host to learn what it is.
                offered = ", ".join(p.path for p in self._pythons)
                raise PackageRefused(
                    None, "not allowed", f"packages are installed only for {offered}"
                )
            had = self._session_pins(session) if session is not None else ()
            asked = await self._packages.layer(
                packages, executable, tag=_tag(python), constraints=had
            )
            layers.append(asked)
        first = self._preinstalling.get(executable)
        if python is not None and not python.default and (first is None or first.done()):
            # Not before its first install ends (numpy, pandas and matplotlib take a minute
            # from an index): until then a run on it gets the standard library and its own.
            base = await self._base_layer(python)
            if base is not None:
                layers.append(base)
        return asked, [layer for layer in layers if layer.pins]

    def _session_pins(self, session: str) -> tuple[str, ...]:
        """The pins of the layers linked into a live session's directory."""
        sandbox = self._live.sandbox_of(session) if self._live is not None else None
        if sandbox is None or self._packages is None:
            return ()
        pins: set[str] = set()
        directory = self._packages_dir(sandbox.workdir)
        for marker in directory.glob(f"*/{MARKER}") if directory.exists() else ():
            with contextlib.suppress(OSError):
                pins.update(marker.read_text().split())
        return tuple(sorted(pins))

    async def preinstalled(self) -> None:
        """Return once every interpreter's preinstalled set (``python_packages``) was installed,
        or refused; runs on one before that get the standard library and their own sets."""
        await asyncio.gather(*self._preinstalls, return_exceptions=True)

    def info(self) -> ServiceInfo:
        """What ``GET /info`` says: sessions, limits, interpreters and the package policy."""
        config, cache = self.config, self._packages
        return ServiceInfo(
            max_sessions=self.session_limit,
            session_idle_timeout=config.session_idle_timeout,
            time_limit=config.time_limit,
            pythons=tuple(Python(p.version, p.path) for p in self._pythons),
            packages="off" if cache is None else cache.policy.kind,
            allowed=() if cache is None else tuple(sorted(cache.policy.allowed or ())),
            packages_why=self._packages_off if cache is None else None,
            install_timeout=None if cache is None else config.package_timeout,
        )

    async def end_session(self, session: str) -> None:
        """End a live session now (see :mod:`.live`); one it does not hold is no error."""
        if self._live is not None:
            await self._live.end(session)

    @property
    def live_sessions(self) -> int:
        """Live sessions open now."""
        return self._live.count if self._live is not None else 0

    @property
    def session_limit(self) -> int:
        """Live sessions at once: ``max_sessions``, or (once started) as many as half the memory
        holds at what each may hold where it runs (see :func:`.limits.session_bytes`); before
        :meth:`start`, the configuration's own default."""
        if self._session_limit is not None:
            return self._session_limit
        return self.config.session_limit

    @property
    def sessions_ended_for_memory(self) -> int:
        """Live sessions the memory watchdog ended since the start (see :mod:`.watchdog`)."""
        return self._memory_ended.count

    def _live_sandboxes(self) -> dict[str, Sandbox]:
        return self._live.sandboxes() if self._live is not None else {}

    def _not_found(self, session: str) -> SessionNotFound:
        """The error for a session not held here, saying why when the watchdog ended it."""
        return SessionNotFound(session, self._memory_ended.reason(session))

    async def _end_for_memory(self, session: str, sandbox: Sandbox, held: int) -> bool:
        """End ``session`` for the memory watchdog, if it still runs in ``sandbox``."""
        live = self._live
        if live is None or live.sandbox_of(session) is not sandbox:
            return False
        self._memory_ended.add(session, held)
        await live.end(session)
        return True

    async def _run_in_session(
        self, session: str, command: list[str], request: EvalRequest, layers: list[Layer]
    ) -> EvalResult:
        live = self._live
        if live is None or self.session_limit == 0:
            return EvalResult("sessions are turned off (EVALUATOR_MAX_SESSIONS=0)", None)
        if not self._runs_as_agent(command):
            return EvalResult(
                "a session runs an offered interpreter with -c CODE or a script, and no "
                "other option",
                None,
            )
        if request.session_resume and not live.touch(session):  # checked again once it runs
            raise self._not_found(session)
        time_limit = min(request.time_limit or self.config.time_limit, self.config.time_limit)
        async with self._slot():
            started = time.monotonic()
            try:
                result = await live.run(
                    session, command[1:], request, time_limit, command[0], layers
                )
            except SessionNotFound:
                raise self._not_found(session) from None
            except (OSError, RuntimeError) as exc:
                log.warning("a live session could not start: %s", exc)
                return EvalResult(f"the session's interpreter could not start: {exc}", None)
        why = self._memory_ended.reason(session, since=started)
        if why is None:
            self._memory_ended.forget(session)  # it runs: a later miss has another reason
        elif result.session_ended:  # the watchdog ended it during this cell
            result = replace(result, stdout=f"{result.stdout}\n[the session was {why}]\n")
        return result

    def _session_argv(self, sandbox: Sandbox, executable: str) -> list[str]:
        """bwrap's command line of a session's agent started cold (see :mod:`.live`).

        It imports nothing ahead: its first cell waits for it, and imports only what it uses,
        as a cold one-shot run does (the warm sandboxes that sessions take have imported
        ``preimport`` while nothing waited)."""
        agent = _AGENT_IN_SANDBOX if self._view is not None else self._agent_file
        command = [executable, agent, "--session"]
        return self._argv(command, sandbox.workdir, self._agent_binds(sandbox.workdir))

    def _agent_binds(self, workdir: Workdir) -> list[tuple[str, str]]:
        """The agent's file, and the sandbox's own directory of package layers (empty: a
        session fills it, see :meth:`_add_layers`)."""
        binds = [(self._agent_file, _AGENT_IN_SANDBOX)]
        if self._packages is not None and self._view is not None:
            directory = self._packages_dir(workdir)
            directory.mkdir(exist_ok=True)
            directory.chmod(0o755)  # not left to the umask: the runs' user must reach it
            binds.append((str(directory), IN_SANDBOX))
        return binds

    def _packages_dir(self, workdir: Workdir) -> Path:
        return self._sandbox_layers / workdir.path.name

    async def _add_layers(self, sandbox: Sandbox, layers: Sequence[Layer]) -> None:
        """Link ``layers`` into a session's directory, where its next cell finds them.

        Raises:
            PackageRefused: the session's sandbox has no such directory (no package cache).
        """
        if not layers:
            return
        if self._packages is None or self._view is None:
            raise PackageRefused(None, "failed", "this evaluator installs no packages")
        directory = self._packages_dir(sandbox.workdir)
        order = len(list(directory.iterdir())) if directory.exists() else 0
        for offset, layer in enumerate(reversed(layers)):  # the asked-for set last: it wins
            try:
                await asyncio.to_thread(link_layer, layer, directory, order + offset)
            except OSError as exc:
                log.warning("could not link a package layer into a session: %s", exc)
                raise PackageRefused(None, "failed", "the layer could not be added") from exc

    def _remove_packages_dir(self, sandbox: Sandbox) -> None:
        if self._packages is not None:
            directory = self._packages_dir(sandbox.workdir)
            if directory.exists():
                remove_tree(directory)

    async def aclose(self) -> None:
        """Stop: wait for the runs' clean-up, remove every sandbox, the cgroups and directories."""
        self._closing = True
        if self._watchdog is not None:
            await self._watchdog.aclose()
            self._watchdog = None
        if self._live is not None:
            await self._live.aclose()
        if self._pool is not None:
            await self._pool.aclose()
        if self._fontlist_task is not None:  # it disposes of its own sandbox
            await asyncio.gather(self._fontlist_task, return_exceptions=True)
            self._fontlist_task = None
        if self._bytecode_task is not None:  # a thread: it cannot be cancelled
            await asyncio.gather(self._bytecode_task, return_exceptions=True)
            self._bytecode_task = None
        for task in self._preinstalls:
            task.cancel()
        await asyncio.gather(*self._preinstalls, return_exceptions=True)
        self._preinstalls.clear()
        if self._packages is not None and self._sandbox_layers.exists():
            await asyncio.to_thread(remove_tree, self._sandbox_layers)
        if self._sandbox_layers_lock is not None:
            os.close(self._sandbox_layers_lock)
            self._sandbox_layers_lock = None
        self._pool = None
        self._users.close()
        if self._root is not None:
            self._root.remove()
            self._root = None
        self._started = False

    @property
    def warm_sandboxes(self) -> int:
        """Warm sandboxes waiting for a run (see ``EvaluatorConfig.warm_sandboxes``)."""
        return self._pool.warm_count if self._pool is not None else 0

    @property
    def warm_runs(self) -> int:
        """Runs, since the start, that took a warm sandbox."""
        return self._pool.warm_taken if self._pool is not None else 0

    @property
    def _home(self) -> str:
        """The working directory inside the sandbox."""
        return self._view.home if self._view is not None else HOME

    def limits_in_force(self) -> tuple[Limit, ...]:
        """Which limits this machine really enforces, and how (known after :meth:`start`)."""
        return limits.describe(
            self.config,
            self._cgroups,
            mounted=self._root is not None and self._root.bounded,
            nproc=self._nproc,
            users=self._users,
            seccomp_reason=None if self._seccomp is not None else self._seccomp_reason,
            home=self._home,
        )

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
        self._running += 1
        try:
            yield
        finally:
            self._running -= 1
            self._idle_since = time.monotonic()
            self._slots.release()
            if self._pool is not None and not self._closing:
                # Warm sandboxes are made only while no run is in progress: a session's cell
                # retires no sandbox, whose disposal would otherwise be what refills the pool.
                self._pool.refill()

    async def _run_in(
        self,
        sandbox: Sandbox,
        command: list[str],
        request: EvalRequest,
        layers: list[Layer],
        *,
        limit: float | None = None,
    ) -> EvalResult:
        """Run ``command`` in ``sandbox``; ``limit``: seconds in place of the runs' time limit
        (the start-up check's)."""
        config = self.config
        assert self._pool is not None
        written: dict[str, int] = {}
        if await self._pool.ready(sandbox):
            try:
                written = await asyncio.to_thread(sandbox.workdir.write_files, request.files)
            except WriteError as exc:
                return EvalResult(str(exc), None)
        time_limit = (
            min(request.time_limit or config.time_limit, config.time_limit)
            if limit is None
            else limit
        )
        if sandbox.warm:
            try:
                await self._add_layers(sandbox, layers)  # before the clock starts
            except PackageRefused as exc:
                return EvalResult(exc.answer, None, ended_by="packages_refused")
            if sandbox.cgroup is not None:
                sandbox.cgroup.foreground()
            sandbox.process.deliver(command[1:], time_limit)
        else:
            binds = [(str(layer.path), f"{IN_SANDBOX}/{layer.key}") for layer in layers]
            path = ":".join(sandbox_path for _, sandbox_path in binds)
            env = [("PYTHONPATH", path)] if path else []
            argv = self._argv(command, sandbox.workdir, binds, env)
            sandbox.process.release(argv, time_limit)
        outcome = await sandbox.process.wait(config.output_limit)
        stdout = decode_output(outcome.output, truncated=outcome.ended_by == "output_limit")
        if stdout is None:
            return EvalResult(INVALID_UTF8, None)
        try:
            files = await asyncio.to_thread(
                sandbox.workdir.collect,
                written,
                max_files=config.max_files,
                timeout=config.file_parse_timeout,
                content_wanted=request.content_wanted,
            )
        except CollectError as exc:
            return EvalResult(str(exc), None)
        return EvalResult(stdout, outcome.returncode, files, _ended_by(outcome, sandbox.cgroup))

    def _argv(
        self,
        command: list[str],
        workdir: Workdir,
        extra: Sequence[tuple[str, str]] = (),
        env: Sequence[tuple[str, str]] = (),
    ) -> list[str]:
        if self._view is None:
            return command
        interpreter = [(p, p) for p in sorted(self._python_binds.get(command[0], ()), key=len)]
        return self._view.argv(
            command,
            workdir=workdir.path,
            seccomp=self._seccomp is not None,
            readonly_files=[*interpreter, *([self._fontlist] if self._fontlist else []), *extra],
            empty_file=self._empty_file,
            env=env,
            shm=workdir.shm,
        )

    def _warm_eligible(self, command: list[str]) -> bool:
        """Whether a warm agent runs ``command`` as the interpreter would: the default
        interpreter given ``-c CODE`` or a ``.py`` script, and no other option."""
        return command[0] == self.config.executable and self._runs_as_agent(command)

    def _runs_as_agent(self, command: list[str]) -> bool:
        """Whether the agent runs ``command`` as its interpreter would: an offered interpreter
        given ``-c CODE`` or a ``.py`` script, and no other option."""
        if command[0] not in {p.path for p in self._pythons} or len(command) < 2:
            return False
        first = command[1]
        return (first == "-c" and len(command) > 2) or (
            first.endswith(".py") and not first.startswith("-")
        )

    def _agent_argv(self, workdir: Workdir) -> list[str]:
        """bwrap's command line of a warm sandbox: the agent, with the modules it imports."""
        command = [self.config.executable, _AGENT_IN_SANDBOX, *self.config.preimport]
        return self._argv(command, workdir, self._agent_binds(workdir))

    def _executable(self, path: str | None) -> str:
        if path is None:
            return self.config.executable
        visible = self._view.readonly_paths if self._view is not None else ()
        if self._view is not None and not _visible(
            path, visible + self._python_binds.get(path, ())
        ):
            raise InvalidExecutable("executable_path does not exist")
        if not os.path.exists(path):
            raise InvalidExecutable("executable_path does not exist")
        if not os.path.isfile(path):
            raise InvalidExecutable("executable_path is not a file")
        if not os.access(path, os.X_OK):
            raise InvalidExecutable("executable_path is not executable")
        return path

    # -- start-up --------------------------------------------------------------------------

    def _covers(self, root: WorkdirRoot) -> tuple[tuple[str, tuple[str, ...]], ...]:
        """What the runs' own uid could not reach on the host, to be covered (see users.py)."""
        cache = [str(self._packages.root)] if self._packages is not None else []
        if self._view is None:
            return covers([*interpreter_paths(self.config.executable), str(root.path), *cache])
        bwrap_dir = os.path.dirname(self._view.bwrap)
        others = [p for paths in self._python_binds.values() for p in paths]
        return covers([*self._view.readonly_paths, *others, bwrap_dir, str(root.path), *cache])

    async def _probe(self) -> None:
        """A first run, to prove the whole sandbox works on this machine.

        It has a generous time limit of its own, and one more try when killed at it: a busy
        host is said to be busy, never taken for a missing sandbox.

        Raises:
            SandboxUnavailable: the run failed, or was killed at its time limit twice; the
                message names the cause.
        """
        limit = _PROBE_TIME_LIMIT
        for attempt in (1, 2):
            result = await self._probe_run(limit)
            if result.ended_by != "time_limit":
                break
            if attempt == 1:
                log.warning(
                    "the start-up check run did not finish within %g s (a busy host?): "
                    "trying once more",
                    limit,
                )
        else:
            raise _HostTooBusy(
                f"the start-up check run did not finish within {limit:g} s, twice: the host is "
                "too busy (see its load average), which says nothing against the sandbox. "
                "Start the evaluator again once the host is less loaded."
            )
        if result.returncode != 0 or result.stdout != "ok\n":
            raise SandboxUnavailable(self._probe_failure(result))

    async def _probe_run(self, limit: float) -> EvalResult:
        """One start-up check run, with ``limit`` seconds rather than the runs' time limit."""
        pool = self._pool
        assert pool is not None
        command = [self._executable(None), "-c", _PROBE]
        sandbox = pool.take()
        try:
            return await self._run_in(
                sandbox, command, EvalRequest(args=command[1:]), [], limit=limit
            )
        except BaseException:
            sandbox.process.kill()
            raise
        finally:
            pool.retire(sandbox)

    def _probe_failure(self, result: EvalResult) -> str:
        """Why the start-up check run failed, in words naming the cause: what to install only
        when bwrap or the namespaces it needs are what failed."""
        output = result.stdout.strip()[:2000]
        if result.ended_by == "memory_limit":
            return (
                "the start-up check run was killed at the memory limit "
                f"({self.config.memory_limit} MiB): the interpreter cannot start within it; "
                "raise the limit"
            )
        failed = f"a first run in the sandbox failed (returncode {result.returncode}): {output}"
        # bwrap's own errors, and the launcher's (its namespaces, its mounts), come before
        # the interpreter: the sandbox could not be made.
        if "bwrap:" in output or _LAUNCH_FAILED in output:
            return failed + "\n" + WHAT_TO_DO
        return failed

    def _check_bytecode(self) -> None:
        """Compile the environment the runs import from, if it lacks bytecode (see bytecode.py)."""
        executable = self.config.executable
        names = {*bytecode.DEFAULT_MODULES, *(m.split(".")[0] for m in self.config.preimport)}
        try:
            found = bytecode.uncompiled(executable, sorted(names))
        except (RuntimeError, ValueError) as exc:
            log.warning("could not check the bytecode of the runs' packages: %s", exc)
            return
        if not found:
            return
        stale = sum(item.stale for item in found)
        names_found = ", ".join(item.module for item in found)
        log.warning(
            "%d source files of %s have no fresh bytecode, which every run would compile "
            "again (e.g. %s); compiling them now",
            stale, names_found, found[0].example,
        )  # fmt: skip
        if bytecode.compile_in_place(executable, [p for item in found for p in item.paths]):
            log.info("compiled the bytecode of %s", names_found)
        else:
            log.warning(
                "the bytecode of %s cannot be written here: make the environment with "
                "`uv sync` (this project compiles it) or run `%s -m compileall` on it as its owner",
                names_found, executable,
            )  # fmt: skip

    async def _build_fontlist(self, pool: SandboxPool) -> None:
        sandbox = pool.prepare()
        try:
            await pool.ready(sandbox)
            sandbox.process.release(
                self._argv([self.config.executable, "-c", _FONTLIST], sandbox.workdir), 60
            )
            outcome = await sandbox.process.wait(self.config.output_limit)
            cache = sandbox.workdir.access / MPLCONFIGDIR
            built = sorted(cache.glob("fontlist-v*.json")) if outcome.returncode == 0 else []
            if not built or self._root is None:
                log.info("no prebuilt matplotlib font list (is matplotlib installed?)")
                return
            kept = self._root.path / built[-1].name
            shutil.copyfile(built[-1], kept)
            kept.chmod(0o444)
            self._fontlist = (str(kept), f"{self._home}/{MPLCONFIGDIR}/{built[-1].name}")
        finally:
            await pool.dispose(sandbox)
            # After the font list: a warm agent importing pyplot would otherwise build its own.
            if self.config.warm_sandboxes and not self._closing:
                pool.start_warming(self._agent_argv, self.config.warm_sandboxes, self._idle)

    def _idle(self) -> float | None:
        """When the last run ended; ``None`` while a run is in progress."""
        return None if self._running else self._idle_since


_libc = ctypes.CDLL(None, use_errno=True)


def _visible(path: str, readonly_paths: tuple[str, ...]) -> bool:
    """Whether ``path`` (and what it points to) is inside the sandbox's read-only binds."""
    if not os.path.isabs(path):
        return False

    def inside(p: str) -> bool:
        return any(p == root or p.startswith(root.rstrip("/") + "/") for root in readonly_paths)

    return inside(os.path.normpath(path)) and inside(os.path.realpath(path))


def _ended_by(outcome: Outcome, cgroup: RunCgroup | None) -> EndedBy | None:
    """Which limit ended the run, read before its cgroup is removed.

    A SIGKILL the jail did not send is the memory limit's when the run's memory cgroup counts
    an OOM kill, the code's own otherwise; without a memory cgroup it cannot be told: ``None``.
    """
    if outcome.ended_by != "exit" or outcome.returncode != 128 + signal.SIGKILL:
        return outcome.ended_by
    kills = None if cgroup is None else cgroup.oom_kills()
    if kills is None:
        return None
    return "memory_limit" if kills else "exit"


#: Lists the top-level names on an interpreter's sys.path (the standard library included).
_IMPORTABLE = (
    "import os, sys, json\n"
    "names = set(sys.builtin_module_names)\n"
    "for d in sys.path:\n"
    "    try:\n"
    "        names.update(e.split('.')[0] for e in os.listdir(d or '.'))\n"
    "    except OSError:\n"
    "        pass\n"
    "print(json.dumps(sorted(names)))"
)


def _importable(executable: str) -> frozenset[str] | None:
    """The top-level names ``executable`` finds on its ``sys.path`` (``None`` if it cannot
    say: then no run with packages takes a warm sandbox)."""
    try:
        out = subprocess.run(
            [executable, "-I", "-c", _IMPORTABLE],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout  # fmt: skip
        names = json.loads(out)
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return frozenset(str(name) for name in names) if isinstance(names, list) else None


def _sweep(sandboxes: Path) -> None:
    """Remove the layer directories of evaluators that are gone: each holds a lock on its own
    while it lives (whatever its pid namespace)."""
    for directory in sandboxes.iterdir():
        try:
            fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue  # its evaluator lives
        finally:
            os.close(fd)
        remove_tree(directory)


def _tag(python: Interpreter) -> str:
    """What names an interpreter in a layer's key: its real binary and its version."""
    return f"{os.path.realpath(python.path)} {python.version}"


def _lstrip_empty(args: tuple[str, ...]) -> list[str]:
    """Leading empty arguments are dropped, as Snekbox does (they confuse the interpreter)."""
    items = list(args)
    while items and items[0] == "":
        items.pop(0)
    return items
