"""Cells that outlive their call: a session's code read as it runs, and after its call answered.

On the built-in evaluator (in this process or behind ``SNEKBOX_URL``), a call's cell is sent
with ``wait`` (:attr:`snekbox_client.EvalRequest.wait`): the evaluator answers within it, with
the output so far and ``running`` if the cell goes on. :meth:`CellReads.follow` then reads it
(``read_output``) until it ends or the call's ``wait_seconds`` have passed, sending the newest
output to a client that asked for progress, at most one notification per
``MCP_PROGRESS_INTERVAL``. A cell still running then stays with its session
(:class:`PendingCell`): ``get_output`` reads it on, ``interrupt`` stops it, and a call that
left (its client disconnected) leaves what it read there, for the next read.

What the gateway holds of a cell's output is bounded (:class:`OutputSoFar`): its first and
last ``keep`` characters, whatever the cell prints.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

from mcp.server.mcpserver import Context
from mcp.types import CallToolResult, TextContent

from snekbox_client import EvalResult

from .choices import Choices
from .code_sessions import CodeSession
from .render import RenderLimits
from .schema import ExecutionResult
from .text import clean, cut_middle, duration, end_of_output

__all__ = [
    "NEWEST_CHARS",
    "CellReads",
    "OutputSoFar",
    "PendingCell",
    "cell_running",
    "progress_wanted",
    "render_running",
]

#: Characters of the newest output a progress notification carries at most.
NEWEST_CHARS = 2000
#: Seconds a cell is given beyond its time limit to have surely ended (the interrupt's grace,
#: a kill, its files collected).
_END_MARGIN = 30.0


class OutputSoFar:
    """Output read in pieces, kept within a bound: its first and last ``keep`` characters (what
    a result shows of a long output anyway: it is cut in the middle), and how many between were
    dropped."""

    def __init__(self, keep: int) -> None:
        self._keep = keep
        self._head = ""
        self._tail = ""
        self._dropped = 0

    def add(self, text: str) -> None:
        if len(self._head) < self._keep and not self._tail:
            room = self._keep - len(self._head)
            self._head += text[:room]
            text = text[room:]
        if not text:
            return
        tail = self._tail + text
        if len(tail) > self._keep:
            self._dropped += len(tail) - self._keep
            tail = tail[-self._keep :]
        self._tail = tail

    def __bool__(self) -> bool:
        return bool(self._head or self._tail)

    def take(self) -> str:
        """What was kept (a line saying what was dropped in between), and forget it."""
        middle = f"\n[… {self._dropped:,} characters not kept …]\n" if self._dropped else ""
        text = self._head + middle + self._tail
        self._head, self._tail, self._dropped = "", "", 0
        return text


@dataclass
class PendingCell:
    """A session's cell the evaluator runs on after its call answered (or was left).

    What the call chose and sent stays for its result, which a later read renders.
    """

    started: float
    #: Seconds it may run (its progress notifications' total).
    time_limit: float
    #: By when it has surely ended (``time.monotonic()``): its time limit, and a margin.
    deadline: float
    choices: Choices
    uploads: dict[str, bytes]
    time_limit_lowered: float | None
    #: Output read from the evaluator that no answer carried yet.
    unread: OutputSoFar

    @classmethod
    def start(
        cls,
        choices: Choices,
        uploads: dict[str, bytes],
        time_limit: float,
        lowered: float | None,
        keep: int,
        started: float,
    ) -> PendingCell:
        return cls(
            started,
            time_limit,
            started + time_limit + _END_MARGIN,
            choices,
            uploads,
            lowered,
            OutputSoFar(keep),
        )

    @property
    def surely_ended(self) -> bool:
        """Whether its time limit (and a margin) has passed: it cannot be running."""
        return time.monotonic() > self.deadline


def progress_wanted(ctx: Context[Any, Any]) -> bool:
    """Whether the call's client sent a progress token (else notifications would go nowhere).
    A client in this process (the SDK's direct dispatcher) has its callback called without
    one: it may want them."""
    try:
        context = ctx.request_context
    except (ValueError, AttributeError):  # outside a request (a direct call in a test)
        return False
    meta: Any = context.meta or {}
    if meta.get("progress_token") is not None or meta.get("progressToken") is not None:
        return True
    return context.request is None


#: Reads a session's cell once: ``(wait, early)``, as ``read_output`` takes them.
ReadOnce = Callable[[float, bool], Awaitable[EvalResult]]


class CellReads:
    """Reads running cells (see the module's docstring), with at least ``interval`` seconds
    between two progress notifications."""

    def __init__(self, interval: float) -> None:
        self.interval = interval

    async def follow(
        self,
        result: EvalResult,
        cell: PendingCell,
        read: ReadOnce,
        *,
        ctx: Context[Any, Any] | None,
        until: float,
        session_id: str,
    ) -> EvalResult:
        """Read the cell on from ``result`` (a ``running`` answer) until it ends or ``until``
        (``time.monotonic()``); ``read(wait, early)`` reads it once. Its output goes into
        ``cell.unread``, and, for a client that asked, into progress notifications.

        Returns its result (``stdout`` all that was read and not answered yet), or, at
        ``until``, a ``running`` result with the output read so far.
        """
        notify = ctx is not None and progress_wanted(ctx)
        newest = ""
        last_sent = -math.inf
        while True:
            if result.running:
                cell.unread.add(result.stdout)
                newest = (newest + clean(result.stdout))[-NEWEST_CHARS:]
            else:
                return _with_output(result, cell.unread.take())
            now = time.monotonic()
            if notify and ctx is not None and now - last_sent >= self.interval:
                elapsed = now - cell.started
                await ctx.report_progress(
                    round(elapsed, 1), cell.time_limit, _message(elapsed, session_id, newest)
                )
                newest, last_sent = "", now
            if now >= until:
                return EvalResult(cell.unread.take(), None, running=True)
            if notify and newest:  # notified too recently: gather until the next may go
                wait, early = max(last_sent + self.interval - now, 0.0), False
            else:  # a notification may go as soon as there is output
                wait, early = min(max(self.interval, 1.0), 30.0), notify
            result = await read(min(wait, max(until - now, 0.0)), early)


def _with_output(result: EvalResult, before: str) -> EvalResult:
    """``result`` with the output read before it in front of its own."""
    if not before:
        return result
    return replace(result, stdout=before + result.stdout)


def _message(elapsed: float, session_id: str, newest: str) -> str:
    """A progress notification's text: how long it has run, where, and its newest output."""
    head = f"running for {elapsed:.1f} s in session {session_id}"
    if not newest:
        return head
    if len(newest) >= NEWEST_CHARS:
        newest = "…" + newest[1:]
    return f"{head}; newest output:\n{newest}"


def how_to_go_on(session_id: str) -> str:
    """What a model does with a running cell: read it on, or stop it."""
    return (
        f'get_output(session_id="{session_id}") reads what it prints next and, once it has '
        "ended, its result (figures and files too); wait_seconds=N waits up to N s for it. "
        f'interrupt(session_id="{session_id}") stops it (a KeyboardInterrupt; the session\'s '
        "variables are kept)."
    )


def cell_running(session: CodeSession) -> str:
    """Why a call on a session whose cell runs on is refused at once."""
    cell = session.cell
    since = "" if cell is None else f", started {duration(time.monotonic() - cell.started)} ago"
    return (
        f"A cell is still running in this session{since} (or ended and its result was not "
        f"read yet); this code did not run. {how_to_go_on(session.id)} Then run this code "
        "again, or run it now in a new session (omit session_id)."
    )


def render_running(
    output: str, session_id: str, elapsed: float, limits: RenderLimits
) -> CallToolResult:
    """The answer of a call (or a read) whose cell runs on: its output since the last answer,
    and how to go on."""
    shown, truncated = cut_middle(clean(output), limits.max_output_chars)
    message = (
        f"still running after {elapsed:.1f} s in session {session_id}: nothing is lost, "
        "the cell goes on"
    )
    # As in every result: a closing line the output does not hold, and only the gateway's
    # lines after it, so that output imitating them stays above it.
    region = shown.rstrip("\n")
    lines = [region, end_of_output(region, truncated)] if region.strip() else ["(no output yet)"]
    lines.append(f"[{message}. {how_to_go_on(session_id)}]")
    text = "\n".join(lines)
    structured = ExecutionResult(
        stdout=shown,
        stdout_truncated=truncated,
        returncode=None,
        status="running",
        message=message,
        images=[],
        files=[],
        session_id=session_id,
    )
    return CallToolResult(
        content=[TextContent(type="text", text=text)],
        structured_content=structured.model_dump(mode="json"),
    )
