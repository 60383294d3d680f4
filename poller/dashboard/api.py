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
``Retry-After`` (:class:`Limits`; each process counts its own).

**Errors** are ``application/problem+json`` (RFC 9457: ``type``, ``title``,
``status``, ``detail``), never a page or a traceback: 401 without valid
credentials, 403 for a change by a read-only caller, 404 for what does not exist
(or is another tenant's), 409 for an idempotency key used with other content, 413
for a body past the payload limit, 422 for input that cannot be used, 503 while
the database is away.

**Lists** are pages of at most ``limit`` (1 to 500, default 100), in name order;
``next`` is the ``after`` that asks for the following page (None: the last one).

Fields are named as in the Python API (:meth:`poller.endpoints.Endpoint.public`).
"""

from __future__ import annotations

import functools
import json
import logging
import math
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from poller import admin, catalog, parse, tokens
from poller.cancel import cancel_messages, pause_endpoint, resume_endpoint
from poller.dashboard.web import Dashboard, client_of, dashboard, identify
from poller.db import TRANSIENT
from poller.endpoint_keys import rotate_secret
from poller.endpoints import (
    Endpoint,
    create_endpoint,
    get_endpoint,
    list_endpoints,
    remove_endpoint,
    set_enabled,
    update_endpoint,
)
from poller.errors import (
    EndpointExists,
    EndpointInUse,
    IdempotencyConflict,
    InvalidInput,
    MessageNotFound,
    NotFound,
    PollerError,
    TokenRefused,
    UnknownEndpoint,
)
from poller.fanout import publish
from poller.outbox import enqueue
from poller.signing import Scheme

log = logging.getLogger("poller.api")
PROBLEM = "application/problem+json"
MAX_LIMIT = 500
TITLES = {401: "Unauthorized", 403: "Forbidden", 404: "Not Found", 409: "Conflict",
          413: "Content Too Large", 415: "Unsupported Media Type", 422: "Unprocessable Content",
          429: "Too Many Requests", 503: "Service Unavailable"}  # fmt: skip
EVENT_FIELDS = {"event_type", "payload", "idempotency_key", "tenant", "ordering_key"}
BODY_SLACK = 64 * 1024  # what an event's body may hold besides its payload


class Limits:
    """A token bucket per API token: ``rate`` requests a second, bursts of twice that."""

    def __init__(self, rate: float, tracked: int = 10_000) -> None:
        self.rate, self.burst, self.tracked = rate, 2 * rate, tracked
        self._buckets: dict[str, tuple[float, float]] = {}  # token -> (tokens left, at)

    def wait(self, who: str, now: float | None = None) -> float:
        """0 and one request taken, or how long ``who`` must wait for the next."""
        now = time.monotonic() if now is None else now
        left, at = self._buckets.get(who, (self.burst, now))
        left = min(self.burst, left + (now - at) * self.rate)
        if left < 1:
            self._buckets[who] = (left, now)
            return (1 - left) / self.rate
        if who not in self._buckets and len(self._buckets) >= self.tracked:
            del self._buckets[next(iter(self._buckets))]  # the longest-known token
        self._buckets[who] = (left - 1, now)
        return 0.0


@dataclass(frozen=True, slots=True)
class Caller:
    """Who called: their scope, whether they may change anything, and their name."""

    scope: tokens.Scope
    read_only: bool
    who: str

    def sees(self, endpoint: Endpoint) -> bool:
        return self.scope.tenant is None or endpoint.tenant == self.scope.tenant


def problem(status: int, detail: str, **headers: str) -> Response:
    body = {"type": "about:blank", "title": TITLES.get(status, "Error"), "status": status,
            "detail": detail}  # fmt: skip
    return JSONResponse(body, status, headers=headers, media_type=PROBLEM)


def _json(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: _json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json(v) for v in value]
    return value


async def _caller(board: Dashboard, request: Request) -> Caller | Response:
    header = request.headers.get("authorization", "")
    if not header:
        return problem(401, "send Authorization: Bearer <token>", **{"www-authenticate": "Bearer"})
    client = client_of(request)
    if (wait := board.throttle.wait(client)) > 0:
        return problem(429, "too many wrong credentials: wait and try again",
                       **{"retry-after": str(max(1, round(wait)))})  # fmt: skip
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer" and value.strip().startswith(tokens.PREFIX):

        def check() -> tokens.Token:
            with board.engine.begin() as conn:
                return tokens.authenticate(conn, value.strip())

        try:
            token = await run_in_threadpool(check)
        except TokenRefused as exc:
            board.throttle.failed(client)
            log.warning("api: refused a token from %s", client)
            return problem(401, str(exc), **{"www-authenticate": 'Bearer error="invalid_token"'})
        return Caller(token.scope, token.read_only, f"token:{token.name}")
    identity = identify(board, request)  # the dashboard's operator credentials
    if isinstance(identity, Response) or identity is None:
        return problem(401, "wrong credentials", **{"www-authenticate": "Bearer"})
    return Caller(tokens.Scope(), board.read_only, f"dashboard:{identity.who}")


Handler = Callable[[Request, Caller], Awaitable[Response]]


def api(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
    """A route of the API: its caller found (else 401), its failures as problems."""

    @functools.wraps(handler)
    async def answered(request: Request) -> Response:
        board = dashboard(request)
        caller = await _caller(board, request)
        if isinstance(caller, Response):
            return caller
        limits: Limits = request.app.state.api_limits
        if (wait := limits.wait(caller.who)) > 0:
            return problem(429, f"more than {limits.rate:g} requests a second for {caller.who}",
                           **{"retry-after": str(max(1, math.ceil(wait)))})  # fmt: skip
        if request.method not in ("GET", "HEAD"):  # a change
            kind = request.headers.get("content-type", "").partition(";")[0].strip().lower()
            if kind != "application/json":  # what no other site's form can send
                return problem(415, "send Content-Type: application/json")
            if caller.read_only:
                return problem(403, f"{caller.who} is read-only: it changes nothing")
        try:
            return await handler(request, caller)
        except NotFound as exc:
            return problem(404, str(exc))
        except (IdempotencyConflict, EndpointExists, EndpointInUse) as exc:
            return problem(409, str(exc))
        except (InvalidInput, ValueError) as exc:
            return problem(422, str(exc))
        except PollerError as exc:
            return problem(422, str(exc))
        except TRANSIENT as exc:
            log.warning("api: database unavailable: %s", type(exc).__name__)
            return problem(503, "the database is not answering; try again")

    return answered


def _page(request: Request) -> tuple[str | None, int]:
    after = request.query_params.get("after") or None
    raw = request.query_params.get("limit", "100")
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_LIMIT:
        raise InvalidInput(f"limit {raw[:20]!r}: a whole number from 1 to {MAX_LIMIT}")
    return after, int(raw)


@api
async def endpoints(request: Request, caller: Caller) -> Response:
    after, limit = _page(request)
    found = await dashboard(request).read(list_endpoints)
    seen = sorted((e for e in found if caller.sees(e)), key=lambda e: e.name)
    if after is not None:
        seen = [e for e in seen if e.name > after]
    page = seen[:limit]
    more = len(seen) > limit
    return JSONResponse(
        {"data": [_json(e.public()) for e in page], "next": page[-1].name if more else None}
    )


@api
async def endpoint(request: Request, caller: Caller) -> Response:
    return JSONResponse(
        _json((await _visible(request, caller, request.path_params["name"])).public())
    )


ATTEMPT_FIELDS = ("attempt", "kind", "outcome", "started_at", "duration_ms", "status_code",
                  "error_class", "error_message", "response_excerpt")  # fmt: skip


async def _visible(request: Request, caller: Caller, name: str) -> Endpoint:
    """The endpoint ``name``, if the caller may see it; else as if there were none."""
    found = await dashboard(request).read(lambda conn: get_endpoint(conn, name))
    if not caller.sees(found):
        raise UnknownEndpoint(name)  # no other tenant's names leak
    return found


@api
async def messages(request: Request, caller: Caller) -> Response:
    """Messages newest first, by endpoint, status, event type and creation (``since``,
    ``until``: ``1h`` ago or an ISO time); ``after``: the ``next`` of the previous page."""
    after, limit = _page(request)
    before = parse.row_id(after) if after is not None else None
    query = request.query_params
    name = query.get("endpoint")
    if name is not None:
        await _visible(request, caller, name)
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
        {"data": [_json(m) for m in page], "next": str(page[-1]["id"]) if more else None}
    )


@api
async def message(request: Request, caller: Caller) -> Response:
    """One message, its payload and every attempt, oldest first."""
    message_id = await _own_message(request, caller)
    found = await dashboard(request).read(lambda conn: admin.message_detail(conn, message_id))
    shown = {k: found[k] for k in (*admin.MESSAGE_FIELDS, "endpoint", "payload")}
    shown["attempts_log"] = [{k: a[k] for k in ATTEMPT_FIELDS} for a in found["attempts_log"]]
    return JSONResponse(_json(shown))


NUMBER, TEXT = (int, float), (str,)
ENDPOINT_FIELDS: dict[str, tuple[type, ...]] = {
    "url": TEXT, "lookup_url": TEXT, "event_types": (list,), "tenant": TEXT,
    "payload_filter": (dict,), "headers": (dict,), "max_attempts": (int,), "timeout": NUMBER,
    "max_in_flight": (int,), "rate_limit": NUMBER, "rate_burst": (int,),
    "circuit_failures": (int,), "circuit_cooldown": NUMBER, "retry_schedule": (list,),
    "max_age": NUMBER, "on_failed_head": TEXT, "trace_context": (bool,),
}  # fmt: skip
"""What a create or an update may set, and the JSON types each takes (poller/endpoints.py
checks the values)."""


def _fields(body: dict[str, Any], allowed: dict[str, tuple[type, ...]]) -> dict[str, Any]:
    """``body``'s fields, each of a type its field takes (a wrong one is 422, never a
    crash further in)."""
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        raise InvalidInput(f"unknown fields: {', '.join(k[:40] for k in unknown[:5])}")
    for name, value in body.items():
        types = allowed[name]
        if value is None or (isinstance(value, bool) and bool not in types):
            raise InvalidInput(f"{name}: {'null' if value is None else 'a boolean'} is not "
                               "one of its values")  # fmt: skip
        if not isinstance(value, types):
            raise InvalidInput(f"{name}: must be {' or '.join(t.__name__ for t in types)}")
    for name in ("event_types", "retry_schedule"):
        items = body.get(name, [])
        kinds = TEXT if name == "event_types" else NUMBER
        if any(not isinstance(i, kinds) or isinstance(i, bool) for i in items):
            raise InvalidInput(f"{name}: a list of {'names' if kinds is TEXT else 'seconds'}")
    headers = body.get("headers", {})
    if any(not isinstance(v, str) for v in headers.values()):
        raise InvalidInput("headers: an object of header names and text values")
    return body


@api
async def create(request: Request, caller: Caller) -> Response:
    """Make an endpoint; its signing secret (or, for ed25519, its public key) is in the
    answer this once. A tenant's token makes one of its tenant's, named for it."""
    board = dashboard(request)
    body = await _body(request, 1024 * 1024)
    if isinstance(body, Response):
        return body
    allowed = {**ENDPOINT_FIELDS, "name": TEXT, "signing": TEXT}
    if caller.scope.tenant is not None:
        for field in ("name", "tenant"):
            if field in body:
                raise InvalidInput(f"{field}: a {caller.scope} token's endpoints get theirs")
        body = {**body, "tenant": caller.scope.tenant}
        name = f"ep_{secrets.token_hex(8)}"  # never one another tenant has
    elif isinstance(body.get("name"), str):
        name = body["name"]
    else:
        raise InvalidInput("name: required, the endpoint's name")
    fields = dict(_fields(body, allowed))
    fields.pop("name", None)
    url = fields.pop("url", None)
    if url is None:
        raise InvalidInput("url: required, where its webhooks go")

    def write() -> Any:
        with board.engine.begin() as conn:
            return create_endpoint(conn, name, url, **fields)

    made = await run_in_threadpool(write)
    shown = made.endpoint.public()
    if made.endpoint.signing is Scheme.HMAC_SHA256:
        shown["secret"] = made.secret  # this once; ed25519: the public keys above
    return JSONResponse(_json(shown), 201)


@api
async def change(request: Request, caller: Caller) -> Response:
    """Change the fields given (``null`` clears nothing: it is refused)."""
    found = await _visible(request, caller, request.path_params["name"])
    board = dashboard(request)
    body = await _body(request, 1024 * 1024)
    if isinstance(body, Response):
        return body
    allowed = dict(ENDPOINT_FIELDS)
    if caller.scope.tenant is not None:
        del allowed["tenant"]  # a tenant's endpoint stays its
    fields = _fields(body, allowed)

    def write() -> Endpoint:
        with board.engine.begin() as conn:
            return update_endpoint(conn, found.name, **fields)

    return JSONResponse(_json((await run_in_threadpool(write)).public()))


@api
async def remove(request: Request, caller: Caller) -> Response:
    """Delete an endpoint; with ``?force=true`` its messages too (409 otherwise)."""
    found = await _visible(request, caller, request.path_params["name"])
    board = dashboard(request)
    force = request.query_params.get("force") == "true"

    def write() -> int:
        with board.engine.begin() as conn:
            return remove_endpoint(conn, found.name, force=force)

    deleted = await run_in_threadpool(write)
    return JSONResponse({"name": found.name, "deleted_messages": deleted})


@api
async def switch(request: Request, caller: Caller) -> Response:
    """``enable`` (its circuit closed, its streak forgotten) or ``disable`` it."""
    found = await _visible(request, caller, request.path_params["name"])
    board = dashboard(request)
    enabled = request.url.path.endswith("/enable")
    reason = f"disabled by {caller.who}"

    def write() -> Endpoint:
        with board.engine.begin() as conn:
            return set_enabled(conn, found.name, enabled, None if enabled else reason)

    return JSONResponse(_json((await run_in_threadpool(write)).public()))


@api
async def hold(request: Request, caller: Caller) -> Response:
    """``pause`` (``{"until": "2h"}`` or an ISO time; none: until resumed) or ``resume``
    its deliveries; its health and attempts are left as they are."""
    found = await _visible(request, caller, request.path_params["name"])
    board = dashboard(request)
    pausing = request.url.path.endswith("/pause")
    body = await _body(request, 64 * 1024)
    if isinstance(body, Response):
        return body
    _fields(body, {"until": TEXT} if pausing else {})
    until = parse.deadline(body["until"]) if "until" in body else None

    def write() -> None:
        with board.engine.begin() as conn:
            if pausing:
                pause_endpoint(conn, found.name, until=until, who=f"api:{caller.who}")
            else:
                resume_endpoint(conn, found.name)

    await run_in_threadpool(write)
    return JSONResponse(_json((await _visible(request, caller, found.name)).public()))


@api
async def rotate(request: Request, caller: Caller) -> Response:
    """A new signing key, in the answer this once (ed25519: its public key); the old one
    signs too for ``keep_old_for`` (default ``24h``). ``signing`` may switch schemes."""
    found = await _visible(request, caller, request.path_params["name"])
    board = dashboard(request)
    body = await _body(request, 64 * 1024)
    if isinstance(body, Response):
        return body
    _fields(body, {"keep_old_for": TEXT, "signing": TEXT})
    keep = parse.duration(body.get("keep_old_for", "24h"))

    def write() -> tuple[Endpoint, str]:
        with board.engine.begin() as conn:
            return rotate_secret(conn, found.name, keep, signing=body.get("signing"))

    rotated, key = await run_in_threadpool(write)
    shown = rotated.public()
    if rotated.signing is Scheme.HMAC_SHA256:
        shown["secret"] = key
    return JSONResponse(_json(shown))


TEST_EVENT = "webhook_poller.test"


@api
async def test_event(request: Request, caller: Caller) -> Response:
    """Send the endpoint a test event (``webhook_poller.test``, signed as any other, by
    the pollers, with retries): 202 with its message, whose attempts show how it went."""
    found = await _visible(request, caller, request.path_params["name"])
    board = dashboard(request)
    body = await _body(request, 64 * 1024)
    if isinstance(body, Response):
        return body
    _fields(body, {})
    key = f"test:{secrets.token_hex(8)}"
    payload = {"test": True, "endpoint": found.name, "sent_by": caller.who}

    def write() -> int:
        with board.engine.begin() as conn:
            return enqueue(conn, endpoint=found.name, event_type=TEST_EVENT, payload=payload,
                           idempotency_key=key)  # fmt: skip

    message_id = await run_in_threadpool(write)
    return JSONResponse({"message_id": message_id, "idempotency_key": key}, 202)


CATALOG_FIELDS: dict[str, tuple[type, ...]] = {
    "description": TEXT, "schema": (dict,), "deprecated": (bool,),
    "example": (dict, list, str, int, float, bool),
}  # fmt: skip


@api
async def event_types(request: Request, caller: Caller) -> Response:
    """The catalog (poller/catalog.py), for every caller: what may be published."""
    found = await dashboard(request).read(catalog.list_event_types)
    return JSONResponse({"data": [_json(t.public()) for t in found], "next": None})


@api
async def event_type(request: Request, caller: Caller) -> Response:
    """One event type; ``PUT`` (an admin's) defines or replaces it, ``DELETE`` removes it."""
    name = request.path_params["name"]
    board = dashboard(request)
    if request.method == "GET":
        return JSONResponse(
            _json((await board.read(lambda c: catalog.get_event_type(c, name))).public())
        )
    if caller.scope.tenant is not None:
        return problem(403, "only an admin's token changes the catalog")
    if request.method == "DELETE":

        def remove_it() -> None:
            with board.engine.begin() as conn:
                catalog.remove_event_type(conn, name)

        await run_in_threadpool(remove_it)
        return JSONResponse({"name": name, "removed": True})
    body = await _body(request, catalog.MAX_SCHEMA_BYTES * 3)
    if isinstance(body, Response):
        return body
    fields = _fields(body, CATALOG_FIELDS)

    def define() -> catalog.EventType:
        with board.engine.begin() as conn:
            return catalog.define_event_type(conn, name, **fields)

    return JSONResponse(_json((await run_in_threadpool(define)).public()))


async def _own_message(request: Request, caller: Caller) -> int:
    """The id in the path, of a message the caller may see; else MessageNotFound."""
    message_id = parse.row_id(request.path_params["id"])
    found = await dashboard(request).read(lambda conn: admin.message_detail(conn, message_id))
    try:
        await _visible(request, caller, found["endpoint"])
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


async def _body(request: Request, limit: int) -> dict[str, Any] | Response:
    """The request's JSON object (its type was checked by :func:`api`); a problem when
    it is not one, or is over ``limit`` bytes (read no further than that)."""
    size = request.headers.get("content-length", "")
    if size.isdigit() and int(size) > limit:
        return problem(413, f"the body is over {limit} bytes")
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > limit:
            return problem(413, f"the body is over {limit} bytes")
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        return problem(422, "the body is not JSON")
    if not isinstance(body, dict):
        return problem(422, "the body must be a JSON object")
    return body


@api
async def events(request: Request, caller: Caller) -> Response:
    """Publish one event, as :func:`poller.publish` does: to every subscribed endpoint
    of its tenant. A tenant's token publishes as its tenant."""
    board = dashboard(request)
    body = await _body(request, board.settings.max_payload_bytes + BODY_SLACK)
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


async def http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own refusals (no such route, a method a route does not take): as
    problems under /api/, as plain text elsewhere, as Starlette answers them."""
    status = getattr(exc, "status_code", 500)
    detail = str(getattr(exc, "detail", "")) or TITLES.get(status, "Error")
    if request.url.path.startswith("/api/"):
        return problem(status, "no such route" if status == 404 else detail)
    return PlainTextResponse(detail, status, headers=getattr(exc, "headers", None))


def routes() -> list[Route]:
    return [
        Route("/api/v1/events", events, methods=["POST"]),
        Route("/api/v1/event-types", event_types, methods=["GET"]),
        Route("/api/v1/event-types/{name:path}", event_type, methods=["GET", "PUT", "DELETE"]),
        Route("/api/v1/endpoints", endpoints, methods=["GET"]),
        Route("/api/v1/endpoints", create, methods=["POST"]),
        Route("/api/v1/endpoints/{name}/enable", switch, methods=["POST"]),
        Route("/api/v1/endpoints/{name}/disable", switch, methods=["POST"]),
        Route("/api/v1/endpoints/{name}/pause", hold, methods=["POST"]),
        Route("/api/v1/endpoints/{name}/resume", hold, methods=["POST"]),
        Route("/api/v1/endpoints/{name}/rotate-secret", rotate, methods=["POST"]),
        Route("/api/v1/endpoints/{name}/test", test_event, methods=["POST"]),
        Route("/api/v1/messages", messages, methods=["GET"]),
        Route("/api/v1/messages/{id}", message, methods=["GET"]),
        Route("/api/v1/messages/{id}/retry", retry, methods=["POST"]),
        Route("/api/v1/messages/{id}/cancel", cancel, methods=["POST"]),
        Route("/api/v1/endpoints/{name}", endpoint, methods=["GET"]),
        Route("/api/v1/endpoints/{name}", change, methods=["PATCH"]),
        Route("/api/v1/endpoints/{name}", remove, methods=["DELETE"]),
    ]
