"""The Rust-backed sender: deliveries through pyreqwest (reqwest and hyper, on tokio).

It costs less CPU per request than aiohttp on the poller's loop (uvloop): the
figures are in docs/explanation/performance.md. It keeps every guarantee of the
other senders (poller/deliver/aiohttp_sender.py), by these means:

* **The guard at the connection seam.** reqwest resolves names itself and
  takes no socket hook, so the sender never lets it: the URL is parsed by
  pyreqwest's own parser (the one the request will use, so no two parsers
  disagree about the host), an IP host is checked as it is, and a name is
  resolved in Python, every answer checked, and the first allowed address
  *pinned* — the request goes through a client built with ``resolve(name,
  address)``, which connects to that address and nowhere else, while ``Host``,
  SNI and certificate checks keep the name. A pin lives :data:`PIN_TTL`
  seconds (aiohttp's DNS cache lives as long), then the name is resolved and
  checked again; a client per pinned address, so a changed answer gets a new
  one and requests in flight finish on the old. reqwest tries the pinned
  address only (aiohttp tries the next allowed answer too).
* No redirects, no proxy from the environment, no decompression.
* **Budgets.** The connect budget (poller/deliver/wire.py) is the client's connect
  timeout (TCP and TLS), after a name's resolution within the same budget;
  the whole exchange, body included, is the request's own timeout (reqwest's:
  an ``asyncio`` timeout around it cost a third of the sender's CPU). hyper
  says in which phase a failure happened: getting a connection is *not
  sent*; after it, *unknown*; a status already received counts.
* The answer is streamed with no read-ahead (``streamed_read_buffer_limit(0)``):
  its status counts as soon as its headers arrive. pyreqwest would otherwise
  read that much body first, and a body that drips slowly or never starts would
  cost the status; a limit of 1 still waited for the first byte, and costs as
  much. Reading ahead 64 KiB is cheaper, and declined for that reason
  (docs/explanation/performance.md). The body is read up to READ_CAP only,
  then the connection is dropped, never drained; an answer that says it has
  none is not read.
* **TLS.** An endpoint's client certificate is the client's identity
  (rustls). Three things reqwest cannot do are done by the aiohttp sender,
  for those requests only: a client key rustls cannot read (DSA, Ed448:
  OpenSSL can, and the endpoint checks accept them), trusting an endpoint's
  CA bundle *alone* (reqwest adds it to the system's roots, and a public CA
  that signed for the same name would be a second way in), and going through
  ``POLLER_PROXY_URL`` (reqwest asks the proxy for the name; the guard needs
  the checked address asked for, with TLS still verifying the name).

At interpreter exit, pyreqwest 0.15's runtime thread may still be dropping
the last connections' Python objects while the interpreter finalises, and
CPython 3.11 aborts the process for it (``PyGILState_Release``) — seen here in 3
of 30 runs exiting right after a burst of requests on pyreqwest's multithreaded
runtime, and in 1 of 72 on its default one, which the sender uses. So an exit within :data:`SETTLE`
seconds of :meth:`ReqwestSender.aclose` waits out the rest of them first (an
``atexit`` hook: a process that goes on pays nothing).
"""

from __future__ import annotations

import asyncio
import atexit
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from pyreqwest.client import Client, ClientBuilder
from pyreqwest.exceptions import (
    BuilderError,
    ConnectTimeoutError,
    DecodeError,
    PoolTimeoutError,
    PyreqwestError,
    ReadTimeoutError,
    RequestTimeoutError,
)
from pyreqwest.http import Url
from pyreqwest.request import RequestBuilder
from pyreqwest.response import Response

from poller.deliver.aiohttp_sender import AiohttpSender
from poller.deliver.wire import (
    READ_CAP,
    RETRY_AFTER_STATUSES,
    TARGETS_KEPT,
    Reply,
    SendError,
    connect_budget,
    preflight,
)
from poller.endpoints.netguard import Resolve, check_address, system_resolve
from poller.endpoints.tls import HANDSHAKE_RESET
from poller.errors import AddressRefused

if TYPE_CHECKING:
    from poller.endpoints.tls import TLSSettings
    from poller.settings import Proxy

PIN_TTL = 10.0  # seconds a name's checked address is used before it is resolved again
CLIENTS_KEPT = 1024  # pinned clients; the oldest is let go (requests in flight finish)
SETTLE = 0.2  # seconds pyreqwest's runtime is given after the clients close (see above)

# rustls's words for a failed handshake, and what a person reads for each.
_RUSTLS = (
    ("UnknownIssuer", "unknown CA (the certificate does not chain to a trusted root; "
     "give the endpoint its CA with --ca-bundle)"),
    ("CaUsedAsEndEntity", "unknown CA (a self-signed certificate; give the endpoint its CA "
     "with --ca-bundle)"),
    ("Expired", "the receiver's certificate has expired"),
    ("NotValidYet", "the receiver's certificate is not valid yet"),
    ("NotValidForName", "hostname mismatch (the certificate is not for this host)"),
    ("CertificateRequired", "client certificate required by the receiver"),
    ("BadCertificate", "client certificate refused by the receiver"),
    ("UnknownCA", "client certificate refused by the receiver (unknown CA)"),
    ("CertificateExpired", "client certificate refused by the receiver (expired)"),
    ("AccessDenied", "client certificate refused by the receiver (access denied)"),
    ("HandshakeFailure", "TLS handshake refused by the receiver"),
    ("ProtocolVersion", "no TLS version in common with the receiver"),
    ("InvalidContentType", "the receiver does not speak TLS on this port"),
    ("CorruptMessage", "the receiver does not speak TLS on this port"),
)  # fmt: skip


def _causes(exc: PyreqwestError) -> list[str]:
    details = getattr(exc, "details", None) or {}
    return [str(c.get("message", "")) for c in details.get("causes") or ()]


def _words(exc: PyreqwestError) -> str:
    """What went wrong, in one line of at most 500 characters: hyper's innermost causes,
    without the URL (it may hold a token) or hyper's phase names."""
    said = [
        c for c in _causes(exc)
        if not c.startswith(("error sending request for url", "client error ("))
    ]  # fmt: skip
    return ": ".join(dict.fromkeys(said or [exc.message]))[:500]


def _tls_reason(exc: PyreqwestError) -> str | None:
    text = " ".join(_causes(exc)).replace(" ", "")
    for word, reason in _RUSTLS:
        if word in text:
            return f"TLS: {reason}"
    if "handshakeeof" in text.lower() or "Connectionreset" in text:
        return HANDSHAKE_RESET  # the refusal's alert went unread
    if "tls" in text.lower() or "handshake" in text.lower() or "certificate" in text.lower():
        return f"TLS: {_words(exc)}"
    return None


@dataclass(frozen=True, slots=True)
class _Target:
    url: Url
    name: str  # "" for an IP host
    address: str  # the IP host, checked; "" for a name (pinned per request)
    port: int
    https: bool
    host: str


def _classified(exc: PyreqwestError, target: _Target) -> SendError:
    """A failure before any answer, by the phase it happened in: hyper says which
    (``client error (Connect)``: getting a connection, TCP and TLS; after it, the
    request was on its way)."""
    causes = _causes(exc)
    connecting = "client error (Connect)" in causes
    # pyreqwest calls any timeout a ConnectTimeoutError; hyper's phase tells them apart
    if isinstance(exc, PoolTimeoutError) or (isinstance(exc, ConnectTimeoutError) and connecting):
        return SendError(
            "ConnectTimeout", "connect timeout: no connection within the budget", sent=False
        )
    if isinstance(exc, BuilderError):
        return SendError("InvalidURL", _words(exc), sent=False)
    if connecting:
        reason = _tls_reason(exc) if target.https else None
        if reason is not None:  # the handshake was refused: the receiver never had it
            return SendError("TLSError", reason, sent=False)
        where = f"{target.host}:{target.port}"
        return SendError("ConnectError", f"cannot connect to {where}: {_words(exc)}", sent=False)
    if isinstance(exc, ReadTimeoutError | RequestTimeoutError):  # connected: maybe processed
        return SendError("ReadTimeout", "read timeout: no answer within the timeout", sent=True)
    if isinstance(exc, DecodeError) or any("closed before" in c for c in causes):
        # Closed after reading the request, or answered with garbage: maybe processed.
        return SendError("RemoteProtocolError", _words(exc), sent=True)
    return SendError("ReadError", _words(exc), sent=True)  # reset, write errors, …


def _retry_after(answer: Response) -> str | None:
    try:
        return answer.get_header("retry-after")
    except ValueError:  # not text (a hostile receiver): no usable Retry-After
        return None


def _bodiless(answer: Response, status: int) -> bool:
    """Whether the answer says it has no body (204, 304, ``Content-Length: 0``): then
    it is not read: pyreqwest's read of an empty body is still a round through its
    runtime, 4-13 % of a request's CPU against a receiver answering 204."""
    if status in (204, 304):
        return True
    try:
        return answer.get_header("content-length") == "0"
    except ValueError:  # pragma: no cover - hyper refuses a length that is not digits
        return False


class ReqwestSender:
    """Deliveries through pyreqwest, guarded and classified like the other senders.

    ``limit`` bounds connections per client (0: unbounded); ``resolve`` replaces
    the system resolver behind the guard (tests). ``proxy``: every request goes
    through the aiohttp sender (see the module's docstring).
    """

    def __init__(
        self,
        *,
        limit: int = 0,
        allow_private: bool = False,
        connect_timeout: float = 5.0,
        resolve: Resolve = system_resolve,
        proxy: Proxy | None = None,
    ) -> None:
        self._limit, self._allow_private = limit, allow_private
        self._connect_timeout, self._resolve, self._proxy = connect_timeout, resolve, proxy
        self._aiohttp: AiohttpSender | None = None
        self._targets: dict[str, _Target] = {}
        # (name or "", pinned address, timeout, identity) -> its client
        self._clients: dict[tuple[str, str, float, str | None], Client] = {}
        self._pins: dict[tuple[str, int], tuple[float, str]] = {}  # -> (expires, address)
        self._resolving: dict[tuple[str, int], asyncio.Future[str]] = {}
        self._foreign: set[TLSSettings] = set()  # client keys rustls cannot use

    def _fallback(self) -> AiohttpSender:
        if self._aiohttp is None:
            self._aiohttp = AiohttpSender(
                limit=self._limit,
                allow_private=self._allow_private,
                connect_timeout=self._connect_timeout,
                proxy=self._proxy,
                resolve=self._resolve,
            )
        return self._aiohttp

    def _target(self, method: str, url: str) -> _Target:
        """The URL as the client reads it, its IP host checked; once per URL."""
        target = self._targets.get(url)
        if target is None:
            preflight(url, self._allow_private)
            try:
                parsed = Url(url)
            except ValueError as exc:
                raise SendError(
                    "InvalidURL", f"the URL cannot be read: {exc}", sent=False
                ) from None
            host = parsed.host_str
            if parsed.scheme not in ("http", "https") or not host:
                raise SendError("InvalidURL", "the URL is not an http(s) URL", sent=False)
            name = parsed.domain or ""
            address = "" if name else host.strip("[]")  # an IP address, as the client reads it
            if address and not self._allow_private:
                try:
                    check_address(address)
                except AddressRefused as exc:
                    said = f"refused: {exc.strerror}"
                    raise SendError("ConnectError", said, sent=False) from None
            port = parsed.port_or_known_default or 0
            target = _Target(parsed, name, address, port, parsed.scheme == "https", host)
            if method == "POST":  # a lookup URL holds the message's key: used once
                if len(self._targets) >= TARGETS_KEPT:
                    self._targets.clear()
                self._targets[url] = target
        return target

    async def _address(self, name: str, port: int, budget: float) -> str:
        """``name``'s first allowed address, resolved at most every PIN_TTL seconds (one
        resolution at a time per name); SendError (not sent) when none is allowed."""
        key = (name, port)
        pinned = self._pins.get(key)
        if pinned is not None and pinned[0] > time.monotonic():
            return pinned[1]
        waiting = self._resolving.get(key)
        if waiting is None:
            waiting = self._resolving[key] = asyncio.ensure_future(self._pin(name, port))
            waiting.add_done_callback(lambda done: self._resolved(key, done))
        try:
            async with asyncio.timeout(budget):
                return await asyncio.shield(waiting)
        except TimeoutError:
            raise SendError(
                "ConnectTimeout", f"connect timeout: resolving {name} timed out", sent=False
            ) from None

    def _resolved(self, key: tuple[str, int], done: asyncio.Future[str]) -> None:
        self._resolving.pop(key, None)
        if not done.cancelled():
            done.exception()  # retrieved: every waiter may have run out of its budget

    async def _pin(self, name: str, port: int) -> str:
        try:
            addresses = await self._resolve(name, port)
        except OSError as exc:
            said = f"cannot resolve {name}: {exc}"[:500]
            raise SendError("ConnectError", said, sent=False) from None
        reasons = []
        for address in addresses:
            if not self._allow_private:
                try:
                    check_address(address)
                except AddressRefused as exc:
                    reasons.append(str(exc))
                    continue
            if len(self._pins) >= TARGETS_KEPT:
                self._pins.clear()
            self._pins[(name, port)] = (time.monotonic() + PIN_TTL, address)
            return address
        said = "; ".join(reasons) or f"{name} resolves to no address"
        raise SendError("ConnectError", f"refused: {said}", sent=False)

    def _aiohttp_only(self, tls: TLSSettings) -> bool:
        return bool(tls.ca_bundle) or tls in self._foreign

    def _client(
        self, name: str, address: str, timeout: float, tls: TLSSettings | None
    ) -> Client | None:
        """The client for a pinned address, a timeout (the whole exchange's: reqwest's
        own, set once here rather than on every request) and the endpoint's client
        certificate; None when rustls cannot use the certificate's key (DSA, Ed448: the
        checks accept what OpenSSL does), and the endpoint is remembered for the aiohttp
        sender."""
        identity = None
        if tls is not None and tls.client_cert and tls.client_key:
            identity = tls.client_key.rstrip() + "\n" + tls.client_cert
        key = (name, address, timeout, identity)
        client = self._clients.get(key)
        if client is None:
            budget = connect_budget(self._connect_timeout, timeout)
            builder = (
                ClientBuilder()
                .follow_redirects(False)
                .no_proxy()
                .gzip(False)
                .brotli(False)
                .zstd(False)
                .deflate(False)
                .referer(False)
                .timeout(timedelta(seconds=timeout))
                .connect_timeout(timedelta(seconds=budget))
                # waiting for a connection is part of getting one: bounded by the budget
                .pool_timeout(timedelta(seconds=budget))
                .max_connections(self._limit or None)
            )
            if name:
                builder = builder.resolve(name, address.split("%", 1)[0], 0)
            if identity is not None:
                builder = builder.identity_pem(identity.encode())
            try:
                client = builder.build()
            except BuilderError:
                if identity is None or tls is None:  # pragma: no cover - nothing else is ours
                    raise
                self._foreign.add(tls)
                return None
            if len(self._clients) >= CLIENTS_KEPT:
                del self._clients[next(iter(self._clients))]  # in-flight requests keep it
            self._clients[key] = client
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
        if self._proxy is not None or (tls is not None and self._aiohttp_only(tls)):
            return await self._fallback().request(method, url, headers, body, timeout, tls)
        target = self._target(method, url)
        began = time.monotonic()
        if target.address:
            address = target.address
        else:  # a name: resolved and checked within the connect budget
            budget = connect_budget(self._connect_timeout, timeout)
            address = await self._address(target.name, target.port, budget)
        client = self._client(target.name, address, timeout, tls)
        if client is None:  # a key rustls cannot use: OpenSSL can
            return await self._fallback().request(method, url, headers, body, timeout, tls)
        try:
            builder = client.request(method, target.url).headers(headers)
        except (PyreqwestError, ValueError) as exc:  # a header no client may send: none sent
            said = str(exc).partition(":")[0]  # never the value: a header may be a credential
            raise SendError("InvalidRequest", f"not sent: {said}"[:200], sent=False) from None
        spent = time.monotonic() - began
        if spent > 0.001:  # a name was resolved: the whole exchange still fits in timeout
            builder = builder.timeout(timedelta(seconds=max(timeout - spent, 0.001)))
        if body:
            builder = builder.body_bytes(body)
        return await self._exchange(builder.streamed_read_buffer_limit(0), target)

    @staticmethod
    async def _exchange(builder: RequestBuilder, target: _Target) -> Reply:
        status: int | None = None
        retry_after: str | None = None
        data = b""
        try:
            async with builder.build_streamed() as answer:
                status = answer.status
                if status in RETRY_AFTER_STATUSES:  # the only answers whose wait counts
                    retry_after = _retry_after(answer)
                if not _bodiless(answer, status):
                    # read(n) waits for n bytes or the end: one call reads a short body
                    data = bytes(await answer.body_reader.read(READ_CAP) or b"")
        except PyreqwestError as exc:  # its timeouts included (they are TimeoutErrors)
            if status is None:
                raise _classified(exc, target) from None
            # The status arrived; a body cut short or slow does not change the answer.
        return Reply(status, retry_after, data[:READ_CAP])

    async def aclose(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            await client.close()
        if self._aiohttp is not None:
            await self._aiohttp.aclose()
            self._aiohttp = None
        if clients:
            global _CLOSED_AT
            _CLOSED_AT = time.monotonic()


_CLOSED_AT = -SETTLE  # when a sender last closed its clients (monotonic seconds)


@atexit.register
def _settle() -> None:
    """At interpreter exit, right after a sender closed: give pyreqwest's runtime the
    rest of SETTLE to drop the connections (see the module's docstring)."""
    left = _CLOSED_AT + SETTLE - time.monotonic()
    if left > 0:
        time.sleep(left)
