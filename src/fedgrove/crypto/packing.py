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


#: the widest gradient (and hessian) a packed pair holds, in bits above the binary point: the most a passive
#: party or guest takes from the key holder's layout
MAX_VALUE_BITS = 64


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
    def unpack(self, v: int) -> tuple[int, int]:
        """Integer (G, H) sums of one packed plaintext."""
        gsum = _signed_low(v, self.shift)
        hsum = (v - gsum) >> self.shift
        return gsum, hsum

    def check_range(self, v: int, n_slots: int = 1) -> None:
        bound = 1 << (self.slot_bits * n_slots)
        if not -bound < v < bound:
            raise ProtocolError("a decrypted value lies outside the range the protocol allows; refusing it")

    def pair_sum(self, slot: int) -> tuple[float, float]:
        """Float (G, H) of one packed sum (a signed ``slot_bits``-bit integer); refused when out of range."""
        return self.pair_decoder()(slot)

    def pair_decoder(self):
        """:meth:`pair_sum` with the layout's constants bound once, for the many sums of a reply (the
        properties cost more than the arithmetic)."""
        s = self.shift
        low, high = -(1 << 2 * s), 1 << 2 * s          # a signed slot of 2S + 1 bits
        g_mask, g_half, h_limit = (1 << s) - 1, 1 << (s - 1), 1 << (s - 1)
        scale = 2.0 ** -self.frac_bits

        def pair(slot: int) -> tuple[float, float]:
            if not low <= slot < high:
                raise ProtocolError("a decrypted sum lies outside the range the protocol allows; refusing it")
            gsum = ((slot + g_half) & g_mask) - g_half
            hsum = (slot - gsum) >> s
            if not 0 <= hsum < h_limit:
                raise ProtocolError("a decrypted hessian sum is negative or too large; refusing it")
            return gsum * scale, hsum * scale

        return pair

    def decode(self, values: list[int], n_slots: int = 1, n_sums: int | None = None) -> np.ndarray:
        """Float (G, H) of each packed sum; ``values`` may hold ``n_slots`` sums each (compressed)."""
        out = []
        w = self.slot_bits
        mask, half = (1 << w) - 1, 1 << (w - 1)
        pair = self.pair_decoder()
        for v in values:
            v = int(v)
            self.check_range(v, n_slots)
            for _ in range(n_slots):
                slot = ((v + half) & mask) - half             # _signed_low(v, w)
                v = (v - slot) >> w
                out.append(pair(slot))
            if v != 0:
                raise ProtocolError("a decrypted value carries more slots than agreed; refusing it")
        arr = np.asarray(out, dtype=np.float64).reshape(-1, 2)
        return arr if n_sums is None else arr[:n_sums]


#: bits of uniform noise above a discarded position's largest value: it hides that value up to 2^-40
MASK_BITS = 40
#: most instances one gradient ciphertext may carry
MAX_ROWS = 16


@dataclass(frozen=True)
class RowPacking:
    """Several instances' packed (g, h) in one plaintext, for keys whose plaintexts are far longer than a pair.

    With ``rows = K`` the key holder encrypts ``sum_j p[kK + j] * 2^(jV)``
    for ciphertext ``k`` (instance ``i`` at position ``i mod K`` of ciphertext
    ``i // K``), ``V = stride_bits``: K times fewer encryptions and gradient
    bytes.  A bin's sum needs each of its instances' own position only: the
    feature holder sums the bin's ciphertexts separately per position ``j``
    (``S_j``, its position ``j`` holds the bin's instances at position ``j``;
    the other positions hold their partners' values) and lays ``S_j`` out at
    ``K - 1 - j`` positions above the bin's base, so that position ``K - 1``
    of the bin adds up exactly the bin's sum while the ``2(K - 1)``
    positions around it hold partners' sums.  Consecutive bins are ``K``
    positions apart (their partner positions overlap, the bin sums never),
    and whole bins fill a plaintext (:meth:`bins_per_plaintext`).  Before the
    key holder decrypts, the feature holder adds uniform noise of
    ``W + MASK_BITS`` bits (``W``: a pair sum's bits) to every partner
    position, so the key holder learns the bin sums it learns with one
    instance per ciphertext and nothing more (statistically, up to 2^-40).
    ``V = W + MASK_BITS + 2`` keeps every position inside its bits: a
    partner position adds up each instance at most twice, and the noise.
    """

    rows: int = 1
    stride_bits: int = 0

    @classmethod
    def for_packer(cls, packer: "GHPacker", rows: int) -> "RowPacking":
        return cls(rows, packer.slot_bits + (MASK_BITS + 2 if rows > 1 else 0))

    def n_ciphertexts(self, n_instances: int) -> int:
        return -(-n_instances // self.rows)

    def pack(self, values: list[int]) -> list[int]:
        """One plaintext per ``rows`` consecutive packed values."""
        if self.rows == 1:
            return values
        k, v = self.rows, self.stride_bits
        return [sum(x << (j * v) for j, x in enumerate(values[i:i + k])) for i in range(0, len(values), k)]

    def fits(self, plaintext_bits: int) -> bool:
        """Whether plaintexts of ``plaintext_bits`` bits hold this layout (at least one whole bin)."""
        return 1 <= self.rows <= MAX_ROWS and (self.rows == 1 or self.bins_per_plaintext(plaintext_bits) >= 1)

    def bins_per_plaintext(self, plaintext_bits: int) -> int:
        """Whole bins (``rows`` sums each, ``2 rows - 1`` positions with their partners) one plaintext holds."""
        positions = (plaintext_bits - 1) // self.stride_bits
        return (positions - (self.rows - 1)) // self.rows

    def masks(self, n_sums: int, per_plaintext: int, pair_bits: int) -> list[int]:
        """Uniform noise for every partner position of each compressed plaintext (``n_sums`` bin sums,
        ``per_plaintext`` to a plaintext, pairs of ``pair_bits`` bits); the bin-sum positions get none."""
        import secrets

        k, v = self.rows, self.stride_bits
        out = []
        for start in range(0, n_sums, per_plaintext):
            n_bins = min(per_plaintext, n_sums - start)
            mask = 0
            for q in range(n_bins * k + k - 1):
                if q % k != k - 1:  # not a bin's sum
                    mask |= secrets.randbits(pair_bits + MASK_BITS) << (q * v)
            out.append(mask)
        return out

    def decode(self, packer: "GHPacker", values: list[int], per_plaintext: int, n_sums: int) -> np.ndarray:
        """Float (G, H) of each bin sum from the decrypted plaintexts; every position must fit its bits and
        every bin sum the packing's range, or the plaintext is refused."""
        k, v = self.rows, self.stride_bits
        mask, half = (1 << v) - 1, 1 << (v - 1)
        pair = packer.pair_decoder()
        out = []
        for start, value in zip(range(0, n_sums, per_plaintext), values):
            n_bins = min(per_plaintext, n_sums - start)
            value = int(value)
            for q in range(n_bins * k + k - 1):
                x = ((value + half) & mask) - half            # _signed_low(value, v)
                value = (value - x) >> v
                if q % k == k - 1:  # a bin's sum (the others: partners' sums under noise)
                    out.append(pair(x))
            if value != 0:
                raise ProtocolError("a decrypted value carries more positions than agreed; refusing it")
        if len(out) != n_sums:
            raise ProtocolError(f"{len(values)} plaintexts hold {len(out)} bin sums, expected {n_sums}")
        return np.asarray(out, dtype=np.float64).reshape(-1, 2)


@dataclass(frozen=True)
class VectorPacker:
    """Fixed-point packing of a short vector of statistics per instance into one plaintext.

    Field ``k`` holds ``round(v_k * 2**frac_bits[k])`` in ``frac_bits[k] +
    int_bits[k] (+1 if signed[k])`` bits, laid out from the lowest bits up.
    Invariant the caller guarantees: every sum the protocol forms stays below
    ``2**int_bits[k]`` in magnitude (and non-negative for unsigned fields), so
    sums decode exactly; :meth:`encode` checks single values against the same
    bound.  Several packed sums share one plaintext in slots of
    :attr:`slot_bits` bits (as :class:`GHPacker`'s), so the vertical protocols'
    encrypted-histogram code carries these statistics unchanged: per-class
    label counts, or (w, w*y, w*y^2), in Federated Forest.
    """

    frac_bits: tuple
    int_bits: tuple
    signed: tuple

    def __post_init__(self):
        if not (len(self.frac_bits) == len(self.int_bits) == len(self.signed) >= 1):
            raise ValueError("frac_bits, int_bits and signed must have one entry per field")

    @property
    def n_values(self) -> int:
        return len(self.frac_bits)

    @property
    def widths(self) -> list[int]:
        return [f + b + int(s) for f, b, s in zip(self.frac_bits, self.int_bits, self.signed)]

    @property
    def slot_bits(self) -> int:
        return sum(self.widths) + 1

    def slots_per_plaintext(self, plaintext_bits: int) -> int:
        if self.slot_bits > plaintext_bits - 1:
            raise ProtocolError(f"the statistics need {self.slot_bits}-bit plaintexts; the key gives "
                                f"{plaintext_bits} bits (use Paillier or fewer classes)")
        return (plaintext_bits - 1) // self.slot_bits

    def encode(self, values: np.ndarray) -> list[int]:
        """One packed integer per row of ``values`` (n, n_values)."""
        values = np.asarray(values, dtype=np.float64).reshape(len(values), self.n_values)
        if not np.all(np.isfinite(values)):
            raise ProtocolError("statistics must be finite to be encrypted")
        fixed = []
        for k, (f, b, s) in enumerate(zip(self.frac_bits, self.int_bits, self.signed)):
            col = values[:, k]
            if len(col) and (np.any(np.abs(col) >= 2.0 ** b) or (not s and np.any(col < 0))):
                raise ProtocolError(f"statistic {k} is out of the packable range (|v| < 2^{b}"
                                    f"{'' if s else ', v >= 0'}; got [{col.min():.3g}, {col.max():.3g}])")
            fixed.append(np.rint(col * 2.0 ** f).tolist())
        shifts = np.concatenate([[0], np.cumsum(self.widths)[:-1]]).astype(int).tolist()
        return [sum(int(x) << sh for x, sh in zip(row, shifts)) for row in zip(*fixed)]

    def decode(self, values: list[int], n_slots: int = 1, n_sums: int | None = None) -> np.ndarray:
        """Float sums (n, n_values) of packed sums; ``values`` may hold ``n_slots`` sums each.  Anything
        outside the agreed layout is refused."""
        out = []
        slot_bits = self.slot_bits
        bound = 1 << (slot_bits * n_slots)
        slot_mask, slot_half = (1 << slot_bits) - 1, 1 << (slot_bits - 1)
        # per field: its bits, its mask, the half of its range (0: unsigned) and its scale
        fields = [(w, (1 << w) - 1, (1 << (w - 1)) if s else 0, 2.0 ** -f)
                  for w, f, s in zip(self.widths, self.frac_bits, self.signed)]
        for v in values:
            v = int(v)
            if not -bound < v < bound:
                raise ProtocolError("a decrypted value lies outside the range the protocol allows; refusing it")
            for _ in range(n_slots):
                slot = ((v + slot_half) & slot_mask) - slot_half   # _signed_low(v, slot_bits)
                v = (v - slot) >> slot_bits
                row = []
                for w, mask, half, scale in fields:
                    field = ((slot + half) & mask) - half           # signed: _signed_low; unsigned: the low bits
                    slot = (slot - field) >> w
                    row.append(field * scale)
                if slot != 0:
                    raise ProtocolError("a decrypted sum does not fit the agreed statistics layout; refusing it")
                out.append(row)
            if v != 0:
                raise ProtocolError("a decrypted value carries more slots than agreed; refusing it")
        arr = np.asarray(out, dtype=np.float64).reshape(-1, self.n_values)
        return arr if n_sums is None else arr[:n_sums]


def _signed_low(v: int, bits: int) -> int:
    half = 1 << (bits - 1)
    return ((v + half) & ((1 << bits) - 1)) - half
