"""A federation's certificate authority and per-party certificates (mutual TLS).

``create_federation_certs(out_dir, parties)`` writes ``ca.pem`` (the CA
certificate, shared with everyone), ``ca.key`` (keep it offline) and for each
party ``<party>.pem`` / ``<party>.key``; run again on the same directory, it
issues certificates to new parties from the CA already there.  A party's
certificate names the party in its common name and in its subject
alternative names (plus ``localhost`` and ``127.0.0.1`` for local runs); gRPC
peers are checked against the CA and the sender named in each envelope must
equal the certificate's name.
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


def check_party_name(party: str, where: str = "") -> None:
    """A party's name becomes its certificate's common name (a DNS name) and the start of its files' names:
    ASCII letters, digits, '-', '_' and '.' only, not dots alone (no path separators, no ".."), and not ``ca``,
    whose files are the federation CA's."""
    if not party or not all((c.isascii() and c.isalnum()) or c in "-_." for c in party) or set(party) == {"."}:
        raise InvalidParameterError(f"{where}party names may hold ASCII letters, digits, '-', '_' and '.' (not "
                                    f"dots alone), got {party!r}")
    if party.lower() == "ca":
        raise InvalidParameterError(f"{where}{party!r} cannot name a party: its files would be the federation CA's "
                                    f"(ca.pem, ca.key); choose another name")


def issue(ca_key, ca_cert, party: str, hosts: list[str] | None = None, days: int = 365):
    check_party_name(party)
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


def create_federation_certs(out_dir, parties: list[str], hosts: dict[str, list[str]] | None = None,
                            replace: bool = False) -> list[Path]:
    """Write the CA and each party's certificate and key to ``out_dir``; returns the files written.

    A directory that already holds a CA (``ca.pem`` and ``ca.key``) keeps it and issues the new parties'
    certificates from it, so the parties that have theirs keep working; a party whose files there are
    valid for this CA is left as it is (running the same command twice changes nothing), one whose files
    are not is refused, unless ``replace`` (new key and certificate for every party given).  Everything is
    checked before any file is written."""
    from fedgrove.exceptions import DataError

    out = Path(out_dir)
    if len(set(parties)) != len(parties) or not parties:
        raise InvalidParameterError(f"party names must be distinct and non-empty, got {parties}")
    for p in parties:
        check_party_name(p)
    have = [p for p in parties if (out / f"{p}.pem").exists() or (out / f"{p}.key").exists()]
    ca = _existing_ca(out)
    todo = list(parties)
    if have and not replace:
        if ca is None:
            raise InvalidParameterError(f"{out} holds certificates of {', '.join(have)} but no CA; use another "
                                        f"directory, or --force to start a new CA there")
        for p in have:
            try:
                check_party_certs(out / "ca.pem", out / f"{p}.pem", out / f"{p}.key", p)
            except DataError as exc:
                raise InvalidParameterError(f"{exc}; issue {p}'s again with --force") from None
        todo = [p for p in parties if p not in have]
    if ca is None:
        ca_key, ca_cert = create_ca()
        files = {"ca.pem": (ca_cert.public_bytes(serialization.Encoding.PEM), False),
                 "ca.key": (_key_pem(ca_key), True)}
    else:
        ca_key, ca_cert = ca
        files = {}
    for p in todo:
        key, cert = issue(ca_key, ca_cert, p, (hosts or {}).get(p))
        files[f"{p}.pem"] = (cert.public_bytes(serialization.Encoding.PEM), False)
        files[f"{p}.key"] = (_key_pem(key), True)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, (data, private) in files.items():
        _write(out / name, data, private)
        written.append(out / name)
    return written


def _existing_ca(out: Path):
    """The CA (key, certificate) kept in ``out``, or None when there is none; refuses one that cannot issue."""
    cert_path, key_path = out / "ca.pem", out / "ca.key"
    if not cert_path.exists() and not key_path.exists():
        return None
    if not (cert_path.exists() and key_path.exists()):
        raise InvalidParameterError(f"{out} holds {'ca.pem' if cert_path.exists() else 'ca.key'} without "
                                    f"{'ca.key' if cert_path.exists() else 'ca.pem'}: new certificates cannot be "
                                    f"issued from this CA; use another directory")
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise InvalidParameterError(f"cannot read the CA in {out}: {exc}") from None
    if key.public_key().public_numbers() != cert.public_key().public_numbers():
        raise InvalidParameterError(f"{key_path} is not the key of {cert_path}")
    if datetime.datetime.now(datetime.timezone.utc) > cert.not_valid_after_utc:
        raise InvalidParameterError(f"the CA in {out} expired on {cert.not_valid_after_utc:%Y-%m-%d}; create "
                                    f"the federation's certificates again in another directory")
    return key, cert


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
