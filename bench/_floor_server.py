"""The MCP SDK's own floor: a bare ``MCPServer`` whose ``execute_python_code`` returns ``"1\\n"``.

For ``bench_gateway_cpu.py``: what any gateway built on this SDK costs per call, over Streamable
HTTP (``/mcp``) and SSE (``/sse``), under uvicorn's defaults, with no middleware, no sessions, no
evaluation. ``GET /healthz`` answers 200 (the readiness probe).

With ``--snekbox-url``, for ``bench_snekbox.py``: the least a gateway in front of Snekbox can be,
as the seed gateways were: the tool posts ``{"input": code}`` to ``/eval`` with one keep-alive
``httpx.AsyncClient`` and returns the stdout as a string, with no prelude, no figures, no files,
no sessions, no limits of its own.

    python bench/_floor_server.py --port 8061 [--snekbox-url http://127.0.0.1:8060]
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import uvicorn
from mcp.server.mcpserver import MCPServer
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

server = MCPServer("floor")
#: The Snekbox the tool forwards to (``--snekbox-url``); ``None``: it runs nothing.
snekbox: httpx.AsyncClient | None = None


@server.tool()
async def execute_python_code(code: str) -> str:
    """Run ``code`` on the Snekbox and answer its stdout, or run nothing and answer ``"1\\n"``."""
    if snekbox is None:
        return "1\n"
    response = await snekbox.post("/eval", json={"input": code})
    response.raise_for_status()
    return str(response.json()["stdout"])


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
    parser.add_argument("--snekbox-url", help="forward each call's code to this Snekbox")
    args = parser.parse_args()
    global snekbox
    if args.snekbox_url:
        snekbox = httpx.AsyncClient(base_url=args.snekbox_url, trust_env=False, timeout=30)
    uvicorn.run(app(), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
