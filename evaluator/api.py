"""Snekbox's HTTP API: ``POST /eval`` parsed and answered exactly as Snekbox does.

The status codes and the ``title`` / ``description`` bodies are Snekbox's (Falcon's) own. The
evaluator's domain errors are translated to HTTP here and nowhere else; anything unexpected is
logged and answered with a bare 500.

A client that goes away (closes its connection) before the answer gets its run cancelled, and so
its sandbox killed: servers do not cancel a request handler when the client disconnects.

No request holds the event loop for long: the body's size (checked against ``Content-Length``
before it is read), its JSON structure (counted while it is read) and its number of files
(counted before the schema) are bounded, and the decoding, the validation and the answer's
encoding run in a worker thread. The JSON and base64 codecs hold the interpreter lock while they
work, so a maximal body still pauses the loop, for a moment (0.1-0.3 s on 2 busy cores).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import logging
import math
import posixpath
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import jsonschema  # type: ignore[import-untyped]
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from snekbox_client import (
    CONTENT_WANTED_FIELD,
    END_SESSIONS_FIELD,
    PACKAGES_FIELD,
    SESSION_FIELD,
    SESSION_OWNER_FIELD,
    SESSION_RESUME_FIELD,
    TIME_LIMIT_FIELD,
    ContentWanted,
    EvalRequest,
    EvalResult,
    File,
)

from .answers import refusal
from .errors import InvalidFile, RequestInvalid
from .host import MPLCONFIGDIR
from .service import Evaluator
from .workdir import TMP_DIR

__all__ = ["MAX_JSON_STRUCTURE", "REQUEST_SCHEMA", "create_app", "parse_request"]

log = logging.getLogger(__name__)

# A live session's id: the request's session, and each of its end_sessions.
_SESSION_PATTERN = "^[A-Za-z0-9_-]{1,64}$"
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
        # This project's extensions (see snekbox_client.TIME_LIMIT_FIELD, SESSION_FIELD,
        # END_SESSIONS_FIELD, PACKAGES_FIELD).
        "time_limit": {"type": "number", "exclusiveMinimum": 0},
        "session": {"type": "string", "pattern": _SESSION_PATTERN},
        "session_resume": {"type": "boolean"},
        "end_sessions": {
            "type": "array",
            "items": {"type": "string", "pattern": _SESSION_PATTERN},
            "maxItems": 64,
        },
        "session_owner": {"type": "string", "pattern": _SESSION_PATTERN},
        "packages": {
            "type": "array",
            "items": {"type": "string", "minLength": 1, "maxLength": 200},
            "maxItems": 64,
        },
    },
    "anyOf": [{"required": ["input"]}, {"required": ["args"]}],
}
_validator = jsonschema.Draft202012Validator(REQUEST_SCHEMA)

#: Commas and opening brackets a request body may hold (in its strings too: an upper bound on its
#: JSON values, which a file's base64 has none of). The JSON decoder holds the interpreter lock
#: for the whole body, at up to ~1 us per value: 64 MiB of empty lists took 9 s, nested ones 28 s.
#: At this bound, at most ~0.3 s, as long as scanning the longest string a body can hold.
MAX_JSON_STRUCTURE = 500_000

# Directories the evaluator keeps for itself in the working directory: TMPDIR, and MPLCONFIGDIR
# (where the prebuilt font list is bound). A request file at or below one of them, or at one of
# their parents, would put a file where bwrap or the code needs a directory of the evaluator's.
_RESERVED = (TMP_DIR, MPLCONFIGDIR)


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


def parse_request(body: Any, *, max_files: int) -> EvalRequest:
    """Validate a decoded JSON body and build the run it asks for.

    When ``input`` is given, ``args`` defaults to ``["-c"]`` and ``input`` is appended to it
    (:attr:`EvalRequest.argv`).

    Raises:
        RequestInvalid: the body fails the schema, or has more than ``max_files`` files
            ("Request data failed validation").
        InvalidFile: a file path is absolute, has a NUL, is not UTF-8, leaves the working
            directory or collides with a directory the evaluator reserves, or its content is not
            base64 ("Request file is invalid").
    """
    # The schema takes ~20 us per file and ~8 us per argument: count the files first, and show
    # it only the first argument that is not a string (its verdict and message are the same).
    checked = body
    if isinstance(body, dict):
        files_given, args_given = body.get("files"), body.get("args")
        if isinstance(files_given, list) and len(files_given) > max_files:
            raise RequestInvalid(
                "Request data failed validation",
                f"A request may send at most {max_files} files, not {len(files_given)}",
            )
        if isinstance(args_given, list):
            checked = {**body, "args": [a for a in args_given if not isinstance(a, str)][:1]}
    error = jsonschema.exceptions.best_match(_validator.iter_errors(checked))
    if error is not None:
        raise RequestInvalid("Request data failed validation", error.message)
    _check_finite(body.get(TIME_LIMIT_FIELD))
    files = tuple(_parse_file(item) for item in body.get("files", []))
    # content_wanted: this project's extension of the request (Snekbox ignores the field).
    try:
        wanted = body.get(CONTENT_WANTED_FIELD)
        content_wanted = None if wanted is None else ContentWanted.from_json(wanted)
    except ValueError as exc:
        raise RequestInvalid("Request data failed validation", str(exc)) from exc
    try:
        return EvalRequest(
            input=body.get("input"),
            args=body.get("args"),
            files=files,
            executable_path=body.get("executable_path") or None,
            content_wanted=content_wanted,
            time_limit=body.get(TIME_LIMIT_FIELD),
            session=body.get(SESSION_FIELD),
            session_resume=body.get(SESSION_RESUME_FIELD, False),
            end_sessions=tuple(body.get(END_SESSIONS_FIELD, ())),
            session_owner=body.get(SESSION_OWNER_FIELD),
            packages=tuple(body.get(PACKAGES_FIELD, ())),
        )
    except ValueError as exc:  # whatever the model refuses is the request's fault: a 400
        raise RequestInvalid("Request data failed validation", str(exc)) from exc


def _check_finite(value: object) -> None:
    """Refuse a NaN or an infinity where the schema wants a number: NaN compares false with
    every bound (``exclusiveMinimum`` lets it through), and no run takes forever.

    Raises:
        RequestInvalid: ``value`` is a float that is not finite.
    """
    if isinstance(value, float) and not math.isfinite(value):
        raise RequestInvalid("Request data failed validation", f"{value} is not a finite number")


def check_request(request: EvalRequest, *, max_files: int) -> None:
    """What :func:`parse_request` checks of a request built in this process rather than sent
    as JSON (the gateway's, with the evaluator in its process): the same errors, and no
    request the API would refuse runs.

    Raises:
        RequestInvalid: as :func:`parse_request` does.
        InvalidFile: as :func:`parse_request` does.
    """
    if len(request.files) > max_files:
        raise RequestInvalid(
            "Request data failed validation",
            f"A request may send at most {max_files} files, not {len(request.files)}",
        )
    # The schema's verdict on all but the files' contents and the arguments, which the
    # dataclass has as bytes and strings already.
    checked: dict[str, Any] = {
        name: value
        for name, value in (
            ("input", request.input),
            ("args", None if request.args is None else []),
            ("files", [{"path": file.path} for file in request.files] or None),
            ("executable_path", request.executable_path),
            (TIME_LIMIT_FIELD, request.time_limit),
            (SESSION_FIELD, request.session),
            (SESSION_RESUME_FIELD, request.session_resume or None),
            (END_SESSIONS_FIELD, list(request.end_sessions) or None),
            (SESSION_OWNER_FIELD, request.session_owner),
            (PACKAGES_FIELD, list(request.packages) or None),
        )
        if value is not None
    }
    error = jsonschema.exceptions.best_match(_validator.iter_errors(checked))
    if error is not None:
        raise RequestInvalid("Request data failed validation", error.message)
    _check_finite(request.time_limit)
    for file in request.files:
        _check_path(file.path)


def _parse_file(item: dict[str, str]) -> File:
    path = item["path"]
    _check_path(path)
    try:
        content = base64.b64decode(item.get("content", ""))
    except (binascii.Error, ValueError) as exc:
        raise InvalidFile(f"Invalid base64 encoding for file '{path}'") from exc
    return File(path, content)


def _check_path(path: str) -> None:
    if path.startswith("/"):
        raise InvalidFile(f"File path '{path}' must be relative")
    # Snekbox resolves the path under /home; a NUL byte makes that fail the same way.
    resolved = posixpath.normpath(posixpath.join("/home", path))
    if "\0" in path or not (resolved == "/home" or resolved.startswith("/home/")):
        raise InvalidFile(f"File path '{path}' may not traverse beyond root")
    try:
        path.encode()
    except UnicodeEncodeError as exc:  # a lone surrogate: no file can have that name
        raise InvalidFile(f"File path {path!r} is not valid UTF-8") from exc
    relative = posixpath.relpath(resolved, "/home")
    for reserved in _RESERVED:
        if f"{relative}/".startswith(f"{reserved}/") or reserved.startswith(f"{relative}/"):
            raise InvalidFile(
                f"File path '{path}' collides with '{reserved}', a directory the evaluator "
                "keeps for itself"
            )


class _NonFinite(Exception):
    """A number of the body is NaN or infinite (see :func:`_finite_float`)."""


def _finite_float(text: str) -> float:
    """The decoder's hook for ``NaN``, ``Infinity``, ``-Infinity`` (which Python's json
    accepts) and every other number with a fraction or exponent (``1e999`` is infinite): no
    field of a request takes a number that is not finite, wherever it is in the body."""
    value = float(text)
    if not math.isfinite(value):
        raise _NonFinite(text)
    return value


def _parse_body(data: bytes | bytearray, max_files: int) -> EvalRequest:
    """Decode and validate a request body (in a worker thread: see the module's docstring)."""
    try:
        body = json.loads(data.decode(), parse_float=_finite_float, parse_constant=_finite_float)
    except _NonFinite as exc:
        raise RequestInvalid(
            "Request data failed validation", f"{exc} is not a finite number"
        ) from exc
    except (ValueError, RecursionError) as exc:  # RecursionError: nested too deep
        raise _HTTPError(400, "Invalid JSON", f"Could not parse JSON body - {exc}") from exc
    return parse_request(body, max_files=max_files)


def _result_body(result: EvalResult) -> bytes:
    """The 200 answer, as Starlette's JSONResponse encodes it (in a worker thread)."""
    return json.dumps(
        result.to_json(), ensure_ascii=False, allow_nan=False, separators=(",", ":")
    ).encode()


class _EvalEndpoint:
    """``/eval``: POST runs code, OPTIONS is the liveness probe."""

    def __init__(self, evaluator: Evaluator) -> None:
        self._evaluator = evaluator
        self._max_body = evaluator.config.request_bytes_limit
        self._max_files = evaluator.config.max_request_files

    async def handle(self, request: Request) -> Response:
        if request.method == "OPTIONS":
            return Response(status_code=200, headers={"Allow": "POST"})
        try:
            data = await self._read_body(request)
            eval_request = await asyncio.to_thread(_parse_body, data, self._max_files)
            result = await self._run_while_connected(request, eval_request)
        except ClientDisconnect:  # while sending the body
            result = None
        except _HTTPError as exc:
            return exc.response()
        except Exception as exc:  # the one table: 400, 404, 503, else a logged 500
            answer = refusal(exc)
            return _HTTPError(
                answer.status, answer.title, answer.description, answer.headers
            ).response()
        if result is None:
            # Nobody reads this answer: the server drops it (nginx's "client closed request").
            return _HTTPError(499, "499 Client Closed Request").response()
        body = await asyncio.to_thread(_result_body, result)
        return Response(body, media_type="application/json")

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

    async def _read_body(self, request: Request) -> bytearray:
        """The body of a JSON request, refused (415, 413, 400) before any costly work."""
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
        too_large = _HTTPError(
            413, "413 Payload Too Large", f"The request body is larger than {self._max_body} bytes."
        )
        length = request.headers.get("content-length", "")
        if length.isdigit() and int(length) > self._max_body:
            raise too_large
        data = bytearray()
        structure = 0
        async for chunk in request.stream():
            data.extend(chunk)
            if len(data) > self._max_body:
                raise too_large
            structure += chunk.count(b",") + chunk.count(b"[") + chunk.count(b"{")
            if structure > MAX_JSON_STRUCTURE:
                raise _HTTPError(
                    413,
                    "413 Payload Too Large",
                    f"The request body has more than {MAX_JSON_STRUCTURE} commas and brackets; "
                    "send large data as files.",
                )
        if not data:
            raise _HTTPError(400, "Invalid JSON", "Could not parse an empty JSON body")
        return data


def _session_endpoint(evaluator: Evaluator) -> Callable[[Request], Awaitable[Response]]:
    """``DELETE /sessions/<id>``: end a live session (this project's extension)."""

    async def end(request: Request) -> Response:
        await evaluator.end_session(request.path_params["session"])
        return Response(status_code=204)

    return end


def _info_endpoint(evaluator: Evaluator) -> Callable[[Request], Awaitable[Response]]:
    """``GET /info``: what this service offers beyond Snekbox's API (this project's extension;
    Snekbox answers 404), so that a gateway in front of it knows whether sessions stay live."""

    async def info(request: Request) -> Response:
        return JSONResponse(evaluator.info().to_json())

    return info


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
        routes=[
            Route("/eval", _EvalEndpoint(evaluator).handle, methods=["POST", "OPTIONS"]),
            Route("/sessions/{session}", _session_endpoint(evaluator), methods=["DELETE"]),
            Route("/info", _info_endpoint(evaluator), methods=["GET"]),
        ],
        exception_handlers={404: _not_found, 405: _method_not_allowed},
        lifespan=lifespan,
    )
