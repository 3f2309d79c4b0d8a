"""The built-in evaluator made to ignore ``content_wanted``, as the real Snekbox does.

Snekbox's request schema ignores unknown fields, so it answers a request carrying
``content_wanted`` with every file's full content. This serves the real evaluator behind an ASGI
wrapper that drops the field from each ``POST /eval`` body: the answers are then Snekbox's, with
all contents (and the evaluator's ``ended_by``, which is not what is tested here), and the
client's own reading of them is what is under test. It keeps no live sessions, as Snekbox.

    python -m tests.snekbox_client.snekbox_like --port 8060 [--host 127.0.0.1] [--executable PY]

``--executable``: the interpreter runs use, as a Snekbox image has its own (one without the
project's packages stands in for an image without pandas). ``--no-info``: ``GET /info`` is
answered 404 and ``packages`` dropped from requests, as Snekbox has neither. ``--also PY``:
another interpreter the sandbox holds, for ``executable_path`` (a Snekbox image may have several).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import uvicorn

from evaluator import Evaluator, EvaluatorConfig, create_app
from snekbox_client._fields import CONTENT_WANTED_FIELD, PACKAGES_FIELD

Scope = dict[str, Any]


class IgnoreContentWanted:
    """An ASGI wrapper removing ``content_wanted`` from request bodies before ``app`` reads them."""

    def __init__(self, app: Any, *, info: bool = True) -> None:
        self.app = app
        self.info = info

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if not self.info and scope["type"] == "http" and scope["path"] == "/info":
            await send({"type": "http.response.start", "status": 404, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] != "http.request":
                await self.app(scope, receive, send)  # a disconnect: let the app see it
                return
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        try:
            data = json.loads(body)
        except ValueError:
            data = None
        dropped = (CONTENT_WANTED_FIELD,) if self.info else (CONTENT_WANTED_FIELD, PACKAGES_FIELD)
        if isinstance(data, dict) and [data.pop(name) for name in dropped if name in data]:
            body = bytearray(json.dumps(data).encode())
        headers = [(k, v) for k, v in scope["headers"] if k.lower() != b"content-length"]
        headers.append((b"content-length", str(len(body)).encode()))
        replayed = False

        async def replay() -> Any:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()

        await self.app({**scope, "headers": headers}, replay, send)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--log-level", default="warning")
    parser.add_argument("--executable", default=sys.executable)
    parser.add_argument("--no-info", action="store_true")
    parser.add_argument("--also", action="append", default=[])
    args = parser.parse_args()
    # One-shot, as Snekbox: no live sessions (its GET /info says so).
    config = EvaluatorConfig(
        time_limit=args.time_limit,
        concurrency=2,
        max_sessions=0,
        executable=args.executable,
        pythons=tuple(args.also),
        python_packages=(),
        preimport=() if args.executable != sys.executable else EvaluatorConfig().preimport,
    )
    evaluator = Evaluator(config)
    app = IgnoreContentWanted(create_app(evaluator, manage_evaluator=True), info=not args.no_info)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)


if __name__ == "__main__":
    main()
