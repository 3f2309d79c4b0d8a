"""The Docker stack, live: the gateway's published port driven by the mcp SDK's clients.

Runs only when COMPOSE_TEST_URL names a running stack (set by .ci/compose-test, which builds
the images, starts each stack with 3 evaluator replicas and tears it down after). Otherwise
every test here is skipped: the fast suite needs no Docker daemon.

COMPOSE_TEST_STACK says which evaluation service stands behind the gateway: "builtin" (the
project's evaluator, compose.builtin.yaml) or "snekbox" (the real Snekbox, compose.yaml, built
from upstream's sources and run with the least set of capabilities). The other variables:
tests/compose/live.py. The Snekbox stack's own promises (its limits, a session's files):
test_compose_snekbox.py; two gateways: test_compose_gateways.py.
"""

from __future__ import annotations

import base64

import anyio
import httpx
import pytest
from mcp.types import ImageContent

from tests.compose.live import NO_STACK, REPLICAS, STACK, TIME_LIMIT, URL, call, replicas_of, where
from tests.evaluator import isolation
from tests.support import connect, text_of

pytestmark = pytest.mark.skipif(not URL, reason=NO_STACK)


@pytest.mark.anyio
async def test_which_evaluation_service_is_under_test() -> None:
    """NsJail names every run "snekbox" (docker/snekbox/snekbox.cfg); the built-in evaluator's
    runs keep their container's name."""
    result = await call("http", "import socket\nprint(socket.gethostname())")
    assert not result.is_error, result
    hostname = text_of(result).splitlines()[0]
    print(f"stack {STACK}: a run's host name is {hostname!r}")
    assert (hostname == "snekbox") == (STACK == "snekbox"), hostname


def test_health_and_readiness() -> None:
    assert httpx.get(f"{URL}/healthz", timeout=10).status_code == 200
    ready = httpx.get(f"{URL}/readyz", timeout=10)
    assert ready.status_code == 200, ready.text
    assert ready.json()["status"] == "ready"


@pytest.mark.anyio
@pytest.mark.parametrize("transport", ["sse", "http"])
async def test_print(transport: str) -> None:
    result = await call(transport, "print('hello from the stack', 6 * 7)")
    assert not result.is_error, result
    assert text_of(result).startswith("hello from the stack 42\n")
    assert result.structured_content["returncode"] == 0


@pytest.mark.anyio
@pytest.mark.parametrize("transport", ["sse", "http"])
async def test_matplotlib_figure_comes_back_as_an_image(transport: str) -> None:
    code = (
        "import matplotlib.pyplot as plt\n"
        "plt.figure(figsize=(3, 2)); plt.plot([1, 4, 9]); plt.title('stack'); plt.show()\n"
        "print('drawn')\n"
    )
    result = await call(transport, code)
    assert not result.is_error, result
    assert text_of(result).startswith("drawn\n")
    images = [c for c in result.content if isinstance(c, ImageContent)]
    assert len(images) == 1
    assert images[0].mime_type == "image/png"
    assert base64.b64decode(images[0].data).startswith(b"\x89PNG\r\n\x1a\n")


@pytest.mark.anyio
async def test_the_time_limit_interrupts_then_kills() -> None:
    """A live session's cell is interrupted at the time limit (the session goes on); code that
    will not stop is killed after the grace. Snekbox has no live session: NsJail kills the run
    at its time limit (docker/snekbox/snekbox.cfg)."""
    spin = "print('spinning', flush=True)\nwhile True:\n    pass\n"
    cases = [(spin, "interrupted", 130)] if STACK == "builtin" else [(spin, "killed", 137)]
    if STACK == "builtin":
        cases.append(
            (
                "print('spinning', flush=True)\nwhile True:\n    try:\n        while True:\n"
                "            pass\n    except KeyboardInterrupt:\n        pass\n",
                "killed",
                137,
            )
        )
    for code, status, returncode in cases:
        started = anyio.current_time()
        result = await call("http", code)
        elapsed = anyio.current_time() - started
        assert not result.is_error, "a time-limit stop is a result, not a tool error"
        assert result.structured_content["status"] == status, text_of(result)
        assert result.structured_content["returncode"] == returncode
        assert text_of(result).startswith("spinning\n")
        assert TIME_LIMIT - 0.5 <= elapsed <= TIME_LIMIT + 20


@pytest.mark.anyio
async def test_the_working_directory_is_bounded() -> None:
    if STACK != "builtin":
        pytest.skip("the built-in evaluator's promise (Snekbox bounds its own tmpfs)")
    result = await call("http", isolation.DISK)
    assert not result.is_error, result
    # The output, then the status line: both writes ended in ENOSPC.
    assert text_of(result).startswith("ENOSPC\nENOSPC True\n"), text_of(result)


@pytest.mark.anyio
async def test_sequential_calls_go_round_robin_over_the_replicas() -> None:
    """The gateway balances itself (snekbox_client.BalancingTransport), not Docker's DNS order."""
    if REPLICAS < 2:
        pytest.skip("the stack was started with one evaluator replica")
    replicas = replicas_of([await where() for _ in range(3 * REPLICAS)])
    print(f"{3 * REPLICAS} sequential calls over {REPLICAS} replicas: {replicas}")
    assert len(set(replicas[:REPLICAS])) == REPLICAS, replicas
    assert replicas == replicas[:REPLICAS] * 3, "not a rotation over every replica"


@pytest.mark.anyio
async def test_concurrent_calls_reach_every_replica() -> None:
    """Fewest in flight first, ties round-robin: within any REPLICAS calls, an idle one is used."""
    if REPLICAS < 2:
        pytest.skip("the stack was started with one evaluator replica")
    seen: list[str] = []

    async def one() -> None:
        seen.append(await where())

    async with anyio.create_task_group() as group:
        for _ in range(30):
            group.start_soon(one)
    replicas = replicas_of(seen)
    spread = {name: replicas.count(name) for name in set(replicas)}
    print(f"30 concurrent calls over {REPLICAS} replicas: {spread}")
    assert len(replicas) == 30
    assert len(spread) == REPLICAS, f"not every replica was used: {spread}"


@pytest.mark.anyio
async def test_a_session_keeps_its_interpreter_on_one_replica() -> None:
    """New sessions spread over the replicas; each session's calls reach the replica whose
    memory holds its interpreter, so its variables last."""
    if STACK != "builtin":
        pytest.skip("Snekbox runs every call in a fresh interpreter: no live session to keep")
    with anyio.fail_after(240):
        async with connect(URL, "http") as client:
            sessions: dict[str, str] = {}  # id: the replica's hostname
            for _ in range(REPLICAS):
                first = await client.call_tool(
                    "execute_python_code", {"code": "import socket\nhome = socket.gethostname()"}
                )
                assert not first.is_error, first
                sessions[first.structured_content["session_id"]] = ""
            for session_id in sessions:
                for _ in range(3):
                    code = "print(home, home == socket.gethostname())"
                    arguments = {"code": code, "session_id": session_id}
                    result = await client.call_tool("execute_python_code", arguments)
                    assert not result.is_error, result
                    home, same = text_of(result).splitlines()[0].split()
                    assert same == "True", "the call reached another replica"
                    sessions[session_id] = home
                await client.call_tool("end_session", {"session_id": session_id})
    print(f"{len(sessions)} sessions on {sorted(set(sessions.values()))}")
    assert len(set(sessions.values())) == REPLICAS, "new sessions did not spread"


@pytest.mark.anyio
async def test_runs_fork_while_every_replica_holds_its_sessions() -> None:
    """Every run of every replica has uid 10001, and the kernel counts a uid's tasks across
    containers: an RLIMIT_NPROC of the uid would be shared by the replicas' ready sandboxes and
    live sessions (a budget of 64 over the service's own processes once made calls fail to start
    an interpreter, "Resource temporarily unavailable"). Each run's is set in its launcher's own
    user namespace, where the kernel counts that run's tasks alone: a run forks its 40."""
    if STACK != "builtin":
        pytest.skip(
            "the built-in evaluator's uid 10001 (Snekbox's pids cgroup: test_compose_snekbox)"
        )
    fork = (  # 40 children alive at once, all reaped before the cell ends
        "import os, socket\n"
        "r, w = os.pipe()\n"
        "children = []\n"
        "for _ in range(40):\n"
        "    child = os.fork()\n"
        "    if child == 0:\n"
        "        os.close(w); os.read(r, 1); os._exit(0)\n"
        "    children.append(child)\n"
        "os.close(w)\n"
        "for child in children:\n"
        "    os.waitpid(child, 0)\n"
        "print(socket.gethostname(), 'forked 40')\n"
    )
    with anyio.fail_after(300):
        async with connect(URL, "http") as client:
            for _ in range(2 * REPLICAS):  # each replica's session limit: 2 GiB / 2 / 384 MiB
                held = await client.call_tool("execute_python_code", {"code": "x = 1"})
                assert not held.is_error, held
            replicas = set()
            for _ in range(REPLICAS):
                result = await client.call_tool("execute_python_code", {"code": fork})
                assert not result.is_error, result
                hostname, said = text_of(result).splitlines()[0].split(" ", 1)
                assert said == "forked 40", text_of(result)
                replicas.add(hostname)
    assert len(replicas) == REPLICAS, replicas
