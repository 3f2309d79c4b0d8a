"""The one output pump: a process's merged output read as it comes, kept to a bound.

One-shot runs (:meth:`.JailedProcess.wait`) and a session's cells
(:meth:`.JailedProcess.run_cell`) both read their output through an :class:`OutputPump`; they
differ only in how a run ends (a kill at the time limit, or an interrupt first). Each chunk the
pump keeps may be handed on as it is read (``on_output``: a callback, or an
:class:`OutputChunks` to iterate over asynchronously), so output can be shown while the code
runs; what is handed on is exactly what the result holds, in order, and never more than the
output limit in all.
"""

from __future__ import annotations

import asyncio
import codecs
import fcntl
import os
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "INVALID_UTF8",
    "OnOutput",
    "Outcome",
    "OutputChunks",
    "OutputPump",
    "decode_output",
    "first_read",
    "read_what_the_pipe_holds",
]

INVALID_UTF8 = "UnicodeDecodeError: invalid Unicode in output pipe"
# Bytes read from an output pipe at a time; the default /proc/sys/fs/pipe-max-size, the most an
# unprivileged process can give its pipe.
_READ_SIZE, _PIPE_MAX_SIZE = 65536, 1 << 20

#: Called with each chunk of output the pump keeps, as it is read (never with ``b""``).
OnOutput = Callable[[bytes], None]


@dataclass(frozen=True)
class Outcome:
    """How a process ended: its exit status as a shell reports it, and its merged output; for
    a session's cell, which watched modules its interpreter imported (see :mod:`.preimports`)."""

    returncode: int
    output: bytes
    ended_by: Literal["exit", "time_limit", "output_limit", "interrupted"]
    imports: tuple[int, int] = (0, 0)


class OutputPump:
    """Reads the non-blocking pipe ``fd`` on the running loop while it is entered (``with``).

    Args:
        fd: The read end of the process's output pipe (stdout and stderr, merged).
        limit: Bytes kept at most; the rest is read and dropped, so that no writer blocks.
        on_limit: Called once, when the output first goes past ``limit``.
        on_output: Called with each chunk kept, as it is read (``initial`` first).
        initial: Output read before the pump started (it counts toward ``limit``).
        marker: One byte the process writes before its output (a session's agent started
            with its first cell: its WARM), dropped; :attr:`marked` says whether it came.

    :attr:`eof` is done once every writer has closed the pipe; :attr:`ended` once no more
    output will be kept (EOF, or past the limit).
    """

    def __init__(
        self,
        fd: int,
        limit: int,
        *,
        on_limit: Callable[[], None],
        on_output: OnOutput | None = None,
        initial: bytes = b"",
        marker: bytes | None = None,
    ) -> None:
        if marker is not None and len(marker) != 1:
            raise ValueError("a marker is one byte (it arrives whole)")
        self._fd = fd
        self._marker = marker
        #: Whether the output began with ``marker`` (``None``: no output yet, or no marker).
        self.marked: bool | None = None
        self._limit = limit
        self._on_limit = on_limit
        self._on_output = on_output
        self._output = bytearray()
        self._reading = False
        self.over_limit = False
        loop = asyncio.get_running_loop()
        self.eof: asyncio.Future[None] = loop.create_future()
        self.ended: asyncio.Future[None] = loop.create_future()
        if initial:
            self._keep(initial)

    def __enter__(self) -> OutputPump:
        asyncio.get_running_loop().add_reader(self._fd, self._on_readable)
        self._reading = True
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop reading (what is left in the pipe stays there; see :meth:`drain`)."""
        if self._reading:
            asyncio.get_running_loop().remove_reader(self._fd)
            self._reading = False

    @property
    def output(self) -> bytes:
        """The output kept so far."""
        return bytes(self._output)

    def drain(self) -> None:
        """Keep what the pipe holds now (see :func:`read_what_the_pipe_holds`): what a cell
        wrote before its status."""
        before = len(self._output)
        read_what_the_pipe_holds(self._fd, self._output, self._limit)
        if self._on_output is not None and len(self._output) > before:
            self._on_output(bytes(self._output[before:]))

    def _on_readable(self) -> None:
        try:
            chunk = os.read(self._fd, _READ_SIZE)
        except BlockingIOError:
            return
        if not chunk:
            self.stop()
            for future in (self.eof, self.ended):
                if not future.done():
                    future.set_result(None)
            return
        self._keep(chunk)

    def _keep(self, chunk: bytes) -> None:
        if self._marker is not None:
            self.marked = chunk[:1] == self._marker
            self._marker = None
            chunk = chunk[1:] if self.marked else chunk
        room = self._limit - len(self._output)
        kept = chunk[: max(room, 0)]
        if kept:
            self._output.extend(kept)
            if self._on_output is not None:
                self._on_output(kept)
        if len(chunk) > room and not self.over_limit:
            self.over_limit = True
            if not self.ended.done():
                self.ended.set_result(None)
            self._on_limit()


class OutputChunks:
    """The chunks an :class:`OutputPump` keeps, as an asynchronous iterator.

    Pass the instance as ``on_output``; iterate from another task; :meth:`close` (once the run
    has ended) ends the iteration after what was buffered. The buffer holds at most what the
    pump keeps, which the output limit bounds; a slow reader gets the chunks joined.
    """

    def __init__(self) -> None:
        self._chunks: deque[bytes] = deque()
        self._closed = False
        self._ready = asyncio.Event()

    def __call__(self, chunk: bytes) -> None:
        self._chunks.append(chunk)
        self._ready.set()

    def close(self) -> None:
        """No more chunks will come."""
        self._closed = True
        self._ready.set()

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[bytes]:
        while True:
            await self._ready.wait()
            self._ready.clear()
            if self._chunks:
                joined = b"".join(self._chunks)
                self._chunks.clear()
                yield joined
            if self._closed and not self._chunks:
                return


async def first_read(fd: int, seconds: float, size: int) -> bytes | None:
    """At most ``size`` bytes of the non-blocking pipe ``fd`` once there are some (``b""``:
    EOF); ``None`` when nothing came within ``seconds``."""
    loop = asyncio.get_running_loop()
    readable: asyncio.Future[None] = loop.create_future()

    def on_readable() -> None:
        if not readable.done():
            readable.set_result(None)

    loop.add_reader(fd, on_readable)
    try:
        await asyncio.wait((readable,), timeout=seconds)
    finally:
        loop.remove_reader(fd)
    try:
        return os.read(fd, size)
    except BlockingIOError:
        return None


def read_what_the_pipe_holds(fd: int, output: bytearray, limit: int) -> None:
    """Read the non-blocking pipe ``fd`` into ``output`` (kept to ``limit`` bytes) until it is
    empty, or a full pipe's worth has come: a writer that goes on (a thread of a session's cell,
    after the cell's status) would otherwise hold the service's loop here as long as it writes.
    """
    try:
        capacity = fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ)
    except OSError:  # not a pipe
        capacity = _PIPE_MAX_SIZE
    for _ in range(capacity // _READ_SIZE + 1):
        try:
            chunk = os.read(fd, _READ_SIZE)
        except BlockingIOError:
            return
        if not chunk:
            return
        output.extend(chunk[: max(limit - len(output), 0)])


def decode_output(output: bytes, *, truncated: bool) -> str | None:
    """The output as text, or ``None`` when it is not UTF-8.

    A truncated output may end in the middle of a character: that part is dropped.
    """
    try:
        return codecs.getincrementaldecoder("utf-8")().decode(output, final=not truncated)
    except UnicodeDecodeError:
        return None
