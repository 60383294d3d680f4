"""The tenant portal, ``/portal``: one tenant's people manage that tenant's endpoints
and see their deliveries (poller/access/portal.py makes the links and signs the sessions).

A page is that tenant's alone: another tenant's endpoint or message is "not found",
as one that does not exist. Each change is a form POST that must carry the
session's CSRF token and come from the portal's own origin (``Origin``,
``Sec-Fetch-Site``); forms are small (:data:`MAX_FORM_BYTES`); changes are
throttled per tenant with the API's limits. A signing secret is shown once, on the
page that answers its create or rotation, and never again.

The session cookie is ``HttpOnly``; ``SameSite=Lax`` when no site may embed the
portal, else ``SameSite=None; Secure; Partitioned``, which a browser sends inside
an iframe of an allowed origin (``POLLER_PORTAL_EMBED_ORIGINS``, which is also the
page's CSP ``frame-ancestors``).
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from poller.access import portal
from poller.endpoints.checks import tenant_endpoint_name
from poller.endpoints.keys import rotate_secret
from poller.endpoints.registry import (
    Endpoint,
    create_endpoint,
    get_endpoint,
    list_endpoints,
    make_room,
    set_enabled,
)
from poller.endpoints.view import seen_by
from poller.errors import (
    ConfigurationError,
    InvalidInput,
    MessageNotFound,
    NotFound,
    PollerError,
    PortalNotConfigured,
    UnknownEndpoint,
)
from poller.operate import admin
from poller.operate.replay import replay
from poller.outbox import catalog
from poller.outbox.enqueue import send_test_event
from poller.rules import actors, parse
from poller.rules.payloads import loads
from poller.rules.signing import Scheme, same_text
from poller.settings import Settings
from poller.web import auth
from poller.web.auth import Limits
from poller.web.base import HEADERS, MAX_FORM_BYTES, client_of, dashboard, form_too_big

log = logging.getLogger("poller.access.portal")
COOKIE = "poller_portal"
RECENT = 50  # deliveries shown on an endpoint's page

Page = Callable[[Request, portal.Session], Awaitable[Response]]


def _key(request: Request) -> bytes:
    """The portal's key, read when the portal is first used (poller/access/portal.py)."""
    state = request.app.state
    if getattr(state, "portal_key", None) is None:
        try:
            state.portal_key = portal.portal_key(dashboard(request).settings)
        except ConfigurationError:
            raise PortalNotConfigured from None
    key: bytes = state.portal_key
    return key


def headers(settings: Settings) -> list[tuple[bytes, bytes]]:
    """The portal's security headers: the dashboard's, but framed only by the origins
    of POLLER_PORTAL_EMBED_ORIGINS (checked to be bare origins). The referrer policy
    stays ``same-origin``: with ``no-referrer`` a browser sends ``Origin: null`` with
    the portal's own forms, and the same-origin check would refuse them."""
    ancestors = " ".join(settings.portal_embed_origins) or "'none'"
    csp = ("default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
           f"frame-ancestors {ancestors}; base-uri 'none'")  # fmt: skip
    shown = [(b"content-security-policy", csp.encode())]
    if not settings.portal_embed_origins:
        shown.append((b"x-frame-options", b"DENY"))
    kept = {b"content-security-policy", b"x-frame-options"}
    return shown + [(k, v) for k, v in HEADERS if k not in kept]


def render(request: Request, template: str, status: int = 200, **context: Any) -> HTMLResponse:
    session: portal.Session | None = request.scope.get("poller.portal")
    html = (
        dashboard(request)
        .templates.get_template(f"portal/{template}")
        .render(
            tenant=session.tenant if session else None,
            csrf=session.csrf(_key(request)) if session else "",
            **context,
        )
    )
    return HTMLResponse(html, status_code=status)


def refuse(request: Request, status: int, message: str) -> HTMLResponse:
    return render(request, "error.html", status, message=message)


def page(handler: Page) -> Callable[[Request], Awaitable[Response]]:
    """A portal page: its session (else 401), its tenant's data, its failures a page."""

    @functools.wraps(handler)
    async def guarded(request: Request) -> Response:
        try:
            session = portal.open_session(_key(request), request.cookies.get(COOKIE, ""))
        except PortalNotConfigured:
            return refuse(request, 503, "The portal is not set up here (POLLER_PORTAL_KEY).")
        except InvalidInput:
            return refuse(request, 401, "This portal session has ended: open the portal "
                          "again from your application.")  # fmt: skip
        request.scope["poller.portal"] = session
        try:
            return await handler(request, session)
        except NotFound:
            return refuse(request, 404, "Not found.")
        except PollerError as exc:
            return refuse(request, 422, str(exc))

    return guarded


def action(handler: Page) -> Callable[[Request], Awaitable[Response]]:
    """A change: the session's CSRF token, from the portal's own origin, throttled."""

    @page
    @functools.wraps(handler)
    async def guarded(request: Request, session: portal.Session) -> Response:
        if not auth.same_origin(request):
            return refuse(request, 403, "Refused: the request came from another site.")
        limits: Limits = request.app.state.api_limits
        if (wait := limits.wait(f"portal:{session.tenant}")) > 0:
            answer = refuse(request, 429, "Too many changes at once: wait and try again.")
            answer.headers["retry-after"] = str(max(1, math.ceil(wait)))
            return answer
        if form_too_big(request):
            return refuse(request, 413, f"A form of at most {MAX_FORM_BYTES} bytes, please.")
        form = await request.form()
        request.scope["poller.form"] = form
        offered = form.get("csrf")
        if not isinstance(offered, str) or not same_text(offered, session.csrf(_key(request))):
            return refuse(request, 403, "Refused: this form has expired; reload the page.")
        return await handler(request, session)

    return guarded


def _form(request: Request) -> FormData:
    form: FormData = request.scope["poller.form"]
    return form


def _text(form: FormData, name: str) -> str:
    value = form.get(name, "")
    return value.strip() if isinstance(value, str) else ""


async def _own(request: Request, session: portal.Session) -> Endpoint:
    name = request.path_params["name"]
    found = await dashboard(request).read(lambda conn: get_endpoint(conn, name))
    if found.tenant != session.tenant:
        raise UnknownEndpoint(name)
    return seen_by(found, session.tenant)


async def start(request: Request) -> Response:
    """Open a link: a session for its tenant, then the portal (the link leaves the bar)."""
    board = dashboard(request)
    client = client_of(request)
    # A link is signed (unguessable): it is checked whoever opens it, so a right one is
    # never held up by anyone's wrong ones (behind one proxy, tenants share an address);
    # wrong ones are counted per address and answered 429 past the limit.
    try:
        link = portal.read_link(_key(request), request.query_params.get("link", ""))
    except PortalNotConfigured:
        return refuse(request, 503, "The portal is not set up here (POLLER_PORTAL_KEY).")
    except InvalidInput as exc:
        board.token_failures.failed(client)
        log.warning("portal: refused a link from %s", client)
        if (wait := board.token_failures.wait(client)) > 0:
            answer = refuse(request, 429, "Too many wrong links: wait and try again.")
            answer.headers["retry-after"] = str(max(1, math.ceil(wait)))
            return answer
        return refuse(request, 401, str(exc))

    def spend() -> None:
        with board.engine.begin() as conn:
            portal.spend_link(conn, link)

    try:  # once: a link opened before is refused (poller/access/portal.py)
        await board.act(spend)
    except InvalidInput as exc:
        log.warning("portal: a link of tenant %s was opened again, from %s", link.tenant, client)
        return refuse(request, 401, str(exc))
    session = portal.session_for(link)
    opened = RedirectResponse("/portal/", 303)
    embedded = bool(board.settings.portal_embed_origins)
    opened.set_cookie(
        COOKIE,
        portal.session_cookie(_key(request), session),
        max_age=int(portal.SESSION.total_seconds()),
        path="/portal",
        httponly=True,
        secure=embedded or request.url.scheme == "https",
        samesite="none" if embedded else "lax",
    )
    if embedded:  # a third-party cookie a browser keeps for the embedding site alone
        opened.headers["set-cookie"] = opened.headers["set-cookie"] + "; Partitioned"
    return opened


@page
async def home(request: Request, session: portal.Session) -> Response:
    """The tenant's endpoints, and a form to add one with event types from the catalog."""

    def read(conn: Any) -> tuple[list[Endpoint], list[catalog.EventType]]:
        mine = list_endpoints(conn, tenant=session.tenant)
        types = [t for t in catalog.list_event_types(conn) if not t.deprecated]
        return sorted(mine, key=lambda e: e.created_at), types

    mine, types = await dashboard(request).read(read)
    return render(request, "home.html", endpoints=mine, event_types=types)


@action
async def add(request: Request, session: portal.Session) -> Response:
    form = _form(request)
    url = _text(form, "url")
    chosen = [str(v) for v in form.getlist("event_types") if isinstance(v, str) and v]
    raw_filter = _text(form, "payload_filter")
    try:
        payload_filter = loads(raw_filter) if raw_filter else None
    except ValueError:
        raise InvalidInput('The filter must be a JSON object, e.g. {"region": "eu"}.') from None
    board = dashboard(request)

    def write() -> Any:
        with board.engine.begin() as conn:
            make_room(conn, session.tenant, board.settings.tenant_max_endpoints)
            name = tenant_endpoint_name()
            return create_endpoint(conn, name, url, event_types=chosen, tenant=session.tenant,
                                   payload_filter=payload_filter,
                                   kinds=frozenset(board.settings.tenant_destinations))  # fmt: skip

    made = await run_in_threadpool(write)
    return await _show(request, session, made.endpoint, secret=made.secret, status=201)


async def _show(
    request: Request,
    session: portal.Session,
    endpoint: Endpoint,
    *,
    secret: str | None = None,
    status: int = 200,
    notice: str = "",
) -> Response:
    def read(conn: Any) -> list[dict[str, Any]]:
        return admin.list_messages(conn, endpoint=endpoint.name, tenant=session.tenant,
                                   limit=RECENT)  # fmt: skip

    recent = await dashboard(request).read(read)
    shown_secret = secret if endpoint.signing is Scheme.HMAC_SHA256 else None
    return render(request, "endpoint.html", status, endpoint=endpoint, secret=shown_secret,
                  messages=recent, notice=notice)  # fmt: skip


@page
async def endpoint_page(request: Request, session: portal.Session) -> Response:
    return await _show(request, session, await _own(request, session))


@action
async def change(request: Request, session: portal.Session) -> Response:
    """rotate, enable, disable, test or replay one of the tenant's endpoints."""
    found = await _own(request, session)
    verb = request.path_params["verb"]
    board = dashboard(request)
    who = actors.of_tenant(session.tenant, f"portal@{client_of(request)}")
    form = _form(request)

    def write() -> tuple[Endpoint, str | None, str]:
        with board.engine.begin() as conn:
            if verb == "rotate":
                rotated, key = rotate_secret(conn, found.name, timedelta(hours=24))
                return rotated, key, "A new signing secret; the old one also signs for 24 hours."
            if verb in ("enable", "disable"):
                done = set_enabled(conn, found.name, verb == "enable",
                                   None if verb == "enable" else f"disabled by {who}")  # fmt: skip
                return done, None, f"{verb.capitalize()}d."
            message_id, _ = send_test_event(conn, found.name, who, found.tenant)
            return found, None, f"Test event queued as message {message_id}."

    if verb == "replay":
        since = parse.moment(_text(form, "since") or "1h")
        done = await board.act(lambda: replay(board.engine, found.name, since=since, who=who))
        notice = (f"Replayed {done.events} events: {done.queued} queued, {done.resent} sent "
                  f"again, {done.open} still on their way.")  # fmt: skip
        return await _show(request, session, found, notice=notice)
    if verb not in ("rotate", "enable", "disable", "test"):
        raise UnknownEndpoint(found.name)
    endpoint, secret, notice = await run_in_threadpool(write)
    return await _show(request, session, endpoint, secret=secret, notice=notice)


async def _own_message(request: Request, session: portal.Session) -> dict[str, Any]:
    message_id = parse.row_id(request.path_params["id"])
    found = await dashboard(request).read(lambda conn: admin.message_detail(conn, message_id))
    owner = await dashboard(request).read(lambda conn: get_endpoint(conn, found["endpoint"]))
    if owner.tenant != session.tenant:
        raise MessageNotFound(f"no message {message_id}")
    return found


@page
async def message_page(request: Request, session: portal.Session) -> Response:
    return render(request, "message.html", message=await _own_message(request, session))


@action
async def retry(request: Request, session: portal.Session) -> Response:
    found = await _own_message(request, session)
    board = dashboard(request)
    plan = await board.read(lambda conn: admin.plan_retry(conn, [found["id"]]))
    if not plan.ids:
        raise InvalidInput(
            f"Message {found['id']} {plan.skipped.get(found['id'], 'cannot be retried')}."
        )
    who = actors.of_tenant(session.tenant, f"portal@{client_of(request)}")
    await board.act(lambda: admin.retry_messages(board.engine, plan.ids, who=who))
    return RedirectResponse(f"/portal/messages/{found['id']}", 303)


def routes() -> list[Route]:
    return [
        Route("/portal/start", start, methods=["GET"]),
        Route("/portal/", home, methods=["GET"]),
        Route("/portal/endpoints", add, methods=["POST"]),
        Route("/portal/endpoints/{name}", endpoint_page, methods=["GET"]),
        Route("/portal/endpoints/{name}/{verb}", change, methods=["POST"]),
        Route("/portal/messages/{id}", message_page, methods=["GET"]),
        Route("/portal/messages/{id}/retry", retry, methods=["POST"]),
    ]
