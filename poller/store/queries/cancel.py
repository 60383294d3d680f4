"""Statements of operators' holds: cancelling messages, pausing endpoints."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import ColumnElement, false

from poller.store.queries._registry import statement as _statement
from poller.store.schema import outbox

__all__ = [  # what `queries` offers by name; the builder is this module's
    "CANCEL_MESSAGES",
    "HOLD_ENDPOINT",
    "RELEASE_ENDPOINT",
    "TAKE_KEYS_OF_MESSAGES",
]

# Cancel, step 1: of these messages, the ordered ones whose key row this
# transaction could lock — skipping any held by an application's enqueue still
# open, or a poller handing the key on — so a cancel never waits, and while it
# holds a key no poller promotes that key's next message under it (a poller's
# hand-on skips a key someone holds, poller/rows/ordering.py). Returns the ids whose
# keys are held here; an ordered message not returned is left alone.
TAKE_KEYS_OF_MESSAGES = _statement(
    "TAKE_KEYS_OF_MESSAGES",
    """
    SELECT o.id
    FROM poller_outbox o
    JOIN poller_ordering_keys k
      ON k.endpoint_id = o.endpoint_id AND k.ordering_key = o.ordering_key
    WHERE o.id = ANY(CAST(:ids AS bigint[])) AND o.status IN ('pending', 'waiting')
    ORDER BY k.endpoint_id, k.ordering_key
    FOR UPDATE OF k SKIP LOCKED
    """,
)

# Cancel, step 2: end these messages cancelled — pending or waiting ones only,
# never one in flight (a poller holds it: it ends as its attempt says), and an
# ordered one only when step 1 holds its key. SKIP LOCKED: a row a poller is
# claiming right now is left to the claim, so a message ends one way, and the
# cancel waits for nobody. Each is recorded as a manual attempt naming who.
CANCEL_MESSAGES = _statement(
    "CANCEL_MESSAGES",
    """
    WITH picked AS (
        SELECT o.id FROM poller_outbox o
        WHERE o.id = ANY(CAST(:ids AS bigint[])) AND o.status IN ('pending', 'waiting')
          AND (o.ordering_key IS NULL OR o.id = ANY(CAST(:keyed AS bigint[])))
        FOR UPDATE SKIP LOCKED
    ), cancelled AS (
        UPDATE poller_outbox o
        SET status = 'cancelled', cancelled_at = now(), needs_lookup = false,
            last_error = 'cancelled by ' || CAST(:who AS text), updated_at = now()
        FROM picked WHERE o.id = picked.id
        RETURNING o.id, o.endpoint_id, o.attempts, o.ordering_key
    ), recorded AS (
        INSERT INTO poller_delivery_attempts
            (message_id, endpoint_id, attempt, kind, poller_id, outcome)
        SELECT id, endpoint_id, attempts, 'manual', CAST(:who AS text), 'cancelled'
        FROM cancelled
    )
    SELECT id, ordering_key FROM cancelled
    """,
)

# Pause: hold an endpoint's messages until :until (NULL: until resumed), naming
# who; held_by set is what makes it paused. Nothing else of it changes: health,
# circuit, attempts, updated_at (a poller need not reload it).
HOLD_ENDPOINT = _statement(
    "HOLD_ENDPOINT",
    """
    UPDATE poller_endpoints
    SET held_until = CAST(:until AS timestamptz), held_by = CAST(:who AS text)
    WHERE name = :name
    RETURNING id, bucket, held_until, held_by
    """,
)

# Resume: the pause ends now; the pollers of its bucket are woken.
RELEASE_ENDPOINT = _statement(
    "RELEASE_ENDPOINT",
    """
    UPDATE poller_endpoints SET held_until = NULL, held_by = NULL
    WHERE name = :name
    RETURNING id, bucket, pg_notify('poller_outbox', CAST(bucket AS text)) AS woke
    """,
)


# Which open messages an operator's cancel takes (poller/operate/cancel.py): an
# endpoint's pending and waiting ones, of one event type, created in [since, until).
def open_where(
    endpoint_id: int,
    *,
    event_type: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    possible: bool = True,
) -> list[ColumnElement[bool]]:
    if not possible:
        return [false()]
    clauses = [outbox.c.endpoint_id == endpoint_id, outbox.c.status.in_(("pending", "waiting"))]
    if event_type is not None:
        clauses.append(outbox.c.event_type == event_type)
    if since is not None:
        clauses.append(outbox.c.created_at >= since)
    if until is not None:
        clauses.append(outbox.c.created_at < until)
    return clauses
