"""Where an endpoint's URL sends: HTTP, or a message broker named by the URL's scheme.

=============================================================  ====================================
URL                                                            publishes
=============================================================  ====================================
``http(s)://host/path``                                        a signed POST (the webhook)
``nats://[user:pass@]host[:4222]/SUBJECT``                     to JetStream, awaiting its PubAck
  (``nats+tls://`` over TLS)
``amqp://[user:pass@]host[:5672]/VHOST?exchange=E&routing_key=K``  to RabbitMQ with publisher
  (``amqps://`` over TLS)                                      confirms, persistent and mandatory
``redis://[[user]:pass@]host[:6379]/DB?stream=NAME``           to a Redis stream (XADD), through a
  (``rediss://`` over TLS; ``maxlen=N`` trims approximately)   script that remembers the id
=============================================================  ====================================

A broker URL's credentials are split off when it is stored (:func:`split_credentials`) and
kept sealed like header values; what is shown and logged is the URL without them.
This module only reads and checks URLs (it is pure): the senders beside
poller/deliver/wire.py publish, and poller/endpoints/urls.py checks hosts.
"""

from __future__ import annotations

import re
from dataclasses import replace
from urllib.parse import SplitResult, parse_qs, quote, unquote, urlsplit, urlunsplit

from poller.errors import InvalidEndpoint
from poller.rules.outcomes import record

HTTP_SCHEMES = frozenset({"http", "https"})
BROKER_SCHEMES = {
    "nats": ("nats", False),
    "nats+tls": ("nats", True),
    "amqp": ("amqp", False),
    "amqps": ("amqp", True),
    "redis": ("redis", False),
    "rediss": ("redis", True),
}
"""A broker URL's scheme → (the kind of broker, whether it is spoken over TLS)."""
KINDS = ("http", "nats", "amqp", "redis")
DEFAULT_PORTS = {"nats": 4222, "amqp": 5672, "amqps": 5671, "redis": 6379}

_SUBJECT_TOKEN = re.compile(r"[^\s.*>]+")
_NAME = re.compile(r"[^\x00-\x20\x7f]{1,255}")  # a queue, exchange, routing key or stream name
_QUERY = {
    "nats": frozenset(),
    "amqp": frozenset({"exchange", "routing_key"}),
    "redis": frozenset({"stream", "maxlen"}),
}
MAX_REDIS_DB = 1_000_000


def kind_of(url: str) -> str:
    """``http`` for an http(s) URL, else the broker its scheme names (``nats``, ``amqp``,
    ``redis``); raises InvalidEndpoint for any other scheme."""
    scheme = url.partition("://")[0].lower()
    if scheme in HTTP_SCHEMES:
        return "http"
    if scheme in BROKER_SCHEMES:
        return BROKER_SCHEMES[scheme][0]
    schemes = ", ".join(sorted(HTTP_SCHEMES | set(BROKER_SCHEMES)))
    raise InvalidEndpoint(f"url must use one of {schemes}, not {scheme or 'no scheme'!r}")


def is_broker(url: str) -> bool:
    return url.partition("://")[0].lower() in BROKER_SCHEMES


@record
class Destination:
    """A broker URL, read: the broker, where it listens and what it publishes to."""

    kind: str  # nats, amqp, redis
    tls: bool
    host: str
    port: int
    username: str | None
    password: str | None
    subject: str = ""  # nats
    vhost: str = "/"  # amqp
    exchange: str = ""  # amqp ("": the default exchange, routing_key names the queue)
    routing_key: str = ""  # amqp
    db: int = 0  # redis
    stream: str = ""  # redis
    maxlen: int | None = None  # redis: XADD MAXLEN ~ N


def parse(url: str, *, what: str = "url") -> Destination:
    """A broker URL read and checked, or InvalidEndpoint naming what is wrong with it."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise InvalidEndpoint(f"{what} is not a valid URL: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in BROKER_SCHEMES:
        raise InvalidEndpoint(f"{what} is not a broker URL (nats, amqp or redis)")
    kind, tls = BROKER_SCHEMES[scheme]
    if not parts.hostname:
        raise InvalidEndpoint(f"{what} has no host")
    if parts.fragment:
        raise InvalidEndpoint(f"{what} must not have a #fragment")
    base = Destination(
        kind=kind,
        tls=tls,
        host=parts.hostname,
        port=port or DEFAULT_PORTS["amqps" if scheme == "amqps" else kind],
        username=None if parts.username is None else unquote(parts.username),
        password=None if parts.password is None else unquote(parts.password),
    )
    path = unquote(parts.path.removeprefix("/"))
    query = _query(parts, kind, what)
    read = {"nats": _nats, "amqp": _amqp, "redis": _redis}[kind]
    return read(base, path, query, what)


def _nats(base: Destination, path: str, query: dict[str, str], what: str) -> Destination:
    if not path:
        raise InvalidEndpoint(f"{what} names no subject: nats://host:port/SUBJECT")
    if len(path) > 255 or not all(_SUBJECT_TOKEN.fullmatch(t) for t in path.split(".")):
        raise InvalidEndpoint(
            f"{what}: {path!r} is not a subject to publish to "
            "(tokens separated by '.', no spaces, no wildcards '*' or '>')"
        )
    return replace(base, subject=path)


def _amqp(base: Destination, path: str, query: dict[str, str], what: str) -> Destination:
    exchange, routing_key = query.get("exchange", ""), query.get("routing_key", "")
    if not exchange and not routing_key:
        raise InvalidEndpoint(
            f"{what} names no exchange and no routing_key: give ?exchange=NAME "
            "(and a routing_key), or a routing_key to publish to that queue"
        )
    for label, value in (("exchange", exchange), ("routing_key", routing_key)):
        if value and not _NAME.fullmatch(value):
            raise InvalidEndpoint(f"{what}: {label} must be 1-255 printable characters")
    vhost = path or "/"
    if not _NAME.fullmatch(vhost):
        raise InvalidEndpoint(f"{what}: the virtual host must be printable characters")
    return replace(base, vhost=vhost, exchange=exchange, routing_key=routing_key)


def _redis(base: Destination, path: str, query: dict[str, str], what: str) -> Destination:
    stream = query.get("stream", "")
    if not stream or not _NAME.fullmatch(stream):
        raise InvalidEndpoint(f"{what} needs ?stream=NAME (1-255 printable characters)")
    db = path or "0"
    if not (db.isascii() and db.isdigit()) or int(db) > MAX_REDIS_DB:
        raise InvalidEndpoint(f"{what}: the database must be a number, not {db!r}")
    maxlen = query.get("maxlen")
    if maxlen is not None and not (maxlen.isascii() and maxlen.isdigit() and int(maxlen) > 0):
        raise InvalidEndpoint(f"{what}: maxlen must be a positive whole number")
    return replace(base, db=int(db), stream=stream, maxlen=None if maxlen is None else int(maxlen))


def _query(parts: SplitResult, kind: str, what: str) -> dict[str, str]:
    try:
        values = parse_qs(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    except ValueError:
        raise InvalidEndpoint(f"{what} has a malformed query") from None
    allowed = _QUERY[kind]
    for name, given in values.items():
        if name not in allowed:
            known = ", ".join(sorted(allowed)) or "none"
            raise InvalidEndpoint(f"{what}: unknown parameter {name!r} (known: {known})")
        if len(given) > 1:
            raise InvalidEndpoint(f"{what}: {name} is given {len(given)} times")
    return {name: given[0] for name, given in values.items()}


def split_credentials(url: str) -> tuple[str, str | None]:
    """The URL without its ``user:password@``, and that userinfo (None when it has none)."""
    parts = urlsplit(url)
    userinfo, at, hostport = parts.netloc.rpartition("@")
    if not at:
        return url, None
    return urlunsplit(parts._replace(netloc=hostport)), userinfo


def with_credentials(url: str, userinfo: str | None) -> str:
    """The URL with the userinfo :func:`split_credentials` took from it put back."""
    if not userinfo:
        return url
    scheme, sep, rest = url.partition("://")
    return f"{scheme}{sep}{userinfo}@{rest}"


def userinfo(username: str | None, password: str | None) -> str | None:
    """``user:password`` quoted for a URL (what :func:`with_credentials` takes)."""
    if username is None and password is None:
        return None
    user = quote(username or "", safe="")
    return user if password is None else f"{user}:{quote(password, safe='')}"
