"""Statements of ordered delivery (poller/rows/ordering.py): key locks, positions, heads.

Every change to a key goes through its ``poller_ordering_keys`` row, locked
first and in a statement of its own: the statement that then reads the key's
messages starts after the lock was granted, so it sees every message a
transaction that held the lock before committed (READ COMMITTED takes a
snapshot per statement). Locks are taken in (endpoint_id, ordering_key) order,
after any outbox row the same transaction locks, so two writers never wait on
each other in a circle. A key's row exists while the key has an open message;
keys are found by their primary key (the message carries it), never by head.
"""

from __future__ import annotations

from poller.store.queries._registry import statement as _statement
from poller.store.schema import NOTIFY_CHANNEL

# Enqueue, step 1: lock these keys' rows (sorted, distinct), creating the missing
# ones without a head, and read each one's head (NULL: no open message). Held until
# the application's transaction ends, so two transactions enqueueing on one key are
# ordered by commit. A row deleted meanwhile (its last message ended) is created anew.
LOCK_ORDERING_KEYS = _statement(
    "LOCK_ORDERING_KEYS",
    """
    INSERT INTO poller_ordering_keys AS k (endpoint_id, ordering_key)
    SELECT DISTINCT m.endpoint_id, m.ordering_key
    FROM unnest(CAST(:endpoint_ids AS bigint[]), CAST(:ordering_keys AS text[]))
        AS m(endpoint_id, ordering_key)
    ORDER BY 1, 2
    ON CONFLICT (endpoint_id, ordering_key) DO UPDATE SET head_id = k.head_id
    RETURNING k.endpoint_id, k.ordering_key, k.head_id
    """,
)


# Admin skip, first: lock the key rows of these ordered messages (waiting for a
# poller's hand-on to commit), so no poller promotes one of them while the skip
# changes it — a poller's hand-on skips a key someone holds.
LOCK_KEYS_OF_MESSAGES = _statement(
    "LOCK_KEYS_OF_MESSAGES",
    """
    SELECT k.endpoint_id, k.ordering_key
    FROM poller_outbox o
    JOIN poller_ordering_keys k
      ON k.endpoint_id = o.endpoint_id AND k.ordering_key = o.ordering_key
    WHERE o.id = ANY(CAST(:ids AS bigint[]))
    ORDER BY k.endpoint_id, k.ordering_key
    FOR UPDATE OF k
    """,
)

# Admin skip: lock the rows of the keys these messages head (before ADVANCE_KEYS,
# in the same transaction), waiting for them. Pollers use TAKE_KEYS_OF_HEADS.
LOCK_KEYS_OF_HEADS = _statement(
    "LOCK_KEYS_OF_HEADS",
    """
    SELECT k.endpoint_id, k.ordering_key
    FROM poller_outbox o
    JOIN poller_ordering_keys k
      ON k.endpoint_id = o.endpoint_id AND k.ordering_key = o.ordering_key AND k.head_id = o.id
    WHERE o.id = ANY(CAST(:ids AS bigint[]))
    ORDER BY k.endpoint_id, k.ordering_key
    FOR UPDATE OF k
    """,
)

# A poller's completion and reclaim, in their transaction after the outbox rows:
# lock the rows of the keys these ended messages head, skipping any that someone
# holds — an application enqueueing on the key in a transaction still open, an
# operator's retry — so a completion never waits on them. The heads returned are
# the ones to hand on now (ADVANCE_KEYS); the poller hands on the rest at its next
# completion, and ENDED_HEADS finds any it could not (it stopped meanwhile).
HEADED_BY = """SELECT k.head_id AS id
    FROM poller_outbox o
    JOIN poller_ordering_keys k
      ON k.endpoint_id = o.endpoint_id AND k.ordering_key = o.ordering_key AND k.head_id = o.id
    WHERE o.id = ANY(CAST(:ids AS bigint[]))"""  # those of :ids that head their key

TAKE_KEYS_OF_HEADS = _statement(
    "TAKE_KEYS_OF_HEADS",
    f"""
    {HEADED_BY}
    ORDER BY k.endpoint_id, k.ordering_key
    FOR UPDATE OF k SKIP LOCKED
    """,
)

# Which of these messages still head their key (no lock): of the ended messages
# TAKE_KEYS_OF_HEADS did not return, those whose key row was busy — the rest are
# no key's head (any more: another poller or the sweep handed the key on).
HEADS_AMONG = _statement(
    "HEADS_AMONG",
    f"""
    {HEADED_BY}
    """,
)

# Maintenance: keys whose head ended but that were not handed on (their row was
# busy at the completion, and the poller stopped before it came back to them),
# locked with SKIP LOCKED, for ADVANCE_KEYS. Blocked keys are left alone.
ENDED_HEADS = _statement(
    "ENDED_HEADS",
    """
    SELECT k.head_id AS id
    FROM poller_ordering_keys k
    JOIN poller_outbox o ON o.id = k.head_id
    WHERE o.status IN ('delivered', 'failed', 'cancelled') AND k.blocked_since IS NULL
    ORDER BY k.endpoint_id, k.ordering_key
    LIMIT :limit
    FOR UPDATE OF k SKIP LOCKED
    """,
)

# These heads ended. A delivered head — or a failed one on a ``skip`` endpoint,
# or one an operator skipped or cancelled — hands the key to its next waiting message (the
# lowest id), which becomes pending; with none waiting the key's row goes, and
# the next enqueue on the key starts pending. A failed head on a ``block``
# endpoint stays the head and marks the key blocked. Messages that are not
# their key's head change nothing, so running this twice is harmless. Pollers
# of the promoted rows' buckets are woken when the transaction commits.
ADVANCE_KEYS = _statement(
    "ADVANCE_KEYS",
    f"""
    WITH ended AS (
        SELECT o.endpoint_id, o.ordering_key, o.id,
               (o.status IN ('delivered', 'cancelled') OR e.on_failed_head = 'skip'
                OR o.id = ANY(CAST(:skipped AS bigint[]))) AS moves_on
        FROM poller_outbox o
        JOIN poller_ordering_keys k
          ON k.endpoint_id = o.endpoint_id AND k.ordering_key = o.ordering_key
         AND k.head_id = o.id
        JOIN poller_endpoints e ON e.id = o.endpoint_id
        WHERE o.id = ANY(CAST(:ids AS bigint[]))
          AND o.status IN ('delivered', 'failed', 'cancelled')
    ), successor AS (
        SELECT ended.endpoint_id, ended.ordering_key, ended.id AS ended_id, nxt.id AS next_id
        FROM ended
        LEFT JOIN LATERAL (
            SELECT w.id FROM poller_outbox w
            WHERE w.endpoint_id = ended.endpoint_id AND w.ordering_key = ended.ordering_key
              AND w.status = 'waiting'
            ORDER BY w.id
            LIMIT 1
        ) AS nxt ON true
        WHERE ended.moves_on
    ), promoted AS (
        UPDATE poller_outbox o SET status = 'pending', updated_at = now()
        FROM successor s WHERE o.id = s.next_id
        RETURNING o.id, o.bucket
    ), moved AS (
        UPDATE poller_ordering_keys k
        SET head_id = s.next_id, blocked_since = NULL
        FROM successor s
        WHERE k.endpoint_id = s.endpoint_id AND k.ordering_key = s.ordering_key
          AND k.head_id = s.ended_id AND s.next_id IS NOT NULL
        RETURNING k.ordering_key
    ), idle AS (
        DELETE FROM poller_ordering_keys k USING successor s
        WHERE k.endpoint_id = s.endpoint_id AND k.ordering_key = s.ordering_key
          AND k.head_id = s.ended_id AND s.next_id IS NULL
        RETURNING k.ordering_key
    ), blocked AS (
        UPDATE poller_ordering_keys k
        SET blocked_since = coalesce(k.blocked_since, now())
        FROM ended
        WHERE NOT ended.moves_on
          AND k.endpoint_id = ended.endpoint_id AND k.ordering_key = ended.ordering_key
        RETURNING k.ordering_key
    )
    SELECT 'promoted' AS what, p.bucket,
           CASE WHEN CAST(:notify AS boolean)
                THEN pg_notify('{NOTIFY_CHANNEL}', CAST(p.bucket AS text)) END AS woke
    FROM (SELECT DISTINCT bucket FROM promoted) AS p
    UNION ALL SELECT 'blocked', NULL, NULL FROM blocked
    """,
)

# Blocked keys for operators: the failed head, its last error, how many wait
# behind it and since when, oldest first.
BLOCKED_KEYS = _statement(
    "BLOCKED_KEYS",
    """
    SELECT e.name AS endpoint, k.ordering_key, k.head_id, k.blocked_since,
           o.event_type, o.idempotency_key, o.attempts, o.last_status_code, o.last_error,
           (SELECT count(*) FROM poller_outbox w
            WHERE w.endpoint_id = k.endpoint_id AND w.ordering_key = k.ordering_key
              AND w.status = 'waiting') AS waiting
    FROM poller_ordering_keys k
    JOIN poller_endpoints e ON e.id = k.endpoint_id
    JOIN poller_outbox o ON o.id = k.head_id
    WHERE k.blocked_since IS NOT NULL
      AND (CAST(:endpoint AS text) IS NULL OR e.name = CAST(:endpoint AS text))
    ORDER BY k.blocked_since, e.name, k.ordering_key
    LIMIT :limit
    """,
)

# Admin retry, step 2 (after LOCK_ORDERING_KEYS on the retried messages' keys): put
# retried ordered messages back in line. A key's head stays pending and its key is
# unblocked; on a key with no head, the retried message with the lowest id becomes
# the head; any other retried message waits — it goes next, having the lowest id —
# so a key never has two messages in flight.
REQUEUE_KEYED = _statement(
    "REQUEUE_KEYED",
    """
    WITH r AS (
        SELECT o.id, o.endpoint_id, o.ordering_key, k.head_id
        FROM poller_outbox o
        JOIN poller_ordering_keys k
          ON k.endpoint_id = o.endpoint_id AND k.ordering_key = o.ordering_key
        WHERE o.id = ANY(CAST(:ids AS bigint[]))
    ), new_head AS (
        SELECT DISTINCT ON (endpoint_id, ordering_key) id, endpoint_id, ordering_key
        FROM r WHERE head_id IS NULL
        ORDER BY endpoint_id, ordering_key, id
    ), headed AS (
        UPDATE poller_ordering_keys k
        SET head_id = n.id, blocked_since = NULL
        FROM new_head n
        WHERE k.endpoint_id = n.endpoint_id AND k.ordering_key = n.ordering_key
          AND k.head_id IS NULL
        RETURNING k.head_id
    ), unblocked AS (
        UPDATE poller_ordering_keys k
        SET blocked_since = NULL
        FROM r
        WHERE k.endpoint_id = r.endpoint_id AND k.ordering_key = r.ordering_key
          AND k.head_id = r.id AND k.blocked_since IS NOT NULL
        RETURNING k.head_id
    ), queued AS (
        UPDATE poller_outbox o SET status = 'waiting'
        FROM r
        WHERE o.id = r.id AND r.head_id IS DISTINCT FROM r.id
          AND NOT EXISTS (SELECT 1 FROM new_head n WHERE n.id = r.id)
        RETURNING o.id
    )
    SELECT (SELECT count(*) FROM headed) + (SELECT count(*) FROM unblocked) AS resumed,
           (SELECT count(*) FROM queued) AS queued
    """,
)

# Admin skip: ordered messages not in flight end as failed, by an operator's
# decision, recorded as a manual attempt; ADVANCE_KEYS then moves their keys on.
SKIP_MESSAGES = _statement(
    "SKIP_MESSAGES",
    """
    WITH skipped AS (
        UPDATE poller_outbox o
        SET status = 'failed', failed_at = now(), claim_expires_at = NULL,
            last_error = 'skipped by ' || CAST(:who AS text), updated_at = now()
        WHERE o.id = ANY(CAST(:ids AS bigint[])) AND o.ordering_key IS NOT NULL
          AND o.status IN ('pending', 'waiting', 'failed')
        RETURNING o.id, o.endpoint_id, o.attempts
    ), recorded AS (
        INSERT INTO poller_delivery_attempts
            (message_id, endpoint_id, attempt, kind, poller_id, outcome)
        SELECT id, endpoint_id, attempts, 'manual', CAST(:who AS text), 'manual_skip'
        FROM skipped
    )
    SELECT id FROM skipped
    """,
)
