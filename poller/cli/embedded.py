"""``poller embedded start | stop | status``: the local servers used when no URL is set."""

from __future__ import annotations

import os
import shlex
from typing import TYPE_CHECKING

import click

from poller.cli.lazy import lazy

if TYPE_CHECKING:
    from poller import settings as config
    from poller.local import embedded as servers
else:
    servers = lazy("poller.local.embedded")
    config = lazy("poller.settings")


@click.group()
def embedded() -> None:
    """Embedded PostgreSQL and Redis under POLLER_DATA_DIR (the default without URLs)."""


@embedded.command()
@click.option("--redis/--no-redis", default=True, show_default=True)
def start(redis: bool) -> None:
    """Start them (or find them running) and print their URLs, and the dashboard's token
    (unless one is set), as shell exports: ``eval "$(poller embedded start)"`` sets them
    in this shell."""
    data_dir = servers.default_data_dir(config.load_settings().data_dir)
    database = servers.EmbeddedPostgres(data_dir).start()
    click.echo(f"export POLLER_DATABASE_URL={shlex.quote(database)}")
    if redis:
        click.echo(
            f"export POLLER_REDIS_URL={shlex.quote(servers.EmbeddedRedis(data_dir).start())}"
        )
    if not os.environ.get("POLLER_DASHBOARD_TOKEN"):  # the web faces' token, for this shell
        token = servers.dashboard_token(data_dir / servers.DASHBOARD_TOKEN_FILE)
        click.echo(f"export POLLER_DASHBOARD_TOKEN={shlex.quote(token)}")


@embedded.command()
def stop() -> None:
    """Stop both servers; their data stays in POLLER_DATA_DIR."""
    data_dir = servers.default_data_dir(config.load_settings().data_dir)
    servers.EmbeddedPostgres(data_dir).stop()
    servers.EmbeddedRedis(data_dir).stop()
    click.echo("stopped")


@embedded.command()
def status() -> None:
    """Say whether each server runs, and where."""
    data_dir = servers.default_data_dir(config.load_settings().data_dir)
    pg, redis = servers.EmbeddedPostgres(data_dir), servers.EmbeddedRedis(data_dir)
    click.echo(f"postgresql: {pg.url() if pg.port else 'stopped'} ({pg.pgdata})")
    click.echo(f"redis:      {redis.url() if redis.port else 'stopped'} ({redis.dir})")
