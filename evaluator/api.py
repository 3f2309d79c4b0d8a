"""Snekbox's HTTP API: ``POST /eval`` parsed and answered exactly as Snekbox does.

The status codes and the ``title`` / ``description`` bodies are Snekbox's (Falcon's) own. The
evaluator's domain errors are translated to HTTP here and nowhere else; anything unexpected is
logged and answered with a bare 500.

A client that goes away (closes its connection) before the answer gets its run cancelled, and so
its sandbox killed: servers do not cancel a request handler when the client disconnects.

No request holds the event loop for long: the body's size (checked against ``Content-Length``
before it is read), its JSON structure (counted while it is read) and its number of files
(counted before the schema) are bounded, and the decoding, the validation and the answer's
encoding run in a worker thread, unless the body or the answer is small (:data:`INLINE_BYTES`):
a thread's hop then costs more than the work. The JSON and base64 codecs hold the interpreter
lock while they work, so a maximal body still pauses the loop, for a moment (0.1-0.3 s on 2
busy cores).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable

from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from snekbox_client import EvalRequest, EvalResult, parse_request

from .answers import refusal
from .errors import RequestInvalid
from .host import MPLCONFIGDIR
from .service import Evaluator
from .workdir import INLINE_BYTES, TMP_DIR

__all__ = ["INLINE_BYTES", "MAX_JSON_STRUCTURE", "RESERVED_DIRS", "create_app"]

log = logging.getLogger(__name__)

#: Commas and opening brackets a request body may hold (in its strings too: an upper bound on its
#: JSON values, which a file's base64 has none of). The JSON decoder holds the interpreter lock
#: for the whole body, at up to ~1 us per value: 64 MiB of empty lists took 9 s, nested ones 28 s.
#: At this bound, at most ~0.3 s, as long as scanning the longest string a body can hold.
MAX_JSON_STRUCTURE = 500_000

#: Directories the evaluator keeps for itself in the working directory: TMPDIR, and MPLCONFIGDIR
#: (where the prebuilt font list is bound). A request file at or below one of them, or at one of
#: their parents, would put a file where bwrap or the code needs a directory of the evaluator's:
#: the request check (:func:`snekbox_client.parse_request`) refuses it.
RESERVED_DIRS = (TMP_DIR, MPLCONFIGDIR)


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
    return parse_request(body, max_files=max_files, reserved=RESERVED_DIRS)


def _result_body(result: EvalResult) -> bytes:
    """The 200 answer, as Starlette's JSONResponse encodes it."""
    return json.dumps(
        result.to_json(), ensure_ascii=False, allow_nan=False, separators=(",", ":")
    ).encode()


async def _encoded(result: EvalResult) -> bytes:
    """:func:`_result_body`, in a worker thread unless the answer is small (no files)."""
    if not result.files and len(result.stdout) <= INLINE_BYTES:
        return _result_body(result)
    return await asyncio.to_thread(_result_body, result)


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
            if len(data) <= INLINE_BYTES:
                eval_request = _parse_body(data, self._max_files)
            else:
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
        body = await _encoded(result)
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


#: The longest a read of a cell's output may wait (seconds), and its body's largest size.
MAX_READ_WAIT, _MAX_READ_BODY = 300.0, 1024


def _cell_endpoints(
    evaluator: Evaluator,
) -> tuple[Callable[[Request], Awaitable[Response]], Callable[[Request], Awaitable[Response]]]:
    """``POST /sessions/<id>/output`` and ``/interrupt`` (this project's extension): read a
    session's cell as it runs, and interrupt it (see :mod:`.cells`)."""

    async def output(request: Request) -> Response:
        try:
            wait, early = await _read_options(request)
            result = await evaluator.dispatcher.read_cell(
                request.path_params["session"], wait, early=early
            )
        except _HTTPError as exc:
            return exc.response()
        except Exception as exc:
            answer = refusal(exc)
            return _HTTPError(
                answer.status, answer.title, answer.description, answer.headers
            ).response()
        body = await _encoded(result)
        return Response(body, media_type="application/json")

    async def interrupt(request: Request) -> Response:
        try:
            evaluator.dispatcher.interrupt(request.path_params["session"])
        except Exception as exc:
            answer = refusal(exc)
            return _HTTPError(answer.status, answer.title, answer.description).response()
        return Response(status_code=204)

    return output, interrupt


async def _read_options(request: Request) -> tuple[float, bool]:
    """A read's ``wait`` (seconds, at most :data:`MAX_READ_WAIT`) and ``early``."""
    data = bytearray()
    async for chunk in request.stream():
        data.extend(chunk)
        if len(data) > _MAX_READ_BODY:
            raise _HTTPError(413, "413 Payload Too Large", "A read's body is a small object.")
    try:
        body = json.loads(data or b"{}", parse_float=_finite_float, parse_constant=_finite_float)
    except (ValueError, _NonFinite) as exc:
        raise _HTTPError(400, "Invalid JSON", f"Could not parse JSON body - {exc}") from exc
    wait, early = body.get("wait", 0) if isinstance(body, dict) else None, False
    if isinstance(body, dict):
        early = body.get("early", False)
    if (
        not isinstance(wait, int | float)
        or isinstance(wait, bool)
        or not 0 <= wait <= MAX_READ_WAIT
        or not isinstance(early, bool)
    ):
        raise _HTTPError(
            400,
            "Request data failed validation",
            f'a read is {{"wait": seconds from 0 to {MAX_READ_WAIT:g}, "early": boolean}}',
        )
    return float(wait), early


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

    read_cell, interrupt_cell = _cell_endpoints(evaluator)
    return Starlette(
        routes=[
            Route("/eval", _EvalEndpoint(evaluator).handle, methods=["POST", "OPTIONS"]),
            Route("/sessions/{session}", _session_endpoint(evaluator), methods=["DELETE"]),
            Route("/sessions/{session}/output", read_cell, methods=["POST"]),
            Route("/sessions/{session}/interrupt", interrupt_cell, methods=["POST"]),
            Route("/info", _info_endpoint(evaluator), methods=["GET"]),
        ],
        exception_handlers={404: _not_found, 405: _method_not_allowed},
        lifespan=lifespan,
    )
