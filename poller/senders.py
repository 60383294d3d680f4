"""How deliveries reach the wire: one narrow seam, two implementations, one guard.

``Sender.request(method, url, headers, body, timeout)`` returns a
:class:`Reply` (status, Retry-After, up to :data:`READ_CAP` bytes of body) or
raises :class:`SendError`, whose ``sent`` flag says whether the receiver may
have seen the request — the distinction the delivery contract is built on
(docs/reference/delivery-contract.md):

* ``sent=False`` (*not sent*): DNS failure, connection refused, TLS failure,
  connect or pool timeout, an invalid URL, a private target refused. Known
  not delivered.
* ``sent=True`` (*unknown*): no answer after the connection was made — read
  timeout, connection reset or closed after sending, an unparseable answer.

**Two budgets.** ``timeout`` bounds the whole exchange (a slow-drip body
cannot hold a claim past its lease; a status already received still counts).
Inside it, the *connect budget* — ``min(connect_timeout, timeout / 2)`` —
bounds getting a connection (pool wait, DNS, TCP, TLS) and is enforced by the
client itself, so it always fires first: a failure within it is *not sent*,
and running out of the whole budget after it is *unknown*. A blackholed host
is therefore a connect timeout, never a "maybe delivered".

:class:`AiohttpSender` is the default: it delivers more per second than httpx
on the same machine (the figures are in docs/explanation/performance.md).
:class:`HttpxSender` uses httpx with the same guard and the same
classification; its ``transport`` argument is for tests
(``httpx.MockTransport``) and owns its own connections.

Both refuse private targets at the connection seam (poller/netguard.py)
unless they are allowed, never follow redirects, verify TLS, ignore proxy
environment variables, and read the body only up to READ_CAP before dropping
the connection. :func:`make_sender` builds the one the settings ask for.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol
from urllib.parse import urlsplit

import aiohttp
import httpcore
import httpx
import yarl

from poller.netguard import (
    PRIVATE_HINT,
    GuardedBackend,
    Resolve,
    guarded_socket,
    host_refusal,
    system_resolve,
)
from poller.tls import HANDSHAKE_RESET, handshake_reset, tls_failure

if TYPE_CHECKING:
    from poller.settings import Settings

READ_CAP = 64 * 1024
NO_CEILING = 1e9  # aiohttp rounds timeouts of 5 s or more up to whole seconds unless told not to


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    retry_after: str | None
    body: bytes


class SendError(Exception):
    """The exchange failed; ``sent`` tells whether the receiver may have the request."""

    def __init__(self, error_class: str, message: str, *, sent: bool) -> None:
        super().__init__(message)
        self.error_class = error_class
        self.sent = sent


class Sender(Protocol):
    async def request(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        body: bytes,
        timeout: float,
        tls: ssl.SSLContext | None = None,
    ) -> Reply: ...

    async def aclose(self) -> None: ...


TARGETS_KEPT = 10_000  # parsed URLs and timeouts a sender keeps
TLS_CLIENTS_KEPT = 256  # httpx clients for endpoints with their own TLS settings


def connect_budget(connect_timeout: float, timeout: float) -> float:
    """The share of ``timeout`` allowed for getting a connection (it must end first)."""
    return min(connect_timeout, timeout / 2)


def _message(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:500]


def preflight(url: str, allow_private: bool) -> None:
    """Refuse a URL before any I/O: unparseable, or a private literal host / ``localhost``.

    Only a courtesy (a clear error, no DNS query): the guard at connect time is
    what holds, for every spelling and every DNS answer.
    """
    try:
        host = urlsplit(url).hostname
    except ValueError as exc:
        raise SendError("InvalidURL", _message(exc), sent=False) from exc
    if not host:
        raise SendError("InvalidURL", f"{url!r} has no host", sent=False)
    if not allow_private:
        reason = host_refusal(host)
        if reason is not None:
            raise SendError("ConnectError", f"refused: {reason}; {PRIVATE_HINT}", sent=False)


# --- aiohttp ---------------------------------------------------------------------


def _connect_failure(exc: aiohttp.ClientConnectorError) -> str:
    """What went wrong connecting, in words a person reads (no ``ssl:default`` noise)."""
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):
        reason = f"TLS certificate refused: {exc.certificate_error}"
    else:
        reason = exc.os_error.strerror or str(exc.os_error) or type(exc.os_error).__name__
    return f"cannot connect to {exc.host}:{exc.port}: {reason}"[:500]


def _aiohttp_error(exc: BaseException) -> SendError:
    """Classify an aiohttp failure by the phase it happened in."""
    tls_reason = tls_failure(exc)
    if tls_reason is not None:  # the handshake was refused: the receiver never had it
        return SendError("TLSError", tls_reason, sent=False)
    message = _message(exc)
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return SendError(
            "ConnectTimeout", "connect timeout: no connection within the budget", sent=False
        )
    if isinstance(exc, aiohttp.ClientConnectorError):
        if exc._conn_key.is_ssl and handshake_reset(exc):  # no public spelling of is_ssl
            return SendError("TLSError", HANDSHAKE_RESET, sent=False)
        return SendError("ConnectError", _connect_failure(exc), sent=False)
    if isinstance(exc, aiohttp.InvalidURL | aiohttp.NonHttpUrlClientError):
        return SendError("InvalidURL", message, sent=False)
    if isinstance(exc, aiohttp.SocketTimeoutError | TimeoutError):
        # The connect budget had not run out, so the connection was made: maybe processed.
        return SendError("ReadTimeout", message, sent=True)
    if isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientResponseError):
        # Closed after reading the request, or answered with garbage: maybe processed.
        return SendError("RemoteProtocolError", message, sent=True)
    return SendError("ReadError", message, sent=True)  # reset, payload errors, …


class AiohttpSender:
    """The default sender: one aiohttp session, created lazily on the running loop.

    ``limit`` bounds open connections (0: unbounded; the service bounds
    concurrency itself). ``resolver`` replaces aiohttp's (tests: a DNS answer
    no real resolver here would give); the guard checks what it returns.
    """

    def __init__(
        self,
        *,
        limit: int = 0,
        allow_private: bool = False,
        connect_timeout: float = 5.0,
        resolver: aiohttp.abc.AbstractResolver | None = None,
    ) -> None:
        self._limit = limit
        self._allow_private = allow_private
        self._connect_timeout = connect_timeout
        self._resolver = resolver
        self._session: aiohttp.ClientSession | None = None
        # Per-request work that depends only on the URL or the timeout, done once: an
        # endpoint's URL is checked and parsed on its first request, not on every one.
        self._targets: dict[str, yarl.URL] = {}
        self._limits: dict[float, aiohttp.ClientTimeout] = {}

    def _target(self, method: str, url: str) -> yarl.URL:
        target = self._targets.get(url)
        if target is None:
            preflight(url, self._allow_private)
            target = yarl.URL(url)
            if method != "POST":  # a lookup URL holds the message's key: used once
                return target
            if len(self._targets) >= TARGETS_KEPT:  # URLs change rarely; never grow unbounded
                self._targets.clear()
            self._targets[url] = target
        return target

    def _timeouts(self, timeout: float) -> aiohttp.ClientTimeout:
        limits = self._limits.get(timeout)
        if limits is None:
            connect = connect_budget(self._connect_timeout, timeout)
            limits = aiohttp.ClientTimeout(
                total=None,
                connect=connect,
                sock_connect=connect,
                sock_read=timeout,
                ceil_threshold=NO_CEILING,
            )
            if len(self._limits) >= TARGETS_KEPT:
                self._limits.clear()
            self._limits[timeout] = limits
        return limits

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(
                limit=self._limit,
                limit_per_host=0,
                ttl_dns_cache=10,
                resolver=self._resolver,
                socket_factory=None if self._allow_private else guarded_socket,
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                auto_decompress=False,
                cookie_jar=aiohttp.DummyCookieJar(),
                skip_auto_headers=("User-Agent", "Content-Type", "Accept-Encoding"),
                trust_env=False,
            )
        return self._session

    async def request(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        body: bytes,
        timeout: float,
        tls: ssl.SSLContext | None = None,
    ) -> Reply:
        limits = self._timeouts(timeout)
        response: aiohttp.ClientResponse | None = None
        data = bytearray()
        try:
            target = self._target(method, url)  # a URL yarl refuses is a ValueError, as in aiohttp
            async with asyncio.timeout(timeout):
                response = await self._get_session().request(
                    method,
                    target,
                    headers=headers,
                    data=body or None,
                    allow_redirects=False,
                    timeout=limits,
                    ssl=True if tls is None else tls,  # the endpoint's own (poller/tls.py)
                )
                while len(data) < READ_CAP:
                    chunk = await response.content.read(READ_CAP - len(data))
                    if not chunk:
                        break
                    data += chunk
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
            if response is None:
                raise _aiohttp_error(exc) from exc
            # The status arrived; a body cut short or slow does not change the answer.
        finally:
            if response is not None:
                if response.content.at_eof():
                    response.release()
                else:
                    response.close()  # drop, never drain, an unread (maybe endless) body
        assert response is not None
        return Reply(response.status, response.headers.get("Retry-After"), bytes(data))

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


# --- httpx ------------------------------------------------------------------------

# httpx's exceptions raised before the request could reach the receiver.
HTTPX_NOT_SENT = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.PoolTimeout,
    httpx.UnsupportedProtocol,
)


def guarded_transport(
    *,
    limit: int,
    allow_private: bool,
    resolve: Resolve = system_resolve,
    tls: ssl.SSLContext | None = None,
) -> httpx.AsyncHTTPTransport:
    """httpx's own transport, its connection pool built on the guarded network backend."""
    limits = httpx.Limits(max_connections=limit or None)
    transport = httpx.AsyncHTTPTransport(limits=limits, retries=0, verify=tls or True)
    if allow_private:
        return transport
    pool = transport._pool  # httpx takes no network backend; swap in a pool that has ours
    if not isinstance(pool, httpcore.AsyncConnectionPool):  # pragma: no cover - httpx changed
        raise RuntimeError("httpx's transport no longer wraps an httpcore.AsyncConnectionPool")
    transport._pool = httpcore.AsyncConnectionPool(
        ssl_context=pool._ssl_context,
        max_connections=pool._max_connections,
        max_keepalive_connections=pool._max_keepalive_connections,
        keepalive_expiry=pool._keepalive_expiry,
        http1=pool._http1,
        http2=pool._http2,
        retries=0,
        network_backend=GuardedBackend(resolve),
    )
    return transport


class HttpxSender:
    """Deliveries through httpx, guarded and classified like the aiohttp sender.

    ``transport`` (tests, e.g. ``httpx.MockTransport``) replaces the guarded
    network transport; ``resolve`` replaces the system resolver behind the guard.
    """

    def __init__(
        self,
        *,
        limit: int = 0,
        allow_private: bool = False,
        connect_timeout: float = 5.0,
        transport: httpx.AsyncBaseTransport | None = None,
        resolve: Resolve = system_resolve,
    ) -> None:
        self._connect_timeout = connect_timeout
        self._allow_private = allow_private
        self._limit, self._resolve = limit, resolve
        self.client = self._client(transport)
        # httpx verifies per client: one more client per TLS context an endpoint has
        # (poller/tls.py caches contexts, so one per distinct setting), oldest closed.
        self._tls_clients: dict[ssl.SSLContext, httpx.AsyncClient] = {}

    def _client(
        self, transport: httpx.AsyncBaseTransport | None, tls: ssl.SSLContext | None = None
    ) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            transport=transport
            or guarded_transport(
                limit=self._limit, allow_private=self._allow_private, resolve=self._resolve, tls=tls
            ),
            follow_redirects=False,
            trust_env=False,
        )

    async def _client_for(self, tls: ssl.SSLContext | None) -> httpx.AsyncClient:
        if tls is None:
            return self.client
        client = self._tls_clients.get(tls)
        if client is None:
            if len(self._tls_clients) >= TLS_CLIENTS_KEPT:
                oldest = next(iter(self._tls_clients))
                await self._tls_clients.pop(oldest).aclose()
            client = self._tls_clients[tls] = self._client(None, tls)
        return client

    async def request(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        body: bytes,
        timeout: float,
        tls: ssl.SSLContext | None = None,
    ) -> Reply:
        preflight(url, self._allow_private)
        connect = connect_budget(self._connect_timeout, timeout)
        client = await self._client_for(tls)
        try:
            request = client.build_request(
                method,
                url,
                headers=headers,
                content=body,
                timeout=httpx.Timeout(timeout, connect=connect, pool=connect),
            )
        except (httpx.InvalidURL, ValueError) as exc:  # nothing was sent: no connection yet
            raise SendError("InvalidURL", _message(exc), sent=False) from exc
        response: httpx.Response | None = None
        data = bytearray()
        try:
            async with asyncio.timeout(timeout):
                response = await client.send(request, stream=True, follow_redirects=False)
                async for chunk in response.aiter_raw():
                    data += chunk
                    if len(data) >= READ_CAP:
                        break
        except (httpx.HTTPError, TimeoutError) as exc:
            if response is None:
                tls_reason = tls_failure(exc)
                if tls_reason is None and isinstance(exc, httpx.ConnectError):
                    https = request.url.scheme == "https"
                    tls_reason = HANDSHAKE_RESET if https and handshake_reset(exc) else None
                if tls_reason is not None:  # the handshake was refused: never had it
                    raise SendError("TLSError", tls_reason, sent=False) from exc
                sent = not isinstance(exc, HTTPX_NOT_SENT)
                name = "ReadTimeout" if isinstance(exc, TimeoutError) else type(exc).__name__
                raise SendError(name, _message(exc), sent=sent) from exc
        finally:
            if response is not None:
                await response.aclose()
        assert response is not None
        return Reply(
            response.status_code, response.headers.get("retry-after"), bytes(data[:READ_CAP])
        )

    async def aclose(self) -> None:
        await self.client.aclose()
        for client in self._tls_clients.values():
            await client.aclose()
        self._tls_clients.clear()


def make_sender(settings: Settings) -> Sender:
    """The shared HTTP sender the settings ask for (``POLLER_HTTP_CLIENT``)."""
    limit, allow = settings.concurrency, settings.allow_private_targets
    if settings.http_client == "aiohttp":
        return AiohttpSender(
            limit=limit, allow_private=allow, connect_timeout=settings.connect_timeout
        )
    return HttpxSender(limit=limit, allow_private=allow, connect_timeout=settings.connect_timeout)
