"""``poller event-types``: the event-type catalog (poller/outbox/catalog.py) — list, show,
define (description, JSON Schema, example, deprecated) and remove."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from poller.cli.common import command_engine
from poller.cli.lazy import lazy
from poller.cli.output import age, emit_json, json_option, table
from poller.rules.payloads import loads

if TYPE_CHECKING:
    from poller.outbox import catalog
else:
    catalog = lazy("poller.outbox.catalog")

MAX_FILE = 3 * 64 * 1024  # a schema's limit, and room for an example


def _json(value: str, option: str) -> Any:
    """JSON text, or ``@file`` holding it; a usage error (exit 2) otherwise."""
    text = value
    if value.startswith("@"):
        path = value[1:]
        if "\x00" in path:
            raise click.BadParameter(
                f"cannot read {path!r}: No such file or directory", param_hint=option
            )
        try:
            with open(Path(path), "rb") as source:
                raw = source.read(MAX_FILE + 1)
        except OSError as exc:
            raise click.BadParameter(
                f"cannot read {path!r}: {exc.strerror}", param_hint=option
            ) from None
        if len(raw) > MAX_FILE:
            raise click.BadParameter(f"{path!r} is over {MAX_FILE} bytes", param_hint=option)
        text = raw.decode("utf-8", "replace")
    try:
        return loads(text)
    except (ValueError, RecursionError) as exc:
        raise click.BadParameter(f"not JSON: {str(exc)[:120]}", param_hint=option) from None


@click.group(name="event-types")
def event_types() -> None:
    """The event-type catalog: what may be published, each type's JSON Schema."""


@event_types.command(name="list")
@json_option
def list_(as_json: bool) -> None:
    """Every event type of the catalog."""
    with command_engine().connect() as conn:
        found = catalog.list_event_types(conn)
    if as_json:
        emit_json([t.public() for t in found])
        return
    table(None, ["name", "schema", "deprecated", "updated", "description"], [
        (t.name, "yes" if t.schema else "no", "yes" if t.deprecated else "",
         age(t.updated_at), t.description)
        for t in found
    ])  # fmt: skip


@event_types.command()
@click.argument("name")
@json_option
def show(name: str, as_json: bool) -> None:
    """One event type, its schema and example."""
    with command_engine().connect() as conn:
        found = catalog.get_event_type(conn, name)
    if as_json:
        emit_json(found.public())
        return
    click.echo(f"{found.name}{' (deprecated)' if found.deprecated else ''}: {found.description}")
    if found.schema is not None:
        click.echo("schema: " + json.dumps(found.schema, indent=2))
    if found.example is not None:
        click.echo("example: " + json.dumps(found.example, indent=2))


@event_types.command()
@click.argument("name")
@click.option("--description", default="", help="What it means, for subscribers.")
@click.option(
    "--schema", metavar="JSON|@FILE", help="A JSON Schema (2020-12) its payloads must match."
)
@click.option("--example", metavar="JSON|@FILE", help="A payload; it must match the schema.")
@click.option("--deprecated", is_flag=True, help="Still published; the portal no longer offers it.")
@json_option
def define(name: str, description: str, schema: str | None, example: str | None,
           deprecated: bool, as_json: bool) -> None:  # fmt: skip
    """Add NAME to the catalog, or replace its entry (publishes are checked from now on)."""
    shape = _json(schema, "--schema") if schema is not None else None
    sample = _json(example, "--example") if example is not None else None
    with command_engine().begin() as conn:
        made = catalog.define_event_type(conn, name, description=description, schema=shape,
                                         example=sample, deprecated=deprecated)  # fmt: skip
    if as_json:
        emit_json(made.public())
        return
    click.echo(f"defined {made.name!r}{' with a schema' if made.schema else ''}")


@event_types.command()
@click.argument("name")
def remove(name: str) -> None:
    """Take NAME out of the catalog: its payloads are no longer checked."""
    with command_engine().begin() as conn:
        catalog.remove_event_type(conn, name)
    click.echo(f"removed {name!r} from the catalog")
