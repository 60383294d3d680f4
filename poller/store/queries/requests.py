"""Statements of what a face remembers between requests: the API's idempotency keys
(poller/web/api/once.py) and the portal links already opened (poller/access/portal.py)."""

from __future__ import annotations

from poller.store.queries._registry import statement as _statement

# An API request's idempotency keys are kept a day (once.KEPT): older ones go first.
FORGET_REQUESTS = _statement(
    "FORGET_REQUESTS",
    "DELETE FROM poller_api_requests WHERE created_at < now() - make_interval(secs => :kept)",
)

# Take a key for a request: a row back when the request is new (make it), none when
# the key was taken (by this request or another: REQUEST_TAKEN says which).
TAKE_REQUEST = _statement(
    "TAKE_REQUEST",
    """
    INSERT INTO poller_api_requests (caller, idempotency_key, request_sha256, made)
    VALUES (:caller, :idempotency_key, :request_sha256, :made)
    ON CONFLICT DO NOTHING
    RETURNING made
    """,
)

# The request that took a key first: its fingerprint, and what it made.
REQUEST_TAKEN = _statement(
    "REQUEST_TAKEN",
    """
    SELECT request_sha256, made FROM poller_api_requests
    WHERE caller = :caller AND idempotency_key = :idempotency_key
    """,
)

# Opened links' nonces outlive their links by portal.USED_KEPT, then go.
FORGET_LINKS = _statement(
    "FORGET_LINKS",
    "DELETE FROM poller_portal_links_used WHERE expires_at < now() - make_interval(secs => :kept)",
)

# Open a link: a row back when it was never opened (of two at once, one wins).
SPEND_LINK = _statement(
    "SPEND_LINK",
    """
    INSERT INTO poller_portal_links_used (nonce, expires_at)
    VALUES (:nonce, CAST(:expires_at AS timestamptz))
    ON CONFLICT DO NOTHING
    RETURNING nonce
    """,
)
