"""``poller enqueue`` / ``poller publish``: add one message to an endpoint, or publish one
event to its subscribers, from the command line (tests, replays, demos)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import click

from poller.cli.common import command_engine
from poller.cli.output import Duration, emit_json, json_option
from poller.errors import InvalidPayload, PayloadTooLarge


def _read(data: str) -> Any:
    try:
        return _payload(data)
    except OSError as exc:
        raise InvalidPayload(f"--data: cannot read {data[1:]!r}: {exc.strerror}") from None


def _file(path: str) -> str:
    """A payload file's text, read no further than the payload limit (``@/dev/zero`` must
    not fill the memory) and as UTF-8."""
    from poller.settings import load_settings

    limit = load_settings().max_payload_bytes
    if "\x00" in path:  # no file is named so (the OS refuses to look)
        raise InvalidPayload(f"--data: cannot read {path!r}: No such file or directory")
    with open(Path(path), "rb") as source:
        raw = source.read(limit + 1)
    if len(raw) > limit:
        raise PayloadTooLarge(f"--data @{path}: over POLLER_MAX_PAYLOAD_BYTES ({limit} bytes)")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidPayload(f"--data @{path}: not UTF-8 text (at byte {exc.start})") from None


def _payload(data: str) -> Any:
    """The --data text, sent exactly as written (a JSON object)."""
    from poller.rules import parse

    return parse.json_payload(_file(data[1:]) if data.startswith("@") else data, "--data")


@click.command()
@click.argument("endpoint")
@click.argument("event_type")
@click.option("--data", required=True, help="The JSON payload, or @file.")
@click.option("--key", required=True, help="Idempotency key.")
@click.option("--deliver-after", type=Duration(), help="Delay, e.g. 10m.")
@click.option("--ordering-key", help="Deliver after the earlier messages with this key.")
def enqueue(
    endpoint: str,
    event_type: str,
    data: str,
    key: str,
    deliver_after: timedelta | None,
    ordering_key: str | None,
) -> None:
    """Enqueue one message (committed at once)."""
    payload = _read(data)
    engine = command_engine()
    from sqlalchemy.orm import Session

    from poller import enqueue as api_enqueue

    with Session(engine) as session, session.begin():
        msg_id = api_enqueue(
            session,
            endpoint=endpoint,
            event_type=event_type,
            payload=payload,
            idempotency_key=key,
            deliver_after=deliver_after,
            ordering_key=ordering_key,
        )
    click.echo(f"message {msg_id} enqueued")


@click.command()
@click.argument("event_type")
@click.option("--data", required=True, help="The JSON payload, or @file.")
@click.option("--key", required=True, help="Idempotency key (unique within the tenant).")
@click.option("--tenant", help="Only this tenant's endpoints receive it.")
@click.option("--deliver-after", type=Duration(), help="Delay, e.g. 10m.")
@click.option("--ordering-key", help="Per endpoint, deliver after earlier events with this key.")
@json_option
def publish(
    event_type: str,
    data: str,
    key: str,
    tenant: str | None,
    deliver_after: timedelta | None,
    ordering_key: str | None,
    as_json: bool,
) -> None:
    """Publish one event to every subscribed endpoint (committed at once)."""
    payload = _read(data)
    engine = command_engine()
    from sqlalchemy.orm import Session

    from poller import publish as api_publish

    with Session(engine) as session, session.begin():
        published = api_publish(
            session,
            event_type=event_type,
            payload=payload,
            idempotency_key=key,
            tenant=tenant,
            deliver_after=deliver_after,
            ordering_key=ordering_key,
        )
    if as_json:
        emit_json(
            {
                "event_id": published.event_id,
                "created": published.created,
                "deliveries": published.deliveries,
            }
        )
        return
    reached = ", ".join(f"{name} (message {i})" for name, i in sorted(published.deliveries.items()))
    verb = "published" if published.created else "was published before with this key; nothing added"
    click.echo(
        f"event {published.event_id} {verb}: "
        + (f"{len(published.deliveries)} endpoint(s): {reached}" if reached else "no endpoint")
    )
