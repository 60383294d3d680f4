"""``poller admin …``: what failed, why, and sending it again — plus stats, purge, leases."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import click

from poller.cli import holds
from poller.cli.common import command_engine, settings_and_url
from poller.cli.lazy import lazy
from poller.cli.output import (
    EVENT_ID,
    ROW_ID,
    Duration,
    Since,
    age,
    confirm,
    emit_json,
    iso,
    json_option,
    safe_json,
    table,
    yes_option,
)
from poller.errors import NothingMatched

if TYPE_CHECKING:
    from poller import settings as config
    from poller.operate import admin as api
    from poller.operate import replay
    from poller.operate import stats as stats_api
    from poller.rows import ordering
    from poller.store import db
else:
    api = lazy("poller.operate.admin")
    ordering = lazy("poller.rows.ordering")
    replay = lazy("poller.operate.replay")
    stats_api = lazy("poller.operate.stats")
    db = lazy("poller.store.db")
    config = lazy("poller.settings")


@click.group()
def admin() -> None:
    """Inspect and repair: stats, failed messages, retry, purge, leases."""


@admin.command()
@json_option
def stats(as_json: bool) -> None:
    """Counts by status and endpoint, lag, in flight, recent failures, attempt rate."""
    with command_engine().connect() as conn:
        found = stats_api.queue_stats(conn)
    if as_json:
        emit_json(found)
        return
    statuses = list(found["totals"])
    states = found["endpoint_states"]
    rows = [
        (name, *(counts[s] for s in statuses), states[name])
        for name, counts in sorted(found["endpoints"].items())
    ]
    rows.append(("all", *(found["totals"][s] for s in statuses), ""))
    table("messages", ["endpoint", *statuses, "endpoint state"], rows)
    if found["pending_held"]:
        click.echo(
            f"{found['pending_held']} pending messages wait for a disabled, paused or "
            "open-circuit endpoint ('poller endpoints health')"
        )
    lag = found["oldest_due_pending_seconds"]
    click.echo(
        f"oldest due pending: {'none' if lag is None else f'{lag:.1f}s'}   "
        f"in flight: {found['in_flight']}   failed last hour/day: "
        f"{found['failed_last_hour']}/{found['failed_last_day']}   "
        f"attempts/s (last minute): {found['attempts_per_second_last_minute']:.1f}"
    )
    if found["events_last_day"]:
        click.echo(
            f"events published last day: {found['events_last_day']}, "
            f"reaching no endpoint: {found['events_unrouted_last_day']}"
        )


@admin.command()
@click.option("--endpoint")
@click.option("--event-type")
@click.option("--since", type=Since(), help="1h, 7d or an ISO 8601 time.")
@click.option("--limit", type=click.IntRange(1, 100_000), default=50, show_default=True)
@json_option
def failed(
    endpoint: str | None, event_type: str | None, since: datetime | None, limit: int, as_json: bool
) -> None:
    """Failed messages, newest first (exit 1 when there are none)."""
    with command_engine().connect() as conn:
        rows = api.list_failed(
            conn, endpoint=endpoint, event_type=event_type, since=since, limit=limit
        )
    if as_json:
        emit_json(rows)
    else:
        table(
            f"failed messages ({len(rows)})",
            [
                "id",
                "endpoint",
                "event type",
                "key",
                "attempts",
                "last status",
                "last error",
                "failed",
            ],
            [
                (
                    r["id"],
                    r["endpoint"],
                    r["event_type"],
                    r["idempotency_key"],
                    f"{r['attempts']}/{r['max_attempts']}",
                    r["last_status_code"],
                    r["last_error"],
                    f"{iso(r['failed_at'])} ({age(r['failed_at'])})",
                )
                for r in rows
            ],
        )
    if not rows:
        raise SystemExit(1)


@admin.command()
@click.argument("message_id", type=ROW_ID, required=False)
@click.option("--key", help="Idempotency key (with --endpoint) instead of an id.")
@click.option("--endpoint")
@click.option("--event", "event_id", type=EVENT_ID, help="A published event and its deliveries.")
@click.option("--no-payload", is_flag=True, help="Leave the payload out.")
@json_option
def show(
    message_id: int | None,
    key: str | None,
    endpoint: str | None,
    event_id: int | None,
    no_payload: bool,
    as_json: bool,
) -> None:
    """One message and every attempt (or, with --event, one event and its deliveries)."""
    if event_id is not None:
        if message_id is not None or key is not None:
            raise click.UsageError("give a message id, --key or --event (one of them)")
        _show_event(event_id, no_payload, as_json)
        return
    with command_engine().connect() as conn:
        detail = api.message_detail(conn, message_id, key=key, endpoint=endpoint)
    if no_payload:
        detail.pop("payload")
    if as_json:
        emit_json(detail)
        return
    attempts = detail.pop("attempts_log")
    payload = detail.pop("payload", None)
    table(
        f"message {detail['id']}",
        ["field", "value"],
        [(k, iso(v) if isinstance(v, datetime) else v) for k, v in detail.items()],
    )
    table(
        "attempts",
        ["#", "kind", "outcome", "status", "error", "ms", "poller", "when", "response"],
        [
            (
                a["attempt"],
                a["kind"],
                a["outcome"] + (" (stale)" if a["stale"] else ""),
                a["status_code"],
                a["error_message"],
                None if a["duration_ms"] is None else f"{a['duration_ms']:.0f}",
                a["poller_id"],
                iso(a["finished_at"]),
                (a["response_excerpt"] or "")[:80],
            )
            for a in attempts
        ],
    )
    if payload is not None:
        click.echo(safe_json(payload, indent=2))


def _show_event(event_id: int, no_payload: bool, as_json: bool) -> None:
    with command_engine().connect() as conn:
        detail = replay.event_detail(conn, event_id)
    if no_payload:
        detail.pop("payload")
    if as_json:
        emit_json(detail)
        return
    deliveries = detail.pop("deliveries")
    payload = detail.pop("payload", None)
    table(
        f"event {event_id}",
        ["field", "value"],
        [(k, iso(v) if isinstance(v, datetime) else v) for k, v in detail.items()],
    )
    table(
        "deliveries",
        ["message", "endpoint", "status", "attempts", "status code", "last error", "delivered"],
        [
            (
                d["id"],
                d["endpoint"],
                d["status"],
                f"{d['attempts']}/{d['max_attempts']}",
                d["last_status_code"],
                (d["last_error"] or "")[:60],
                iso(d["delivered_at"]),
            )
            for d in deliveries
        ],
    )
    if payload is not None:
        click.echo(safe_json(payload, indent=2))


@admin.command(name="replay")
@click.option("--endpoint", required=True, help="The endpoint to deliver to.")
@click.option("--since", required=True, type=Since(), help="Published since (2h, 7d, ISO time).")
@click.option("--until", type=Since(), help="Published before (a duration ago, or ISO time).")
@click.option("--event-type", help="Only events of this type.")
@click.option(
    "--batch",
    type=click.IntRange(1, 10_000),
    default=lambda: replay.REPLAY_BATCH,  # read when the command runs (poller/cli/lazy.py)
    help="Events per transaction (default 500).",
)
@click.option("--dry-run", is_flag=True, help="Count what would be sent; change nothing.")
@yes_option
@json_option
def replay_(
    endpoint: str,
    since: datetime,
    until: datetime | None,
    event_type: str | None,
    batch: int,
    dry_run: bool,
    yes: bool,
    as_json: bool,
) -> None:
    """Deliver past published events to one endpoint again (new endpoint catching up,
    or a receiver that lost data): new deliveries, and ended ones sent again."""
    if until is not None and until <= since:
        raise click.UsageError("--until must be later than --since")
    engine = command_engine()
    if not dry_run:
        plan = replay.replay(
            engine, endpoint, since=since, until=until, event_type=event_type, dry_run=True
        )
        if not plan.events:
            _say(plan.as_dict(), as_json, "nothing to replay: no subscribed event in the window")
            raise NothingMatched("nothing matched: no event to replay")
        confirm(
            f"replay {plan.events} event(s) to {endpoint} "
            f"({plan.queued} new, {plan.resent} sent again)?",
            yes,
        )
    done = replay.replay(
        engine,
        endpoint,
        since=since,
        until=until,
        event_type=event_type,
        dry_run=dry_run,
        batch=batch,
    )
    verb = "would replay" if dry_run else "replayed"
    _say(
        done.as_dict(),
        as_json,
        f"{verb} {done.events} event(s) to {endpoint}: {done.queued} new, {done.resent} sent "
        f"again, {done.open} still open, {done.taken} key(s) taken by enqueued messages",
    )
    if not done.events:
        raise NothingMatched("nothing matched: no event to replay")


@admin.command()
@click.argument("ids", type=ROW_ID, nargs=-1)
@click.option("--all-failed", is_flag=True, help="Every failed message (with the filters).")
@click.option("--endpoint", help="With --all-failed: only this endpoint.")
@click.option("--since", type=Since(), help="With --all-failed: failed since (1h, ISO).")
@click.option("--force", is_flag=True, help="Also re-send delivered messages (same key).")
@click.option("--dry-run", is_flag=True, help="List what would be retried; change nothing.")
@yes_option
@json_option
def retry(
    ids: tuple[int, ...],
    all_failed: bool,
    endpoint: str | None,
    since: datetime | None,
    force: bool,
    dry_run: bool,
    yes: bool,
    as_json: bool,
) -> None:
    """Send messages again: back to pending now, with a fresh attempt budget."""
    if bool(ids) == all_failed:
        raise click.UsageError("give message ids, or --all-failed (not both)")
    if (endpoint or since) and not all_failed:
        raise click.UsageError("--endpoint and --since go with --all-failed")
    engine = command_engine()
    with engine.connect() as conn:
        plan = api.plan_retry(
            conn, list(ids), all_failed=all_failed, endpoint=endpoint, since=since, force=force
        )
    document = {
        "ids": plan.ids,
        "skipped": {str(k): v for k, v in plan.skipped.items()},
        "dry_run": dry_run,
    }
    if not plan.ids:
        _report(document, as_json, "nothing to retry")
        raise NothingMatched("nothing matched: no message can be retried")
    if not dry_run:
        confirm(f"send {len(plan.ids)} message(s) again?", yes)
        document["retried"] = api.retry_messages(engine, plan.ids)
    _report(
        document,
        as_json,
        f"{'would retry' if dry_run else 'retried'} {len(plan.ids)}: {_ids(plan.ids)}",
    )


@admin.command()
@click.option("--endpoint", help="Only this endpoint's keys.")
@click.option("--limit", type=click.IntRange(1, 100_000), default=100, show_default=True)
@json_option
def blocked(endpoint: str | None, limit: int, as_json: bool) -> None:
    """Ordering keys stopped behind a head that failed for good (retry or skip it)."""
    with command_engine().connect() as conn:
        found = ordering.blocked_keys(conn, endpoint=endpoint, limit=limit)
    if as_json:
        emit_json(found)
        return
    table(
        "blocked ordering keys",
        ["endpoint", "key", "head", "event type", "attempts", "last error", "waiting", "since"],
        [
            (
                k["endpoint"],
                k["ordering_key"],
                k["head_id"],
                k["event_type"],
                k["attempts"],
                (k["last_error"] or "")[:60],
                k["waiting"],
                age(k["blocked_since"]),
            )
            for k in found
        ],
    )
    if found:
        click.echo("resume a key: poller admin retry HEAD; move past it: poller admin skip HEAD")


@admin.command()
@click.argument("ids", type=ROW_ID, nargs=-1, required=True)
@yes_option
@json_option
def skip(ids: tuple[int, ...], yes: bool, as_json: bool) -> None:
    """End ordered messages as failed so their keys move on (a blocked head, usually)."""
    confirm(f"skip {len(ids)} message(s) for good?", yes)
    with command_engine().begin() as conn:
        done = ordering.skip_messages(conn, list(ids), who=api.actor())
    refused = {str(i): "not found, not ordered, or in flight" for i in ids if i not in set(done)}
    if as_json:
        emit_json({"skipped": done, "refused": refused})
    else:
        click.echo(f"skipped {len(done)}: {_ids(done)}" if done else "nothing skipped")
        for ident, why in refused.items():
            click.echo(f"not skipped {ident}: {why}")
    if not done:
        raise NothingMatched("nothing skipped: give ids of ordered messages not in flight")


def _ids(ids: list[int]) -> str:
    return ", ".join(map(str, ids[:20])) + (f" … (+{len(ids) - 20})" if len(ids) > 20 else "")


def _say(document: dict[str, Any], as_json: bool, line: str) -> None:
    if as_json:
        emit_json(document)
    else:
        click.echo(line)


def _report(document: dict[str, Any], as_json: bool, line: str) -> None:
    if as_json:
        emit_json(document)
        return
    click.echo(line)
    for ident, why in document["skipped"].items():
        click.echo(f"skipped {ident}: {why}")


@admin.command()
@click.option("--delivered-older-than", type=Duration(), help="e.g. 7d")
@click.option("--failed-older-than", type=Duration(), help="e.g. 30d")
@click.option("--dry-run", is_flag=True, help="Count what would be deleted.")
@yes_option
@json_option
def purge(
    delivered_older_than: timedelta | None,
    failed_older_than: timedelta | None,
    dry_run: bool,
    yes: bool,
    as_json: bool,
) -> None:
    """Delete old delivered/failed messages and their attempts, in small batches.

    As the maintenance leader's purge does, it then deletes spent keys past
    POLLER_RETENTION_KEYS and events past POLLER_RETENTION_EVENTS whose rows are gone."""
    if delivered_older_than is None and failed_older_than is None:
        raise click.UsageError("give --delivered-older-than and/or --failed-older-than")
    engine = command_engine()
    with engine.connect() as conn:
        counts: dict[str, int] = api.purge_counts(conn, delivered_older_than, failed_older_than)
    total = sum(counts.values())
    if not dry_run and total:
        confirm(f"delete {total} messages and their attempts?", yes)
        from poller.service import maintenance

        settings = config.default_settings()
        plan = maintenance.retention_plan(
            delivered_age=delivered_older_than.total_seconds() if delivered_older_than else None,
            failed_age=failed_older_than.total_seconds() if failed_older_than else None,
            keys_age=settings.retention_keys,
            events_age=settings.retention_events,
        )
        counts = maintenance.purge(engine, plan)
    if as_json:
        emit_json({"dry_run": dry_run, "deleted" if not dry_run else "would_delete": counts})
    else:
        verb = "would delete" if dry_run else "deleted"
        click.echo(", ".join(f"{verb} {n} {status}" for status, n in counts.items()))


@admin.command()
@json_option
def leases(as_json: bool) -> None:
    """Shard leases: holder, fence, seconds left, and PostgreSQL's accepted fence."""
    import asyncio

    from poller.claim.shards import lease_holdings
    from poller.election import make_elector

    settings, url = settings_and_url()
    command_engine()  # the schema check, and a clear error if the database is away

    async def read() -> list[Any]:
        engine = db.async_engine(url)
        elector = make_elector(
            settings.election_backend, owner="admin", engine=engine, redis_url=settings.redis_url
        )
        try:
            return await lease_holdings(elector, engine)
        finally:
            await elector.close()
            await engine.dispose()

    rows = asyncio.run(read())
    if as_json:
        emit_json(
            [
                {
                    "key": r.key,
                    "holder": r.holder,
                    "fence": r.fence,
                    "expires_in": r.expires_in,
                    "accepted_fence": r.accepted_fence,
                }
                for r in rows
            ]
        )
        return
    table(
        f"leases ({settings.election_backend} election)",
        ["lease", "holder", "fence", "expires in", "accepted fence"],
        [
            (
                r.key,
                r.holder or "(free)",
                r.fence,
                None if r.expires_in is None else f"{r.expires_in:.1f}s",
                r.accepted_fence,
            )
            for r in rows
        ],
    )


admin.add_command(holds.cancel)
