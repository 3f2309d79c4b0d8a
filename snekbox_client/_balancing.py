"""Spreading requests over every address a service's name resolves to.

``docker compose up --scale evaluator=3`` puts three replicas behind one name, which Docker's DNS
resolves to three addresses. A plain httpx client connects to whichever address comes first and
then reuses that connection, so where calls land depends on DNS answer order and connection
reuse. :class:`BalancingTransport` decides instead: one connection pool per address, each
request sent to the address with the fewest requests in flight, ties broken round-robin.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass

import httpx

from ._plain_http import PlainHTTPTransport, ResetUnread

__all__ = [
    "REPLICA",
    "AddressState",
    "BalancingTransport",
    "Resolver",
    "UnresolvedReplica",
    "resolve",
]

log = logging.getLogger(__name__)

#: The (path, address) pairs whose retargeted URL a transport keeps.
_CACHED_URLS = 64

#: The request extension that sends a request to one address (a replica holding a live
#: session) instead of choosing.
REPLICA = "snekbox_client.replica"


class UnresolvedReplica(httpx.ConnectError):
    """The name no longer resolves to the address a request was pinned to."""


#: Resolves ``(host, port)`` to IP addresses as strings; raises ``OSError`` when it cannot.
Resolver = Callable[[str, int], Awaitable[Sequence[str]]]


async def resolve(host: str, port: int) -> list[str]:
    """The addresses ``host`` resolves to for TCP (the system resolver), without duplicates."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


@dataclass(frozen=True)
class AddressState:
    """One address of the service: evaluations in flight on it, and whether it is skipped."""

    address: str
    in_flight: int
    down: bool


class _Address:
    def __init__(self, address: str, pool: httpx.AsyncBaseTransport) -> None:
        self.address = address
        self.pool = pool
        #: Evaluations (POSTs) in flight: what the choice counts.
        self.in_flight = 0
        #: Requests of any kind whose response is not closed: the pool stays open for them.
        self.open = 0
        self.down_until = 0.0


class BalancingTransport(httpx.AsyncBaseTransport):
    """An httpx transport that spreads the requests for ``host:port`` over its addresses.

    Each evaluation (a ``POST``) goes to the address with the fewest evaluations in flight (from
    sending the request until its response is closed); among equals, to the next one in address
    order after the last chosen, so sequential evaluations go round-robin. Other requests
    (``OPTIONS``, Snekbox's liveness probe; ``GET /info``) go to the next address in line
    without moving the rotation and are not counted in flight: health checks come at any moment
    (a ``/readyz``, Docker's healthcheck), and must not change where evaluations go.

    A request whose :data:`REPLICA` extension names an address goes there and nowhere else
    (a live session is in that replica's memory): it fails with :class:`UnresolvedReplica` when
    the name no longer resolves to that address, and with ``httpx.ConnectError`` when the
    address refuses the connection.

    The name is resolved again every ``refresh_interval`` seconds and after a connection error.
    An address that refused or timed out a connection is skipped for ``refresh_interval``
    seconds, and the request is sent to another address (a failed connection sent nothing);
    when every address is down, all are tried again. A resolution that fails keeps the
    previous addresses. The ``Host`` header stays the name of the URL.

    For plain ``http`` only: over TLS, connecting by address would need the name for SNI and the
    certificate check, so :class:`~snekbox_client.SnekboxClient` leaves ``https`` URLs to
    httpx's own transport (one name, connections reused).

    Args:
        host: The name (or address) of the service, as in its URL.
        port: Its port.
        resolver: The name resolution to use (see :func:`resolve`): the seam for tests.
        refresh_interval: Seconds between resolutions, and how long a dead address is skipped.
        resolve_timeout: Seconds a resolution may take before the previous answer is kept.
        limits: Connection pool limits, for each address's own pool.
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        resolver: Resolver = resolve,
        refresh_interval: float = 5.0,
        resolve_timeout: float = 2.0,
        limits: httpx.Limits | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self._resolver = resolver
        self._refresh_interval = refresh_interval
        self._resolve_timeout = resolve_timeout
        self._limits = limits or httpx.Limits()
        self._addresses: list[_Address] = []
        self._cursor = 0
        self._resolved_at = -float("inf")
        self._resolving = asyncio.Lock()
        self._retired: list[_Address] = []
        self._urls: dict[tuple[bytes, str], httpx.URL] = {}

    @property
    def addresses(self) -> tuple[AddressState, ...]:
        """The addresses known now, in rotation order."""
        now = time.monotonic()
        return tuple(
            AddressState(a.address, a.in_flight, a.down_until > now) for a in self._addresses
        )

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if (request.url.host, request.url.port or 80) != (self.host, self.port):
            raise httpx.UnsupportedProtocol(
                f"this transport serves {self.host}:{self.port} only, not {request.url}"
            )
        await self._refresh(force=False)
        pinned = request.extensions.get(REPLICA)
        if pinned is not None:
            return await self._send_pinned(str(pinned), request)
        tried: set[str] = set()
        refreshed = False
        last_error: httpx.TransportError | None = None
        while True:
            address = self._pick(tried, probe=request.method != "POST")
            if address is None:
                if refreshed or last_error is None:
                    raise last_error or httpx.ConnectError(f"{self.host} resolves to no address")
                # Every address failed: perhaps the replicas moved; ask the resolver once more.
                refreshed = True
                await self._refresh(force=True)
                continue
            tried.add(address.address)
            try:
                return await self._send(address, request)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                self._mark_down(address, exc)
                if isinstance(exc, ResetUnread):
                    raise  # sent once: not to another replica, it could run twice
                last_error = exc

    async def choose(self) -> str:
        """The address the next request would go to, the rotation moved past it: for a caller
        that sends a series of requests to one replica (a live session's, with :data:`REPLICA`).

        Raises:
            httpx.ConnectError: the name resolves to no address.
        """
        await self._refresh(force=False)
        address = self._pick(set(), probe=False)
        if address is None:
            raise httpx.ConnectError(f"{self.host} resolves to no address")
        return address.address

    async def _send_pinned(self, pinned: str, request: httpx.Request) -> httpx.Response:
        address = next((a for a in self._addresses if a.address == pinned), None)
        if address is None:
            raise UnresolvedReplica(f"{self.host} no longer resolves to the replica {pinned}")
        try:
            return await self._send(address, request)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            self._mark_down(address, exc)
            raise

    def _mark_down(self, address: _Address, exc: Exception) -> None:
        """Skip an address that refused or timed out a connection, and resolve the name again."""
        log.info("cannot connect to %s (%s): %s", address.address, self.host, exc)
        address.down_until = time.monotonic() + self._refresh_interval
        self._resolved_at = -float("inf")

    async def aclose(self) -> None:
        for address in [*self._addresses, *self._retired]:
            await address.pool.aclose()
        self._addresses, self._retired = [], []

    # -- choosing --------------------------------------------------------------------------

    def _pick(self, tried: set[str], *, probe: bool) -> _Address | None:
        candidates = [a for a in self._addresses if a.address not in tried]
        now = time.monotonic()
        up = [a for a in candidates if a.down_until <= now]
        if not up and not any(a.down_until <= now for a in self._addresses):
            up = candidates  # every address is down: try them all again
        if not up:
            return None
        count = len(self._addresses)
        best = min(
            (i for i, a in enumerate(self._addresses) if a in up),
            key=lambda i: (self._addresses[i].in_flight, (i - self._cursor) % count),
        )
        if not probe:
            self._cursor = (best + 1) % count
        return self._addresses[best]

    async def _send(self, address: _Address, request: httpx.Request) -> httpx.Response:
        # The same request (headers, Host included, body and timeouts) to the chosen address.
        retargeted = httpx.Request(
            request.method,
            self._retargeted(request.url, address),
            headers=request.headers,
            stream=request.stream,
            extensions=request.extensions,
        )
        evaluation = request.method == "POST"
        address.open += 1
        address.in_flight += evaluation
        try:
            response = await address.pool.handle_async_request(retargeted)
        except BaseException:
            self._release(address, evaluation)
            raise
        if not isinstance(response.stream, httpx.AsyncByteStream):  # never, from httpx's pools
            self._release(address, evaluation)
            raise TypeError("the address's transport returned a synchronous stream")
        response.stream = _Counted(response.stream, lambda: self._release(address, evaluation))
        return response

    def _retargeted(self, url: httpx.URL, address: _Address) -> httpx.URL:
        """``url`` on ``address``: parsed once per path and address (httpx parses a URL again
        for each copy, a tenth of a request's CPU), the first few kept."""
        key = (url.raw_path, address.address)
        retargeted = self._urls.get(key)
        if retargeted is None:
            retargeted = url.copy_with(host=address.address)
            if len(self._urls) < _CACHED_URLS:
                self._urls[key] = retargeted
        return retargeted

    @staticmethod
    def _release(address: _Address, evaluation: bool) -> None:
        address.open -= 1
        address.in_flight -= evaluation

    # -- resolving -------------------------------------------------------------------------

    async def _refresh(self, *, force: bool) -> None:
        due = time.monotonic() - self._resolved_at >= self._refresh_interval
        if not (force or due):
            return
        for gone in [a for a in self._retired if a.open == 0]:
            self._retired.remove(gone)
            await gone.pool.aclose()
        if self._resolving.locked() and self._addresses and not force:
            return  # another request is resolving: use the addresses known meanwhile
        async with self._resolving:
            if not force and time.monotonic() - self._resolved_at < self._refresh_interval:
                return  # resolved while this request waited
            try:
                async with asyncio.timeout(self._resolve_timeout):
                    found = await self._resolver(self.host, self.port)
            except (OSError, TimeoutError) as exc:
                reason = str(exc) or type(exc).__name__
                if not self._addresses:
                    raise httpx.ConnectError(f"cannot resolve {self.host}: {reason}") from exc
                log.warning("cannot resolve %s (%s); keeping its addresses", self.host, reason)
                self._resolved_at = time.monotonic()
                return
            await self._update(found)
            self._resolved_at = time.monotonic()

    async def _update(self, found: Sequence[str]) -> None:
        """Take a new answer, keeping the state (in flight, down) of addresses still in it."""
        known = {a.address: a for a in self._addresses}
        last = self._addresses[(self._cursor - 1) % len(self._addresses)] if known else None
        addresses = []
        for ip in sorted(set(found), key=_address_order):
            address = known.pop(ip, None)
            if address is None:
                pool = PlainHTTPTransport(self._limits)
                address = _Address(ip, pool)
            addresses.append(address)
        if addresses != self._addresses:
            log.info("%s resolves to %s", self.host, ", ".join(a.address for a in addresses))
        for gone in known.values():
            if gone.open:
                self._retired.append(gone)  # closed once its last response is
            else:
                await gone.pool.aclose()
        # Keep the rotation going from where it was.
        if last is not None and last in addresses:
            self._cursor = (addresses.index(last) + 1) % len(addresses)
        elif addresses:
            self._cursor %= len(addresses)
        self._addresses = addresses


class _Counted(httpx.AsyncByteStream):
    """A response body that calls ``release`` once, when it is closed."""

    def __init__(self, stream: httpx.AsyncByteStream, release: Callable[[], None]) -> None:
        self._stream = stream
        self._release: Callable[[], None] | None = release

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._stream:
            yield chunk

    async def aclose(self) -> None:
        try:
            await self._stream.aclose()
        finally:
            release, self._release = self._release, None
            if release is not None:
                release()


def _address_order(address: str) -> tuple[int, int]:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    return ip.version, int(ip)
