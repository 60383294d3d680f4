"""An endpoint's keys over time: rotating its signing key, resealing what is sealed.

A rotation keeps the old key signing for a while (both signatures are sent:
poller/rules/signing.py), so receivers move to the new key without a gap; it may
change the scheme. Resealing (``poller endpoints rotate-key``) moves every
sealed value — signing keys, headers, client keys — to POLLER_SECRETS_KEY's
first key, or back to plain text (poller/rules/keyring.py).
"""

from __future__ import annotations

from datetime import timedelta

from poller.endpoints.headers import PLAIN_PREFIX as HEADERS_PLAIN
from poller.endpoints.registry import Conn, Endpoint, change_one, get_endpoint, new_secret
from poller.endpoints.tls import PLAIN_PREFIX as TLS_PLAIN
from poller.errors import SecretUnreadable
from poller.rules.keyring import PLAIN_PREFIX as KEY_PLAIN
from poller.rules.keyring import Keyring
from poller.rules.signing import check_scheme
from poller.settings import default_settings
from poller.store.queries import endpoints as built


def rotate_secret(
    conn: Conn,
    name: str,
    keep_old_for: timedelta,
    *,
    keyring: Keyring | None = None,
    signing: str | None = None,
) -> tuple[Endpoint, str]:
    """A new signing key; the old one keeps signing too for ``keep_old_for``.

    ``signing`` changes the scheme (poller/rules/signing.py); by default the new key
    is of the current one. Returns the new key (for ed25519, give the receiver
    its public key: ``Endpoint.public_keys``).
    """
    keyring = keyring or default_settings().keyring
    if signing is None:
        current = get_endpoint(conn, name, keyring=keyring)
        if current.signing is None:  # its key could not be opened: its scheme is unknown
            raise SecretUnreadable(
                f"endpoint {name!r}: {current.secret_error}; give the scheme to rotate to"
            )
        signing = current.signing
    secret = new_secret(check_scheme(signing))
    values = built.rotated_key(keyring.seal(secret), keep_old_for)
    return change_one(conn, name, values, keyring), secret


SEALED: dict[str, str | tuple[str, ...]] = {
    "secret": KEY_PLAIN,
    "previous_secret": KEY_PLAIN,
    "headers": HEADERS_PLAIN,
    "client_key": TLS_PLAIN,
}
"""The columns stored sealed with POLLER_SECRETS_KEY, and how each starts in plain text."""


def reseal_secrets(conn: Conn, *, plain: bool = False, keyring: Keyring | None = None) -> int:
    """Seal every stored secret again with the keyring's first key (``rotate-key``).

    With ``plain``, store them in plain text again (to stop using POLLER_SECRETS_KEY).
    All endpoints change in one transaction, or none: a secret no key opens raises
    SecretUnreadable naming its endpoint. Returns how many endpoints were rewritten.
    Headers and client keys are sealed secrets too (:data:`SEALED`).
    """
    keyring = keyring or default_settings().keyring
    if not plain and not keyring.seals:
        raise SecretUnreadable(
            "POLLER_SECRETS_KEY is not set: there is no key to encrypt with "
            "(make one with 'poller endpoints new-key')"
        )
    rows = conn.execute(built.sealed_columns(list(SEALED))).all()
    for row in rows:
        values = {}
        for column, prefix in SEALED.items():
            stored = getattr(row, column)
            try:
                values[column] = (
                    None
                    if stored is None
                    else keyring.reseal(stored, plain=plain, plain_prefix=prefix)
                )
            except SecretUnreadable as exc:
                raise SecretUnreadable(f"endpoint {row.name!r}: {exc}") from None
        conn.execute(built.reseal(row.id, values))
    return len(rows)
