"""Deliveries through an egress proxy (``POLLER_PROXY_URL``), so they leave from one address.

::

    POLLER_PROXY_URL=http://user:pass@egress.internal:3128

A receiver's firewall then allows the proxy's address alone. https targets go
through a ``CONNECT`` tunnel (TLS end to end: the proxy sees neither headers
nor body); http targets as absolute-form requests.

**The private-target guard still holds**, and more strictly than without a
proxy. The poller resolves the target itself, checks every address
(poller/endpoints/netguard.py), and asks the proxy for the *checked address* —
``CONNECT 203.0.113.7:443``, or ``POST http://203.0.113.7/hook`` — never for
the name, so the proxy resolves nothing and a DNS answer that changes between
the check and the connection (rebinding) changes nothing. The ``Host`` header
and TLS (SNI and certificate verification) still use the URL's name. The
poller's own sockets may then connect to the proxy's address only: that is the
one exemption from the guard, and nothing else is reachable.

**Classification.** A proxy that cannot be reached, refuses the tunnel (407,
502 …) or hangs before the tunnel is up is *not sent*, its error naming the
proxy (never its password). Over an absolute-form (http) request, a 407 is the
proxy's (not sent); a 502 or 504 may be the proxy's answer after the receiver
got the request, so it is *unknown* (looked up, never lost).

Proxy environment variables (``HTTP_PROXY``…) stay ignored: only this setting
routes deliveries.
"""

from __future__ import annotations

import asyncio
import contextvars
import ipaddress
import ssl
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpcore

from poller.endpoints.netguard import (
    GuardedBackend,
    Resolve,
    check_address,
    literal_address,
)
from poller.errors import AddressRefused, SendError
from poller.settings import Proxy
from poller.settings import netloc as host_port

UNKNOWN_VIA_PROXY = frozenset({502, 504})  # over absolute-form: the receiver may have it


@dataclass(frozen=True, slots=True)
class Pinned:
    """A target URL with its host replaced by the checked address."""

    url: str
    host_header: str  # the URL's own host[:port], for the Host header
    server_hostname: str | None  # https: the name TLS verifies (SNI)


async def pin(url: str, resolve: Resolve, *, allow_private: bool) -> Pinned:
    """Resolve ``url``'s host once and check every address; the URL on the first allowed
    one. AddressRefused (nothing sent, the proxy not asked) when none is allowed;
    OSError when the name does not resolve."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    https = parts.scheme == "https"
    port = parts.port or (443 if https else 80)
    literal = literal_address(host)
    addresses = [str(literal)] if literal is not None else await resolve(host, port)
    reasons = []
    for address in addresses:
        if not allow_private:
            try:
                check_address(address)
            except AddressRefused as exc:
                reasons.append(str(exc))
                continue
        ip = ipaddress.ip_address(address.split("%", 1)[0])
        default = port == (443 if https else 80)
        netloc = (
            (f"[{ip}]" if ip.version == 6 else str(ip)) if default else host_port(str(ip), port)
        )
        rest = parts.path or "/"
        if parts.query:
            rest += "?" + parts.query
        shown = host if default else host_port(host, port)
        if ":" in host and default:
            shown = f"[{host}]"
        return Pinned(f"{parts.scheme}://{netloc}{rest}", shown, host if https else None)
    raise AddressRefused("; ".join(reasons) or f"{host} resolves to no address")


# httpcore opens a CONNECT tunnel's TLS for the URL's host, which is the pinned
# address: the name TLS must verify travels beside the request (poller/deliver/httpx_sender.py).
SNI: contextvars.ContextVar[str | None] = contextvars.ContextVar("poller_proxy_sni", default=None)
# Whether this request's bytes went out toward the receiver (not a CONNECT): a failure
# before that — a proxy hanging on CONNECT, say — is not sent. Set in the sending task.
WROTE: contextvars.ContextVar[bool] = contextvars.ContextVar("poller_proxy_wrote", default=False)


class Route:
    """A sender's way through the proxy: targets pinned to checked addresses, sockets to
    the proxy's address only, the proxy's own answers told from the receiver's."""

    def __init__(self, proxy: Proxy, resolve: Resolve, *, allow_private: bool) -> None:
        self.proxy = proxy
        self._resolve = resolve
        self._allow_private = allow_private
        self.addresses: frozenset[str] | None = None  # the proxy's, resolved on first use

    async def pin(self, url: str, budget: float) -> Pinned:
        """The URL on its checked address, within the connect budget; SendError (not sent,
        the proxy not asked) when it is refused, does not resolve or takes too long."""
        try:
            async with asyncio.timeout(budget):
                if self.addresses is None:
                    found = await self._resolve(self.proxy.host, self.proxy.port)
                    self.addresses = frozenset(a.split("%", 1)[0] for a in found)
                return await pin(url, self._resolve, allow_private=self._allow_private)
        except AddressRefused as exc:
            raise SendError("ConnectError", f"refused: {exc.strerror}", sent=False) from None
        except TimeoutError:
            raise SendError("ConnectTimeout", "resolving timed out", sent=False) from None
        except OSError as exc:
            raise SendError("ConnectError", f"cannot resolve: {exc}"[:500], sent=False) from None

    def check_socket(self, address: str) -> None:
        """AddressRefused unless a socket goes to the proxy: the guard's one exemption."""
        if self.addresses is None or address.split("%", 1)[0] not in self.addresses:
            raise AddressRefused(
                f"refused to connect to {address}: with POLLER_PROXY_URL set, deliveries "
                "connect only to the proxy"
            )

    def refused(self, status: int, message: str = "") -> SendError:
        """The proxy refused to open the tunnel (CONNECT answered ``status``): not sent."""
        said = f" {message}" if message else ""
        hint = ": check POLLER_PROXY_URL's credentials" if status == 407 else ""
        return SendError(
            "ProxyError", f"proxy {self.proxy.shown} answered {status}{said}{hint}", sent=False
        )

    def answer_error(self, url: str, status: int) -> SendError | None:
        """For an http target (absolute-form): a 407 is the proxy's (not sent); a 502 or
        504 may be the proxy's after the receiver got the request (unknown)."""
        if url.startswith("https:"):
            return None  # inside the tunnel every answer is the receiver's
        if status == 407:
            return self.refused(407)
        if status in UNKNOWN_VIA_PROXY:
            return SendError(
                "ProxyError",
                f"proxy {self.proxy.shown} answered {status}: the receiver may have the request",
                sent=True,
            )
        return None

    def unreachable(self, exc: BaseException) -> SendError:
        """The proxy could not be reached: not sent."""
        reason = getattr(exc, "strerror", None) or type(exc).__name__
        return SendError(
            "ProxyError", f"cannot connect to proxy {self.proxy.shown}: {reason}", sent=False
        )


class ProxyBackend(GuardedBackend):
    """httpcore's network backend with a proxy: it connects to the proxy's address alone,
    and opens a tunnel's TLS for the target's name (:data:`SNI`), not its pinned address."""

    def __init__(self, route: Route, inner: httpcore.AsyncNetworkBackend | None = None) -> None:
        super().__init__(route._resolve, inner)
        self._route = route

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        try:
            for address in await self._resolve(host, port):
                self._route.check_socket(address)
                stream = await self._inner.connect_tcp(
                    address, port, timeout, local_address, socket_options
                )
                return _NamedTLS(stream)
        except AddressRefused as exc:
            raise httpcore.ConnectError(str(exc)) from exc
        except httpcore.ConnectTimeout as exc:
            raise httpcore.ConnectTimeout(
                f"connecting to proxy {self._route.proxy.shown} timed out"
            ) from exc
        except httpcore.ConnectError as exc:
            raise httpcore.ConnectError(
                f"cannot connect to proxy {self._route.proxy.shown}: {exc}"
            ) from exc
        except OSError as exc:
            reason = exc.strerror or type(exc).__name__
            raise httpcore.ConnectError(
                f"cannot connect to proxy {self._route.proxy.shown}: {reason}"
            ) from exc
        raise httpcore.ConnectError(f"proxy {host} resolves to no address")


class _NamedTLS(httpcore.AsyncNetworkStream):
    """A proxy connection whose tunnel TLS verifies the target's name (:data:`SNI`)."""

    def __init__(self, inner: httpcore.AsyncNetworkStream) -> None:
        self._inner = inner

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return await self._inner.read(max_bytes, timeout)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if buffer and not buffer.startswith(b"CONNECT "):  # absolute-form: toward the receiver
            WROTE.set(True)
        await self._inner.write(buffer, timeout)

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.AsyncNetworkStream:
        name = SNI.get() or server_hostname
        return _Tunnel(await self._inner.start_tls(ssl_context, name, timeout))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _Tunnel(_NamedTLS):
    """The TLS stream inside a tunnel: every write goes to the receiver."""

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if buffer:
            WROTE.set(True)
        await self._inner.write(buffer, timeout)
