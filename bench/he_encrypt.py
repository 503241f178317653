"""Where 2048-bit encryption time goes: HEU OU by plaintext length, HEU Paillier, and a key-holder (CRT) estimate.

Answers two questions the vertical benchmark raises (issue 3):

* HEU's Okamoto-Uchiyama encryption slows with the plaintext's length
  (``g^m`` with an ``m``-bit exponent): rates for 32,561 values (a9a's
  training rows) of 8 to 200 bits and at the length of the packed (g, h)
  pairs the vertical protocol encrypts for a9a (53 fractional bits, headroom
  for sums of all 32,561 rows: ``packer_for``).
* Paillier: HEU encrypts with ``h_s^r mod n^2`` for a random 1,024-bit ``r``
  and a fixed-base table (10-bit windows).  The key holder, knowing ``p`` and
  ``q``, could do that work modulo ``p^2`` and ``q^2`` and join the halves by
  the CRT.  This script times that in Python with gmpy2 (one core, same
  exponent length and windows, own throw-away 2048-bit key, every result
  checked by decryption) against HEU's Paillier on the same machine, and
  prints the ratio.  fedgrove does not ship it (see the README).

Writes bench/results/he_encrypt.json.

    python bench/he_encrypt.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import secrets
import time
from pathlib import Path

import numpy as np

from fedgrove.crypto.he import available_backends, keygen
from fedgrove.crypto.packing import GHPacker
from fedgrove.experiments.report import machine, write_json

RESULTS = Path(__file__).resolve().parent / "results" / "he_encrypt.json"
N_ROWS = 32561          # a9a's training rows: one encryption each per tree
EXP_BITS, WINDOW = 1024, 10  # HEU's Paillier: key_size / 2 exponent bits, 10-bit fixed-base windows


def _median_rate(fn, n: int, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return n / float(np.median(times))


def ou_by_length(repeats: int, packed_bits: int) -> dict:
    he = keygen("ou", 2048, "heu")
    rng = np.random.default_rng(0)
    out = {}
    for bits in sorted({8, 60, 100, packed_bits, 150, 200}):
        values = [int.from_bytes(rng.bytes(32), "little") >> (256 - bits) for _ in range(N_ROWS)]
        out[str(bits)] = _median_rate(lambda v=values: he.encrypt(v), N_ROWS, repeats)
    return out


def packed_length() -> int:
    """Bits of the packed (g, h) plaintexts the vertical protocol encrypts for logistic loss on N_ROWS rows
    (the layout ``packer_for`` gives the key holder)."""
    from fedgrove.protocols.vertical.active import packer_for

    rng = np.random.default_rng(1)
    p = 1 / (1 + np.exp(-rng.normal(size=N_ROWS)))
    y = rng.integers(0, 2, N_ROWS)
    packer = packer_for("binary", y.astype(float))
    return max(int(v).bit_length() for v in packer.encode(p - y, p * (1 - p)))


class CRTEncryptor:
    """Paillier encryption by the key holder: (1 + m n) * h_s^r, with h_s^r computed mod p^2 and q^2."""

    def __init__(self, bits: int = 2048):
        import gmpy2

        self.gmpy2 = gmpy2
        half = bits // 2
        while True:
            p = gmpy2.next_prime(gmpy2.mpz(secrets.randbits(half)) | (gmpy2.mpz(3) << (half - 2)))
            q = gmpy2.next_prime(gmpy2.mpz(secrets.randbits(half)) | (gmpy2.mpz(3) << (half - 2)))
            if p != q and (p * q).bit_length() == bits:
                break
        self.p, self.q, self.n = p, q, p * q
        self.nn, self.pp, self.qq = self.n * self.n, p * p, q * q
        h = gmpy2.mpz(secrets.randbelow(int(self.n)))
        self.hs = gmpy2.powmod(h, self.n, self.nn)
        self.q2_inv = gmpy2.invert(self.qq, self.pp)  # CRT: x = xq + qq * ((xp - xq) * qq^-1 mod pp)
        self.tables = [self._table(self.hs % m, m) for m in (self.pp, self.qq)]
        self.lam = (p - 1) * (q - 1)
        self.mu = gmpy2.invert(self.lam, self.n)

    @staticmethod
    def _table(base, mod):
        rows = []
        for _ in range(-(-EXP_BITS // WINDOW)):
            row, acc = [1] * (1 << WINDOW), 1
            for j in range(1, 1 << WINDOW):
                acc = acc * base % mod
                row[j] = acc
            rows.append(row)
            base = acc * base % mod
        return rows

    def _pow(self, table, r: int, mod):
        acc, mask = 1, (1 << WINDOW) - 1
        for i, row in enumerate(table):
            d = (r >> (i * WINDOW)) & mask
            if d:
                acc = acc * row[d] % mod
        return acc

    def encrypt(self, m: int):
        r = secrets.randbits(EXP_BITS) | (1 << (EXP_BITS - 1))
        xp, xq = self._pow(self.tables[0], r, self.pp), self._pow(self.tables[1], r, self.qq)
        rn = xq + self.qq * ((xp - xq) * self.q2_inv % self.pp)
        return (1 + m * self.n) * rn % self.nn

    def decrypt(self, c) -> int:
        u = self.gmpy2.powmod(c, self.lam, self.nn)
        return int((u - 1) // self.n * self.mu % self.n)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--crt-values", type=int, default=2000)
    args = ap.parse_args()
    if "heu" not in available_backends():
        raise SystemExit("this benchmark compares against HEU: pip install sf-heu (CPython 3.11)")
    res = {"machine": machine(), "rows": N_ROWS, "repeats": args.repeats}
    res["packed_gh_bits"] = packed_length()
    res["ou_encrypt_per_s_by_plaintext_bits"] = ou_by_length(args.repeats, res["packed_gh_bits"])
    print("HEU OU encryptions/s by plaintext bits:",
          {k: round(v) for k, v in res["ou_encrypt_per_s_by_plaintext_bits"].items()},
          f"(our packed pairs: {res['packed_gh_bits']} bits)", flush=True)

    values = GHPacker().encode(np.full(args.crt_values, -0.5), np.full(args.crt_values, 0.25))
    heu = keygen("paillier", 2048, "heu")
    heu_rate = _median_rate(lambda: heu.encrypt(values), len(values), args.repeats)
    crt = CRTEncryptor()
    rates = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        cts = [crt.encrypt(v) for v in values]
        rates.append(len(values) / (time.perf_counter() - t0))
    if any(crt.decrypt(c) != v % int(crt.n) for c, v in zip(cts[:50], values[:50])):
        raise SystemExit("CRT encryption does not decrypt to its plaintext")
    crt_rate = float(np.median(rates))
    res["paillier"] = {"heu_encrypt_per_s_all_cores": heu_rate, "crt_gmpy2_encrypt_per_s_one_core": crt_rate,
                       "ratio_crt_one_core_to_heu": crt_rate / heu_rate,
                       "seconds_per_tree_heu": N_ROWS / heu_rate,
                       "exponent_bits": EXP_BITS, "window_bits": WINDOW}
    print(f"Paillier-2048 encryptions/s: HEU {heu_rate:.0f} (all cores), key-holder CRT in gmpy2 {crt_rate:.0f} "
          f"(one core): {crt_rate / heu_rate:.2f}x; HEU takes {N_ROWS / heu_rate:.1f} s for a tree's {N_ROWS} "
          f"pairs, CRT {N_ROWS / crt_rate:.1f} s on one core")
    write_json(RESULTS, res)
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
