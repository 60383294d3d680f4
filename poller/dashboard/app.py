"""The dashboard as one ASGI app: the pages (poller/dashboard/pages.py) on the
ground every page stands on (poller/dashboard/web.py)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from typing import Any

from sqlalchemy import Engine
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp

from poller.dashboard import api, auth, pages, portal, rest
from poller.dashboard.web import (
    HERE,
    Dashboard,
    SecurityHeaders,
    database_away,
    expected_failure,
    host_of,
    login,
    logout,
    loopback,
)
from poller.db import TRANSIENT
from poller.errors import ConfigurationError, PollerError
from poller.settings import DASHBOARD_ADDR, Settings

FACES = ("dashboard", "api", "portal")
"""What a listener may serve: the operator's pages, the management API (/api/v1), the
tenant portal (/portal)."""


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
    ``leases``: reads the shard leases (``poller dashboard`` binds it to an elector)."""
    unknown = sorted(set(faces) - set(FACES))
    if unknown or not faces:
        raise ConfigurationError(f"faces {', '.join(unknown) or '(none)'}: a selection of "
                                 f"{', '.join(FACES)}")  # fmt: skip
    routes: list[BaseRoute] = []
    if "api" in faces:
        routes += api.routes()  # /api/v1 (poller/dashboard/api.py)
    if "portal" in faces:
        routes += portal.routes()  # /portal (poller/dashboard/portal.py)
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
        },
    )
    app.state.dashboard = Dashboard(settings, engine, creds, leases=leases)
    app.state.api_limits = rest.Limits(settings.api_rate_limit)
    bound = host_of(addr or settings.dashboard_addr or DASHBOARD_ADDR)
    return SecurityHeaders(app, loopback_only=loopback(bound), portal=portal.headers(settings))
