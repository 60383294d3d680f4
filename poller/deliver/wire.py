"""What every sender shares: the seam, its answer, its one error, and the budgets.

``Sender.request(method, url, headers, body, timeout, tls)`` (``tls``: the
endpoint's own, poller/endpoints/tls.py) returns a
:class:`Reply` (status, Retry-After, up to :data:`READ_CAP` bytes of body) or
raises :class:`SendError`, whose ``sent`` flag says whether the receiver may
have seen the request — the distinction the delivery contract is built on
(docs/reference/delivery-contract.md):

* ``sent=False`` (*not sent*): DNS failure, connection refused, TLS failure,
  connect or pool timeout, an invalid URL, a private target refused, an egress
  proxy that could not be reached or refused the tunnel. Known not delivered.
* ``sent=True`` (*unknown*): no answer after the connection was made — read
  timeout, connection reset or closed after sending, an unparseable answer.

**Two budgets.** ``timeout`` bounds the whole exchange (a slow-drip body
cannot hold a claim past its lease; a status already received still counts).
Inside it, the *connect budget* — ``min(connect_timeout, timeout / 2)`` —
bounds getting a connection (pool wait, DNS, TCP, proxy tunnel, TLS) and is
enforced by the client itself, so it always fires first: a failure within it
is *not sent*, and running out of the whole budget after it is *unknown*. A
blackholed host is therefore a connect timeout, never a "maybe delivered".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol
from urllib.parse import urlsplit

from poller.endpoints.netguard import host_refusal
from poller.errors import SendError as SendError
from poller.rules.outcomes import record

if TYPE_CHECKING:
    from poller.endpoints.tls import TLSSettings

READ_CAP = 64 * 1024
RETRY_AFTER_STATUSES = frozenset({429, 503})
"""The answers whose ``Retry-After`` pauses the endpoint (poller/rules/health.py); a sender may
leave it unread on any other."""


@record  # frozen to the type checker; built per request, so not frozen at run time
class Reply:
    status: int
    retry_after: str | None
    body: bytes


class Sender(Protocol):
    async def request(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        body: bytes,
        timeout: float,
        tls: TLSSettings | None = None,
    ) -> Reply: ...

    async def aclose(self) -> None: ...


TARGETS_KEPT = 10_000  # parsed URLs and timeouts a sender keeps


def connect_budget(connect_timeout: float, timeout: float) -> float:
    """The share of ``timeout`` allowed for getting a connection (it must end first)."""
    return min(connect_timeout, timeout / 2)


def error_text(exc: BaseException) -> str:
    """An exception as one line of at most 500 characters, its type first."""
    return f"{type(exc).__name__}: {exc}"[:500]


def preflight(url: str, allow_private: bool) -> None:
    """Refuse a URL before any I/O: unparseable, or a private literal host / ``localhost``.

    Only a courtesy (a clear error, no DNS query): the guard at connect time is
    what holds, for every spelling and every DNS answer.
    """
    try:
        host = urlsplit(url).hostname
    except ValueError as exc:
        raise SendError("InvalidURL", error_text(exc), sent=False) from exc
    if not host:
        raise SendError("InvalidURL", f"{url!r} has no host", sent=False)
    if not allow_private:
        reason = host_refusal(host)
        if reason is not None:
            raise SendError("ConnectError", f"refused: {reason}", sent=False)
