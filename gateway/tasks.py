"""The tasks extension of MCP 2026-07-28 (``io.modelcontextprotocol/tasks``), served from cells.

The SDK (mcp 2.3) carries the 2025-11-25 task types but no runtime for the 2026-07-28 extension;
it does let an extension add request methods and wrap ``tools/call`` (:mod:`mcp.server.extension`),
which is what this is. A ``tools/call`` of ``execute_python_code`` whose request declares the
extension (its ``_meta`` client capabilities) waits :data:`TASK_WAIT` seconds (or its own
``wait_seconds``); a cell still running then is answered as a task (``resultType: "task"``)
instead of a ``running`` result. The task is that cell: ``tasks/get`` reads it (its output so
far in ``statusMessage``, nothing consumed) and, once it ended, answers ``completed`` with the
tool's result as the call would have given it; ``tasks/cancel`` interrupts it. Only the task's
owner (the call's bearer token) can see it: to anyone else it does not exist. Tasks are kept
:data:`TASK_TTL_MS` after their creation, :data:`MAX_TASKS` at most.
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from collections.abc import Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension, MethodBinding
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp.shared.exceptions import MCPError
from mcp.types import CallToolResult, TextContent
from mcp_types import CLIENT_CAPABILITIES_META_KEY, CallToolRequestParams, RequestParams

from .callers import owner

if TYPE_CHECKING:
    from .tool import Gateway

__all__ = ["MAX_TASKS", "TASKS", "TASK_TTL_MS", "TASK_WAIT", "CellTasks", "task_wait"]

TASKS = "io.modelcontextprotocol/tasks"
#: Seconds a call that may become a task waits for its cell first (most end within it).
TASK_WAIT = 1.0
#: How long a task is kept after its creation (ms), how often to poll it, and how many are kept.
TASK_TTL_MS, POLL_INTERVAL_MS, MAX_TASKS = 3_600_000, 1000, 1024
_MODERN = frozenset({"2026-07-28"})
#: JSON-RPC's "invalid params": the spec's answer to an unknown task id.
_INVALID_PARAMS = -32602

_task_wanted: ContextVar[bool] = ContextVar("task_wanted", default=False)


def task_wait() -> float | None:
    """The ``wait_seconds`` of a call that may become a task (``None``: not such a call)."""
    return TASK_WAIT if _task_wanted.get() else None


class TaskParams(RequestParams):
    """``tasks/get``, ``tasks/cancel`` and ``tasks/update``'s params: the task's id."""

    taskId: str


@dataclass
class _Task:
    id: str
    owner: str | None
    session_id: str
    created: str
    updated: str
    status: Literal["working", "completed", "cancelled"] = "working"
    result: dict[str, Any] | None = None
    message: str | None = None
    cancelled: bool = False
    born: float = field(default_factory=time.monotonic)

    def wire(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "taskId": self.id,
            "status": self.status,
            "createdAt": self.created,
            "lastUpdatedAt": self.updated,
            "ttlMs": TASK_TTL_MS,
            "pollIntervalMs": POLL_INTERVAL_MS,
        }
        if self.message:
            body["statusMessage"] = self.message
        if self.result is not None:
            body["result"] = self.result
        return body


class CellTasks(Extension):
    """The extension, over ``gateway``'s calls (see the module's docstring)."""

    identifier = TASKS

    def __init__(self, gateway: Gateway) -> None:
        self._gateway = gateway
        self._tasks: OrderedDict[str, _Task] = OrderedDict()

    def methods(self) -> Sequence[MethodBinding]:
        return (
            MethodBinding("tasks/get", TaskParams, self._get, _MODERN),
            MethodBinding("tasks/cancel", TaskParams, self._cancel, _MODERN),
            MethodBinding("tasks/update", TaskParams, self._update, _MODERN),
        )

    async def intercept_tool_call(
        self,
        params: CallToolRequestParams,
        ctx: ServerRequestContext[Any, Any],
        call_next: CallNext,
    ) -> HandlerResult:
        if params.name != "execute_python_code" or not _declares_tasks(ctx):
            return await call_next(ctx)
        wanted = _task_wanted.set(self._gateway.connection.reads_cells)
        try:
            result = await call_next(ctx)
        finally:
            _task_wanted.reset(wanted)
        if not isinstance(result, CallToolResult) or result.is_error:
            return result
        structured = result.structured_content
        if not structured or structured.get("status") != "running":
            return result
        now = _now()
        task = _Task(secrets.token_urlsafe(16), owner(), structured["session_id"], now, now)
        task.message = structured.get("message")
        self._keep(task)
        return {"resultType": "task", **task.wire()}

    async def _get(self, ctx: ServerRequestContext[Any, Any], params: TaskParams) -> HandlerResult:
        task = self._find(params.taskId)
        if task.status == "working":
            await self._read(task, ctx, interrupt=False)
        return task.wire()

    async def _cancel(
        self, ctx: ServerRequestContext[Any, Any], params: TaskParams
    ) -> HandlerResult:
        task = self._find(params.taskId)
        if task.status == "working" and not task.cancelled:
            task.cancelled = True
            await self._read(task, ctx, interrupt=True)
        return {}

    async def _update(
        self, ctx: ServerRequestContext[Any, Any], params: TaskParams
    ) -> HandlerResult:
        self._find(params.taskId)
        raise MCPError(code=_INVALID_PARAMS, message="This task never asks for input.")

    async def _read(
        self, task: _Task, ctx: ServerRequestContext[Any, Any], *, interrupt: bool
    ) -> None:
        """Read the task's cell without taking its output (the result keeps it all)."""
        calls = self._gateway.calls
        try:
            result = await calls.follow_up(
                task.session_id,
                Context(request_context=ctx),
                wait=0.0,
                interrupt=interrupt,
                keep_output=True,
            )
        except ToolError as exc:  # the session or its cell is gone: the task ends with it
            result = CallToolResult(
                content=[TextContent(type="text", text=str(exc))], is_error=True
            )
        structured = result.structured_content or {}
        task.updated = _now()
        if structured.get("status") == "running" and not result.is_error:
            task.message = _tail(structured.get("stdout", ""), structured.get("message", ""))
            return
        task.status = "cancelled" if task.cancelled else "completed"
        task.message = structured.get("message")
        task.result = result.model_dump(mode="json", by_alias=True, exclude_none=True)

    def _find(self, task_id: str) -> _Task:
        self._expire()
        task = self._tasks.get(task_id)
        if task is None or task.owner != owner():
            raise MCPError(code=_INVALID_PARAMS, message="Failed to retrieve task: Task not found")
        return task

    def _keep(self, task: _Task) -> None:
        self._expire()
        self._tasks[task.id] = task
        while len(self._tasks) > MAX_TASKS:
            self._tasks.popitem(last=False)

    def _expire(self) -> None:
        deadline = time.monotonic() - TASK_TTL_MS / 1000
        while self._tasks and next(iter(self._tasks.values())).born < deadline:
            self._tasks.popitem(last=False)


def _declares_tasks(ctx: ServerRequestContext[Any, Any]) -> bool:
    """Whether the request's own client capabilities declare the extension (the spec: never
    from an earlier request's)."""
    meta: Any = ctx.meta or {}
    capabilities = meta.get(CLIENT_CAPABILITIES_META_KEY) if isinstance(meta, dict) else None
    if capabilities is None:
        return False
    extensions = (
        capabilities.get("extensions")
        if isinstance(capabilities, dict)
        else getattr(capabilities, "extensions", None)
    )
    return isinstance(extensions, dict) and TASKS in extensions


def _tail(stdout: str, message: str) -> str:
    """A working task's status: how long it has run, and its newest output."""
    newest = stdout[-500:]
    return f"{message}; newest output:\n{newest}" if newest else message


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
