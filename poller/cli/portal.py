"""``poller portal-link``: a short-lived link to one tenant's portal (poller/access/portal.py)."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

import click

from poller.cli.lazy import lazy
from poller.cli.output import Duration, emit_json, json_option

if TYPE_CHECKING:
    from poller import settings as config
    from poller.access import portal
else:
    portal = lazy("poller.access.portal")
    config = lazy("poller.settings")


@click.command(name="portal-link")
@click.argument("tenant")
@click.option("--expires", type=Duration(), default="15m", show_default=True,
              help="How long the link may be opened, once (at most 1d).")  # fmt: skip
@click.option("--base-url", metavar="URL",
              help="Where tenants reach the portal (default: POLLER_PORTAL_URL).")  # fmt: skip
@json_option
def portal_link(tenant: str, expires: timedelta, base_url: str | None, as_json: bool) -> None:
    """Print a short-lived link that opens one tenant's webhook portal, once."""
    link = portal.portal_link(tenant, expires, settings=config.load_settings(), base_url=base_url)
    if as_json:
        emit_json({"url": link})
        return
    click.echo(link)
