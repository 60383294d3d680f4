"""Headers an endpoint sends with every delivery and lookup: credentials for the receiver.

::

    create_endpoint(conn, "billing", "https://billing.example.com/webhooks",
                    headers={"Authorization": "Bearer s3cr3t", "X-Api-Key": "k"})

Receivers behind an API gateway want a bearer token or an API key. The values
are credentials: they are stored sealed like signing secrets (``POLLER_SECRETS_KEY``,
poller/rules/keyring.py; ``poller endpoints rotate-key`` reseals them too) and never
shown — ``endpoints show``, the dashboard, ``--json``, logs and errors give the
names only. An error about a header names it, never its value.

Refused (:class:`~poller.errors.InvalidEndpoint`): a name that is not an HTTP
token; a value with a control character (CR, LF, NUL…), a character outside
visible ASCII, or space at either end; the headers that frame or route the
request (``Host``, ``Content-Length``, ``Transfer-Encoding``, ``Connection`` and
the other hop-by-hop ones, ``Content-Type``, ``Content-Encoding``, ``Expect``,
``Proxy-*``); the poller's own (``webhook-*``, ``Idempotency-Key``,
``User-Agent``, ``traceparent``, ``tracestate``); the same name twice (names are
case-insensitive); more than :data:`MAX_HEADERS` headers or :data:`MAX_BYTES` bytes in
all.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

from poller.errors import InvalidEndpoint

MAX_HEADERS = 32
MAX_BYTES = 8 * 1024
PLAIN_PREFIX = "headers:"  # the stored spelling without POLLER_SECRETS_KEY: headers:{json}

Headers = tuple[tuple[str, str], ...]

_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}")
_VALUE = re.compile(r"[\x21-\x7e]([\x20-\x7e]*[\x21-\x7e])?")
RESERVED = frozenset(
    {
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "te",
        "trailer",
        "upgrade",
        "expect",
        "content-type",
        "content-encoding",
        "idempotency-key",
        "user-agent",
        "cookie",
        "traceparent",  # the delivery's trace context (poller/rules/tracing.py)
        "tracestate",
    }
)
"""Names refused whatever their case: they frame, route or identify the request."""
RESERVED_PREFIXES = ("webhook-", "proxy-")


def check_headers(headers: Mapping[str, str] | None) -> Headers:
    """The headers, checked, in the order given; InvalidEndpoint naming the first bad one."""
    if not headers:
        return ()
    if not isinstance(headers, Mapping):
        raise InvalidEndpoint("headers must be a mapping of names to values")
    checked: list[tuple[str, str]] = []
    seen: set[str] = set()
    for name, value in headers.items():
        checked.append(_check_one(name, value))
        lowered = checked[-1][0].lower()
        if lowered in seen:
            raise InvalidEndpoint(f"header {name!r} is given twice (names ignore case)")
        seen.add(lowered)
    if len(checked) > MAX_HEADERS:
        raise InvalidEndpoint(f"at most {MAX_HEADERS} headers (got {len(checked)})")
    size = sum(len(n) + len(v) + 4 for n, v in checked)  # "name: value\r\n"
    if size > MAX_BYTES:
        raise InvalidEndpoint(f"headers of at most {MAX_BYTES} bytes in all (got {size})")
    return tuple(checked)


def _check_one(name: object, value: object) -> tuple[str, str]:
    if not isinstance(name, str) or not _TOKEN.fullmatch(name):
        shown = repr(name)[:60] if isinstance(name, str) else type(name).__name__
        raise InvalidEndpoint(
            f"header name {shown} is not an HTTP token (letters, digits, - and !#$%&'*+.^_`|~)"
        )
    lowered = name.lower()
    if lowered in RESERVED or lowered.startswith(RESERVED_PREFIXES):
        raise InvalidEndpoint(
            f"header {name!r} is set by the poller or frames the request; it cannot be given"
        )
    if not isinstance(value, str) or not _VALUE.fullmatch(value):
        raise InvalidEndpoint(
            f"header {name!r}: the value must be visible ASCII (spaces inside only), "
            "with no control characters"
        )
    return name, value


def merged(current: Headers, changes: Mapping[str, str | None], *, clear: bool = False) -> Headers:
    """``current`` with ``changes`` applied (a value of None removes that header; names
    ignore case); ``clear`` starts from none. Checked like :func:`check_headers`."""
    result = {} if clear else {name.lower(): (name, value) for name, value in current}
    for name, value in changes.items():
        key = name.lower() if isinstance(name, str) else name
        if value is None:
            result.pop(key, None)
        else:
            result[key] = (name, value)
    return check_headers(dict(result.values()))


def dumps(headers: Headers) -> str | None:
    """The plain stored spelling (sealed by the caller), or None for no headers."""
    return PLAIN_PREFIX + json.dumps([list(h) for h in headers]) if headers else None


def loads(plain: str) -> Headers:
    """Headers from their plain stored spelling."""
    return tuple((str(n), str(v)) for n, v in json.loads(plain.removeprefix(PLAIN_PREFIX)))
