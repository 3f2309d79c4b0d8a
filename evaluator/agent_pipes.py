"""The service's side of an agent's pipes (the agent's own is :mod:`._agent`).

A warm agent reads its run's arguments from its request pipe (fd 5 inside), NUL-terminated and
ended by the release marker (:func:`.launch.write_args`), or :data:`._agent.SESSION`, which
makes it a session's interpreter. A session's interpreter then reads frames there: a kind
(:data:`._agent.CELL`, :data:`._agent.INTERRUPT`), the payload's length (4 bytes, big-endian)
and the payload; it says how each cell ended on its status pipe (fd 6 inside): 4 bytes,
big-endian, signed, then which watched modules it imported (:mod:`.preimports`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterator, Sequence

from . import _agent
from .launch import encode_args

__all__ = ["CellStatus", "cell_frame", "send_frame", "start_session", "write_within"]

#: A cell's status (4 bytes), then two masks of the watched modules (see _agent.STATUS_FD).
_STATUS_BYTES = 8


def cell_frame(args: Sequence[str]) -> bytes:
    """The frame that runs one cell with ``args`` (as ``python ARGS`` would take them).

    Raises:
        ValueError: an argument contains a NUL byte.
    """
    payload = encode_args(args)
    return _agent.CELL + len(payload).to_bytes(4, "big") + payload


def send_frame(fd: int, kind: bytes, payload: bytes = b"") -> None:
    """A small frame to a session's agent, if the pipe has room: one that does not fit would
    not be read anyway (the agent is then killed after its grace)."""
    os.set_blocking(fd, False)
    with contextlib.suppress(BlockingIOError, BrokenPipeError):
        os.write(fd, kind + len(payload).to_bytes(4, "big") + payload)


def start_session(fd: int) -> None:
    """Make a warm agent a session's interpreter (an empty pipe: one write, never blocks)."""
    with contextlib.suppress(BrokenPipeError):
        os.write(fd, _agent.SESSION)


async def write_within(fd: int, data: bytes, seconds: float) -> bool:
    """Write ``data`` to the request pipe ``fd``; whether it all went within ``seconds``.

    An agent that does not read (a thread of an earlier cell holding the GIL) must not hold up
    the service, only its own cell.
    """
    os.set_blocking(fd, False)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
            continue
        except BrokenPipeError:
            return False  # the agent is gone; the cell ends with the process
        except BlockingIOError:
            pass
        writable: asyncio.Future[None] = loop.create_future()

        def on_writable(ready: asyncio.Future[None] = writable) -> None:
            if not ready.done():
                ready.set_result(None)

        loop.add_writer(fd, on_writable)
        try:
            await asyncio.wait((writable,), timeout=max(deadline - loop.time(), 0))
        finally:
            loop.remove_writer(fd)
        if not writable.done():
            return False
    return True


class CellStatus:
    """The status of one cell, read from the non-blocking status pipe ``fd``."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._status = bytearray()

    @property
    def value(self) -> int | None:
        """The cell's status; ``None`` when the agent did not say it (it is gone)."""
        if len(self._status) < _STATUS_BYTES:
            return None
        return int.from_bytes(self._status[:4], "big", signed=True)

    @property
    def imports(self) -> tuple[int, int]:
        """The watched modules the interpreter started without, and those of them imported
        since (masks; see :mod:`.preimports`); none before the status is whole."""
        if len(self._status) < _STATUS_BYTES:
            return 0, 0
        return int.from_bytes(self._status[4:6], "big"), int.from_bytes(self._status[6:], "big")

    @contextlib.contextmanager
    def watch(self) -> Iterator[asyncio.Future[None]]:
        """While entered, read the status as it comes; the future is done once it is whole,
        or the pipe closed first."""
        loop = asyncio.get_running_loop()
        said: asyncio.Future[None] = loop.create_future()

        def on_readable() -> None:
            try:
                chunk = os.read(self._fd, _STATUS_BYTES - len(self._status))
            except BlockingIOError:
                return
            self._status.extend(chunk)
            if not chunk or len(self._status) == _STATUS_BYTES:
                loop.remove_reader(self._fd)
                if not said.done():
                    said.set_result(None)

        loop.add_reader(self._fd, on_readable)
        try:
            yield said
        finally:
            loop.remove_reader(self._fd)
