"""Ed25519 signatures (``cryptography``): who wrote a ledger record, who endorsed a histogram."""

from __future__ import annotations

from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from fedgrove.exceptions import ProtocolError


class SigningKey:
    """A party's Ed25519 key pair."""

    def __init__(self, private_key: Ed25519PrivateKey | None = None):
        self._sk = private_key or Ed25519PrivateKey.generate()

    @classmethod
    def from_seed(cls, seed: bytes) -> "SigningKey":
        """A key from 32 secret bytes (tests and reproducible experiments)."""
        return cls(Ed25519PrivateKey.from_private_bytes(seed))

    def save(self, path) -> None:
        """Write the private key (PKCS#8 PEM, unencrypted) to ``path``, readable by its owner only."""
        from fedgrove.engine.model import atomic_write_bytes

        atomic_write_bytes(path, self._sk.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                        serialization.NoEncryption()))

    @classmethod
    def load(cls, path) -> "SigningKey":
        """A key written by :meth:`save`."""
        from fedgrove.exceptions import DataError

        try:
            key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
        except FileNotFoundError:
            raise DataError(f"signing key file {str(path)!r} does not exist") from None
        except (OSError, ValueError, TypeError) as exc:
            raise DataError(f"{str(path)!r} is not an unencrypted PEM private key: {exc}") from None
        if not isinstance(key, Ed25519PrivateKey):
            raise DataError(f"{str(path)!r} holds a {type(key).__name__}, not an Ed25519 key")
        return cls(key)

    def derive(self, purpose: bytes, length: int = 32) -> bytes:
        """Secret bytes for ``purpose``, derived from the private key (HKDF-SHA256): only the key's holder can
        compute them, and they are the same for as long as the key is (a resumed run draws the same noise)."""
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.kdf.hkdf import HKDF

        raw = self._sk.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                     serialization.NoEncryption())
        return HKDF(hashes.SHA256(), length, salt=b"fedgrove", info=b"fedgrove|" + purpose).derive(raw)

    def public_bytes(self) -> bytes:
        return self._sk.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)

    def sign(self, data: bytes) -> bytes:
        return self._sk.sign(data)


def public_key(raw: bytes) -> Ed25519PublicKey:
    if len(raw) != 32:
        raise ProtocolError(f"an Ed25519 public key has 32 bytes, got {len(raw)}")
    return Ed25519PublicKey.from_public_bytes(raw)


def verify(public: bytes | Ed25519PublicKey, signature: bytes, data: bytes) -> bool:
    """Whether ``signature`` is the holder of ``public``'s signature on ``data``."""
    key = public_key(public) if isinstance(public, (bytes, bytearray)) else public
    try:
        key.verify(bytes(signature), bytes(data))
    except (InvalidSignature, ValueError):
        return False
    return True
