"""Cells read as they run: a live session's cell that goes on after its request's answer.

A request that names a session and ``wait`` (:attr:`snekbox_client.EvalRequest.wait`) runs its
cell as a task of its own (:class:`Cell`): the request is answered once the cell ends or
``wait`` seconds have passed, whichever is first, with the output so far and ``running``; the
cell goes on whether its client stays or not. ``POST /sessions/<id>/output`` reads what it
wrote since the last read (each byte once, in order), and, once it ended, its result;
``POST /sessions/<id>/interrupt`` interrupts it (see :meth:`.JailedProcess.run_cell`).

What a cell holds is bounded: its unread output by the output limit (which counts all it wrote,
as for any run), its result by what the request's ``content_wanted`` lets through. A result
nobody reads is dropped with its session (ended, expired, evicted).
"""

from __future__ import annotations

import asyncio
import codecs
import time

from snekbox_client import EvalResult

from .errors import CellConflict

__all__ = ["Cell", "Cells"]


class Cell:
    """One cell of a session, its output read in pieces while it runs."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        #: Done once the cell is to be interrupted (a KeyboardInterrupt; see :meth:`interrupt`
        #: and :meth:`.JailedProcess.run_cell`, which waits for it beside the cell's end).
        self.interrupted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.task: asyncio.Task[None] | None = None
        self.started = time.monotonic()
        self._unread = bytearray()
        # Pieces end anywhere, even inside a character: a decoder keeps the partial one. A
        # piece read while the cell runs cannot be refused as a whole run's output is (invalid
        # UTF-8): its bad bytes become U+FFFD.
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._read_any = False
        self._result: EvalResult | None = None
        self._error: BaseException | None = None
        #: When it ended (``time.monotonic()``; ``None``: it runs).
        self.ended_at: float | None = None
        # Output came, or the cell ended: what a read for any output wakes on. A read for the
        # end wakes on the end alone, not on each piece of output before it.
        self._changed = asyncio.Event()
        self._ended = asyncio.Event()

    @property
    def running(self) -> bool:
        """Whether the cell has not ended yet."""
        return self._result is None and self._error is None

    @property
    def read_any(self) -> bool:
        """Whether a piece of its output was read while it ran (its result then holds only
        the rest: see :meth:`rest`)."""
        return self._read_any

    def interrupt(self) -> None:
        """Interrupt the cell, once (see :attr:`interrupted`)."""
        if not self.interrupted.done():
            self.interrupted.set_result(None)

    def on_output(self, chunk: bytes) -> None:
        """The output pump's hook: ``chunk`` was written (and kept, within the limit)."""
        self._unread += chunk
        self._changed.set()

    def rest(self) -> str:
        """The output not read yet, decoded to its end (for the result of a cell read in
        pieces)."""
        text = self._decoder.decode(bytes(self._unread), final=True)
        self._unread.clear()
        return text

    def finish(self, result: EvalResult) -> None:
        """The cell ended with ``result`` (its output: :meth:`rest`, or all of it)."""
        self._unread.clear()
        self._result = result
        self.ended_at = time.monotonic()
        self._changed.set()
        self._ended.set()

    def fail(self, error: BaseException) -> None:
        """The cell could not run (``error`` is what its request would have raised)."""
        self._unread.clear()
        self._error = error
        self.ended_at = time.monotonic()
        self._changed.set()
        self._ended.set()

    async def read(self, wait: float, *, early: bool = False) -> EvalResult:
        """Its output since the last read, waiting up to ``wait`` seconds for the end (with
        ``early``, for any output): ``running`` and the piece, or the result once it ended.

        Raises:
            Exception: what the cell's run raised (it did not run).
        """
        deadline = time.monotonic() + wait
        woken = self._changed if early else self._ended
        while self.running and not (early and self._unread):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            woken.clear()
            try:
                async with asyncio.timeout(remaining):
                    await woken.wait()
            except TimeoutError:
                break
        return self.take()

    def take(self) -> EvalResult:
        """What :meth:`read` answers, now."""
        if self._error is not None:
            raise self._error
        if self._result is not None:
            return self._result
        piece = self._decoder.decode(bytes(self._unread))
        self._unread.clear()
        self._read_any = True
        return EvalResult(piece, None, running=True)


class Cells:
    """The cells of one evaluator's sessions, by session id: the one running (or ended, its
    result unread) in each."""

    def __init__(self) -> None:
        self._cells: dict[str, Cell] = {}

    def begin(self, session_id: str) -> Cell:
        """A new cell for ``session_id``.

        Raises:
            CellConflict: one runs there, or ended and nobody read its result.
        """
        cell = self._cells.get(session_id)
        if cell is not None and cell.running:
            raise CellConflict(
                f"a cell is running in session {session_id!r}: read its output or interrupt it"
            )
        if cell is not None:
            raise CellConflict(
                f"the last cell of session {session_id!r} ended and its result was not read: "
                "read it first"
            )
        cell = self._cells[session_id] = Cell(session_id)
        return cell

    def get(self, session_id: str) -> Cell:
        """The cell of ``session_id`` to read or interrupt.

        Raises:
            CellConflict: there is none (no cell ran there unread).
        """
        cell = self._cells.get(session_id)
        if cell is None:
            raise CellConflict(f"no cell is running in session {session_id!r}, and none is unread")
        return cell

    def running(self, session_id: str) -> bool:
        """Whether a cell runs in ``session_id`` now."""
        cell = self._cells.get(session_id)
        return cell is not None and cell.running

    async def read(self, session_id: str, wait: float, *, early: bool = False) -> EvalResult:
        """See :meth:`Cell.read`; a cell's result, once answered, is forgotten (a read that
        was cancelled leaves it to the next).

        Raises:
            CellConflict: no cell to read.
        """
        cell = self.get(session_id)
        try:
            result = await cell.read(wait, early=early)
        except asyncio.CancelledError:
            raise
        except BaseException:
            self._forget(cell)
            raise
        if not result.running:
            self._forget(cell)
        return result

    def drop(self, session_id: str) -> None:
        """Forget the cell of a session ended on purpose (its result is nobody's now)."""
        cell = self._cells.pop(session_id, None)
        if cell is not None and cell.running:
            cell.interrupt()

    def expire(self, idle_timeout: float) -> None:
        """Forget the results nobody read within ``idle_timeout`` seconds of their end."""
        deadline = time.monotonic() - idle_timeout
        for cell in list(self._cells.values()):
            if cell.ended_at is not None and cell.ended_at < deadline:
                self._forget(cell)

    def _forget(self, cell: Cell) -> None:
        if self._cells.get(cell.session_id) is cell:
            del self._cells[cell.session_id]
