"""The dashboard against a database a run left behind: it must show what is there.

Used by the fault hunt (loadtest/hunt.py) after each seed, so the pages meet
whatever hostile receivers and faults wrote (response excerpts, errors, half
finished rows) — not only the tidy rows of the dashboard's own tests.
"""

from __future__ import annotations

import re
from typing import Any

from sqlalchemy import text
from starlette.testclient import TestClient

from poller.settings import load_settings
from poller.web import auth
from poller.web.app import create_app

TOKEN = "hunt-dashboard-token-000"
PAGES = ("/", "/failed", "/endpoints", "/keys", "/leases")
MESSAGES = 15  # message pages looked at, failed ones first


def dashboard_disagrees(engine: Any) -> list[str]:
    """Every page answers 200, the overview's counts equal the database's, and no value
    a receiver sent reaches a page unescaped; one line per disagreement."""
    with engine.connect() as conn:
        counts = dict(
            conn.execute(text("SELECT status, count(*) FROM poller_outbox GROUP BY 1")).all()
        )
        ids = [
            int(i)
            for i in conn.execute(
                text("SELECT id FROM poller_outbox ORDER BY status = 'failed' DESC, id LIMIT :n"),
                {"n": MESSAGES},
            ).scalars()
        ]
        names = list(
            conn.execute(text("SELECT name FROM poller_endpoints ORDER BY name LIMIT 5")).scalars()
        )
    problems = []
    app = create_app(load_settings(), engine, auth.Credentials(TOKEN))
    with TestClient(app, base_url="http://127.0.0.1:8188", raise_server_exceptions=False) as web:
        web.headers["authorization"] = f"Bearer {TOKEN}"
        pages = [*PAGES, *(f"/endpoints/{n}" for n in names), *(f"/messages/{i}" for i in ids)]
        for path in pages:
            page = web.get(path)
            if page.status_code != 200:
                problems.append(f"dashboard: {path} answered {page.status_code}")
            elif re.search(r"<(script|img|iframe)\b", page.text.partition("<main")[2], re.I):
                problems.append(f"dashboard: {path} carries unescaped markup")
            if path == "/" and page.status_code == 200:
                shown = dict(re.findall(r'data-status="(\w+)">([\d,]+)<', page.text))
                for status in (
                    "pending",
                    "in_flight",
                    "waiting",
                    "delivered",
                    "failed",
                    "cancelled",
                ):
                    have = int(shown.get(status, "-1").replace(",", ""))
                    if have != counts.get(status, 0):
                        problems.append(
                            f"dashboard: overview shows {have} {status}, "
                            f"the database has {counts.get(status, 0)}"
                        )
    return problems
