"""The evaluation service: checks the sandbox, runs requests in it, a bounded number at once.

:class:`Evaluator` is the façade; its parts each have a module:

- :mod:`.startup`: what start-up checks and prepares on the host, and the probe run;
- :mod:`.run_packages`: the package layers a run gets, and how they reach its sandbox;
- :mod:`.dispatch`: a request taken to a one-shot run or a live session's cell;
- :mod:`.commands`: the interpreter a request names, and bwrap's command line around it;
- :mod:`.slots`: the run slots and their bounded wait queue;
- :mod:`.pool` and :mod:`.live`: the sandboxes made ahead, and the live sessions;
- :mod:`.watchdog`: the memory watchdog, wired here to the live sessions.

Each run takes a sandbox prepared ahead of time from the pool, which disposes of it after the
answer is produced, always; :meth:`Evaluator.aclose` waits for all of it. A run that is
cancelled (its caller gave up, or its HTTP client went away) has its process tree killed at once
and its sandbox disposed of, and the cancellation goes on.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
from collections.abc import Callable
from types import TracebackType

from snekbox_client import EvalRequest, EvalResult, Python, ServiceInfo

from . import limits, matplotlib_caches, startup
from .cgroups import Cgroups
from .commands import CommandLines
from .config import EvaluatorConfig
from .dispatch import Dispatcher, ended_by
from .errors import SandboxNotMade
from .host import HOME
from .live import LiveSessions
from .models import Limit
from .pool import SandboxPool
from .pythons import Interpreter, find_uv, interpreters
from .run_packages import RunPackages
from .slots import RunSlots
from .users import RunUsers
from .watchdog import MemInfo, MemoryEnded, MemoryWatchdog, read_meminfo
from .workdir import WorkdirRoot

__all__ = ["Evaluator"]

log = logging.getLogger(__name__)

_PR_SET_CHILD_SUBREAPER = 36


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
        self._slots = RunSlots(self.config.concurrency, self.config.queue_limit, self._refill)
        self._pool: SandboxPool | None = None
        self._live: LiveSessions | None = None
        self._dispatch: Dispatcher | None = None
        self._commands: CommandLines | None = None
        self._run_packages = RunPackages(self.config)
        self._matplotlib_task: asyncio.Task[None] | None = None
        self._bytecode_task: asyncio.Future[None] | None = None
        self._root: WorkdirRoot | None = None
        self._cgroups = Cgroups({}, None)
        self._users = RunUsers(None, 0)
        self._seccomp: bytes | None = None
        self._seccomp_reason = "disabled by configuration"
        self._nproc: int | None = None
        self._pythons: tuple[Interpreter, ...] = ()

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
        session_bytes = await self._prepare()
        _libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        self._started = True
        try:
            pool = await self._start_pool()
        except BaseException:
            await self.aclose()
            raise
        for limit in self.limits_in_force():
            log.log(logging.INFO if limit.enforced else logging.WARNING, "limit %s", limit)
        startup.log_lowered_nproc(self.config, self._nproc, self._users)
        startup.log_sessions(self.config, self.session_limit, session_bytes, self._cgroups)
        config = self.config
        if config.memory_reserve > 0 and self._dispatch is not None:
            self._watchdog = MemoryWatchdog(
                config.memory_reserve,
                self._dispatch.live_sandboxes,
                self._dispatch.end_for_memory,
                meminfo=self._meminfo,
            )
            self._watchdog.start()
        await pool.settled(refill=True)  # a first request finds its sandbox ready
        self._run_packages.preinstall()
        if not config.unsandboxed and self._commands is not None and self._root is not None:
            self._matplotlib_task = asyncio.ensure_future(
                matplotlib_caches.build(
                    pool,
                    self._commands,
                    self._root,
                    config.output_limit,
                    then=lambda: self._start_warming(pool),
                )
            )
        self._bytecode_task = asyncio.ensure_future(
            asyncio.to_thread(startup.check_bytecode, config)
        )

    async def _prepare(self) -> int:
        """What every run needs, in order: the interpreters, the sandbox's view of the host,
        the runs' users, the package cache, the cgroups, the private directory and the seccomp
        filter. Returns the bytes each live session is counted at.

        Raises:
            SandboxUnavailable: bwrap is missing, or user namespaces are disabled.
        """
        config = self.config
        startup.warn_if_unsandboxed(config)
        uv = find_uv(config.uv)
        self._pythons = await asyncio.to_thread(interpreters, config.executable, config.pythons, uv)
        view, python_binds = startup.sandbox_view_of(config, self._pythons)
        self._users = RunUsers.for_service(config.sandbox_uid, config.sandbox_uids)
        await self._run_packages.open(uv, self._users, self._pythons)
        self._cgroups = startup.detect_cgroups(config)
        session_bytes = limits.session_bytes(config, self._cgroups)
        self._session_limit = min(config.sessions_within(session_bytes), 100_000)
        root = self._root = WorkdirRoot.create(config.workdir_root)
        # Not root: each run's launcher mounts its size-bounded tmpfs, in a user namespace.
        root.launchers_mount = not root.can_mount and not config.unsandboxed
        agent_file, compiled_agent, empty_file = startup.place_agent_files(root, self._pythons[0])
        self._seccomp, self._seccomp_reason = startup.seccomp_filter(config, self._users)
        self._commands = CommandLines(
            config,
            self._pythons,
            view,
            python_binds,
            seccomp=self._seccomp is not None,
            agent_file=agent_file,
            compiled_agent=compiled_agent,
            empty_file=empty_file,
            packages=self._run_packages,
            resident_prelude=startup.place_resident_prelude(config, root, self._pythons[0]),
        )
        return session_bytes

    async def _start_pool(self) -> SandboxPool:
        """Make the pool and prove a first run works in it.

        Should the launchers fail to mount their working directories (user namespaces that
        cannot nest, say), the runs go on in plain directories, and the limits say so.
        """
        while True:
            pool = self._make_pool()
            try:
                await startup.probe(self._probe_run, self.config.memory_limit)
                return pool
            except SandboxNotMade as exc:  # not a busy host, nor a limit: the mounts, maybe
                root = self._root
                if root is None or not root.launchers_mount:
                    raise
                startup.log_plain_directories(exc, processes_lost=self._nproc is not None)
                root.launchers_mount = False
                await pool.aclose()

    def _make_pool(self) -> SandboxPool:
        """The pool, the live sessions and the dispatcher, made with what start found."""
        # The live sessions see the derived cap.
        config = self.config.model_copy(update={"max_sessions": self.session_limit})
        root, commands = self._root, self._commands
        assert root is not None and commands is not None
        pool, self._nproc = startup.make_pool(
            config,
            root,
            self._cgroups,
            self._users,
            commands,
            self._seccomp,
            on_dispose=self._run_packages.remove_directory,
        )
        self._pool = pool
        packages, preimports = self._run_packages, commands.preimports
        live = self._live = LiveSessions(
            pool, commands.session_argv, config, ended_by, packages.add_layers, preimports.observe
        )
        self._dispatch = Dispatcher(
            self.config,
            pool,
            live,
            self._slots,
            commands,
            self._run_packages,
            self._memory_ended,
            self.session_limit,
        )
        return pool

    async def _probe_run(self, limit: float) -> EvalResult:
        """One start-up check run, with ``limit`` seconds rather than the runs' time limit."""
        pool, dispatch, commands = self._pool, self._dispatch, self._commands
        assert pool is not None and dispatch is not None and commands is not None
        command = [commands.executable(None), "-c", startup.PROBE]
        sandbox = pool.take()
        try:
            return await dispatch.run_in(
                sandbox, command, EvalRequest(args=command[1:]), [], limit=limit
            )
        except BaseException:
            sandbox.process.kill()
            raise
        finally:
            pool.retire(sandbox)

    def _start_warming(self, pool: SandboxPool) -> None:
        """Start the warm sandboxes once matplotlib's caches are built (else each builds them)."""
        config, commands = self.config, self._commands
        if commands is not None and config.warm_sandboxes and not self._closing:
            most, spare, cpus = config.warm_sandboxes_max, self._slots.spare_cpu, self._slots.cpus
            light = commands.started_argv if config.preimport else None
            pool.start_warming(commands.agent_argv, config.warm_sandboxes, most, spare, cpus, light)

    def _refill(self) -> None:
        """After each run's answer (a run may leave a CPU spare, see :mod:`.pool`); a session's
        cell retires no sandbox, whose disposal would otherwise refill the pool."""
        if self._pool is not None and not self._closing:
            self._pool.refill_soon()

    async def run(self, request: EvalRequest) -> EvalResult:
        """Run one request and return its result.

        Raises:
            InvalidExecutable: ``executable_path`` does not exist in the sandbox, is not a file,
                or is not executable.
            QueueFull: every slot is busy and ``max_queue`` runs (or the owner's share) wait.
            SessionNotFound: the request resumes a session that is not live here.
            RuntimeError: :meth:`start` was not called, or :meth:`aclose` was.

        The live sessions ``request.end_sessions`` names are ended first, whatever becomes of
        the run. When the awaiting task is cancelled, the run's process tree is SIGKILLed before
        the cancellation goes on; its sandbox is disposed of in the background, as after any run.
        """
        return await self.dispatcher.run(request)

    @property
    def dispatcher(self) -> Dispatcher:
        """Where requests go: runs, and cells read as they run (:mod:`.cells`).

        Raises:
            RuntimeError: :meth:`start` was not called, or :meth:`aclose` was.
        """
        dispatch = self._dispatch
        if not self._started or self._closing or dispatch is None:
            raise RuntimeError("the evaluator is not running: call start() first")
        return dispatch

    async def preinstalled(self) -> None:
        """Return once every interpreter's preinstalled set (``python_packages``) was installed,
        or refused; runs on one before that get the standard library and their own sets."""
        await self._run_packages.preinstalled()

    def info(self) -> ServiceInfo:
        """What ``GET /info`` says: sessions, limits, interpreters and the package policy."""
        config, cache = self.config, self._run_packages.cache
        return ServiceInfo(
            max_sessions=self.session_limit,
            session_idle_timeout=config.session_idle_timeout,
            time_limit=config.time_limit,
            pythons=tuple(Python(p.version, p.path) for p in self._pythons),
            packages="off" if cache is None else cache.policy.kind,
            allowed=() if cache is None else tuple(sorted(cache.policy.allowed or ())),
            packages_why=self._run_packages.why_off if cache is None else None,
            install_timeout=None if cache is None else config.package_timeout,
            long_time_limit=config.long_time_limit if self.session_limit else None,
            resident_prelude=self._commands.resident_prelude if self._commands else None,
        )

    async def end_session(self, session: str) -> None:
        """End a live session now (see :mod:`.live`); one it does not hold is no error."""
        if self._dispatch is not None:
            self._dispatch.forget_cell(session)
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
        if self._matplotlib_task is not None:  # it disposes of its own sandbox
            await asyncio.gather(self._matplotlib_task, return_exceptions=True)
            self._matplotlib_task = None
        if self._bytecode_task is not None:  # a thread: it cannot be cancelled
            await asyncio.gather(self._bytecode_task, return_exceptions=True)
            self._bytecode_task = None
        await self._run_packages.aclose()
        self._pool = None
        self._dispatch = None
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

    def limits_in_force(self) -> tuple[Limit, ...]:
        """Which limits this machine really enforces, and how (known after :meth:`start`)."""
        return limits.describe(
            self.config,
            self._cgroups,
            mounted=self._root is not None and self._root.bounded,
            nproc=self._nproc,
            users=self._users,
            seccomp_reason=None if self._seccomp is not None else self._seccomp_reason,
            home=self._commands.home if self._commands is not None else HOME,
        )


_libc = ctypes.CDLL(None, use_errno=True)
