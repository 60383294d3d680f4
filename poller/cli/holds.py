"""``poller admin cancel`` and ``poller endpoints pause / resume``: an operator's holds
(poller/operate/cancel.py), attached to their groups by poller/cli/admin.py and endpoints.py."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

import click

from poller.cli.common import command_engine
from poller.cli.lazy import lazy
from poller.cli.output import ROW_ID, Since, Until, confirm, emit_json, iso, json_option, yes_option
from poller.errors import NothingMatched

if TYPE_CHECKING:
    from poller.operate import cancel as api
else:
    api = lazy("poller.operate.cancel")


def _ids(ids: list[int]) -> str:
    return ", ".join(map(str, ids[:20])) + (f" … (+{len(ids) - 20})" if len(ids) > 20 else "")


@click.command()
@click.argument("ids", type=ROW_ID, nargs=-1)
@click.option("--endpoint", help="Cancel this endpoint's pending and waiting messages.")
@click.option("--event-type", help="With --endpoint: only messages of this event type.")
@click.option("--since", type=Since(), help="With --endpoint: created since (1h, ISO).")
@click.option("--until", type=Since(), help="With --endpoint: created before (1h, ISO).")
@click.option("--dry-run", is_flag=True, help="List what would be cancelled; change nothing.")
@yes_option
@json_option
def cancel(
    ids: tuple[int, ...],
    endpoint: str | None,
    event_type: str | None,
    since: datetime | None,
    until: datetime | None,
    dry_run: bool,
    yes: bool,
    as_json: bool,
) -> None:
    """End pending and waiting messages as cancelled: never sent again (in-flight ones end
    as their attempt says). Ordered keys move past them; 'admin retry' undoes it."""
    if (event_type or since or until) and not endpoint:
        raise click.UsageError("--event-type, --since and --until go with --endpoint")
    if bool(ids) == bool(endpoint):
        raise click.UsageError("give message ids, or --endpoint (not both)")
    engine = command_engine()
    where = api.CancelFilter(endpoint, event_type, since, until) if endpoint else None
    with engine.connect() as conn:
        plan = api.plan_cancel(conn, list(ids), where=where)
    document: dict[str, Any] = {
        "ids": plan.cancelled,
        "refused": {str(k): v for k, v in plan.refused.items()},
        "dry_run": dry_run,
    }
    if plan.cancelled and not dry_run:
        confirm(f"cancel {len(plan.cancelled)} message(s) for good?", yes)
        done = api.cancel_messages(engine, plan.cancelled)
        document.update(
            ids=done.cancelled,
            refused={**document["refused"], **{str(k): v for k, v in done.refused.items()}},
        )
    refused = document["refused"]
    if as_json:
        emit_json(document)
    elif document["ids"]:
        verb = "would cancel" if dry_run else "cancelled"
        click.echo(f"{verb} {len(document['ids'])}: {_ids(document['ids'])}")
        for ident, why in refused.items():
            click.echo(f"not cancelled {ident}: {why}")
    if not document["ids"]:  # one line: why nothing was (a second cancel: already so)
        reasons = "; ".join(f"{ident}: {why}" for ident, why in list(refused.items())[:5])
        raise NothingMatched(
            f"nothing cancelled: {reasons}"
            if reasons
            else "nothing matched: no pending or waiting message to cancel"
        )


@click.command()
@click.argument("name")
@click.option("--until", type=Until(), help="Resume by itself then (2h, or an ISO time).")
@json_option
def pause(name: str, until: datetime | None, as_json: bool) -> None:
    """Hold an endpoint's messages (not sent, nothing lost) until --until or 'resume'.
    Its health, attempts and circuit are left alone; for a broken endpoint, use 'disable'."""
    with command_engine().begin() as conn:
        held = api.pause_endpoint(conn, name, until=until)
    if as_json:
        emit_json(held)
        return
    click.echo(
        f"endpoint {name} paused "
        + (f"until {iso(until)}" if until else "until 'poller endpoints resume'")
    )


@click.command()
@click.argument("name")
def resume(name: str) -> None:
    """End an endpoint's pause: its messages are sent again now."""
    with command_engine().begin() as conn:
        api.resume_endpoint(conn, name)
    click.echo(f"endpoint {name} resumed")
