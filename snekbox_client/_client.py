"""The client: one shared ``httpx.AsyncClient`` speaking ``POST /eval``."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from types import TracebackType
from typing import Any
from urllib.parse import quote

import httpx

from ._answer import AnswerReader
from ._balancing import REPLICA, BalancingTransport, UnresolvedReplica
from ._exceptions import (
    ConnectionLost,
    EvaluatorRejected,
    EvaluatorTimeout,
    EvaluatorUnavailable,
    InvalidResponse,
    ReplicaGone,
)
from ._fields import json_body
from ._info import ServiceInfo
from ._request import ContentWanted, EvalRequest
from ._result import EvalResult

__all__ = ["DEFAULT_TIMEOUT", "SnekboxClient"]

#: Seconds to wait for an answer. It must exceed the service's own time limit (Snekbox: 6 s,
#: the built-in evaluator: 15 s by default) plus its queueing, so that a slow run is reported by
#: the service as a 137 kill rather than by the client as a timeout.
DEFAULT_TIMEOUT = 30.0

#: Idle connections are dropped after 4 s: uvicorn closes them after 5 by default (the built-in
#: evaluator as a service, after 75), and a request sent on one it is closing would come back
#: "connection lost" for code that never ran.
_DEFAULT_LIMITS = httpx.Limits(max_connections=32, max_keepalive_connections=8, keepalive_expiry=4)
_MiB = 1024 * 1024
#: The most of an error answer read, for its title and description.
_ERROR_BODY_BYTES = 64 * 1024
#: An answer up to this size is decoded on the event loop: handing it to a thread (which keeps
#: a large one's base64 and UTF-8 decoding off the loop) costs more than the decoding.
_DECODE_INLINE_BYTES = 64 * 1024
#: Seconds an answer's bytes may take to arrive beyond the time its run was given.
_TRANSFER_SECONDS = 5.0
#: The request paths whose parsed URL a client keeps (``/eval``, ``/info`` ... come first).
_CACHED_URLS = 16


class SnekboxClient:
    """An async client of one evaluation service.

    Args:
        base_url: The service's root URL, e.g. ``http://snekbox:8060``. With ``transport`` set,
            any URL will do; it only appears in error messages.
        transport: An httpx transport to use instead of the network, e.g.
            ``httpx.ASGITransport(app)`` to call an in-process ASGI evaluator.
        timeout: Seconds to wait for an evaluation to come back (see :data:`DEFAULT_TIMEOUT`).
        connect_timeout: Seconds to wait for a connection, so a dead service is reported fast.
        limits: Connection pool limits (of each address's pool, for a balanced ``http`` URL).
        refresh_interval: Seconds between resolutions of a balanced URL's host.
        max_answer_bytes: The largest answer read (Snekbox's largest is about 70 MB: 48 MiB of
            files in base64 and 1 MB of output), kept in memory or not.
        max_text_bytes: The most output and file names an answer may carry (JSON-escaped).
        max_content_bytes: The most file contents kept from one answer when the request has no
            ``content_wanted``; files beyond come back without content (``complete`` False).
        max_files: The most files an answer may list (Snekbox returns at most 100).

    With no ``transport`` and an ``http`` URL, requests are spread over every address the
    URL's host resolves to (several replicas behind one name): see :class:`BalancingTransport`.
    An ``https`` URL uses httpx's own transport: one name, its connections reused.

    An answer is read as it arrives and only what the result keeps is held in memory: ``stdout``,
    file names and sizes, and the file contents the request's ``content_wanted`` asks for (the
    client applies that rule itself when the service ignores it, as Snekbox does); decoding
    what was kept runs in a thread, off the event loop.

    Proxy environment variables are ignored (``trust_env=False``): evaluation traffic goes
    straight to the service it was configured for.
    """

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8060",
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        connect_timeout: float = 2.0,
        limits: httpx.Limits = _DEFAULT_LIMITS,
        refresh_interval: float = 5.0,
        max_answer_bytes: int = 128 * _MiB,
        max_text_bytes: int = 16 * _MiB,
        max_content_bytes: int = 64 * _MiB,
        max_files: int = 1000,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.max_answer_bytes = max_answer_bytes
        self.max_text_bytes = max_text_bytes
        self.max_content_bytes = max_content_bytes
        self.max_files = max_files
        url = httpx.URL(self.base_url)
        if transport is None and url.scheme == "http":
            transport = BalancingTransport(
                url.host,
                url.port or 80,
                refresh_interval=refresh_interval,
                resolve_timeout=connect_timeout,
                limits=limits,
            )
        #: The transport in use: a :class:`BalancingTransport` for a plain ``http`` URL, the one
        #: given, or ``None`` for httpx's own (``https``).
        self.transport = transport
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            transport=transport,
            timeout=httpx.Timeout(timeout, connect=connect_timeout),
            limits=limits,
            trust_env=False,
            # The answer is read as it comes: no compression to inflate in memory first.
            headers={"Accept-Encoding": "identity"},
        )
        # Through the balancing transport, requests skip httpx's client (cookies, auth,
        # redirects: none of which this API has), which costs more CPU than the rest of the
        # request: see _exchange.
        self._direct = isinstance(transport, BalancingTransport)
        self._urls: dict[str, httpx.URL] = {}
        self._json_headers = httpx.Headers(self._http.headers)
        self._json_headers["Content-Type"] = "application/json"

    async def eval(
        self, request: EvalRequest, *, replica: str | None = None, extra_time: float = 0.0
    ) -> EvalResult:
        """Run one evaluation; on the replica at address ``replica``, if given (where a live
        session is: see :class:`BalancingTransport` and :meth:`choose_replica`), waiting
        ``extra_time`` seconds more than ``timeout`` for its answer (packages to install).

        Raises:
            EvaluatorUnavailable: the service could not be reached (the code did not run);
                :class:`ReplicaGone` when the service's name no longer resolves to ``replica``.
            ConnectionLost: a connection was made, then broke before the whole answer came.
            EvaluatorTimeout: it did not answer within ``timeout``.
            EvaluatorRejected: it answered with an error status.
            InvalidResponse: it answered 200 with something unparseable, undecodable or over a
                limit.
        """
        wanted = request.content_wanted or ContentWanted(("*",), self.max_content_bytes)
        # A cell read as it runs is answered within its wait, which the service spends first.
        waited = self.timeout + extra_time + (request.wait or 0.0)
        return await self._result("/eval", request.to_bytes(), wanted, replica, waited)

    async def read_output(
        self,
        session: str,
        *,
        wait: float,
        early: bool = False,
        replica: str | None = None,
    ) -> EvalResult:
        """Read what the running cell of a live session of the built-in evaluator wrote since
        the last read (``POST /sessions/<id>/output``), waiting up to ``wait`` seconds for its
        end (or, with ``early``, for its next output): :attr:`EvalResult.running` while it runs;
        once it ended, its result, ``stdout`` what was not read before.

        Raises:
            EvaluatorRejected: 404, the session is not live there; 409, no cell of it is
                running or unread.
            The other errors of :meth:`eval`.
        """
        path = f"/sessions/{quote(session, safe='')}/output"
        wanted = ContentWanted(("*",), self.max_content_bytes)
        body = json_body({"wait": wait, "early": early})
        return await self._result(path, body, wanted, replica, self.timeout + wait)

    async def _result(
        self,
        path: str,
        body: bytes,
        wanted: ContentWanted,
        replica: str | None,
        waited: float,
    ) -> EvalResult:
        """POST ``body`` (JSON) to ``path`` and read its answer, an eval result, as it arrives
        (keeping the contents ``wanted``), waiting ``waited`` seconds for it."""
        reader = AnswerReader(
            wanted,
            max_answer_bytes=self.max_answer_bytes,
            max_text_bytes=self.max_text_bytes,
            max_files=self.max_files,
        )
        timeout = httpx.Timeout(waited, connect=self.connect_timeout)
        try:
            # Each read waits at most ``waited``, and so does the whole answer (and its bytes
            # a little more): a service that trickles its answer does not hold the call.
            async with asyncio.timeout(self.connect_timeout + waited + _TRANSFER_SECONDS):
                async with self._exchange(
                    "POST", path, replica, body=body, timeout=timeout
                ) as response:
                    if response.status_code != 200:
                        raise _rejection(response.status_code, await _read_at_most(response))
                    async for chunk in response.aiter_bytes():
                        reader.feed(chunk)
        except TimeoutError:
            raise EvaluatorTimeout(self.base_url, waited) from None
        if reader.bytes_read <= _DECODE_INLINE_BYTES:
            return reader.result()
        return await asyncio.to_thread(reader.result)

    async def interrupt(self, session: str, *, replica: str | None = None) -> None:
        """Interrupt the running cell of a live session (``POST /sessions/<id>/interrupt``):
        a ``KeyboardInterrupt`` in it, and its interpreter killed if it does not stop; its end
        is read with :meth:`read_output`.

        Raises:
            EvaluatorRejected: 404, the session is not live there; 409, no cell is running.
            The other errors of :meth:`eval`.
        """
        path = f"/sessions/{quote(session, safe='')}/interrupt"
        async with self._exchange("POST", path, replica) as response:
            if response.status_code >= 300:
                raise _rejection(response.status_code, await _read_at_most(response))

    async def choose_replica(self) -> str | None:
        """The replica that a series of requests (a live session's) should all go to: the one a
        request would go to now. ``None`` when the URL is not balanced (one address).

        Raises:
            EvaluatorUnavailable: the URL's name resolves to no address.
        """
        if not isinstance(self.transport, BalancingTransport):
            return None
        try:
            return await self.transport.choose()
        except httpx.TransportError as exc:
            raise EvaluatorUnavailable(self.base_url, _reason(exc)) from exc

    async def info(self) -> ServiceInfo:
        """What the service offers beyond Snekbox's API (``GET /info``): Snekbox, which has no
        such route, offers nothing beyond it.

        Raises the same errors as :meth:`eval`.
        """
        async with self._exchange("GET", "/info") as response:
            if response.status_code in (404, 405):
                return ServiceInfo.none()
            content = await _read_at_most(response)
            if response.status_code != 200:
                raise _rejection(response.status_code, content)
        try:
            return ServiceInfo.from_json(json.loads(content))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise InvalidResponse(f"GET /info answered what is not JSON: {exc}") from exc

    async def ping(self) -> None:
        """Check that the service answers ``OPTIONS /eval`` (Snekbox's cheapest probe).

        Raises the same errors as :meth:`eval`.
        """
        async with self._exchange("OPTIONS", "/eval") as response:
            if response.status_code >= 400:
                raise _rejection(response.status_code, await _read_at_most(response))

    async def end_session(self, session: str, *, replica: str | None = None) -> None:
        """End a live session of the built-in evaluator (``DELETE /sessions/<id>``), on the
        replica at ``replica`` if given; one it does not hold (or Snekbox, which has none) is
        no error.

        Raises the same errors as :meth:`eval` when the service cannot be reached.
        """
        path = f"/sessions/{quote(session, safe='')}"
        async with self._exchange("DELETE", path, replica) as response:
            if response.status_code >= 500:
                raise _rejection(response.status_code, await _read_at_most(response))

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> SnekboxClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    @asynccontextmanager
    async def _exchange(
        self, method: str, path: str, replica: str | None = None, **kwargs: Any
    ) -> AsyncIterator[httpx.Response]:
        """One request (to the address ``replica``, if given, of a balanced URL), its response
        streamed; every httpx error becomes a :class:`SnekboxError`.

        Whether the code may have run decides the class: not if no connection was made
        (:class:`EvaluatorUnavailable`), perhaps if one broke (:class:`ConnectionLost`).
        """
        try:
            extensions = {REPLICA: replica} if replica is not None else None
            if self._direct:
                async with self._direct_stream(method, path, extensions, kwargs) as response:
                    yield response
            else:
                if "body" in kwargs:  # JSON, encoded
                    kwargs["content"] = kwargs.pop("body")
                    kwargs["headers"] = {"Content-Type": "application/json"}
                async with self._http.stream(
                    method, path, extensions=extensions, **kwargs
                ) as response:
                    yield response
        except httpx.TimeoutException as exc:
            if isinstance(exc, httpx.ConnectTimeout | httpx.PoolTimeout):
                raise EvaluatorUnavailable(self.base_url, "connection timed out") from exc
            waited = kwargs["timeout"].read if "timeout" in kwargs else self.timeout
            raise EvaluatorTimeout(self.base_url, waited) from exc
        except (
            httpx.ReadError,
            httpx.WriteError,
            httpx.CloseError,
            httpx.RemoteProtocolError,
        ) as exc:
            raise ConnectionLost(self.base_url, _reason(exc)) from exc
        except UnresolvedReplica as exc:
            raise ReplicaGone(self.base_url, _reason(exc)) from exc
        except httpx.TransportError as exc:  # no connection made, or no request httpx could send
            raise EvaluatorUnavailable(self.base_url, _reason(exc)) from exc
        except httpx.DecodingError as exc:  # a Content-Encoding whose body does not decode
            raise InvalidResponse(f"the answer cannot be decoded: {_reason(exc)}") from exc
        except httpx.HTTPError as exc:  # what else httpx raises for an answer (redirects, ...)
            raise InvalidResponse(_reason(exc)) from exc

    @asynccontextmanager
    async def _direct_stream(
        self,
        method: str,
        path: str,
        extensions: dict[str, Any] | None,
        options: dict[str, Any],
    ) -> AsyncIterator[httpx.Response]:
        """What ``self._http.stream`` does for this API's requests (``options``: its JSON
        ``body``, encoded, and ``timeout``), straight to the transport: the URL parsed once
        per path."""
        if self._http.is_closed:
            raise RuntimeError("Cannot send a request, as the client has been closed.")
        assert self.transport is not None
        url = self._urls.get(path)
        if url is None:
            url = httpx.URL(self.base_url + path)
            if len(self._urls) < _CACHED_URLS:  # session paths vary: the first ones are kept
                self._urls[path] = url
        content = options.get("body")
        headers = self._http.headers if content is None else self._json_headers
        timeouts = (options.get("timeout") or self._http.timeout).as_dict()
        request = httpx.Request(
            method,
            url,
            headers=headers,
            content=content,
            extensions={"timeout": timeouts, **(extensions or {})},
        )
        response = await self.transport.handle_async_request(request)
        response.request = request
        try:
            yield response
        finally:
            await response.aclose()


def _reason(exc: Exception) -> str:
    return str(exc) or type(exc).__name__


async def _read_at_most(response: httpx.Response, limit: int = _ERROR_BODY_BYTES) -> bytes:
    body = bytearray()
    async for chunk in response.aiter_bytes():
        body += chunk[: limit - len(body)]
        if len(body) >= limit:
            break
    return bytes(body)


def _rejection(status_code: int, content: bytes) -> EvaluatorRejected:
    title, description = f"HTTP {status_code}", None
    try:
        body = json.loads(content)
    except (json.JSONDecodeError, UnicodeDecodeError):
        body = None
    if isinstance(body, dict) and isinstance(body.get("title"), str):
        title = body["title"]
        if isinstance(body.get("description"), str):
            description = body["description"]
    elif content:
        description = content.decode("utf-8", "replace")[:500]
    return EvaluatorRejected(status_code, title, description)
