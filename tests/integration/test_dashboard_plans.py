"""Every statement the dashboard's pages send reads the big tables through an index.

The pages are fetched for real over a 220,000-message outbox with three days of
attempts; each statement they sent is captured and EXPLAINed with its own
parameters. A sequential scan of ``poller_outbox`` or ``poller_delivery_attempts``
is what turns a page from milliseconds into seconds at a million rows
(loadtest/dashboard.py times them there).
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from sqlalchemy import Engine, event, text
from starlette.testclient import TestClient

from loadtest.dashboard import seed
from poller.operate import stats
from poller.settings import load_settings
from poller.web import auth
from poller.web.app import create_app

TOKEN = "plans-dashboard-token-0000"
BIG = ("poller_outbox", "poller_delivery_attempts")


def _scans(plan: dict[str, Any]) -> list[str]:
    found = []
    if plan.get("Relation Name") in BIG:
        found.append(f"{plan['Node Type']} on {plan['Relation Name']} {plan.get('Index Name', '')}")
    for child in plan.get("Plans", []):
        found += _scans(child)
    return found


@pytest.mark.slow
def test_every_page_reads_through_indexes(engine: Engine, db_url: str) -> None:
    # Big enough that the planner prefers the indexes it would use at a million rows
    # (at 100,000 it reads the attempts table whole: cheaper there, and rightly so),
    # and past stats.EXACT_BELOW, so the overview takes its large-table path.
    assert stats.EXACT_BELOW < 220_000
    seed(db_url, 220_000, 50, spread=3 * 86400)
    sent: list[tuple[str, Any]] = []

    def capture(_c: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        if statement.lstrip().upper().startswith(("SELECT", "WITH")):
            sent.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", capture)
    app = create_app(load_settings(), engine, auth.Credentials(TOKEN))
    with TestClient(app, base_url="http://127.0.0.1:8188") as web:
        web.headers["authorization"] = f"Bearer {TOKEN}"
        with engine.connect() as conn:
            some = conn.execute(text("SELECT max(id) FROM poller_outbox")).scalar_one()
        first = web.get("/failed").text
        cursor = re.search(r'rel="next" href="([^"]+)"', first)
        assert cursor
        for path in (
            "/",
            cursor.group(1).replace("&amp;", "&"),
            "/failed?endpoint=ep-007",
            "/failed?error=503&endpoint=ep-007",
            f"/messages/{some}",
            "/endpoints",
            "/keys",
        ):
            assert web.get(path).status_code == 200, path
    event.remove(engine, "before_cursor_execute", capture)
    assert len(sent) > 10
    raw = engine.raw_connection()
    try:
        cur = raw.cursor()
        problems = []
        for statement, parameters in sent:
            cur.execute("EXPLAIN (FORMAT JSON) " + statement, parameters)
            plan = cur.fetchone()[0]
            plan = json.loads(plan) if isinstance(plan, str) else plan
            seq = [s for s in _scans(plan[0]["Plan"]) if s.startswith("Seq Scan")]
            if seq:
                problems.append((seq, statement[:200]))
        assert not problems, problems
    finally:
        raw.close()
