"""The dashboard's pages and actions: each a thin face on a ``poller admin`` function."""

from __future__ import annotations

import json
import logging
from datetime import datetime
from typing import Any

from sqlalchemy import Connection
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from poller.endpoints.registry import Endpoint, get_endpoint, set_enabled
from poller.errors import InvalidInput, MessageNotFound, PollerError, UnknownEndpoint
from poller.operate import admin, stats
from poller.operate.cancel import pause_endpoint, resume_endpoint
from poller.operate.replay import replay
from poller.rows.ordering import blocked_keys
from poller.rules import parse
from poller.store import queries
from poller.web.base import action, dashboard, page, who

log = logging.getLogger("poller.web")

PAGE_SIZE = 50
CHART_W, CHART_H = 600, 120
RECENT_MINUTES = 5  # the overview's "now" rates: attempts over the last 5 minutes


def _when(value: str, what: str) -> datetime | None:
    if not value:
        return None
    try:
        return parse.moment(value)
    except InvalidInput as exc:
        raise InvalidInput(f"{what}: {exc}") from None


def _filter(params: Any) -> admin.FailedFilter:
    def text(name: str) -> str | None:
        value = str(params.get(name, "")).strip()
        if len(value) > 200 or not value.isprintable():
            raise InvalidInput(f"{name}: at most 200 printable characters")
        return value or None

    return admin.FailedFilter(
        endpoint=text("endpoint"),
        event_type=text("event_type"),
        error=text("error"),
        since=_when(str(params.get("since", "")).strip(), "since"),
        until=_when(str(params.get("until", "")).strip(), "until"),
    )


def _filter_query(raw: Any) -> dict[str, str]:
    """The filter as the query parameters it came from (for links and hidden fields)."""
    names = ("endpoint", "event_type", "error", "since", "until")
    return {n: str(raw.get(n, "")).strip() for n in names if str(raw.get(n, "")).strip()}


def _cursor(value: str) -> tuple[datetime, int] | None:
    if not value:
        return None
    when, _, ident = value.rpartition("~")
    try:
        at = datetime.fromisoformat(when)
    except ValueError:
        raise InvalidInput("before: not a page cursor") from None
    try:
        number = parse.row_id(ident)
    except InvalidInput:
        raise InvalidInput("before: not a page cursor") from None
    if at.tzinfo is None:
        raise InvalidInput("before: not a page cursor")
    return at, number


def _chart(series: list[dict[str, Any]]) -> dict[str, Any]:
    """Bars for the last hour's attempts per minute, scaled to the chart box."""
    top = max([max(p["delivered"], p["failed"]) for p in series] + [1])
    width = CHART_W / max(len(series), 1)
    bars = []
    for i, p in enumerate(series):
        ok = p["delivered"] * (CHART_H - 10) / top
        bad = p["failed"] * (CHART_H - 10) / top
        bars.append(
            {
                "x": round(i * width, 1),
                "w": round(max(width / 2 - 1, 1), 1),
                "ok_y": round(CHART_H - ok, 1),
                "ok_h": round(ok, 1),
                "bad_x": round(i * width + width / 2, 1),
                "bad_y": round(CHART_H - bad, 1),
                "bad_h": round(bad, 1),
                "title": f"{p['minute']:%H:%M}: {p['delivered']} delivered, {p['failed']} failed",
            }
        )
    total_ok = sum(p["delivered"] for p in series)
    total_bad = sum(p["failed"] for p in series)
    recent = series[-RECENT_MINUTES:]  # "now": the last minutes, not the hour's average
    span = max(len(recent), 1) * 60
    return {
        "bars": bars,
        "top": top,
        "width": CHART_W,
        "height": CHART_H,
        "total": total_ok + total_bad,
        "delivered": total_ok,
        "failed": total_bad,
        "delivered_now": sum(p["delivered"] for p in recent) / span,
        "failed_now": sum(p["failed"] for p in recent) / span,
    }


# --- pages ---------------------------------------------------------------------


@page
async def overview(request: Request) -> Response:
    board = dashboard(request)

    def read(conn: Connection) -> dict[str, Any]:
        return {
            "stats": stats.queue_stats(conn, delivered=False),
            "activity": stats.activity(conn),
        }

    data = await board.read(read)
    return board.render(
        request,
        "overview.html",
        refresh=5,
        stats=data["stats"],
        chart=_chart(data["activity"]),
    )


@page
async def failed(request: Request) -> Response:
    board = dashboard(request)
    try:
        where = _filter(request.query_params)
        before = _cursor(request.query_params.get("before", ""))
    except InvalidInput as exc:
        return board.error(request, 400, str(exc))

    def read(conn: Connection) -> list[dict[str, Any]]:
        return admin.list_failed(conn, where=where, before=before, limit=PAGE_SIZE + 1)

    try:
        rows = await board.read(read)
    except UnknownEndpoint as exc:
        return board.error(request, 404, str(exc))
    more = len(rows) > PAGE_SIZE
    rows = rows[:PAGE_SIZE]
    query = _filter_query(request.query_params)
    next_page = None
    if more:
        last = rows[-1]
        next_page = {**query, "before": f"{last['failed_at'].isoformat()}~{last['id']}"}
    return board.render(
        request,
        "failed.html",
        refresh=0 if before else 5,
        rows=rows,
        query=query,
        next_page=next_page,
        first_page=before is None,
    )


def _pretty(payload: Any) -> str:
    if payload is None:
        return ""
    if isinstance(payload, str):  # a payload no value is made of (stored_payload)
        return payload
    return json.dumps(payload, indent=2, ensure_ascii=False)


def _message_id(request: Request) -> int | None:
    """The path's message id; None when no row can have it (not a number, past bigint —
    Starlette's ``int`` converter raised on 4,300 digits: a 500)."""
    try:
        return parse.row_id(request.path_params["id"])
    except InvalidInput:
        return None


async def _message(request: Request) -> dict[str, Any] | Response:
    """The message the path names, with its attempts; or the 404 page."""
    board = dashboard(request)
    message_id = _message_id(request)
    if message_id is None:
        return board.error(request, 404, f"no message {request.path_params['id']}")
    try:
        return await board.read(lambda conn: admin.message_detail(conn, message_id))
    except MessageNotFound as exc:
        return board.error(request, 404, str(exc))


@page
async def message(request: Request) -> Response:
    board = dashboard(request)
    detail = await _message(request)
    if isinstance(detail, Response):
        return detail
    return board.render(
        request,
        "message.html",
        m=detail,
        payload=_pretty(detail["payload"]),
        done=request.query_params.get("done"),
    )


@page
async def endpoint_page(request: Request) -> Response:
    """One endpoint's delivery settings and health: header names, never their values;
    TLS subjects, never the key; the public key of an ed25519 endpoint."""
    board = dashboard(request)
    name = request.path_params["name"]

    def read(conn: Connection) -> tuple[Endpoint, dict[str, Any]]:
        found = get_endpoint(conn, name)
        return found, stats.endpoint_health(conn, found.id)

    found, health = await board.read(read)
    return board.render(
        request,
        "endpoint.html",
        e=found,
        health=health,
        tls=found.tls.summary() if found.tls else None,
    )


@page
async def endpoint_list(request: Request) -> Response:
    """The endpoints by name, a page at a time (``after``: the last name of the page
    before), optionally those whose names contain ``q``: thousands of customers'
    endpoints on one page took 0.9 s to make and weighed 6.5 MB, every 5 s."""
    board = dashboard(request)
    after = request.query_params.get("after") or None
    contains = request.query_params.get("q", "").strip() or None

    def read(conn: Connection) -> list[dict[str, Any]]:
        report = stats.health_report(conn, after=after, contains=contains, limit=PAGE_SIZE + 1)
        names = [row["name"] for row in report]
        described = {r.name: r for r in conn.execute(queries.ENDPOINTS_SHOWN, {"names": names})}
        for row in report:
            info = described.get(row["name"])
            row["url"] = info.url if info else ""
            row["event_types"] = list(info.event_types or ()) if info else []
            row["tenant"] = info.tenant if info else None
        return report

    try:
        rows = await board.read(read)
    except InvalidInput as exc:
        return board.error(request, 400, str(exc))
    query = {"q": contains} if contains else {}
    next_page = {**query, "after": rows[PAGE_SIZE - 1]["name"]} if len(rows) > PAGE_SIZE else None
    return board.render(
        request,
        "endpoints.html",
        refresh=0 if after else 5,
        rows=rows[:PAGE_SIZE],
        query=query,
        next_page=next_page,
        first_page=after is None,
        done=request.query_params.get("done"),
    )


@page
async def leases(request: Request) -> Response:
    board = dashboard(request)
    rows = await board.leases() if board.leases is not None else []
    return board.render(
        request,
        "leases.html",
        refresh=5,
        rows=rows,
        backend=board.settings.election_backend,
    )


@page
async def keys(request: Request) -> Response:
    board = dashboard(request)
    rows = await board.read(lambda conn: blocked_keys(conn, limit=200))
    return board.render(request, "keys.html", refresh=5, rows=rows)


# --- actions: a confirmation page (GET), then the change (POST) -------------------


@page
async def confirm_retry_one(request: Request) -> Response:
    detail = await _message(request)
    if isinstance(detail, Response):
        return detail
    return dashboard(request).render(request, "confirm_retry.html", m=detail, count=None, query={})


@action
async def retry_one(request: Request) -> Response:
    board = dashboard(request)
    message_id = _message_id(request)
    if message_id is None:
        return board.error(request, 404, f"no message {request.path_params['id']}")
    plan = await board.read(lambda conn: admin.plan_retry(conn, [message_id]))
    if not plan.ids:
        why = plan.skipped.get(message_id, "not failed")
        return board.error(request, 409, f"message {message_id} was not retried: {why}")
    actor = who(request)
    done = await board.act(lambda: admin.retry_messages(board.engine, plan.ids, who=actor))
    log.info("dashboard: %s retried message %d", actor, message_id)
    return RedirectResponse(f"/messages/{message_id}?done=retried&n={done}", 303)


async def _plan(request: Request, params: Any) -> admin.RetryPlan | Response:
    board = dashboard(request)
    try:
        where = _filter(params)
        return await board.read(lambda conn: admin.plan_retry(conn, where=where))
    except InvalidInput as exc:
        return board.error(request, 400, str(exc))
    except UnknownEndpoint as exc:
        return board.error(request, 404, str(exc))


@page
async def confirm_retry_many(request: Request) -> Response:
    board = dashboard(request)
    plan = await _plan(request, request.query_params)
    if isinstance(plan, Response):
        return plan
    query = _filter_query(request.query_params)
    return board.render(request, "confirm_retry.html", m=None, count=len(plan.ids), query=query)


@action
async def retry_many(request: Request) -> Response:
    board = dashboard(request)
    plan = await _plan(request, request.scope["poller.form"])
    if isinstance(plan, Response):
        return plan
    actor = who(request)
    done = await board.act(lambda: admin.retry_messages(board.engine, plan.ids, who=actor))
    log.info("dashboard: %s retried %d failed messages", actor, done)
    return RedirectResponse(f"/failed?done=retried&n={done}", 303)


def _endpoint_name(request: Request) -> str:
    return str(request.path_params["name"])


def _replay_window(params: Any) -> tuple[datetime, datetime | None, str | None]:
    """A replay's since (required), until and event type, from a query or a form."""
    start = _when(str(params.get("since", "")).strip(), "since")
    if start is None:
        raise InvalidInput("since: required")
    end = _when(str(params.get("until", "")).strip(), "until")
    return start, end, str(params.get("event_type", "")).strip() or None


@page
async def confirm_endpoint(request: Request) -> Response:
    board = dashboard(request)
    verb = request.path_params["verb"]
    name = _endpoint_name(request)
    params = request.query_params
    context: dict[str, Any] = {
        "verb": verb,
        "name": name,
        "since": params.get("since", "").strip(),
        "until": params.get("until", "").strip(),
        "event": params.get("event_type", "").strip(),
        "preview": None,
    }
    if verb == "replay" and context["since"]:
        try:
            start, end, event = _replay_window(params)
            preview = await board.act(
                lambda: replay(
                    board.engine, name, since=start, until=end, event_type=event, dry_run=True
                )
            )
        except PollerError as exc:
            return board.error(request, 400, str(exc))
        context["preview"] = preview.as_dict()
    return board.render(request, "confirm_endpoint.html", **context)


@action
async def endpoint_action(request: Request) -> Response:
    board = dashboard(request)
    verb = request.path_params["verb"]
    name = _endpoint_name(request)
    actor = who(request)
    try:
        if verb == "replay":
            start, end, event = _replay_window(request.scope["poller.form"])
            result = await board.act(
                lambda: replay(
                    board.engine, name, since=start, until=end, event_type=event, who=actor
                )
            )
            log.info("dashboard: %s replayed to %s: %s", actor, name, result.as_dict())
            n = result.queued + result.resent
        elif verb in (
            "pause",
            "resume",
        ):  # poller/operate/cancel.py: until resumed, health untouched

            def hold() -> None:
                with board.engine.begin() as conn:
                    if verb == "pause":
                        pause_endpoint(conn, name, who=actor)
                    else:
                        resume_endpoint(conn, name)

            await board.act(hold)
            log.info("dashboard: %s %sd endpoint %s", actor, verb, name)
            n = 1
        else:
            enabled = verb == "enable"

            def change() -> None:
                with board.engine.begin() as conn:
                    set_enabled(conn, name, enabled, reason=f"disabled by {actor}")

            await board.act(change)
            log.info("dashboard: %s %sd endpoint %s", actor, verb, name)
            n = 1
    except UnknownEndpoint as exc:
        return board.error(request, 404, str(exc))
    except PollerError as exc:
        return board.error(request, 400, str(exc))
    return RedirectResponse(f"/endpoints?done={verb}&n={n}", 303)


def routes() -> list[Route]:
    verbs = "{verb:str}"
    return [
        Route("/", overview),
        Route("/failed", failed),
        Route("/failed/retry", confirm_retry_many, methods=["GET"]),
        Route("/failed/retry", retry_many, methods=["POST"]),
        Route("/messages/{id}", message),
        Route("/messages/{id}/retry", confirm_retry_one, methods=["GET"]),
        Route("/messages/{id}/retry", retry_one, methods=["POST"]),
        Route("/endpoints", endpoint_list),
        Route("/endpoints/{name:str}", endpoint_page),
        Route(f"/endpoints/{{name:str}}/{verbs}", _verb(confirm_endpoint), methods=["GET"]),
        Route(f"/endpoints/{{name:str}}/{verbs}", _verb(endpoint_action), methods=["POST"]),
        Route("/leases", leases),
        Route("/keys", keys),
    ]


def _verb(handler: Any) -> Any:
    async def checked(request: Request) -> Response:
        if request.path_params["verb"] not in ("enable", "disable", "replay", "pause", "resume"):
            return dashboard(request).error(request, 404, "no such action")
        response: Response = await handler(request)
        return response

    return checked
