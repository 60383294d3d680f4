"""How deliveries reach the wire: one narrow seam, two implementations.

``Sender.request(method, url, headers, body, timeout)`` returns a
:class:`Reply` (status, headers, up to :data:`READ_CAP` bytes of body) or
raises :class:`SendError`, whose ``sent`` flag says whether the receiver may
have seen the request — the distinction SPEC §4 is built on:

* ``sent=False`` (*not sent*): DNS failure, connection refused, TLS failure,
  connect or pool timeout, a private target refused. Known not delivered.
* ``sent=True`` (*unknown*): no answer after the request went out — read
  timeout, connection reset or closed after sending, an unparseable answer.

:class:`AiohttpSender` is the default: measured on a 2-core machine, one
``poller run`` process reached 1,800 deliveries/s through httpx's API over an
aiohttp transport and well over 3,000 with aiohttp called directly (httpx's
request/response models cost more per message than signing, claiming and
completing together; see README "Performance"). :class:`HttpxSender` takes any
``httpx.AsyncClient`` — custom transports, proxies, ``httpx.MockTransport`` in
tests — and classifies httpx's exceptions the same way.

Either way the whole exchange is bounded by ``timeout`` (a slow-drip body
cannot hold a claim past its lease; a status already received still counts),
redirects are never followed, TLS is verified, and the body is read only up to
READ_CAP before the connection is dropped. Unless private targets are allowed,
the aiohttp sender refuses hosts that *resolve* to non-global addresses at
connect time (every resolved address is filtered, so DNS rebinding cannot slip
past an earlier check), and both refuse literal private IPs.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import aiohttp
import httpx
from aiohttp.abc import AbstractResolver, ResolveResult

from poller.endpoints import is_private_host

READ_CAP = 64 * 1024
PRIVATE_HINT = "set POLLER_ALLOW_PRIVATE_TARGETS=true to allow it"


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
        self, method: str, url: str, headers: Mapping[str, str], body: bytes, timeout: float
    ) -> Reply: ...

    async def aclose(self) -> None: ...


def _refuse_literal_private(url: str, allow_private: bool) -> None:
    if allow_private:
        return
    host = httpx.URL(url).host
    literal = host.lower() in ("localhost",) or host.lower().endswith(".localhost")
    try:
        ipaddress.ip_address(host.strip("[]"))
        literal = literal or is_private_host(host)
    except ValueError:
        pass
    if literal:
        raise SendError(
            "ConnectError", f"{host} is a private or loopback address; {PRIVATE_HINT}", sent=False
        )


# --- aiohttp ---------------------------------------------------------------------


class _GuardedResolver(AbstractResolver):
    """aiohttp's threaded resolver, minus every non-global address."""

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
                + PRIVATE_HINT
            )
        return allowed

    async def close(self) -> None:
        await self._inner.close()


class PrivateTargetRefused(OSError):
    """The target resolves to an address deliveries may not reach."""


def _aiohttp_error(exc: BaseException) -> SendError:
    """Classify an aiohttp failure by the phase it happened in."""
    message = f"{type(exc).__name__}: {exc}"[:500]
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return SendError("ConnectTimeout", message, sent=False)
    if isinstance(exc, aiohttp.ClientConnectorError | PrivateTargetRefused):
        return SendError("ConnectError", message, sent=False)
    if isinstance(exc, aiohttp.InvalidURL):
        return SendError("InvalidURL", message, sent=False)
    if isinstance(exc, aiohttp.SocketTimeoutError | TimeoutError):
        return SendError("ReadTimeout", message, sent=True)
    if isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientResponseError):
        # Closed after reading the request, or answered with garbage: maybe processed.
        return SendError("RemoteProtocolError", message, sent=True)
    return SendError("ReadError", message, sent=True)  # reset, payload errors, …


class AiohttpSender:
    """The default sender: one aiohttp session, created lazily on the running loop.

    ``limit`` bounds open connections (0: unbounded; the service bounds
    concurrency itself).
    """

    def __init__(self, *, limit: int = 0, allow_private: bool = False) -> None:
        self._limit = limit
        self._allow_private = allow_private
        self._session: aiohttp.ClientSession | None = None

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(
                limit=self._limit,
                limit_per_host=0,
                ttl_dns_cache=10,
                resolver=None if self._allow_private else _GuardedResolver(),
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                auto_decompress=False,
                cookie_jar=aiohttp.DummyCookieJar(),
                skip_auto_headers=("User-Agent", "Content-Type", "Accept-Encoding"),
            )
        return self._session

    async def request(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes, timeout: float
    ) -> Reply:
        _refuse_literal_private(url, self._allow_private)
        limits = aiohttp.ClientTimeout(total=None, connect=timeout, sock_read=timeout)
        response: aiohttp.ClientResponse | None = None
        data = bytearray()
        try:
            async with asyncio.timeout(timeout):
                response = await self._get_session().request(
                    method,
                    url,
                    headers=dict(headers),
                    data=body or None,
                    allow_redirects=False,
                    timeout=limits,
                )
                while len(data) < READ_CAP:
                    chunk = await response.content.read(READ_CAP - len(data))
                    if not chunk:
                        break
                    data += chunk
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
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


class HttpxSender:
    """Deliveries through any ``httpx.AsyncClient`` (transports, proxies, mocks)."""

    def __init__(self, client: httpx.AsyncClient, *, allow_private: bool = False) -> None:
        self.client = client
        self._allow_private = allow_private

    async def request(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes, timeout: float
    ) -> Reply:
        _refuse_literal_private(url, self._allow_private)
        request = self.client.build_request(
            method, url, headers=headers, content=body, timeout=httpx.Timeout(timeout)
        )
        response: httpx.Response | None = None
        data = bytearray()
        try:
            async with asyncio.timeout(timeout):
                response = await self.client.send(request, stream=True, follow_redirects=False)
                async for chunk in response.aiter_raw():
                    data += chunk
                    if len(data) >= READ_CAP:
                        break
        except (httpx.HTTPError, TimeoutError) as exc:
            if response is None:
                sent = not isinstance(exc, HTTPX_NOT_SENT)
                name = "ReadTimeout" if isinstance(exc, TimeoutError) else type(exc).__name__
                raise SendError(name, f"{name}: {exc}"[:500], sent=sent) from exc
        finally:
            if response is not None:
                await response.aclose()
        assert response is not None
        return Reply(
            response.status_code, response.headers.get("retry-after"), bytes(data[:READ_CAP])
        )

    async def aclose(self) -> None:
        await self.client.aclose()
