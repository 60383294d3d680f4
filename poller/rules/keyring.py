"""Signing secrets at rest: sealed with ``POLLER_SECRETS_KEY`` when it is set.

A stored secret is one of two spellings, so both can live side by side while an
operator turns encryption on:

* ``whsec_…`` (or ``whsk_…``, an ed25519 key) — in plain text (no key set
  when it was written);
* ``fernet:<token>`` — a Fernet token (AES-128-CBC + HMAC-SHA256, from
  ``cryptography``) of the plain secret.

``POLLER_SECRETS_KEY`` holds one or more Fernet keys, comma-separated. The
first seals every secret written; all of them open (``MultiFernet``), so a key
is rotated without downtime:

1. append the new key to every process's ``POLLER_SECRETS_KEY``, restart;
2. move it to the front, restart;
3. ``poller endpoints rotate-key`` re-seals every stored secret with it;
4. remove the old key.

A secret that cannot be opened (sealed but no key set, or no key fits) makes
the endpoint's :attr:`~poller.endpoints.registry.Endpoint.secret_error`; ``poller run``
refuses to start on it, and a delivery that meets one later crashes as a
counted attempt (it is never sent unsigned).

``cryptography`` (the service's extra) is imported when a key is used, so an
application's light install that only enqueues never needs it.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from poller.errors import ConfigurationError, SecretUnreadable

if TYPE_CHECKING:
    from cryptography.fernet import MultiFernet

SEALED_PREFIX = "fernet:"
PLAIN_PREFIX = ("whsec_", "whsk_")  # a signing key in plain text: HMAC or ed25519
ENV_NAME = "POLLER_SECRETS_KEY"
_KEY_RE = re.compile(r"[A-Za-z0-9_-]{43}=")  # 32 bytes, URL-safe base64, as Fernet makes them


def new_key() -> str:
    """A fresh key for ``POLLER_SECRETS_KEY``: 32 random bytes, URL-safe base64."""
    from cryptography.fernet import Fernet

    return Fernet.generate_key().decode("ascii")


def parse_keys(value: str) -> tuple[str, ...]:
    """The keys in a ``POLLER_SECRETS_KEY`` value (comma- or space-separated).

    Raises ConfigurationError naming the position of a bad key, never its value.
    """
    keys = tuple(part for part in re.split(r"[\s,]+", value) if part)
    if not keys:
        raise ConfigurationError(f"{ENV_NAME}: is set but holds no key")
    for position, key in enumerate(keys, 1):
        if not _KEY_RE.fullmatch(key):  # Fernet() alone accepts trailing junk after the '='
            raise ConfigurationError(
                f"{ENV_NAME}: key {position} of {len(keys)} is not a Fernet key "
                "(32 bytes in URL-safe base64; make one with 'poller endpoints new-key')"
            ) from None
    return keys


class Keyring:
    """Seals secrets with the first key, opens them with any key."""

    def __init__(self, keys: Sequence[str] = ()) -> None:
        self._fernet: MultiFernet | None = None
        if keys:
            from cryptography.fernet import Fernet, MultiFernet

            self._fernet = MultiFernet([Fernet(key) for key in keys])
        self.key_count = len(keys)

    @classmethod
    def from_value(cls, value: str | None) -> Keyring:
        """The keyring of a ``POLLER_SECRETS_KEY`` value (None or empty: no key)."""
        return cls(parse_keys(value) if value and value.strip() else ())

    @property
    def seals(self) -> bool:
        """True when secrets written now are encrypted."""
        return self._fernet is not None

    def seal(self, secret: str) -> str:
        """The stored spelling of a plain secret: sealed with the first key, if any."""
        if self._fernet is None:
            return secret
        return SEALED_PREFIX + self._fernet.encrypt(secret.encode("utf-8")).decode("ascii")

    def open(self, stored: str, plain_prefix: str | tuple[str, ...] = PLAIN_PREFIX) -> str:
        """The plain secret of a stored one, or SecretUnreadable saying why. A plain one
        starts with ``plain_prefix`` (``whsec_`` or ``whsk_`` for a signing key)."""
        if stored.startswith(plain_prefix):
            return stored
        if not stored.startswith(SEALED_PREFIX):
            spelled = "/".join((plain_prefix,) if isinstance(plain_prefix, str) else plain_prefix)
            raise SecretUnreadable(f"the stored secret is neither {spelled}… nor fernet:…")
        if self._fernet is None:
            raise SecretUnreadable(f"the secret is encrypted and {ENV_NAME} is not set")
        from cryptography.fernet import InvalidToken

        try:
            plain = self._fernet.decrypt(stored.removeprefix(SEALED_PREFIX).encode("ascii"))
        except (InvalidToken, UnicodeEncodeError):
            raise SecretUnreadable(
                f"the secret is encrypted with a key that is not in {ENV_NAME}"
            ) from None
        return plain.decode("utf-8")

    def reseal(
        self,
        stored: str,
        *,
        plain: bool = False,
        plain_prefix: str | tuple[str, ...] = PLAIN_PREFIX,
    ) -> str:
        """A stored secret sealed again with the first key (or in plain text with ``plain``)."""
        secret = self.open(stored, plain_prefix)
        return secret if plain else self.seal(secret)


def is_sealed(stored: str | None) -> bool:
    return stored is not None and stored.startswith(SEALED_PREFIX)


@functools.lru_cache(maxsize=8)
def keyring_for(value: str | None) -> Keyring:
    """The keyring of a ``POLLER_SECRETS_KEY`` value, built once per value."""
    return Keyring.from_value(value)
