"""Calls at a deadline from one thread: the kills that must come even while the event loop stalls.

A run's time limit is kept by the event loop and, should the loop stall (a long synchronous
step, a starved host), by a call from a thread a little later (see :mod:`.child`). One thread
serves every run. A ``threading.Timer`` per run started a thread at each release, on the event
loop, which then waited until the new thread was scheduled before the run's code could go.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable

__all__ = ["Deadline", "call_later"]

log = logging.getLogger(__name__)


#: Cancelled calls kept in the heap at the most before it is rebuilt without them, when they
#: are also half of it (as asyncio's loop does with its timers): a client sending many short
#: runs, each with a long time limit, would otherwise keep one per run until its deadline.
_CANCELLED_KEPT = 100


class Deadline:
    """A call :func:`call_later` will make; :meth:`cancel` drops it, and what it holds."""

    __slots__ = ("_deadlines", "callback", "when")

    def __init__(self, deadlines: _Deadlines, when: float, callback: Callable[[], object]) -> None:
        self._deadlines = deadlines
        self.when = when
        self.callback: Callable[[], object] | None = callback

    def cancel(self) -> None:
        """Do not make the call (one already begun goes on, as ``Timer.cancel`` lets it)."""
        self._deadlines.cancel(self)


class _Deadlines:
    """The pending calls, earliest first, and the thread that makes them (started on first use,
    and again should it have died)."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._pending: list[tuple[float, int, Deadline]] = []
        self._cancelled = 0  # of those still in _pending
        self._order = itertools.count()  # ties: the one asked for first goes first
        self._thread: threading.Thread | None = None

    def call_later(self, seconds: float, callback: Callable[[], object]) -> Deadline:
        deadline = Deadline(self, time.monotonic() + seconds, callback)
        with self._changed:
            heapq.heappush(self._pending, (deadline.when, next(self._order), deadline))
            if self._thread is None or not self._thread.is_alive():
                thread = threading.Thread(target=self._serve, name="deadlines", daemon=True)
                thread.start()
                self._thread = thread
            elif self._pending[0][2] is deadline:  # earlier than the one the thread waits for
                self._changed.notify()
        return deadline

    def cancel(self, deadline: Deadline) -> None:
        with self._changed:
            if deadline.callback is None:  # made, or cancelled already
                return
            deadline.callback = None
            self._cancelled += 1
            if self._cancelled > _CANCELLED_KEPT and 2 * self._cancelled > len(self._pending):
                self._pending = [entry for entry in self._pending if entry[2].callback]
                heapq.heapify(self._pending)
                self._cancelled = 0

    def _serve(self) -> None:
        while True:
            callback = self._next_due()
            try:
                callback()
            except Exception:
                log.exception("a call at a deadline failed")

    def _next_due(self) -> Callable[[], object]:
        """Wait until the earliest call not cancelled is due; take it."""
        with self._changed:
            while True:
                if not self._pending:
                    self._changed.wait()
                    continue
                when, _, deadline = self._pending[0]
                callback = deadline.callback
                if callback is None:
                    heapq.heappop(self._pending)  # cancelled: dropped once it comes first
                    self._cancelled -= 1
                elif (left := when - time.monotonic()) > 0:
                    self._changed.wait(left)
                else:
                    heapq.heappop(self._pending)
                    deadline.callback = None
                    return callback


_DEADLINES = _Deadlines()


def call_later(seconds: float, callback: Callable[[], object]) -> Deadline:
    """Call ``callback`` from the deadlines' thread after ``seconds``, unless cancelled first.

    The callback must be quick (every later one waits for it) and safe to call from a thread.
    """
    return _DEADLINES.call_later(seconds, callback)
