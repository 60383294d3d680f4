"""An httpx transport over aiohttp: httpx's API, aiohttp's speed, exact error phases.

httpx's own connection pool tops out near 600–1,250 requests/s on this class
of machine; aiohttp near 9,600 (../shared/FACTS.md). Deliveries keep the httpx
API (``httpx.AsyncClient(transport=AiohttpTransport(...))``) and get aiohttp
underneath.

What matters most is *when* a request failed, because that decides whether the
receiver may have processed it (SPEC §4). aiohttp's errors are mapped onto
httpx's by phase:

==========================================  ===============================  ==========
aiohttp                                     httpx                            outcome
==========================================  ===============================  ==========
ClientConnectorError (DNS, refused, TLS)    ConnectError                     not sent
ConnectionTimeoutError (connect, pool)      ConnectTimeout                   not sent
PrivateTargetRefused (our resolver)         ConnectError                     not sent
ServerDisconnectedError                     RemoteProtocolError              unknown
SocketTimeoutError (waiting for answer)     ReadTimeout                      unknown
ClientOSError after connecting (reset)      ReadError                        unknown
ClientResponseError / bad status line       RemoteProtocolError              unknown
ClientPayloadError (body cut)               ReadError                        unknown
==========================================  ===============================  ==========

(The ``httpx-aiohttp`` package maps ``ServerDisconnectedError`` to
``ConnectTimeout``, which would file a request the receiver may have processed
as never sent; tests/integration/test_transport.py pins the mapping above with
a receiver that closes the connection after reading the request.)

Private targets: unless allowed, a host that *resolves* to a loopback, private,
link-local or otherwise non-global address is refused at connect time (the
resolver filters every address, so DNS rebinding cannot slip past a check made
earlier), as is a literal IP of that kind.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import httpx
from aiohttp.abc import AbstractResolver, ResolveResult

from poller.endpoints import is_private_host

_HOP_HEADERS = frozenset({b"host", b"content-length", b"transfer-encoding", b"connection"})
CHUNK = 64 * 1024


class PrivateTargetRefused(OSError):
    """The target resolves to an address deliveries may not reach."""


class _GuardedResolver(AbstractResolver):
    """Resolves with aiohttp's default resolver, then drops non-global addresses."""

    def __init__(self) -> None:
        self._inner = aiohttp.ThreadedResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        results = await self._inner.resolve(host, port, family)
        allowed = [r for r in results if ipaddress.ip_address(r["host"]).is_global]
        if not allowed:
            raise PrivateTargetRefused(
                f"{host} resolves only to private, loopback or link-local addresses; "
                "set POLLER_ALLOW_PRIVATE_TARGETS=true to allow it"
            )
        return allowed

    async def close(self) -> None:
        await self._inner.close()


def _map_error(exc: BaseException, request: httpx.Request) -> httpx.TransportError:
    """The httpx exception for an aiohttp one, chosen by the phase it happened in."""
    message = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return httpx.ConnectTimeout(message, request=request)
    if isinstance(exc, aiohttp.ClientConnectorError | PrivateTargetRefused):
        return httpx.ConnectError(message, request=request)
    if isinstance(exc, aiohttp.SocketTimeoutError):
        return httpx.ReadTimeout(message, request=request)
    if isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientResponseError):
        return httpx.RemoteProtocolError(message, request=request)
    if isinstance(exc, aiohttp.InvalidURL):
        return httpx.UnsupportedProtocol(message, request=request)
    # ClientOSError (reset), ClientPayloadError, anything else once connected.
    return httpx.ReadError(message, request=request)


class _AiohttpStream(httpx.AsyncByteStream):
    def __init__(self, response: aiohttp.ClientResponse, request: httpx.Request) -> None:
        self._response = response
        self._request = request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._response.content.iter_chunked(CHUNK):
                yield chunk
        except (aiohttp.ClientError, OSError) as exc:
            raise _map_error(exc, self._request) from exc

    async def aclose(self) -> None:
        # Unread body left: close the connection rather than drain a hostile stream.
        if self._response.content.at_eof():
            self._response.release()
        else:
            self._response.close()


class AiohttpTransport(httpx.AsyncBaseTransport):
    """httpx transport on one aiohttp session (created lazily on the running loop).

    ``limit`` bounds open connections (0: unbounded; the service bounds
    concurrency itself). Redirects are never followed; TLS is verified.
    """

    def __init__(self, *, limit: int = 0, allow_private: bool = False) -> None:
        self._limit = limit
        self._allow_private = allow_private
        self._session: aiohttp.ClientSession | None = None

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            resolver = None if self._allow_private else _GuardedResolver()
            connector = aiohttp.TCPConnector(
                limit=self._limit, limit_per_host=0, ttl_dns_cache=10, resolver=resolver
            )
            self._session = aiohttp.ClientSession(
                connector=connector, auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar()
            )
        return self._session

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        timeouts: dict[str, Any] = request.extensions.get("timeout", {})
        connect = _sum(timeouts.get("pool"), timeouts.get("connect"))
        timeout = aiohttp.ClientTimeout(
            total=None,
            connect=connect,
            sock_connect=timeouts.get("connect"),
            sock_read=timeouts.get("read"),
        )
        if not self._allow_private and request.url.host and _literal_private(request.url.host):
            raise httpx.ConnectError(
                f"{request.url.host} is a private, loopback or link-local address; "
                "set POLLER_ALLOW_PRIVATE_TARGETS=true to allow it",
                request=request,
            )
        headers = [(k, v) for k, v in request.headers.raw if k.lower() not in _HOP_HEADERS]
        try:
            response = await self._get_session().request(
                request.method,
                str(request.url),
                headers=[(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers],
                data=await request.aread(),
                allow_redirects=False,
                timeout=timeout,
                skip_auto_headers=("User-Agent", "Content-Type"),
            )
        except (aiohttp.ClientError, OSError) as exc:
            raise _map_error(exc, request) from exc
        return httpx.Response(
            status_code=response.status,
            headers=[(k, v) for k, v in response.raw_headers],
            stream=_AiohttpStream(response, request),
            extensions={
                "http_version": b"HTTP/1.1",
                "reason_phrase": (response.reason or "").encode(),
            },
        )

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def _sum(*values: float | None) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) if present else None


def _literal_private(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return host.lower() == "localhost" or host.lower().endswith(".localhost")
    return is_private_host(host)
