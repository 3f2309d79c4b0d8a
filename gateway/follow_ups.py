"""``get_output`` and ``interrupt``: the calls that follow a cell which outlived its own call.

Both name a session of the caller's (tokens: only its owner may read or stop it), find its
running cell (:class:`~gateway.cells.PendingCell`; one started through another gateway is asked
of the evaluator all the same), and read it: for up to ``wait_seconds``, or, after an interrupt,
to its end. A cell that ended is rendered as its own call would have been (its figures, its
files kept in the session), once.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from mcp.types import CallToolResult

from .callers import client_of, owner
from .cells import PendingCell
from .choices import Choices
from .code_sessions import SessionGone
from .failures import ServiceFailure

if TYPE_CHECKING:
    from .calls import Calls
    from .outcomes import Call

__all__ = ["follow_up"]

#: Why a service without cells read as they run has nothing to read or interrupt.
NO_CELLS = (
    "This evaluation service runs each call to its end before answering (it does not keep "
    "code running after a call), so there is never a running cell to read or interrupt."
)


async def follow_up(
    calls: Calls,
    call: Call,
    session_id: str,
    *,
    wait: float,
    interrupt: bool,
    keep_output: bool = False,
) -> CallToolResult:
    """See :meth:`~gateway.calls.Calls.follow_up`."""
    if not calls.connection.reads_cells:
        raise call.refuse("refused", NO_CELLS)
    live = calls.connection.live_sessions
    try:
        session = calls.sessions.get(session_id, owner(), adopt=live, client=client_of(call.ctx))
    except SessionGone as exc:
        raise call.refuse("refused", str(exc)) from exc
    call.log["session_id"] = session.id
    cell = session.cell
    if cell is None:  # none known here; another gateway may have started one
        limit, keep = calls.connection.max_time_limit(), calls.settings.max_output_chars
        choices = Choices(None, session.packages)
        cell = PendingCell.start(choices, {}, limit, None, keep, time.monotonic())
    try:
        if interrupt:
            await calls.evaluations.interrupt(session)
            call.log["interrupted"] = True
        until = time.monotonic() + wait
        first = await calls.evaluations.read(session, 0.0, False)  # an ended cell: at once
        result = await calls.read_cell(session, cell, first, call, until)
    except ServiceFailure as failure:
        if failure.kind == "refused":  # the evaluator holds no cell of it
            session.cell = None
        raise
    calls.metrics.reads.labels("running" if result.running else "ended").inc()
    if result.running:
        session.cell = cell
        answer = calls.outcomes.running(call, session, result)
        if keep_output:  # read again, in full, with the result
            cell.unread.add(result.stdout)
        return answer
    view = calls.outcomes.conclude(call, session, cell.choices, cell.uploads, result)
    view.time_limit_lowered = cell.time_limit_lowered
    return calls.outcomes.render(call, result, view, cell.choices, started=cell.started)
