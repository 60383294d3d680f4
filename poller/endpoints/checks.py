"""What an endpoint's own settings may be: its name, the numbers, its signing scheme.

Each check returns the value to store or raises :class:`~poller.errors.InvalidEndpoint`
saying what was expected. The settings with a module of their own are checked
there: URLs (poller/endpoints/urls.py), headers (poller/endpoints/headers.py), health
(poller/rules/health.py), subscriptions (poller/endpoints/subscriptions.py), the retry schedule
(poller/rules/retry.py).
"""

from __future__ import annotations

import math
import re
import secrets
from collections.abc import Iterable
from typing import Any

from poller.errors import InvalidEndpoint, NotAllowed
from poller.rules.signing import Scheme, check_scheme, scheme_of
from poller.settings import MAX_ATTEMPTS, MAX_IN_FLIGHT, MIN_INTERVAL
from poller.store.schema import ON_FAILED_HEAD

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
MAX_AGE_LIMIT = 365 * 86400.0  # a year: longer is a typo, not a policy
MIN_MAX_AGE = 1.0  # a second: a claim, its signature and its send take about that


def could_be_name(name: object) -> bool:
    """Whether ``name`` is a name an endpoint can have. Lookups check it first: a name
    that no endpoint can have (a NUL, say) is *unknown*, not a database error."""
    return isinstance(name, str) and _NAME_RE.fullmatch(name) is not None


def check_name(name: object) -> str:
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise InvalidEndpoint(
            "endpoint name must be 1-64 characters of letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return name


def check_on_failed_head(value: object) -> str | None:
    if value is None or value in ON_FAILED_HEAD:
        return value
    raise InvalidEndpoint(f"on_failed_head must be one of {', '.join(ON_FAILED_HEAD)}")


MAX_COUNT = 2**31 - 1  # the columns' integers
MAX_SECONDS = 365 * 86400.0
_MOST = {"max_attempts": MAX_ATTEMPTS, "max_in_flight": MAX_IN_FLIGHT}

# What a tenant may set on its own endpoints (the API with a tenant's token, the
# portal): where its webhooks go and what reaches them, the headers and TLS material
# its receiver wants, how they are signed. Capacity and retry policy (attempts,
# timeout, in-flight, rate limit, breaker, retry schedule, age limit, what a key does
# after a failure, trace context) are the operator's: they decide what one tenant
# takes of the pollers every tenant shares.
TENANT_SETTABLE = frozenset(
    {"url", "lookup_url", "event_types", "payload_filter", "headers", "clear_headers",
     "client_cert", "client_key", "ca_bundle", "signing"}
)  # fmt: skip


def check_tenant_fields(fields: Iterable[str], caller: str) -> None:
    """NotAllowed naming the fields of ``fields`` that are not a tenant's to set."""
    refused = sorted(set(fields) - TENANT_SETTABLE)
    if refused:
        raise NotAllowed(
            f"{', '.join(refused)}: set by the operator, not by {caller} (a tenant sets "
            "url, lookup_url, event_types, payload_filter, headers and TLS material)"
        )


def positive(value: Any, what: str, *, integer: bool) -> Any:
    """``value`` if it is a positive integer (``integer``) or number of seconds; None stays."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidEndpoint(f"{what} must be a positive number")
    if integer and (not isinstance(value, int) or value < 1):
        raise InvalidEndpoint(f"{what} must be a positive integer")
    most = _MOST.get(what, MAX_COUNT)
    if integer and value > most:
        raise InvalidEndpoint(f"{what} must be at most {most}")
    if not integer and (not math.isfinite(value) or value <= 0):
        raise InvalidEndpoint(f"{what} must be a positive number of seconds")
    if not integer and value > MAX_SECONDS:
        raise InvalidEndpoint(f"{what} must be at most 365 days")
    return value


def check_flag(value: object, what: str, default: bool) -> bool:
    """A yes/no option: True, False, or None for ``default``; anything else is refused
    (``bool("false")`` is True: a word from a config file would switch it on)."""
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InvalidEndpoint(f"{what} must be True or False, not {type(value).__name__}")
    return value


def check_timeout(value: Any) -> float | None:
    """An endpoint's request timeout: seconds, at least POLLER_REQUEST_TIMEOUT's floor."""
    seconds = positive(value, "timeout", integer=False)
    if seconds is None:
        return None
    if seconds < MIN_INTERVAL:
        raise InvalidEndpoint(f"timeout must be at least {MIN_INTERVAL} s")
    return float(seconds)


def check_max_age(value: Any) -> float | None:
    """An age limit in seconds, from a second to a year: a shorter one would fail every
    message unsent (a message is older than that by the time it is claimed)."""
    seconds = positive(value, "max_age", integer=False)
    if seconds is not None and seconds > MAX_AGE_LIMIT:
        raise InvalidEndpoint("max_age must be at most 365 days")
    if seconds is not None and seconds < MIN_MAX_AGE:
        raise InvalidEndpoint(
            f"max_age must be at least {MIN_MAX_AGE:g} s: a younger limit fails every "
            "message unsent"
        )
    return None if seconds is None else float(seconds)


def signing_scheme(signing: object, key: str | None) -> Scheme:
    """The scheme asked for (default: a given key's, else HMAC); a given key must be of it."""
    if signing is None:
        return Scheme.HMAC_SHA256 if key is None else scheme_of(key)
    scheme = check_scheme(signing)
    if key is not None and scheme_of(key) is not scheme:
        raise InvalidEndpoint(f"the secret given is a {scheme_of(key)} key, not {scheme}")
    return scheme


def tenant_endpoint_name() -> str:
    """A name for an endpoint a tenant makes (the API, the portal): ``ep_`` and 16 hex
    digits, never one another tenant has, so making one tells nothing of the others."""
    return f"ep_{secrets.token_hex(8)}"
