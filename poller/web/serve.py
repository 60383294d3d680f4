"""Serving the dashboard: the app wired to a database and an elector, and a socket.

This is the dashboard's entry point: the CLI (``poller serve``, ``poller demo
--dashboard``) imports this module and nothing else of the dashboard's (an
import-linter contract in pyproject.toml), so the faces share no code.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import socket
from collections.abc import AsyncIterator, Callable, Collection, Mapping
from typing import Any

from sqlalchemy import Engine
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from poller.errors import ConfigurationError
from poller.settings import DASHBOARD_ADDR, Settings
from poller.store.db import async_engine
from poller.web import auth
from poller.web.app import FACES as FACES
from poller.web.app import create_app
from poller.web.auth import Credentials as Credentials
from poller.web.auth import credentials as credentials
from poller.web.base import loopback as loopback

log = logging.getLogger("poller.web")

DEFAULT_ADDR = DASHBOARD_ADDR


def build(
    settings: Settings,
    url: str,
    engine: Engine,
    creds: auth.Credentials,
    listeners: Mapping[int, tuple[str, Collection[str]]] | None = None,
) -> ASGIApp:
    """The app, with a lease reader that holds its own async engine and elector while the
    app runs (its lifespan). ``listeners`` ({port: (address, faces)}, the sockets bound):
    each port serves only its faces (:func:`by_port`); else every face, on
    POLLER_DASHBOARD_ADDR."""
    state: dict[str, Any] = {}

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        from poller.election import make_elector

        state["engine"] = async_engine(url, pool_size=1, max_overflow=1)
        state["elector"] = make_elector(
            settings.election_backend,
            owner="dashboard",
            engine=state["engine"],
            redis_url=settings.redis_url,
        )
        try:
            yield
        finally:
            await state["elector"].close()
            await state["engine"].dispose()

    async def leases() -> list[Any]:
        from poller.claim.shards import lease_holdings

        return await lease_holdings(state["elector"], state["engine"])

    if not listeners:
        return create_app(settings, engine, creds, leases=leases, lifespan=lifespan)
    apps = {
        port: create_app(settings, engine, creds, faces=faces, addr=addr, leases=leases)
        for port, (addr, faces) in listeners.items()
    }
    return by_port(apps, lifespan)


def by_port(
    apps: Mapping[int, ASGIApp],
    lifespan: Callable[[Starlette], contextlib.AbstractAsyncContextManager[None]],
) -> ASGIApp:
    """One server, several sockets: each request goes to the app of the port it came in
    on (the ASGI scope's ``server``); the lifespan is run once, for them all."""
    own = Starlette(lifespan=lifespan)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await own(scope, receive, send)
            return
        port = (scope.get("server") or (None, 0))[1]
        await apps.get(port if isinstance(port, int) else 0, _no_such_listener)(
            scope, receive, send
        )

    return app


async def _no_such_listener(scope: Scope, receive: Receive, send: Send) -> None:
    await PlainTextResponse("not served here", 404)(scope, receive, send)


def bind(addr: str, setting: str = "POLLER_DASHBOARD_ADDR") -> socket.socket:
    """A listening socket on ``host:port``; ConfigurationError (one line, naming
    ``setting``) if it cannot be."""
    host, _, port = addr.rpartition(":")
    host = host.strip("[]")
    try:
        family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    except ValueError:
        family = socket.AF_INET  # a name: resolved by bind
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, int(port)))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise ConfigurationError(
            f"{setting}={addr}: cannot listen there: {exc.strerror or exc}"
        ) from None
    return sock


def serve(app: ASGIApp, sock: socket.socket | list[socket.socket]) -> None:
    """Serve until SIGINT/SIGTERM, then return (uvicorn; no access log: login links
    carry the token).

    uvicorn shuts down gracefully on the signal and then raises it again under the
    handler that was there before it started — the default one would end the
    process before its caller's cleanup (the demo's embedded servers). So a handler
    that does nothing is that one, while it serves."""
    import signal

    import uvicorn

    # proxy_headers off: uvicorn would take X-Forwarded-For from 127.0.0.1 by default,
    # and the app reads it only from the proxies POLLER_FORWARDED_ALLOW_IPS names
    # (poller/web/auth.py client_address).
    config = uvicorn.Config(
        app, log_level="warning", access_log=False, lifespan="on", proxy_headers=False
    )
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        uvicorn.Server(config).run(sockets=sock if isinstance(sock, list) else [sock])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
