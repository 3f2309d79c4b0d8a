"""The gateway under uvicorn, driven by the mcp SDK's own clients over SSE and Streamable HTTP."""

from __future__ import annotations

import base64
import io
import re

import anyio
import httpx
import pytest
from mcp.types import ImageContent
from PIL import Image

from python_mcp_server import Settings, create_app
from tests.gateway.conftest import KILL_LIMIT
from tests.support import closed_port, connect, memory_is_a_cgroup, serve, text_of

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("transport", ["sse", "http"])]

FIGURES = """
import matplotlib.pyplot as plt
plt.figure(figsize=(2, 1)); plt.plot([1, 2, 3]); plt.show()
plt.figure(figsize=(3, 1)); plt.plot([3, 2, 1]); plt.show()
plt.figure(figsize=(4, 1)); plt.bar([1, 2], [3, 4])
print("drawn")
"""


async def call(url: str, transport: str, code: str):  # type: ignore[no-untyped-def]
    with anyio.fail_after(60):
        async with connect(url, transport) as client:
            return await client.call_tool("execute_python_code", {"code": code})


async def test_print(gateway_url: str, transport: str) -> None:
    result = await call(gateway_url, transport, "print('hello', 6 * 7)")
    assert not result.is_error
    assert text_of(result).startswith("hello 42\n")
    assert result.structured_content["returncode"] == 0
    assert result.structured_content["status"] == "ok"


async def test_a_last_expression_is_shown_and_stdin_is_empty(
    gateway_url: str, transport: str
) -> None:
    result = await call(gateway_url, transport, "import sys\nprint(repr(sys.stdin.read()))\n6 * 7")
    assert text_of(result).startswith("''\n42\n[end of output]")
    assert result.structured_content["stdout"] == "''\n42\n"


async def test_exception_shows_only_user_frames(gateway_url: str, transport: str) -> None:
    code = "def f():\n    return 1 / 0\n\nprint('before')\nf()\n"
    result = await call(gateway_url, transport, code)
    text = text_of(result)
    assert not result.is_error, "a user's exception is a normal result"
    assert result.structured_content["returncode"] == 1
    assert result.structured_content["status"] == "exception"
    assert text.startswith("before\nTraceback (most recent call last):")
    assert "line 5, in <module>" in text and "line 2, in f" in text
    assert "ZeroDivisionError: division by zero" in text
    assert "_mcp_" not in text and "runpy" not in text


async def test_sys_exit_status(gateway_url: str, transport: str) -> None:
    result = await call(gateway_url, transport, "import sys\nprint('bye')\nsys.exit(3)")
    assert result.structured_content["returncode"] == 3
    assert "exit code 3" in text_of(result)


async def test_figures_come_back_as_images_in_order(gateway_url: str, transport: str) -> None:
    result = await call(gateway_url, transport, FIGURES)
    assert text_of(result).startswith("drawn\n")
    images = [c for c in result.content if isinstance(c, ImageContent)]
    assert len(images) == 3
    widths = []
    for image in images:
        assert image.mime_type == "image/png"
        data = base64.b64decode(image.data)
        assert data.startswith(b"\x89PNG\r\n\x1a\n")
        with Image.open(io.BytesIO(data)) as png:
            png.verify()
            widths.append(png.size[0])
    assert widths[0] < widths[1] < widths[2], "figures arrive in drawing order"
    assert [i["width"] for i in result.structured_content["images"]] == widths


async def test_files_the_code_saves_are_listed(gateway_url: str, transport: str) -> None:
    code = "open('table.csv', 'w').write('a,b\\n1,2\\n')\nprint('saved')"
    result = await call(gateway_url, transport, code)
    files = result.structured_content["files"]
    assert [(f["path"], f["size"], f["mime_type"]) for f in files] == [("table.csv", 8, "text/csv")]
    assert files[0]["uri"].startswith("session://")
    assert '[files written: "table.csv" (8 bytes)]' in text_of(result)


async def test_time_limit_kill(
    kill_gateway_url: str, transport: str, request: pytest.FixtureRequest
) -> None:
    result = await call(
        kill_gateway_url, transport, "print('spinning', flush=True)\nwhile True: pass"
    )
    assert not result.is_error
    text = text_of(result)
    assert text.startswith("spinning\n")
    assert "memory" not in text
    # The built-in evaluator says which limit (ended_by), and the model is told what to do. In
    # its own sessions the code is interrupted and the session lives on; one-shot, it is killed.
    if request.node.callspec.params["kill_gateway_url"] == "in-process":
        assert result.structured_content["returncode"] == 130
        assert result.structured_content["status"] == "interrupted"
        assert "the time limit was reached; the session's variables are kept" in text
        stopped_after = re.search(r"interrupted after (\d+\.\d) s", text)
    else:
        assert result.structured_content["returncode"] == 137
        assert result.structured_content["status"] == "killed"
        assert "the time limit was reached; make the code faster or make it do less" in text
        stopped_after = re.search(r"killed after (\d+\.\d) s", text)
    # Not before the limit; the upper bound only says the run did not go on unbounded.
    assert stopped_after and KILL_LIMIT <= float(stopped_after.group(1)) < KILL_LIMIT + 10


async def test_memory_limit_kill(
    gateway_url: str, transport: str, request: pytest.FixtureRequest
) -> None:
    result = await call(gateway_url, transport, "x = bytearray(2 * 1024**3)\nprint('survived')")
    assert not result.is_error
    text = text_of(result)
    # The size is named when the gateway knows it: its own evaluator, not one over HTTP.
    in_process = request.node.callspec.params["gateway_url"] == "in-process"
    limit = r" \(\d[\d,]* MiB\)" if in_process else ""
    if memory_is_a_cgroup():
        assert result.structured_content["returncode"] == 137
        assert result.structured_content["status"] == "killed"
        assert text.startswith("(no output)")
        assert re.search(
            f"the memory limit{limit} was reached; use less memory, e.g. process", text
        )
    else:  # an ordinary user's address-space rlimit: MemoryError
        assert result.structured_content["returncode"] == 1 and "MemoryError" in text
        assert re.search(f"the memory limit{limit} was likely reached; use less memory", text)
    assert "time limit" not in text


async def test_output_flood_is_capped_and_cut(gateway_url: str, transport: str) -> None:
    result = await call(gateway_url, transport, "while True:\n    print('x' * 999)")
    structured = result.structured_content
    assert structured["returncode"] == 143
    assert structured["status"] == "output_limit"
    assert structured["stdout_truncated"] is True
    text = text_of(result)
    assert "[... output cut:" in text and "output limit was reached" in text
    assert len(text) < 25_000


async def test_unreachable_evaluator_is_a_tool_error(transport: str) -> None:
    dead = f"http://127.0.0.1:{closed_port()}"
    with serve(create_app(Settings(snekbox_url=dead))) as url:
        result = await call(url, transport, "print(1)")
        async with httpx.AsyncClient() as http:
            ready = await http.get(f"{url}/readyz")
    assert result.is_error
    assert "unreachable" in text_of(result) and "did not run" in text_of(result)
    assert ready.status_code == 503
    reason = "the evaluation service is unreachable"
    assert ready.json() == {"status": "unavailable", "reason": reason}
