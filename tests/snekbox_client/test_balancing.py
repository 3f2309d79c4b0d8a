"""Requests spread over a service's replicas: real evaluators behind one name, on loopback.

The name ``evaluator.test`` resolves, through a resolver given to the transport (the seam: no
test may edit /etc/hosts), to the replicas of ``conftest.replicas``; the system resolution is
tested on its own, with ``localhost``.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import AsyncIterator, Iterator, Sequence

import anyio
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from snekbox_client import (
    BalancingTransport,
    EvalRequest,
    EvaluatorUnavailable,
    ReplicaGone,
    SnekboxClient,
)
from snekbox_client._balancing import resolve
from tests.support import raw_server, reset_unread

from .conftest import IDENTIFY, REPLICAS, evaluator_at, port_free_on

pytestmark = pytest.mark.anyio

NAME = "evaluator.test"


class Answers:
    """A resolver whose answer the test changes; counts its calls."""

    def __init__(self, addresses: Sequence[str]) -> None:
        self.addresses = list(addresses)
        self.calls = 0
        self.error: OSError | None = None

    async def __call__(self, host: str, port: int) -> list[str]:
        assert host == NAME
        self.calls += 1
        if self.error is not None:
            raise self.error
        return list(self.addresses)


@contextlib.asynccontextmanager
async def balanced(
    port: int, answers: Answers, refresh_interval: float = 60.0
) -> AsyncIterator[tuple[SnekboxClient, BalancingTransport]]:
    transport = BalancingTransport(NAME, port, resolver=answers, refresh_interval=refresh_interval)
    async with SnekboxClient(f"http://{NAME}:{port}", transport=transport) as client:
        yield client, transport


async def replica_of(client: SnekboxClient, code: str = IDENTIFY) -> int:
    """Which replica ran ``code`` (see ``conftest.replicas``)."""
    with anyio.fail_after(60):
        result = await client.eval(EvalRequest(input=code))
    assert result.returncode == 0, result
    return len(result.files)


async def test_sequential_calls_go_round_robin(replicas: int) -> None:
    """In address order, whatever the resolver's order; probes do not move the rotation."""
    answers = Answers(["127.0.0.3", "127.0.0.1", "127.0.0.2"])
    async with balanced(replicas, answers) as (client, _):
        seen = []
        for _ in range(9):
            seen.append(await replica_of(client))
            await client.ping()
    assert seen == [1, 2, 3] * 3


async def test_the_least_busy_replica_gets_the_next_call(replicas: int) -> None:
    """Two long calls hold two replicas: every short call meanwhile goes to the third."""
    long_ones: list[int] = []
    async with (
        balanced(replicas, Answers(REPLICAS)) as (client, transport),
        anyio.create_task_group() as group,
    ):

        async def long_call() -> None:
            code = "import time\ntime.sleep(8)\n" + IDENTIFY
            long_ones.append(await replica_of(client, code))

        group.start_soon(long_call)
        group.start_soon(long_call)
        with anyio.fail_after(60):
            while sum(a.in_flight for a in transport.addresses) < 2:  # noqa: ASYNC110 (polled)
                await anyio.sleep(0.01)
        short_ones = [await replica_of(client) for _ in range(4)]
        assert sum(a.in_flight for a in transport.addresses) == 2, "the long calls ended"
    assert sorted(long_ones) == [1, 2]
    assert short_ones == [3, 3, 3, 3]


async def test_a_pinned_request_goes_to_its_replica_and_nowhere_else(replicas: int) -> None:
    """A live session is in one replica's memory: its calls go there, whatever the rotation
    (elsewhere, ``session_resume`` would be refused 404); a replica gone is said so."""
    answers = Answers(list(REPLICAS))
    async with balanced(replicas, answers, refresh_interval=0.2) as (client, _):
        with anyio.fail_after(120):
            replica = await client.choose_replica()
            assert replica in REPLICAS
            first = await client.eval(EvalRequest(input="x = 1", session="pinned"), replica=replica)
            assert first.session_ended is False
            resume = EvalRequest(input="x += 1\nprint(x)", session="pinned", session_resume=True)
            counts = []
            for _ in range(4):
                counts.append((await client.eval(resume, replica=replica)).stdout)
                await client.eval(EvalRequest(input="1"))  # moves the rotation on
            await client.end_session("pinned", replica=replica)
        assert counts == ["2\n", "3\n", "4\n", "5\n"]
        answers.addresses = [a for a in REPLICAS if a != replica]
        await anyio.sleep(0.3)
        with pytest.raises(ReplicaGone, match="no longer resolves to the replica"):
            await client.eval(resume, replica=replica)


async def test_a_replica_that_dies_is_skipped(replicas: int) -> None:
    """Its call goes to another replica at once (a refused connection sent nothing)."""
    with evaluator_at("127.0.0.4", replicas, "--max-files", "4") as fourth:
        answers = Answers([*REPLICAS, "127.0.0.4"])
        # Resolved again only on the refused connection, however slow a loaded host makes
        # the eleven runs (the default interval, 60 s, could pass too).
        async with balanced(replicas, answers, refresh_interval=3600.0) as (client, transport):
            assert [await replica_of(client) for _ in range(4)] == [1, 2, 3, 4]
            fourth.kill()
            fourth.wait(timeout=10)
            after = [await replica_of(client) for _ in range(7)]
            down = {a.address for a in transport.addresses if a.down}
    # 127.0.0.4's turn came after 3: refused, the call went to 1; then 4 is skipped.
    assert after == [1, 2, 3, 1, 2, 3, 1]
    assert down == {"127.0.0.4"}
    assert answers.calls == 2, "a connection error makes the name be resolved again"


async def test_a_request_reset_unread_is_not_sent_to_another_replica(replicas: int) -> None:
    """A replica resets a new connection once the request has come, unread: it is skipped from
    then on, but this request is not sent again elsewhere (a proxy that resets on its own could
    have forwarded it: it could run twice); the call is "unreachable", the code did not run."""
    with raw_server(reset_unread, host="127.0.0.4", port=replicas):
        answers = Answers([*REPLICAS, "127.0.0.4"])
        async with balanced(replicas, answers, refresh_interval=3600.0) as (client, transport):
            assert [await replica_of(client) for _ in range(3)] == [1, 2, 3]
            with pytest.raises(EvaluatorUnavailable, match="reset with the request unread"):
                await client.eval(EvalRequest(input=IDENTIFY))
            assert {a.address for a in transport.addresses if a.down} == {"127.0.0.4"}
            assert await replica_of(client) == 1


async def test_when_every_address_is_down_the_error_says_so(replicas: int) -> None:
    answers = Answers(["127.0.0.4"])  # listed, nothing listens there
    async with balanced(replicas, answers) as (client, transport):
        for _ in range(2):  # down, and still tried: it is the only one
            with pytest.raises(EvaluatorUnavailable, match="unreachable"):
                await client.eval(EvalRequest(input="print(1)"))
        assert [a.down for a in transport.addresses] == [True]


async def test_the_name_is_resolved_again_and_the_answer_followed(replicas: int) -> None:
    answers = Answers(["127.0.0.1"])
    async with balanced(replicas, answers, refresh_interval=0.2) as (client, transport):
        assert [await replica_of(client) for _ in range(2)] == [1, 1]
        answers.addresses = ["127.0.0.2", "127.0.0.3"]  # replica 1 removed, two added
        await anyio.sleep(0.3)
        assert [await replica_of(client) for _ in range(4)] == [2, 3, 2, 3]
        assert [a.address for a in transport.addresses] == ["127.0.0.2", "127.0.0.3"]
        # A resolution that fails keeps the addresses known.
        answers.error = OSError("the DNS is down")
        await anyio.sleep(0.3)
        assert await replica_of(client) in (2, 3)


async def test_a_name_that_does_not_resolve_is_unavailable(replica_port: int) -> None:
    answers = Answers(REPLICAS)
    answers.error = OSError("Name or service not known")
    async with balanced(replica_port, answers) as (client, _):
        with pytest.raises(
            EvaluatorUnavailable, match=f"cannot resolve {re.escape(NAME)}: Name or service"
        ):
            await client.eval(EvalRequest(input="print(1)"))


# --- The Host header -------------------------------------------------------------------------


@contextlib.contextmanager
def witness(
    address: str, port: int, probes: tuple[threading.Event, threading.Event] | None = None
) -> Iterator[None]:
    """A server on ``address:port`` that answers each /eval with the Host header it received.

    With ``probes`` (arrived, answer), an ``OPTIONS /eval`` sets the first and is answered once
    the second is set: a health check that stays in flight (the fake's one reason to be).
    """

    async def eval_(request: Request) -> Response:
        if request.method == "OPTIONS":
            if probes is not None:
                probes[0].set()
                await anyio.to_thread.run_sync(probes[1].wait, 30)
            return Response()
        stdout = f"{request.headers['host']} at {address}"
        return JSONResponse({"stdout": stdout, "returncode": 0, "files": []})

    app = Starlette(routes=[Route("/eval", eval_, methods=["POST", "OPTIONS"])])
    server = uvicorn.Server(uvicorn.Config(app, host=address, port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the witness did not start"
        time.sleep(0.01)
    try:
        yield
    finally:
        server.should_exit = True
        thread.join(timeout=10)


async def test_the_host_header_stays_the_name() -> None:
    addresses = ["127.0.0.5", "127.0.0.6"]
    port = port_free_on(addresses)
    with witness(addresses[0], port), witness(addresses[1], port):
        async with balanced(port, Answers(addresses)) as (client, _):
            answers = [(await client.eval(EvalRequest(input="x"))).stdout for _ in range(2)]
    assert answers == [f"{NAME}:{port} at 127.0.0.5", f"{NAME}:{port} at 127.0.0.6"]


async def test_a_health_probe_in_flight_does_not_move_the_evaluations() -> None:
    """Health checks come at any moment: one in flight on a replica must not send the next
    evaluations elsewhere (a sequential rotation seen broken by the compose test)."""
    addresses = ["127.0.0.5", "127.0.0.6"]
    port = port_free_on(addresses)
    arrived, answer = threading.Event(), threading.Event()
    with witness(addresses[0], port, (arrived, answer)), witness(addresses[1], port):
        async with (
            balanced(port, Answers(addresses)) as (client, _),
            anyio.create_task_group() as group,
        ):
            group.start_soon(client.ping)  # to 127.0.0.5, the next in line; held there
            assert await anyio.to_thread.run_sync(arrived.wait, 30)
            seen = []
            for _ in range(4):
                seen.append((await client.eval(EvalRequest(input="x"))).stdout.split()[-1])
            answer.set()
    assert seen == addresses * 2


# --- The system resolver, and which transport a URL gets ---------------------------------------


async def test_the_system_resolver_resolves_localhost() -> None:
    assert "127.0.0.1" in await resolve("localhost", 8060)
    assert await resolve("127.0.0.7", 8060) == ["127.0.0.7"]


async def test_an_http_url_is_balanced_by_default(replicas: int) -> None:
    async with SnekboxClient(f"http://localhost:{replicas}") as client:
        assert isinstance(client.transport, BalancingTransport)
        assert await replica_of(client) == 1  # localhost is 127.0.0.1 (and maybe ::1: refused)
        assert "127.0.0.1" in [a.address for a in client.transport.addresses]


async def test_an_https_url_keeps_httpx_own_transport() -> None:
    async with SnekboxClient("https://snekbox.example:8060") as client:
        assert client.transport is None


async def test_requests_for_another_host_are_refused() -> None:
    transport = BalancingTransport(NAME, 80, resolver=Answers(REPLICAS))
    async with SnekboxClient("http://elsewhere.test", transport=transport) as client:
        with pytest.raises(EvaluatorUnavailable, match=r"serves evaluator\.test:80 only"):
            await client.ping()
