"""The management API, ``/api/v1``: JSON in and out, served by ``poller serve``.

**Who.** ``Authorization: Bearer wpt_…``, an API token (poller/access/tokens.py), or the
dashboard's operator credentials (its token or basic user), which act as ``admin``.
Only the ``Authorization`` header counts: the dashboard's session cookie does not,
so no other site can make a logged-in browser call the API. An API token is checked
whoever sends it (a right one is never held up by someone else's wrong ones); wrong
tokens, and wrong operator credentials (throttled before the check, as on the
pages), are counted per client address and answered 429 past the limit
(poller/web/auth.py).

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
``Retry-After`` (:class:`poller.web.auth.Limits`; each process counts its own).

**Errors** are ``application/problem+json`` (RFC 9457: ``type``, ``title``,
``status``, ``detail``), never a page or a traceback: 401 without valid
credentials, 403 for a change by a read-only caller, 404 for what does not exist
(or is another tenant's), 409 for an idempotency key used with other content, 413
for a body past the payload limit, 422 for input that cannot be used, 503 while
the database is away.

**Lists** are pages of at most ``limit`` (1 to 500, default 100), in name order;
``next`` is the ``after`` that asks for the following page (None: the last one).

Fields are named as in the Python API (an endpoint's: poller/endpoints/view.py).
"""

from __future__ import annotations

import functools
from datetime import timedelta
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from poller.errors import (
    EventNotFound,
    InvalidInput,
    MessageNotFound,
    UnknownEndpoint,
)
from poller.operate import admin
from poller.operate.cancel import cancel_messages
from poller.operate.replay import event_detail, replay
from poller.outbox import catalog
from poller.outbox.publish import publish
from poller.rules import actors, parse
from poller.rules.version import version
from poller.store.schema import STATUSES
from poller.web.api import endpoints as ep
from poller.web.api import openapi, shapes
from poller.web.api.openapi import Operation
from poller.web.api.rest import (
    PAGE,
    Caller,
    Param,
    api,
    as_json,
    page_of,
    problem,
    visible,
)
from poller.web.base import dashboard

EVENT_FIELDS = ("id", "event_type", "payload", "idempotency_key", "tenant", "ordering_key",
                "created_at")  # fmt: skip
BODY_SLACK = 64 * 1024  # what an event's body may hold besides its payload


ATTEMPT_FIELDS = ("attempt", "kind", "outcome", "started_at", "duration_ms", "status_code",
                  "error_class", "error_message", "response_excerpt")  # fmt: skip


TEXT = {"type": "string"}
MESSAGE_QUERY = (
    *PAGE,
    Param("endpoint", "Only this endpoint's", TEXT),
    Param("status", "Only those in this state", {"enum": list(STATUSES)}),
    Param("event_type", "Only those of this event type", TEXT),
    Param("since", "Made at or after: an ISO time, or a duration ago (``1h``)", TEXT),
    Param("until", "Made before: an ISO time, or a duration ago", TEXT),
)


@api(answers={200: shapes.MessagePage}, query=MESSAGE_QUERY)
async def messages(request: Request, caller: Caller, _: dict[str, Any]) -> Response:
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
    page = [_seen_by(m, caller) for m in found[:limit]]
    more = len(found) > limit
    return JSONResponse(
        {"data": [as_json(m) for m in page], "next": str(page[-1]["id"]) if more else None}
    )


def _seen_by(message: dict[str, Any], caller: Caller) -> dict[str, Any]:
    """A message as its caller may see it: a tenant sees an operator as ``operator`` in
    its last error ("cancelled by …": poller/rules/actors.py)."""
    if caller.scope.tenant is None or not message.get("last_error"):
        return message
    return {**message, "last_error": actors.seen_by(message["last_error"], caller.scope.tenant)}


@api(answers={200: shapes.MessageDetail})
async def message(request: Request, caller: Caller, _: dict[str, Any]) -> Response:
    """One message, its payload and every attempt, oldest first."""
    message_id = await _own_message(request, caller)
    found = await dashboard(request).read(lambda conn: admin.message_detail(conn, message_id))
    shown = _seen_by({k: found[k] for k in (*admin.MESSAGE_FIELDS, "endpoint", "payload")}, caller)
    shown["attempts_log"] = [{k: a[k] for k in ATTEMPT_FIELDS} for a in found["attempts_log"]]
    return JSONResponse(as_json(shown))


EVENT_TYPES_PAGE = (
    Param("after", "The ``next`` of the previous page", TEXT),
    Param("limit", "Event types a page, 1 to 100 (default 20): each may carry a schema "
          "of 64 KB and an example of 256 KB", {"type": "integer", "minimum": 1, "maximum": 100}),
)  # fmt: skip


@api(answers={200: shapes.EventTypePage}, query=EVENT_TYPES_PAGE)
async def event_types(request: Request, caller: Caller, _: dict[str, Any]) -> Response:
    """The catalog, for every caller, in name order: what may be published, and each
    type's schema — a page at a time (``next``: the ``after`` of the next page)."""
    after, limit = page_of(request, default=20, most=100)
    found = await dashboard(request).read(
        lambda conn: catalog.list_event_types(conn, after=after, limit=limit + 1)
    )
    page, more = found[:limit], len(found) > limit
    return JSONResponse(
        {"data": [as_json(t.public()) for t in page], "next": page[-1].name if more else None}
    )


@api(answers={200: shapes.EventType})
async def event_type(request: Request, caller: Caller, _: dict[str, Any]) -> Response:
    """One event type of the catalog."""
    name = request.path_params["name"]
    found = await dashboard(request).read(lambda c: catalog.get_event_type(c, name))
    return JSONResponse(as_json(found.public()))


@api(
    body=shapes.EventTypeDefinition,
    answers={200: shapes.EventType},
    limit=catalog.MAX_SCHEMA_BYTES * 3,
)
async def define(request: Request, caller: Caller, fields: dict[str, Any]) -> Response:
    """Define an event type, or replace its entry (an admin's token only)."""
    name = request.path_params["name"]
    board = dashboard(request)
    if caller.scope.tenant is not None:
        return problem(403, "only an admin's token changes the catalog")

    def write() -> catalog.EventType:
        with board.engine.begin() as conn:
            return catalog.define_event_type(conn, name, **fields)

    return JSONResponse(as_json((await run_in_threadpool(write)).public()))


@api(answers={200: shapes.EventTypeRemoved})
async def undefine(request: Request, caller: Caller, _: dict[str, Any]) -> Response:
    """Take an event type out of the catalog: its payloads are no longer checked."""
    name = request.path_params["name"]
    board = dashboard(request)
    if caller.scope.tenant is not None:
        return problem(403, "only an admin's token changes the catalog")

    def write() -> None:
        with board.engine.begin() as conn:
            catalog.remove_event_type(conn, name)

    await run_in_threadpool(write)
    return JSONResponse({"name": name, "removed": True})


async def _own_message(request: Request, caller: Caller) -> int:
    """The id in the path, of a message the caller may see; else MessageNotFound."""
    message_id = parse.row_id(request.path_params["id"])
    found = await dashboard(request).read(lambda conn: admin.message_detail(conn, message_id))
    try:
        await visible(request, caller, found["endpoint"])
    except UnknownEndpoint:
        raise MessageNotFound(f"no message {message_id}") from None
    return message_id


@api(answers={200: shapes.MessageState})
async def retry(request: Request, caller: Caller, _: dict[str, Any]) -> Response:
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


@api(answers={200: shapes.MessageState})
async def cancel(request: Request, caller: Caller, _: dict[str, Any]) -> Response:
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


@api(
    body=shapes.EventNew,
    answers={201: shapes.Published, 200: shapes.Published},
    limit=lambda board: board.settings.max_payload_bytes + BODY_SLACK,
)
async def events(request: Request, caller: Caller, body: dict[str, Any]) -> Response:
    """Publish one event, as :func:`poller.publish` does: to every subscribed endpoint
    of its tenant (201; 200 and nothing added for a key published before). A tenant's
    token publishes as its tenant. An ``Idempotency-Key`` header, if sent, must be the
    body's ``idempotency_key``."""
    board = dashboard(request)
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


async def _own_event(request: Request, caller: Caller) -> dict[str, Any]:
    """The event in the path, if the caller may see it (its tenant's); else EventNotFound."""
    event_id = parse.row_id(request.path_params["id"])
    found = await dashboard(request).read(lambda conn: event_detail(conn, event_id))
    if caller.scope.tenant is not None and found["tenant"] != caller.scope.tenant:
        raise EventNotFound(f"no event {event_id}")
    return found


@api(answers={200: shapes.Event})
async def event(request: Request, caller: Caller, _: dict[str, Any]) -> Response:
    """One published event, its payload and its delivery to each endpoint."""
    found = await _own_event(request, caller)
    shown = {k: found[k] for k in EVENT_FIELDS}
    shown["deliveries"] = found["deliveries"]
    return JSONResponse(as_json(shown))


@api(body=shapes.EventReplay, answers={200: shapes.Replayed})
async def replay_event(request: Request, caller: Caller, body: dict[str, Any]) -> Response:
    """Deliver this event to ``endpoint`` (subscribed to it now) again, or for the
    first time: 409 when it is not subscribed to it."""
    found = await _own_event(request, caller)
    target = await visible(request, caller, body["endpoint"])
    board = dashboard(request)
    at = found["created_at"]
    done = await board.act(
        lambda: replay(board.engine, target.name, since=at, until=at + timedelta(microseconds=1),
                       event_id=found["id"], who=f"api:{caller.who}")
    )  # fmt: skip
    if not done.events:
        return problem(409, f"{target.name} is not subscribed to event {found['id']}: its "
                       "event types, tenant or payload filter do not reach it")  # fmt: skip
    return JSONResponse(done.as_dict())


OPERATIONS = (
    Operation("GET", "/endpoints", ep.endpoints, "listEndpoints", "List endpoints"),
    Operation("POST", "/endpoints", ep.create, "createEndpoint", "Create an endpoint"),
    Operation("GET", "/endpoints/{name}", ep.endpoint, "getEndpoint", "Get an endpoint"),
    Operation("PATCH", "/endpoints/{name}", ep.change, "updateEndpoint", "Update an endpoint"),
    Operation("DELETE", "/endpoints/{name}", ep.remove, "deleteEndpoint", "Delete an endpoint"),
    Operation("POST", "/endpoints/{name}/enable", ep.switch, "enableEndpoint",
              "Enable an endpoint"),
    Operation("POST", "/endpoints/{name}/disable", ep.switch, "disableEndpoint",
              "Disable an endpoint"),
    Operation("POST", "/endpoints/{name}/pause", ep.pause, "pauseEndpoint",
              "Pause an endpoint's deliveries"),
    Operation("POST", "/endpoints/{name}/resume", ep.resume, "resumeEndpoint",
              "Resume an endpoint's deliveries"),
    Operation("POST", "/endpoints/{name}/rotate-secret", ep.rotate, "rotateSecret",
              "Rotate an endpoint's signing key"),
    Operation("POST", "/endpoints/{name}/test", ep.test_event, "sendTestEvent",
              "Send a test event"),
    Operation("POST", "/endpoints/{name}/replay", ep.replay_since, "replayToEndpoint",
              "Replay events to an endpoint"),
    Operation("GET", "/messages", messages, "listMessages", "List messages"),
    Operation("GET", "/messages/{id}", message, "getMessage", "Get a message and its attempts"),
    Operation("POST", "/messages/{id}/retry", retry, "retryMessage", "Retry a message"),
    Operation("POST", "/messages/{id}/cancel", cancel, "cancelMessage", "Cancel a message"),
    Operation("POST", "/events", events, "publishEvent", "Publish an event"),
    Operation("GET", "/events/{id}", event, "getEvent", "Get an event and its deliveries"),
    Operation("POST", "/events/{id}/replay", replay_event, "replayEvent",
              "Replay an event to an endpoint"),
    Operation("GET", "/event-types", event_types, "listEventTypes", "List the event-type catalog"),
    Operation("GET", "/event-types/{name:path}", event_type, "getEventType", "Get an event type"),
    Operation("PUT", "/event-types/{name:path}", define, "defineEventType", "Define an event type"),
    Operation("DELETE", "/event-types/{name:path}", undefine, "removeEventType",
              "Remove an event type"),
)  # fmt: skip
"""Every route of the API, under ``/api/v1``: what routes() serves and the OpenAPI
document describes."""


@functools.cache
def openapi_document() -> dict[str, Any]:
    return openapi.document(OPERATIONS, version())


async def openapi_json(request: Request) -> Response:
    """The OpenAPI document (poller/web/api/openapi.py), for anyone."""
    return JSONResponse(openapi_document())


def routes() -> list[Route]:
    # /event-types/{name:path} takes any name, so the fixed paths go first
    served = [Route("/api/v1/openapi.json", openapi_json, methods=["GET"])]
    return served + [Route(op.route, op.handler, methods=[op.method]) for op in OPERATIONS]
