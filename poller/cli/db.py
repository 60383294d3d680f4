"""``poller db upgrade | current``: schema migrations from the installed package."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from poller.cli.common import settings_and_url, where
from poller.cli.lazy import lazy

if TYPE_CHECKING:
    from poller.store import migrate
else:
    migrate = lazy("poller.store.migrate")


@click.group()
def db() -> None:
    """Database schema migrations."""


@db.command()
@click.option("--revision", default="head", show_default=True, help="Target revision.")
def upgrade(revision: str) -> None:
    """Migrate the database to the newest schema (idempotent), and set the SQL doors'
    poller.max_payload_bytes, poller.max_attempts and poller.notify to this process's
    settings."""
    settings, url = settings_and_url(create=True)
    migrate.upgrade(url, revision)
    click.echo(f"database at revision {migrate.current_revision(url)} ({where(settings, url)})")
    if migrate.current_revision(url) is not None and (
        refused := migrate.write_door_settings(url, settings)
    ):  # the SQL doors' limits: warned, not fatal (a role that migrates need not own)
        click.echo(
            f"warning: could not set the SQL doors' poller.* settings ({refused}): run "
            "ALTER DATABASE … SET poller.max_payload_bytes = … as its owner",
            err=True,
        )


@db.command()
def current() -> None:
    """Show the database's revision and whether it is the newest (exit 1 if it is not)."""
    settings, url = settings_and_url()
    revision = migrate.current_revision(url)
    head = migrate.head_revision()
    if revision == head:
        click.echo(f"{revision} (head) — {where(settings, url)}")
        return
    if revision is None:
        click.echo(f"not migrated (newest is {head}); run: poller db upgrade")
    elif migrate.newer_than_known(revision):
        click.echo(f"{revision} (newer than this version knows, {head}: upgrade webhook-poller)")
    else:
        click.echo(f"{revision} (newest is {head}; run: poller db upgrade)")
    raise SystemExit(1)
