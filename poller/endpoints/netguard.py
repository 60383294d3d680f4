"""The private-target guard: which addresses a delivery may connect to, checked at connect.

Unless ``POLLER_ALLOW_PRIVATE_TARGETS`` is on, a delivery or lookup may only
connect to a *global* unicast address. The check runs on the address a socket
is about to connect to — after every resolution, for every HTTP client — so
no spelling of a host and no DNS answer can get past it:

* **aiohttp** — ``TCPConnector(socket_factory=…)``: aiohttp hands every
  address it is about to connect to (resolved or literal) to
  :func:`guarded_socket` first.
* **httpx** — :class:`GuardedBackend`, an httpcore network backend: it
  resolves the host once, refuses every non-global answer, and connects to
  the address it checked (no second resolution, so DNS rebinding cannot
  swap it). TLS still verifies the certificate against the URL's host name.

Refused (:func:`refusal`): loopback, private, link-local, shared (CGNAT),
unspecified, multicast, reserved, documentation and benchmark ranges, site-local
IPv6, and IPv6 forms that embed an IPv4 address (IPv4-mapped
``::ffff:127.0.0.1``, IPv4-compatible, 6to4 ``2002::/16``, NAT64
``64:ff9b::/96`` and ``64:ff9b:1::/48``) are judged by the address they embed;
IPv4-compatible ``::a.b.c.d`` and Teredo are refused outright.

Numeric hosts have many spellings: ``2130706433``, ``0177.0.0.1``,
``0x7f.1``, ``127.1`` all mean 127.0.0.1 to ``inet_aton`` and to browsers.
:func:`parse_ipv4` reads them the way the WHATWG URL standard does, so
``poller endpoints add`` stores the canonical dotted quad (or refuses a
numeric host that is not a valid address) and a pre-flight check can name the
address in its error.

Environment proxies (``HTTP_PROXY``…) are never used: a proxy would connect
on our behalf to an address this guard never sees.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import httpcore

from poller.errors import AddressRefused, InvalidHost

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolve = Callable[[str, int], Awaitable[list[str]]]

_NAT64 = (ipaddress.IPv6Network("64:ff9b::/96"), ipaddress.IPv6Network("64:ff9b:1::/48"))
_SHARED = ipaddress.IPv4Network("100.64.0.0/10")


# --- addresses ----------------------------------------------------------------------


def refusal(address: IPAddress) -> str | None:
    """Why deliveries may not connect to ``address``; None when it is a global unicast one."""
    if isinstance(address, ipaddress.IPv6Address):
        embedded = _embedded_ipv4(address)
        if embedded is not None:
            inner = refusal(embedded)
            return f"{address} embeds {embedded}: {inner}" if inner else None
        if address.is_site_local:
            return f"{address} is a site-local address"
    for flag, what in (
        ("is_loopback", "a loopback"),
        ("is_link_local", "a link-local"),
        ("is_unspecified", "an unspecified"),
        ("is_multicast", "a multicast"),
        ("is_reserved", "a reserved"),
        ("is_private", "a private"),
    ):
        if getattr(address, flag):
            return f"{address} is {what} address"
    if isinstance(address, ipaddress.IPv4Address) and address in _SHARED:
        return f"{address} is a shared (carrier-grade NAT) address"
    if not address.is_global:
        return f"{address} is not a global address"
    return None


def _embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if any(address in net for net in _NAT64):
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None  # IPv4-compatible ::a.b.c.d is reserved (::/8), Teredo private (2001::/23)


def check_address(host: str) -> None:
    """Raise AddressRefused unless ``host`` (an IP address string) is global."""
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])  # drop an IPv6 zone id
    except ValueError:
        raise AddressRefused(f"{host!r} is not an IP address") from None
    reason = refusal(address)
    if reason is not None:
        raise AddressRefused(f"refused to connect to {reason}")


# --- host spellings ---------------------------------------------------------------


def _ipv4_number(part: str) -> int | None:
    """One part of a numeric host as the WHATWG URL standard reads it (hex, octal, decimal)."""
    if not part:
        return None
    base = 10
    if part[:2].lower() == "0x":
        base, part = 16, part[2:]
        if not part:
            return 0
    elif len(part) > 1 and part[0] == "0":
        base, part = 8, part[1:]
    try:
        return int(part, base) if part.isascii() and part.isalnum() else None
    except ValueError:
        return None


def parse_ipv4(host: str) -> ipaddress.IPv4Address | None:
    """A numeric IPv4 host in any spelling, or None when the host is a name.

    Raises InvalidHost for a host that ends in a number but is no valid
    address (``1.2.3.256``, ``1.2.3.4.5``), as a browser would refuse it.
    """
    parts = host.split(".")
    if parts[-1] == "" and len(parts) > 1:
        parts.pop()  # one trailing dot is allowed
    last = parts[-1]
    if not last or not (last.isascii() and (last.isdigit() or last[:2].lower() == "0x")):
        return None  # a name (its last label is not a number)
    numbers = [_ipv4_number(p) for p in parts]
    if len(parts) > 4 or any(n is None for n in numbers):
        raise InvalidHost(f"{host!r} is not a valid IPv4 address")
    values = [n for n in numbers if n is not None]
    if any(n > 255 for n in values[:-1]) or values[-1] >= 256 ** (5 - len(values)):
        raise InvalidHost(f"{host!r} is not a valid IPv4 address")
    number = values[-1]
    for i, n in enumerate(values[:-1]):
        number += n * 256 ** (3 - i)
    return ipaddress.IPv4Address(number)


def literal_address(host: str) -> IPAddress | None:
    """The address a literal host names (IPv6 in brackets or not, any IPv4 spelling), else None."""
    bare = host.strip("[]").split("%", 1)[0]
    if ":" in bare:
        try:
            return ipaddress.IPv6Address(bare)
        except ValueError:
            raise InvalidHost(f"{host!r} is not a valid IPv6 address") from None
    return parse_ipv4(bare)


def is_local_name(host: str) -> bool:
    host = host.lower().rstrip(".")
    return host == "localhost" or host.endswith(".localhost")


def host_refusal(host: str) -> str | None:
    """Why a URL's host is refused before any connection (a literal or ``localhost``)."""
    if is_local_name(host):
        return f"{host} is a loopback name"
    try:
        address = literal_address(host)
    except InvalidHost as exc:
        return str(exc)
    return None if address is None else refusal(address)


# --- the connection seams -------------------------------------------------------------


def guarded_socket(addr_info: tuple[Any, ...]) -> socket.socket:
    """aiohttp's ``socket_factory``: a socket, once the address it will connect to is checked."""
    family, type_, proto, _, sockaddr = addr_info
    check_address(str(sockaddr[0]))
    return socket.socket(family=family, type=type_, proto=proto)


async def system_resolve(host: str, port: int) -> list[str]:
    """Every address the system resolver gives for ``host`` (A and AAAA)."""
    infos = await asyncio.get_running_loop().getaddrinfo(
        host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
    )
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


class GuardedBackend(httpcore.AsyncNetworkBackend):
    """httpcore's network backend, guarded: resolve once, check, connect to what was checked."""

    def __init__(
        self, resolve: Resolve = system_resolve, inner: httpcore.AsyncNetworkBackend | None = None
    ) -> None:
        self._resolve = resolve
        self._inner = inner or httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        """One connect budget (``timeout``) for resolving and every address tried: a
        blackholed host with an A and an AAAA record must not take twice the budget
        and overrun the exchange's timeout."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        try:
            async with asyncio.timeout_at(deadline):
                addresses = await self._resolve(host, port)
        except TimeoutError:
            raise httpcore.ConnectTimeout(f"resolving {host} timed out") from None
        except OSError as exc:
            raise httpcore.ConnectError(f"cannot resolve {host}: {exc}") from exc
        allowed, reasons = [], []
        for address in addresses:
            try:
                check_address(address)
                allowed.append(address)
            except AddressRefused as exc:
                reasons.append(str(exc))
        if not allowed:
            raise httpcore.ConnectError(
                "; ".join(reasons) or f"{host} resolves to no address"
            ) from None
        error: Exception | None = None
        for i, address in enumerate(allowed):
            share = None  # each address its share of what is left: the last gets the rest
            if deadline is not None:
                left = deadline - loop.time()
                if left <= 0:
                    raise httpcore.ConnectTimeout(f"connecting to {host} timed out") from error
                share = left / (len(allowed) - i)
            try:
                return await self._inner.connect_tcp(
                    address, port, share, local_address, socket_options
                )
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                error = exc
        assert error is not None
        raise error

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("deliveries never connect to unix sockets")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)
