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


def check_party_certs(ca_path, cert_path, key_path, party: str, now: datetime.datetime | None = None) -> None:
    """Refuse, before any connection, a party's TLS files that cannot work: unreadable, a certificate outside its
    validity period, one issued to another party or by another CA than ``ca_path``'s, or a key that is not the
    certificate's.  (Otherwise the handshakes fail and the peers only see a party that never answers.)"""
    from cryptography.exceptions import InvalidSignature

    from fedgrove.exceptions import DataError

    try:
        ca = x509.load_pem_x509_certificate(Path(ca_path).read_bytes())
        cert = x509.load_pem_x509_certificate(Path(cert_path).read_bytes())
        key = serialization.load_pem_private_key(Path(key_path).read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise DataError(f"party {party}: cannot read its TLS files ({ca_path}, {cert_path}, {key_path}): "
                        f"{exc}") from None
    now = now or datetime.datetime.now(datetime.timezone.utc)
    redo = "create the federation's certificates again with `fedgrove certs`"
    for what, c, path in (("the CA certificate", ca, ca_path), ("its certificate", cert, cert_path)):
        if now < c.not_valid_before_utc or now > c.not_valid_after_utc:
            raise DataError(f"party {party}: {what} {path} is valid from {c.not_valid_before_utc:%Y-%m-%d %H:%M} "
                            f"to {c.not_valid_after_utc:%Y-%m-%d %H:%M} UTC, not now; {redo}")
    names = [a.value for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    if names != [party]:
        raise DataError(f"party {party}: {cert_path} is the certificate of {', '.join(map(str, names)) or 'nobody'}, "
                        f"not of {party}")
    try:
        cert.verify_directly_issued_by(ca)
    except (InvalidSignature, ValueError, TypeError):
        raise DataError(f"party {party}: {cert_path} was not issued by {ca_path} (certificates of another "
                        f"federation?); {redo}") from None
    if key.public_key().public_numbers() != cert.public_key().public_numbers():
        raise DataError(f"party {party}: {key_path} is not the key of {cert_path}")
