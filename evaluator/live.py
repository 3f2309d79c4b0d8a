"""Live sessions: a sandbox and its interpreter kept from run to run, one per session id.

A request that names a session (:attr:`snekbox_client.EvalRequest.session`) runs as a cell in
that session's interpreter, started for an id the service does not hold yet: the agent
(:mod:`._agent`, ``--session``) in a sandbox of its own, with the isolation and limits of a
one-shot run (its own uid, cgroup, working directory, memory and process limits). Each cell's
files are written into the directory the session keeps, its output is what it prints until its
status comes, and only the files it changed come back.

A cell past its time limit is interrupted (KeyboardInterrupt, repeated); if it has not ended
:data:`INTERRUPT_GRACE` seconds later, the interpreter is killed and the session ends. So does
it past the output limit (as a one-shot run, 143) and when the interpreter dies (a memory kill,
``os._exit``): the answer says so (``session_ended``), and the next run naming the id starts a
new interpreter. Sessions also end after ``session_idle_timeout`` seconds without a run (looked
for on a timer, not only when a request comes), when :meth:`LiveSessions.end` is asked, or to
make room (``session_limit``): the longest idle session of the owner holding the most
(``session_owner``, the new session counted; sessions without one count as one owner), so that a
client flooding the service ends its own sessions before anyone else's. They are held in a
:class:`serving.BoundedTable`, the rule both services share: a session whose cell runs is never
ended to make room, nor when it expires; a new session that only busy ones could make room for
is refused (:class:`.errors.SessionsFull`, a 503 "retry"), and nothing runs.

Between cells a session's processes are held (see :mod:`.idle`): at the least CPU weight of its
cgroup, or, without a cpu controller, stopped; a cell gets them back running before its code
is sent, so idle sessions take no CPU time a run wants.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from serving import BoundedTable, TableFull
from snekbox_client import EndedBy, EvalRequest, EvalResult, File

from .cells import Cell
from .cgroups import RunCgroup
from .config import EvaluatorConfig
from .errors import SessionNotFound, SessionsFull
from .idle import IdleHold
from .jail import INVALID_UTF8, Outcome, decode_output
from .packages import Layer, PackageRefused
from .pool import Sandbox, SandboxPool
from .workdir import WriteError

__all__ = ["INTERRUPT_GRACE", "LiveSessions"]

log = logging.getLogger(__name__)

#: Seconds an interrupted cell has to end before its interpreter is killed.
INTERRUPT_GRACE = 2.0
#: Seconds a running cell has, once its session is ended on shutdown, to see it.
_CLOSE_TIMEOUT = 10.0


@dataclass(eq=False)
class _Session:
    id: str
    sandbox: Sandbox
    executable: str
    #: Whom it counts against when room is made (``session_owner``).
    owner: str | None
    #: Holds its processes between cells.
    idle: IdleHold
    last_used: float = field(default_factory=time.monotonic)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    retired: bool = False
    #: Whether its interpreter said it started (a cold one: see :meth:`LiveSessions._start_cold`).
    started: bool = True


class LiveSessions:
    """The live sessions of one evaluator.

    Args:
        pool: Where their sandboxes come from, and go back to be disposed of.
        agent_argv: bwrap's command line of a session's agent, for a sandbox and interpreter.
        config: The limits (time, output, files) and the sessions' own settings.
        ended_by: Which limit ended a cell whose interpreter died, read from its cgroup (a
            memory kill is told from the code's own SIGKILL there).
        add_layers: Makes package layers importable by the session's next cell.
        observe: Told what a session's first cell imported (:meth:`.Preimports.observe`).
    """

    def __init__(
        self,
        pool: SandboxPool,
        agent_argv: Callable[[Sandbox, str], list[str]],
        config: EvaluatorConfig,
        ended_by: Callable[[Outcome, RunCgroup | None], EndedBy | None],
        add_layers: Callable[[Sandbox, Sequence[Layer]], Awaitable[None]],
        observe: Callable[[tuple[str, ...], int, int], None],
    ) -> None:
        self._pool = pool
        self._agent_argv = agent_argv
        self._add_layers = add_layers
        self._observe = observe
        self._config = config
        self._ended_by = ended_by
        # Held while a cell runs (its lock taken): never ended to make room, nor on expiry.
        self._table: BoundedTable[_Session] = BoundedTable(
            max(1, config.session_limit), _running, newcomer_counted=True
        )
        self._starting: dict[str, asyncio.Future[_Session]] = {}
        self._closed = False
        self._expiry: asyncio.TimerHandle | None = None

    @property
    def count(self) -> int:
        """Sessions open now."""
        return len(self._table)

    def sandboxes(self) -> dict[str, Sandbox]:
        """The sandbox of each live session, by id (for the memory watchdog)."""
        return {session.id: session.sandbox for session in self._table}

    def sandbox_of(self, session_id: str) -> Sandbox | None:
        """The sandbox of the live session ``session_id`` (``None``: not live here)."""
        session = self._table.get(session_id)
        return session.sandbox if session is not None else None

    def touch(self, session_id: str) -> bool:
        """Whether the session ``session_id`` is live (or starting) here; if live, it is marked
        used now: a run for it is on its way, and the longest idle sessions make room first."""
        self.expire()
        session = self._table.get(session_id)
        if session is not None:
            self._table.touch(session, session_id)
        return session is not None or session_id in self._starting

    async def run(
        self,
        session_id: str,
        args: list[str],
        request: EvalRequest,
        time_limit: float,
        executable: str,
        layers: Sequence[Layer] = (),
        cell: Cell | None = None,
    ) -> EvalResult:
        """Run ``args`` (the interpreter's arguments) as a cell of the session ``session_id``,
        whose interpreter is ``executable`` (a new session's; a later cell must name the same),
        with ``layers`` importable from this cell on; ``cell``: read as it runs, and
        interrupted when asked (see :mod:`.cells`).

        Raises:
            SessionNotFound: the request resumes a session not live here (any more: it may
                have ended while the run waited for a slot or for the cell before).
            SessionsFull: a new session needs room, and every session that could make it is
                running a cell (nothing ran).
            RuntimeError: the session's interpreter could not start.
        """
        self.expire()
        session = self._table.get(session_id)
        if session is None:
            if request.session_resume and session_id not in self._starting:
                raise SessionNotFound(session_id)
            session = await self._start(session_id, executable, request.session_owner)
        if session.executable != executable:
            return EvalResult(
                f"this session's interpreter is {session.executable}, not {executable}: a "
                "session keeps its interpreter (start a new session for another)",
                None,
                session_ended=False,
            )
        # The sandbox a new session took is made again once the run's slot is given back.
        return await self._run_in(session, args, request, time_limit, layers, cell)

    async def _run_in(
        self,
        session: _Session,
        args: list[str],
        request: EvalRequest,
        time_limit: float,
        layers: Sequence[Layer],
        cell: Cell | None,
    ) -> EvalResult:
        """Run a cell in ``session`` once the cell before has ended (see :meth:`run`)."""
        session_id = session.id
        async with session.lock:
            if session.retired and request.session_resume:
                raise SessionNotFound(session_id)
            if session.retired:  # ended while this run waited for the one before
                message = "the session was ended while this run waited for the one before"
                return EvalResult(message, None, session_ended=True)
            self._table.touch(session, session_id)
            ended = True
            try:
                await session.idle.release()  # running again before its code is sent
                result = await self._cell(session, args, request, time_limit, layers, cell)
                ended = bool(result.session_ended) or self._table.get(session_id) is not session
                return result
            finally:  # cancelled mid-cell (the client left) or failed: its state is unknown
                self._table.touch(session, session_id)  # idle from now on
                if ended:
                    self._discard(session)
                else:  # idle until its next cell: what its code left running waits too
                    session.idle.hold()

    async def _cell(
        self,
        session: _Session,
        args: list[str],
        request: EvalRequest,
        time_limit: float,
        layers: Sequence[Layer],
        cell: Cell | None,
    ) -> EvalResult:
        config, workdir = self._config, session.sandbox.workdir
        try:  # before the files: a cell refused its packages leaves none of them
            await self._add_layers(session.sandbox, layers)
        except PackageRefused as exc:
            return EvalResult(exc.answer, None, ended_by="packages_refused", session_ended=False)
        parse = config.file_parse_timeout
        before: dict[str, int] = {}
        written: dict[str, int] = {}
        try:  # a thread's hop costs more than a snapshot of nothing, or no files
            if not workdir.holds_nothing():
                before = await asyncio.to_thread(workdir.snapshot, timeout=parse)
            if request.files:
                written = await workdir.write_in(request.files)
        except WriteError as exc:
            return EvalResult(str(exc), None, session_ended=False)
        first = workdir.fresh
        outcome = await session.sandbox.process.run_cell(
            args,
            time_limit=time_limit,
            output_limit=config.output_limit,
            grace=INTERRUPT_GRACE,
            on_output=cell.on_output if cell is not None else None,
            interrupted=cell.interrupted if cell is not None else None,
            starting=not session.started,
        )
        session.started, workdir.fresh = True, False
        if first and session.executable == self._config.executable:  # the warm ones' Python
            self._observe(session.sandbox.imports, *outcome.imports)
        alive = session.sandbox.process.alive
        ended_by = outcome.ended_by if alive else self._ended_by(outcome, session.sandbox.cgroup)
        if cell is not None and cell.read_any:  # the rest of what was read in pieces
            stdout: str | None = cell.rest()
        else:
            stdout = decode_output(outcome.output, truncated=outcome.ended_by == "output_limit")
        if stdout is None:
            return EvalResult(INVALID_UTF8, None, session_ended=not alive)
        files: tuple[File, ...] = ()
        if not workdir.holds_nothing():
            files = await asyncio.to_thread(
                workdir.collect,
                {**before, **written},
                max_files=config.max_files,
                timeout=parse,
                content_wanted=request.content_wanted,
                strict=False,
            )
        return EvalResult(stdout, outcome.returncode, files, ended_by, not alive)

    async def _start(self, session_id: str, executable: str, owner: str | None) -> _Session:
        """The session's interpreter, started (once, however many runs ask at the same time),
        counted against ``owner``. Raises :class:`.SessionsFull`: no session that could end to
        make room is idle (a sandbox taken meanwhile is disposed of)."""
        starting = self._starting.get(session_id)
        if starting is not None:
            return await asyncio.shield(starting)
        future: asyncio.Future[_Session] = asyncio.get_running_loop().create_future()
        self._starting[session_id] = future
        try:
            self._make_room(session_id, owner)  # a refusal costs no sandbox
            # A warm sandbox runs the default interpreter, its modules imported.
            default = executable == self._config.executable
            sandbox = await self._pool.take_warm() if default else None
            started = sandbox is not None
            if sandbox is not None:
                if sandbox.cgroup is not None:
                    sandbox.cgroup.foreground()
                sandbox.process.become_session()
            else:
                sandbox = await self._start_cold(executable)
            try:  # again after the waits (one still warming): sessions started meanwhile
                if self._closed:  # the service stopped while it started
                    raise RuntimeError("the evaluator is stopping")
                self._make_room(session_id, owner)
            except BaseException:
                self._pool.retire(sandbox)
                raise
            hold = IdleHold(sandbox.process.pid, sandbox.cgroup)
            session = _Session(session_id, sandbox, executable, owner, hold, started=started)
            self._table.add(session_id, session, owner)
            self._keep_expiring()
            future.set_result(session)
            return session
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: a run that waited on it re-raises it
            raise
        finally:
            del self._starting[session_id]

    def _make_room(self, session_id: str, owner: str | None) -> None:
        """End idle sessions until one more of ``owner`` fits (see the module); each is killed
        on the loop's next turn, once the new session's cell is sent: a kill waits out its
        interpreter's teardown (tenths of a millisecond), which the new session need not.

        Raises:
            SessionsFull: the sessions that would have to end are all running a cell.
        """
        try:
            while (victim := self._table.to_close(owner)) is not None:
                ended = self._table.pop(victim)
                log.info("live session of %s ended to make room: %s", ended.owner, victim)
                asyncio.get_running_loop().call_soon(self._close, ended)
        except TableFull as full:
            raise SessionsFull(session_id, full.held) from None

    async def _start_cold(self, executable: str) -> Sandbox:
        """A sandbox whose session agent is released, not waited for: the first cell is sent
        at once, and its run says whether the agent started (as a one-shot run's does)."""
        sandbox = self._pool.take(session=True)
        try:
            if not await sandbox.ready():
                raise RuntimeError("the session's sandbox did not start")
            sandbox.process.release(self._agent_argv(sandbox, executable), None)
        except BaseException:
            await self._pool.dispose(sandbox)
            raise
        return sandbox

    async def end(self, session_id: str) -> None:
        """End a session now (once its running cell, if any, is killed)."""
        session = self._table.get(session_id)
        if session is not None:
            self._close(session)

    def expire(self) -> None:
        """End the sessions idle for longer than ``session_idle_timeout`` seconds (not those
        whose cell runs)."""
        for session_id in self._table.expired(self._config.session_idle_timeout):
            log.info("live session expired: %s", session_id)
            self._close(self._table.pop(session_id))

    def _keep_expiring(self) -> None:
        """Look for idle sessions every quarter of the idle timeout (at most a minute apart)
        while any is open: an idle interpreter, and whatever its code left running, ends on
        time even when no request comes to trigger :meth:`expire`."""
        if self._expiry is not None or not self._table or self._closed:
            return
        every = min(60.0, max(0.5, self._config.session_idle_timeout / 4))
        self._expiry = asyncio.get_running_loop().call_later(every, self._expire_and_go_on)

    def _expire_and_go_on(self) -> None:
        self._expiry = None
        self.expire()
        self._keep_expiring()

    def _close(self, session: _Session) -> None:
        """End a session: its interpreter is killed at once, its sandbox disposed of once no
        cell runs in it (a running cell's run does that, seeing it killed)."""
        if not session.lock.locked():
            self._discard(session)  # kills it once: each kill reads its cgroup's processes
            return
        if self._table.get(session.id) is session:
            self._table.pop(session.id)
        session.idle.release_now()
        session.sandbox.process.kill()

    def _discard(self, session: _Session) -> None:
        if session.retired:
            return
        session.retired = True
        if self._table.get(session.id) is session:
            self._table.pop(session.id)
        session.idle.release_now()
        session.sandbox.process.kill()
        self._pool.retire(session.sandbox)

    async def aclose(self) -> None:
        """End every session, and wait (a little) for the cells that ran to see it: their
        sandboxes are then the pool's to dispose of, which the service waits for."""
        self._closed = True
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        sessions = list(self._table)
        for session in sessions:
            self._close(session)
        for session in sessions:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_CLOSE_TIMEOUT):
                    async with session.lock:
                        pass
            self._discard(session)


def _running(session: _Session) -> bool:
    """Whether a cell runs in ``session`` (its lock is held): it is never ended to make room,
    nor when it expires."""
    return session.lock.locked()
