"""An endpoint as the poller reads it: a row of ``poller_endpoints`` with its secrets
opened (poller/rules/keyring.py). The dispatcher signs and sends with it, the faces show it;
poller/endpoints/registry.py makes, changes and reads the rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Row

from poller.endpoints import headers as header_codec
from poller.endpoints.headers import PLAIN_PREFIX as HEADERS_PLAIN
from poller.endpoints.headers import Headers
from poller.endpoints.tls import PLAIN_PREFIX as TLS_PLAIN
from poller.endpoints.tls import TLSSettings
from poller.errors import SecretUnreadable
from poller.rules.destinations import with_credentials
from poller.rules.keyring import Keyring, is_sealed
from poller.rules.signing import Scheme, public_key, scheme_of
from poller.settings import default_settings

CREDENTIALS_PLAIN = "userinfo:"
"""The stored spelling of a broker URL's credentials without POLLER_SECRETS_KEY."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    """An endpoint as stored, its secrets opened (poller/rules/keyring.py).

    Secrets are left out of ``repr`` so they never reach logs. When a stored
    secret cannot be opened, ``secret`` is empty and ``secret_error`` says why:
    reading the endpoint still works, signing with it raises (:meth:`signing_secrets`).
    """

    id: int
    name: str
    url: str
    lookup_url: str | None
    enabled: bool
    disabled_reason: str | None
    max_attempts: int | None
    timeout: float | None
    max_in_flight: int | None
    bucket: int
    created_at: datetime
    updated_at: datetime
    secret: str = field(repr=False)
    previous_secret: str | None = field(repr=False, default=None)
    previous_secret_expires_at: datetime | None = None
    on_failed_head: str = "block"
    """Ordered keys whose head fails for good: ``block`` (wait for an operator) or ``skip``."""
    rate_limit: float | None = None
    """Requests per second across all pollers (poller/rules/health.py); None: unlimited."""
    rate_burst: int | None = None
    """Requests the rate limit allows at once; None: one second's worth."""
    circuit_failures: int | None = None
    """Failed sends in a row that open the circuit (0: never); None: POLLER_CIRCUIT_FAILURES."""
    circuit_cooldown: float | None = None
    """Seconds open before the first probe; None: POLLER_CIRCUIT_COOLDOWN."""
    event_types: tuple[str, ...] = ()
    """Published event types it receives: names and ``prefix*``
    (poller/endpoints/subscriptions.py)."""
    tenant: str | None = None
    """Only events published for this tenant reach it; None: only events without one."""
    payload_filter: dict[str, Any] | None = None
    """A JSON object a published event's payload must contain to reach it."""
    retry_schedule: tuple[float, ...] | None = None
    """Seconds between attempts (the last repeats); None: POLLER_RETRY_SCHEDULE."""
    max_age: float | None = None
    """Seconds after its creation a message may still be sent; older, it ends ``failed``
    (``expired``) at its next claim. None: no limit."""
    trace_context: bool = True
    """Whether deliveries carry the message's trace context to it (poller/rules/tracing.py)."""
    held_until: datetime | None = None
    """Paused by an operator (poller/operate/cancel.py) until then; None with :attr:`held_by`: until
    resumed."""
    held_by: str | None = None
    """Who paused it; None: not paused."""
    headers: Headers = field(repr=False, default=())
    """Sent with every delivery and lookup (poller/endpoints/headers.py); the values are
    credentials."""
    client_cert: str | None = None
    """PEM client certificate for mutual TLS (poller/endpoints/tls.py)."""
    client_key: str | None = field(repr=False, default=None)
    """Its private key (stored sealed like the secret); never shown."""
    ca_bundle: str | None = None
    """PEM CA certificates its certificate chains to: then only they are trusted for it."""
    url_credentials: str | None = field(repr=False, default=None)
    """A broker URL's ``user:password`` (poller/rules/destinations.py), split off :attr:`url`
    and stored sealed; never shown. :attr:`target` puts it back to connect with."""
    secret_sealed: bool = False
    """True when the stored secret is encrypted (POLLER_SECRETS_KEY)."""
    secret_error: str | None = None

    @property
    def signing(self) -> Scheme | None:
        """The scheme of its current key (poller/rules/signing.py); None when it is unreadable."""
        return None if self.secret_error is not None else scheme_of(self.secret)

    @property
    def public_keys(self) -> tuple[str, ...]:
        """The ``whpk_`` keys a receiver verifies with: the current key's, then the previous
        one's during a rotation. Empty for HMAC, whose secret is the receiver's key."""
        if self.secret_error is not None:
            return ()
        keys = self.signing_secrets(datetime.now(UTC))
        return tuple(k for k in map(public_key, keys) if k is not None)

    @property
    def paused(self) -> bool:
        """Whether an operator's pause holds its messages now."""
        return self.held_by is not None and (
            self.held_until is None or self.held_until > datetime.now(UTC)
        )

    @property
    def tls(self) -> TLSSettings | None:
        """Its own TLS settings, if it has any (poller/endpoints/tls.py)."""
        if self.client_cert is None and self.ca_bundle is None:
            return None
        return TLSSettings(self.client_cert, self.client_key, self.ca_bundle)

    @property
    def target(self) -> str:
        """The URL to connect to: :attr:`url` with its credentials, if it has any."""
        return with_credentials(self.url, self.url_credentials)

    @property
    def header_names(self) -> tuple[str, ...]:
        """What may be shown of :attr:`headers`: their names."""
        return tuple(name for name, _ in self.headers)

    @classmethod
    def from_row(cls, row: Row[Any], keyring: Keyring | None = None) -> Endpoint:
        """An endpoint from a row of ``poller_endpoints``, its secrets opened with ``keyring``
        (default: POLLER_SECRETS_KEY's)."""
        keyring = keyring or default_settings().keyring
        values = {name: getattr(row, name) for name in _STORED_FIELDS}
        values["secret_sealed"] = is_sealed(row.secret)
        values["event_types"] = tuple(row.event_types or ())
        values["retry_schedule"] = tuple(row.retry_schedule) if row.retry_schedule else None
        try:
            values["secret"] = keyring.open(row.secret)
            if row.previous_secret is not None:
                values["previous_secret"] = keyring.open(row.previous_secret)
            if row.headers is not None:
                values["headers"] = header_codec.loads(keyring.open(row.headers, HEADERS_PLAIN))
            if row.client_key is not None:
                values["client_key"] = keyring.open(row.client_key, TLS_PLAIN)
            if row.url_credentials is not None:
                opened = keyring.open(row.url_credentials, CREDENTIALS_PLAIN)
                values["url_credentials"] = opened.removeprefix(CREDENTIALS_PLAIN)
        except SecretUnreadable as exc:
            values.update(secret="", previous_secret=None, headers=(), secret_error=str(exc))
            values.update(url_credentials=None)
            values.update(client_cert=None, ca_bundle=None)  # never half a TLS setting
        return cls(**values)

    def signing_secrets(self, now: datetime) -> list[str]:
        """The current secret, plus the previous one until it expires (rotation).

        Raises SecretUnreadable when the stored secrets could not be opened.
        """
        if self.secret_error is not None:
            raise SecretUnreadable(f"endpoint {self.name!r}: {self.secret_error}")
        active = [self.secret]
        expires = self.previous_secret_expires_at
        if self.previous_secret and (expires is None or expires > now):
            active.append(self.previous_secret)
        return active


_STORED_FIELDS = tuple(
    name
    for name in Endpoint.__dataclass_fields__
    if name not in ("secret_sealed", "secret_error", "headers", "client_key", "url_credentials")
)
