"""The management API, ``/api/v1``: JSON in and out, served by ``poller dashboard``.

**Who.** ``Authorization: Bearer wpt_…``, an API token (poller/tokens.py), or the
dashboard's operator credentials (its token or basic user), which act as ``admin``.
Only the ``Authorization`` header counts: the dashboard's session cookie does not,
so no other site can make a logged-in browser call the API. Wrong credentials are
counted by the dashboard's throttle, and answered 429 past it.

**Tenants.** A ``tenant:NAME`` token sees NAME's endpoints alone: any other answers
404, the answer a name that does not exist gets, so no other tenant's names leak;
it publishes as NAME, and only as NAME.

**Changes** take a JSON body (``Content-Type: application/json``, 415 otherwise):
a form another site's page posts cannot be one, and a script of another origin
cannot send one without the CORS preflight this API never answers, so a browser
that holds the operator's basic credentials cannot be made to change anything.
A read-only token or dashboard changes nothing (403).

**Throttled per token** (per operator, for the dashboard's credentials):
``POLLER_API_RATE_LIMIT`` requests a second, in bursts of twice that, then 429 with
``Retry-After`` (:class:`poller.dashboard.rest.Limits`; each process counts its own).

**Errors** are ``application/problem+json`` (RFC 9457: ``type``, ``title``,
``status``, ``detail``), never a page or a traceback: 401 without valid
credentials, 403 for a change by a read-only caller, 404 for what does not exist
(or is another tenant's), 409 for an idempotency key used with other content, 413
for a body past the payload limit, 422 for input that cannot be used, 503 while
the database is away.

**Lists** are pages of at most ``limit`` (1 to 500, default 100), in name order;
``next`` is the ``after`` that asks for the following page (None: the last one).

Fields are named as in the Python API (an endpoint's: poller/endpoint_view.py).
"""

from __future__ import annotations

from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from poller import admin, catalog, parse
from poller.cancel import cancel_messages
from poller.dashboard import api_endpoints as ep
from poller.dashboard.rest import (
    TEXT,
    Caller,
    api,
    as_json,
    fields_of,
    json_body,
    page_of,
    problem,
    visible,
)
from poller.dashboard.web import dashboard
from poller.errors import (
    InvalidInput,
    MessageNotFound,
    UnknownEndpoint,
)
from poller.fanout import publish

EVENT_FIELDS = {"event_type", "payload", "idempotency_key", "tenant", "ordering_key"}
BODY_SLACK = 64 * 1024  # what an event's body may hold besides its payload


ATTEMPT_FIELDS = ("attempt", "kind", "outcome", "started_at", "duration_ms", "status_code",
                  "error_class", "error_message", "response_excerpt")  # fmt: skip


@api
async def messages(request: Request, caller: Caller) -> Response:
    """Messages newest first, by endpoint, status, event type and creation (``since``,
    ``until``: ``1h`` ago or an ISO time); ``after``: the ``next`` of the previous page."""
    after, limit = page_of(request)
    before = parse.row_id(after) if after is not None else None
    query = request.query_params
    name = query.get("endpoint")
    if name is not None:
        await visible(request, caller, name)
    since, until = (parse.moment(query[k]) if k in query else None for k in ("since", "until"))
    found = await dashboard(request).read(
        lambda conn: admin.list_messages(
            conn, endpoint=name, status=query.get("status"), event_type=query.get("event_type"),
            tenant=caller.scope.tenant, since=since, until=until, before=before,
            limit=limit + 1,
        )
    )  # fmt: skip
    page = found[:limit]
    more = len(found) > limit
    return JSONResponse(
        {"data": [as_json(m) for m in page], "next": str(page[-1]["id"]) if more else None}
    )


@api
async def message(request: Request, caller: Caller) -> Response:
    """One message, its payload and every attempt, oldest first."""
    message_id = await _own_message(request, caller)
    found = await dashboard(request).read(lambda conn: admin.message_detail(conn, message_id))
    shown = {k: found[k] for k in (*admin.MESSAGE_FIELDS, "endpoint", "payload")}
    shown["attempts_log"] = [{k: a[k] for k in ATTEMPT_FIELDS} for a in found["attempts_log"]]
    return JSONResponse(as_json(shown))


CATALOG_FIELDS: dict[str, tuple[type, ...]] = {
    "description": TEXT, "schema": (dict,), "deprecated": (bool,),
    "example": (dict, list, str, int, float, bool),
}  # fmt: skip


@api
async def event_types(request: Request, caller: Caller) -> Response:
    """The catalog (poller/catalog.py), for every caller: what may be published."""
    found = await dashboard(request).read(catalog.list_event_types)
    return JSONResponse({"data": [as_json(t.public()) for t in found], "next": None})


@api
async def event_type(request: Request, caller: Caller) -> Response:
    """One event type; ``PUT`` (an admin's) defines or replaces it, ``DELETE`` removes it."""
    name = request.path_params["name"]
    board = dashboard(request)
    if request.method == "GET":
        return JSONResponse(
            as_json((await board.read(lambda c: catalog.get_event_type(c, name))).public())
        )
    if caller.scope.tenant is not None:
        return problem(403, "only an admin's token changes the catalog")
    if request.method == "DELETE":

        def remove_it() -> None:
            with board.engine.begin() as conn:
                catalog.remove_event_type(conn, name)

        await run_in_threadpool(remove_it)
        return JSONResponse({"name": name, "removed": True})
    body = await json_body(request, catalog.MAX_SCHEMA_BYTES * 3)
    if isinstance(body, Response):
        return body
    fields = fields_of(body, CATALOG_FIELDS)

    def define() -> catalog.EventType:
        with board.engine.begin() as conn:
            return catalog.define_event_type(conn, name, **fields)

    return JSONResponse(as_json((await run_in_threadpool(define)).public()))


async def _own_message(request: Request, caller: Caller) -> int:
    """The id in the path, of a message the caller may see; else MessageNotFound."""
    message_id = parse.row_id(request.path_params["id"])
    found = await dashboard(request).read(lambda conn: admin.message_detail(conn, message_id))
    try:
        await visible(request, caller, found["endpoint"])
    except UnknownEndpoint:
        raise MessageNotFound(f"no message {message_id}") from None
    return message_id


@api
async def retry(request: Request, caller: Caller) -> Response:
    """Send a failed or cancelled message again, with a fresh attempt budget."""
    message_id = await _own_message(request, caller)
    board = dashboard(request)
    plan = await board.read(lambda conn: admin.plan_retry(conn, [message_id]))
    if not plan.ids:
        return problem(
            409, f"message {message_id} {plan.skipped.get(message_id, 'cannot be retried')}"
        )
    await board.act(lambda: admin.retry_messages(board.engine, plan.ids, who=f"api:{caller.who}"))
    return JSONResponse({"id": message_id, "status": "pending"})


@api
async def cancel(request: Request, caller: Caller) -> Response:
    """End a pending or waiting message as cancelled: never sent again."""
    message_id = await _own_message(request, caller)
    board = dashboard(request)
    done = await board.act(
        lambda: cancel_messages(board.engine, [message_id], who=f"api:{caller.who}")
    )
    if message_id not in done.cancelled:
        why = done.refused.get(message_id, "cannot be cancelled")
        return problem(409, f"message {message_id} not cancelled: {why}")
    return JSONResponse({"id": message_id, "status": "cancelled"})


@api
async def events(request: Request, caller: Caller) -> Response:
    """Publish one event, as :func:`poller.publish` does: to every subscribed endpoint
    of its tenant. A tenant's token publishes as its tenant."""
    board = dashboard(request)
    body = await json_body(request, board.settings.max_payload_bytes + BODY_SLACK)
    if isinstance(body, Response):
        return body
    unknown = sorted(set(body) - EVENT_FIELDS)
    if unknown:
        raise InvalidInput(f"unknown fields: {', '.join(k[:40] for k in unknown[:5])}")
    missing = sorted({"event_type", "payload", "idempotency_key"} - set(body))
    if missing:
        raise InvalidInput(f"missing fields: {', '.join(missing)}")
    tenant = body.get("tenant")
    if caller.scope.tenant is not None:
        if tenant not in (None, caller.scope.tenant):
            raise InvalidInput(f"a {caller.scope} token publishes as {caller.scope.tenant}")
        tenant = caller.scope.tenant
    keyed = request.headers.get("idempotency-key")
    if keyed is not None and keyed != body["idempotency_key"]:
        raise InvalidInput("the Idempotency-Key header and idempotency_key differ")

    def write() -> Any:
        with board.engine.begin() as conn:
            return publish(
                conn,
                event_type=body["event_type"],
                payload=body["payload"],
                idempotency_key=body["idempotency_key"],
                tenant=tenant,
                ordering_key=body.get("ordering_key"),
            )

    published = await run_in_threadpool(write)
    return JSONResponse(
        {
            "event_id": published.event_id,
            "deliveries": published.deliveries,
            "created": published.created,
        },
        201 if published.created else 200,
    )


def routes() -> list[Route]:
    return [
        Route("/api/v1/events", events, methods=["POST"]),
        Route("/api/v1/event-types", event_types, methods=["GET"]),
        Route("/api/v1/event-types/{name:path}", event_type, methods=["GET", "PUT", "DELETE"]),
        Route("/api/v1/endpoints", ep.endpoints, methods=["GET"]),
        Route("/api/v1/endpoints", ep.create, methods=["POST"]),
        Route("/api/v1/endpoints/{name}/enable", ep.switch, methods=["POST"]),
        Route("/api/v1/endpoints/{name}/disable", ep.switch, methods=["POST"]),
        Route("/api/v1/endpoints/{name}/pause", ep.hold, methods=["POST"]),
        Route("/api/v1/endpoints/{name}/resume", ep.hold, methods=["POST"]),
        Route("/api/v1/endpoints/{name}/rotate-secret", ep.rotate, methods=["POST"]),
        Route("/api/v1/endpoints/{name}/test", ep.test_event, methods=["POST"]),
        Route("/api/v1/messages", messages, methods=["GET"]),
        Route("/api/v1/messages/{id}", message, methods=["GET"]),
        Route("/api/v1/messages/{id}/retry", retry, methods=["POST"]),
        Route("/api/v1/messages/{id}/cancel", cancel, methods=["POST"]),
        Route("/api/v1/endpoints/{name}", ep.endpoint, methods=["GET"]),
        Route("/api/v1/endpoints/{name}", ep.change, methods=["PATCH"]),
        Route("/api/v1/endpoints/{name}", ep.remove, methods=["DELETE"]),
    ]
