"""What every web face stands on: authentication, security headers, rendering.

The faces (poller/web/dashboard, poller/web/api, poller/web/portal) get from here
:class:`Dashboard` (the app's state: the database, the credentials, the renderer; named
for the first face) and the decorators that guard pages (:func:`page` for reads,
:func:`action` for POSTs); poller/web/app.py puts them together into one ASGI app.
"""

from __future__ import annotations

import functools
import ipaddress
import logging
import math
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

import jinja2
from sqlalchemy import Connection, Engine
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from poller.errors import NotFound
from poller.settings import Settings
from poller.web import auth

log = logging.getLogger("poller.web")

HERE = Path(__file__).parent
REFRESH_SECONDS = 5
MAX_FORM_BYTES = 64 * 1024

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"same-origin"),
    (b"cache-control", b"no-store"),
    (b"cross-origin-opener-policy", b"same-origin"),
]

T = TypeVar("T")


class Dashboard:
    """What every page needs: the database, who may come in, and the renderer."""

    def __init__(
        self,
        settings: Settings,
        engine: Engine,
        creds: auth.Credentials,
        *,
        leases: Callable[[], Awaitable[list[Any]]] | None = None,
    ) -> None:
        self.settings = settings
        self.engine = engine
        self.creds = creds
        self.read_only = settings.dashboard_read_only
        self.leases = leases  # poller/claim/shards.py lease_holdings, bound to an elector
        self.throttle = auth.Throttle()  # credentials no other site can make a browser send
        self.link_throttle = auth.Throttle()  # /login?token= links, which any page can
        self.token_failures = auth.Throttle()  # API tokens and portal links: checked first
        self.proxies = auth.proxies(settings.forwarded_allow_ips)  # POLLER_FORWARDED_ALLOW_IPS
        self.templates = jinja2.Environment(
            loader=jinja2.FileSystemLoader(HERE / "templates"),
            autoescape=True,  # every value is text, whatever it contains
            undefined=jinja2.StrictUndefined,
        )
        self.templates.filters["urlq"] = lambda v: quote(str(v), safe="")

    async def read(self, fn: Callable[[Connection], T]) -> T:
        """``fn(conn)`` in a worker thread (the admin functions are synchronous)."""

        def run() -> T:
            with self.engine.connect() as conn:
                return fn(conn)

        return await run_in_threadpool(run)

    async def act(self, fn: Callable[[], T]) -> T:
        return await run_in_threadpool(fn)

    def render(
        self, request: Request, template: str, status: int = 200, **context: Any
    ) -> HTMLResponse:
        identity: auth.Identity | None = request.scope.get("poller.identity")
        fragment = request.headers.get("x-poller-refresh") == "1"
        html = self.templates.get_template(template).render(
            request=request,
            path=request.url.path,
            fragment=fragment,
            refresh=context.pop("refresh", 0),
            read_only=self.read_only,
            csrf=auth.csrf_token(self.creds, identity) if identity else "",
            who=identity.who if identity else None,
            **context,
        )
        return HTMLResponse(html, status_code=status)

    def error(self, request: Request, status: int, message: str) -> HTMLResponse:
        return self.render(request, "error.html", status, message=message)


def dashboard(request: Request) -> Dashboard:
    board: Dashboard = request.app.state.dashboard
    return board


def client_of(request: Request) -> str:
    """The client's address: the peer's, or the one a trusted proxy's ``X-Forwarded-For``
    names (POLLER_FORWARDED_ALLOW_IPS, :func:`poller.web.auth.client_address`)."""
    peer = request.client.host if request.client else "unknown"
    return auth.client_address(
        peer, request.headers.get("x-forwarded-for"), dashboard(request).proxies
    )


def too_many(board: Dashboard, request: Request, wait: float) -> Response:
    response = board.error(request, 429, "too many wrong credentials: wait and try again")
    response.headers["retry-after"] = str(max(1, math.ceil(wait)))
    return response


def identify(
    board: Dashboard, request: Request, *, cookies: bool = True
) -> auth.Identity | Response | None:
    """Who sent this request; a 429 response while its address is throttled for
    guessing; None when it carries no valid credential (a wrong one is counted).
    ``cookies``: whether a session cookie counts (the pages; never the API)."""
    presented = "authorization" in request.headers
    client = client_of(request)
    if presented and (wait := board.throttle.wait(client)) > 0:
        return too_many(board, request, wait)
    identity = auth.identify(board.creds, request, cookies=cookies)
    if identity is None and presented:
        board.throttle.failed(client)
        log.warning("dashboard: wrong credentials from %s", client)
    return identity


def authenticate(
    board: Dashboard, request: Request, refuse: Callable[[Dashboard, Request], Response]
) -> Response | None:
    """None when the request carries valid credentials (its identity is then in the
    scope); else the throttle's 429 or what ``refuse`` answers."""
    identity = identify(board, request)
    if isinstance(identity, Response):
        return identity
    if identity is None:
        return refuse(board, request)
    request.scope["poller.identity"] = identity
    return None


def form_too_big(request: Request) -> bool:
    """Forms carry a Content-Length; a stream or a big body is refused unread."""
    size = request.headers.get("content-length", "")
    return not size.isdigit() or int(size) > MAX_FORM_BYTES


def who(request: Request) -> str:
    """The actor recorded for an action: ``dashboard:<who>@<client address>``."""
    identity: auth.Identity = request.scope["poller.identity"]
    return f"dashboard:{identity.who}@{client_of(request)}"


Handler = Callable[[Request], Awaitable[Response]]


def page(handler: Handler) -> Handler:
    """A page: the request must be authenticated (else the login page, or a basic
    challenge when basic credentials are the only kind)."""

    def refuse(board: Dashboard, request: Request) -> Response:
        if board.creds.token is None:
            return Response(
                "authentication required",
                401,
                {"www-authenticate": 'Basic realm="poller serve", charset="UTF-8"'},
            )
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return RedirectResponse(f"/login?next={quote(target, safe='')}", 303)

    @functools.wraps(handler)
    async def guarded(request: Request) -> Response:
        refused = authenticate(dashboard(request), request, refuse)
        return refused if refused is not None else await handler(request)

    return guarded


def action(handler: Handler) -> Handler:
    """A change: authenticated, not read-only, from this site, with the CSRF token."""

    @functools.wraps(handler)
    async def guarded(request: Request) -> Response:
        board = dashboard(request)
        refused = authenticate(board, request, lambda *_: Response("authentication required", 401))
        if refused is not None:
            return refused
        if board.read_only:
            return board.error(request, 403, "the dashboard is read-only")
        if not auth.same_origin(request):
            return board.error(request, 403, "refused: the request came from another site")
        if form_too_big(request):
            return board.error(request, 413, f"a form of at most {MAX_FORM_BYTES} bytes, please")
        form = await request.form()
        request.scope["poller.form"] = form
        offered = form.get("csrf")
        identity = request.scope["poller.identity"]
        if not auth.csrf_ok(board.creds, identity, offered if isinstance(offered, str) else None):
            return board.error(request, 403, "refused: missing or wrong CSRF token; reload")
        return await handler(request)

    return guarded


def safe_next(target: str | None) -> str:
    """A local path to go back to after logging in; anything else goes home. Browsers
    drop tabs and newlines from a URL (``/\\t/evil.example`` becomes ``//evil.example``,
    another site) and read ``\\`` as ``/``: a target holding either goes home too."""
    if (
        not target
        or not target.startswith("/")
        or target.startswith("//")
        or "\\" in target
        or not target.isprintable()
        or any(c.isspace() for c in target)
    ):
        return "/"
    return target


def logged_in(board: Dashboard, target: str) -> Response:
    response = RedirectResponse(safe_next(target), 303)
    response.set_cookie(
        auth.COOKIE,
        auth.new_session(board.creds),
        max_age=auth.SESSION_HOURS * 3600,
        httponly=True,
        samesite="strict",
        path="/",
    )
    return response


async def login(request: Request) -> Response:
    board = dashboard(request)
    client = client_of(request)
    target = request.query_params.get("next", "/")
    # A login link (GET) can be fired by any page the operator visits, as an image,
    # from the operator's own address: its wrong tokens count against links alone,
    # so such a page can never throttle the form, basic or bearer credentials.
    throttle = board.link_throttle
    if request.method == "POST":
        if not auth.same_origin(request):
            return board.error(request, 403, "refused: the request came from another site")
        if form_too_big(request):
            return board.error(request, 413, f"a form of at most {MAX_FORM_BYTES} bytes, please")
        form = await request.form()
        offered = form.get("token")
        target = str(form.get("next") or "/")
        throttle = board.throttle
    else:
        offered = request.query_params.get("token")
    if isinstance(offered, str) and offered:
        if (wait := throttle.wait(client)) > 0:
            return too_many(board, request, wait)
        if auth.token_matches(board.creds, offered.strip()):
            log.info("dashboard: login from %s", client)
            return logged_in(board, target)
        throttle.failed(client)
        log.warning("dashboard: wrong token from %s", client)
        return board.render(request, "login.html", 401, next=safe_next(target), wrong=True)
    return board.render(request, "login.html", next=safe_next(target), wrong=False)


@action
async def logout(request: Request) -> Response:
    response = RedirectResponse("/login", 303)
    response.delete_cookie(auth.COOKIE, path="/")
    return response


async def expected_failure(request: Request, exc: Exception) -> Response:
    """An expected failure no page handled itself (poller/errors.py): a status page, 404
    for :class:`~poller.errors.NotFound`, 400 for any other; never a traceback."""
    status = 404 if isinstance(exc, NotFound) else 400
    return dashboard(request).error(request, status, str(exc))


async def database_away(request: Request, exc: Exception) -> Response:
    """A page whose database is away or busy: 503 and one log line, not a traceback."""
    reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    log.warning("dashboard: database unavailable: %s", reason[0] if reason else type(exc).__name__)
    return dashboard(request).error(
        request, 503, "The database is not answering. This page works again once it does."
    )


def loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address, IPv6 with or without brackets) is this
    machine's loopback."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host.lower() in ("localhost", "localhost.")


def host_of(header: str) -> str:
    """The host of a Host header: ``[::1]:8188`` → ``[::1]``, ``a:80`` → ``a``."""
    if header.startswith("["):
        return header.split("]", 1)[0] + "]"
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class SecurityHeaders:
    """Adds the headers in :data:`HEADERS` to every response, static files included
    (the portal's own to its pages).

    Served on loopback, it answers only requests whose Host is loopback too: a page
    on ``evil.example`` whose name is re-pointed to 127.0.0.1 (DNS rebinding) reaches
    the port as its own origin, and is refused here before any route."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        loopback_only: bool = False,
        portal: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        self.app = app
        self.loopback_only = loopback_only
        self.portal = portal or HEADERS  # /portal/…: poller/web/portal/pages.py

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        added = self.portal if scope.get("path", "").startswith("/portal/") else HEADERS

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *added]
            await send(message)

        if self.loopback_only:
            host = dict(scope.get("headers") or []).get(b"host", b"").decode("latin-1")
            if not loopback(host_of(host)):
                refused = Response("unexpected Host header: open the dashboard by 127.0.0.1", 421)
                await refused(scope, receive, with_headers)
                return
        await self.app(scope, receive, with_headers)
