"""Two of the three senders: aiohttp and httpx, guarded and classified alike.

The seam they implement, its answer and its error are in poller/wire.py; the
third, the default (reqwest, through pyreqwest), is poller/reqwest_sender.py,
and poller/sending.py builds the one the settings ask for. The figures behind
the default are in docs/explanation/performance.md. :class:`HttpxSender`'s
``transport`` argument is for tests (``httpx.MockTransport``) and owns its own
connections.

Both refuse private targets at the connection seam (poller/netguard.py)
unless they are allowed, never follow redirects, verify TLS (with an
endpoint's own client certificate and CA, poller/tls.py), ignore proxy
environment variables — ``POLLER_PROXY_URL`` alone routes them through a
proxy, to the address they checked (poller/proxy.py) — and read the body only
up to READ_CAP before dropping the connection.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import aiohttp
import httpcore
import httpx
import yarl

from poller.netguard import GuardedBackend, Resolve, guarded_socket, system_resolve
from poller.proxy import SNI, WROTE, Proxy, ProxyBackend, Route
from poller.tls import HANDSHAKE_RESET, handshake_reset, tls_failure
from poller.wire import READ_CAP as READ_CAP
from poller.wire import TARGETS_KEPT, connect_budget, error_text, preflight
from poller.wire import Reply as Reply
from poller.wire import Sender as Sender
from poller.wire import SendError as SendError

if TYPE_CHECKING:
    from poller.tls import TLSSettings

NO_CEILING = 1e9  # aiohttp rounds timeouts of 5 s or more up to whole seconds unless told not to
TLS_CLIENTS_KEPT = 256  # httpx clients for endpoints with their own TLS settings


# --- aiohttp ---------------------------------------------------------------------


def _connect_failure(exc: aiohttp.ClientConnectorError) -> str:
    """What went wrong connecting, in words a person reads (no ``ssl:default`` noise)."""
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):
        reason = f"TLS certificate refused: {exc.certificate_error}"
    else:
        reason = exc.os_error.strerror or str(exc.os_error) or type(exc.os_error).__name__
    return f"cannot connect to {exc.host}:{exc.port}: {reason}"[:500]


def _aiohttp_error(exc: BaseException, route: Route | None = None) -> SendError:
    """Classify an aiohttp failure by the phase it happened in."""
    if route is not None and isinstance(exc, aiohttp.ClientHttpProxyError):
        return route.refused(exc.status, exc.message)  # the tunnel was refused: not sent
    if route is not None and isinstance(exc, aiohttp.ClientProxyConnectionError):
        return route.unreachable(exc.os_error)
    if route is not None and isinstance(exc, aiohttp.ConnectionTimeoutError):
        return SendError(
            "ConnectTimeout",
            f"connect timeout: no tunnel through proxy {route.proxy.shown} within the budget",
            sent=False,
        )
    tls_reason = tls_failure(exc)
    if tls_reason is not None:  # the handshake was refused: the receiver never had it
        return SendError("TLSError", tls_reason, sent=False)
    message = error_text(exc)
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
    """Deliveries through aiohttp: one session, created lazily on the running loop.

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
        proxy: Proxy | None = None,
        resolve: Resolve = system_resolve,
    ) -> None:
        self._limit = limit
        self._allow_private = allow_private
        # With a proxy (poller/proxy.py) the sender resolves and checks targets itself.
        self._route = None if proxy is None else Route(proxy, resolve, allow_private=allow_private)
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
                socket_factory=self._socket_factory(),
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                auto_decompress=False,
                cookie_jar=aiohttp.DummyCookieJar(),
                skip_auto_headers=("User-Agent", "Content-Type", "Accept-Encoding"),
                trust_env=False,
            )
        return self._session

    def _socket_factory(self) -> Any:
        route = self._route
        if route is None:
            return None if self._allow_private else guarded_socket

        def to_the_proxy(addr_info: tuple[Any, ...]) -> socket.socket:
            family, type_, proto, _, sockaddr = addr_info
            route.check_socket(str(sockaddr[0]))
            return socket.socket(family=family, type=type_, proto=proto)

        return to_the_proxy

    async def _via_proxy(
        self, route: Route, url: str, headers: Mapping[str, str], timeout: float
    ) -> tuple[yarl.URL, dict[str, str], dict[str, Any]]:
        """The URL on its checked address, its headers, and the proxy arguments."""
        pinned = await route.pin(url, connect_budget(self._connect_timeout, timeout))
        sent = {**headers, "Host": pinned.host_header}
        via: dict[str, Any] = {"proxy": route.proxy.url}
        auth = route.proxy.authorization
        if pinned.server_hostname is not None:  # https: a tunnel, TLS for the name
            via["server_hostname"] = pinned.server_hostname
            if auth is not None:
                via["proxy_headers"] = {"Proxy-Authorization": auth}
        elif auth is not None:  # http: the proxy reads it off the request itself
            sent["Proxy-Authorization"] = auth
        return yarl.URL(pinned.url), sent, via

    async def request(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        body: bytes,
        timeout: float,
        tls: TLSSettings | None = None,
    ) -> Reply:
        limits = self._timeouts(timeout)
        response: aiohttp.ClientResponse | None = None
        data = bytearray()
        via: dict[str, Any] = {}
        try:
            target = self._target(method, url)  # a URL yarl refuses is a ValueError, as in aiohttp
            if self._route is not None:
                target, headers, via = await self._via_proxy(self._route, url, headers, timeout)
            async with asyncio.timeout(timeout):
                response = await self._get_session().request(
                    method,
                    target,
                    headers=headers,
                    data=body or None,
                    allow_redirects=False,
                    timeout=limits,
                    ssl=True if tls is None else tls.context(),  # the endpoint's (poller/tls.py)
                    **via,
                )
                while len(data) < READ_CAP:
                    chunk = await response.content.read(READ_CAP - len(data))
                    if not chunk:
                        break
                    data += chunk
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
            if response is None:
                raise _aiohttp_error(exc, self._route) from exc
            # The status arrived; a body cut short or slow does not change the answer.
        finally:
            if response is not None:
                if response.content.at_eof():
                    response.release()
                else:
                    response.close()  # drop, never drain, an unread (maybe endless) body
        assert response is not None
        if self._route is not None:
            proxy_said = self._route.answer_error(url, response.status)
            if proxy_said is not None:
                raise proxy_said
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
    route: Route | None = None,
) -> httpx.AsyncHTTPTransport:
    """httpx's own transport, its connection pool built on the guarded network backend
    (with a proxy: a proxy pool whose backend connects to the proxy alone)."""
    limits = httpx.Limits(max_connections=limit or None)
    transport = httpx.AsyncHTTPTransport(limits=limits, retries=0, verify=tls or True)
    if route is not None:
        auth = route.proxy.username
        transport._pool = httpcore.AsyncHTTPProxy(
            proxy_url=route.proxy.url,
            proxy_auth=None if auth is None else (auth, route.proxy.password or ""),
            network_backend=ProxyBackend(route),
            **_pool_settings(transport),
        )
    elif not allow_private:
        transport._pool = httpcore.AsyncConnectionPool(
            network_backend=GuardedBackend(resolve), **_pool_settings(transport)
        )
    return transport


def _pool_settings(transport: httpx.AsyncHTTPTransport) -> dict[str, Any]:
    """What httpx set up in its own pool, to build ours on another network backend (httpx
    takes none)."""
    pool = transport._pool
    if not isinstance(pool, httpcore.AsyncConnectionPool):  # pragma: no cover - httpx changed
        raise RuntimeError("httpx's transport no longer wraps an httpcore.AsyncConnectionPool")
    return {
        "ssl_context": pool._ssl_context,
        "max_connections": pool._max_connections,
        "max_keepalive_connections": pool._max_keepalive_connections,
        "keepalive_expiry": pool._keepalive_expiry,
        "http1": pool._http1,
        "http2": pool._http2,
        "retries": 0,
    }


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
        proxy: Proxy | None = None,
    ) -> None:
        self._connect_timeout = connect_timeout
        self._allow_private = allow_private
        self._limit, self._resolve = limit, resolve
        self._route = None if proxy is None else Route(proxy, resolve, allow_private=allow_private)
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
                limit=self._limit,
                allow_private=self._allow_private,
                resolve=self._resolve,
                tls=tls,
                route=self._route,
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
        tls: TLSSettings | None = None,
    ) -> Reply:
        preflight(url, self._allow_private)
        connect = connect_budget(self._connect_timeout, timeout)
        client = await self._client_for(None if tls is None else tls.context())
        target = url
        if self._route is not None:  # to the checked address, through the proxy
            pinned = await self._route.pin(url, connect)
            target, headers = pinned.url, {**headers, "Host": pinned.host_header}
            SNI.set(pinned.server_hostname)
            WROTE.set(False)
        try:
            request = client.build_request(
                method,
                target,
                headers=headers,
                content=body,
                timeout=httpx.Timeout(timeout, connect=connect, pool=connect),
            )
        except (httpx.InvalidURL, ValueError) as exc:  # nothing was sent: no connection yet
            raise SendError("InvalidURL", error_text(exc), sent=False) from exc
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
                raise self._failure(exc, request.url.scheme == "https") from exc
        finally:
            if response is not None:
                await response.aclose()
        assert response is not None
        if self._route is not None:
            proxy_said = self._route.answer_error(url, response.status_code)
            if proxy_said is not None:
                raise proxy_said
        return Reply(
            response.status_code, response.headers.get("retry-after"), bytes(data[:READ_CAP])
        )

    def _failure(self, exc: BaseException, https: bool) -> SendError:
        """What a failure before any answer was, by the phase it happened in."""
        if isinstance(exc, httpx.LocalProtocolError):  # h11 refused to write it: none sent
            # never its words: h11 quotes an offending header, which may be a credential
            said = "not sent: the request is not valid HTTP"
            return SendError("InvalidRequest", said, sent=False)
        tls_reason = tls_failure(exc)
        if tls_reason is None and isinstance(exc, httpx.ConnectError):
            tls_reason = HANDSHAKE_RESET if https and handshake_reset(exc) else None
        if tls_reason is not None:  # the handshake was refused: never had it
            return SendError("TLSError", tls_reason, sent=False)
        if self._route is not None:
            if isinstance(exc, httpx.ProxyError):  # the tunnel was refused
                status, _, message = str(exc).partition(" ")
                if status.isdigit():
                    return self._route.refused(int(status), message)
            if not WROTE.get() and not isinstance(exc, HTTPX_NOT_SENT):  # a hang on CONNECT
                return SendError(
                    "ProxyError",
                    f"proxy {self._route.proxy.shown} did not open the tunnel: {error_text(exc)}",
                    sent=False,
                )
        sent = not isinstance(exc, HTTPX_NOT_SENT)
        name = "ReadTimeout" if isinstance(exc, TimeoutError) else type(exc).__name__
        return SendError(name, error_text(exc), sent=sent)

    async def aclose(self) -> None:
        await self.client.aclose()
        for client in self._tls_clients.values():
            await client.aclose()
        self._tls_clients.clear()
