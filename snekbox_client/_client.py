"""The client: one shared ``httpx.AsyncClient`` speaking ``POST /eval``."""

from __future__ import annotations

import json
from types import TracebackType
from typing import Any

import httpx

from ._exceptions import (
    EvaluatorRejected,
    EvaluatorTimeout,
    EvaluatorUnavailable,
    InvalidResponse,
)
from ._models import EvalRequest, EvalResult

__all__ = ["DEFAULT_TIMEOUT", "SnekboxClient"]

#: Seconds to wait for an answer. It must exceed the service's own time limit (Snekbox: 6 s,
#: the built-in evaluator: 15 s by default) plus its queueing, so that a slow run is reported by
#: the service as a 137 kill rather than by the client as a timeout.
DEFAULT_TIMEOUT = 30.0

_DEFAULT_LIMITS = httpx.Limits(max_connections=32, max_keepalive_connections=8, keepalive_expiry=5)


class SnekboxClient:
    """An async client of one evaluation service.

    Args:
        base_url: The service's root URL, e.g. ``http://snekbox:8060``. With ``transport`` set,
            any URL will do; it only appears in error messages.
        transport: An httpx transport to use instead of the network, e.g.
            ``httpx.ASGITransport(app)`` to call an in-process ASGI evaluator.
        timeout: Seconds to wait for an evaluation to come back (see :data:`DEFAULT_TIMEOUT`).
        connect_timeout: Seconds to wait for a connection, so a dead service is reported fast.
        limits: Connection pool limits.

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
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            transport=transport,
            timeout=httpx.Timeout(timeout, connect=connect_timeout),
            limits=limits,
            trust_env=False,
        )

    async def eval(self, request: EvalRequest) -> EvalResult:
        """Run one evaluation.

        Raises:
            EvaluatorUnavailable: the service could not be reached.
            EvaluatorTimeout: it did not answer within ``timeout``.
            EvaluatorRejected: it answered with an error status.
            InvalidResponse: it answered 200 with something unparseable.
        """
        response = await self._send("POST", "/eval", json=request.to_json())
        if response.status_code != 200:
            raise _rejection(response)
        try:
            data = response.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise InvalidResponse(f"the answer is not JSON: {exc}") from exc
        return EvalResult.from_json(data)

    async def ping(self) -> None:
        """Check that the service answers ``OPTIONS /eval`` (Snekbox's cheapest probe).

        Raises the same errors as :meth:`eval`.
        """
        response = await self._send("OPTIONS", "/eval")
        if response.status_code >= 400:
            raise _rejection(response)

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

    async def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return await self._http.request(method, path, **kwargs)
        except httpx.TimeoutException as exc:
            if isinstance(exc, httpx.ConnectTimeout | httpx.PoolTimeout):
                raise EvaluatorUnavailable(self.base_url, "connection timed out") from exc
            raise EvaluatorTimeout(self.base_url, self.timeout) from exc
        except httpx.TransportError as exc:
            raise EvaluatorUnavailable(self.base_url, str(exc) or type(exc).__name__) from exc


def _rejection(response: httpx.Response) -> EvaluatorRejected:
    title, description = f"HTTP {response.status_code}", None
    try:
        body = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        body = None
    if isinstance(body, dict) and isinstance(body.get("title"), str):
        title = body["title"]
        if isinstance(body.get("description"), str):
            description = body["description"]
    elif response.text:
        description = response.text[:500]
    return EvaluatorRejected(response.status_code, title, description)
