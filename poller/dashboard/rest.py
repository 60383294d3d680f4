"""The ground every route of the management API stands on (poller/dashboard/api.py says
what the API is): who called (:func:`api`), what they may see (:meth:`Caller.sees`,
:func:`visible`), the throttle per token (:class:`Limits`), problem documents, and
reading a JSON body no larger than a limit, its fields of the types they take."""

from __future__ import annotations

import functools
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from poller import tokens
from poller.dashboard.web import Dashboard, client_of, dashboard, identify
from poller.db import TRANSIENT
from poller.endpoints import (
    Endpoint,
    get_endpoint,
)
from poller.errors import (
    EndpointExists,
    EndpointInUse,
    IdempotencyConflict,
    InvalidInput,
    NotFound,
    PollerError,
    TokenRefused,
    UnknownEndpoint,
)

log = logging.getLogger("poller.api")
PROBLEM = "application/problem+json"
MAX_LIMIT = 500
NUMBER, TEXT = (int, float), (str,)  # the JSON types of a field (fields_of)
TITLES = {401: "Unauthorized", 403: "Forbidden", 404: "Not Found", 409: "Conflict",
          413: "Content Too Large", 415: "Unsupported Media Type", 422: "Unprocessable Content",
          429: "Too Many Requests", 503: "Service Unavailable"}  # fmt: skip


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


def as_json(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: as_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [as_json(v) for v in value]
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


def page_of(request: Request) -> tuple[str | None, int]:
    after = request.query_params.get("after") or None
    raw = request.query_params.get("limit", "100")
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_LIMIT:
        raise InvalidInput(f"limit {raw[:20]!r}: a whole number from 1 to {MAX_LIMIT}")
    return after, int(raw)


async def visible(request: Request, caller: Caller, name: str) -> Endpoint:
    """The endpoint ``name``, if the caller may see it; else as if there were none."""
    found = await dashboard(request).read(lambda conn: get_endpoint(conn, name))
    if not caller.sees(found):
        raise UnknownEndpoint(name)  # no other tenant's names leak
    return found


def fields_of(body: dict[str, Any], allowed: dict[str, tuple[type, ...]]) -> dict[str, Any]:
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


async def json_body(request: Request, limit: int) -> dict[str, Any] | Response:
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


async def http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own refusals (no such route, a method a route does not take): as
    problems under /api/, as plain text elsewhere, as Starlette answers them."""
    status = getattr(exc, "status_code", 500)
    detail = str(getattr(exc, "detail", "")) or TITLES.get(status, "Error")
    if request.url.path.startswith("/api/"):
        return problem(status, "no such route" if status == 404 else detail)
    return PlainTextResponse(detail, status, headers=getattr(exc, "headers", None))
