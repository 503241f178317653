"""Okamoto-Uchiyama encryption on gmpy2: fedgrove's default scheme where SecretFlow's HEU is not installed.

HEU publishes wheels for CPython 3.11 on Linux x86-64 only; elsewhere (3.12,
3.13, other platforms) no maintained library offers Okamoto-Uchiyama, and
python-paillier's Paillier encrypts about 300x slower than HEU's OU.  This
module is the scheme itself on gmpy2's integers, built as HEU builds its keys
(the first two points), with the differences the rest names:

* Okamoto and Uchiyama (Eurocrypt 1998): ``n = p^2 q``; the plaintexts are
  ``Z_p``; ``Enc(m) = G^m H^r mod n``; decryption through the subgroup of
  ``Z_{p^2}^*`` of order ``p``, where the logarithm ``L(x) = (x - 1) / p`` is
  linear.
* Coron, Naccache and Paillier's acceleration: ``p - 1 = t u`` with a prime
  ``t`` of 224 bits (2048-bit keys; 256 for 3072), ``G = g^u``,
  ``H = g'^(n u)``, so that decryption raises to ``t`` rather than ``p - 1``
  (``H^t = 1`` modulo ``p^2``).

HEU draws short exponents ``r`` (110 bits for 2048-bit keys); here ``r`` is
uniform modulo the order of ``H`` (up to 2^-128 from it, for the public
side, which does not know that order).  ``q = 2 q' + 1`` is a safe prime and
``H`` has order ``q'`` modulo ``q``, so there its powers are the squares.  The
key holder, knowing ``p`` and ``q``, encrypts modulo ``p^2`` and modulo ``q``
and joins the halves (CRT), drawing the same distribution as ``G^m H^r`` for a
uniform ``r``: modulo ``p^2``, ``G`` is ``w (1 + k p)`` with ``w`` in ``H``'s
subgroup of prime order ``t``, so ``G^m H^r = (1 + m k p) H^r'`` with ``r'``
uniform modulo ``t`` (no power of ``G``); modulo ``q`` a uniform square (the
square of a uniform unit).  Everyone else encrypts modulo ``n``.  Fixed bases
(``G``, ``G^-1``, ``H`` and their residues) are raised by tables of
``base^(j 2^(8i))``: one modular multiplication per non-zero byte of the
exponent.  Randomness comes from :mod:`secrets`.

Plaintexts are signed integers of absolute value below ``2^(|p| - 2)``
(681 bits for 2048-bit keys, as HEU's ``plaintext_bound``).
"""

from __future__ import annotations

import secrets
import threading
from concurrent.futures import ThreadPoolExecutor

import gmpy2
from gmpy2 import mpz

#: bits of the prime factor t of p - 1 per key size (HEU's, after NIST's 112- and 128-bit levels)
FACTOR_BITS = {2048: 224, 3072: 256}
STATISTICAL_BITS = 128  # the public side's r is this many bits longer than the order of H can be
PRIME_ROUNDS = 50       # Miller-Rabin rounds of gmpy2.is_prime for every prime of a key
WINDOW_BITS = 8
THREADED_DECRYPTION = 256  # ciphertexts from which decryption is shared among threads
_threads: int | None = None  # decryption's threads (None: the cores this process may use, at most 8)


def set_threads(n: int) -> None:
    """Decrypt on ``n`` threads (gmpy2 raises a list of ciphertexts without the interpreter lock)."""
    global _threads
    _threads = max(1, int(n))


def decryption_threads() -> int:
    if _threads is not None:
        return _threads
    from fedgrove._cores import available_cores

    return min(8, available_cores())


def p_bits(key_bits: int) -> int:
    return (key_bits + 2) // 3


def plaintext_bits(key_bits: int) -> int:
    """|plaintext| < 2^plaintext_bits for a key of ``key_bits``: below p/2, p having exactly p_bits bits."""
    return p_bits(key_bits) - 2


def public_r_bits(key_bits: int) -> int:
    """The length of the public side's r: ord(H) divides t (q - 1) < 2^(|t| + |q|), where q < 2^key_bits / p^2
    has at most key_bits - 2 (p_bits - 1) bits."""
    return FACTOR_BITS[key_bits] + (key_bits - 2 * p_bits(key_bits) + 2) + STATISTICAL_BITS


class FixedBase:
    """``base^e mod modulus`` for many exponents ``e >= 0``: row ``i`` of the table holds ``base^(j 2^(8i))``
    for ``j`` in 0..255, built as far as the longest exponent asked for so far (under a lock: parties of one
    process may share a key)."""

    def __init__(self, base, modulus):
        self.modulus = mpz(modulus)
        self._next = mpz(base) % self.modulus  # base^(2^(8 len(rows)))
        self.rows: list[list] = []
        self._lock = threading.Lock()

    def _extend(self, n_rows: int) -> None:
        with self._lock:
            mod = self.modulus
            while len(self.rows) < n_rows:
                b, x, row = self._next, mpz(1), [mpz(1)]
                for _ in range((1 << WINDOW_BITS) - 1):
                    x = x * b % mod
                    row.append(x)
                self.rows.append(row)
                self._next = x * b % mod

    def pow(self, e: int):
        e = int(e)
        n_bytes = (e.bit_length() + 7) // 8
        if n_bytes > len(self.rows):
            self._extend(n_bytes)
        mod, acc = self.modulus, mpz(1)
        for row, byte in zip(self.rows, e.to_bytes(n_bytes, "little")):
            if byte:
                acc = acc * row[byte] % mod
        return acc


class _Signed:
    """``G^m`` for signed ``m`` modulo one modulus: a table for ``G`` and one for ``G^-1``."""

    def __init__(self, g, modulus):
        self.pos = FixedBase(g, modulus)
        self.neg = FixedBase(gmpy2.invert(mpz(g), mpz(modulus)), modulus)

    def pow(self, m: int):
        return self.pos.pow(m) if m >= 0 else self.neg.pow(-m)


class PublicKey:
    """``n = p^2 q``, ``G`` and ``H``; encrypts modulo ``n``."""

    def __init__(self, n, g, h, key_bits: int):
        self.n, self.g, self.h, self.key_bits = mpz(n), mpz(g), mpz(h), int(key_bits)
        self.plaintext_bits = plaintext_bits(self.key_bits)
        self._tables = None
        self._tables_lock = threading.Lock()

    def _fixed(self):
        with self._tables_lock:
            if self._tables is None:
                self._tables = (_Signed(self.g, self.n), FixedBase(self.h, self.n))
            return self._tables

    def g_pow(self, m: int):
        """``G^m mod n`` (``m`` signed): the encryption of ``m`` without randomness."""
        return self._fixed()[0].pow(m)

    def encrypt(self, values) -> list:
        gm, hr = self._fixed()
        n, bits = self.n, public_r_bits(self.key_bits)
        return [gm.pow(int(v)) * hr.pow(secrets.randbits(bits)) % n for v in values]

    def check_plaintexts(self, values) -> list[int]:
        values = [int(v) for v in values]
        bound = 1 << self.plaintext_bits
        for v in values:
            if not -bound < v < bound:
                raise ValueError(f"plaintext of {v.bit_length()} bits beyond the key's {self.plaintext_bits}")
        return values


class SecretKey:
    """``p``, ``q``, ``t`` and the decryption constant; encrypts by the CRT and decrypts.

    ``t`` is the decryption exponent: any multiple of the order of ``H`` modulo ``p^2`` with ``G^t`` not 1
    there (this module's keys: the prime factor of ``p - 1``; ``p - 1`` serves any Okamoto-Uchiyama key, HEU's
    among them)."""

    def __init__(self, public: PublicKey, p, q, t):
        self.public = public
        self.p, self.q, self.t = mpz(p), mpz(q), mpz(t)
        self.p2 = self.p * self.p
        if self.p2 * self.q != public.n:
            raise ValueError("p^2 q is not the public key's n")
        gt = gmpy2.powmod(public.g % self.p2, self.t, self.p2)
        if gt == 1:
            raise ValueError("G^t is 1 modulo p^2: not an Okamoto-Uchiyama key")
        self.l_inv = gmpy2.invert((gt - 1) // self.p, self.p)
        self.q_inv = gmpy2.invert(self.q, self.p2)  # joining the halves
        self.q1 = self.q - 1
        self.half = self.p // 2
        # this module's keys: q = 2 q' + 1 with q' prime, and H of order q' modulo q, so that H's powers there are
        # the squares modulo q, and a uniform one is the square of a uniform unit (one multiplication)
        h_q = public.h % self.q
        self.squares = self.q1 % 2 == 0 and gmpy2.is_prime(self.q1 // 2, PRIME_ROUNDS) and h_q != 1 \
            and gmpy2.powmod(h_q, self.q1 // 2, self.q) == 1
        # this module's keys (G = g^u, u even): G modulo p^2 has order dividing p t, so it is w (1 + k p) with w in
        # H's subgroup of prime order t there, and G modulo q is a square.  Then G^m H^r = (1 + m k p) H^(r + e m)
        # modulo p^2 (w = H^e), whose exponent r + e m is uniform when r is, and G^m H^r is a uniform square modulo
        # q: the key holder encrypts with one fixed-base power of H, one multiplication and a squaring, the same
        # distribution as G^m H^r.  Other keys (HEU's) take the general way.
        g_p, h_p = public.g % self.p2, public.h % self.p2
        self.linear = self.squares and h_p != 1 and gmpy2.powmod(h_p, self.t, self.p2) == 1 \
            and gmpy2.powmod(g_p, self.p * self.t, self.p2) == 1 \
            and gmpy2.powmod(public.g % self.q, self.q1 // 2, self.q) == 1
        self.k = (gt - 1) // self.p * gmpy2.invert(self.t, self.p) % self.p  # G^t = 1 + t k p modulo p^2
        self._tables = None
        self._tables_lock = threading.Lock()

    def _fixed(self):
        with self._tables_lock:
            if self._tables is None:
                pk = self.public
                h_q = None if self.squares else FixedBase(pk.h % self.q, self.q)
                self._tables = (_Signed(pk.g % self.p2, self.p2), FixedBase(pk.h % self.p2, self.p2),
                                _Signed(pk.g % self.q, self.q), h_q)
            return self._tables

    def encrypt(self, values) -> list:
        """``G^m H^r mod n`` computed modulo ``p^2`` (``H`` of order dividing ``t`` there) and modulo ``q``
        (order dividing ``q - 1``): with ``r`` uniform modulo the order of ``H``, its residues modulo the two
        orders are uniform and independent, so each part is drawn on its own: ``H^(r mod t)`` modulo ``p^2``,
        and modulo ``q`` the square of a uniform unit (this module's keys) or ``H^(r mod (q - 1))``.  This
        module's keys skip ``G^m`` too (``self.linear``: see ``__init__``): about 4x faster for plaintexts of
        hundreds of bits, as packed gradients are."""
        gp, hp, gq, hq = self._fixed()
        p, p2, q, t, q1, q_inv = self.p, self.p2, self.q, self.t, self.q1, self.q_inv
        out = []
        if self.linear:  # see __init__: (1 + m k p) H^r' modulo p^2, a uniform square modulo q
            k, randbelow = self.k, secrets.randbelow
            for v in values:
                cp = (1 + int(v) * k % p * p) * hp.pow(randbelow(t)) % p2
                x = mpz(1 + randbelow(q1))
                cq = x * x % q
                out.append(cq + q * ((cp - cq) * q_inv % p2))
            return out
        for v in values:
            m = int(v)
            cp = gp.pow(m) * hp.pow(secrets.randbelow(t)) % p2
            if hq is None:
                x = mpz(1 + secrets.randbelow(q1))
                cq = gq.pow(m) * x % q * x % q
            else:
                cq = gq.pow(m) * hq.pow(secrets.randbelow(q1)) % q
            out.append(cq + q * ((cp - cq) * q_inv % p2))
        return out

    def decrypt(self, ciphertexts) -> list[int]:
        """Signed plaintexts: ``L(c^t mod p^2) / L(G^t mod p^2) mod p``, above ``p / 2`` read as negative."""
        p, p2, t, l_inv, half = self.p, self.p2, self.t, self.l_inv, self.half
        reduced = [c % p2 for c in ciphertexts]
        # gmpy2 raises a list in C without the interpreter lock: other threads run meanwhile, and a long list is
        # cut into one piece a thread
        k = decryption_threads() if len(reduced) >= THREADED_DECRYPTION else 1
        if k > 1:
            step = -(-len(reduced) // k)
            with ThreadPoolExecutor(k, thread_name_prefix="fedgrove-ou") as pool:
                pieces = pool.map(lambda a: gmpy2.powmod_base_list(reduced[a:a + step], t, p2),
                                  range(0, len(reduced), step))
                powered = [x for piece in pieces for x in piece]
        else:
            powered = gmpy2.powmod_base_list(reduced, t, p2)
        out = []
        for x in powered:
            m = int((x - 1) // p * l_inv % p)
            out.append(m - int(p) if m > half else m)
        return out


def _random_prime(low: int, high: int, condition=None):
    """A uniformly drawn prime in [low, high] (and meeting ``condition``)."""
    while True:
        x = mpz(low + secrets.randbelow(high - low + 1)) | 1
        if x <= high and gmpy2.is_prime(x, PRIME_ROUNDS) and (condition is None or condition(x)):
            return x


_SMALL_PRIMES = mpz(1)
for _k in (5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71, 73, 79, 83, 89, 97):
    _SMALL_PRIMES *= _k


def _safe_prime(low: int, high: int):
    """A uniformly drawn prime ``q = 2 q' + 1`` in [low, high] with ``q'`` prime."""
    lo, hi = (low - 1) // 2, (high - 1) // 2
    while True:
        qp = mpz(lo + secrets.randbelow(hi - lo + 1))
        qp += (5 - qp % 6) % 6  # q' = 5 mod 6: odd, and 3 divides neither q' nor 2 q' + 1
        q = 2 * qp + 1
        if low <= q <= high and gmpy2.gcd(qp * q, _SMALL_PRIMES) == 1 and gmpy2.is_prime(qp, 1) \
                and gmpy2.is_prime(q, 1) and gmpy2.is_prime(qp, PRIME_ROUNDS) and gmpy2.is_prime(q, PRIME_ROUNDS):
            return q


def generate(key_bits: int) -> tuple[PublicKey, SecretKey]:
    """A new key pair whose ``n`` has exactly ``key_bits`` bits (2048 or 3072)."""
    pb, tb = p_bits(key_bits), FACTOR_BITS[key_bits]
    t = _random_prime(1 << (tb - 1), (1 << tb) - 1)
    # p = t u + 1 of exactly pb bits (u even)
    u_low, u_high = -(-(1 << (pb - 1)) // t), ((1 << pb) - 2) // t
    while True:
        u = mpz(u_low + secrets.randbelow(u_high - u_low + 1)) & ~mpz(1)
        p = t * u + 1
        if u >= u_low and p.bit_length() == pb and gmpy2.is_prime(p, PRIME_ROUNDS):
            break
    p2 = p * p
    # q: n = p^2 q of exactly key_bits bits, q = 2 q' + 1 with q' prime (so p and t, other primes, divide q - 1 = 2 q'
    # neither, as the scheme asks)
    q = _safe_prime(-(-(1 << (key_bits - 1)) // p2), ((1 << key_bits) - 1) // p2)
    n = p2 * q
    assert n.bit_length() == key_bits
    while True:  # g whose residue G^t = g^(p-1) modulo p^2 has order p
        g0 = mpz(2 + secrets.randbelow(int(n) - 3))
        if g0 % p and g0 % q and gmpy2.powmod(g0 % p2, p - 1, p2) != 1:
            break
    while True:  # H = g'^(n u) of order t modulo p^2 and q' modulo q (u is even: H is a square there, and not 1)
        g1 = mpz(2 + secrets.randbelow(int(n) - 3))
        h = gmpy2.powmod(g1, n * u, n)
        if g1 % p and g1 % q not in (0, 1, q - 1) and h % p2 != 1:
            break
    public = PublicKey(n, gmpy2.powmod(g0, u, n), h, key_bits)
    return public, SecretKey(public, p, q, t)
