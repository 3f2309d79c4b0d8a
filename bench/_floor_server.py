"""The MCP SDK's own floor: a bare ``MCPServer`` whose ``execute_python_code`` returns ``"1\\n"``.

For ``bench_gateway_cpu.py``: what any gateway built on this SDK costs per call, over Streamable
HTTP (``/mcp``) and SSE (``/sse``), under uvicorn's defaults, with no middleware, no sessions, no
evaluation. ``GET /healthz`` answers 200 (the readiness probe).

    python bench/_floor_server.py --port 8061
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import uvicorn
from mcp.server.mcpserver import MCPServer
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

server = MCPServer("floor")


@server.tool()
async def execute_python_code(code: str) -> str:
    """Run nothing; answer what ``print(1)`` prints."""
    return "1\n"


async def healthz(request: Request) -> JSONResponse:
    return JSONResponse({"status": "ok"})


def app() -> Starlette:
    """Both transports in one app, the Streamable HTTP session manager in its lifespan."""
    streamable = server.streamable_http_app()
    sse = server.sse_app()

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with server.session_manager.run():
            yield

    return Starlette(
        routes=[Route("/healthz", healthz), *streamable.routes, *sse.routes], lifespan=lifespan
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    port = parser.parse_args().port
    uvicorn.run(app(), host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main()
