"""What an endpoint's URL and lookup URL may be: checked once, stored as connected to.

A URL is http or https, or a message broker's (poller/rules/destinations.py: ``nats``,
``amqp(s)``, ``redis(s)``, checked by :func:`check_destination`), with a valid host (a
DNS name, or an address in its canonical spelling: ``2130706433`` and ``0x7f.1`` are
stored as ``127.0.0.1``, so what is stored is what the guard checks and the client connects to), no
credentials, no spaces or control characters, and not a private, loopback or
link-local address unless private targets are allowed (poller/endpoints/netguard.py). A
lookup URL also holds :data:`LOOKUP_PLACEHOLDER`.
"""

from __future__ import annotations

import re
from urllib.parse import SplitResult, urlsplit, urlunsplit

import idna

from poller.endpoints.netguard import host_refusal, literal_address
from poller.errors import InvalidEndpoint, InvalidHost, PrivateTarget
from poller.rules import destinations

LOOKUP_PLACEHOLDER = "{idempotency_key}"
MAX_URL = 8192
"""Characters a URL may have: its path and query go in every request's first line, which
servers commonly cap at 8 KiB (a longer one is answered 414, or the connection closed);
and a URL is stored, cached by every poller and shown on every endpoint page."""

_LABEL_RE = re.compile(r"[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?")


def _check_name_host(host: str, what: str) -> None:
    """A DNS name: LDH labels (and ``_``), or internationalised labels that IDNA accepts."""
    labels = host.rstrip(".").split(".")
    if len(host) > 253 or not all(labels):
        raise InvalidEndpoint(f"{what} host {host!r} is not a valid host name")
    for label in labels:
        if label.isascii() and not label.startswith("xn--") and _LABEL_RE.fullmatch(label):
            continue
        try:
            idna.encode(label, uts46=True)
        except (idna.IDNAError, UnicodeError, ValueError):
            raise InvalidEndpoint(f"{what} host {host!r} is not a valid host name") from None


def _ascii_host(url: str, parts: SplitResult, what: str) -> tuple[str, SplitResult]:
    """The URL with its host in ASCII, as IDNA maps it (UTS 46): a look-alike such as
    ``１２７.０.０.１``, ``127。0。0。1`` or ``ｌｏｃａｌｈｏｓｔ`` is stored as the host a client
    connects to (``127.0.0.1``, ``localhost``) — and checked as that, here, where a
    private one is refused when it is saved, not only at connect time."""
    host = parts.hostname or ""
    if host.isascii():
        return url, parts
    try:
        mapped = idna.encode(host, uts46=True, std3_rules=False).decode("ascii")
    except (idna.IDNAError, UnicodeError, ValueError):
        raise InvalidEndpoint(f"{what} host {host!r} is not a valid host name") from None
    netloc = mapped if parts.port is None else f"{mapped}:{parts.port}"
    url = urlunsplit(parts._replace(netloc=netloc))
    return url, urlsplit(url)


def _canonical_host(url: str, parts: SplitResult, what: str) -> str:
    """The URL with a numeric host in its canonical spelling (``0x7f.1`` → ``127.0.0.1``)."""
    host = parts.hostname or ""
    try:
        address = literal_address(host)
    except InvalidHost as exc:
        raise InvalidEndpoint(f"{what}: {exc}") from None
    if address is None:
        _check_name_host(host, what)
        return url
    canonical = f"[{address.compressed}]" if address.version == 6 else str(address)
    if canonical == parts.netloc.rsplit(":", 1)[0] or canonical == parts.netloc:
        return url
    netloc = canonical if parts.port is None else f"{canonical}:{parts.port}"
    return urlunsplit(parts._replace(netloc=netloc))


def check_url(url: object, *, what: str = "url", allow_private: bool = False) -> str:
    """An http(s) URL with a valid host and no credentials, or InvalidEndpoint.

    Returns the URL to store: a numeric host in any spelling a client would
    accept (``2130706433``, ``0177.0.0.1``, ``127.1``) is rewritten as the
    canonical address, so what is stored is what is connected to.
    """
    if not isinstance(url, str) or not url:
        raise InvalidEndpoint(f"{what} must be a non-empty http(s) URL")
    _check_text(url, what)
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a port out of range
    except ValueError as exc:
        raise InvalidEndpoint(f"{what} {url!r} is not a valid URL: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise InvalidEndpoint(f"{what} must use http or https, not {parts.scheme or 'no scheme'!r}")
    if not parts.hostname:
        raise InvalidEndpoint(f"{what} {url!r} has no host")
    if parts.username or parts.password:
        raise InvalidEndpoint(f"{what} must not carry credentials (user:password@)")
    return _stored_host(url, what, allow_private)


def _check_text(url: str, what: str) -> None:
    """Not too long, and no spaces, control characters or lone surrogates."""
    if len(url) > MAX_URL:
        raise InvalidEndpoint(f"{what} is {len(url):,} characters; at most {MAX_URL:,} are allowed")
    if any(ch.isspace() or ord(ch) < 0x20 or "\ud800" <= ch <= "\udfff" for ch in url):
        raise InvalidEndpoint(
            f"{what} must not contain spaces, control characters or lone surrogates"
        )


def _stored_host(url: str, what: str, allow_private: bool) -> str:
    """The URL with its host as it is connected to (ASCII, a canonical address), checked
    against the private-target guard."""
    parts = urlsplit(url)
    if parts.port == 0:
        raise InvalidEndpoint(f"{what} has port 0")
    url, parts = _ascii_host(url, parts, what)
    url = _canonical_host(url, parts, what)
    reason = host_refusal(urlsplit(url).hostname or "")
    if not allow_private and reason is not None:
        raise PrivateTarget(
            f"{what} points at a private, loopback or link-local address ({reason})"
        )
    return url


def check_destination(
    url: object, *, allow_private: bool = False, kinds: frozenset[str] | None = None
) -> tuple[str, str | None]:
    """An endpoint's URL checked, and the credentials to seal apart from it.

    An http(s) URL is :func:`check_url`'s (no credentials: an endpoint's headers carry
    them). A broker URL (poller/rules/destinations.py) must read as one, with its host
    checked as an HTTP one is; its ``user:password@`` comes back apart, to be stored
    sealed, never shown. ``kinds``: the destinations allowed (``http``, ``nats``,
    ``amqp``, ``redis``; None: every one), as a tenant's portal may be narrower.
    """
    if not isinstance(url, str) or not url:
        raise InvalidEndpoint("url must be a non-empty http(s) or broker URL")
    kind = destinations.kind_of(url)
    if kinds is not None and kind not in kinds:
        offered = ", ".join(k for k in destinations.KINDS if k in kinds)
        raise InvalidEndpoint(f"url: {kind} destinations are not offered here (offered: {offered})")
    if kind == "http":
        return check_url(url, allow_private=allow_private), None
    _check_text(url, "url")
    destinations.parse(url)  # what it publishes to, and its parameters
    stored, userinfo = destinations.split_credentials(url)
    return _stored_host(stored, "url", allow_private), userinfo


def check_lookup_url(url: object, *, allow_private: bool = False) -> str:
    checked = check_url(url, what="lookup_url", allow_private=allow_private)
    if LOOKUP_PLACEHOLDER not in checked:
        raise InvalidEndpoint(f"lookup_url must contain {LOOKUP_PLACEHOLDER}")
    return checked
