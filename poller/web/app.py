"""The web faces a process serves, assembled into one ASGI app: the dashboard's pages
(poller/web/dashboard), the API (poller/web/api) and the portal (poller/web/portal) on
the ground every page and route stands on (poller/web/base.py, poller/web/auth.py)."""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from typing import Any

from sqlalchemy import Engine
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp

from poller.errors import ConfigurationError, PollerError
from poller.settings import DASHBOARD_ADDR, Settings
from poller.store.db import TRANSIENT
from poller.web import auth
from poller.web.api import rest
from poller.web.api import routes as api
from poller.web.base import (
    HERE,
    Dashboard,
    SecurityHeaders,
    dashboard,
    database_away,
    expected_failure,
    host_of,
    login,
    logout,
    loopback,
)
from poller.web.dashboard import pages
from poller.web.portal import pages as portal

log = logging.getLogger("poller.web")

FACES = ("dashboard", "api", "portal")
"""What a listener may serve: the operator's pages, the management API (/api/v1), the
tenant portal (/portal)."""


async def unexpected_failure(request: Request, exc: Exception) -> Response:
    """Anything else a route raised is a bug: logged with its traceback under an id, and
    answered 500 with that id (a problem under /api/, a status page elsewhere) — never
    passed off as the caller's mistake."""
    error_id = uuid.uuid4().hex[:12]
    log.error("bug %s on %s %s", error_id, request.method, request.url.path, exc_info=exc)
    said = f"unexpected error (a bug in webhook-poller), logged as {error_id}"
    if request.url.path.startswith("/api/"):
        return rest.problem(500, said)
    return dashboard(request).error(request, 500, said)


def create_app(
    settings: Settings,
    engine: Engine,
    creds: auth.Credentials,
    *,
    faces: Collection[str] = FACES,
    addr: str | None = None,
    leases: Callable[[], Awaitable[list[Any]]] | None = None,
    lifespan: Callable[[Starlette], contextlib.AbstractAsyncContextManager[None]] | None = None,
) -> ASGIApp:
    """The web faces as an ASGI app: ``faces``, a selection of :data:`FACES` (a listener
    published to customers serves the portal and the API, never the operator's pages).
    ``engine``: a synchronous engine (admin functions); ``addr``: where it is served
    (default POLLER_DASHBOARD_ADDR: on loopback, it answers loopback names only);
    ``leases``: reads the shard leases (``poller serve`` binds it to an elector)."""
    unknown = sorted(set(faces) - set(FACES))
    if unknown or not faces:
        raise ConfigurationError(f"faces {', '.join(unknown) or '(none)'}: a selection of "
                                 f"{', '.join(FACES)}")  # fmt: skip
    routes: list[BaseRoute] = []
    if "api" in faces:
        routes += api.routes()  # /api/v1 (poller/web/api/routes.py)
    if "portal" in faces:
        routes += portal.routes()  # /portal (poller/web/portal/pages.py)
    if "dashboard" in faces:
        routes += [
            *pages.routes(),
            Route("/login", login, methods=["GET", "POST"]),
            Route("/logout", logout, methods=["POST"]),
        ]
    if "dashboard" in faces or "portal" in faces:
        routes.append(Mount("/static", StaticFiles(directory=HERE / "static"), name="static"))

    @contextlib.asynccontextmanager
    async def default_lifespan(_app: Starlette) -> AsyncIterator[None]:
        yield

    app = Starlette(
        routes=routes,
        lifespan=lifespan or default_lifespan,
        exception_handlers={
            **dict.fromkeys(TRANSIENT, database_away),
            PollerError: expected_failure,
            HTTPException: rest.http_error,  # no route, wrong method: a problem under /api/
            Exception: unexpected_failure,  # a bug: 500 with an id in the log
        },
    )
    app.state.dashboard = Dashboard(settings, engine, creds, leases=leases)
    app.state.api_limits = auth.Limits(settings.api_rate_limit)
    bound = host_of(addr or settings.dashboard_addr or DASHBOARD_ADDR)
    return SecurityHeaders(app, loopback_only=loopback(bound), portal=portal.headers(settings))
