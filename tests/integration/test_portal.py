"""The tenant portal (poller/access/portal.py, poller/web/portal/pages.py) in process: links
and sessions, one tenant's pages alone, changes only with the session's CSRF token from
the portal's own origin, headers that let only the configured origins frame it. The
whole journey in Chromium is in tests/browser/test_portal_browser.py."""

from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from urllib.parse import parse_qs, urlparse

import pytest
from sqlalchemy import Engine, text
from starlette.testclient import TestClient

from poller.access import portal
from poller.endpoints.registry import create_endpoint, set_enabled
from poller.errors import ConfigurationError, InvalidInput
from poller.settings import load_settings
from tests.integration.test_dashboard import client

KEY = "portal-test-key-0123456789abcdef0123"
SECRET_SHOWN = re.compile(r"whsec_[A-Za-z0-9+/=]+")


def _link(tenant: str, **extra: object) -> str:
    settings = load_settings(portal_key=KEY, **extra)
    return portal.portal_link(tenant, settings=settings, base_url="http://127.0.0.1:8188")


def _open(web: TestClient, tenant: str) -> str:
    """Start a session for ``tenant``; the CSRF token of its home page."""
    started = web.get(_link(tenant).removeprefix("http://127.0.0.1:8188"))
    assert started.status_code == 303 and started.headers["location"] == "/portal/"
    home = web.get("/portal/")
    assert home.status_code == 200
    found = re.search(r'name="csrf" value="([^"]+)"', home.text)
    assert found
    return found.group(1)


def test_links_open_only_for_their_tenant_until_they_expire() -> None:
    key = portal.portal_key(load_settings(portal_key=KEY))
    token = parse_qs(urlparse(_link("acme")).query)["link"][0]
    assert portal.read_link(key, token).tenant == "acme"
    name, expires, nonce, _ = token.split(".")
    for forged in (token[:-2] + "xx", token.replace("YWNtZQ", "Z2xvYmV4"), "", "a.b.c.d",
                   "x" * 5000, token + ".x", f"{name}.{expires}.{nonce}.\x80é",
                   f"{name}.²³.{nonce}.x"):  # fmt: skip
        with pytest.raises(InvalidInput):
            portal.read_link(key, forged)
    with pytest.raises(InvalidInput):  # a link is no session, nor the other way round
        portal.open_session(key, token)
    with pytest.raises(InvalidInput):
        portal.read_link(key, token, now=time.time() + 16 * 60)
    other = portal.portal_key(load_settings(portal_key="another-key-" + "9" * 24))
    with pytest.raises(InvalidInput):
        portal.read_link(other, token)
    with pytest.raises(InvalidInput):
        portal.portal_link("acme", timedelta(days=2), settings=load_settings(portal_key=KEY))
    with pytest.raises(InvalidInput):
        portal.portal_link("no spaces", settings=load_settings(portal_key=KEY))
    with pytest.raises(ConfigurationError, match="POLLER_PORTAL_KEY"):
        portal.portal_link("acme", settings=load_settings(database_url="postgresql://h/db"))
    no_addr = load_settings(portal_key=KEY, dashboard_addr="")  # it was "http://None/…"
    assert portal.portal_link("acme", settings=no_addr).startswith("http://127.0.0.1:8188/portal/")


def test_a_link_opens_the_portal_once(engine: Engine) -> None:
    link = _link("acme").removeprefix("http://127.0.0.1:8188")
    with client(engine, portal_key=KEY) as web:
        assert web.get(link).status_code == 303
        web.cookies.clear()
        again = web.get(link)  # from a history, a log, a proxy: refused
        assert again.status_code == 401 and "opened already" in again.text
        assert web.get("/portal/").status_code == 401  # and no session came of it
        assert web.get(_link("acme").removeprefix("http://127.0.0.1:8188")).status_code == 303
    key = portal.portal_key(load_settings(portal_key=KEY))
    token = parse_qs(urlparse(_link("globex")).query)["link"][0]
    opened = portal.read_link(key, token)

    def spend() -> bool:
        try:
            with engine.begin() as conn:
                portal.spend_link(conn, opened)
        except InvalidInput:
            return False
        return True

    with ThreadPoolExecutor(8) as pool:  # the same link, eight times at once: one opens it
        assert sorted(pool.map(lambda _: spend(), range(8))) == [False] * 7 + [True]
    with engine.begin() as conn:  # an hour past its expiry, a used link's row goes
        conn.execute(
            text("UPDATE poller_portal_links_used SET expires_at = now() - interval '2 hours'")
        )
    spend()
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM poller_portal_links_used")).scalar() == 1


def test_wrong_links_from_an_address_hold_up_no_right_one(engine: Engine) -> None:
    """Tenants behind one ingress share its address: past the limit its wrong links are
    answered 429, and another tenant's right link still opens (it used to wait 60 s)."""
    with client(engine, portal_key=KEY) as web:
        for n in range(20):
            last = web.get(f"/portal/start?link=forged-{n}")
        assert last.status_code == 429 and last.headers["retry-after"]
        assert web.get(_link("acme").removeprefix("http://127.0.0.1:8188")).status_code == 303


def test_a_tenant_sees_operator_where_the_operator_acted(engine: Engine) -> None:
    with engine.begin() as conn:
        create_endpoint(conn, "acme-hooks", "https://acme.example/in", tenant="acme")
        set_enabled(conn, "acme-hooks", False, "disabled by admin:root@db-host-7")
    with client(engine, portal_key=KEY) as web:
        _open(web, "acme")
        page = web.get("/portal/endpoints/acme-hooks").text
    assert "disabled by operator" in page and "db-host-7" not in page


def test_a_tenant_sees_and_changes_its_own_endpoints_alone(engine: Engine) -> None:
    with engine.begin() as conn:
        create_endpoint(conn, "globex-hooks", "https://globex.example/in", tenant="globex")
        create_endpoint(conn, "billing", "https://billing.example/in")
    with client(engine, portal_key=KEY) as web:
        csrf = _open(web, "acme")
        form = {"csrf": csrf, "url": "https://acme.example/in", "event_types": ["order.paid"]}
        made = web.post("/portal/endpoints", data=form)
        assert made.status_code == 201 and len(SECRET_SHOWN.findall(made.text)) == 1
        name = re.search(r"/portal/endpoints/(ep_[0-9a-f]{16})/", made.text).group(1)  # type: ignore[union-attr]
        page = web.get(f"/portal/endpoints/{name}")
        assert page.status_code == 200 and not SECRET_SHOWN.search(page.text)  # shown once
        home = web.get("/portal/").text
        assert name in home and "globex" not in home and "billing" not in home
        for path in ("/portal/endpoints/globex-hooks", "/portal/endpoints/billing"):
            assert web.get(path).status_code == 404
            assert web.post(f"{path}/disable", data={"csrf": csrf}).status_code == 404
        refused = [
            web.post(f"/portal/endpoints/{name}/disable", data={}),  # no token
            web.post(f"/portal/endpoints/{name}/disable", data={"csrf": csrf + "x"}),
            web.post(
                f"/portal/endpoints/{name}/disable",
                data={"csrf": csrf},
                headers={"origin": "https://evil.example"},
            ),
        ]
        assert [r.status_code for r in refused] == [403, 403, 403]
        rotated = web.post(f"/portal/endpoints/{name}/rotate", data={"csrf": csrf})
        assert rotated.status_code == 200 and len(SECRET_SHOWN.findall(rotated.text)) == 1
        bad = web.post("/portal/endpoints", data={"csrf": csrf, "url": "https://a.example",
                                                  "payload_filter": "{nope"})  # fmt: skip
        assert bad.status_code == 422 and "Traceback" not in bad.text
        _open(web, "globex")  # the same browser, now globex: acme's endpoint is gone
        assert web.get(f"/portal/endpoints/{name}").status_code == 404
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT name, tenant, enabled FROM poller_endpoints "
                                 "ORDER BY name")).all()  # fmt: skip
    assert [(r.tenant, r.enabled) for r in rows] == [(None, True), ("acme", True),
                                                     ("globex", True)]  # fmt: skip


def test_a_tenant_full_of_endpoints_is_told_so(engine: Engine) -> None:
    with engine.begin() as conn:
        create_endpoint(conn, "acme-1", "https://acme.example/1", tenant="acme")
    with client(engine, portal_key=KEY, tenant_max_endpoints=2) as web:
        csrf = _open(web, "acme")
        form = {"csrf": csrf, "url": "https://acme.example/in"}
        assert web.post("/portal/endpoints", data=form).status_code == 201
        full = web.post("/portal/endpoints", data=form)
        assert full.status_code == 422 and "has 2 endpoints" in full.text
        assert "Traceback" not in full.text
    with engine.connect() as conn:
        held = "SELECT count(*) FROM poller_endpoints WHERE tenant = 'acme'"
        assert conn.execute(text(held)).scalar_one() == 2


def test_the_portal_is_framed_only_by_the_origins_allowed(engine: Engine) -> None:
    with client(engine, portal_key=KEY) as web:
        answer = web.get(_link("acme").removeprefix("http://127.0.0.1:8188"))
        assert "frame-ancestors 'none'" in answer.headers["content-security-policy"]
        assert answer.headers["x-frame-options"] == "DENY"
        cookie = answer.headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=lax" in cookie and "path=/portal" in cookie
        assert web.get("/portal/").status_code == 200  # the cookie is kept
    embed = ("https://app.example.com", "http://localhost:3000")
    with client(engine, portal_key=KEY, portal_embed_origins=embed) as web:
        answer = web.get(_link("acme").removeprefix("http://127.0.0.1:8188"))
        csp = answer.headers["content-security-policy"]
        assert "frame-ancestors https://app.example.com http://localhost:3000;" in csp
        assert "x-frame-options" not in answer.headers
        cookie = answer.headers["set-cookie"].lower()
        assert "samesite=none" in cookie and "secure" in cookie and "partitioned" in cookie
        assert web.get("/").headers["x-frame-options"] == "DENY"  # the dashboard: never
    for nasty in ({"portal_embed_origins": ("https://a.example; script-src *",)},
                  {"portal_embed_origins": ("https://a.example/path",)},
                  {"portal_embed_origins": ("*",)},
                  {"portal_url": "https://hooks.example/?x=1"},
                  {"portal_url": "javascript:alert(1)"},
                  {"portal_url": "https://a b.example"},
                  {"portal_key": "short"},
                  {"portal_key": "x" * 31 + "\n"}):  # fmt: skip
        with pytest.raises(ConfigurationError):
            load_settings(**nasty)


def test_without_a_key_or_a_session_the_portal_says_so(engine: Engine) -> None:
    with client(engine, portal_key=KEY) as web:
        ended = web.get("/portal/")
        assert ended.status_code == 401 and "open the portal again" in ended.text
        assert web.get("/portal/start?link=forged").status_code == 401
    with client(engine, database_url="postgresql://h/db") as web:
        answer = web.get("/portal/start?link=x")
        assert answer.status_code == 503 and "POLLER_PORTAL_KEY" in answer.text


def test_credentials_of_any_characters_are_refused_never_a_crash(engine: Engine) -> None:
    """compare_digest raises on text that is not ASCII: a cookie, a CSRF field, a link."""
    from tests.integration.test_dashboard import TOKEN

    with client(engine, portal_key=KEY) as web:
        csrf = _open(web, "acme")
        with engine.begin() as conn:
            create_endpoint(conn, "mine", "https://acme.example/in", tenant="acme")
        answer = web.post("/portal/endpoints/mine/disable", data={"csrf": "\x80é" + csrf})
        assert answer.status_code == 403
        assert web.get("/portal/start?link=YWNtZQ.1.x.%C3%A9").status_code == 401
        web.cookies.clear()
        garbled = "poller_portal=YWNtZQ.²³.x.é".encode()  # a cookie header as a browser may
        assert web.get("/portal/", headers={"cookie": garbled}).status_code == 401
    with client(engine) as web:
        garbled = "poller_dashboard=¹²³.nonce.é".encode()
        assert web.get("/", headers={"cookie": garbled}).status_code == 303  # to the login
        assert web.get(f"/login?token={TOKEN}").status_code == 303
        answer = web.post("/endpoints/mine/disable", data={"csrf": "é"})
        assert answer.status_code == 403
