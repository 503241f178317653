"""Fixed-point packing of (g, h) pairs into single plaintexts.

Invariant (what the codec guarantees): every per-instance ``g`` with
``|g| < 2**value_bits`` and ``0 <= h < 2**value_bits`` is encoded as integers
``gi = round(g * 2**frac_bits)``, ``hi = round(h * 2**frac_bits)`` and packed as
``p = gi + hi * 2**S`` with ``S = frac_bits + value_bits + count_bits + 1``.
Sums of up to ``2**count_bits`` packed values decode *exactly* to
``(sum gi, sum hi)``: the low ``S`` bits hold the signed g-sum, the rest the
h-sum.  Several packed sums can share one plaintext (:meth:`GHPacker.compress`,
slots of ``W = 2S + 1`` bits) so the key holder decrypts fewer ciphertexts.

The key holder accepts only decrypted values inside the range the protocol
allows (:meth:`GHPacker.check_range`) and rejects anything else: a forged or
corrupted ciphertext cannot smuggle an arbitrary value through.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedgrove.exceptions import ProtocolError


@dataclass(frozen=True)
class GHPacker:
    frac_bits: int = 53
    value_bits: int = 16
    count_bits: int = 30

    @property
    def shift(self) -> int:
        """S: bits of the g field (signed)."""
        return self.frac_bits + self.value_bits + self.count_bits + 1

    @property
    def slot_bits(self) -> int:
        """W: bits of one packed (G, H) sum, sign included."""
        return 2 * self.shift + 1

    def slots_per_plaintext(self, plaintext_bits: int) -> int:
        return max(1, (plaintext_bits - 1) // self.slot_bits)

    # -- encoding ---------------------------------------------------------------------
    def encode(self, g: np.ndarray, h: np.ndarray) -> list[int]:
        g = np.asarray(g, dtype=np.float64)
        h = np.asarray(h, dtype=np.float64)
        limit = float(2 ** self.value_bits)
        if not (np.all(np.isfinite(g)) and np.all(np.isfinite(h))):
            raise ProtocolError("gradients must be finite to be encrypted")
        if np.any(np.abs(g) >= limit) or np.any(h < 0) or np.any(h >= limit):
            raise ProtocolError(f"gradients out of the packable range: need |g| < 2^{self.value_bits} and "
                                f"0 <= h < 2^{self.value_bits} (got max |g| {np.abs(g).max():.3g}, "
                                f"h in [{h.min():.3g}, {h.max():.3g}])")
        scale = float(2 ** self.frac_bits)
        gi = np.rint(g * scale)
        hi = np.rint(h * scale)
        s = self.shift
        return [int(a) + (int(b) << s) for a, b in zip(gi.tolist(), hi.tolist())]

    def encode_fixed(self, values: np.ndarray) -> np.ndarray:
        """The fixed-point integers of ``values`` as float64 sums would see them (for tests/oracles)."""
        return np.rint(np.asarray(values, dtype=np.float64) * float(2 ** self.frac_bits))

    # -- decoding ---------------------------------------------------------------------
    def _signed_low(self, v: int, bits: int) -> int:
        half = 1 << (bits - 1)
        return ((v + half) & ((1 << bits) - 1)) - half

    def unpack(self, v: int) -> tuple[int, int]:
        """Integer (G, H) sums of one packed plaintext."""
        gsum = self._signed_low(v, self.shift)
        hsum = (v - gsum) >> self.shift
        return gsum, hsum

    def check_range(self, v: int, n_slots: int = 1) -> None:
        bound = 1 << (self.slot_bits * n_slots)
        if not -bound < v < bound:
            raise ProtocolError("a decrypted value lies outside the range the protocol allows; refusing it")

    def decode(self, values: list[int], n_slots: int = 1, n_sums: int | None = None) -> np.ndarray:
        """Float (G, H) of each packed sum; ``values`` may hold ``n_slots`` sums each (compressed)."""
        out = []
        scale = 2.0 ** -self.frac_bits
        limit = 1 << (self.shift - 1)
        for v in values:
            v = int(v)
            self.check_range(v, n_slots)
            for _ in range(n_slots):
                slot = self._signed_low(v, self.slot_bits)
                v = (v - slot) >> self.slot_bits
                gsum, hsum = self.unpack(slot)
                if not (0 <= hsum < limit):
                    raise ProtocolError("a decrypted hessian sum is negative or too large; refusing it")
                out.append((gsum * scale, hsum * scale))
            if v != 0:
                raise ProtocolError("a decrypted value carries more slots than agreed; refusing it")
        arr = np.asarray(out, dtype=np.float64).reshape(-1, 2)
        return arr if n_sums is None else arr[:n_sums]
