"""``poller serve`` (also ``poller dashboard``, its earlier name): the web faces — the
operator's pages, the management API and the tenant portal (poller/web) — on one
address, or the customers' apart."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from poller.cli.common import command_engine, settings_and_url, where

if TYPE_CHECKING:
    import socket

    from poller.settings import Settings

FACES = ("dashboard", "api", "portal")  # poller/web/app.py FACES, without its import


def _faces(_ctx: click.Context, _param: click.Parameter, given: str | None) -> tuple[str, ...]:
    if given is None:
        return FACES
    chosen = tuple(dict.fromkeys(f.strip() for f in given.split(",") if f.strip()))
    unknown = [f for f in chosen if f not in FACES]
    if unknown or not chosen:
        raise click.BadParameter(f"a comma-separated selection of {', '.join(FACES)}")
    return chosen


@click.command()
@click.option("--addr", help="host:port to serve on (default: POLLER_DASHBOARD_ADDR).")
@click.option(
    "--faces",
    callback=_faces,
    metavar="dashboard,api,portal",
    help="What this address serves (default: all three). With POLLER_PORTAL_ADDR set, the "
    "portal and the API are served there as well, and the portal only there.",
)
def serve(addr: str | None, faces: tuple[str, ...]) -> None:
    """Serve the web faces: the operator's dashboard (queue, failures, endpoints, leases;
    retry and replay), the management API (/api/v1) and the tenant portal (/portal).

    The dashboard shows payloads, so it always asks for credentials:
    POLLER_DASHBOARD_TOKEN, or POLLER_DASHBOARD_USER and POLLER_DASHBOARD_PASSWORD, or
    (embedded server) the token it keeps in the data folder and prints here. To publish
    only what customers use, set POLLER_PORTAL_ADDR (the portal and the API, on their
    own address) or run one process per address with --faces."""
    from poller.settings import load_settings
    from poller.web.serve import DEFAULT_ADDR, bind, build, credentials, loopback, serve

    settings, url = settings_and_url()
    if addr is not None:
        settings = load_settings(dashboard_addr=addr)  # the setting's own check
    address = addr or settings.dashboard_addr or DEFAULT_ADDR
    listeners: list[tuple[str, str, tuple[str, ...]]] = []  # (address, setting, faces)
    portal_addr = settings.portal_addr
    if portal_addr is not None and ("portal" in faces or "api" in faces):
        apart = tuple(f for f in ("portal", "api") if f in faces)
        listeners.append((portal_addr, "POLLER_PORTAL_ADDR", apart))
        faces = tuple(f for f in faces if f != "portal")
    if faces:
        listeners.insert(0, (address, "POLLER_DASHBOARD_ADDR", faces))
    engine = command_engine()
    creds = credentials(settings)
    socks = [bind(at, setting) for at, setting, _ in listeners]
    served = {}
    for sock, (_, _, chosen) in zip(socks, listeners, strict=True):
        base = _base(sock)
        served[sock.getsockname()[1]] = (base.removeprefix("http://"), chosen)
        click.echo(f"{' + '.join(chosen)} for {where(settings, url)} on {base}/")
        if "dashboard" in chosen:
            _how_to_log_in(settings, creds, base)
        if not loopback(str(sock.getsockname()[0])) and "dashboard" in chosen:
            click.echo(
                f"warning: serving payloads on {base} over plain HTTP: put TLS in front of it",
                err=True,
            )
    serve(build(settings, url, engine, creds, served), socks)


def _base(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}"


def _how_to_log_in(settings: Settings, creds: Any, base: str) -> None:
    """How the operator gets in (``creds``: poller/web/auth.py Credentials)."""
    if creds.token_file is not None:
        click.echo(f"open {base}/login?token={creds.token}  (token in {creds.token_file})")
    elif creds.token is not None:
        click.echo("log in with POLLER_DASHBOARD_TOKEN")
    if creds.basic:
        click.echo("HTTP basic: POLLER_DASHBOARD_USER / POLLER_DASHBOARD_PASSWORD")
    if settings.dashboard_read_only:
        click.echo("read-only: no retry, replay, enable or disable")
