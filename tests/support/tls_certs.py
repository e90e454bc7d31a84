"""Throw-away PKI for the TLS tests, generated with the ``cryptography`` package.

EC P-256 keys (fast to generate); certificates valid from an hour ago for a day unless
``expired``. Server certificates name 127.0.0.1 (IP) and localhost (DNS).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _pem_key(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


class Ca:
    """A self-signed CA that issues leaf certificates into ``directory``."""

    def __init__(self, directory: Path, name: str = "pp1q-test-ca") -> None:
        self.dir, self.name = directory, name
        directory.mkdir(parents=True, exist_ok=True)
        self.key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        self.cert = (x509.CertificateBuilder().subject_name(_name(name)).issuer_name(_name(name))
                     .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
                     .not_valid_before(now - dt.timedelta(hours=1))
                     .not_valid_after(now + dt.timedelta(days=1))
                     .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                     .add_extension(x509.KeyUsage(False, False, False, False, False, True, True,
                                                  False, False), critical=True)
                     .sign(self.key, hashes.SHA256()))
        self.path = directory / f"{name}.pem"
        self.path.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))

    def issue(self, cn: str, *, server: bool, expired: bool = False,
              names: tuple[str, ...] = ("127.0.0.1", "localhost")) -> Leaf:
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        start = now - dt.timedelta(days=3 if expired else 0, hours=1)
        end = now - dt.timedelta(days=1) if expired else now + dt.timedelta(days=1)
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        b = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(self.cert.subject)
             .public_key(key.public_key()).serial_number(x509.random_serial_number())
             .not_valid_before(start).not_valid_after(end)
             .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
             .add_extension(x509.ExtendedKeyUsage([usage]), critical=False))
        if server:
            alt = [_alt_name(n) for n in names]
            b = b.add_extension(x509.SubjectAlternativeName(alt), critical=False)
        cert = b.sign(self.key, hashes.SHA256())
        leaf = Leaf(self.dir / f"{cn}.crt", self.dir / f"{cn}.key", self.path)
        leaf.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        leaf.key.write_bytes(_pem_key(key))
        leaf.key.chmod(0o600)  # as security.md asks (tls.py refuses a key others read)
        return leaf


def _alt_name(n: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(n))
    except ValueError:
        return x509.DNSName(n)


@dataclass(frozen=True)
class Leaf:
    cert: Path
    key: Path
    ca: Path

    def settings(self, ca: Path | None = None) -> dict:
        return {"tls_cert": str(self.cert), "tls_key": str(self.key),
                "tls_ca": str(ca or self.ca)}

    def args(self, ca: Path | None = None) -> list[str]:
        s = self.settings(ca)
        return ["--tls-cert", s["tls_cert"], "--tls-key", s["tls_key"], "--tls-ca", s["tls_ca"]]
