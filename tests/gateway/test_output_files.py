"""Big output files cost the gateway no memory.

The gateway returns only figures' contents, and lists other files by name and size; a run may
still write 48 MiB of files (sparse ones cost the sandbox no memory at all). Each test runs the
gateway as its own process and, during one such call, resets and then reads its peak RSS
(VmHWM); the event loop's stalls are a timing, which ``bench/bench_output_files.py`` measures
(``/healthz`` polled during the call). Before ``content_wanted`` and the streamed answer, one
call grew the gateway by 130 to 220 MiB and stalled ``/healthz`` for 0.4 to 0.8 s here.
Evaluation services: the built-in evaluator in-process, and a
Snekbox-like one that ignores ``content_wanted`` and sends every content.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.gateway.harness import ServiceProcess, gateway_process
from tests.support import connect, text_of

pytestmark = pytest.mark.anyio

MiB = 1024 * 1024
#: The bound of one hostile call's growth of the gateway's peak RSS. How long the event loop
#: stalls meanwhile is a timing, measured by bench/bench_output_files.py, not asserted here.
MAX_GROWTH_MIB = 30

SPARSE = "for i in range(4):\n    open(f'sparse_{i}.bin', 'wb').truncate(11 * 2**20)\n"
RANDOM = (
    "import os\n"
    "for i in range(4):\n"
    "    with open(f'data_{i}.bin', 'wb') as f:\n"
    "        for _ in range(47):\n"
    "            f.write(os.urandom(1 << 18))\n"
)
#: Sparse 11 MiB files with figures' names and a PNG's first bytes: figures over the budget.
FIGURE_NAMED = (
    "head = b'\\x89PNG\\r\\n\\x1a\\n\\x00\\x00\\x00\\rIHDR' + (3000).to_bytes(4, 'big') * 2\n"
    "for i in range(1, 5):\n"
    "    with open(f'figure_{i:03d}.png', 'wb') as f:\n"
    "        f.write(head)\n"
    "        f.truncate(11 * 2**20)\n"
)
#: Each call, and the files (path, size) its structured result lists.
CALLS = {
    "four-sparse-11MiB-files": (SPARSE, [(f"sparse_{i}.bin", 11 * MiB) for i in range(4)]),
    "47MiB-of-random-files": (RANDOM, [(f"data_{i}.bin", 47 * MiB // 4) for i in range(4)]),
    "figure-named-sparse-files": (FIGURE_NAMED, []),
}
ENV = {"EVALUATOR_TIME_LIMIT": "60", "MCP_EVAL_TIMEOUT": "90"}


def reset_peak(pid: int) -> None:
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := VmRSS


def kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


@pytest.fixture(scope="module")
def snekbox_like() -> Iterator[ServiceProcess]:
    args = ["-m", "tests.snekbox_client.snekbox_like", "--port", "{port}"]
    service = ServiceProcess([*args, "--time-limit", "60"], {}, ("OPTIONS", "/eval"))
    service.start()
    try:
        yield service
    finally:
        service.stop()


@pytest.fixture(scope="module", params=["in-process", "snekbox-like"])
def gateway(request: pytest.FixtureRequest) -> Iterator[ServiceProcess]:
    env = dict(ENV)
    if request.param == "snekbox-like":
        env["SNEKBOX_URL"] = request.getfixturevalue("snekbox_like").url
    service = gateway_process(env)
    service.start()
    try:
        yield service
    finally:
        service.stop()


async def call(url: str, code: str) -> Any:
    async with connect(url, "http") as mcp:
        with anyio.fail_after(120):
            return await mcp.call_tool("execute_python_code", {"code": code})


@pytest.mark.parametrize("name", CALLS)
async def test_big_output_files_cost_the_gateway_little(gateway: ServiceProcess, name: str) -> None:
    code, listed = CALLS[name]
    await call(gateway.url, "print('warm-up')")
    reset_peak(gateway.pid)
    before = kib(gateway.pid, "VmRSS")
    result = await call(gateway.url, code)
    growth = (kib(gateway.pid, "VmHWM") - before) / 1024
    assert not result.is_error, result
    assert "[exit code 0: ok]" in text_of(result)
    files = result.structured_content["files"]
    assert [(f["path"], f["size"]) for f in files] == listed
    assert growth < MAX_GROWTH_MIB, f"the gateway grew by {growth:.0f} MiB for one call"
    if name == "figure-named-sparse-files":
        images = result.structured_content["images"]
        assert [(i["width"], i["size"], i["returned"]) for i in images] == [
            (3000, 11 * MiB, False)
        ] * 4
