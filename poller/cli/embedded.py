"""``poller embedded start | stop | status``: the local servers used when no URL is set."""

from __future__ import annotations

import click

from poller.embedded import EmbeddedPostgres, EmbeddedRedis, default_data_dir
from poller.settings import load_settings


@click.group()
def embedded() -> None:
    """Embedded PostgreSQL and Redis under POLLER_DATA_DIR (the default without URLs)."""


@embedded.command()
@click.option("--redis/--no-redis", default=True, show_default=True)
def start(redis: bool) -> None:
    """Start them (or find them running) and print their URLs."""
    data_dir = default_data_dir(load_settings().data_dir)
    click.echo(f"POLLER_DATABASE_URL={EmbeddedPostgres(data_dir).start()}")
    if redis:
        click.echo(f"POLLER_REDIS_URL={EmbeddedRedis(data_dir).start()}")


@embedded.command()
def stop() -> None:
    """Stop both servers; their data stays in POLLER_DATA_DIR."""
    data_dir = default_data_dir(load_settings().data_dir)
    EmbeddedPostgres(data_dir).stop()
    EmbeddedRedis(data_dir).stop()
    click.echo("stopped")


@embedded.command()
def status() -> None:
    """Say whether each server runs, and where."""
    data_dir = default_data_dir(load_settings().data_dir)
    pg, redis = EmbeddedPostgres(data_dir), EmbeddedRedis(data_dir)
    click.echo(f"postgresql: {pg.url() if pg.port else 'stopped'} ({pg.pgdata})")
    click.echo(f"redis:      {redis.url() if redis.port else 'stopped'} ({redis.dir})")
