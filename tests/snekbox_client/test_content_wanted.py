"""``content_wanted``: only the contents asked for come back, from the evaluator and from Snekbox.

Two real services on loopback: ``python -m evaluator``, which honours the field, and the same
evaluator made to ignore it (``snekbox_like``), whose answers carry every content as Snekbox's
do. The client must read the same result from both, holding little of the latter in memory.
"""

from __future__ import annotations

import base64
import tracemalloc
from collections.abc import AsyncIterator, Iterator

import anyio
import httpx
import pytest

from snekbox_client import (
    ContentWanted,
    EvalRequest,
    EvalResult,
    File,
    InvalidResponse,
    SnekboxClient,
)
from tests.gateway.harness import ServiceProcess, evaluator_process
from tests.support import TIME_LIMIT

pytestmark = pytest.mark.anyio

MiB = 1024 * 1024
PNG_HEAD = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR"

#: Two "figures" (a PNG's first 24 bytes, then noise), a 5 MiB data file, a sparse 11 MiB one.
CODE = f"""
import os
def png(side, size):
    head = {PNG_HEAD!r} + side.to_bytes(4, 'big') * 2
    return head + os.urandom(size - len(head))
open('figure_001.png', 'wb').write(png(10, 10_000))
open('figure_002.png', 'wb').write(png(20, 100_000))
open('data.csv', 'wb').write(os.urandom(5 * 2**20))
with open('sparse.bin', 'wb') as f:
    f.truncate(11 * 2**20)
print('written')
"""
WANTED = ContentWanted(("figure_*.png",), max_bytes=50_000, head_bytes=24)


@pytest.fixture(scope="module")
def evaluator() -> Iterator[ServiceProcess]:
    service = evaluator_process(TIME_LIMIT)
    service.start()
    try:
        yield service
    finally:
        service.stop()


@pytest.fixture(scope="module")
def snekbox_like() -> Iterator[ServiceProcess]:
    args = ["-m", "tests.snekbox_client.snekbox_like", "--port", "{port}"]
    service = ServiceProcess([*args, "--time-limit", str(TIME_LIMIT)], {}, ("OPTIONS", "/eval"))
    service.start()
    try:
        yield service
    finally:
        service.stop()


@pytest.fixture
async def client(evaluator: ServiceProcess) -> AsyncIterator[SnekboxClient]:
    async with SnekboxClient(evaluator.url) as snekbox:
        yield snekbox


async def evaluate(client: SnekboxClient, request: EvalRequest) -> EvalResult:
    with anyio.fail_after(60):
        result = await client.eval(request)
    assert (result.returncode, result.stdout) == (0, "written\n"), result
    return result


def check(result: EvalResult) -> None:
    """What WANTED asks for: figure 1 whole, figure 2's head, the others' sizes only."""
    files = {f.path: f for f in result.files}
    assert set(files) == {"figure_001.png", "figure_002.png", "data.csv", "sparse.bin"}
    assert files["figure_001.png"].complete and files["figure_001.png"].size == 10_000
    second = files["figure_002.png"]
    assert (second.size, len(second.content)) == (100_000, 24)
    assert second.content == PNG_HEAD + (20).to_bytes(4, "big") * 2
    assert files["data.csv"] == File("data.csv", b"", 5 * MiB)
    assert files["sparse.bin"] == File("sparse.bin", b"", 11 * MiB)


async def test_the_evaluator_sends_only_the_contents_wanted(evaluator: ServiceProcess) -> None:
    body = EvalRequest(input=CODE, content_wanted=WANTED).to_json()
    async with httpx.AsyncClient(trust_env=False, timeout=60) as http:
        answer = await http.post(f"{evaluator.url}/eval", json=body)
    assert answer.status_code == 200, answer.text
    assert len(answer.content) < 20_000, "16 MiB of files, and only ~10 kB of them come back"
    files = {f["path"]: f for f in answer.json()["files"]}
    assert files["data.csv"] == {"path": "data.csv", "size": 5 * MiB, "content": ""}
    assert len(base64.b64decode(files["figure_002.png"]["content"])) == 24
    check(EvalResult.from_json(answer.json()))


async def test_a_malformed_field_is_a_validation_error(evaluator: ServiceProcess) -> None:
    body = {"input": "print(1)", "content_wanted": {"paths": "figure_*.png"}}
    async with httpx.AsyncClient(trust_env=False, timeout=60) as http:
        answer = await http.post(f"{evaluator.url}/eval", json=body)
    assert answer.status_code == 400
    assert answer.json() == {
        "title": "Request data failed validation",
        "description": "'content_wanted.paths' is not a list of strings",
    }


async def test_the_same_result_whether_the_service_honours_the_field_or_not(
    client: SnekboxClient, snekbox_like: ServiceProcess
) -> None:
    request = EvalRequest(input=CODE, content_wanted=WANTED)
    honoured = await evaluate(client, request)
    async with SnekboxClient(snekbox_like.url) as snekbox:
        ignored = await evaluate(snekbox, request)
    check(honoured)
    check(ignored)


async def test_a_full_answer_is_read_in_little_memory(snekbox_like: ServiceProcess) -> None:
    """60 MiB of base64 arrive (four sparse 11 MiB files); the client holds under 4 MiB."""
    code = "for i in range(4):\n    open(f'sparse_{i}', 'wb').truncate(11 * 2**20)\nprint(1)"
    async with SnekboxClient(snekbox_like.url) as snekbox:
        tracemalloc.start()
        try:
            with anyio.fail_after(60):
                result = await snekbox.eval(EvalRequest(input=code, content_wanted=WANTED))
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert [(f.path, f.size, f.content) for f in result.files] == [
        (f"sparse_{i}", 11 * MiB, b"") for i in range(4)
    ]
    assert peak < 4 * MiB, f"reading the answer took {peak / MiB:.0f} MiB"


async def test_without_the_field_every_content_comes_back(client: SnekboxClient) -> None:
    """Snekbox's own semantics: the whole files, as long as they fit ``max_content_bytes``."""
    result = await evaluate(client, EvalRequest(input=CODE))
    assert all(f.complete for f in result.files)
    assert {f.path: f.size for f in result.files}["data.csv"] == 5 * MiB
    async with SnekboxClient(client.base_url, max_content_bytes=MiB) as small:
        capped = {f.path: f for f in (await evaluate(small, EvalRequest(input=CODE))).files}
    assert capped["data.csv"] == File("data.csv", b"", 5 * MiB)
    assert capped["figure_001.png"].complete and capped["figure_002.png"].complete


async def test_an_answer_over_the_caps_is_invalid(snekbox_like: ServiceProcess) -> None:
    async with SnekboxClient(snekbox_like.url, max_answer_bytes=MiB) as snekbox:
        with pytest.raises(InvalidResponse, match="the answer is larger than 1,048,576 bytes"):
            await snekbox.eval(EvalRequest(input=CODE, content_wanted=WANTED))
    async with SnekboxClient(snekbox_like.url, max_text_bytes=10_000) as snekbox:
        with pytest.raises(InvalidResponse, match="output and file names are larger than"):
            await snekbox.eval(EvalRequest(input="print('x' * 20_000)"))


@pytest.mark.parametrize("kib", [16, 48])
async def test_answers_on_either_side_of_the_inline_decoding_size_read_alike(
    client: SnekboxClient, kib: int
) -> None:
    """An answer up to 64 KiB is decoded on the event loop, a larger one in a thread (here about
    40 and 120 KiB): the same result either way."""
    code = (
        f"import sys\nsys.stdout.write(('é' + 'a' * 99) * {kib * 10})\n"
        f"open('f.bin', 'wb').write(bytes(range(256)) * {kib * 4})"
    )
    with anyio.fail_after(60):
        result = await client.eval(EvalRequest(input=code))
    assert result.stdout == ("é" + "a" * 99) * (kib * 10)
    assert [(f.path, f.content) for f in result.files] == [("f.bin", bytes(range(256)) * kib * 4)]
