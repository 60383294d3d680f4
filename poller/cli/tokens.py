"""``poller tokens``: the management API's tokens (poller/access/tokens.py)."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

import click

from poller.cli.common import command_engine
from poller.cli.lazy import lazy
from poller.cli.output import Until, age, emit_json, iso, json_option, table

if TYPE_CHECKING:
    from poller.access import tokens as api
else:
    api = lazy("poller.access.tokens")


@click.group()
def tokens() -> None:
    """The management API's tokens: make one (shown once), list, revoke."""


@tokens.command()
@click.argument("name")
@click.option(
    "--scope",
    required=True,
    metavar="admin|tenant:NAME",
    help="admin: everything; tenant:NAME: only that tenant's endpoints and events.",
)
@click.option("--read-only", is_flag=True, help="It may read, never change anything.")
@click.option("--expires", type=Until(), help="When it stops working (30d, ISO); default never.")
@json_option
def create(name: str, scope: str, read_only: bool, expires: datetime | None, as_json: bool) -> None:
    """Make a token named NAME and print it, this once: only its hash is kept."""
    import getpass

    scoped = api.Scope.parse(scope)
    engine = command_engine()
    with engine.begin() as conn:
        made, token = api.create_token(
            conn, name, scoped, read_only=read_only, expires=expires, created_by=getpass.getuser()
        )
    if as_json:
        emit_json({"token": token, **made.public()})
        return
    click.echo(token)
    rights = "read-only, " if made.read_only else ""
    until = f"until {iso(made.expires_at)}" if made.expires_at else "no expiry"
    click.echo(f"token {made.name!r}: {made.scope}, {rights}{until}. It is shown this once: "
               "keep it in your secret store.", err=True)  # fmt: skip


@tokens.command(name="list")
@json_option
def list_(as_json: bool) -> None:
    """Every token (never the token itself), revoked and expired ones too."""
    engine = command_engine()
    with engine.connect() as conn:
        found = api.list_tokens(conn)
    if as_json:
        emit_json([t.public() for t in found])
        return
    table(
        None,
        ["name", "scope", "rights", "state", "created", "expires", "last used"],
        [
            (
                t.name,
                str(t.scope),
                "read" if t.read_only else "read, write",
                t.state(),
                age(t.created_at),
                iso(t.expires_at) or "never",
                age(t.last_used_at) if t.last_used_at else "never",
            )
            for t in found
        ],
    )


@tokens.command()
@click.argument("name")
@json_option
def revoke(name: str, as_json: bool) -> None:
    """Revoke the token NAME: its next request is refused. Its name stays taken."""
    engine = command_engine()
    with engine.begin() as conn:
        revoked = api.revoke_token(conn, name)
    if as_json:
        emit_json(revoked.public())
        return
    click.echo(f"revoked token {revoked.name!r} ({revoked.scope})")
