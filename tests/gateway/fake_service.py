"""A fake evaluation service, handed to the gateway in place of Snekbox or the evaluator.

It answers ``/eval``-shaped requests from a script of results (or errors, or functions of the
request), records every request, ends and replica choice, and fails on demand: the gateway's
call pipeline, sessions, eviction, choices and rendering are tested against it in
milliseconds, with no sandbox, process or socket.
"""

from __future__ import annotations

import asyncio
import json
import marshal
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from gateway.environment import PROBE
from snekbox_client import (
    EvalRequest,
    EvalResult,
    EvaluatorRejected,
    EvaluatorUnavailable,
    File,
    ServiceInfo,
    SnekboxError,
)

#: What the fake's Python is found to be by the gateway's environment probe.
ENVIRONMENT = {"python": "3.12.1", "packages": {"numpy": "2.1.0", "matplotlib": "3.9.2"}}

#: One step of a script: an answer, an error to raise, or a function of the request.
Step = EvalResult | SnekboxError | Callable[[EvalRequest], EvalResult | Awaitable[EvalResult]]

#: What a live service says of itself: it keeps interpreters, and honours a call's time limit.
LIVE = ServiceInfo(max_sessions=100, session_idle_timeout=600.0, time_limit=10.0)


def ok(stdout: str = "", *files: File, **fields: Any) -> EvalResult:
    """A run that ended by itself with ``stdout`` and wrote ``files``."""
    fields.setdefault("returncode", 0)
    fields.setdefault("ended_by", "exit")
    return EvalResult(stdout=stdout, files=files, **fields)


def code_of(request: EvalRequest) -> str:
    """The user's code a request runs: the launcher's argument, or in the prelude's bundle."""
    if request.args and request.args[0] == "-c":
        return request.args[2]
    head = marshal.loads(request.files[1].content)
    return bytes(head[3]).decode("utf-8", "surrogatepass")


class FakeService:
    """The gateway's :class:`~gateway.connection.EvaluationService`, scripted.

    Args:
        steps: The answers to the calls' requests, in order; once they run out, every run
            prints nothing and exits 0.
        info: What ``GET /info`` answers (default: Snekbox's nothing, one-shot runs).
        replica: What :meth:`choose_replica` answers.
    """

    def __init__(
        self, *steps: Step, info: ServiceInfo | None = None, replica: str | None = None
    ) -> None:
        self.script: deque[Step] = deque(steps)
        self.info_answer = info or ServiceInfo.none()
        self.replica = replica
        #: The calls' requests, in order, with the replica each was sent to.
        self.requests: list[EvalRequest] = []
        self.replicas: list[str | None] = []
        #: The environment probes run (not counted in :attr:`requests`).
        self.probes = 0
        #: The live sessions ended (``DELETE``), with their replica.
        self.ended: list[tuple[str, str | None]] = []
        #: Set: every request waits for it (to hold calls in flight).
        self.gate: asyncio.Event | None = None
        #: Set: ping fails, as an unreachable service's does.
        self.down = False
        self.closed = False
        #: The answers to reads of running cells, in order (then 409: no cell).
        self.read_script: deque[EvalResult | SnekboxError] = deque()
        #: The reads made: (session, wait, early).
        self.reads: list[tuple[str, float, bool]] = []
        #: The sessions whose cells were interrupted.
        self.interrupted: list[str] = []

    def then(self, *steps: Step) -> FakeService:
        """Add ``steps`` to the script."""
        self.script.extend(steps)
        return self

    def fail(self, error: SnekboxError) -> None:
        """Make the next request fail with ``error``."""
        self.script.appendleft(error)

    @property
    def codes(self) -> list[str]:
        """The user code of each request."""
        return [code_of(request) for request in self.requests]

    async def eval(
        self, request: EvalRequest, *, replica: str | None = None, extra_time: float = 0.0
    ) -> EvalResult:
        if request.input == PROBE:
            self.probes += 1
            return EvalResult(stdout=json.dumps(ENVIRONMENT) + "\n", returncode=0)
        self.requests.append(request)
        self.replicas.append(replica)
        if self.gate is not None:
            await self.gate.wait()
        step = self.script.popleft() if self.script else ok()
        if isinstance(step, SnekboxError):
            raise step
        if isinstance(step, EvalResult):
            return step
        answer = step(request)
        return await answer if isinstance(answer, Awaitable) else answer

    async def end_session(self, session: str, *, replica: str | None = None) -> None:
        self.ended.append((session, replica))

    async def read_output(
        self, session: str, *, wait: float, early: bool = False, replica: str | None = None
    ) -> EvalResult:
        self.reads.append((session, wait, early))
        if not self.read_script:
            raise EvaluatorRejected(409, "Cell conflict", "no cell")
        step = self.read_script.popleft()
        if isinstance(step, SnekboxError):
            raise step
        return step

    async def interrupt(self, session: str, *, replica: str | None = None) -> None:
        if not self.read_script:
            raise EvaluatorRejected(409, "Cell conflict", "no cell is running")
        self.interrupted.append(session)

    async def choose_replica(self) -> str | None:
        return self.replica

    async def info(self) -> ServiceInfo:
        return self.info_answer

    async def ping(self) -> None:
        if self.down:
            raise EvaluatorUnavailable("fake", "down on purpose")

    async def aclose(self) -> None:
        self.closed = True
