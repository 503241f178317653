"""A federation's certificate authority and per-party certificates (mutual TLS).

``create_federation_certs(out_dir, parties)`` writes ``ca.pem`` (the CA
certificate, shared with everyone), ``ca.key`` (keep it offline) and for each
party ``<party>.pem`` / ``<party>.key``.  A party's certificate names the party
in its common name and in its subject alternative names (plus ``localhost``
and ``127.0.0.1`` for local runs); gRPC peers are checked against the CA and
the sender named in each envelope must equal the certificate's name.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from fedgrove.exceptions import InvalidParameterError


def _write(path: Path, data: bytes, private: bool = False) -> None:
    path.write_bytes(data)
    if private:
        os.chmod(path, 0o600)


def _key_pem(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def create_ca(name: str = "fedgrove federation CA", days: int = 365):
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    return key, cert


def issue(ca_key, ca_cert, party: str, hosts: list[str] | None = None, days: int = 365):
    if not party or not all(c.isalnum() or c in "-_." for c in party):
        raise InvalidParameterError(f"party names may hold letters, digits, '-', '_' and '.', got {party!r}")
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    names = [x509.DNSName(party), x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    for h in hosts or []:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            names.append(x509.DNSName(h))
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, party)]))
            .issuer_name(ca_cert.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    return key, cert


def create_federation_certs(out_dir, parties: list[str], hosts: dict[str, list[str]] | None = None) -> list[Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if len(set(parties)) != len(parties) or not parties:
        raise InvalidParameterError(f"party names must be distinct and non-empty, got {parties}")
    ca_key, ca_cert = create_ca()
    written = [out / "ca.pem", out / "ca.key"]
    _write(written[0], ca_cert.public_bytes(serialization.Encoding.PEM))
    _write(written[1], _key_pem(ca_key), private=True)
    for p in parties:
        key, cert = issue(ca_key, ca_cert, p, (hosts or {}).get(p))
        _write(out / f"{p}.pem", cert.public_bytes(serialization.Encoding.PEM))
        _write(out / f"{p}.key", _key_pem(key), private=True)
        written += [out / f"{p}.pem", out / f"{p}.key"]
    return written
