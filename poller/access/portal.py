"""Tenant portal links and sessions: a page where one tenant's people manage that
tenant's endpoints and see their deliveries (served by ``poller serve`` under
``/portal``: poller/web/portal/pages.py).

**A link** (:func:`portal_link`, ``poller portal-link``) is the application's way in
for its customer: it signs ``(tenant, expiry, nonce)`` with ``POLLER_PORTAL_KEY``
(HMAC-SHA256) and is valid until it expires (default 15 minutes; at most a day).
It opens the portal **once**: its nonce is written when it is opened
(:func:`spend_link`, ``poller_portal_links_used``), and the same link again is
refused, so one copied from a history, a log or a proxy is worth nothing, and
one that leaked before it was opened is found out when its user's own is
refused. The application makes one each time its signed-in user opens
"Webhooks". Opening it starts a session and redirects to the portal, so the
link leaves the address bar.

**A session** is a cookie signed the same way, for one tenant, for
:data:`SESSION` (an hour), never longer than a day after its link was made.
Everything in the portal is that tenant's: another tenant's endpoint or message
is not found. Its CSRF token is a MAC of the session's nonce, so a form of one
session does not work in another.

**The key** is ``POLLER_PORTAL_KEY`` (32+ characters); the same on every process
that makes links or serves the portal. On the embedded server without one, a key
kept in its data folder (``portal-key``, mode 0600), as the dashboard keeps its
token. A new key ends every link and session.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from urllib.parse import quote

from sqlalchemy import Connection

from poller.endpoints.subscriptions import check_tenant
from poller.errors import ConfigurationError, InvalidInput
from poller.rules.signing import same_text
from poller.settings import Settings
from poller.store import queries

KEY_FILE = "portal-key"
SESSION = timedelta(hours=1)
LONGEST_LINK = timedelta(days=1)
DEFAULT_LINK = timedelta(minutes=15)
USED_KEPT = timedelta(hours=1)  # an opened link's nonce outlives its expiry (clocks differ)
USED = "this portal link was opened already: ask for a new one"


@dataclass(frozen=True, slots=True)
class Link:
    """A link whose signature and expiry were checked: whose portal, until when, its id."""

    tenant: str
    expires: float  # seconds since the epoch
    nonce: str


@dataclass(frozen=True, slots=True)
class Session:
    """Whose portal this is, until when, and what its forms must carry."""

    tenant: str
    expires: float  # seconds since the epoch
    nonce: str

    def csrf(self, key: bytes) -> str:
        return _mac(key, f"csrf\0{self.nonce}")


def portal_key(settings: Settings) -> bytes:
    """The key links and sessions are signed with (module docstring)."""
    if settings.portal_key is not None:
        raw = settings.portal_key.get_secret_value()
    elif settings.database_url:
        raise ConfigurationError(
            "the tenant portal needs POLLER_PORTAL_KEY (32+ characters), the same on every "
            "process that makes links or serves the portal"
        )
    else:
        from poller.local.embedded import default_data_dir, kept_secret

        folder = default_data_dir(settings.data_dir)
        raw = kept_secret(folder / KEY_FILE, "portal key", lambda k: len(k) >= 32, 32)
    return hashlib.sha256(b"poller-portal\0" + raw.encode()).digest()


def portal_link(
    tenant: str,
    expires: timedelta = DEFAULT_LINK,
    *,
    settings: Settings | None = None,
    base_url: str | None = None,
) -> str:
    """A signed URL that opens the portal for ``tenant`` until ``expires`` from now.

    ``base_url``: where tenants reach the portal (default ``POLLER_PORTAL_URL``, else
    the dashboard's address). Raises InvalidInput for a tenant no endpoint could have
    or a lifetime outside (0, 1 day], ConfigurationError without a key."""
    settings = settings or Settings()
    if not isinstance(tenant, str):
        raise InvalidInput("tenant: the tenant whose portal the link opens")
    check_tenant(tenant, InvalidInput)
    if not timedelta(0) < expires <= LONGEST_LINK:
        raise InvalidInput(
            f"expires: more than 0 s and at most {LONGEST_LINK.total_seconds():g} s (a day); "
            f"got {expires.total_seconds():g} s"
        )
    key = portal_key(settings)
    token = _sign(key, "link", tenant, time.time() + expires.total_seconds())
    base = base_url or settings.portal_base
    return f"{base.rstrip('/')}/portal/start?link={quote(token, safe='')}"


def read_link(key: bytes, token: str, now: float | None = None) -> Link:
    """A link signed with ``key`` and not expired; InvalidInput for any other (forged,
    expired, malformed: one message for all). Whether it was opened before is
    :func:`spend_link`'s to say."""
    return Link(*_verify(key, "link", token, now))


def spend_link(conn: Connection, link: Link) -> None:
    """Record that ``link`` was opened, in ``conn``'s transaction; InvalidInput when it
    was already (of two at once, one wins). Forgets links expired an hour ago."""
    conn.execute(queries.FORGET_LINKS, {"kept": USED_KEPT.total_seconds()})
    fresh = conn.execute(
        queries.SPEND_LINK,
        {"nonce": link.nonce, "expires_at": datetime.fromtimestamp(link.expires, UTC)},
    ).first()
    if fresh is None:
        raise InvalidInput(USED)


def session_for(link: Link, now: float | None = None) -> Session:
    """The session an opened link starts: an hour, and never a day past the link."""
    now = time.time() if now is None else now
    ends = min(now + SESSION.total_seconds(), link.expires + LONGEST_LINK.total_seconds())
    return Session(link.tenant, ends, secrets.token_urlsafe(12))


def session_cookie(key: bytes, session: Session) -> str:
    return _sign(key, "session", session.tenant, session.expires, session.nonce)


def open_session(key: bytes, cookie: str, now: float | None = None) -> Session:
    tenant, expires, nonce = _verify(key, "session", cookie, now)
    return Session(tenant, expires, nonce)


def _mac(key: bytes, message: str) -> str:
    digest = hmac.new(key, message.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def _sign(key: bytes, kind: str, tenant: str, expires: float, nonce: str | None = None) -> str:
    name = base64.urlsafe_b64encode(tenant.encode()).rstrip(b"=").decode()
    body = f"{name}.{int(expires)}.{nonce or secrets.token_urlsafe(9)}"
    return body + "." + _mac(key, kind + "\0" + body)


def _verify(key: bytes, kind: str, token: str, now: float | None) -> tuple[str, float, str]:
    refused = InvalidInput("this portal link is not valid, or has expired: ask for a new one")
    parts = token.split(".") if len(token) <= 1024 else []
    if len(parts) != 4 or not (parts[1].isascii() and parts[1].isdigit()):
        raise refused
    name, expires, nonce, mac = parts
    if not same_text(_mac(key, kind + "\0" + f"{name}.{expires}.{nonce}"), mac):
        raise refused
    if int(expires) <= (time.time() if now is None else now):
        raise refused
    try:
        tenant = base64.urlsafe_b64decode(name + "=" * (-len(name) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError):
        raise refused from None
    return tenant, float(expires), nonce
