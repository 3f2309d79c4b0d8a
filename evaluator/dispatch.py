"""The dispatch of a request: to a one-shot run in a sandbox of the pool, or to a cell of a live
session; either way in a run slot, with the layers of packages it asked for. The memory
watchdog ends live sessions through it too, so that a session's next request says why.

A one-shot run takes a warm sandbox when one fits (its agent has imported numpy and the rest
already), else a cold one; the sandbox is retired (disposed of in the background) whatever
becomes of the run, and killed at once when its caller gives up.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from dataclasses import replace

from snekbox_client import EndedBy, EvalRequest, EvalResult, File

from .cells import Cell, Cells
from .cgroups import RunCgroup
from .commands import CommandLines
from .config import EvaluatorConfig
from .errors import CellConflict, SessionNotFound
from .jail import INVALID_UTF8, Outcome, decode_output
from .live import LiveSessions
from .packages import IN_SANDBOX, Layer, PackageRefused
from .pool import SandboxPool
from .run_packages import RunPackages
from .sandbox import Sandbox
from .slots import RunSlots
from .watchdog import MemoryEnded
from .workdir import CollectError, WriteError

__all__ = ["Dispatcher", "ended_by"]

log = logging.getLogger(__name__)


class Dispatcher:
    """Runs requests in one evaluator's pool and live sessions (see the module).

    Args:
        config: The evaluator's settings.
        pool: Its sandboxes.
        live: Its live sessions.
        slots: Its run slots, which every run and cell holds.
        commands: Its command lines.
        packages: Its package wiring.
        memory_ended: The sessions the memory watchdog ended, to say why one is gone.
        session_limit: Live sessions at once (0: sessions are off).
    """

    def __init__(
        self,
        config: EvaluatorConfig,
        pool: SandboxPool,
        live: LiveSessions,
        slots: RunSlots,
        commands: CommandLines,
        packages: RunPackages,
        memory_ended: MemoryEnded,
        session_limit: int,
    ) -> None:
        self._config = config
        self._pool = pool
        self._live = live
        self._slots = slots
        self._commands = commands
        self._packages = packages
        self._memory_ended = memory_ended
        self._session_limit = session_limit
        #: The cells read as they run (requests with ``wait``), by session.
        self._cells = Cells()

    async def run(self, request: EvalRequest) -> EvalResult:
        """Run one request (see :meth:`.service.Evaluator.run`, which says what it raises)."""
        for closed in request.end_sessions:  # before anything else: they made room for this one
            await self._live.end(closed)
        command = self._commands.command(request)
        if any("\0" in arg for arg in command):
            return EvalResult("ValueError: embedded null byte", None)
        session = request.session
        if session is not None and request.session_resume and not self._live.touch(session):
            raise self.not_found(session)  # before any install: nothing runs
        try:
            in_session = self._live.sandbox_of(session) if session is not None else None
            asked, layers = await self._packages.layers(request.packages, command[0], in_session)
        except PackageRefused as exc:
            # A live session's interpreter goes on; one not started yet was not started.
            ended = False if session is not None and self._live.touch(session) else None
            return EvalResult(exc.answer, None, ended_by="packages_refused", session_ended=ended)
        with self._packages.holding(layers):
            if session is not None:
                result = await self._run_in_session(session, command, request, layers)
            else:
                result = await self._run_once(command, request, layers)
        if asked is None:
            return result
        return replace(result, installed=asked.pins, install_seconds=round(asked.seconds, 4))

    async def _run_once(
        self, command: list[str], request: EvalRequest, layers: list[Layer]
    ) -> EvalResult:
        pool = self._pool
        async with self._slots.hold(request.session_owner):
            # A warm agent has imported numpy and the rest already: a run whose packages
            # provide a module the environment has (maybe imported, maybe another version)
            # starts cold.
            warm = self._commands.warm_eligible(command) and self._packages.fits_warm(layers)
            sandbox = (await pool.take_warm() if warm else None) or pool.take()
            try:
                return await self.run_in(sandbox, command, request, layers)
            except BaseException:
                # Cancelled, or failed: kill now rather than when the disposal gets its turn
                # (the event loop may be shutting down and never run it).
                sandbox.process.kill()
                raise
            finally:
                pool.retire(sandbox)

    async def run_in(
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
        config = self._config
        written: dict[str, int] = {}
        if await sandbox.ready():
            try:
                if request.files:
                    written = await sandbox.workdir.write_in(request.files)
            except WriteError as exc:
                return EvalResult(str(exc), None)
        time_limit = (
            min(request.time_limit or config.time_limit, config.time_limit)
            if limit is None
            else limit
        )
        if sandbox.warm:
            try:
                await self._packages.add_layers(sandbox, layers)  # before the clock starts
            except PackageRefused as exc:
                return EvalResult(exc.answer, None, ended_by="packages_refused")
            if sandbox.cgroup is not None:
                sandbox.cgroup.foreground()
            sandbox.process.deliver(command[1:], time_limit)
        else:
            binds = [(str(layer.path), f"{IN_SANDBOX}/{layer.key}") for layer in layers]
            path = ":".join(sandbox_path for _, sandbox_path in binds)
            env = [("PYTHONPATH", path)] if path else []
            argv = self._commands.argv(command, sandbox.workdir, binds, env)
            sandbox.process.release(argv, time_limit)
        outcome = await sandbox.process.wait(config.output_limit)
        stdout = decode_output(outcome.output, truncated=outcome.ended_by == "output_limit")
        if stdout is None:
            return EvalResult(INVALID_UTF8, None)
        files: tuple[File, ...] = ()  # nothing to collect: no thread to hop to
        try:
            if not sandbox.workdir.holds_nothing():
                files = await asyncio.to_thread(
                    sandbox.workdir.collect,
                    written,
                    max_files=config.max_files,
                    timeout=config.file_parse_timeout,
                    content_wanted=request.content_wanted,
                )
        except CollectError as exc:
            return EvalResult(str(exc), None)
        return EvalResult(stdout, outcome.returncode, files, ended_by(outcome, sandbox.cgroup))

    async def _run_in_session(
        self, session: str, command: list[str], request: EvalRequest, layers: list[Layer]
    ) -> EvalResult:
        live = self._live
        if self._session_limit == 0:
            return EvalResult("sessions are turned off (EVALUATOR_MAX_SESSIONS=0)", None)
        if not self._commands.runs_as_agent(command):
            return EvalResult(
                "a session runs an offered interpreter with -c CODE or a script, and no "
                "other option",
                None,
            )
        if request.session_resume and not live.touch(session):  # checked again once it runs
            raise self.not_found(session)
        if self._cells.running(session):
            raise CellConflict(
                f"a cell is running in session {session!r}: read its output or interrupt it"
            )
        config = self._config
        longest = config.time_limit if request.wait is None else config.long_time_limit
        time_limit = min(request.time_limit or config.time_limit, longest)
        if request.wait is None:
            return await self._session_cell(session, command, request, layers, time_limit)
        cell = self._cells.begin(session)
        cell.task = asyncio.create_task(
            self._cell_task(cell, command, request, layers, time_limit),
            name=f"cell of {session}",
        )
        return await self._cells.read(session, request.wait)

    async def _cell_task(
        self,
        cell: Cell,
        command: list[str],
        request: EvalRequest,
        layers: list[Layer],
        time_limit: float,
    ) -> None:
        """Run ``cell`` to its end, whoever waits for it (see :mod:`.cells`)."""
        try:
            with self._packages.holding(layers):
                result = await self._session_cell(
                    cell.session_id, command, request, layers, time_limit, cell
                )
        except BaseException as exc:
            cell.fail(exc)
            if isinstance(exc, asyncio.CancelledError):  # the service stops
                raise
        else:
            cell.finish(result)

    async def _session_cell(
        self,
        session: str,
        command: list[str],
        request: EvalRequest,
        layers: list[Layer],
        time_limit: float,
        cell: Cell | None = None,
    ) -> EvalResult:
        """Run a cell of ``session`` in its turn for a run slot (``cell``: read as it runs)."""
        live = self._live
        async with self._slots.hold(request.session_owner):
            started = time.monotonic()
            try:
                result = await live.run(
                    session, command[1:], request, time_limit, command[0], layers, cell
                )
            except SessionNotFound:
                raise self.not_found(session) from None
            except (OSError, RuntimeError) as exc:
                log.warning("a live session could not start: %s", exc)
                return EvalResult(f"the session's interpreter could not start: {exc}", None)
        why = self._memory_ended.reason(session, since=started)
        if why is None:
            self._memory_ended.forget(session)  # it runs: a later miss has another reason
        elif result.session_ended:  # the watchdog ended it during this cell
            result = replace(result, stdout=f"{result.stdout}\n[the session was {why}]\n")
        return result

    async def read_cell(self, session: str, wait: float, *, early: bool = False) -> EvalResult:
        """The output of ``session``'s cell since the last read, or its result (see
        :meth:`.cells.Cell.read`).

        Raises:
            SessionNotFound: no cell ran there and the session is not live.
            CellConflict: the session is live, and no cell of it runs or is unread.
        """
        self._cells.expire(self._config.session_idle_timeout)
        try:
            return await self._cells.read(session, wait, early=early)
        except CellConflict:
            if not self._live.touch(session):
                raise self.not_found(session) from None
            raise

    def interrupt(self, session: str) -> None:
        """Interrupt ``session``'s running cell (see :meth:`.cells.Cell`): its end is read as
        any other (:meth:`read_cell`); one that ended already is left to be read.

        Raises:
            SessionNotFound: no cell ran there and the session is not live.
            CellConflict: no cell of it is running or unread.
        """
        try:
            cell = self._cells.get(session)
        except CellConflict:
            if not self._live.touch(session):
                raise self.not_found(session) from None
            raise
        cell.interrupt()

    def forget_cell(self, session: str) -> None:
        """A session ended on purpose: its cell's result is nobody's."""
        self._cells.drop(session)

    def live_sandboxes(self) -> dict[str, Sandbox]:
        """The sandbox of each live session, for the memory watchdog (see :mod:`.watchdog`)."""
        return self._live.sandboxes()

    async def end_for_memory(self, session: str, sandbox: Sandbox, held: int) -> bool:
        """End ``session`` for the memory watchdog, if it still runs in ``sandbox``; its next
        request is told why (see :meth:`not_found`)."""
        if self._live.sandbox_of(session) is not sandbox:
            return False
        self._memory_ended.add(session, held)
        await self._live.end(session)
        return True

    def not_found(self, session: str) -> SessionNotFound:
        """The error for a session not held here, saying why when the watchdog ended it."""
        return SessionNotFound(session, self._memory_ended.reason(session))


def ended_by(outcome: Outcome, cgroup: RunCgroup | None) -> EndedBy | None:
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
