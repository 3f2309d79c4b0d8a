"""Real servers for tests: uvicorn on a free loopback port, a port where nothing listens."""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import uvicorn


@contextmanager
def serve(app: Any, *, startup_timeout: float = 30.0) -> Iterator[str]:
    """Run an ASGI app under uvicorn in a thread on a free loopback port; yield its base URL.

    Waits on uvicorn's own ``started`` flag (set once the socket listens and the lifespan has
    started) rather than on a fixed delay, and fails the test if startup does not finish.
    """
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("the server exited during startup (see the log above)")
        if time.monotonic() > deadline:
            server.should_exit = True
            raise TimeoutError(f"the server did not start within {startup_timeout} s")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until_answers(
    url: str, process: subprocess.Popen[Any], *, method: str = "GET", timeout: float = 60
) -> httpx.Response:
    """Poll ``url`` until a server started as ``process`` answers; fail if it exits or stalls."""
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited during startup ({process.returncode})")
        try:
            return httpx.request(method, url)
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} did not answer within {timeout:g} s") from None
            time.sleep(0.05)
