"""All configuration, read from ``POLLER_*`` environment variables (and ``.env``).

Durations are seconds (fractions allowed, so tests can run fast schedules).
``load_settings()`` validates everything at start and turns pydantic's errors
into one :class:`~poller.errors.ConfigurationError` whose message names the
environment variable, e.g.::

    POLLER_CLAIM_LEASE=5: must be at least 2 x POLLER_REQUEST_TIMEOUT + 1 s (21.0) ...

Example::

    >>> from poller import load_settings
    >>> settings = load_settings(claim_lease=90, request_timeout=20)
    >>> settings.retry_schedule[0]
    5.0
"""

from __future__ import annotations

import base64
import functools
import ipaddress
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import unquote, urlsplit

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError

from poller.errors import ConfigurationError
from poller.rules.health import HealthPolicy
from poller.rules.keyring import Keyring, keyring_for, parse_keys
from poller.rules.retry import MAX_SCHEDULE_LENGTH

DEFAULT_RETRY_SCHEDULE: tuple[float, ...] = (5, 300, 1800, 7200, 18000, 36000, 50400, 72000, 86400)
"""Seconds after the previous attempt (±20 % jitter). Ten attempts in about three days."""

MAX_SECONDS = 10 * 365 * 86400.0
"""No duration setting may exceed ten years (nor be inf or NaN): PostgreSQL's interval
arithmetic must stay exact."""
MAX_RETRY_SECONDS = 30 * 86400.0
"""A retry interval, or an honoured Retry-After, is at most 30 days."""

MIN_INTERVAL = 0.05
MAX_ATTEMPTS = 1000  # an attempt budget's bound, on every door (poller/endpoints/checks.py)
MAX_IN_FLIGHT = 10_000  # deliveries of one endpoint at once, at most
"""A loop's interval or a request's timeout is at least this: 1e-300 was taken, and a
sweep or poll loop then ran flat out against the database, every request timed out."""

PositiveSeconds = Annotated[float, Field(gt=0, le=MAX_SECONDS)]
IntervalSeconds = Annotated[float, Field(ge=MIN_INTERVAL, le=MAX_SECONDS)]
RetrySeconds = Annotated[float, Field(gt=0, le=MAX_RETRY_SECONDS)]

ENV_PREFIX = "POLLER_"
SECRET_FIELDS = frozenset(
    {
        "database_url",
        "redis_url",
        "secrets_key",
        "dashboard_token",
        "dashboard_password",
        "proxy_url",
        "portal_key",
    }
)
"""Settings whose values never appear in an error message (passwords, keys)."""


DASHBOARD_ADDR = "127.0.0.1:8188"  # where `poller serve` serves when nothing says
METRICS_ENDPOINTS = 200  # endpoints with their own delivery-metric series (a process)


class Settings(BaseSettings):
    """webhook-poller's settings; each field is the env var ``POLLER_<NAME>``."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_file=".env",
        env_file_encoding="utf-8",
        extra="ignore",
        frozen=True,
        allow_inf_nan=False,  # POLLER_CLAIM_LEASE=inf would pass every bound check
    )

    database_url: str | None = None
    """PostgreSQL URL (``postgresql://user:pass@host/db``). Unset: embedded server in DATA_DIR."""
    redis_url: str | None = None
    """Redis URL for the ``redis`` election backend."""
    data_dir: Path | None = None
    """Where the embedded PostgreSQL/Redis keep their data when no URL is set. Unset: the
    nearest ``.poller`` folder holding a server, from here up (as git finds ``.git``);
    a new one is made in ``./.poller`` only by ``poller embedded start`` and ``db upgrade``."""

    election: Literal["redis", "postgres", "none"] | None = None
    """Election backend; default ``redis`` when REDIS_URL is set, else ``postgres``."""
    election_fail: Literal["open", "closed"] = "open"
    """Backend down: ``open`` claims from every shard (rows stay safe), ``closed`` stops."""
    shards: int = Field(default=8, ge=1, le=256)
    """Shards the 256 buckets are split into; each is led by one poller at a time. Fixed
    for a database once pollers have run (recorded with the fences)."""
    lease_ttl: float = Field(default=10.0, ge=0.5, le=3600)
    """Election lease per shard (0.5 s or more); renewed every TTL/3, and a leader stops
    claiming a shard TTL/5 before its lease could expire."""

    claim_lease: PositiveSeconds = 60.0
    """Row claim lease; must exceed the worst delivery time (send + lookup + margin)."""
    sweep_interval: IntervalSeconds = 5.0
    """How often the maintenance leader reclaims expired claims (at least 0.05 s)."""
    batch_size: int = Field(default=100, ge=1, le=10_000)
    """Most rows one claim statement takes."""
    concurrency: int = Field(default=64, ge=1, le=10_000)
    """Deliveries at work at once per ``poller run`` process, across all endpoints: a
    request still waiting for its answer after ``POLLER_WAITING_AFTER`` seconds no longer
    counts (it costs the process a socket and some memory, not CPU), so slow receivers
    do not take the room fast ones need."""
    waiting_after: float = Field(default=0.1, ge=0.01, le=3600)
    """Seconds after which a delivery still waiting for its receiver's answer stops
    counting against ``POLLER_CONCURRENCY`` and counts against ``POLLER_MAX_WAITING``."""
    max_waiting: int = Field(default=2000, ge=0, le=100_000)
    """Deliveries a process may hold waiting for slow receivers beyond its concurrency
    (each a socket and some memory). Near it, endpoints with a delivery waiting get no
    more until some answer, so fast ones keep their room; at it, nothing more starts."""
    tenant_max_in_flight: int = Field(default=500, ge=0, le=100_000)
    """Deliveries of one tenant's endpoints a process holds at most (0: no ceiling):
    past it, that tenant's endpoints get no more until some end (a claim under way may
    take it past by one batch). Endpoints without a tenant have no ceiling."""
    poll_interval: IntervalSeconds = 1.0
    """Fallback poll when no NOTIFY wake-up comes (at least 0.05 s)."""
    request_timeout: IntervalSeconds = 10.0
    """Whole-exchange timeout for one delivery or one lookup (connect, send, answer; at
    least 0.05 s)."""
    connect_timeout: IntervalSeconds = 5.0
    """Budget for getting a connection (pool, DNS, TCP, TLS), at most half the request
    timeout: failing within it is *not sent*, timing out after it is *unknown*."""
    retry_schedule: tuple[RetrySeconds, ...] = DEFAULT_RETRY_SCHEDULE
    """JSON list of 1 to 50 seconds (each ≤ 30 days), e.g. ``[5, 300, 1800]``; the last
    repeats."""
    retry_after_max: RetrySeconds = 3600.0
    """A receiver's Retry-After is honoured up to this many seconds."""
    permanent_statuses: tuple[Annotated[int, Field(ge=100, le=599)], ...] = ()
    """JSON list of HTTP statuses that fail a message at once, e.g. ``[400, 422]``."""
    max_attempts: int = Field(default=10, ge=1, le=MAX_ATTEMPTS)
    """Default attempt budget of a message (endpoint and enqueue can override)."""
    max_payload_bytes: int = Field(default=256 * 1024, ge=1, le=64 * 1024 * 1024)
    """Largest payload (serialised JSON, in bytes) enqueue and publish accept."""
    max_in_flight: int = Field(default=16, ge=1, le=MAX_IN_FLIGHT)
    """Default per-endpoint limit of deliveries in flight (an endpoint can override it)."""
    http_client: Literal["aiohttp", "httpx", "reqwest"] = "reqwest"
    """HTTP client for deliveries: ``reqwest`` (the default: Rust's, through pyreqwest,
    the least CPU per delivery), ``aiohttp`` or ``httpx``."""
    notify: bool = True
    """LISTEN/NOTIFY wake-ups; turn off behind PgBouncer in transaction mode."""
    allow_private_targets: bool = False
    """Allow endpoints on private, loopback or link-local addresses (demo, tests)."""
    trace_propagation: bool = True
    """Send a message's trace context (``traceparent``, ``tracestate``) to its receiver
    when the application enqueued it inside an OpenTelemetry span (poller/rules/tracing.py);
    an endpoint can refuse it (``--no-trace-context``)."""
    proxy_url: SecretStr | None = None
    """Egress proxy every delivery and lookup goes through, ``http://[user:pass@]host:port``
    (CONNECT for https targets): deliveries leave from its address. The poller checks
    each target and asks the proxy for the checked address (poller/deliver/proxy.py); proxy
    environment variables stay ignored. Unset: direct."""

    @field_validator("proxy_url")
    @classmethod
    def _proxy(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None or not value.get_secret_value().strip():
            return None
        parse_proxy(value.get_secret_value())  # ValueError saying what, never the password
        return value

    @property
    def proxy(self) -> Proxy | None:
        """The egress proxy (poller/deliver/proxy.py), if one is set."""
        return None if self.proxy_url is None else parse_proxy(self.proxy_url.get_secret_value())

    metrics_addr: str | None = None
    """``host:port`` for /metrics, /healthz, /readyz (port 0: one the kernel picks, logged);
    unset: not served."""
    metrics_endpoints: int = Field(default=METRICS_ENDPOINTS, ge=0, le=1_000_000)
    """How many endpoints have their own series in a process's delivery metrics (outcomes,
    exchange durations, commit→delivery): the first met; the rest count under
    ``endpoint="_other"``, and ``webhook_poller_metrics_endpoints_folded`` turns 1. An
    endpoint costs about 40 series: 10,000 made each scrape 35 MB and 3.6 s of CPU."""
    log_format: Literal["auto", "json", "console"] = "auto"
    """``json`` (one object per line), ``console`` (a readable line) or ``auto``: console
    on a terminal, JSON otherwise."""
    dashboard_addr: str | None = DASHBOARD_ADDR
    """``host:port`` ``poller serve`` serves on. It shows payloads: keep it on loopback,
    or behind a TLS proxy, unless you mean it."""
    dashboard_token: SecretStr | None = None
    """Token that opens the dashboard (``Authorization: Bearer``, or the login page). Unset
    and no user/password: a token kept in the embedded server's data folder."""
    dashboard_user: str | None = None
    """HTTP basic user for the dashboard (with POLLER_DASHBOARD_PASSWORD)."""
    dashboard_password: SecretStr | None = None
    """HTTP basic password for the dashboard (with POLLER_DASHBOARD_USER)."""
    dashboard_read_only: bool = False
    """Show everything, change nothing: no retry, replay, enable or disable."""
    api_rate_limit: float = Field(default=50.0, ge=0.01, le=100_000)
    """Requests a second each API token may make (``/api/v1``, poller/web/api/routes.py),
    0.01 to 100,000, in bursts of up to twice that (at least one); past it, 429 with
    ``Retry-After``. Per process."""
    tenant_max_endpoints: int = Field(default=100, ge=0, le=1_000_000)
    """Endpoints a tenant may have when it makes one itself (a tenant's API token, the
    portal); 0: no limit. An operator may make more for it. Each publish for a tenant
    writes a row per subscribed endpoint inside the application's transaction, and
    the portal's home page lists them all."""
    tenant_destinations: tuple[Literal["http", "nats", "amqp", "redis"], ...] = ("http",)
    """JSON list of the destinations a tenant may give its own endpoints (a tenant's API
    token, the portal): ``http`` (http and https URLs), ``nats``, ``amqp``, ``redis``
    (docs/how-to/brokers.md). An operator may give a tenant's endpoint any of them."""
    portal_key: SecretStr | None = None
    """Signs tenant portal links and sessions (32+ characters; poller/access/portal.py). Unset
    and no database URL: a key kept in the embedded server's data folder."""
    portal_addr: str | None = None
    """``host:port`` on which ``poller serve`` serves the tenant portal and the API
    apart (unset: beside the operator's pages, on POLLER_DASHBOARD_ADDR, which then
    serves the operator's pages and the API only). Publish this one to customers and
    keep the operator's on a private network (docs/how-to/deploy.md)."""
    portal_url: str | None = None
    """The portal's address as tenants reach it, e.g. ``https://hooks.example.com`` (a
    link is this and ``/portal/start?link=…``); unset: ``http://`` POLLER_DASHBOARD_ADDR."""
    portal_embed_origins: tuple[str, ...] = ()
    """JSON list of origins whose pages may show the portal in an iframe, e.g.
    ``["https://app.example.com"]`` (CSP ``frame-ancestors``); none: no site may."""
    forwarded_allow_ips: tuple[str, ...] = ()
    """JSON list of the addresses (or networks, ``10.0.0.0/8``) of the reverse proxies
    in front of the dashboard, API and portal, e.g. ``["10.0.0.5"]``: a request from one
    of them is taken to come from the address its ``X-Forwarded-For`` names (the last
    one not itself listed). Wrong credentials are counted per client address, so behind
    a proxy set this, or every client shares the proxy's address. None: trust no
    ``X-Forwarded-For`` (never ``*``: anyone could then pick their address)."""
    retention_delivered: PositiveSeconds = 7 * 86400.0
    """How long a delivered message (and its attempts) is kept before the purge."""
    retention_failed: PositiveSeconds = 30 * 86400.0
    """How long a failed message (and its attempts) is kept: time to look and retry."""
    retention_events: PositiveSeconds = 7 * 86400.0
    """How long a published event is kept (and can be replayed) once no row references it."""
    retention_keys: PositiveSeconds = 90 * 86400.0
    """How long the key of a purged message stays spent: re-enqueueing it is refused
    (IdempotencyKeySpent) instead of delivering the same key twice."""
    shutdown_grace: float = Field(default=10.0, ge=0, le=3600)
    """On SIGTERM, how long in-flight deliveries may finish before their claims are released."""
    child_hung_after: float = Field(default=30.0, ge=1, le=3600)
    """``poller run --processes``: a child whose /healthz has not answered this long
    (a blocked event loop) is killed and restarted."""
    circuit_failures: int = Field(default=10, ge=0, le=1_000_000)
    """Failed sends in a row (no answer, 5xx, 408, 429) that open an endpoint's circuit:
    its messages then wait, spending no attempts (poller/rules/health.py). 0: never open."""
    circuit_cooldown: float = Field(default=30.0, ge=MIN_INTERVAL, le=86400)
    """Seconds a circuit stays open before one probe message is sent (at least 0.05:
    5e-324 was taken, and a failing endpoint was probed ten times a second for
    about 1,070 doublings of it)."""
    circuit_cooldown_max: float = Field(default=900.0, ge=MIN_INTERVAL, le=86400)
    """Each failed probe doubles the cool-down, up to this many seconds."""
    disable_after: float = Field(default=5 * 86400.0, ge=0, le=365 * 86400)
    """Disable an endpoint whose sends have failed this many seconds with no delivery
    (the reason is stored; ``endpoints enable`` undoes it). 0: never."""
    operator_endpoint: str | None = None
    """Name of the endpoint that receives operational events (circuit opened/closed,
    endpoint disabled, message failed) as signed webhooks (poller/rows/events.py)."""
    secrets_key: SecretStr | None = None
    """Fernet key(s), comma-separated, that encrypt signing secrets at rest: the first
    seals, all open (poller/rules/keyring.py). Unset: secrets are stored in plain text."""

    @field_validator("secrets_key")
    @classmethod
    def _fernet_keys(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and value.get_secret_value().strip():
            parse_keys(value.get_secret_value())  # ConfigurationError names the position
            return value
        return None

    @property
    def health(self) -> HealthPolicy:
        """The circuit breaker's and auto-disable's settings."""
        return HealthPolicy(
            self.circuit_failures,
            self.circuit_cooldown,
            self.circuit_cooldown_max,
            self.disable_after,
        )

    @field_validator("operator_endpoint")
    @classmethod
    def _endpoint_name(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", value):
            raise ValueError("must be an endpoint name (letters, digits, '.', '_', '-')")
        return value

    @model_validator(mode="after")
    def _dashboard_credentials(self) -> Settings:
        token = self.dashboard_token.get_secret_value() if self.dashboard_token else ""
        if token and (len(token) < 16 or not token.isprintable() or " " in token):
            raise ValueError(
                "POLLER_DASHBOARD_TOKEN: must be at least 16 printable characters, no spaces"
            )
        password = self.dashboard_password.get_secret_value() if self.dashboard_password else ""
        if bool(self.dashboard_user) != bool(password):
            raise ValueError(
                "POLLER_DASHBOARD_USER and POLLER_DASHBOARD_PASSWORD: set both, or neither"
            )
        user = self.dashboard_user
        if user and (":" in user or not user.isprintable()):
            raise ValueError("POLLER_DASHBOARD_USER: printable, and no ':'")
        return self

    @model_validator(mode="after")
    def _cooldowns_in_order(self) -> Settings:
        if self.circuit_cooldown_max < self.circuit_cooldown:
            raise ValueError(
                f"POLLER_CIRCUIT_COOLDOWN_MAX={self.circuit_cooldown_max:g}: must be at least "
                f"POLLER_CIRCUIT_COOLDOWN ({self.circuit_cooldown:g})"
            )
        return self

    @property
    def keyring(self) -> Keyring:
        """The keys of POLLER_SECRETS_KEY (none: secrets are stored in plain text)."""
        return keyring_for(self.secrets_key.get_secret_value() if self.secrets_key else None)

    @field_validator("retry_schedule")
    @classmethod
    def _schedule_not_empty(cls, value: tuple[float, ...]) -> tuple[float, ...]:
        if not value:
            raise ValueError("must list at least one interval, e.g. [5, 300, 1800]")
        if len(value) > MAX_SCHEDULE_LENGTH:  # as an endpoint's (poller/rules/retry.py)
            raise ValueError(f"may list at most {MAX_SCHEDULE_LENGTH} intervals")
        return value

    @field_validator("portal_embed_origins")
    @classmethod
    def _origins(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for origin in value:  # each goes into a header: nothing but scheme://host[:port]
            if not re.fullmatch(r"https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?", origin):
                raise ValueError(
                    f"{origin[:80]!r} is not an origin (scheme://host[:port], no path)"
                )
        return value

    @field_validator("forwarded_allow_ips")
    @classmethod
    def _proxies(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for proxy in value:
            try:
                ipaddress.ip_network(proxy, strict=False)
            except ValueError:
                shown = proxy[:80]
                raise ValueError(
                    f"{shown!r} is not an address or network (e.g. 10.0.0.5, 10.0.0.0/8); "
                    "list the proxies: no wildcard"
                ) from None
        return value

    @field_validator("portal_key")
    @classmethod
    def _portal_key(cls, value: SecretStr | None) -> SecretStr | None:
        key = value.get_secret_value() if value is not None else ""
        if not key:
            return None
        if len(key) < 32 or not key.isprintable():
            raise ValueError("must be at least 32 printable characters")
        return value

    @field_validator("portal_url")
    @classmethod
    def _portal_url(cls, value: str | None) -> str | None:
        if not value:
            return None
        if not re.fullmatch(r"https?://[^\s/?#]+(/[^\s?#]*)?", value):
            raise ValueError(f"{value[:80]!r} is not an http(s) URL without a query")
        return value.rstrip("/")

    @field_validator("metrics_addr", "dashboard_addr", "portal_addr")
    @classmethod
    def _host_port(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        host, sep, port = value.rpartition(":")
        if not (sep and host and port.isascii() and port.isdigit() and len(port) <= 5) or not (
            0 <= int(port) < 65536
        ):
            raise ValueError(f"must be host:port, e.g. 127.0.0.1:9108 (got {value!r})")
        return value

    @model_validator(mode="after")
    def _claim_lease_covers_delivery(self) -> Settings:
        needed = self.min_claim_lease(self.request_timeout)
        if self.claim_lease < needed:
            raise ValueError(
                f"POLLER_CLAIM_LEASE={self.claim_lease:g}: must be at least "
                f"2 x POLLER_REQUEST_TIMEOUT + 1 s ({needed:g}) so a lookup and a send "
                "finish before the claim can expire"
            )
        return self

    @model_validator(mode="after")
    def _embedded_portal_over_https(self) -> Settings:
        """A framed portal's cookie is ``SameSite=None; Secure``: a browser keeps it from
        an https page alone (and from localhost), so over plain http every link would
        open a portal that forgets its session at once."""
        if not self.portal_embed_origins:
            return self
        base = self.portal_base
        parts = urlsplit(base)
        if parts.scheme == "http" and parts.hostname not in ("localhost", "127.0.0.1", "::1"):
            name = "POLLER_PORTAL_URL" if self.portal_url else "POLLER_DASHBOARD_ADDR"
            raise ValueError(
                f"{name}: POLLER_PORTAL_EMBED_ORIGINS needs the portal on https "
                f"(set POLLER_PORTAL_URL=https://…): a framed portal's cookie is Secure, "
                f"and a browser keeps none from {base[:80]}"
            )
        return self

    @property
    def portal_base(self) -> str:
        """Where tenants' browsers reach the portal: POLLER_PORTAL_URL, else the address
        it is served on (POLLER_PORTAL_ADDR, else POLLER_DASHBOARD_ADDR) over http."""
        served = self.portal_addr or self.dashboard_addr or DASHBOARD_ADDR
        return self.portal_url or f"http://{served}"

    @property
    def election_backend(self) -> str:
        """The backend in force: POLLER_ELECTION, else redis with a REDIS_URL, else postgres."""
        if self.election:
            return self.election
        return "redis" if self.redis_url else "postgres"

    @staticmethod
    def min_claim_lease(request_timeout: float) -> float:
        """The shortest claim lease that covers a lookup and a send of ``request_timeout`` each."""
        return 2 * request_timeout + 1.0


LIST_EXAMPLES = {
    "retry_schedule": "[5, 300, 1800]",
    "permanent_statuses": "[400, 422]",
    "tenant_destinations": '["http", "nats"]',
    "portal_embed_origins": '["https://app.example.com"]',
    "forwarded_allow_ips": '["10.0.0.5", "10.1.0.0/16"]',
}
"""What a list setting looks like, for the error that says one is not JSON."""


def _env_name(loc: tuple[Any, ...]) -> str:
    field = str(loc[0]) if loc else ""
    return ENV_PREFIX + field.upper() if field else "settings"


def load_settings(**overrides: Any) -> Settings:
    """Read and validate the settings; raise ConfigurationError naming the variable.

    Keyword arguments override the environment (useful in tests and embedding).
    """
    try:
        return Settings(**overrides)
    except UnicodeDecodeError as exc:  # only files are decoded: the environment is str
        raise ConfigurationError(
            f".env in {os.getcwd()}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} "
            f"at offset {exc.start})"
        ) from None
    except OSError as exc:
        raise ConfigurationError(f".env in {os.getcwd()}: cannot be read: {exc}") from None
    except SettingsError as exc:  # a complex value (list) that is not JSON
        field = re.search(r'field "(\w+)"', str(exc))
        name = _env_name((field.group(1),)) if field else "settings"
        example = LIST_EXAMPLES.get(field.group(1) if field else "", "[…]")
        raise ConfigurationError(f"{name}: not valid JSON (e.g. {example})") from None
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            message = str(error["msg"]).removeprefix("Value error, ")
            setting = str(error["loc"][0]) if error["loc"] else ""
            if error["type"] == "tuple_type" and setting in LIST_EXAMPLES:  # JSON, not a list
                message = f"not a JSON list (e.g. {LIST_EXAMPLES[setting]})"
            if message.startswith(ENV_PREFIX):
                problems.append(message)
            else:
                value = error.get("input")
                secret = bool(error["loc"]) and error["loc"][0] in SECRET_FIELDS
                shown = f"={value!r}" if isinstance(value, str | int | float) else ""
                shown = "" if secret else shown
                problems.append(f"{_env_name(error['loc'])}{shown}: {message}")
        raise ConfigurationError("; ".join(problems)) from None


@functools.cache
def default_settings() -> Settings:
    """Settings read once from the environment, for the enqueue defaults."""
    return load_settings()


# The egress proxy setting, parsed (poller/deliver/proxy.py routes deliveries through it).


@dataclass(frozen=True, slots=True)
class Proxy:
    host: str
    port: int
    username: str | None = None
    password: str | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        """Its URL without credentials (what the HTTP clients are given)."""
        return f"http://{netloc(self.host, self.port)}"

    @property
    def shown(self) -> str:
        """What errors and logs may say of it: its address, never its credentials (the
        rule of every URL an error shows: poller/endpoints/urls.py shown_url)."""
        return f"http://{netloc(self.host, self.port)}"

    @property
    def authorization(self) -> str | None:
        """The ``Proxy-Authorization`` value (basic), if it has credentials."""
        if self.username is None:
            return None
        pair = f"{self.username}:{self.password or ''}".encode()
        return "Basic " + base64.b64encode(pair).decode("ascii")


def netloc(host: str, port: int) -> str:
    """``host:port``, an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_proxy(value: str) -> Proxy:
    """``http://[user:pass@]host:port`` → Proxy; ValueError saying what is wrong (never
    quoting the password)."""
    try:
        parts = urlsplit(value.strip())
        port = parts.port
    except ValueError:
        raise ValueError("POLLER_PROXY_URL is not a URL like http://user:pass@host:3128") from None
    if parts.scheme != "http":
        raise ValueError(
            "POLLER_PROXY_URL must start with http:// (the tunnel carries TLS to https targets)"
        )
    if not parts.hostname:
        raise ValueError("POLLER_PROXY_URL has no host")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError("POLLER_PROXY_URL must be http://[user:pass@]host:port, no path")
    return Proxy(
        parts.hostname,
        port or 80,
        unquote(parts.username) if parts.username is not None else None,
        unquote(parts.password) if parts.password is not None else None,
    )
