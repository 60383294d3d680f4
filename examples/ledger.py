"""The consumers' store in examples/: apply an event once, whatever copies of it arrive.

Delivery is at least once, and a broker may hand a consumer a message again (a resend
after an unknown outcome, a redelivery after a consumer died before acknowledging). So
the event's effect and its ``webhook-id`` are written in one transaction, and an id
already written is skipped; the consumer acknowledges only after the commit. SQLite
stands in for your database: any with a unique key does it the same way.
"""

from __future__ import annotations

import sqlite3
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS processed (webhook_id TEXT PRIMARY KEY);
CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, status TEXT NOT NULL);
"""


def open_ledger(path: str) -> sqlite3.Connection:
    db = sqlite3.connect(path)
    db.executescript(SCHEMA)
    return db


def apply_once(db: sqlite3.Connection, webhook_id: str, event: dict[str, Any]) -> bool:
    """Apply ``event`` unless ``webhook_id`` was applied before; whether it was applied now."""
    with db:  # one transaction: the effect and the record of its id
        added = db.execute(
            "INSERT INTO processed (webhook_id) VALUES (?) ON CONFLICT DO NOTHING", (webhook_id,)
        )
        if added.rowcount == 0:
            return False  # a copy of one already applied
        db.execute(
            "INSERT INTO orders (id, status) VALUES (?, ?) "
            "ON CONFLICT (id) DO UPDATE SET status = excluded.status",
            (event["order"], event["status"]),
        )
        return True
