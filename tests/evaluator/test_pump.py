"""The one output pump: what it keeps, what it hands on as it reads, and where it stops.

No sandbox: a plain pipe stands for a process's output.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterator

import pytest

from evaluator.pump import OutputChunks, OutputPump


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    read_end, write_end = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
    yield read_end, write_end
    for fd in (read_end, write_end):
        with contextlib.suppress(OSError):
            os.close(fd)


async def test_the_pump_keeps_the_output_and_hands_on_each_chunk_as_it_reads(
    pipe: tuple[int, int],
) -> None:
    read_end, write_end = pipe
    handed: list[bytes] = []
    first = asyncio.Event()

    def on_output(chunk: bytes) -> None:
        handed.append(chunk)
        first.set()

    pump = OutputPump(read_end, 100, on_limit=lambda: None, on_output=on_output)
    async with asyncio.timeout(30):
        with pump:
            os.write(write_end, b"first ")
            await first.wait()
            assert handed == [b"first "]  # before the end: as it is read
            os.write(write_end, b"second")
            os.close(write_end)
            await pump.eof
    assert pump.output == b"first second" == b"".join(handed)
    assert not pump.over_limit
    assert pump.ended.done()


async def test_past_the_limit_the_pump_keeps_the_first_bytes_and_says_so_once(
    pipe: tuple[int, int],
) -> None:
    read_end, write_end = pipe
    limits: list[None] = []
    chunks = OutputChunks()
    pump = OutputPump(
        read_end, 10, on_limit=lambda: limits.append(None), on_output=chunks, initial=b"012"
    )
    async with asyncio.timeout(30):
        with pump:
            os.write(write_end, b"3456789abcdef")
            await pump.ended  # the limit: no more is kept
            os.write(write_end, b"more")
            os.close(write_end)
            await pump.eof  # read on and dropped: no writer blocks
        chunks.close()
        received = [chunk async for chunk in chunks]
    assert pump.output == b"0123456789"
    assert b"".join(received) == pump.output
    assert pump.over_limit
    assert limits == [None]


async def test_drain_keeps_what_the_pipe_holds_within_the_limit(pipe: tuple[int, int]) -> None:
    read_end, write_end = pipe
    handed: list[bytes] = []
    pump = OutputPump(read_end, 8, on_limit=lambda: None, on_output=handed.append)
    os.write(write_end, b"status came first")
    pump.drain()
    assert pump.output == b"status c" == b"".join(handed)
