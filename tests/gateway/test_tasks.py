"""The tasks extension (MCP 2026-07-28, ``io.modelcontextprotocol/tasks``) over raw JSON-RPC:
a long call that declares it becomes a task, polled with ``tasks/get`` to its result, cancelled
with ``tasks/cancel``; one that does not declare it never gets a task; only its owner sees it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import pytest

from gateway.tokens import ClientTokens
from python_mcp_server import Settings

from .conftest import gateway, with_evaluator

pytestmark = pytest.mark.xdist_group("tasks")

TASKS = "io.modelcontextprotocol/tasks"
TOKENS = {"alice": "alice-token-0123456789", "bob": "bob-token-0123456789ab"}
COUNT = "import time\nfor i in range(4):\n    print(i, flush=True)\n    time.sleep(1)\n"


@pytest.fixture(scope="module", params=["in-process", "live-over-http"])
def url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tokens = tmp_path_factory.mktemp("tokens") / "tokens"
    tokens.write_text("".join(f"{name} {token}\n" for name, token in TOKENS.items()))
    settings = Settings(auth_tokens_file=ClientTokens.read(tokens))
    with gateway(with_evaluator(settings, time_limit=60), request.param) as served:
        yield served


async def rpc(
    url: str, method: str, params: dict[str, Any], *, who: str = "alice", tasks: bool = True
) -> dict[str, Any]:
    """One 2026-07-28 request (sessionless), its JSON-RPC answer."""
    capabilities: dict[str, Any] = {"extensions": {TASKS: {}}} if tasks else {}
    meta = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": capabilities,
        "io.modelcontextprotocol/clientInfo": {"name": "test", "version": "1"},
    }
    name = params.get("taskId") or params.get("name")
    headers = {
        "Authorization": f"Bearer {TOKENS[who]}",
        "MCP-Protocol-Version": "2026-07-28",
        "Accept": "application/json, text/event-stream",
        "Mcp-Method": method,
        **({"Mcp-Name": name} if name else {}),
    }
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": {**params, "_meta": meta}}
    with anyio.fail_after(120):
        async with httpx.AsyncClient(timeout=120) as http:
            response = await http.post(f"{url}/mcp", json=body, headers=headers)
    # A JSON-RPC error comes with a 4xx status in this era; the body says which.
    assert response.status_code in (200, 400), response.text
    text = response.text
    if "data:" in text:  # an SSE answer: its last event
        text = [line[5:] for line in text.splitlines() if line.startswith("data:")][-1]
    answer: dict[str, Any] = json.loads(text)
    return answer


async def call(url: str, code: str, **options: Any) -> dict[str, Any]:
    params = {"name": "execute_python_code", "arguments": {"code": code}}
    return await rpc(url, "tools/call", params, **options)


async def poll(url: str, task_id: str) -> dict[str, Any]:
    for _ in range(60):
        answer: dict[str, Any] = (await rpc(url, "tasks/get", {"taskId": task_id}))["result"]
        if answer["status"] != "working":
            return answer
        await anyio.sleep(answer["pollIntervalMs"] / 1000)
    raise AssertionError("the task never ended")


async def test_a_long_call_becomes_a_task_read_to_its_result(url: str) -> None:
    created = (await call(url, COUNT))["result"]
    assert created["resultType"] == "task" and created["status"] == "working"
    ended = await poll(url, created["taskId"])
    assert ended["status"] == "completed"
    result = ended["result"]
    assert result["structuredContent"]["stdout"] == "0\n1\n2\n3\n"  # nothing lost
    assert result["structuredContent"]["status"] == "ok" and not result["isError"]
    again = (await rpc(url, "tasks/get", {"taskId": created["taskId"]}))["result"]
    assert again["status"] == "completed" and again["result"] == result


async def test_a_short_call_and_a_client_without_the_extension_get_no_task(url: str) -> None:
    quick = (await call(url, "print('hi')"))["result"]
    assert quick["resultType"] == "complete" and quick["structuredContent"]["stdout"] == "hi\n"
    plain = (await call(url, COUNT, tasks=False))["result"]
    assert plain["resultType"] == "complete"
    assert plain["structuredContent"]["stdout"] == "0\n1\n2\n3\n"


async def test_cancelling_a_task_interrupts_its_cell(url: str) -> None:
    created = (await call(url, "while True:\n    pass"))["result"]
    acknowledged = await rpc(url, "tasks/cancel", {"taskId": created["taskId"]})
    assert "error" not in acknowledged, acknowledged
    ended = await poll(url, created["taskId"])
    assert ended["status"] == "cancelled"


async def test_another_token_cannot_see_a_task(url: str) -> None:
    created = (await call(url, COUNT))["result"]
    for method in ("tasks/get", "tasks/cancel"):
        refused = await rpc(url, method, {"taskId": created["taskId"]}, who="bob")
        assert refused["error"]["code"] == -32602, refused
    unknown = await rpc(url, "tasks/get", {"taskId": "no-such-task"})
    assert unknown["error"]["code"] == -32602
    assert (await poll(url, created["taskId"]))["status"] == "completed"
