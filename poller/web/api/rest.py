"""The ground every route of the management API stands on (poller/web/api/routes.py says
what the API is): who called (:func:`api`), what they may see (:meth:`Caller.sees`,
:func:`visible`), the throttle per token (:class:`Limits`), problem documents, and
reading a JSON body no larger than a limit and checking it against its shape
(poller/web/api/shapes.py)."""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import TypeAdapter, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from poller.access import tokens
from poller.endpoints.registry import (
    Endpoint,
    get_endpoint,
)
from poller.endpoints.view import seen_by
from poller.errors import (
    EndpointExists,
    EndpointInUse,
    IdempotencyConflict,
    InvalidInput,
    NotAllowed,
    NotFound,
    PollerError,
    RequestConflict,
    RequestRefused,
    TenantFull,
    TokenRefused,
    UnknownEndpoint,
)
from poller.rules import actors
from poller.rules.payloads import json_problem, loads
from poller.store.db import TRANSIENT
from poller.web.api import shapes
from poller.web.auth import Limits
from poller.web.base import Dashboard, client_of, dashboard, identify

log = logging.getLogger("poller.api")
PROBLEM = "application/problem+json"
MAX_LIMIT = 500
CONFLICTS = (IdempotencyConflict, RequestConflict, EndpointExists, EndpointInUse, TenantFull)
"""Errors answered 409: the request is good, but what is stored stands in its way."""
TITLES = {401: "Unauthorized", 403: "Forbidden", 404: "Not Found", 409: "Conflict",
          413: "Content Too Large", 415: "Unsupported Media Type", 422: "Unprocessable Content",
          429: "Too Many Requests", 503: "Service Unavailable"}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Caller:
    """Who called: their scope, whether they may change anything, and their name."""

    scope: tokens.Scope
    read_only: bool
    who: str

    def sees(self, endpoint: Endpoint) -> bool:
        return self.scope.tenant is None or endpoint.tenant == self.scope.tenant


def problem(
    status: int,
    detail: str,
    errors: list[dict[str, str]] | None = None,
    headers: dict[str, str] | None = None,
) -> Response:
    body: dict[str, Any] = {"type": "about:blank", "title": TITLES.get(status, "Error"),
                            "status": status, "detail": detail}  # fmt: skip
    if errors:
        body["errors"] = errors
    return JSONResponse(body, status, headers=headers, media_type=PROBLEM)


def as_json(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: as_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [as_json(v) for v in value]
    return value


async def _caller(board: Dashboard, request: Request) -> Caller | Response:
    """Who calls: an API token, or the operator's own credentials (the dashboard's token as
    a bearer, or its basic user) — never the dashboard's session cookie, which a browser
    adds by itself.

    An API token carries 256 random bits: it is checked whoever sends it, so a right one
    is never held up by anyone's wrong ones (behind one proxy every tenant shares an
    address). Wrong ones are counted per client address and answered 429 past the
    limit, 401 before. The operator's credentials may be guessable: their failures are
    throttled per address before the check, as on the dashboard's pages."""
    header = request.headers.get("authorization", "")
    if not header:
        return problem(
            401, "send Authorization: Bearer <token>", headers={"www-authenticate": "Bearer"}
        )
    client = client_of(request)
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer" and value.strip().startswith(tokens.PREFIX):

        def check() -> tokens.Token:
            with board.engine.begin() as conn:
                return tokens.authenticate(conn, value.strip())

        try:
            token = await run_in_threadpool(check)
        except TokenRefused as exc:
            board.token_failures.failed(client)
            log.warning("api: refused a token from %s", client)
            if (wait := board.token_failures.wait(client)) > 0:
                return problem(429, "too many wrong tokens: wait and try again",
                               headers={"retry-after": str(max(1, round(wait)))})  # fmt: skip
            return problem(
                401, str(exc), headers={"www-authenticate": 'Bearer error="invalid_token"'}
            )
        who = f"token:{token.name}"
        if token.scope.tenant is not None:  # a tenant's own actions show as its own
            who = actors.of_tenant(token.scope.tenant, who)
        return Caller(token.scope, token.read_only, who)
    identity = identify(board, request, cookies=False)  # the operator's credentials
    if isinstance(identity, Response):
        retry = identity.headers.get("retry-after", "60")
        return problem(429, "too many wrong credentials: wait and try again",
                       headers={"retry-after": retry})  # fmt: skip
    if identity is None:
        return problem(401, "wrong credentials", headers={"www-authenticate": "Bearer"})
    return Caller(tokens.Scope(), board.read_only, f"dashboard:{identity.who}")


Handler = Callable[[Request, Caller, dict[str, Any]], Awaitable[Response]]


@dataclass(frozen=True, slots=True)
class Param:
    """A query parameter a route reads (for the OpenAPI document)."""

    name: str
    description: str
    schema: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Spec:
    """What a route takes and answers: its body's shape (poller/web/api/shapes.py),
    read no further than ``limit`` bytes; its answers' shapes by status; its query."""

    body: type | None
    answers: dict[int, type]
    query: tuple[Param, ...]
    limit: int | Callable[[Dashboard], int]


def api(
    *,
    answers: dict[int, type],
    body: type | None = None,
    query: tuple[Param, ...] = (),
    limit: int | Callable[[Dashboard], int] = 64 * 1024,
) -> Callable[[Handler], Callable[[Request], Awaitable[Response]]]:
    """A route of the API: its caller found (else 401), its body read and checked
    against ``body`` (a change without one takes ``{}`` or nothing), its failures as
    problems. The route gets the body's fields as given."""
    shape: TypeAdapter[Any] = TypeAdapter(body or shapes.NoFields)

    def route(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        @functools.wraps(handler)
        async def answered(request: Request) -> Response:
            board = dashboard(request)
            caller = await _caller(board, request)
            if isinstance(caller, Response):
                return caller
            limits: Limits = request.app.state.api_limits
            if (wait := limits.wait(caller.who)) > 0:
                return problem(
                    429, f"more than {limits.rate:g} requests a second for {caller.who}",
                    headers={"retry-after": str(max(1, math.ceil(wait)))},
                )  # fmt: skip
            try:
                fields: dict[str, Any] = {}
                if request.method not in ("GET", "HEAD"):  # a change
                    most = limit if isinstance(limit, int) else limit(board)
                    fields = await _change(request, caller, shape, most)
                return await handler(request, caller, fields)
            except RequestRefused as exc:
                return problem(exc.status, exc.detail, errors=exc.errors)
            except NotFound as exc:
                return problem(404, str(exc))
            except NotAllowed as exc:
                return problem(403, str(exc))
            except (
                IdempotencyConflict,
                RequestConflict,
                EndpointExists,
                EndpointInUse,
                TenantFull,
            ) as exc:
                return problem(409, str(exc))
            except PollerError as exc:  # a ValueError is a bug: 500, logged
                hint = getattr(exc, "hint", None)  # an admin's: the setting that allows it
                said = f"{exc}; {hint}" if hint and caller.scope.tenant is None else str(exc)
                return problem(422, said)
            except TRANSIENT as exc:
                log.warning("api: database unavailable: %s", type(exc).__name__)
                return problem(503, "the database is not answering; try again")

        answered.spec = Spec(body, answers, query, limit)  # type: ignore[attr-defined]
        return answered

    return route


async def _change(
    request: Request, caller: Caller, shape: TypeAdapter[Any], limit: int
) -> dict[str, Any]:
    """A change's body, checked; refused for a caller that may change nothing."""
    kind = request.headers.get("content-type", "").partition(";")[0]
    if kind.strip().lower() != "application/json":  # what no other site's form can send
        raise RequestRefused(415, "send Content-Type: application/json")
    if caller.read_only:
        raise RequestRefused(403, f"{caller.who} is read-only: it changes nothing")
    return _checked(shape, await _json(request, limit))


async def _json(request: Request, limit: int) -> Any:
    """The request's JSON (nothing: ``{}``), read no further than ``limit`` bytes."""
    size = request.headers.get("content-length", "")
    if size.isdigit() and int(size) > limit:
        raise RequestRefused(413, f"the body is over {limit} bytes")
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > limit:
            raise RequestRefused(413, f"the body is over {limit} bytes")
    if not raw.strip():
        return {}
    try:
        return loads(raw)
    except (ValueError, RecursionError) as exc:
        raise RequestRefused(422, json_problem("the body", exc)[:200]) from None


def _checked(shape: TypeAdapter[Any], body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise RequestRefused(422, "the body must be a JSON object")
    try:
        fields: dict[str, Any] = shape.validate_python(body)
    except ValidationError as exc:
        errors = [
            {"field": "/" + "/".join(str(p)[:80] for p in e["loc"]), "message": e["msg"]}
            for e in exc.errors(include_url=False, include_input=False)[:20]
        ]
        shown = "; ".join(f"{e['field'][1:] or 'body'}: {e['message']}" for e in errors[:3])
        raise RequestRefused(422, shown, errors) from None
    except RecursionError:
        raise RequestRefused(422, "the body is nested too deep") from None
    return fields


PAGE = (
    Param("limit", f"At most this many (1 to {MAX_LIMIT}, default 100)",
          {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT}),
    Param("after", "The ``next`` of the page before", {"type": "string"}),
)  # fmt: skip


def page_of(request: Request, default: int = 100, most: int = MAX_LIMIT) -> tuple[str | None, int]:
    """The ``after`` and ``limit`` of a list's page (``limit`` from 1 to ``most``)."""
    after = request.query_params.get("after") or None
    raw = request.query_params.get("limit", str(default))
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 6 and 1 <= int(raw) <= most):
        raise InvalidInput(f"limit {raw[:20]!r}: a whole number from 1 to {most}")
    return after, int(raw)


async def visible(request: Request, caller: Caller, name: str) -> Endpoint:
    """The endpoint ``name``, if the caller may see it; else as if there were none."""
    found = await dashboard(request).read(lambda conn: get_endpoint(conn, name))
    if not caller.sees(found):
        raise UnknownEndpoint(name)  # no other tenant's names leak
    return seen_by(found, caller.scope.tenant)


async def http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own refusals (no such route, a method a route does not take): as
    problems under /api/, as plain text elsewhere, as Starlette answers them."""
    status = getattr(exc, "status_code", 500)
    detail = str(getattr(exc, "detail", "")) or TITLES.get(status, "Error")
    if request.url.path.startswith("/api/"):
        return problem(status, "no such route" if status == 404 else detail)
    return PlainTextResponse(detail, status, headers=getattr(exc, "headers", None))
