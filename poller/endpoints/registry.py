"""Endpoints: named webhook destinations, with their signing secrets.

::

    from poller.endpoints.registry import create_endpoint

    with engine.begin() as conn:
        created = create_endpoint(conn, "billing", "https://billing.example.com/webhooks",
                                  lookup_url="https://billing.example.com/webhooks/{idempotency_key}")
        print(created.secret)   # whsec_…: shown once, give it to the receiver

An endpoint's ``bucket`` (0–255) is a stable hash of its name: every message of
the endpoint lands in that bucket, and shard ``s`` of ``S`` owns the buckets
with ``bucket % S == s`` (docs/explanation/election.md).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from poller.endpoints import headers as header_codec
from poller.endpoints.checks import (
    check_flag,
    check_max_age,
    check_name,
    check_on_failed_head,
    check_timeout,
    could_be_name,
    positive,
    signing_scheme,
)
from poller.endpoints.headers import Headers, check_headers
from poller.endpoints.record import CREDENTIALS_PLAIN
from poller.endpoints.record import Endpoint as Endpoint  # re-exported: the record
from poller.endpoints.subscriptions import check_subscription_settings
from poller.endpoints.tls import TLSSettings, check_tls
from poller.endpoints.urls import check_destination, check_lookup_url
from poller.errors import (
    EndpointBusy,
    EndpointExists,
    EndpointInUse,
    InvalidEndpoint,
    InvalidInput,
    SecretUnreadable,
    TenantFull,
    UnknownEndpoint,
)
from poller.rules.health import DEFAULT as DEFAULT  # re-exported: update_endpoint's sentinel
from poller.rules.health import MAX_RATE as MAX_RATE
from poller.rules.health import check_health_settings
from poller.rules.keyring import Keyring
from poller.rules.retry import check_schedule
from poller.rules.signing import SECRET_PREFIX as SECRET_PREFIX
from poller.rules.signing import Scheme, check_key, new_key
from poller.settings import default_settings
from poller.store import queries
from poller.store.queries import endpoints as built
from poller.store.schema import BUCKETS

Conn = Session | Connection


def bucket_for(name: str) -> int:
    """The endpoint's bucket: first byte of SHA-256 of its name (stable across versions)."""
    return hashlib.sha256(name.encode("utf-8")).digest()[0] % BUCKETS


def new_secret(signing: Scheme | str = Scheme.HMAC_SHA256) -> str:
    """A new signing key: a ``whsec_`` secret, or an ed25519 ``whsk_`` key
    (poller/rules/signing.py)."""
    return new_key(signing)


@dataclass(frozen=True, slots=True)
class CreatedEndpoint:
    endpoint: Endpoint
    secret: str = field(repr=False)


_TENANT_LOCKS = 0x57484B54  # the first key of make_room's advisory locks (two-key form)


def make_room(conn: Connection, tenant: str, limit: int) -> None:
    """Refuse the tenant another endpoint (TenantFull) when it has ``limit`` (0: no limit).

    Call it in the transaction that makes the endpoint: it holds a transaction-level
    advisory lock on the tenant till the end, so two makes at once cannot both pass
    the count. Only makes for that tenant wait on it: no claim, completion or publish
    takes it."""
    if not limit:
        return
    conn.execute(built.lock_tenant(_TENANT_LOCKS, tenant))
    held = conn.execute(built.tenant_endpoints(tenant)).scalar_one()
    if held >= limit:
        raise TenantFull(tenant, limit)


def create_endpoint(
    conn: Conn,
    name: str,
    url: str,
    *,
    lookup_url: str | None = None,
    max_attempts: int | None = None,
    timeout: float | None = None,
    max_in_flight: int | None = None,
    secret: str | None = None,
    allow_private: bool | None = None,
    keyring: Keyring | None = None,
    on_failed_head: str = "block",
    rate_limit: float | None = None,
    rate_burst: int | None = None,
    circuit_failures: int | None = None,
    circuit_cooldown: float | None = None,
    event_types: Any = None,
    tenant: str | None = None,
    payload_filter: Any = None,
    headers: Mapping[str, str] | None = None,
    retry_schedule: Sequence[float] | None = None,
    signing: str | None = None,
    max_age: float | None = None,
    client_cert: str | None = None,
    client_key: str | None = None,
    ca_bundle: str | None = None,
    trace_context: bool | None = None,
    kinds: frozenset[str] | None = None,
) -> CreatedEndpoint:
    """Create an endpoint in the caller's transaction; the generated secret is returned once.

    ``allow_private`` defaults to ``POLLER_ALLOW_PRIVATE_TARGETS``; the secret is
    stored sealed with ``keyring`` (default: POLLER_SECRETS_KEY's), if it has a key.
    ``event_types``, ``tenant`` and ``payload_filter`` say which published events
    reach it (poller/endpoints/subscriptions.py); without ``event_types``, none does.
    ``headers`` go with every delivery and lookup, sealed like the secret
    (poller/endpoints/headers.py). ``signing`` is ``hmac-sha256`` (the default) or
    ``ed25519`` (poller/rules/signing.py): then ``secret`` is a ``whsk_`` key and the
    receiver verifies with :attr:`Endpoint.public_keys`. ``max_age`` (seconds)
    ends older messages ``failed`` (``expired``) instead of sending them.
    ``client_cert``/``client_key`` (PEM) are for mutual TLS, ``ca_bundle`` (PEM)
    a private CA (poller/endpoints/tls.py); the key is sealed like the secret.
    ``url`` may name a broker (poller/rules/destinations.py): its credentials are
    sealed like the secret; ``kinds`` narrows the destinations allowed (a tenant's).
    """
    keyring = keyring or default_settings().keyring
    allow_private = check_flag(
        allow_private, "allow_private", default_settings().allow_private_targets
    )
    scheme = signing_scheme(signing, secret)
    values = {
        "name": check_name(name),
        "lookup_url": None
        if lookup_url is None
        else check_lookup_url(lookup_url, allow_private=allow_private),
        "max_attempts": positive(max_attempts, "max_attempts", integer=True),
        "timeout": check_timeout(timeout),
        "max_in_flight": positive(max_in_flight, "max_in_flight", integer=True),
        "max_age": check_max_age(max_age),
        "secret": secret if secret is not None else new_secret(scheme),
        "bucket": bucket_for(name),
        "on_failed_head": check_on_failed_head(on_failed_head) or "block",
        "trace_context": check_flag(trace_context, "trace_context", True),
        **check_health_settings(rate_limit, rate_burst, circuit_failures, circuit_cooldown),
        **check_subscription_settings(event_types, tenant, payload_filter),
    }
    values["url"], userinfo = check_destination(url, allow_private=allow_private, kinds=kinds)
    values["url_credentials"] = _sealed_credentials(userinfo, keyring)
    plain = values["secret"]
    check_key(plain)
    values["secret"] = keyring.seal(plain)
    values["headers"] = _sealed_headers(check_headers(headers), keyring)
    values.update(_tls_columns(check_tls(client_cert, client_key, ca_bundle), keyring))
    if retry_schedule is not None:
        values["retry_schedule"] = list(check_schedule(retry_schedule))
    try:
        with conn.begin_nested():
            row = conn.execute(built.create(values)).one()
    except IntegrityError as exc:
        if "uq_poller_endpoints_name" in str(exc.orig):
            raise EndpointExists(name) from None
        raise
    return CreatedEndpoint(Endpoint.from_row(row, keyring), plain)


def _tls_columns(tls: TLSSettings, keyring: Keyring) -> dict[str, Any]:
    key = None if tls.client_key is None else keyring.seal(tls.client_key)
    return {"client_cert": tls.client_cert, "client_key": key, "ca_bundle": tls.ca_bundle}


def _sealed_credentials(userinfo: str | None, keyring: Keyring) -> str | None:
    return None if userinfo is None else keyring.seal(CREDENTIALS_PLAIN + userinfo)


def _sealed_headers(headers: Headers, keyring: Keyring) -> str | None:
    stored = header_codec.dumps(headers)
    return None if stored is None else keyring.seal(stored)


def get_endpoint(conn: Conn, name: str, *, keyring: Keyring | None = None) -> Endpoint:
    """The endpoint called ``name``, or UnknownEndpoint."""
    if not could_be_name(name):
        raise UnknownEndpoint(name)
    row = conn.execute(built.by_name(name)).one_or_none()
    if row is None:
        raise UnknownEndpoint(name)
    return Endpoint.from_row(row, keyring)


def list_endpoints(
    conn: Conn,
    *,
    tenant: str | None = None,
    after: str | None = None,
    limit: int | None = None,
    keyring: Keyring | None = None,
) -> list[Endpoint]:
    """The endpoints by name (in code-point order), or ``tenant``'s, those named after
    ``after``, at most ``limit``: chosen by PostgreSQL, so a page of a tenant's opens the
    secrets of that page alone (the faces read every endpoint and opened every secret
    for each page: at 10,000 endpoints a page cost seconds)."""
    if after is not None and "\x00" in after:
        raise InvalidInput("after: a name holds no NUL")
    query = built.page(tenant, after, limit)
    return [Endpoint.from_row(row, keyring) for row in conn.execute(query).all()]


def change_one(
    conn: Conn, name: str, values: dict[str, Any], keyring: Keyring | None = None
) -> Endpoint:
    """Change the endpoint called ``name`` (``values``: its checked, sealed columns)."""
    if not could_be_name(name):
        raise UnknownEndpoint(name)
    row = conn.execute(built.change(name, values)).one_or_none()
    if row is None:
        raise UnknownEndpoint(name)
    return Endpoint.from_row(row, keyring)


def update_endpoint(
    conn: Conn,
    name: str,
    *,
    url: str | None = None,
    lookup_url: str | None = None,
    max_attempts: int | None = None,
    timeout: float | None = None,
    max_in_flight: int | None = None,
    allow_private: bool | None = None,
    on_failed_head: str | None = None,
    rate_limit: float | None = None,
    rate_burst: int | None = None,
    circuit_failures: int | None = None,
    circuit_cooldown: float | None = None,
    event_types: Any = None,
    tenant: Any = None,
    payload_filter: Any = None,
    headers: Mapping[str, str | None] | None = None,
    clear_headers: bool = False,
    keyring: Keyring | None = None,
    retry_schedule: Any = None,
    max_age: Any = None,
    client_cert: Any = None,
    client_key: str | None = None,
    ca_bundle: Any = None,
    trace_context: bool | None = None,
    kinds: frozenset[str] | None = None,
) -> Endpoint:
    """Change the given fields (None leaves a field as it is); checked like create.
    A new ``url`` closes the endpoint's circuit (poller/rules/health.py).

    A health setting given as :data:`DEFAULT` goes back to the default (no rate
    limit, the global breaker settings); so do ``tenant`` and ``payload_filter``
    (none). ``event_types=[]`` ends every subscription. A changed subscription
    applies to events published from then on; ``poller admin replay`` sends
    earlier ones. ``headers`` are merged into the endpoint's (a value of None
    removes that one); ``clear_headers`` drops them all first. A
    ``retry_schedule`` of :data:`DEFAULT` goes back to ``POLLER_RETRY_SCHEDULE``;
    a ``max_age`` of :data:`DEFAULT` removes the age limit. A new client
    certificate comes with its key; ``client_cert`` (or ``ca_bundle``) of
    :data:`DEFAULT` removes it.
    """
    allow_private = check_flag(
        allow_private, "allow_private", default_settings().allow_private_targets
    )
    changes = _sealed_changes(
        conn, name, keyring, headers, clear_headers, client_cert, client_key, ca_bundle
    )
    if url is not None:
        changes["url"], userinfo = check_destination(url, allow_private=allow_private, kinds=kinds)
        keyring = keyring or default_settings().keyring
        changes["url_credentials"] = _sealed_credentials(userinfo, keyring)
    if lookup_url is not None:
        changes["lookup_url"] = (
            None if lookup_url == "" else check_lookup_url(lookup_url, allow_private=allow_private)
        )
    for field_name, value in (("max_attempts", max_attempts), ("max_in_flight", max_in_flight)):
        if value is not None:
            changes[field_name] = positive(value, field_name, integer=True)
    if timeout is not None:
        changes["timeout"] = check_timeout(timeout)
    if on_failed_head is not None:
        changes["on_failed_head"] = check_on_failed_head(on_failed_head)
    if trace_context is not None:
        changes["trace_context"] = check_flag(trace_context, "trace_context", True)
    changes.update(
        check_health_settings(rate_limit, rate_burst, circuit_failures, circuit_cooldown)
    )
    changes.update(check_subscription_settings(event_types, tenant, payload_filter))
    changes.update(_resettable(retry_schedule=retry_schedule, max_age=max_age))
    if not changes:
        raise InvalidEndpoint("nothing to change: give at least one field")
    endpoint = change_one(conn, name, changes, keyring)
    if "url" in changes:  # a new destination: what the old one did says nothing of it
        _reset_health(conn, endpoint.id)
    return endpoint


def _sealed_changes(
    conn: Conn,
    name: str,
    keyring: Keyring | None,
    headers: Mapping[str, str | None] | None,
    clear_headers: bool,
    client_cert: Any,
    client_key: str | None,
    ca_bundle: Any,
) -> dict[str, Any]:
    """The changes to what is stored sealed (headers, the client key): checked against
    the endpoint's current values, which must open."""
    tls_given = client_cert is not None or client_key is not None or ca_bundle is not None
    if not (headers or clear_headers or tls_given):
        return {}
    keyring = keyring or default_settings().keyring
    current = get_endpoint(conn, name, keyring=keyring)
    if current.secret_error is not None:  # what is sealed could not be opened: keep it
        raise SecretUnreadable(f"endpoint {name!r}: {current.secret_error}")
    changes: dict[str, Any] = {}
    if headers or clear_headers:
        new = header_codec.merged(current.headers, headers or {}, clear=clear_headers)
        changes["headers"] = _sealed_headers(new, keyring)
    if tls_given:
        cert, key = current.client_cert, current.client_key
        if client_cert is DEFAULT:
            cert = key = None
        else:  # a renewed certificate may keep its key, and a new key needs its certificate
            cert = current.client_cert if client_cert is None else client_cert
            key = current.client_key if client_key is None else client_key
        bundle = current.ca_bundle if ca_bundle is None else ca_bundle
        bundle = None if bundle is DEFAULT else bundle
        changes.update(_tls_columns(check_tls(cert, key, bundle), keyring))
    return changes


def _resettable(**given: Any) -> dict[str, Any]:
    """The changes of settings that :data:`DEFAULT` resets (to NULL: the global one)."""
    checks = {"retry_schedule": lambda v: list(check_schedule(v)), "max_age": check_max_age}
    return {
        name: None if value is DEFAULT else checks[name](value)
        for name, value in given.items()
        if value is not None
    }


def _reset_health(conn: Conn, endpoint_id: int) -> None:
    """Close the endpoint's circuit and forget its failure streak and pause (health.py)."""
    conn.execute(queries.RESET_HEALTH, {"endpoint_id": endpoint_id})


def set_enabled(conn: Conn, name: str, enabled: bool, reason: str | None = None) -> Endpoint:
    """Enable (clearing the reason) or disable (with a reason) an endpoint.

    Enabling also closes its circuit and forgets its failure streak and any pause
    (poller/rules/health.py): an operator who turns it back on wants its backlog sent.
    """
    said = (reason or "disabled").encode("utf-8", "replace").decode("utf-8")  # lone surrogates
    said = said.replace("\x00", "\ufffd")[:1000]  # PostgreSQL stores no NUL
    values = {"enabled": enabled, "disabled_reason": None if enabled else said}
    endpoint = change_one(conn, name, values)
    if enabled:
        _reset_health(conn, endpoint.id)
    return endpoint


def _delete_empty(conn: Connection, params: Mapping[str, Any]) -> bool:
    """Delete the endpoint if it has no message (a message committed meanwhile fails the
    foreign key check: not now, then)."""
    try:
        with conn.begin_nested():
            return bool(conn.execute(queries.DELETE_EMPTY_ENDPOINT, params).all())
    except IntegrityError:
        return False


REMOVAL_MARGIN = 2.0
"""Seconds a forced removal waits past the longest lease its in-flight messages had."""
REMOVAL_WAIT_MAX = 300.0
"""The most a forced removal waits for its messages' claims to end, in seconds."""
REMOVAL_POLL = 0.05


def remove_endpoint(
    engine: Engine, name: str, *, force: bool = False, wait: float | None = None
) -> int:
    """Delete an endpoint; with ``force`` its messages too (returns how many).

    A forced removal never deletes a message in flight under a live claim, and
    waits on no lock: first the endpoint is disabled (it takes no new message, its
    subscriptions go, no poller claims its rows again) and every message no live
    claim holds is deleted; then it waits while its pollers finish the attempts
    already on the wire — each ends as its attempt says and is deleted then; a
    claim whose lease expired is deleted at once, its late outcome fenced out —
    and deletes the endpoint once it has no message left. It waits at most the
    longest lease one of its messages had, plus :data:`REMOVAL_MARGIN` (or
    ``wait`` seconds); a message still held then (another transaction has it
    locked) ends the call with :class:`EndpointBusy`, the endpoint left disabled
    and "being removed" for a later call to finish.
    """
    with engine.begin() as conn:
        endpoint = get_endpoint(conn, name)
        count = conn.execute(built.messages_of(endpoint.id)).scalar_one()
        if count and not force:
            raise EndpointInUse(
                f"endpoint {name!r} has {count} messages: remove it with force to delete "
                "them too (force=True, --force, ?force=true)"
            )
        if count:
            conn.execute(queries.START_REMOVAL, {"endpoint_id": endpoint.id})
    deleted, deadline = 0, None
    params = {"endpoint_id": endpoint.id}
    while True:
        with engine.begin() as conn:
            step = conn.execute(queries.DELETE_UNCLAIMED_MESSAGES, params).one()
            deleted += int(step.deleted)
            if not step.remaining and _delete_empty(conn, params):
                return deleted
        now = time.monotonic()
        if deadline is None:
            left = max(float(step.lease_left or 0), 0.0) + REMOVAL_MARGIN
            deadline = now + min(left if wait is None else wait, REMOVAL_WAIT_MAX)
        if now >= deadline:
            raise EndpointBusy(
                f"endpoint {name!r}: {step.remaining} of its messages are still held (in "
                "flight, or locked by another transaction); it stays disabled — remove it "
                "again to finish"
            )
        time.sleep(REMOVAL_POLL)
