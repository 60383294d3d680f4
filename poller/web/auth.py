"""Who may open the dashboard, and proof that an action came from its own page.

**Credentials** (:func:`credentials`), first found wins:

1. ``POLLER_DASHBOARD_TOKEN`` — sent as ``Authorization: Bearer <token>`` by
   scripts, or typed into the login page (``/login?token=…`` logs in from a
   link), which sets a session cookie;
2. ``POLLER_DASHBOARD_USER`` + ``POLLER_DASHBOARD_PASSWORD`` — HTTP basic;
3. neither, on the embedded server: a token kept in ``dashboard-token`` in its
   data folder (made once, mode 0600), so ``poller demo`` can print a link that
   ``poller serve`` accepts later;
4. neither, on a configured database: refused. The pages show payloads.

Every comparison is constant-time (:func:`hmac.compare_digest`). Guessing the
operator's credentials (which a person chose) is throttled (:class:`Throttle`):
past :data:`FAILURES_ALLOWED` wrong ones from one client address in
:data:`FAILURE_WINDOW` seconds, that address's credential checks are answered 429
until the window has room again. The client address is the peer's, or — from a
proxy ``POLLER_FORWARDED_ALLOW_IPS`` lists — the one its ``X-Forwarded-For``
names (:func:`client_address`); so behind a proxy, set it. Sessions already
issued keep working, so an attacker sharing an address with the operator can
slow a new login down, never end a session. Only what no other site can make
the operator's browser send is throttled together: an ``Authorization`` header
and the login form (same-origin checked). A login link (``GET /login?token=``)
can be fired by any page the operator visits, as an image, from the operator's
own address: its wrong tokens have a throttle of their own, which holds up links
and nothing else.

What nobody guesses — an API token (256 random bits), a signed portal link — is
checked whoever sends it, so a right one is never held up by anyone's wrong ones
(tenants behind one ingress share its address); wrong ones are counted per
address and answered 429 past the limit (``token_failures``).

**Sessions** are cookies ``<issued>.<nonce>.<mac>``: HMAC-SHA256 under a key
derived from the credential, valid :data:`SESSION_HOURS`. ``HttpOnly``,
``SameSite=Strict``. Changing the token ends every session.

**Actions** (POST) need a CSRF token bound to the session (or to the basic
user) in the form, and are refused when the browser says the request came
from another site (``Origin``, ``Sec-Fetch-Site``). Bearer requests carry no
ambient credential a third-party page could borrow, so they need no CSRF token.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ipaddress
import secrets
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from starlette.requests import HTTPConnection

from poller.errors import ConfigurationError
from poller.rules.signing import same_text
from poller.settings import Settings

COOKIE = "poller_dashboard"
SESSION_HOURS = 12
FAILURES_ALLOWED = 10
FAILURE_WINDOW = 60.0
CLIENTS_TRACKED = 10_000


@dataclass(frozen=True, slots=True)
class Credentials:
    token: str | None = None
    user: str | None = None
    password: str | None = None
    token_file: Path | None = None  # where the token was read from (embedded server)

    @property
    def key(self) -> bytes:
        """The key sessions and CSRF tokens are signed with: derived from the credential,
        so a new token or password ends the old sessions."""
        material = f"{self.token or ''}\0{self.user or ''}\0{self.password or ''}"
        return hashlib.sha256(b"poller-dashboard\0" + material.encode()).digest()

    @property
    def basic(self) -> bool:
        return self.user is not None and self.password is not None


def credentials(settings: Settings) -> Credentials:
    """The dashboard's credentials from the settings (module docstring); ConfigurationError
    when there are none and no embedded server to keep a token in."""
    token = settings.dashboard_token.get_secret_value() if settings.dashboard_token else None
    password = (
        settings.dashboard_password.get_secret_value() if settings.dashboard_password else None
    )
    if token or settings.dashboard_user:
        return Credentials(token or None, settings.dashboard_user, password)
    if settings.database_url:
        raise ConfigurationError(
            "the dashboard shows payloads and needs credentials: set POLLER_DASHBOARD_TOKEN "
            "(16+ characters: export POLLER_DASHBOARD_TOKEN=$(openssl rand -hex 16)) or "
            "POLLER_DASHBOARD_USER and POLLER_DASHBOARD_PASSWORD; `poller embedded start` "
            "exports one for its own server"
        )
    from poller.local.embedded import DASHBOARD_TOKEN_FILE, dashboard_token, default_data_dir

    path = default_data_dir(settings.data_dir) / DASHBOARD_TOKEN_FILE
    return Credentials(dashboard_token(path), token_file=path)


def _mac(key: bytes, text: str) -> str:
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


def new_session(creds: Credentials, now: float | None = None) -> str:
    issued = int(time.time() if now is None else now)
    body = f"{issued}.{secrets.token_hex(8)}"
    return f"{body}.{_mac(creds.key, body)}"


def session_valid(creds: Credentials, cookie: str, now: float | None = None) -> bool:
    issued, _, rest = cookie.partition(".")
    nonce, _, mac = rest.partition(".")
    if not (issued.isascii() and issued.isdigit() and nonce and mac) or len(cookie) > 200:
        return False
    if not same_text(_mac(creds.key, f"{issued}.{nonce}"), mac):
        return False
    age = (time.time() if now is None else now) - int(issued)
    return -60 <= age <= SESSION_HOURS * 3600


def token_matches(creds: Credentials, offered: str) -> bool:
    if creds.token is None:
        return False
    return hmac.compare_digest(creds.token.encode(), offered.encode("utf-8", "replace"))


@dataclass(frozen=True, slots=True)
class Identity:
    who: str  # "token", or the basic user: named in logs and in manual attempts
    binding: str  # what CSRF tokens are bound to ("" for bearer: none needed)


def identify(
    creds: Credentials, request: HTTPConnection, *, cookies: bool = True
) -> Identity | None:
    """Who sent this request, or None: a bearer token, basic credentials or (with
    ``cookies``: the pages, never the API) a session."""
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer" and value:
        return Identity("token", "") if token_matches(creds, value.strip()) else None
    if scheme.lower() == "basic" and value and creds.basic:
        try:
            user, sep, password = base64.b64decode(value, validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return None
        assert creds.user is not None and creds.password is not None
        ok_user = hmac.compare_digest(user.encode(), creds.user.encode())
        ok_password = hmac.compare_digest(password.encode(), creds.password.encode())
        return Identity(user, f"basic:{user}") if sep and ok_user and ok_password else None
    cookie = request.cookies.get(COOKIE) if cookies else None
    if cookie and session_valid(creds, cookie):
        return Identity("token", f"session:{cookie}")
    return None


def csrf_token(creds: Credentials, identity: Identity) -> str:
    return _mac(creds.key, f"csrf\0{identity.binding}")


def csrf_ok(creds: Credentials, identity: Identity, offered: str | None) -> bool:
    if not identity.binding:  # bearer: nothing ambient to forge with
        return True
    return offered is not None and same_text(csrf_token(creds, identity), offered)


def same_origin(request: HTTPConnection) -> bool:
    """False when the browser says the request came from another site."""
    if request.headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
        return False
    origin = request.headers.get("origin")
    if origin is None:
        return True
    host = request.headers.get("host", "")
    return origin in (f"http://{host}", f"https://{host}")


Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def proxies(listed: tuple[str, ...]) -> tuple[Network, ...]:
    """POLLER_FORWARDED_ALLOW_IPS as networks (the setting checked each is one)."""
    return tuple(ipaddress.ip_network(proxy, strict=False) for proxy in listed)


def _trusted(address: str, trusted: tuple[Network, ...]) -> bool:
    try:
        ip = ipaddress.ip_address(address.strip().strip("[]"))
    except ValueError:
        return False
    return any(ip in network for network in trusted)


def client_address(peer: str, forwarded_for: str | None, trusted: tuple[Network, ...]) -> str:
    """Whom a request comes from: ``peer``, unless ``peer`` is a trusted proxy; then the
    last address of ``X-Forwarded-For`` that is not itself a trusted proxy (each proxy
    appends the address it got the request from, so the ones on the left are whatever
    the client wrote). A proxy that sent none, or only trusted ones, is the client."""
    if not trusted or not forwarded_for or not _trusted(peer, trusted):
        return peer
    for hop in reversed(forwarded_for.split(",")):
        hop = hop.strip()
        if not hop:
            continue
        if not _trusted(hop, trusted):
            try:
                return str(ipaddress.ip_address(hop.strip("[]")))
            except ValueError:
                return peer  # not an address: the proxy's word is worth nothing here
    return peer


class Throttle:
    """Wrong credentials per client address (module docstring): :meth:`wait` says how
    long that client must wait before its credentials are checked again."""

    def __init__(self, allowed: int = FAILURES_ALLOWED, window: float = FAILURE_WINDOW) -> None:
        self.allowed, self.window = allowed, window
        self._failures: dict[str, deque[float]] = {}

    def wait(self, client: str, now: float | None = None) -> float:
        now = time.monotonic() if now is None else now
        failures = self._failures.get(client)
        if failures is None:
            return 0.0
        while failures and failures[0] <= now - self.window:
            failures.popleft()
        if not failures:
            del self._failures[client]
            return 0.0
        if len(failures) < self.allowed:
            return 0.0
        return failures[0] + self.window - now

    def failed(self, client: str, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if client not in self._failures and len(self._failures) >= CLIENTS_TRACKED:
            del self._failures[next(iter(self._failures))]  # the longest-known address
        self._failures.setdefault(client, deque(maxlen=self.allowed)).append(now)


class Limits:
    """A token bucket per caller (an API token, a portal link): ``rate`` requests a
    second, bursts of twice that, and of at least one (a bucket of 2 × 0.25 never held a
    whole request: every call was refused for ever)."""

    def __init__(self, rate: float, tracked: int = 10_000) -> None:
        self.rate, self.burst, self.tracked = rate, max(1.0, 2 * rate), tracked
        self._buckets: dict[str, tuple[float, float]] = {}  # token -> (tokens left, at)

    def wait(self, who: str, now: float | None = None) -> float:
        """0 and one request taken, or how long ``who`` must wait for the next."""
        now = time.monotonic() if now is None else now
        left, at = self._buckets.get(who, (self.burst, now))
        left = min(self.burst, left + (now - at) * self.rate)
        if left < 1:
            self._buckets[who] = (left, now)
            return (1 - left) / self.rate
        if who not in self._buckets and len(self._buckets) >= self.tracked:
            del self._buckets[next(iter(self._buckets))]  # the longest-known token
        self._buckets[who] = (left - 1, now)
        return 0.0
