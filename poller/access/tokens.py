"""API tokens: who may call the management API, and on whose behalf.

**A token** is ``wpt_`` and 32 random bytes in base64url (47 characters in all). It
is printed once, when it is made; what is kept is its SHA-256, and finding that hash
is the check. 256 random bits need no slow hash: nobody guesses them, and a copy of
the table opens nothing.

**Scopes.** ``admin`` may do everything; ``tenant:NAME`` only what concerns tenant
NAME's endpoints, messages and events (the API answers 404 for anything else, so
no other tenant's names or ids leak). A ``read_only`` token may only read. A token
may expire; a revoked one stays listed (and its name taken), so the list says who
had which.

**Last use** is written at most once a minute a token (:data:`LAST_USE_EVERY`): a
busy client must not turn every request into a write.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Row
from sqlalchemy.exc import IntegrityError

from poller.endpoints.subscriptions import check_tenant
from poller.errors import InvalidInput, TokenExists, TokenNotFound, TokenRefused
from poller.rules import parse
from poller.store import queries

PREFIX = "wpt_"
LAST_USE_EVERY = timedelta(minutes=1)
_TOKEN = re.compile(r"wpt_[A-Za-z0-9_-]{43}")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


@dataclass(frozen=True, slots=True)
class Scope:
    """``admin`` (``tenant`` None) or ``tenant:NAME``."""

    tenant: str | None = None

    def __str__(self) -> str:
        return "admin" if self.tenant is None else f"tenant:{self.tenant}"

    @classmethod
    def parse(cls, text: object) -> Scope:
        """``admin`` or ``tenant:NAME`` (a tenant as endpoints name theirs)."""
        if text == "admin":
            return cls()
        if isinstance(text, str) and text.startswith("tenant:"):
            tenant = check_tenant(text.removeprefix("tenant:"), InvalidInput)
            return cls(tenant)
        shown = text[:40] if isinstance(text, str) else type(text).__name__
        raise InvalidInput(f"scope {shown!r}: admin, or tenant:NAME")


@dataclass(frozen=True, slots=True)
class Token:
    """A token as stored: never the token itself."""

    id: int
    name: str
    scope: Scope
    read_only: bool
    created_at: datetime
    created_by: str | None
    expires_at: datetime | None
    revoked_at: datetime | None
    last_used_at: datetime | None

    def state(self, now: datetime | None = None) -> str:
        """``active``, ``expired`` or ``revoked``."""
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at is not None and self.expires_at <= (now or datetime.now(UTC)):
            return "expired"
        return "active"

    def public(self) -> dict[str, Any]:
        """What ``tokens list --json`` shows of it."""
        return {
            "name": self.name,
            "scope": str(self.scope),
            "read_only": self.read_only,
            "state": self.state(),
            "created_at": self.created_at,
            "created_by": self.created_by,
            "expires_at": self.expires_at,
            "revoked_at": self.revoked_at,
            "last_used_at": self.last_used_at,
        }


def _token(row: Row[Any]) -> Token:
    return Token(
        id=row.id,
        name=row.name,
        scope=Scope.parse(row.scope),
        read_only=row.read_only,
        created_at=row.created_at,
        created_by=row.created_by,
        expires_at=row.expires_at,
        revoked_at=row.revoked_at,
        last_used_at=row.last_used_at,
    )


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def check_name(name: object) -> str:
    """1 to 64 letters, digits, ``.``, ``_`` and ``-``, starting with a letter or digit."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        shown = name[:40] if isinstance(name, str) else type(name).__name__
        raise InvalidInput(
            f"token name {shown!r}: 1 to 64 letters, digits, '.', '_' or '-', starting with "
            "a letter or digit"
        )
    return name


def create_token(
    conn: Connection,
    name: str,
    scope: Scope | str,
    *,
    read_only: bool = False,
    expires: datetime | timedelta | str | None = None,
    created_by: str | None = None,
) -> tuple[Token, str]:
    """Make a token: what is stored of it, and the token (shown this once). ``expires``: a
    time, a duration from now (``30d``), or None for never."""
    name = check_name(name)
    scope = scope if isinstance(scope, Scope) else Scope.parse(scope)
    now = datetime.now(UTC)
    expires_at = None
    if isinstance(expires, timedelta):
        if expires <= timedelta(0):
            raise InvalidInput("a token's lifetime must be positive")
        expires_at = now + expires
    elif expires is not None:
        expires_at = parse.deadline(expires, now)
    token = PREFIX + secrets.token_urlsafe(32)
    try:
        with conn.begin_nested():
            row = conn.execute(
                queries.CREATE_TOKEN,
                {
                    "name": name,
                    "scope": str(scope),
                    "read_only": read_only,
                    "token_sha256": _digest(token),
                    "created_by": created_by,
                    "expires_at": expires_at,
                },
            ).one()
    except IntegrityError:
        raise TokenExists(f"a token named {name!r} exists (revoked ones keep their name)") from None
    return _token(row), token


def list_tokens(conn: Connection) -> list[Token]:
    """Every token, revoked and expired ones too, oldest first."""
    return [_token(row) for row in conn.execute(queries.EVERY_TOKEN)]


def revoke_token(conn: Connection, name: str) -> Token:
    """Revoke the token named ``name`` (at once: its next request is refused). Revoking
    a revoked token changes nothing."""
    if not _NAME.fullmatch(name):  # no token has it (PostgreSQL refuses a NUL outright)
        raise TokenNotFound(f"no token named {name[:64]!r}")
    row = conn.execute(queries.REVOKE_TOKEN, {"name": name}).one_or_none()
    if row is None:
        raise TokenNotFound(f"no token named {name[:64]!r}")
    return _token(row)


def authenticate(conn: Connection, presented: str) -> Token:
    """The active token ``presented`` is; :class:`TokenRefused` if it is none, expired or
    revoked (the same answer for each, and never the token in it). Records its use."""
    if not _TOKEN.fullmatch(presented):
        raise TokenRefused("not a webhook-poller API token")
    row = conn.execute(queries.TOKEN_BY_DIGEST, {"token_sha256": _digest(presented)}).one_or_none()
    if row is None:
        raise TokenRefused("unknown, expired or revoked token")
    found = _token(row)
    now = datetime.now(UTC)
    if found.state(now) != "active":
        raise TokenRefused("unknown, expired or revoked token")
    if found.last_used_at is None or now - found.last_used_at >= LAST_USE_EVERY:
        conn.execute(queries.TOKEN_USED, {"id": found.id})
    return found
