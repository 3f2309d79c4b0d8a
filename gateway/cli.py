"""``python-mcp-server``: flags from the settings' declaration, uvicorn, and a draining shutdown.

The flags are the settings marked :class:`~serving.settings.Flag`, made as the evaluator's
are (:func:`~serving.settings.add_flags`) and parsed before the environment is read, so
``--help`` works whatever the environment holds. A bad value, from a flag or a variable, stops
start-up with one line (never a traceback).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import socket
import sys
from collections.abc import Sequence
from types import FrameType
from typing import Any

import anyio
import uvicorn

from serving import add_flags, guarded_protocol

from .app import create_app
from .settings import Settings
from .tool import Gateway

__all__ = ["DrainingServer", "main", "parse_flags"]

logger = logging.getLogger(__name__)

#: Seconds for the last answers to reach their streams after the last tool call returns.
_FLUSH_DELAY = 0.5


class DrainingServer(uvicorn.Server):
    """uvicorn, but SIGTERM/SIGINT first lets the calls in flight finish (up to ``grace`` s).

    Meanwhile the gateway turns new calls away with a "shutting down" tool error; then the
    usual graceful shutdown closes the connections (SSE streams included). A second signal
    stops at once.
    """

    def __init__(self, config: uvicorn.Config, gateway: Gateway, grace: float) -> None:
        super().__init__(config)
        self.gateway = gateway
        self.grace = grace
        self._loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.gateway.draining or self._loop is None:
            super().handle_exit(sig, frame)
            return
        self.gateway.draining = True
        asyncio.run_coroutine_threadsafe(self._drain(sig), self._loop)

    async def _drain(self, sig: int) -> None:
        gateway = self.gateway
        if gateway.active_calls:
            logger.info("draining %d call(s) before shutdown", gateway.active_calls)
        with anyio.move_on_after(self.grace) as grace:
            await gateway.drained()
            await anyio.sleep(_FLUSH_DELAY)
        if grace.cancelled_caught:
            logger.warning("shutdown grace of %g s is over; stopping anyway", self.grace)
        super().handle_exit(sig, None)


def parse_flags(argv: Sequence[str] | None) -> dict[str, Any]:
    """The settings given as flags, by name (values as typed; validated with the others)."""
    parser = argparse.ArgumentParser(
        prog="python-mcp-server",
        description="Serve the execute_python_code MCP tool over SSE (/sse) and HTTP (/mcp). "
        "Every setting is also an environment variable (see the README); a flag wins.",
    )
    add_flags(parser, Settings)
    return vars(parser.parse_args(argv))


def main(argv: Sequence[str] | None = None) -> None:
    """Console entry point: ``python-mcp-server [--host H] [--port P] [--snekbox-url URL]``."""
    flags = parse_flags(argv)
    try:
        settings = Settings.from_env(os.environ, flags=flags)
        app = create_app(settings)
    except ValueError as exc:
        sys.exit(f"python-mcp-server: {exc}")
    # force: the mcp SDK configures the root logger when the server is created.
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        force=True,
    )
    # httpx logs every request at INFO: one line per call is ours to write.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("uvicorn.access").addFilter(_without_query_strings)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        # After the drain, what remains are idle streams: close them promptly.
        timeout_graceful_shutdown=2,
        timeout_keep_alive=settings.keep_alive_timeout,
        http=guarded_protocol(
            header_timeout=settings.request_timeout, max_connections=settings.max_connections
        ),
    )
    DrainingServer(config, app.state.gateway, settings.shutdown_grace).run()


def _without_query_strings(record: logging.LogRecord) -> bool:
    """Drop query strings from access-log lines: a client may put a secret there."""
    if isinstance(record.args, tuple) and len(record.args) == 5:
        client, method, path, version, status = record.args
        record.args = (client, method, str(path).split("?", 1)[0], version, status)
    return True
