"""The tenant portal in Chromium, as a tenant's person uses it: open the link the
application gave, add an endpoint with event types from the catalog, copy its secret,
send a test event and see its attempt arrive, retry a failed delivery; another
tenant's endpoint is not there, a forged cross-site POST and an expired link are
refused. Real processes: ``poller serve``, ``poller run``, ``poller receiver``."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import Engine, text

from poller.access import portal
from poller.endpoints.registry import create_endpoint
from poller.outbox.catalog import define_event_type
from poller.outbox.enqueue import enqueue
from poller.settings import load_settings
from tests.acceptance.procs import poller_env, receiver, started, stats, wait_until
from tests.browser.test_dashboard_browser import TOKEN, browser_page, pytestmark, shot

__all__ = ["browser_page", "pytestmark"]
KEY = "portal-browser-key-0123456789abcdefgh"


def test_a_tenant_manages_its_webhooks_in_the_portal(
    engine: Engine, db_url: str, tmp_path: Path, browser_page: Any
) -> None:
    page = browser_page
    with engine.begin() as conn:
        define_event_type(conn, "order.paid", description="An order was paid")
        define_event_type(conn, "order.refunded", description="An order was refunded")
        create_endpoint(conn, "globex-secret-hooks", "https://globex.example/in", tenant="globex")
        create_endpoint(conn, "acme-old", "https://acme.example/old", tenant="acme")
        failed = enqueue(conn, endpoint="acme-old", event_type="order.paid", payload={"n": 1},
                         idempotency_key="old-1")  # fmt: skip
        conn.execute(text("UPDATE poller_outbox SET status = 'failed', failed_at = now(), "
                          "attempts = max_attempts WHERE id = :id"), {"id": failed})  # fmt: skip
    with receiver(tmp_path) as (_, receiver_url):
        env = poller_env(POLLER_DATABASE_URL=db_url, POLLER_DASHBOARD_TOKEN=TOKEN,
                         POLLER_PORTAL_KEY=KEY)  # fmt: skip
        with started(["serve", "--addr", "127.0.0.1:0"], env, tmp_path / "dash.log") as dash:
            port = dash.wait_for(r"on http://127\.0\.0\.1:(\d+)/").group(1)
            base = f"http://127.0.0.1:{port}"
            settings = load_settings(portal_key=KEY)
            link = portal.portal_link("acme", settings=settings, base_url=base)

            page.goto(link)
            page.wait_for_url(f"{base}/portal/")
            assert "acme-old" in page.locator("main").inner_text()
            assert "globex" not in page.content()
            shot(page, "portal-home")

            page.fill("input[name=url]", f"{receiver_url}/acme")
            page.check("input[value='order.paid']")
            page.click("button:has-text('Add endpoint')")
            secret = page.locator("#secret pre").inner_text()
            assert secret.startswith("whsec_")
            shot(page, "portal-endpoint-made")

            with started(["run", "--id", "portal"], env, tmp_path / "run.log"):
                page.click("button:has-text('Send a test event')")
                notice = page.locator("[role=status]").inner_text()
                message_id = re.search(r"message (\d+)", notice).group(1)  # type: ignore[union-attr]
                assert "whsec_" not in page.content()  # the secret was shown once
                wait_until(lambda: stats(receiver_url)["received"] >= 1, timeout=30)
                page.click(f"a[href='/portal/messages/{message_id}']")
                wait_until(lambda: _delivered(page), timeout=30)
                attempts = page.locator("table").inner_text()
                assert "delivered" in attempts and "200" in attempts
                shot(page, "portal-delivery")

                page.goto(f"{base}/portal/messages/{failed}")
                page.click("button:has-text('Send it again')")
                page.wait_for_url(f"{base}/portal/messages/{failed}")
                assert page.locator("h1 .state").inner_text() in ("pending", "in_flight", "failed")

            assert "Not found" in _text_of(page, f"{base}/portal/endpoints/globex-secret-hooks")
            cookies = {c["name"]: c["value"] for c in page.context.cookies()}
            forged = httpx.post(f"{base}/portal/endpoints/acme-old/disable",
                                cookies=cookies, data={"csrf": "forged"},
                                headers={"origin": "https://evil.example"})  # fmt: skip
            assert forged.status_code == 403
            expired = (
                base
                + "/portal/start?link="
                + portal._sign(portal.portal_key(settings), "link", "acme", time.time() - 1)
            )
            assert "expired" in _text_of(page, expired)
    with engine.connect() as conn:
        state = dict(conn.execute(text("SELECT name, enabled FROM poller_endpoints")).all())
        attempts = "SELECT outcome FROM poller_delivery_attempts WHERE message_id = :id"
        retried = conn.execute(text(attempts), {"id": failed}).scalars().all()
    assert state["acme-old"] is True and state["globex-secret-hooks"] is True
    assert "manual_retry" in retried


def _delivered(page: Any) -> bool:
    page.reload()
    return bool(page.locator("h1 .state").inner_text() == "delivered")


def _text_of(page: Any, url: str) -> str:
    page.goto(url)
    return str(page.locator("main").inner_text())
