"""Secure aggregation's fixed-point vectors: every value, of either sign and any size, encodes to its exact
fixed-point integer, and masked sums decode to the sum of those integers."""

from fractions import Fraction

import numpy as np
import pytest

from fedgrove.crypto.secagg import FixedPoint128, MaskingKeys, add128
from fedgrove.exceptions import ProtocolError

FRAC = 53


def _values(rng) -> np.ndarray:
    # every scale from 1e-20 to 1e6, both signs, and the values next to the words' boundaries
    scales = 10.0 ** rng.integers(-20, 7, 400)
    x = rng.normal(size=400) * scales
    edges = [0.0, -0.0, 1e-17, -1e-17, -1e-14, -2.0 ** -43, -2.0 ** -42, -2.0 ** -54, -1 / 3, -2.0 ** 10 - 0.3,
             -2.0 ** 11, 2.0 ** 11, -(2.0 ** 11) - 2.0 ** -40, 2.0 ** 70, -(2.0 ** 70), -(2.0 ** 72) + 2.0 ** 20]
    return np.concatenate([x, edges])


def _fixed(x: np.ndarray) -> list[int]:
    return [int(v) for v in np.rint(np.ldexp(x, FRAC)).tolist()]


def _as_int(hi: np.ndarray, lo: np.ndarray) -> list[int]:
    """The signed 128-bit integers the words hold."""
    out = []
    for h, low in zip(hi.tolist(), lo.tolist()):
        v = (int(h) << 64) | int(low)
        out.append(v - (1 << 128) if v >= 1 << 127 else v)
    return out


def test_every_value_encodes_to_its_fixed_point_integer_and_back(rng):
    codec = FixedPoint128(FRAC)
    x = _values(rng)
    hi, lo = codec.encode(x)
    assert _as_int(hi, lo) == _fixed(x)
    # the fixed-point value is a float (an integer times a power of two): it decodes exactly
    np.testing.assert_array_equal(codec.decode(hi, lo), np.ldexp(np.rint(np.ldexp(x, FRAC)), -FRAC))


def test_tiny_negative_values_keep_their_size():
    # 2**64 - 1 is no float64: splitting the words with floats turned -1e-14 into -2048
    codec = FixedPoint128(FRAC)
    for v in (-1e-14, -1e-17, -2.0 ** -44):
        assert abs(codec.decode(*codec.encode(np.array([v])))[0] - v) <= 2.0 ** -54


def test_masked_sums_decode_to_the_sum_of_the_fixed_point_integers(rng):
    codec = FixedPoint128(FRAC)
    names = ["a", "b", "c"]
    keys = {n: MaskingKeys(n) for n in names}
    public = {n: k.public_bytes() for n, k in keys.items()}
    for k in keys.values():
        k.agree(public, b"session")
    vectors = {n: _values(rng) for n in names}
    total_hi = np.zeros(len(vectors["a"]), dtype=np.uint64)
    total_lo = np.zeros_like(total_hi)
    for n in names:
        hi, lo = codec.encode(vectors[n])
        m_hi, m_lo = keys[n].mask128("tree=0/layer=1", len(hi))
        hi, lo = add128(hi, lo, m_hi, m_lo)
        alone = codec.decode(hi, lo)
        assert np.median(np.abs(alone)) > 1e6  # one party's masked vector is noise
        total_hi, total_lo = add128(total_hi, total_lo, hi, lo)
    exact = [sum(t) for t in zip(*(_fixed(vectors[n]) for n in names))]
    assert _as_int(total_hi, total_lo) == exact
    expected = np.array([float(Fraction(v, 2 ** FRAC)) for v in exact])
    np.testing.assert_allclose(codec.decode(total_hi, total_lo), expected, rtol=2.0 ** -52, atol=0)


def test_values_beyond_the_words_are_refused():
    codec = FixedPoint128(FRAC)
    with pytest.raises(ProtocolError, match="too large"):
        codec.encode(np.array([2.0 ** 74]))
    with pytest.raises(ProtocolError, match="non-finite"):
        codec.encode(np.array([np.nan]))


def test_a_key_no_party_could_agree_with_is_refused_before_it_is_relayed():
    from fedgrove.crypto.secagg import check_public_key

    good = MaskingKeys("a").public_bytes()
    check_public_key("a", good)  # a real key passes
    for raw, error in ((bytes(32), "is not a usable X25519 key"), (bytes([1]) + bytes(31), "is not a usable"),
                       (good[:31], "must be 32 bytes, got 31")):  # 0 and 1 are low-order points
        with pytest.raises(ProtocolError, match=f"public masking key of b {error}"):
            check_public_key("b", raw)
        with pytest.raises(ProtocolError, match=f"public masking key of b {error}"):
            MaskingKeys("a").agree({"b": raw})
