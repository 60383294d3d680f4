"""The dashboard in a real browser: Playwright driving Debian's Chromium.

Real processes all the way: ``poller serve`` and ``poller receiver`` as
subprocesses, a ``poller run`` that delivers what the page retries, PostgreSQL.
Screenshots of every page go to ``.pytest-output/dashboard/`` (the docs' comes
from here). ``make browser`` installs Chromium; without it these tests skip,
saying why.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, text

from poller.outbox.enqueue import Message, enqueue_many
from tests.acceptance.procs import poller_env, receiver, started, stats, wait_until
from tests.conftest import make_endpoint, repo_root

CHROMIUM = os.environ.get("POLLER_TEST_CHROMIUM", "/usr/bin/chromium")
TOKEN = "browser-test-token-0123456789"
HOSTILE = "<script>document.title='pwned'</script><img src=x onerror=\"alert(1)\">"
SHOTS = repo_root() / ".pytest-output" / "dashboard"
# As FACTS.md: without the background-networking flags this closed network refuses
# Chromium's connections many at a time.
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not os.access(CHROMIUM, os.X_OK),
        reason=f"no Chromium at {CHROMIUM}: `make browser` installs Debian's (needs root and "
        "apt-get), or set POLLER_TEST_CHROMIUM",
    ),
]


@pytest.fixture
def browser_page(tmp_path: Path) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        try:
            page = browser.new_context(viewport={"width": 1280, "height": 860}).new_page()
            page.set_default_timeout(15_000)
            yield page
        finally:
            browser.close()


def shot(page: Any, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def db_counts(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT status, count(*) FROM poller_outbox GROUP BY status"))
        return {status: int(n) for status, n in rows}


def test_operator_session_in_chromium(
    engine: Engine, db_url: str, tmp_path: Path, browser_page: Any
) -> None:
    page = browser_page
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    with receiver(tmp_path) as (_, receiver_url):
        make_endpoint(engine, "billing", url=f"{receiver_url}/hooks")
        make_endpoint(engine, "ledger", url="http://127.0.0.1:9/closed")
        with engine.begin() as conn:
            ids = enqueue_many(
                conn,
                [Message("billing", "order.paid", {"n": i}, f"b{i}") for i in range(3)]
                + [Message("billing", "order.paid", {"note": HOSTILE}, "hostile")]
                + [
                    Message(
                        "ledger",
                        "invoice.sent",
                        {"n": i},
                        f"l{i}",
                        deliver_after=timedelta(hours=1),
                    )
                    for i in range(4)
                ],
            )
            conn.execute(
                text(
                    "UPDATE poller_outbox SET status = 'failed', attempts = max_attempts, "
                    "failed_at = now(), last_status_code = 503, last_error = :error "
                    "WHERE id = ANY(:ids)"
                ),
                {"ids": ids[:4], "error": HOSTILE},
            )
        hostile_id = ids[3]
        env = poller_env(POLLER_DATABASE_URL=db_url, POLLER_DASHBOARD_TOKEN=TOKEN)
        with started(["serve", "--addr", "127.0.0.1:0"], env, tmp_path / "dash.log") as dash:
            port = dash.wait_for(r"on http://127\.0\.0\.1:(\d+)/").group(1)
            base = f"http://127.0.0.1:{port}"

            # Refused without credentials: scripts get the login redirect, not a page.
            assert httpx.get(f"{base}/failed").status_code == 303
            assert httpx.post(f"{base}/messages/{hostile_id}/retry").status_code == 401

            page.goto(f"{base}/")
            assert page.url.startswith(f"{base}/login")
            shot(page, "login")
            page.fill("input[name=token]", "not-the-token-at-all")
            page.click("button:has-text('Log in')")
            page.locator("[role=alert]").wait_for()
            page.fill("input[name=token]", TOKEN)
            page.click("button:has-text('Log in')")
            page.wait_for_url(f"{base}/")

            # The overview shows what the database holds.
            expected = db_counts(engine)
            for status in ("pending", "failed", "delivered"):
                shown = page.locator(f"[data-status={status}]").inner_text()
                assert int(shown.replace(",", "")) == expected.get(status, 0), status
            shot(page, "overview")

            page.click("nav >> text=Failed")
            page.wait_for_url(f"{base}/failed")
            assert page.locator("tr[data-id]").count() == 4
            shot(page, "failed")

            # A hostile payload and error are text on the page, never markup.
            page.click(f"a[href='/messages/{hostile_id}']")
            page.wait_for_url(f"{base}/messages/{hostile_id}")
            assert (
                "<script>document.title='pwned'</script>"
                in page.locator("pre.payload").inner_text()
            )
            assert page.title() != "pwned" and dialogs == []
            assert page.locator("main script, main img").count() == 0
            shot(page, "message")

            # Retry from the page: confirmation, then a real delivery by a running poller.
            with started(["run", "--id", "browser"], env, tmp_path / "run.log"):
                page.click("text=Retry this message")
                page.wait_for_url(f"{base}/messages/{hostile_id}/retry")
                shot(page, "confirm-retry")
                page.click(f"button:has-text('Retry message {hostile_id}')")
                page.wait_for_url(re.compile(rf"/messages/{hostile_id}\?done=retried"))
                page.locator("[role=status]").wait_for()
                wait_until(lambda: stats(receiver_url)["received"] >= 1, timeout=30)
                wait_until(lambda: _status(engine, hostile_id) == "delivered", timeout=30)
                page.reload()
                assert page.locator("h1 .state").inner_text() == "delivered"
                assert "dashboard:token@127.0.0.1" in page.locator("table").inner_text()

                for name, path in [
                    ("endpoints", "/endpoints"),
                    ("keys", "/keys"),
                    ("leases", "/leases"),
                ]:
                    page.goto(f"{base}{path}")
                    assert page.locator("h1").is_visible()
                    shot(page, name)
                # The poller's shards, once it has taken them (the page refreshes itself).
                wait_until(lambda: "browser" in page.locator("main").inner_text(), timeout=20)
                shot(page, "leases")
            assert dialogs == []
    assert _status(engine, ids[0]) == "failed"  # only the one retried was sent again


def _status(engine: Engine, message_id: int) -> str:
    with engine.connect() as conn:
        return str(
            conn.execute(
                text("SELECT status FROM poller_outbox WHERE id = :id"), {"id": message_id}
            ).scalar_one()
        )
