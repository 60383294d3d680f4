"""Certificates the TLS tests make (``cryptography``, P-256: fast): CAs, leaf certificates
for 127.0.0.1 or another name, expired ones, and TLS servers on 127.0.0.1 using them."""

from __future__ import annotations

import contextlib
import ipaddress
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.integration import servers


@dataclass(frozen=True)
class Issued:
    cert: str  # PEM
    key: str  # PEM, unencrypted
    _cert: x509.Certificate
    _key: ec.EllipticCurvePrivateKey

    def encrypted_key(self, password: bytes) -> str:
        return self._key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(password),
        ).decode()


CA_USAGE = x509.KeyUsage(
    digital_signature=True,
    content_commitment=False,
    key_encipherment=False,
    data_encipherment=False,
    key_agreement=False,
    key_cert_sign=True,
    crl_sign=True,
    encipher_only=False,
    decipher_only=False,
)


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _pem(cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> Issued:
    return Issued(
        cert.public_bytes(serialization.Encoding.PEM).decode(),
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ).decode(),
        cert,
        key,
    )


def authority(common: str = "Test Root CA") -> Issued:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common))
        .issuer_name(_name(common))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(days=1))
        .not_valid_after(now + timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(CA_USAGE, critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return _pem(cert, key)


def issue(
    ca: Issued,
    common: str = "127.0.0.1",
    *,
    client: bool = False,
    expired: bool = False,
) -> Issued:
    """A leaf certificate signed by ``ca``: a server one for ``common`` (an IP or a DNS
    name), or a client one; ``expired`` ended yesterday."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.now(UTC)
    ends = now - timedelta(days=1) if expired else now + timedelta(days=7)
    try:
        alt: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(common))
    except ValueError:
        alt = x509.DNSName(common)
    usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common))
        .issuer_name(ca._cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(days=2))
        .not_valid_after(ends)
        .add_extension(x509.SubjectAlternativeName([alt]), critical=False)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca._key.public_key()),
            critical=False,
        )
        .sign(ca._key, hashes.SHA256())
    )
    return _pem(cert, key)


@contextlib.asynccontextmanager
async def tls_server(
    tmp: Path,
    server: Issued,
    *,
    client_ca: Issued | None = None,
    status: int = 200,
    tls12: bool = False,
) -> AsyncIterator[str]:
    """An HTTPS server on 127.0.0.1 answering ``status``; with ``client_ca`` it requires a
    client certificate that CA signed (mutual TLS); ``tls12`` caps it at TLS 1.2.
    Yields its base URL."""
    (tmp / "server.pem").write_text(server.cert)
    (tmp / "server-key.pem").write_text(server.key)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp / "server.pem", tmp / "server-key.pem")
    if tls12:  # the client certificate is judged inside the handshake
        context.maximum_version = ssl.TLSVersion.TLSv1_2
    if client_ca is not None:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(cadata=client_ca.cert)
    async with servers.raw_server(servers.answer(status), tls=context) as url:
        yield url
