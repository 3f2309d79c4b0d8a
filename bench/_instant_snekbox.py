"""A stand-in Snekbox that runs nothing: every ``POST /eval`` answers ``print(1)``'s result at once.

For ``bench_gateway_cpu.py``: in front of it a gateway's time and CPU are its own (and the MCP
SDK's), with no evaluation behind them. ``OPTIONS /eval`` answers 200 (the readiness probe);
anything else 404, as Snekbox answers ``GET /info``.

    python bench/_instant_snekbox.py --port 8060
"""

from __future__ import annotations

import argparse
import asyncio
import json

ANSWER = json.dumps({"stdout": "1\n", "returncode": 0, "files": []}).encode()
_HEAD = b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answer each request of one kept-alive connection, reading its body whole first."""
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            request_line, *fields = head.decode("latin-1").split("\r\n")
            length = 0
            for field in fields:
                name, _, value = field.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            await reader.readexactly(length)
            method, path = request_line.split(" ")[:2]
            if path == "/eval" and method in ("POST", "OPTIONS"):
                body = ANSWER if method == "POST" else b""
                writer.write(_HEAD % (200, b"OK", len(body)) + body)
            else:
                writer.write(_HEAD % (404, b"Not Found", 0))
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def serve(port: int) -> None:
    server = await asyncio.start_server(handle, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    asyncio.run(serve(parser.parse_args().port))


if __name__ == "__main__":
    main()
