"""``poller db upgrade | current``: schema migrations from the installed package."""

from __future__ import annotations

import click

from poller import migrate
from poller.cli.common import settings_and_url


@click.group()
def db() -> None:
    """Database schema migrations."""


@db.command()
@click.option("--revision", default="head", show_default=True, help="Target revision.")
def upgrade(revision: str) -> None:
    """Migrate the database to the newest schema (idempotent)."""
    _, url = settings_and_url()
    migrate.upgrade(url, revision)
    click.echo(f"database at revision {migrate.current_revision(url)}")


@db.command()
def current() -> None:
    """Show the database's revision and whether it is the newest."""
    _, url = settings_and_url()
    revision = migrate.current_revision(url)
    head = migrate.head_revision()
    if revision is None:
        click.echo(f"not migrated (newest is {head}); run: poller db upgrade")
    elif revision == head:
        click.echo(f"{revision} (head)")
    else:
        click.echo(f"{revision} (newest is {head}; run: poller db upgrade)")
