"""``poller endpoints …``: destinations, their secrets and their health."""

from __future__ import annotations

import getpass
import logging
import socket
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import click

from poller.cli import holds
from poller.cli.common import command_engine
from poller.cli.endpoint_options import (
    header_changes,
    header_option,
    limit_options,
    signing_option,
    subscription_changes,
    subscription_options,
    tls_options,
)
from poller.cli.endpoint_view import percent, public, rate, shown_field, state
from poller.cli.lazy import lazy
from poller.cli.output import (
    Duration,
    age,
    confirm,
    emit_json,
    iso,
    json_option,
    safe_text,
    table,
    yes_option,
)
from poller.observe import logs
from poller.rules.health import DEFAULT

if TYPE_CHECKING:
    from poller import settings as config
    from poller.endpoints import keys
    from poller.endpoints import registry as api
    from poller.operate import stats
    from poller.rules import keyring
else:
    api = lazy("poller.endpoints.registry")
    keys = lazy("poller.endpoints.keys")
    stats = lazy("poller.operate.stats")
    keyring = lazy("poller.rules.keyring")
    config = lazy("poller.settings")

audit = logging.getLogger("poller.audit")
PLAIN_TEXT_NOTE = (
    "signing secrets stored in plain text; set {key} and run "
    "'poller endpoints rotate-key' to encrypt them (see the docs, Secrets at rest)"
)


@click.group()
def endpoints() -> None:
    """Webhook destinations: add, inspect, enable/disable, rotate secrets, remove."""


@endpoints.command()
@click.argument("name")
@click.argument("url")
@limit_options
@subscription_options
@header_option
@signing_option
@tls_options
@json_option
def add(
    name: str,
    url: str,
    lookup_url: str | None,
    max_attempts: int | None,
    timeout: float | None,
    max_in_flight: int | None,
    on_failed_head: str | None,
    event_types: str | None,
    tenant: str | None,
    payload_filter: str | None,
    header: tuple[str, ...],
    headers_from: tuple[str, ...],
    signing: str | None,
    as_json: bool,
    **health: Any,
) -> None:
    """Create an endpoint; its signing secret (or, with --signing ed25519, its public key)
    is printed once, here.

    URL is an http(s) URL, or a broker's: nats://HOST:PORT/SUBJECT (JetStream),
    amqp(s)://USER:PASS@HOST/VHOST?exchange=E&routing_key=K (RabbitMQ),
    redis(s)://HOST:PORT/DB?stream=NAME (a Redis stream); a broker URL's credentials
    are stored sealed and never shown (docs/how-to/brokers.md)."""
    engine = command_engine()
    health = {k: (None if v is DEFAULT else v) for k, v in health.items()}
    subscription = {
        k: None if v is DEFAULT else v
        for k, v in subscription_changes(event_types, tenant, payload_filter).items()
    }
    with engine.begin() as conn:
        created = api.create_endpoint(
            conn,
            name,
            url,
            lookup_url=lookup_url,
            max_attempts=max_attempts,
            timeout=timeout,
            max_in_flight=max_in_flight,
            on_failed_head=on_failed_head or "block",
            headers={
                k: v
                for k, v in header_changes(header + headers_from, removals=False).items()
                if v is not None
            },
            signing=signing,
            **health,
            **subscription,
        )
    public_keys = created.endpoint.public_keys
    if as_json:  # an ed25519 key never leaves: the receiver needs only its public key
        emit_json(
            {**public(created.endpoint), **({} if public_keys else {"secret": created.secret})}
        )
        return
    click.echo(f"endpoint {name} created → {created.endpoint.url}")
    if public_keys:
        click.echo(f"public key (give it to the receiver; it verifies v1a): {public_keys[0]}")
    else:
        click.echo(f"signing secret (shown once, give it to the receiver): {created.secret}")


@endpoints.command()
@click.argument("name")
@click.option("--url")
@limit_options
@subscription_options
@header_option
@click.option("--clear-headers", is_flag=True, help="Drop every header (before any --header).")
@tls_options
@json_option
def update(
    name: str,
    url: str | None,
    lookup_url: str | None,
    max_attempts: int | None,
    timeout: float | None,
    max_in_flight: int | None,
    on_failed_head: str | None,
    event_types: str | None,
    tenant: str | None,
    payload_filter: str | None,
    header: tuple[str, ...],
    headers_from: tuple[str, ...],
    clear_headers: bool,
    as_json: bool,
    **health: Any,
) -> None:
    """Change an endpoint's URL, lookup URL, limits, subscriptions or headers (--lookup-url ''
    removes it; a health setting given as 'default' goes back to the default;
    --events, --tenant or --filter '' clears it; --header 'NAME:' removes that header)."""
    with command_engine().begin() as conn:
        endpoint = api.update_endpoint(
            conn,
            name,
            url=url,
            lookup_url=lookup_url,
            max_attempts=max_attempts,
            timeout=timeout,
            max_in_flight=max_in_flight,
            on_failed_head=on_failed_head,
            headers=header_changes(header + headers_from, removals=True),
            clear_headers=clear_headers,
            **health,
            **subscription_changes(event_types, tenant, payload_filter),
        )
    if as_json:
        emit_json(public(endpoint))
    else:
        click.echo(f"endpoint {name} updated")


@endpoints.command(name="list")
@json_option
def list_(as_json: bool) -> None:
    """Every endpoint (never its secret)."""
    with command_engine().connect() as conn:
        found = api.list_endpoints(conn)
    if as_json:
        emit_json([public(e) for e in found])
        return
    table(
        "endpoints",
        ["name", "url", "enabled", "events", "tenant", "max attempts", "in flight", "secret"],
        [
            (
                e.name,
                e.url,
                "yes" if e.enabled else f"no: {e.disabled_reason}",
                ",".join(e.event_types) or "-",
                e.tenant or "-",
                e.max_attempts or "default",
                e.max_in_flight or "default",
                "encrypted" if e.secret_sealed else "plain text",
            )
            for e in found
        ],
    )
    plain = sum(1 for e in found if not e.secret_sealed)
    if plain:
        click.echo(
            f"note: {plain} of {len(found)} {PLAIN_TEXT_NOTE.format(key=keyring.ENV_NAME)}",
            err=True,
        )


@endpoints.command()
@click.argument("name")
@json_option
def show(name: str, as_json: bool) -> None:
    """One endpoint and its health (never its secret)."""
    with command_engine().connect() as conn:
        endpoint = api.get_endpoint(conn, name)
        health = stats.endpoint_health(conn, endpoint.id)
    document = {**public(endpoint), "health": health}
    if as_json:
        emit_json(document)
        return
    rows = [(k, shown_field(k, v)) for k, v in public(endpoint).items()]
    rows += [
        ("last success", f"{iso(health['last_success'])} ({age(health['last_success'])})"),
        ("failures since last success", health["failures_since_last_success"]),
        (
            "messages",
            ", ".join(f"{k} {v}" for k, v in sorted(health["messages"].items())) or "none",
        ),
    ]
    table(f"endpoint {name}", ["field", "value"], rows)


@endpoints.command(name="health")
@click.argument("name", required=False)
@json_option
def health_(name: str | None, as_json: bool) -> None:
    """Circuit, failure streak, success ratios and rate limit of every endpoint (or NAME)."""
    with command_engine().connect() as conn:
        report = stats.health_report(conn, name)
    if as_json:
        emit_json(report if name is None else report[0])
        return
    table(
        "endpoint health" if name is None else f"endpoint {name} health",
        ["name", "state", "failures", "last success", "ok 1h", "ok 24h", "rate", "pending"],
        [
            (
                r["name"],
                state(r),
                r["consecutive_failures"],
                age(r["last_success_at"]),
                percent(r["success_ratio_1h"], r["sends_1h"]),
                percent(r["success_ratio_24h"], r["sends_24h"]),
                rate(r),
                r["pending"],
            )
            for r in report
        ],
    )
    for r in report:
        if r["last_error"] and (r["circuit"] != "closed" or r["consecutive_failures"]):
            click.echo(f"{r['name']}: last error {safe_text(r['last_error'])}", err=True)


@endpoints.command()
@click.argument("name")
def enable(name: str) -> None:
    """Deliver to it again: closes its circuit; its waiting messages resume."""
    with command_engine().begin() as conn:
        api.set_enabled(conn, name, True)
    click.echo(f"endpoint {name} enabled")


@endpoints.command()
@click.argument("name")
@click.option("--reason", default="disabled by an operator", show_default=True)
@yes_option
def disable(name: str, reason: str, yes: bool) -> None:
    """Stop delivering to it; its messages wait (nothing is lost)."""
    confirm(f"disable endpoint {name}?", yes)
    with command_engine().begin() as conn:
        endpoint = api.set_enabled(conn, name, False, reason)
    click.echo(f"endpoint {name} disabled: {safe_text(endpoint.disabled_reason or '')}")


@endpoints.command(name="rotate-secret")
@click.argument("name")
@click.option(
    "--keep-old-for",
    type=Duration(),
    default="24h",
    show_default=True,
    help="How long the old secret keeps signing too.",
)
@signing_option
@yes_option
@json_option
def rotate_secret(
    name: str, keep_old_for: timedelta, signing: str | None, yes: bool, as_json: bool
) -> None:
    """A new signing secret, printed once (for ed25519, its public key); the old one also
    signs for a while. --signing changes the scheme, both signing during the overlap."""
    confirm(f"rotate the secret of endpoint {name}?", yes)
    with command_engine().begin() as conn:
        endpoint, secret = keys.rotate_secret(conn, name, keep_old_for, signing=signing)
    public = endpoint.public_keys[0] if endpoint.signing == "ed25519" else None
    if as_json:
        emit_json(
            {
                "name": name,
                "signing": endpoint.signing,
                **({"public_key": public} if public else {"secret": secret}),
                "previous_secret_expires_at": endpoint.previous_secret_expires_at,
            }
        )
        return
    if public:
        click.echo(f"new public key for {name} (give it to the receiver): {public}")
    else:
        click.echo(f"new signing secret for {name} (shown once): {secret}")
    click.echo(f"the old secret also signs until {iso(endpoint.previous_secret_expires_at)}")


@endpoints.command()
@click.argument("name")
@json_option
def secret(name: str, as_json: bool) -> None:
    """Print the endpoint's current signing secret (the request is logged, the value never);
    for ed25519, the public keys a receiver verifies with (an ed25519 key never leaves)."""
    with command_engine().connect() as conn:
        endpoint = api.get_endpoint(conn, name)
    active = endpoint.signing_secrets(datetime.now(UTC))  # raises when it cannot be opened
    if endpoint.signing == "ed25519":
        if as_json:
            emit_json({"name": name, "signing": "ed25519", "public_keys": endpoint.public_keys})
        else:
            click.echo("\n".join(endpoint.public_keys))
        return
    logs.configure(config.default_settings().log_format)
    audit.warning(
        "signing secret of endpoint %s shown to %s on %s",
        name,
        getpass.getuser(),
        socket.gethostname(),
        extra={"endpoint": name, "audit": "secret_shown"},
    )
    if as_json:
        emit_json(
            {
                "name": name,
                "secret": active[0],
                "previous_secret": active[1] if len(active) > 1 else None,
                "previous_secret_expires_at": endpoint.previous_secret_expires_at
                if len(active) > 1
                else None,
            }
        )
        return
    click.echo(active[0])


@endpoints.command(name="new-key")
def new_key_() -> None:
    """Print a new key for POLLER_SECRETS_KEY (nothing is stored)."""
    click.echo(keyring.new_key())


@endpoints.command(name="rotate-key")
@click.option(
    "--plain",
    is_flag=True,
    help="Store the secrets in plain text again (to stop using POLLER_SECRETS_KEY).",
)
@yes_option
def rotate_key(plain: bool, yes: bool) -> None:
    """Encrypt every signing secret again with the first key of POLLER_SECRETS_KEY."""
    what = "store every signing secret in plain text" if plain else "re-encrypt every secret"
    confirm(f"{what}?", yes)
    with command_engine().begin() as conn:
        count = keys.reseal_secrets(conn, plain=plain)
    how = "in plain text" if plain else f"encrypted with the first key of {keyring.ENV_NAME}"
    click.echo(f"{count} endpoints' secrets stored {how}")


@endpoints.command()
@click.argument("name")
@click.option("--force", is_flag=True, help="Delete its messages too.")
@yes_option
def remove(name: str, force: bool, yes: bool) -> None:
    """Delete an endpoint (refused while it has messages, unless --force)."""
    confirm(f"remove endpoint {name}{' and all its messages' if force else ''}?", yes)
    deleted = api.remove_endpoint(command_engine(), name, force=force)
    click.echo(f"endpoint {name} removed" + (f" with {deleted} messages" if deleted else ""))


endpoints.add_command(holds.pause)
endpoints.add_command(holds.resume)
