"""Statements of the management API's tokens (poller/access/tokens.py). A token is kept as the
SHA-256 of its text, never the text."""

from __future__ import annotations

from poller.store.queries._registry import statement as _statement

# A new token (the name unique among all, revoked ones too: the caller's savepoint
# turns the clash into TokenExists); the whole row back.
CREATE_TOKEN = _statement(
    "CREATE_TOKEN",
    """
    INSERT INTO poller_api_tokens
        (name, scope, read_only, token_sha256, created_by, expires_at)
    VALUES (:name, :scope, :read_only, :token_sha256, :created_by,
            CAST(:expires_at AS timestamptz))
    RETURNING *
    """,
)

# Every token, revoked and expired ones too, oldest first.
EVERY_TOKEN = _statement("EVERY_TOKEN", "SELECT * FROM poller_api_tokens ORDER BY id")

# Revoke a token by name, at once (a revoked one keeps its first revocation time).
REVOKE_TOKEN = _statement(
    "REVOKE_TOKEN",
    """
    UPDATE poller_api_tokens SET revoked_at = coalesce(revoked_at, now())
    WHERE name = :name
    RETURNING *
    """,
)

# The token a request presented, by the digest of its text.
TOKEN_BY_DIGEST = _statement(
    "TOKEN_BY_DIGEST", "SELECT * FROM poller_api_tokens WHERE token_sha256 = :token_sha256"
)

# When a token was last used (written at most once a LAST_USE_EVERY, not per request).
TOKEN_USED = _statement(
    "TOKEN_USED", "UPDATE poller_api_tokens SET last_used_at = now() WHERE id = :id"
)
