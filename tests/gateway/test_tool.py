"""The tool's behaviour through an in-memory MCP client, on the built-in evaluator."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import pytest
from mcp import Client
from mcp.types import ImageContent

from gateway.connection import evaluation_service
from python_mcp_server import Gateway, Settings, create_server
from tests.gateway.fake_service import FakeService
from tests.support import TIME_LIMIT, text_of

pytestmark = pytest.mark.anyio


@pytest.fixture
async def client(settings: Settings) -> AsyncIterator[Client]:
    async with (
        Gateway(settings, evaluation_service(settings)) as gateway,
        Client(create_server(gateway)) as client,
    ):
        yield client


async def run(client: Client, code: str):  # type: ignore[no-untyped-def]
    with anyio.fail_after(60):
        return await client.call_tool("execute_python_code", {"code": code})


async def test_tool_is_listed_with_description_and_output_schema(
    client: Client, settings: Settings
) -> None:
    tools = (await client.list_tools()).tools
    assert sorted(t.name for t in tools) == [
        "end_session",
        "execute_python_code",
        "get_output",
        "interrupt",
    ]
    tool = next(t for t in tools if t.name == "execute_python_code")
    assert tool.input_schema["required"] == ["code"]
    properties = tool.input_schema["properties"]
    assert properties["code"]["type"] == "string"
    assert {"session_id", "files", "timeout_seconds", "wait_seconds"} <= set(properties)
    for name in ("get_output", "interrupt"):  # the tools that follow a running cell
        follower = next(t for t in tools if t.name == name)
        assert follower.input_schema["required"] == ["session_id"]
        assert follower.output_schema is not None
    assert "get_output(session_id, wait_seconds)" in (tool.description or "")
    assert "maximum" in properties["timeout_seconds"]["description"]
    assert tool.annotations is not None
    assert (tool.annotations.read_only_hint, tool.annotations.idempotent_hint) == (False, False)
    assert "session_id" in tool.output_schema["properties"] if tool.output_schema else False
    assert "Sessions are like a notebook" in (tool.description or "")
    # In front of Snekbox (one-shot), the description says what a session keeps there.
    one_shot = Gateway(settings, FakeService())  # not started: nothing said of sessions
    assert "variables and imports do NOT carry over" in one_shot.tool_description()
    wall_clock = f"{TIME_LIMIT:g} s wall-clock"
    for promise in ("numpy", "matplotlib", "no network", "PNG image", wall_clock):
        assert promise in (tool.description or ""), promise
    assert tool.output_schema is not None
    assert {"stdout", "returncode", "status", "images", "files"} <= set(
        tool.output_schema["properties"]
    )


async def test_stderr_is_merged_in_order(client: Client) -> None:
    code = "import sys\nprint('one')\nprint('two', file=sys.stderr)\nprint('three')"
    assert text_of(await run(client, code)).startswith("one\ntwo\nthree\n")


async def test_future_import_and_main_name(client: Client) -> None:
    code = "from __future__ import annotations\ndef f(x: Undefined) -> None: ...\nprint(__name__)"
    result = await run(client, code)
    assert text_of(result).startswith("__main__\n")
    assert result.structured_content["returncode"] == 0


async def test_syntax_error_points_at_the_users_line(client: Client) -> None:
    result = await run(client, "x = 1\ny = (\n")
    text = text_of(result)
    assert result.structured_content["returncode"] == 1
    assert "SyntaxError" in text and "line 2" in text
    assert result.structured_content["status"] == "exception"


async def test_segfault_is_described_by_signal(client: Client) -> None:
    result = await run(client, "import ctypes\nctypes.string_at(0)")
    assert result.structured_content["returncode"] == 139
    assert result.structured_content["status"] == "signal"
    assert "SIGSEGV" in text_of(result)


async def test_numpy_and_pandas_work(client: Client) -> None:
    code = "import numpy as np, pandas as pd\nprint(pd.DataFrame({'a': np.arange(3)}).a.sum())"
    assert text_of(await run(client, code)).startswith("3\n")


async def test_no_state_between_calls(client: Client) -> None:
    await run(client, "x = 41\nopen('kept.txt', 'w').write('x')")
    result = await run(client, "import os\nprint('x' in globals(), os.path.exists('kept.txt'))")
    assert text_of(result).startswith("False False\n")


async def test_figure_budget_drops_figures_and_says_so(settings: Settings) -> None:
    code = "import matplotlib.pyplot as plt\nfor i in range(4):\n    plt.figure(); plt.plot([i, 0])"
    small = settings.model_copy(update={"max_images": 2})
    async with (
        Gateway(small, evaluation_service(small)) as gateway,
        Client(create_server(gateway)) as client,
    ):
        result = await run(client, code)
    images = [c for c in result.content if isinstance(c, ImageContent)]
    assert len(images) == 2
    assert [i["returned"] for i in result.structured_content["images"]] == [
        True,
        True,
        False,
        False,
    ]
    assert "2 of 4 figures not returned: figure_003.png" in text_of(result)


async def test_wrong_argument_type_is_a_clear_error(client: Client) -> None:
    with anyio.fail_after(30):
        result = await client.call_tool("execute_python_code", {"code": 42})
    assert result.is_error
    assert "code" in text_of(result)


@pytest.mark.parametrize("installed", [False, True])
async def test_the_sdks_spans_are_kept_only_when_a_tracer_provider_is_installed(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, installed: bool
) -> None:
    """Without a provider OpenTelemetry records nothing, so the SDK's span per call is dropped."""
    from mcp.server._otel import OpenTelemetryMiddleware
    from opentelemetry import trace

    if installed:  # what `opentelemetry-instrument` or the hosting code does before the app
        monkeypatch.setattr(trace, "get_tracer_provider", trace.NoOpTracerProvider)
    async with Gateway(settings, evaluation_service(settings)) as gateway:
        server = create_server(gateway)
        async with Client(server) as client:
            result = await run(client, "print(6 * 7)")
    kept = [m for m in server.middleware if isinstance(m, OpenTelemetryMiddleware)]
    assert len(kept) == (1 if installed else 0)
    assert text_of(result).startswith("42\n")
