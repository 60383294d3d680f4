"""An endpoint's TLS: a client certificate (mutual TLS) and a private CA bundle.

::

    poller endpoints add billing https://billing.internal/webhooks \\
        --client-cert client.pem --client-key client-key.pem --ca-bundle internal-ca.pem

* ``client_cert`` / ``client_key``: PEM; the key unencrypted (the poller seals
  it at rest with ``POLLER_SECRETS_KEY``, like signing secrets, and never shows
  it). Both or neither; the key must be the certificate's, the certificate not
  expired. Intermediates may follow the certificate in the same PEM.
* ``ca_bundle``: PEM certificates the endpoint's certificate chains to. With a
  bundle, *only* it is trusted for that endpoint (not the system's roots): a
  private CA is the point, and a public CA that signed for the same name is not
  a second way in. Hostname checks stay on.

A TLS failure is *not sent* (the receiver's application never saw the request,
even when a TLS 1.3 server refuses the client certificate after the client
wrote it), with a reason a person reads: :func:`tls_failure`.
"""

from __future__ import annotations

import contextlib
import functools
import os
import ssl
import tempfile
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from poller.errors import InvalidEndpoint

PLAIN_PREFIX = "-----BEGIN"  # a client key stored in plain text (no POLLER_SECRETS_KEY)
MAX_CERT = 64 * 1024
MAX_KEY = 16 * 1024
MAX_BUNDLE = 512 * 1024


@dataclass(frozen=True, slots=True)
class TLSSettings:
    client_cert: str | None = None
    client_key: str | None = field(default=None, repr=False)
    ca_bundle: str | None = None

    def context(self) -> ssl.SSLContext:
        """The client context for this endpoint, built once per settings."""
        return _context(self.client_cert, self.client_key, self.ca_bundle)

    def summary(self) -> dict[str, Any]:
        """What may be shown: the certificates' subjects and expiry, never the key."""
        shown: dict[str, Any] = {"client_cert": None, "ca_bundle": None}
        if self.client_cert:
            cert = x509.load_pem_x509_certificates(self.client_cert.encode())[0]
            shown["client_cert"] = {
                "subject": cert.subject.rfc4514_string(),
                "issuer": cert.issuer.rfc4514_string(),
                "expires": cert.not_valid_after_utc,
            }
        if self.ca_bundle:
            shown["ca_bundle"] = [
                c.subject.rfc4514_string()
                for c in x509.load_pem_x509_certificates(self.ca_bundle.encode())
            ]
        return shown


def _text(pem: object, what: str) -> str:
    if not isinstance(pem, str) or not pem.strip():
        raise InvalidEndpoint(f"{what} is empty")
    if "\x00" in pem:  # PostgreSQL stores no NUL, and no PEM holds one
        raise InvalidEndpoint(f"{what} is not PEM text (it holds a NUL)")
    return pem


def _certificates(pem: str, what: str, limit: int) -> list[x509.Certificate]:
    _text(pem, what)
    if len(pem.encode("utf-8", "replace")) > limit:
        raise InvalidEndpoint(f"{what} is larger than {limit // 1024} KiB")
    try:
        found = x509.load_pem_x509_certificates(pem.encode("utf-8"))
    except (ValueError, UnicodeEncodeError):
        raise InvalidEndpoint(f"{what} is not a PEM certificate") from None
    if not found:
        raise InvalidEndpoint(f"{what} holds no certificate")
    return found


def check_tls(
    client_cert: str | None, client_key: str | None, ca_bundle: str | None
) -> TLSSettings:
    """The settings if they are usable; InvalidEndpoint says what is wrong (never quoting
    the key)."""
    if (client_cert is None) != (client_key is None):
        raise InvalidEndpoint("a client certificate needs its key, and a key its certificate")
    if client_cert is not None and client_key is not None:
        cert = _certificates(client_cert, "the client certificate", MAX_CERT)[0]
        _text(client_key, "the client key")
        if len(client_key.encode("utf-8", "replace")) > MAX_KEY:
            raise InvalidEndpoint(f"the client key is larger than {MAX_KEY // 1024} KiB")
        try:
            key = serialization.load_pem_private_key(client_key.encode("utf-8"), password=None)
        except TypeError:
            raise InvalidEndpoint(
                "the client key is encrypted: give it unencrypted (the poller stores it "
                "sealed with POLLER_SECRETS_KEY)"
            ) from None
        except (ValueError, UnicodeEncodeError, UnsupportedAlgorithm):
            raise InvalidEndpoint("the client key is not a PEM private key") from None
        if key.public_key().public_bytes(
            Encoding.PEM, PublicFormat.SubjectPublicKeyInfo
        ) != cert.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo):
            raise InvalidEndpoint("the client key is not the client certificate's key")
        if cert.not_valid_after_utc <= datetime.now(UTC):
            raise InvalidEndpoint(
                f"the client certificate expired on {cert.not_valid_after_utc:%Y-%m-%d}"
            )
    if ca_bundle is not None:
        _certificates(ca_bundle, "the CA bundle", MAX_BUNDLE)
    settings = TLSSettings(client_cert, client_key, ca_bundle)
    try:
        settings.context()
    except ssl.SSLError as exc:
        raise InvalidEndpoint(f"TLS settings refused: {exc.reason or exc}") from None
    return settings


@functools.lru_cache(maxsize=256)
def _context(cert: str | None, key: str | None, ca_bundle: str | None) -> ssl.SSLContext:
    context = (
        ssl.create_default_context(cadata=ca_bundle)
        if ca_bundle
        else (ssl.create_default_context())
    )
    if cert is not None and key is not None:
        # ssl loads a certificate chain only from files: a private directory, gone at once.
        with tempfile.TemporaryDirectory(prefix="poller-tls-") as folder:
            cert_path, key_path = os.path.join(folder, "cert.pem"), os.path.join(folder, "key.pem")
            for path, text in ((cert_path, cert), (key_path, key)):
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "w") as handle:
                    handle.write(text)
            context.load_cert_chain(cert_path, key_path)
    return context


# What a person reads for each failure, by OpenSSL's verify code or alert reason.
_VERIFY = {
    2: "unknown CA (no issuer certificate; give the endpoint its CA with --ca-bundle)",
    10: "the receiver's certificate has expired",
    9: "the receiver's certificate is not valid yet",
    18: "unknown CA (a self-signed certificate; give the endpoint its CA with --ca-bundle)",
    19: "unknown CA (a self-signed root in the chain; give the endpoint --ca-bundle)",
    20: "unknown CA (the certificate does not chain to a trusted root; see --ca-bundle)",
    21: "unknown CA (the certificate does not chain to a trusted root; see --ca-bundle)",
    62: "hostname mismatch (the certificate is not for this host)",
    64: "hostname mismatch (the certificate is not for this IP address)",
}
_ALERTS = {
    "TLSV13_ALERT_CERTIFICATE_REQUIRED": "client certificate required by the receiver",
    "SSLV3_ALERT_BAD_CERTIFICATE": "client certificate refused by the receiver",
    "TLSV1_ALERT_UNKNOWN_CA": "client certificate refused by the receiver (unknown CA)",
    "SSLV3_ALERT_CERTIFICATE_EXPIRED": "client certificate refused by the receiver (expired)",
    "TLSV1_ALERT_ACCESS_DENIED": "client certificate refused by the receiver (access denied)",
    "SSLV3_ALERT_HANDSHAKE_FAILURE": "TLS handshake refused by the receiver",
    "TLSV1_ALERT_PROTOCOL_VERSION": "no TLS version in common with the receiver",
    "WRONG_VERSION_NUMBER": "the receiver does not speak TLS on this port",
}


def _ssl_errors(exc: BaseException | None) -> list[ssl.SSLError]:
    """The ssl errors in an exception's chain (causes, contexts, wrapped arguments)."""
    seen: list[ssl.SSLError] = []
    stack = [exc]
    visited: set[int] = set()
    while stack:
        current = stack.pop()
        if current is None or id(current) in visited:
            continue
        visited.add(id(current))
        if isinstance(current, ssl.SSLError) and type(current).__module__ == "ssl":
            seen.append(current)  # ssl's own, not a client's subclass wrapping one
        stack += [current.__cause__, current.__context__]
        stack += [a for a in getattr(current, "args", ()) if isinstance(a, BaseException)]
        for name in ("certificate_error", "os_error"):
            with contextlib.suppress(AttributeError):
                stack.append(getattr(current, name))
    return seen


HANDSHAKE_RESET = (
    "TLS: the receiver reset the connection in the handshake (it refused the client "
    "certificate, usually)"
)


def handshake_reset(exc: BaseException) -> bool:
    """Whether a connection failure was a reset or an EOF: for an https URL, in the TLS
    handshake (TCP itself is refused, not reset) — where a receiver that refuses a
    client certificate closes with its alert unread, so the client sees a reset or an
    early EOF. Only for failures getting a connection: nothing was sent."""
    stack: list[BaseException | None] = [exc]
    visited: set[int] = set()
    while stack:
        current = stack.pop()
        if current is None or id(current) in visited:
            continue
        visited.add(id(current))
        if isinstance(current, ConnectionResetError | ssl.SSLEOFError):
            return True
        stack += [current.__cause__, current.__context__, getattr(current, "os_error", None)]
    return False


def tls_failure(exc: BaseException) -> str | None:
    """Why the TLS handshake failed, in words; None if it did not (another ssl error — an
    EOF without close_notify after an answer, say — leaves the phase to decide). Every
    reason here means the receiver's application never had the request."""
    for error in _ssl_errors(exc):
        if isinstance(error, ssl.SSLCertVerificationError):
            reason = _VERIFY.get(error.verify_code, error.verify_message or str(error))
            return f"TLS: {reason}"
        if error.reason in _ALERTS:
            return f"TLS: {_ALERTS[error.reason]}"
    return None
