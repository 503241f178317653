"""Secure aggregation by pairwise masking (Bonawitz et al., without dropout recovery).

Each client holds an X25519 key pair.  Two clients derive a shared secret by
key agreement, stretch it with HKDF into a pair key, and expand that key with
ChaCha20 into a mask for each aggregation, domain-separated by a tag (round,
tree, layer, node...).  Client ``i`` adds the mask shared with every ``j > i``
and subtracts the one shared with every ``j < i``; in the sum over all
clients the masks cancel exactly, so the aggregator learns the total and
nothing else about any single client's vector.

Two value domains:

* fixed-point vectors modulo 2**128 (:class:`FixedPoint128`): float values are
  scaled by ``2**frac_bits`` and held as two uint64 words (high, low), so
  sums of up to 2**(127 - frac_bits - value_bits) terms decode exactly;
* homomorphic-encryption plaintexts modulo ``n`` (:func:`mask_mod`), for
  protocols that aggregate encrypted values.

Threat model: honest-but-curious parties; the aggregator relays public keys,
so the channels' mutual TLS (which binds each key to its sender) is what
stops it from substituting its own.  No protection if a client drops out
mid-aggregation (the sum cannot be unmasked; the protocol fails loudly).
"""

from __future__ import annotations

import hashlib

import numpy as np
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from fedgrove.exceptions import ProtocolError

_TWO64 = float(2 ** 64)


def _exchange(sk: X25519PrivateKey, name: str, raw: bytes) -> bytes:
    """The shared secret of ``sk`` with ``name``'s raw public key; a ProtocolError for a key that is not one."""
    if len(raw) != 32:
        raise ProtocolError(f"public masking key of {name} must be 32 bytes, got {len(raw)}")
    try:
        return sk.exchange(X25519PublicKey.from_public_bytes(raw))
    except ValueError:  # a low-order point (all zeros, say): no shared secret, and no secrecy either
        raise ProtocolError(f"public masking key of {name} is not a usable X25519 key (a low-order "
                            f"point)") from None


def check_public_key(name: str, raw: bytes) -> None:
    """Refuse a raw public key that no party could agree a pair key with, as :meth:`MaskingKeys.agree` would:
    for a party that relays keys (the horizontal aggregator), which then says so first, whatever the order in
    which the others would have found it."""
    _exchange(X25519PrivateKey.generate(), name, raw)


class MaskingKeys:
    """One client's X25519 key pair and the pair keys it shares with the others."""

    def __init__(self, me: str, private_key: X25519PrivateKey | None = None):
        self.me = me
        self._sk = private_key or X25519PrivateKey.generate()
        self.pair_keys: dict[str, bytes] = {}

    def public_bytes(self) -> bytes:
        return self._sk.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)

    def agree(self, peers: dict[str, bytes], session: bytes = b"") -> None:
        """Derive the pair key with each peer from its raw 32-byte public key."""
        for name, raw in peers.items():
            if name == self.me:
                continue
            shared = _exchange(self._sk, name, raw)
            a, b = sorted([self.me, name])
            info = b"fedgrove-secagg|" + a.encode() + b"|" + b.encode() + b"|" + session
            self.pair_keys[name] = HKDF(hashes.SHA256(), 32, salt=None, info=info).derive(shared)

    def _stream(self, peer: str, tag: str, n_bytes: int) -> bytes:
        nonce = hashlib.sha256(tag.encode()).digest()[:16]
        enc = Cipher(algorithms.ChaCha20(self.pair_keys[peer], nonce), mode=None).encryptor()
        return enc.update(b"\x00" * n_bytes)

    def _sign(self, peer: str) -> int:
        return 1 if self.me < peer else -1

    def mask128(self, tag: str, length: int) -> tuple[np.ndarray, np.ndarray]:
        """Net mask (high, low uint64 words) this client adds for aggregation ``tag``."""
        hi = np.zeros(length, dtype=np.uint64)
        lo = np.zeros(length, dtype=np.uint64)
        for peer in sorted(self.pair_keys):
            words = np.frombuffer(self._stream(peer, tag, 16 * length), dtype="<u8").reshape(length, 2)
            m_hi, m_lo = words[:, 0].copy(), words[:, 1].copy()
            if self._sign(peer) < 0:
                m_hi, m_lo = neg128(m_hi, m_lo)
            hi, lo = add128(hi, lo, m_hi, m_lo)
        return hi, lo

    def mask_mod(self, tag: str, values: list[int], modulus: int) -> list[int]:
        """Mask integers modulo ``modulus`` (e.g. an HE plaintext space)."""
        out = [int(v) % modulus for v in values]
        width = (modulus.bit_length() + 7) // 8 + 16  # extra bytes make the reduction bias negligible
        for peer in sorted(self.pair_keys):
            stream = self._stream(peer, tag + "|mod", width * len(out))
            sign = self._sign(peer)
            for k in range(len(out)):
                r = int.from_bytes(stream[k * width:(k + 1) * width], "little") % modulus
                out[k] = (out[k] + sign * r) % modulus
        return out


    def mask_shared(self, tag: str, ids: np.ndarray, shared: dict[str, np.ndarray], bits: int = 224) -> list[int]:
        """Integer masks for this party's instances ``ids`` that cancel, as integers, over each instance's holders.

        ``shared[peer]`` lists the instance IDs this party holds in common with
        ``peer``; both sides draw the same ``bits``-bit value for each common
        ID (in sorted ID order) and add it with opposite signs.  An instance
        held by this party alone gets mask 0.
        """
        ids = np.asarray(ids, dtype=np.int64)
        pos = {int(i): k for k, i in enumerate(ids.tolist())}
        out = [0] * len(ids)
        width = (bits + 7) // 8
        for peer in sorted(shared):
            if peer not in self.pair_keys:
                raise ProtocolError(f"no masking key agreed with {peer}")
            common = np.unique(np.asarray(shared[peer], dtype=np.int64))
            stream = self._stream(peer, tag + "|shared", width * len(common))
            sign = self._sign(peer)
            for j, i in enumerate(common.tolist()):
                k = pos.get(int(i))
                if k is None:
                    raise ProtocolError(f"instance {i} said to be shared with {peer} is not held here")
                out[k] += sign * int.from_bytes(stream[j * width:(j + 1) * width], "little")
        return out


def add128(a_hi, a_lo, b_hi, b_lo):
    lo = a_lo + b_lo  # uint64 wraps
    carry = (lo < a_lo).astype(np.uint64)
    return a_hi + b_hi + carry, lo


def neg128(hi, lo):
    # two's complement: ~x + 1
    n_hi, n_lo = ~hi, ~lo
    return add128(n_hi, n_lo, np.zeros_like(hi), np.ones_like(lo))


class FixedPoint128:
    """Exact fixed-point vectors modulo 2**128 as (high, low) uint64 words."""

    def __init__(self, frac_bits: int = 53):
        self.frac_bits = frac_bits

    def encode(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``round(x * 2**frac_bits)`` as 128-bit two's complement words, exactly."""
        x = np.asarray(x, dtype=np.float64).ravel()
        if not np.all(np.isfinite(x)):
            raise ProtocolError("cannot aggregate non-finite values")
        scaled = np.rint(np.ldexp(x, self.frac_bits))  # exact power-of-two scaling, then integer
        if np.any(np.abs(scaled) >= 2.0 ** 126):
            raise ProtocolError("values too large for 128-bit fixed point")
        # below 2**63 in magnitude the integer is an int64, whose two's complement is the low word (the high
        # word: its sign).  Splitting by floats instead loses a negative value's low bits: 2**64 - 1 is no
        # float64, and -1 became -2**64.
        small = np.abs(scaled) < 2.0 ** 63
        as_int = np.where(small, scaled, 0.0).astype(np.int64)
        hi = np.where(as_int < 0, -1, 0).astype(np.int64)
        lo = as_int.view(np.uint64).copy()
        if not small.all():  # at least 2**63: multiples of 2**11, so both words are exact in float64
            big = scaled[~small]
            big_hi = np.floor(big / _TWO64)
            hi[~small] = big_hi.astype(np.int64)
            lo[~small] = _float_to_u64(big - big_hi * _TWO64)
        return hi.view(np.uint64), lo

    def decode(self, hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
        """The 128-bit values over ``2**frac_bits`` as floats: exact where the value is one (every encoded value
        is), else within a unit in the last place.  A negative value is decoded from its magnitude: as a high
        word of -1 plus a low word near 2**64 it lost its low bits to cancellation."""
        negative = hi.view(np.int64) < 0
        n_hi, n_lo = neg128(hi, lo)
        m_hi = np.where(negative, n_hi, hi)
        m_lo = np.where(negative, n_lo, lo)
        lo_f = (m_lo >> np.uint64(11)).astype(np.float64) * 2048.0 + (m_lo & np.uint64(2047)).astype(np.float64)
        magnitude = np.ldexp(m_hi.astype(np.float64), 64 - self.frac_bits) + np.ldexp(lo_f, -self.frac_bits)
        return np.where(negative, -magnitude, magnitude)

    @staticmethod
    def add(a, b):
        return add128(a[0], a[1], b[0], b[1])


def _float_to_u64(x: np.ndarray) -> np.ndarray:
    """Exact conversion of integral floats in [0, 2**64) to uint64 (numpy casts above 2**63 poorly)."""
    big = x >= 2.0 ** 63
    out = np.where(big, x - 2.0 ** 63, x).astype(np.uint64)
    out[big] += np.uint64(1 << 63)
    return out
