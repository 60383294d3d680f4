"""The management API's endpoint routes: list, show, make, change, delete, enable and
disable, pause and resume, rotate the key, send a test event (poller/web/api/routes.py
says what the API is; poller/web/api/rest.py is the ground the routes stand on)."""

from __future__ import annotations

from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from poller.endpoints.checks import check_tenant_fields, tenant_endpoint_name
from poller.endpoints.keys import rotate_secret
from poller.endpoints.registry import (
    Endpoint,
    create_endpoint,
    get_endpoint,
    list_endpoints,
    make_room,
    remove_endpoint,
    set_enabled,
    update_endpoint,
)
from poller.endpoints.view import public, seen_by
from poller.errors import InvalidInput, UnknownEndpoint
from poller.operate.cancel import pause_endpoint, resume_endpoint
from poller.operate.replay import replay
from poller.outbox.enqueue import send_test_event
from poller.rules import parse
from poller.rules.signing import Scheme
from poller.settings import Settings
from poller.web.api import once, shapes
from poller.web.api.rest import (
    PAGE,
    Caller,
    Param,
    api,
    as_json,
    page_of,
    visible,
)
from poller.web.base import dashboard

MAX_BODY = 1024 * 1024  # an endpoint's settings: its CA bundle, headers, filter
REPLAY_NOTE = (
    "the same request again: this endpoint was made by the first, whose answer alone "
    "carried its signing secret; if that answer was lost, rotate the secret"
)
FORCE = Param("force", "``true``: delete its messages too (409 otherwise)", {"enum": ["true"]})


@api(answers={200: shapes.EndpointPage}, query=PAGE)
async def endpoints(request: Request, caller: Caller, _: dict[str, Any]) -> Response:
    """Endpoints in name order (a tenant's token: its tenant's)."""
    after, limit = page_of(request)
    tenant = caller.scope.tenant
    seen = await dashboard(request).read(
        lambda conn: list_endpoints(conn, tenant=tenant, after=after, limit=limit + 1)
    )
    page = seen[:limit]
    more = len(seen) > limit
    return JSONResponse(
        {
            "data": [as_json(public(seen_by(e, tenant))) for e in page],
            "next": page[-1].name if more else None,
        }
    )


@api(answers={200: shapes.Endpoint})
async def endpoint(request: Request, caller: Caller, _: dict[str, Any]) -> Response:
    """One endpoint: never its secret, key or header values."""
    return JSONResponse(
        as_json(public(await visible(request, caller, request.path_params["name"])))
    )


@api(body=shapes.EndpointNew, answers={201: shapes.EndpointKeyed}, limit=MAX_BODY)
async def create(request: Request, caller: Caller, body: dict[str, Any]) -> Response:
    """Make an endpoint; its signing secret (or, for ed25519, its public key) is in the
    answer this once. A tenant's token makes one of its tenant's, named for it. With
    an ``Idempotency-Key``, the same request again makes nothing and answers with the
    endpoint it made (``Idempotent-Replayed: true``), as its caller may see it now:
    without the secret, which only the first answer carries (``note`` says so; rotate
    it if that answer was lost), and 404 if the endpoint is gone or no longer the
    caller's tenant's."""
    board = dashboard(request)
    if caller.scope.tenant is not None:
        for field in ("name", "tenant"):
            if field in body:
                raise InvalidInput(f"{field}: a {caller.scope} token's endpoints get theirs")
        check_tenant_fields(body, f"a {caller.scope} token")
        body = {**body, "tenant": caller.scope.tenant}
        name = tenant_endpoint_name()
    elif "name" in body:
        name = body["name"]
    else:
        raise InvalidInput("name: required, the endpoint's name")
    fields = {k: v for k, v in body.items() if k not in ("name", "url")}
    url = body["url"]

    key = request.headers.get("idempotency-key")
    kinds = _offered(board.settings, caller)

    def write() -> tuple[Endpoint, str, bool]:
        with board.engine.begin() as conn:
            first = None if key is None else once.claim(conn, caller.who, key, body, name)
            if first is not None:  # the same request again: what it made, as seen now
                found = get_endpoint(conn, first)
                if caller.scope.tenant is not None and found.tenant != caller.scope.tenant:
                    raise UnknownEndpoint(first)
                return found, "", True
            if caller.scope.tenant is not None:
                make_room(conn, caller.scope.tenant, board.settings.tenant_max_endpoints)
            made = create_endpoint(conn, name, url, kinds=kinds, **fields)
            return made.endpoint, made.secret, False

    made, secret, again = await run_in_threadpool(write)
    shown = public(seen_by(made, caller.scope.tenant))
    if again:
        shown["note"] = REPLAY_NOTE
    elif made.signing is Scheme.HMAC_SHA256:
        shown["secret"] = secret  # this once; ed25519: the public keys above
    replayed = {"idempotent-replayed": "true"} if again else None
    return JSONResponse(as_json(shown), 201, headers=replayed)


@api(body=shapes.EndpointSettings, answers={200: shapes.Endpoint}, limit=MAX_BODY)
async def change(request: Request, caller: Caller, fields: dict[str, Any]) -> Response:
    """Change the fields given (``null`` clears nothing: it is refused)."""
    found = await visible(request, caller, request.path_params["name"])
    board = dashboard(request)
    if caller.scope.tenant is not None:
        if "tenant" in fields:
            raise InvalidInput(f"tenant: a {caller.scope} token's endpoints stay its")
        check_tenant_fields(fields, f"a {caller.scope} token")

    kinds = _offered(board.settings, caller)

    def write() -> Endpoint:
        with board.engine.begin() as conn:
            return update_endpoint(conn, found.name, kinds=kinds, **fields)

    return JSONResponse(
        as_json(public(seen_by(await run_in_threadpool(write), caller.scope.tenant)))
    )


@api(answers={200: shapes.Removed}, query=(FORCE,))
async def remove(request: Request, caller: Caller, _: dict[str, Any]) -> Response:
    """Delete an endpoint; with ``?force=true`` its messages too (409 otherwise)."""
    found = await visible(request, caller, request.path_params["name"])
    board = dashboard(request)
    force = request.query_params.get("force") == "true"

    def write() -> int:
        return remove_endpoint(board.engine, found.name, force=force)

    deleted = await run_in_threadpool(write)
    return JSONResponse({"name": found.name, "deleted_messages": deleted})


@api(answers={200: shapes.Endpoint})
async def switch(request: Request, caller: Caller, _: dict[str, Any]) -> Response:
    """Enable it (its circuit closed, its failure streak forgotten), or disable it:
    nothing is sent to it until it is enabled."""
    found = await visible(request, caller, request.path_params["name"])
    board = dashboard(request)
    enabled = request.url.path.endswith("/enable")
    reason = f"disabled by {caller.who}"

    def write() -> Endpoint:
        with board.engine.begin() as conn:
            return set_enabled(conn, found.name, enabled, None if enabled else reason)

    return JSONResponse(
        as_json(public(seen_by(await run_in_threadpool(write), caller.scope.tenant)))
    )


@api(body=shapes.PauseRequest, answers={200: shapes.Endpoint})
async def pause(request: Request, caller: Caller, body: dict[str, Any]) -> Response:
    """Hold its deliveries (``until``: a time or ``2h``; none: until resumed); its
    health and attempts are left as they are."""
    found = await visible(request, caller, request.path_params["name"])
    board = dashboard(request)
    until = parse.deadline(body["until"]) if "until" in body else None

    def write() -> None:
        with board.engine.begin() as conn:
            pause_endpoint(conn, found.name, until=until, who=f"api:{caller.who}")

    await run_in_threadpool(write)
    return JSONResponse(as_json(public(await visible(request, caller, found.name))))


@api(answers={200: shapes.Endpoint})
async def resume(request: Request, caller: Caller, _: dict[str, Any]) -> Response:
    """Deliver again what a pause held."""
    found = await visible(request, caller, request.path_params["name"])
    board = dashboard(request)

    def write() -> None:
        with board.engine.begin() as conn:
            resume_endpoint(conn, found.name)

    await run_in_threadpool(write)
    return JSONResponse(as_json(public(await visible(request, caller, found.name))))


@api(body=shapes.RotateRequest, answers={200: shapes.EndpointKeyed})
async def rotate(request: Request, caller: Caller, body: dict[str, Any]) -> Response:
    """A new signing key, in the answer this once (ed25519: its public key); the old one
    signs too for ``keep_old_for`` (default ``24h``). ``signing`` may switch schemes."""
    found = await visible(request, caller, request.path_params["name"])
    board = dashboard(request)
    keep = parse.duration(body.get("keep_old_for", "24h"))

    def write() -> tuple[Endpoint, str]:
        with board.engine.begin() as conn:
            return rotate_secret(conn, found.name, keep, signing=body.get("signing"))

    rotated, key = await run_in_threadpool(write)
    shown = public(seen_by(rotated, caller.scope.tenant))
    if rotated.signing is Scheme.HMAC_SHA256:
        shown["secret"] = key
    return JSONResponse(as_json(shown))


@api(answers={202: shapes.TestSent})
async def test_event(request: Request, caller: Caller, _: dict[str, Any]) -> Response:
    """Send the endpoint a test event (``webhook_poller.test``, signed as any other, by
    the pollers, with retries): 202 with its message, whose attempts show how it went."""
    found = await visible(request, caller, request.path_params["name"])
    board = dashboard(request)

    def write() -> tuple[int, str]:
        with board.engine.begin() as conn:
            return send_test_event(conn, found.name, caller.who, found.tenant)

    message_id, key = await run_in_threadpool(write)
    return JSONResponse({"message_id": message_id, "idempotency_key": key}, 202)


@api(body=shapes.ReplayRequest, answers={200: shapes.Replayed})
async def replay_since(request: Request, caller: Caller, body: dict[str, Any]) -> Response:
    """Deliver again the events published in [since, until) it is subscribed to now:
    those it never had are queued, those that ended are sent again, those still open
    are left alone. Each keeps its idempotency key (its ``webhook-id``)."""
    found = await visible(request, caller, request.path_params["name"])
    board = dashboard(request)
    since = parse.moment(body["since"])
    until = parse.moment(body["until"]) if "until" in body else None
    done = await board.act(
        lambda: replay(board.engine, found.name, since=since, until=until,
                       event_type=body.get("event_type"), dry_run=body.get("dry_run", False),
                       who=f"api:{caller.who}")
    )  # fmt: skip
    return JSONResponse(done.as_dict())


def _offered(settings: Settings, caller: Caller) -> frozenset[str] | None:
    """The destinations the caller may name: a tenant's token, POLLER_TENANT_DESTINATIONS'."""
    return None if caller.scope.tenant is None else frozenset(settings.tenant_destinations)
