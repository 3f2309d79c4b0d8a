"""Snekbox's HTTP API: ``POST /eval`` parsed and answered exactly as Snekbox does.

The status codes and the ``title`` / ``description`` bodies are Snekbox's (Falcon's) own. The
evaluator's domain errors are translated to HTTP here and nowhere else; anything unexpected is
logged and answered with a bare 500.

A client that goes away (closes its connection) before the answer gets its run cancelled, and so
its sandbox killed: servers do not cancel a request handler when the client disconnects.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import logging
import posixpath
from collections.abc import AsyncIterator
from typing import Any

import jsonschema  # type: ignore[import-untyped]
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .config import MiB
from .errors import InvalidFile, QueueFull, RequestInvalid
from .models import EvalRequest, EvalResult, FileAttachment
from .service import Evaluator

__all__ = ["REQUEST_SCHEMA", "create_app", "parse_request"]

log = logging.getLogger(__name__)

#: Snekbox's request schema. The path pattern rejects a leading ``/`` and the two characters
#: ``\0`` (a literal backslash-zero, as Snekbox's own tests expect).
REQUEST_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "input": {"type": "string"},
        "args": {"type": "array", "items": {"type": "string"}},
        "files": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "path": {"type": "string", "pattern": r"^(?!/)(?!.*\\0).*$"},
                    "content": {"type": "string"},
                },
                "required": ["path"],
            },
        },
        "executable_path": {"type": "string"},
    },
    "anyOf": [{"required": ["input"]}, {"required": ["args"]}],
}
_validator = jsonschema.Draft202012Validator(REQUEST_SCHEMA)


class _HTTPError(Exception):
    """An answer other than 200, with Falcon's body."""

    def __init__(
        self,
        status: int,
        title: str,
        description: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(title)
        self.status = status
        self.title = title
        self.description = description
        self.headers = headers

    def response(self) -> JSONResponse:
        body = {"title": self.title}
        if self.description is not None:
            body["description"] = self.description
        return JSONResponse(body, self.status, headers=self.headers)


def parse_request(body: Any) -> EvalRequest:
    """Validate a decoded JSON body and build the run it asks for.

    When ``input`` is given, ``args`` defaults to ``["-c"]`` and ``input`` is appended to it.

    Raises:
        RequestInvalid: the body fails the schema ("Request data failed validation").
        InvalidFile: a file path is absolute, has a NUL or leaves the working directory, or its
            content is not base64 ("Request file is invalid").
    """
    error = jsonschema.exceptions.best_match(_validator.iter_errors(body))
    if error is not None:
        raise RequestInvalid("Request data failed validation", error.message)
    args = list(body.get("args", ["-c"] if "input" in body else []))
    if "input" in body:
        args.append(body["input"])
    files = tuple(_parse_file(item) for item in body.get("files", []))
    return EvalRequest(tuple(args), files, body.get("executable_path") or None)


def _parse_file(item: dict[str, str]) -> FileAttachment:
    path = item["path"]
    if path.startswith("/"):
        raise InvalidFile(f"File path '{path}' must be relative")
    # Snekbox resolves the path under /home; a NUL byte makes that fail the same way.
    resolved = posixpath.normpath(posixpath.join("/home", path))
    if "\0" in path or not (resolved == "/home" or resolved.startswith("/home/")):
        raise InvalidFile(f"File path '{path}' may not traverse beyond root")
    try:
        content = base64.b64decode(item.get("content", ""))
    except (binascii.Error, ValueError) as exc:
        raise InvalidFile(f"Invalid base64 encoding for file '{path}'") from exc
    return FileAttachment(path, content)


def _result_json(result: EvalResult) -> dict[str, Any]:
    return {
        "stdout": result.stdout,
        "returncode": result.returncode,
        "files": [
            {
                "path": file.path,
                "size": file.size,
                "content": base64.b64encode(file.content).decode("ascii"),
            }
            for file in result.files
        ],
    }


class _EvalEndpoint:
    """``/eval``: POST runs code, OPTIONS is the liveness probe."""

    def __init__(self, evaluator: Evaluator) -> None:
        self._evaluator = evaluator
        # A request carries at most the working directory's worth of files, base64-encoded.
        self._max_body = evaluator.config.workdir_size * MiB * 2 + MiB

    async def handle(self, request: Request) -> Response:
        if request.method == "OPTIONS":
            return Response(status_code=200, headers={"Allow": "POST"})
        try:
            body = await self._read_json(request)
            result = await self._run_while_connected(request, parse_request(body))
        except ClientDisconnect:  # while sending the body
            result = None
        except _HTTPError as exc:
            return exc.response()
        except RequestInvalid as exc:
            return _HTTPError(400, exc.title, exc.description).response()
        except QueueFull as exc:
            return _HTTPError(
                503,
                "Evaluation queue is full",
                f"All {exc.running} evaluation slots are busy and {exc.waiting} evaluations are "
                "waiting; try again later.",
                headers={"Retry-After": "1"},
            ).response()
        except Exception:
            log.exception("An exception occurred while trying to process the request")
            return _HTTPError(500, "500 Internal Server Error").response()
        if result is None:
            # Nobody reads this answer: the server drops it (nginx's "client closed request").
            return _HTTPError(499, "499 Client Closed Request").response()
        return JSONResponse(_result_json(result))

    async def _run_while_connected(
        self, request: Request, eval_request: EvalRequest
    ) -> EvalResult | None:
        """Run, unless the client disconnects first: then cancel the run and return ``None``.

        The body must have been read: from then on, the only message left to receive is
        ``http.disconnect`` (sent at disconnection, or once the answer is sent).
        """
        # Plain tasks rather than a task group, so the run's own errors come back unwrapped.
        run = asyncio.ensure_future(self._evaluator.run(eval_request))
        watch = asyncio.ensure_future(_wait_for_disconnect(request))
        try:
            await asyncio.wait((run, watch), return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
            if not run.done():
                run.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await run
        if run.cancelled():
            log.info("the client disconnected before the answer: its run is cancelled")
            return None
        return run.result()

    async def _read_json(self, request: Request) -> Any:
        content_type = request.headers.get("content-type")
        # No content type: Falcon assumes JSON, its default media type.
        if content_type is not None:
            media_type = content_type.split(";", 1)[0].strip().lower()
            if media_type != "application/json":
                raise _HTTPError(
                    415,
                    "415 Unsupported Media Type",
                    f"{content_type} is an unsupported media type.",
                )
        data = bytearray()
        async for chunk in request.stream():
            data.extend(chunk)
            if len(data) > self._max_body:
                raise _HTTPError(
                    413,
                    "413 Payload Too Large",
                    f"The request body is larger than {self._max_body} bytes.",
                )
        if not data:
            raise _HTTPError(400, "Invalid JSON", "Could not parse an empty JSON body")
        try:
            return json.loads(data.decode())
        except ValueError as exc:
            raise _HTTPError(400, "Invalid JSON", f"Could not parse JSON body - {exc}") from exc


async def _wait_for_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _not_found(request: Request, exc: Exception) -> Response:
    return _HTTPError(404, "404 Not Found").response()


async def _method_not_allowed(request: Request, exc: Exception) -> Response:
    return _HTTPError(405, "405 Method Not Allowed", headers={"Allow": "POST, OPTIONS"}).response()


def create_app(evaluator: Evaluator, *, manage_evaluator: bool = False) -> Starlette:
    """The ASGI app serving ``/eval`` with ``evaluator``.

    The app works without its lifespan (``httpx.ASGITransport`` does not run it): start the
    evaluator before the first request. With ``manage_evaluator``, the lifespan starts and
    closes it, for a standalone server.
    """

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if manage_evaluator:
            await evaluator.start()
        try:
            yield
        finally:
            if manage_evaluator:
                await evaluator.aclose()

    return Starlette(
        routes=[Route("/eval", _EvalEndpoint(evaluator).handle, methods=["POST", "OPTIONS"])],
        exception_handlers={404: _not_found, 405: _method_not_allowed},
        lifespan=lifespan,
    )
