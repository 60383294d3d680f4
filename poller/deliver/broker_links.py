"""Connections to brokers: one a destination, opened through the guard within the connect
budget, kept and reused, dropped when it fails and opened again by the next send.

Every broker sender (poller/deliver/nats_sender.py, amqp_sender.py, redis_sender.py)
keeps its clients here. What it shares with the HTTP senders (poller/deliver/wire.py):

* **The guard.** The broker's host is resolved once per connection and every address
  checked (poller/endpoints/netguard.py); the client connects to the address that was
  checked, never a second resolution. Over TLS the client connects by the host's name,
  whose certificate it verifies: an answer rebound to another address fails the
  handshake there.
* **The connect budget.** Resolving and connecting (and, for AMQP, opening a channel)
  must end within ``min(connect_timeout, timeout / 2)``; a failure or timeout there is
  *not sent*, as for HTTP.
* **Bounded reconnects.** A client's own reconnect loop is off: a connection that fails
  is dropped, and the next send to the destination opens one more, once, within its
  connect budget. Every connection opened or failed is counted
  (``webhook_poller_broker_connections_total{kind,result}``), so a flapping broker shows.
  (redis-py keeps a pool and replaces a connection it finds closed before it sends on
  it — never a resend; the Redis sender counts each connection its pool opens.)

The connections kept are capped (:data:`LINKS_KEPT`); the oldest unused ones close first.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Generic, TypeVar

from poller.deliver.wire import TARGETS_KEPT, Reply, connect_budget, error_text
from poller.endpoints.netguard import Resolve, refusal, system_resolve
from poller.errors import SendError
from poller.observe.metrics import BROKER_CONNECTIONS
from poller.rules import destinations
from poller.rules.destinations import Destination

if TYPE_CHECKING:
    from poller.endpoints.tls import TLSSettings

C = TypeVar("C")
Open = Callable[[Destination, str, float, "TLSSettings | None"], Awaitable[C]]
"""Open a client to the destination at the checked address within the seconds given, with
the endpoint's TLS settings (poller/endpoints/tls.py) when it has its own."""
Key = tuple[str, "TLSSettings | None"]
Close = Callable[[C], Awaitable[None]]

LINKS_KEPT = 256


@functools.lru_cache(maxsize=TARGETS_KEPT)
def destination_of(url: str) -> Destination:
    """A broker URL read once (poller/rules/destinations.py); SendError if it cannot be."""
    try:
        return destinations.parse(url)
    except ValueError as exc:
        raise SendError("InvalidURL", error_text(exc), sent=False) from None


class Links(Generic[C]):
    """The open clients of one broker kind, a destination URL each."""

    def __init__(
        self,
        kind: str,
        open_: Open[C],
        close: Close[C],
        *,
        allow_private: bool,
        resolve: Resolve = system_resolve,
        counts_itself: bool = False,
    ) -> None:
        self.kind = kind
        self._counted = not counts_itself  # a client that opens connections of its own
        self._open = open_
        self._close = close
        self._allow_private = allow_private
        self._resolve = resolve
        self._clients: OrderedDict[Key, C] = OrderedDict()
        self._opening: dict[Key, asyncio.Future[C]] = {}

    async def get(
        self, url: str, destination: Destination, budget: float, tls: TLSSettings | None
    ) -> C:
        """The client for ``url``: the kept one, else one opened within ``budget`` seconds
        (SendError ``sent=False`` when it cannot be)."""
        client = self.kept(url, tls)
        if client is not None:
            return client
        key = (url, tls)
        pending = self._opening.get(key)
        if pending is None:  # one connect a destination at a time; the others wait on it
            pending = asyncio.ensure_future(self._connect(destination, budget, tls))
            self._opening[key] = pending
            pending.add_done_callback(lambda _: self._opening.pop(key, None))
        client = await asyncio.shield(pending)
        if key not in self._clients:
            self._clients[key] = client
            await self._trim()
        return self._clients[key]

    def kept(self, url: str, tls: TLSSettings | None) -> C | None:
        """The client kept for ``url``, if there is one (without a coroutine: every
        publish asks)."""
        key = (url, tls)
        client = self._clients.get(key)
        if client is not None:
            self._clients.move_to_end(key)
        return client

    async def drop(self, url: str, tls: TLSSettings | None, client: C) -> None:
        """Forget a client that failed (the next send opens another) and close it."""
        if self._clients.get((url, tls)) is client:
            del self._clients[(url, tls)]
        await self._quietly_close(client)

    async def aclose(self) -> None:
        clients, self._clients = list(self._clients.values()), OrderedDict()
        for client in clients:
            await self._quietly_close(client)

    async def _connect(self, destination: Destination, budget: float, tls: TLSSettings | None) -> C:
        try:
            async with asyncio.timeout(budget):
                address = await self._checked_address(destination)
                client = await self._open(destination, address, budget, tls)
        except SendError:
            BROKER_CONNECTIONS.labels(self.kind, "failed").inc()
            raise
        except TimeoutError:
            BROKER_CONNECTIONS.labels(self.kind, "failed").inc()
            raise SendError(
                "ConnectTimeout",
                f"connect timeout: no connection to {self.kind} broker "
                f"{destination.host}:{destination.port} within {budget:g}s",
                sent=False,
            ) from None
        except Exception as exc:  # every client's connect errors: known not sent
            BROKER_CONNECTIONS.labels(self.kind, "failed").inc()
            raise SendError(
                "ConnectError",
                f"cannot connect to {self.kind} broker {destination.host}:{destination.port}: "
                f"{error_text(exc)}",
                sent=False,
            ) from exc
        if self._counted:
            BROKER_CONNECTIONS.labels(self.kind, "opened").inc()
        return client

    async def _checked_address(self, destination: Destination) -> str:
        """The address to connect to: the host's, resolved once and checked."""
        try:
            addresses = await self._resolve(destination.host, destination.port)
        except OSError as exc:
            raise SendError(
                "ConnectError", f"cannot resolve {destination.host}: {error_text(exc)}", sent=False
            ) from exc
        if self._allow_private:
            return addresses[0] if addresses else destination.host
        for address in addresses:
            reason = refusal(ipaddress.ip_address(address.partition("%")[0]))
            if reason is not None:
                raise SendError("ConnectError", f"refused: {reason}", sent=False)
        if not addresses:
            raise SendError("ConnectError", f"{destination.host} has no address", sent=False)
        return addresses[0]

    async def _trim(self) -> None:
        while len(self._clients) > LINKS_KEPT:
            _, oldest = self._clients.popitem(last=False)
            await self._quietly_close(oldest)

    async def _quietly_close(self, client: C) -> None:
        try:
            async with asyncio.timeout(5):
                await self._close(client)
        except Exception:
            pass


class LinkLost(Exception):
    """Raised by a publish whose connection is no use any more: the sender drops it and
    raises the :class:`SendError` it carries."""

    def __init__(self, error: SendError) -> None:
        super().__init__(str(error))
        self.error = error


class BrokerSender(Generic[C]):
    """The seam's ``request`` (poller/deliver/wire.py) for a broker: the destination read,
    its connection got or opened within the connect budget, one publish with what is
    left of the timeout. A broker's sender gives :meth:`_open`, :meth:`_close`,
    :meth:`_usable` and :meth:`_publish` (which raises :class:`LinkLost` to have the
    connection dropped)."""

    kind = ""
    counts_itself = False  # its client opens connections of its own and counts them

    def __init__(
        self,
        *,
        allow_private: bool = False,
        connect_timeout: float = 5.0,
        resolve: Resolve = system_resolve,
        **_: object,
    ) -> None:
        self._connect_timeout = connect_timeout
        self._links: Links[C] = Links(
            self.kind, self._open, self._close, allow_private=allow_private, resolve=resolve,
            counts_itself=self.counts_itself,
        )  # fmt: skip

    async def request(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        body: bytes,
        timeout: float,
        tls: TLSSettings | None = None,
    ) -> Reply:
        if method != "POST":  # a broker answers no lookup: its resend is the lookup
            raise SendError("NotSupported", f"a {self.kind} destination has no lookup URL",
                            sent=False)  # fmt: skip
        destination = destination_of(url)
        began = time.monotonic()
        budget = connect_budget(self._connect_timeout, timeout)
        client = self._links.kept(url, tls)
        if client is None:
            client = await self._links.get(url, destination, budget, tls)
        if not self._usable(client):  # closed since it was kept: open another, once
            await self._links.drop(url, tls, client)
            client = await self._links.get(url, destination, budget, tls)
        left = max(timeout - (time.monotonic() - began), 0.001)
        try:
            return await self._publish(client, destination, headers, body, left, timeout)
        except LinkLost as lost:
            await self._links.drop(url, tls, client)
            raise lost.error from None

    async def aclose(self) -> None:
        await self._links.aclose()

    async def _open(
        self, destination: Destination, address: str, budget: float, tls: TLSSettings | None
    ) -> C:
        raise NotImplementedError

    async def _close(self, client: C) -> None:
        raise NotImplementedError

    def _usable(self, client: C) -> bool:
        return True

    async def _publish(
        self,
        client: C,
        destination: Destination,
        headers: Mapping[str, str],
        body: bytes,
        left: float,
        timeout: float,
    ) -> Reply:
        """Publish once within ``left`` seconds (``timeout``: the whole, for the words)."""
        raise NotImplementedError
