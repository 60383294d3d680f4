"""Deliveries through httpx (``POLLER_HTTP_CLIENT=httpx``), guarded and classified as every
sender is (poller/deliver/wire.py; poller/deliver/aiohttp_sender.py says how). ``transport`` is for
tests (``httpx.MockTransport``) and owns its own connections."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import httpcore
import httpx

from poller.deliver.proxy import SNI, WROTE, ProxyBackend, Route
from poller.deliver.wire import READ_CAP, Reply, connect_budget, error_text, preflight
from poller.endpoints.netguard import GuardedBackend, Resolve, system_resolve
from poller.endpoints.tls import HANDSHAKE_RESET, handshake_reset, tls_failure
from poller.errors import SendError
from poller.settings import Proxy

if TYPE_CHECKING:
    from poller.endpoints.tls import TLSSettings

TLS_CLIENTS_KEPT = 256  # httpx clients for endpoints with their own TLS settings


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
        # (poller/endpoints/tls.py caches contexts, so one per distinct setting), oldest closed.
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
