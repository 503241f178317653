"""Private set intersection of instance IDs: Diffie-Hellman PSI over X25519 (semi-honest), in a star.

Every ID is hashed (SHA-256 with a domain tag) to a 32-byte X25519 u-coordinate
and blinded by a party's secret scalar; scalar multiplication commutes, so an
ID blinded by two parties, in either order, gives the same value, and equal
doubly-blinded values mean equal IDs.  Nobody sees another party's IDs, hashed
or not: a hash blinded by a secret scalar reveals nothing without that scalar
(the decisional Diffie-Hellman assumption, with the hash as a random oracle).

Star, around a lead party L (the label holder); every other party P, on its own:

1. P sends L its IDs' hashes blinded with its key ``a``, in an order of its own
   (a secret shuffle): ``A``.
2. L sends P its own blinded with ``b`` (shuffled): ``B``; and ``A`` blinded
   again with ``b``, in ``A``'s order: ``AB``.
3. P sends L ``B`` blinded again with ``a``, in ``B``'s order: ``BA``.  P knows
   which of its rows L holds (``AB`` in ``BA``), and L which of its rows P holds
   (``BA`` in ``AB``).
4. L intersects over all P and sends each P, in ``A``'s order, which of its rows
   every party holds.

Each party keeps the rows every party holds.  What each learns: L, the sizes of
the others' sets and which of its instances each holds; P, the size of L's set,
which of its rows L holds and which of them every party holds.  Nothing else:
no ID crosses in the clear.  Not protected: a party that lies about its IDs
(hashes it does not hold) learns whether others hold them, as with any PSI.
"""

from __future__ import annotations

import hashlib
import secrets

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from fedgrove.exceptions import ProtocolError

POINT = 32  # bytes of an X25519 u-coordinate
_DOMAIN = b"fedgrove/psi/v1/"


def hash_ids(ids: np.ndarray) -> list[bytes]:
    """Each int64 ID as a 32-byte u-coordinate (SHA-256 of a domain tag and the ID's 8 bytes)."""
    ids = np.ascontiguousarray(ids, dtype="<i8")
    return [hashlib.sha256(_DOMAIN + ids[i:i + 1].tobytes()).digest() for i in range(len(ids))]


class Blinder:
    """A party's secret scalar: blinds u-coordinates, its own or another party's already blinded."""

    def __init__(self, key: bytes | None = None):
        self._key = X25519PrivateKey.from_private_bytes(key if key is not None else secrets.token_bytes(32))

    def blind(self, points: list[bytes]) -> list[bytes]:
        out = []
        for p in points:
            try:
                out.append(self._key.exchange(X25519PublicKey.from_public_bytes(p)))
            except ValueError:  # a low-order point: the result would be all zeros (no hash lands there)
                raise ProtocolError("a blinded ID is a point of low order: not the hash of an ID") from None
        return out


def pack(points: list[bytes]) -> bytes:
    return b"".join(points)


def unpack(data: bytes, n: int | None = None, what: str = "blinded IDs") -> list[bytes]:
    """The 32-byte points of a message, refused unless whole (and ``n`` of them, when given)."""
    if len(data) % POINT or (n is not None and len(data) != n * POINT):
        expected = f"{n} x {POINT}" if n is not None else f"a multiple of {POINT}"
        raise ProtocolError(f"{what}: {len(data)} bytes, expected {expected}")
    return [data[i:i + POINT] for i in range(0, len(data), POINT)]


def shuffled(points: list[bytes]) -> tuple[list[bytes], np.ndarray]:
    """The points in a secret random order, and that order (``out[k] = points[order[k]]``)."""
    order = list(range(len(points)))
    secrets.SystemRandom().shuffle(order)
    return [points[k] for k in order], np.array(order, dtype=np.int64)


def matches(mine: list[bytes], theirs: list[bytes]) -> np.ndarray:
    """For each of ``mine``, whether it is among ``theirs`` (doubly blinded values of two parties)."""
    other = set(theirs)
    return np.fromiter((p in other for p in mine), dtype=bool, count=len(mine))
