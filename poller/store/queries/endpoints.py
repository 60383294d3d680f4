"""Statements of the endpoint registry (poller/endpoints/registry.py)."""

from __future__ import annotations

from poller.store.queries._registry import statement as _statement

# Removing an endpoint with its messages, step 1: it takes no new message (enqueue
# and publish refuse or pass a disabled endpoint, its subscriptions are dropped), and
# the pollers stop claiming its rows. Returns its id, NULL-free.
START_REMOVAL = _statement(
    "START_REMOVAL",
    """
    UPDATE poller_endpoints
    SET enabled = false, disabled_reason = 'being removed', event_types = '{}',
        updated_at = now()
    WHERE id = :endpoint_id
    RETURNING id
    """,
)

# Removing an endpoint, step 2 (repeated): delete its messages that no live claim
# holds — every one not in flight, and those whose claim expired (a late outcome
# from that claim is fenced out) — but never one in flight under a live claim (its
# poller is sending it: it ends as its attempt says, and is deleted then). SKIP
# LOCKED: a row a poller is claiming this instant, or one another transaction holds,
# is left for the next round, so neither the claim path nor anyone else waits on a
# removal, and a removal waits on nobody. Returns how many it deleted, and how many
# of the endpoint's messages remain.
DELETE_UNCLAIMED_MESSAGES = _statement(
    "DELETE_UNCLAIMED_MESSAGES",
    """
    WITH unclaimed AS (
        SELECT id FROM poller_outbox
        WHERE endpoint_id = :endpoint_id
          AND (status <> 'in_flight' OR claim_expires_at < now())
        FOR UPDATE SKIP LOCKED
    ), deleted AS (
        DELETE FROM poller_outbox WHERE id = ANY(ARRAY(SELECT id FROM unclaimed))
        RETURNING id
    )
    SELECT (SELECT count(*) FROM deleted) AS deleted,
           (SELECT count(*) FROM poller_outbox WHERE endpoint_id = :endpoint_id)
               - (SELECT count(*) FROM deleted) AS remaining,
           (SELECT extract(epoch FROM max(claim_expires_at) - now()) FROM poller_outbox
            WHERE endpoint_id = :endpoint_id AND status = 'in_flight') AS lease_left
    """,
)

# Removing an endpoint, last step: once it has no message left (its health, keys and
# credentials go with it: ON DELETE CASCADE). SKIP LOCKED: an application's enqueue
# that read the endpoint before it was disabled holds its row (the foreign key's
# check) until it commits; the removal tries again rather than wait, and an insert
# that committed meanwhile fails this statement's foreign key check (RESTRICT) and
# is deleted by the next round. Returns its id when it was deleted.
DELETE_EMPTY_ENDPOINT = _statement(
    "DELETE_EMPTY_ENDPOINT",
    """
    DELETE FROM poller_endpoints e
    WHERE e.id = (SELECT id FROM poller_endpoints WHERE id = :endpoint_id
                  FOR UPDATE SKIP LOCKED)
      AND NOT EXISTS (SELECT 1 FROM poller_outbox o WHERE o.endpoint_id = e.id)
    RETURNING e.id
    """,
)

# Every endpoint, whole, by name: `poller run` opens each one's signing secret before
# it starts (poller/service/runner.py), so a wrong POLLER_SECRETS_KEY stops it at once.
EVERY_ENDPOINT = _statement("EVERY_ENDPOINT", "SELECT * FROM poller_endpoints ORDER BY name")

# An endpoint's id by name, or no row: POLLER_OPERATOR_ENDPOINT must name one.
ENDPOINT_ID = _statement("ENDPOINT_ID", "SELECT id FROM poller_endpoints WHERE name = :name")

# What the dashboard's endpoint list shows beside their health (stats.health_report):
# where each goes and what it takes — never a secret.
ENDPOINTS_SHOWN = _statement(
    "ENDPOINTS_SHOWN",
    """
    SELECT name, url, event_types, tenant FROM poller_endpoints
    WHERE name = ANY(CAST(:names AS text[]))
    """,
)
