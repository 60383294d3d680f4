"""``poller dashboard``: the operator's web page (poller/dashboard)."""

from __future__ import annotations

import click

from poller.cli.common import command_engine, settings_and_url, where


@click.command()
@click.option("--addr", help="host:port to serve on (default: POLLER_DASHBOARD_ADDR).")
def dashboard(addr: str | None) -> None:
    """Serve the dashboard: queue, failures, endpoints, leases; retry and replay.

    It shows payloads, so it always asks for credentials: POLLER_DASHBOARD_TOKEN,
    or POLLER_DASHBOARD_USER and POLLER_DASHBOARD_PASSWORD, or (embedded server)
    the token it keeps in the data folder and prints here."""
    from poller.dashboard.serve import DEFAULT_ADDR, bind, build, credentials, loopback, serve
    from poller.settings import load_settings

    settings, url = settings_and_url()
    if addr is not None:
        settings = load_settings(dashboard_addr=addr)  # the setting's own check
    address = addr or settings.dashboard_addr or DEFAULT_ADDR
    engine = command_engine()
    creds = credentials(settings)
    sock = bind(address)
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    base = f"http://{shown}:{port}"
    click.echo(f"dashboard for {where(settings, url)} on {base}/")
    if creds.token_file is not None:
        click.echo(f"open {base}/login?token={creds.token}  (token in {creds.token_file})")
    elif creds.token is not None:
        click.echo("log in with POLLER_DASHBOARD_TOKEN")
    if creds.basic:
        click.echo("HTTP basic: POLLER_DASHBOARD_USER / POLLER_DASHBOARD_PASSWORD")
    if settings.dashboard_read_only:
        click.echo("read-only: no retry, replay, enable or disable")
    if not loopback(str(host)):
        click.echo(
            f"warning: serving payloads on {host} over plain HTTP: put TLS in front of it",
            err=True,
        )
    serve(build(settings, url, engine, creds), sock)
