"""The management API's endpoint routes: list, show, make, change, delete, enable and
disable, pause and resume, rotate the key, send a test event (poller/dashboard/api.py
says what the API is; poller/dashboard/rest.py is the ground the routes stand on)."""

from __future__ import annotations

import secrets
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from poller import parse
from poller.cancel import pause_endpoint, resume_endpoint
from poller.dashboard.rest import (
    NUMBER,
    TEXT,
    Caller,
    api,
    as_json,
    fields_of,
    json_body,
    page_of,
    visible,
)
from poller.dashboard.web import dashboard
from poller.endpoint_keys import rotate_secret
from poller.endpoint_view import public
from poller.endpoints import (
    Endpoint,
    create_endpoint,
    list_endpoints,
    remove_endpoint,
    set_enabled,
    update_endpoint,
)
from poller.errors import (
    InvalidInput,
)
from poller.outbox import enqueue
from poller.signing import Scheme


@api
async def endpoints(request: Request, caller: Caller) -> Response:
    after, limit = page_of(request)
    found = await dashboard(request).read(list_endpoints)
    seen = sorted((e for e in found if caller.sees(e)), key=lambda e: e.name)
    if after is not None:
        seen = [e for e in seen if e.name > after]
    page = seen[:limit]
    more = len(seen) > limit
    return JSONResponse(
        {"data": [as_json(public(e)) for e in page], "next": page[-1].name if more else None}
    )


@api
async def endpoint(request: Request, caller: Caller) -> Response:
    return JSONResponse(
        as_json(public(await visible(request, caller, request.path_params["name"])))
    )


ENDPOINT_FIELDS: dict[str, tuple[type, ...]] = {
    "url": TEXT, "lookup_url": TEXT, "event_types": (list,), "tenant": TEXT,
    "payload_filter": (dict,), "headers": (dict,), "max_attempts": (int,), "timeout": NUMBER,
    "max_in_flight": (int,), "rate_limit": NUMBER, "rate_burst": (int,),
    "circuit_failures": (int,), "circuit_cooldown": NUMBER, "retry_schedule": (list,),
    "max_age": NUMBER, "on_failed_head": TEXT, "trace_context": (bool,),
}  # fmt: skip
"""What a create or an update may set, and the JSON types each takes (poller/endpoints.py
checks the values)."""


@api
async def create(request: Request, caller: Caller) -> Response:
    """Make an endpoint; its signing secret (or, for ed25519, its public key) is in the
    answer this once. A tenant's token makes one of its tenant's, named for it."""
    board = dashboard(request)
    body = await json_body(request, 1024 * 1024)
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
    fields = dict(fields_of(body, allowed))
    fields.pop("name", None)
    url = fields.pop("url", None)
    if url is None:
        raise InvalidInput("url: required, where its webhooks go")

    def write() -> Any:
        with board.engine.begin() as conn:
            return create_endpoint(conn, name, url, **fields)

    made = await run_in_threadpool(write)
    shown = public(made.endpoint)
    if made.endpoint.signing is Scheme.HMAC_SHA256:
        shown["secret"] = made.secret  # this once; ed25519: the public keys above
    return JSONResponse(as_json(shown), 201)


@api
async def change(request: Request, caller: Caller) -> Response:
    """Change the fields given (``null`` clears nothing: it is refused)."""
    found = await visible(request, caller, request.path_params["name"])
    board = dashboard(request)
    body = await json_body(request, 1024 * 1024)
    if isinstance(body, Response):
        return body
    allowed = dict(ENDPOINT_FIELDS)
    if caller.scope.tenant is not None:
        del allowed["tenant"]  # a tenant's endpoint stays its
    fields = fields_of(body, allowed)

    def write() -> Endpoint:
        with board.engine.begin() as conn:
            return update_endpoint(conn, found.name, **fields)

    return JSONResponse(as_json(public(await run_in_threadpool(write))))


@api
async def remove(request: Request, caller: Caller) -> Response:
    """Delete an endpoint; with ``?force=true`` its messages too (409 otherwise)."""
    found = await visible(request, caller, request.path_params["name"])
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
    found = await visible(request, caller, request.path_params["name"])
    board = dashboard(request)
    enabled = request.url.path.endswith("/enable")
    reason = f"disabled by {caller.who}"

    def write() -> Endpoint:
        with board.engine.begin() as conn:
            return set_enabled(conn, found.name, enabled, None if enabled else reason)

    return JSONResponse(as_json(public(await run_in_threadpool(write))))


@api
async def hold(request: Request, caller: Caller) -> Response:
    """``pause`` (``{"until": "2h"}`` or an ISO time; none: until resumed) or ``resume``
    its deliveries; its health and attempts are left as they are."""
    found = await visible(request, caller, request.path_params["name"])
    board = dashboard(request)
    pausing = request.url.path.endswith("/pause")
    body = await json_body(request, 64 * 1024)
    if isinstance(body, Response):
        return body
    fields_of(body, {"until": TEXT} if pausing else {})
    until = parse.deadline(body["until"]) if "until" in body else None

    def write() -> None:
        with board.engine.begin() as conn:
            if pausing:
                pause_endpoint(conn, found.name, until=until, who=f"api:{caller.who}")
            else:
                resume_endpoint(conn, found.name)

    await run_in_threadpool(write)
    return JSONResponse(as_json(public(await visible(request, caller, found.name))))


@api
async def rotate(request: Request, caller: Caller) -> Response:
    """A new signing key, in the answer this once (ed25519: its public key); the old one
    signs too for ``keep_old_for`` (default ``24h``). ``signing`` may switch schemes."""
    found = await visible(request, caller, request.path_params["name"])
    board = dashboard(request)
    body = await json_body(request, 64 * 1024)
    if isinstance(body, Response):
        return body
    fields_of(body, {"keep_old_for": TEXT, "signing": TEXT})
    keep = parse.duration(body.get("keep_old_for", "24h"))

    def write() -> tuple[Endpoint, str]:
        with board.engine.begin() as conn:
            return rotate_secret(conn, found.name, keep, signing=body.get("signing"))

    rotated, key = await run_in_threadpool(write)
    shown = public(rotated)
    if rotated.signing is Scheme.HMAC_SHA256:
        shown["secret"] = key
    return JSONResponse(as_json(shown))


TEST_EVENT = "webhook_poller.test"


@api
async def test_event(request: Request, caller: Caller) -> Response:
    """Send the endpoint a test event (``webhook_poller.test``, signed as any other, by
    the pollers, with retries): 202 with its message, whose attempts show how it went."""
    found = await visible(request, caller, request.path_params["name"])
    board = dashboard(request)
    body = await json_body(request, 64 * 1024)
    if isinstance(body, Response):
        return body
    fields_of(body, {})
    key = f"test:{secrets.token_hex(8)}"
    payload = {"test": True, "endpoint": found.name, "sent_by": caller.who}

    def write() -> int:
        with board.engine.begin() as conn:
            return enqueue(conn, endpoint=found.name, event_type=TEST_EVENT, payload=payload,
                           idempotency_key=key)  # fmt: skip

    message_id = await run_in_threadpool(write)
    return JSONResponse({"message_id": message_id, "idempotency_key": key}, 202)
