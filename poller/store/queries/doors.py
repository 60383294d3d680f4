"""Statements of the doors into the outbox (poller/outbox/doors.py): each calls a function the
migrations made (db/sql/0026_doors.sql), which holds what a write means."""

from __future__ import annotations

from poller.store.queries._registry import statement as _statement

# One message, written or refused without raising (the caller's transaction stays
# usable): its id, or a refusal's SQLSTATE, message and detail.
TRY_ENQUEUE = _statement(
    "TRY_ENQUEUE",
    """
    SELECT id, sqlstate, message, detail FROM poller_try_enqueue(
        CAST(:endpoint AS text), CAST(:event_type AS text), CAST(:payload AS text),
        CAST(:idempotency_key AS text), CAST(:ordering_key AS text),
        CAST(:deliver_at AS timestamptz), CAST(:deliver_after AS interval),
        CAST(:max_attempts AS integer), CAST(:traceparent AS text), CAST(:tracestate AS text),
        CAST(:max_payload_bytes AS integer), CAST(:default_max_attempts AS integer),
        CAST(:notify AS boolean))
    """,
)

# Many messages in one call (a refusal raises: the caller runs it in a savepoint);
# their ids in the order given.
ENQUEUE_MANY_CALL = _statement(
    "ENQUEUE_MANY_CALL",
    """
    SELECT poller_enqueue_many(
        CAST(:endpoints AS text[]), CAST(:event_types AS text[]), CAST(:payloads AS text[]),
        CAST(:idempotency_keys AS text[]), CAST(:ordering_keys AS text[]),
        CAST(:deliver_ats AS timestamptz[]), CAST(:deliver_afters AS interval[]),
        CAST(:max_attempts AS integer[]), CAST(:traceparent AS text), CAST(:tracestate AS text),
        CAST(:max_payload_bytes AS integer), CAST(:default_max_attempts AS integer),
        CAST(:notify AS boolean)) AS ids
    """,
)

# One event without an ordering key, published or refused without raising: its id,
# whether this call made it, its deliveries, its type's JSON Schema in the catalog.
TRY_PUBLISH = _statement(
    "TRY_PUBLISH",
    """
    SELECT event_id, created, CAST(deliveries AS text) AS deliveries, schema, sqlstate,
           message, detail
    FROM poller_try_publish(
        CAST(:event_type AS text), CAST(:payload AS text), CAST(:idempotency_key AS text),
        CAST(:tenant AS text), CAST(:deliver_at AS timestamptz),
        CAST(:deliver_after AS interval), CAST(:traceparent AS text), CAST(:tracestate AS text),
        CAST(NULL AS boolean), CAST(:max_payload_bytes AS integer),
        CAST(:default_max_attempts AS integer), CAST(:notify AS boolean))
    """,
)

# Many events in one call, ordered ones too (a refusal raises: the caller runs it in a
# savepoint): a row per event in the order given.
PUBLISH_MANY_CALL = _statement(
    "PUBLISH_MANY_CALL",
    """
    SELECT event_id, created, CAST(deliveries AS text) AS deliveries, schema
    FROM poller_publish_many(
        CAST(:event_types AS text[]), CAST(:payloads AS text[]),
        CAST(:idempotency_keys AS text[]), CAST(:tenants AS text[]),
        CAST(:ordering_keys AS text[]), CAST(:deliver_ats AS timestamptz[]),
        CAST(:deliver_afters AS interval[]), CAST(:traceparent AS text),
        CAST(:tracestate AS text), CAST(NULL AS boolean), CAST(:max_payload_bytes AS integer),
        CAST(:default_max_attempts AS integer), CAST(:notify AS boolean))
    """,
)

# A publish whose payload the Python door checked against its type's JSON Schema: it
# is sent without another check.
MARK_CHECKED = _statement(
    "MARK_CHECKED",
    "UPDATE poller_events SET payload_checked = true WHERE id = ANY(CAST(:ids AS bigint[])) "
    "RETURNING id",
)

# Undo a publish whose payload did not hold its type's JSON Schema: its rows and event go.
UNPUBLISH_CALL = _statement(
    "UNPUBLISH_CALL", "SELECT poller_unpublish(CAST(:event_id AS bigint)) AS done"
)

# Replay's rows for one endpoint (poller/operate/replay.py): through the kernel every write
# shares; their ids in the order given.
INSERT_ROWS_CALL = _statement(
    "INSERT_ROWS_CALL",
    """
    SELECT poller_insert_rows(
        CAST(:endpoint_ids AS bigint[]), CAST(:event_types AS text[]),
        CAST(:payloads AS json[]), CAST(:idempotency_keys AS text[]),
        CAST(:max_attempts AS integer[]), CAST(:deliver_ats AS timestamptz[]),
        CAST(:delays AS double precision[]), CAST(:ordering_keys AS text[]),
        CAST(:event_ids AS bigint[]), CAST(:traceparent AS text), CAST(:tracestate AS text),
        CAST(:notify AS boolean)) AS ids
    """,
)
