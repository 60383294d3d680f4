"""The aiohttp sender (``POLLER_HTTP_CLIENT=aiohttp``), guarded and classified as every
sender is: the seam, its answer and its error are poller/deliver/wire.py's, and
poller/deliver/sending.py builds the sender the settings ask for.

The aiohttp and httpx senders refuse private targets at the connection seam
(poller/endpoints/netguard.py) unless they are allowed, never follow redirects, verify
TLS (with an endpoint's own client certificate and CA, poller/endpoints/tls.py), ignore proxy
environment variables — ``POLLER_PROXY_URL`` alone routes them through a
proxy, to the address they checked (poller/deliver/proxy.py) — and read the body only
up to READ_CAP before dropping the connection.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import aiohttp
import yarl

from poller.deliver.proxy import Route
from poller.deliver.wire import READ_CAP as READ_CAP
from poller.deliver.wire import TARGETS_KEPT, connect_budget, error_text, preflight
from poller.deliver.wire import Reply as Reply
from poller.endpoints.netguard import Resolve, guarded_socket, system_resolve
from poller.endpoints.tls import HANDSHAKE_RESET, handshake_reset, tls_failure
from poller.errors import SendError
from poller.settings import Proxy

if TYPE_CHECKING:
    from poller.endpoints.tls import TLSSettings

NO_CEILING = 1e9  # aiohttp rounds timeouts of 5 s or more up to whole seconds unless told not to


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
        # With a proxy (poller/deliver/proxy.py) the sender resolves and checks targets itself.
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
                    ssl=True
                    if tls is None
                    else tls.context(),  # the endpoint's (poller/endpoints/tls.py)
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
