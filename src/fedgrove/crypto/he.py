"""Additively homomorphic encryption behind one small interface.

Backends:

* ``heu`` — SecretFlow's HEU (package ``sf-heu``), multi-threaded C++:
  Okamoto–Uchiyama (``ou``, default, as SecretFlow uses) and Paillier
  (``paillier``); 2048-bit keys by default, 3072 selectable.
* ``gmpy2`` — Okamoto–Uchiyama written here on gmpy2 (:mod:`fedgrove.crypto.ou`):
  the default wherever HEU is not installed (CPython 3.12+, other platforms).
* ``phe`` — python-paillier with gmpy2, the pure-Python reference used to
  cross-check HEU, and Paillier wherever HEU is not installed.

An :class:`HEContext` holds a public key and, for the key holder, the secret
key.  Ciphertext vectors are opaque :class:`Ciphertexts`; they serialise to
bytes for the wire.  Plaintexts are Python ints (signed).
"""

from __future__ import annotations

import itertools
import numbers
import os
import sys
import threading
import warnings
import weakref
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from fedgrove.exceptions import InvalidParameterError, ProtocolError

SCHEMES = ("ou", "paillier")
KEY_BITS = (2048, 3072)


_NO_HEU = "sf-heu is not installed (it ships wheels for CPython 3.11 on Linux x86-64 only)"


def _heu_available() -> bool:
    try:
        import heu  # noqa: F401
    except ImportError:
        return False
    return True


def available_backends() -> list[str]:
    return (["heu"] if _heu_available() else []) + ["gmpy2", "phe"]


@dataclass
class Ciphertexts:
    backend: str
    data: object   # backend-specific vector
    size: int
    #: slot width W -> this vector times 2^W, 2^2W, ... (made by :meth:`HEContext.compressed_sums`, kept for its
    #: next call on the same vector: a tree's gradients serve every layer's histograms)
    shifted: dict = field(default_factory=dict, repr=False, compare=False)


class HEContext(ABC):
    scheme: str
    key_bits: int
    backend: str
    #: whether an addition costs enough that summing rows with equal bins once pays for finding them
    #: (``encrypted_histograms``); not for plaintext integers
    costly_additions: bool = True

    @property
    @abstractmethod
    def has_secret(self) -> bool: ...

    @property
    @abstractmethod
    def plaintext_bits(self) -> int:
        """Largest |plaintext| is below 2**plaintext_bits."""

    @abstractmethod
    def encrypt(self, values: list[int]) -> Ciphertexts: ...

    @abstractmethod
    def select_sums(self, ct: Ciphertexts, groups: list[list[int]], for_key_holder: bool = False) -> Ciphertexts:
        """``[sum(ct[i] for i in g) for g in groups]``, every ``i`` one of ``ct``'s positions: an empty group
        sums to a fresh encryption of 0; with ``for_key_holder`` (sums only the key holder will see) to one
        shared encryption of 0, at no cost."""

    @abstractmethod
    def add(self, a: Ciphertexts, b: Ciphertexts) -> Ciphertexts: ...

    @abstractmethod
    def mul_scalar(self, ct: Ciphertexts, factors: list[int]) -> Ciphertexts: ...

    @abstractmethod
    def add_plain(self, ct: Ciphertexts, values: list[int]) -> Ciphertexts:
        """``ct[i] + values[i]`` (no fresh randomness: for noise the key holder must not separate out)."""

    def mul_const(self, ct: Ciphertexts, factor: int) -> Ciphertexts:
        """Every ciphertext times the same ``factor``."""
        return self.mul_scalar(ct, [factor] * ct.size)

    @abstractmethod
    def decrypt(self, ct: Ciphertexts) -> list[int]: ...

    @abstractmethod
    def serialize(self, ct: Ciphertexts) -> bytes: ...

    @abstractmethod
    def deserialize(self, data: bytes) -> Ciphertexts: ...

    @abstractmethod
    def public_bytes(self) -> bytes: ...

    def compress(self, ct: Ciphertexts, slot_bits: int, n_slots: int) -> Ciphertexts:
        """Fold groups of ``n_slots`` ciphertexts into one: ``c0 + c1*2^W + c2*2^2W ...``.

        Evaluated by Horner's rule from the highest slot down, so every scalar
        multiplication is by ``2^W`` (the cost of a modular exponentiation grows
        with the exponent's length).  For the key holder to decrypt: missing
        slots of the last group are a shared encryption of 0.
        """
        if n_slots <= 1 or ct.size <= 1:
            return ct
        n = ct.size
        n_out = (n + n_slots - 1) // n_slots
        top = min(n_slots, n) - 1
        acc = self.select_sums(ct, [[k * n_slots + top] if k * n_slots + top < n else [] for k in range(n_out)], True)
        for slot in range(top - 1, -1, -1):
            acc = self.mul_const(acc, 1 << slot_bits)
            nxt = self.select_sums(ct, [[k * n_slots + slot] if k * n_slots + slot < n else [] for k in range(n_out)],
                                   True)
            acc = self.add(acc, nxt)
        return acc

    def compressed_sums(self, ct: Ciphertexts, groups, slot_bits: int, n_slots: int) -> Ciphertexts:
        """``compress(select_sums(ct, groups, True), slot_bits, n_slots)``, the same plaintexts, by the cheaper
        of two orders, counted in multiplications by ``2^W`` (``W = slot_bits``; each is a modular
        exponentiation, worth about ``W`` ciphertext additions).

        Summing first and then compressing (Horner's rule) multiplies ``n_slots - 1`` sums of every output.
        Where ``ct`` holds fewer ciphertexts than there are outputs (small nodes, whose bins hold a row or two
        each: many sums over few rows), it costs less to multiply ``ct`` itself: copies of ``ct`` times
        ``2^W``, ``2^2W``, ... (each from the one before), after which position ``t`` of every output sums
        copy ``t`` and the outputs are added up, with no sum multiplied.  The copies stay with ``ct``
        (``ct.shifted``): the next call on it, a later layer of the same tree, pays nothing for them.
        """
        groups = IndexGroups.of(groups, ct.size)
        n = len(groups)
        top = min(n_slots, n) - 1  # multiplications per output by Horner's rule (none: nothing to fold)
        n_out = -(-n // n_slots)
        copies = ct.shifted.get(slot_bits, [])
        if top < 1 or (top - min(top, len(copies))) * ct.size >= top * n_out:
            return self.compress(self.select_sums(ct, groups, True), slot_bits, n_slots)
        copies = ct.shifted.setdefault(slot_bits, copies)
        while len(copies) < top:
            copies.append(self.mul_const(copies[-1] if copies else ct, 1 << slot_bits))
        out = None
        for t in range(top + 1):
            part = self.select_sums(ct if t == 0 else copies[t - 1], groups.every(n_slots, t, n_out), True)
            out = part if out is None else self.add(out, part)
        return out


# ------------------------------------------------------------------------------------- HEU
_HEU_POOL_LOCK = threading.Lock()
_heu_pool_started = False


HEU_THREADS_VARIABLE = "YACL_NUM_THREADS"  # HEU's pool size, read when the pool starts (default: every core)


def limit_heu_threads(n: int) -> int | None:
    """Have HEU's thread pool, which every HEU operation of this process shares, start with ``n`` threads;
    returns the pool's size where it is known (None: every core).  A value the user put in the environment
    (``YACL_NUM_THREADS``) is kept, and once the pool has started (the first HEU key) nothing changes.  gmpy2's
    OU decrypts on ``n`` threads from then on."""
    from fedgrove.crypto import ou

    ou.set_threads(n)  # gmpy2's OU decrypts on as many
    with _HEU_POOL_LOCK:
        if not _heu_pool_started and HEU_THREADS_VARIABLE not in os.environ:
            os.environ[HEU_THREADS_VARIABLE] = str(max(1, int(n)))
        value = os.environ.get(HEU_THREADS_VARIABLE, "")
        return int(value) if value.isdigit() else None


def _start_heu_pool(encrypt_two) -> None:
    """HEU's thread pool starts on the first batch operation of a process and announces it with a line on
    the process's standard output (its C++ logger: "[info] [thread_pool.cc:30] Create a fixed thread pool
    ..."), which is mixed into fedgrove's output and into anything piped from it.  Start the pool once here,
    with file descriptor 1 pointed at the null device for that one call."""
    global _heu_pool_started
    with _HEU_POOL_LOCK:
        if _heu_pool_started:
            return
        _heu_pool_started = True
        try:
            sys.stdout.flush()
            saved, null = os.dup(1), os.open(os.devnull, os.O_WRONLY)
        except (OSError, ValueError):  # no standard output to protect
            encrypt_two()
            return
        try:
            os.dup2(null, 1)
            encrypt_two()
        finally:
            os.dup2(saved, 1)
            os.close(saved)
            os.close(null)


class IndexGroups(Sequence):
    """Groups of ciphertext positions for ``select_sums`` as one flat array and each group's size: the form
    it works on, given so by a caller that has it (no Python list per group)."""

    def __init__(self, flat, sizes):
        self.flat = np.asarray(flat, dtype=np.int64)
        self.sizes = np.asarray(sizes, dtype=np.int64)
        if self.sizes.ndim != 1 or self.flat.ndim != 1 or int(self.sizes.sum()) != len(self.flat) \
                or np.any(self.sizes < 0):
            raise ProtocolError(f"index groups: sizes summing to {int(self.sizes.sum())} for "
                                f"{len(self.flat)} positions")
        self.starts = np.cumsum(self.sizes) - self.sizes

    @classmethod
    def of(cls, groups, n: int) -> IndexGroups:
        """``groups`` (these, or sequences of positions) as IndexGroups, every position one of ``n``."""
        if not isinstance(groups, cls):
            if not isinstance(groups, (list, tuple)):
                groups = list(groups)
            sizes = np.fromiter(map(len, groups), dtype=np.int64, count=len(groups))
            groups = cls(np.fromiter(itertools.chain.from_iterable(groups), dtype=np.int64,
                                     count=int(sizes.sum())), sizes)
        bad = (groups.flat < 0) | (groups.flat >= n)
        if bad.any():
            raise ProtocolError(f"select sums name ciphertext {int(groups.flat[bad][0])} of an array of {n}")
        return groups

    def __len__(self):
        return len(self.sizes)

    def __getitem__(self, k):
        start = int(self.starts[k])
        return self.flat[start:start + int(self.sizes[k])]

    def every(self, step: int, first: int, count: int) -> IndexGroups:
        """Groups ``first``, ``first + step``, ... of these, as ``count`` groups (empty ones after the last)."""
        picked = np.arange(first, len(self.sizes), step)[:count]
        own = self.sizes[picked]
        # position i of the result, in picked group k, is flat[starts[k] + i - (where group k begins in the result)]
        begins = np.cumsum(own) - own
        flat = self.flat[np.arange(int(own.sum()), dtype=np.int64) + np.repeat(self.starts[picked] - begins, own)]
        sizes = np.zeros(count, dtype=np.int64)
        sizes[:len(picked)] = own
        return IndexGroups(flat, sizes)

    def lists(self) -> list[list[int]]:
        """Each group as a list, and int objects, of its own (tolist makes one per position)."""
        items = self.flat.tolist()
        return [items[a:a + n] for a, n in zip(self.starts.tolist(), self.sizes.tolist())]


class HEUContext(HEContext):
    backend = "heu"

    def __init__(self, scheme: str, key_bits: int, kit=None, public_key=None):
        from heu import numpy as hnp
        from heu import phe

        self._phe, self._hnp = phe, hnp
        self.scheme, self.key_bits = scheme, key_bits
        schema = phe.SchemaType.OU if scheme == "ou" else phe.SchemaType.ZPaillier
        if kit is None and public_key is None:
            kit = hnp.setup(schema, key_bits)
        self._kit = kit if kit is not None else hnp.setup(public_key)
        self._secret = kit is not None
        # held for as long as this context lives: the entry of :data:`_HEU_PUBLIC_KEYS` lasts as long
        self._public_key = public_key if public_key is not None else _shared_heu_public_key(self._kit.public_key())
        self._encoder = phe.BigintEncoder(schema)
        self._enc = self._kit.encryptor()
        self._ev = self._kit.evaluator()
        self._dec = self._kit.decryptor() if self._secret else None
        self._bound_bits = int(self._kit.public_key().plaintext_bound()).bit_length() - 1 \
            if hasattr(self._kit.public_key().plaintext_bound(), "__int__") else None
        _start_heu_pool(lambda: self._enc.encrypt(self._array([0, 0])))

    @property
    def has_secret(self):
        return self._secret

    @property
    def plaintext_bits(self):
        if self._bound_bits is not None:
            return self._bound_bits
        return 680 if self.scheme == "ou" else self.key_bits - 2

    def _array(self, values):
        return self._hnp.array(np.array(values, dtype=object).reshape(-1, 1), self._encoder)

    def encrypt(self, values):
        return Ciphertexts("heu", self._enc.encrypt(self._array(values)), len(values))

    # HEU 0.5 crashes the process (a segmentation fault) on some operations with an empty ciphertext array
    # (serialize, multiply, select sums): those are answered here without calling it
    def select_sums(self, ct, groups, for_key_holder=False):
        groups = IndexGroups.of(groups, ct.size)
        n_groups = len(groups)
        if ct.size == 0 or n_groups == 0:
            return self.encrypt([0] * n_groups)
        # an empty group sums a placeholder (ciphertext 0), overwritten below: HEU's own sum of an empty group
        # is c - c, one fixed ciphertext under a key whatever c, which shows anyone holding the key that it is 0
        empty = np.flatnonzero(groups.sizes == 0)
        if empty.size:
            groups = IndexGroups(np.insert(groups.flat, groups.starts[empty], 0), np.maximum(groups.sizes, 1))
        if groups.sizes.max() == 1:  # one ciphertext a group: a gather, in this thread
            out = ct.data[groups.flat.tolist()]
        else:
            # HEU's batch_select_sum reads each group's list on the worker threads of its pool, which do not
            # hold the interpreter lock: a list or an int object in two groups has its reference count raced
            # by two threads, and a lost update frees it while in use (memory corrupted, a segmentation fault
            # later, in unrelated code).  Every group gets a list and int objects of its own (CPython's cached
            # small ints, -5 to 256, are shared but their counts cannot reach zero: immortal from 3.12,
            # counted from 999,999,999 in 3.11).
            out = self._ev.batch_select_sum(ct.data, groups.lists())
        if empty.size:
            if for_key_holder:  # one encryption of 0, made by subtraction
                first = out[int(empty[0]):int(empty[0]) + 1]
                zero = self._ev.sub(first, first)[0]
                zeros = itertools.repeat(zero)
            else:
                fresh = self.encrypt([0] * empty.size).data
                zeros = (fresh[k] for k in range(empty.size))
            for i, z in zip(empty.tolist(), zeros):
                out[i] = z
        return Ciphertexts("heu", out, n_groups)

    def add(self, a, b):
        return Ciphertexts("heu", self._ev.add(a.data, b.data), a.size)

    def mul_scalar(self, ct, factors):
        if ct.size == 0:
            return ct
        return Ciphertexts("heu", self._ev.mul(ct.data, self._array(factors)), ct.size)

    def add_plain(self, ct, values):
        if ct.size == 0:
            return ct
        return Ciphertexts("heu", self._ev.add(ct.data, self._array(values)), ct.size)

    def mul_const(self, ct, factor):
        if ct.size == 0:
            return ct
        # HEU broadcasts a 1x1 plaintext array: no per-ciphertext Python big integers to encode
        return Ciphertexts("heu", self._ev.mul(ct.data, self._array([factor])), ct.size)

    def decrypt(self, ct):
        if not self._secret:
            raise ProtocolError("this party holds no secret key")
        return [int(v) for v in self._dec.decrypt(ct.data).to_numpy(self._encoder).ravel()]

    def serialize(self, ct):
        return b"" if ct.size == 0 else bytes(ct.data.serialize())  # HEU's form of any array is never empty

    def deserialize(self, data):
        if len(data) == 0:
            return self.encrypt([])
        try:
            arr = self._hnp.CiphertextArray.load_from(data)
        except Exception as exc:  # HEU raises its own runtime errors on bad bytes
            raise ProtocolError(f"malformed ciphertext block: {exc}") from None
        return Ciphertexts("heu", arr, int(arr.shape[0]) if arr.ndim else 1)

    def public_bytes(self):
        return _key_header("heu", self.scheme, self.key_bits) + bytes(self._kit.public_key().serialize())


# ------------------------------------------------------------------------------------- phe
class PheContext(HEContext):
    """python-paillier with raw ciphertext arithmetic (gmpy2 when installed)."""

    backend = "phe"

    def __init__(self, scheme: str, key_bits: int, keypair=None, public_key=None):
        from phe import paillier

        if scheme != "paillier":
            raise InvalidParameterError("the phe backend implements Paillier only; use scheme='paillier' or "
                                        "install sf-heu for Okamoto-Uchiyama")
        self.scheme, self.key_bits = scheme, key_bits
        if keypair is None and public_key is None:
            keypair = paillier.generate_paillier_keypair(n_length=key_bits)
        self._pk = keypair[0] if keypair is not None else public_key
        self._sk = keypair[1] if keypair is not None else None
        self._n = self._pk.n
        self._nsq = self._pk.nsquare
        try:
            import gmpy2

            self._mpz = gmpy2.mpz
        except ImportError:  # pragma: no cover - gmpy2 is a dependency of the crypto extra
            self._mpz = int

    @property
    def has_secret(self):
        return self._sk is not None

    @property
    def plaintext_bits(self):
        return self._n.bit_length() - 2

    def encrypt(self, values):
        n = self._n
        return Ciphertexts("phe", [self._mpz(self._pk.raw_encrypt(int(v) % n)) for v in values], len(values))

    def select_sums(self, ct, groups, for_key_holder=False):
        nsq, data, out = self._nsq, ct.data, []
        for g in IndexGroups.of(groups, ct.size).lists():
            if g:
                acc = data[g[0]]
                for i in g[1:]:
                    acc = acc * data[i] % nsq
            else:  # the key holder's: the trivial encryption of 0; anyone else's: a fresh one
                acc = self._mpz(1) if for_key_holder else self._mpz(self._pk.raw_encrypt(0))
            out.append(acc)
        return Ciphertexts("phe", out, len(out))

    def add(self, a, b):
        nsq = self._nsq
        return Ciphertexts("phe", [x * y % nsq for x, y in zip(a.data, b.data)], a.size)

    def mul_scalar(self, ct, factors):
        nsq, n = self._nsq, self._n
        return Ciphertexts("phe", [pow(c, int(f) % n, nsq) for c, f in zip(ct.data, factors)], ct.size)

    def add_plain(self, ct, values):
        nsq, n = self._nsq, self._n  # g = n + 1: Enc(m) without randomness is 1 + m n
        return Ciphertexts("phe", [c * ((1 + (int(v) % n) * n) % nsq) % nsq for c, v in zip(ct.data, values)],
                           ct.size)

    def decrypt(self, ct):
        if self._sk is None:
            raise ProtocolError("this party holds no secret key")
        n, half = self._n, self._n // 2
        out = []
        for c in ct.data:
            m = self._sk.raw_decrypt(int(c))
            out.append(m - n if m > half else m)
        return out

    def serialize(self, ct):
        width = (self._nsq.bit_length() + 7) // 8
        return b"".join(int(c).to_bytes(width, "big") for c in ct.data)

    def deserialize(self, data):
        width = (self._nsq.bit_length() + 7) // 8
        if len(data) % width:
            raise ProtocolError(f"malformed ciphertext block: {len(data)} bytes is not a multiple of {width}")
        vals = [self._mpz(int.from_bytes(data[i:i + width], "big")) for i in range(0, len(data), width)]
        if any(v >= self._nsq for v in vals):
            raise ProtocolError("malformed ciphertext block: value outside Z_{n^2}")
        return Ciphertexts("phe", vals, len(vals))

    def public_bytes(self):
        return _key_header("phe", self.scheme, self.key_bits) + int(self._n).to_bytes((self._n.bit_length() + 7) // 8,
                                                                                      "big")


# ------------------------------------------------------------------------------------- gmpy2 (OU)
class OUContext(HEContext):
    """Okamoto-Uchiyama on gmpy2 (:mod:`fedgrove.crypto.ou`): the default where HEU is not installed.

    Ciphertexts are integers modulo ``n`` (one key length of bytes each, as HEU's OU); the key holder encrypts
    by the CRT.  An empty group's sum for the key holder is the trivial encryption of 0 (1), as python-paillier's.
    """

    backend = "gmpy2"

    def __init__(self, key_bits: int, public=None, secret=None):
        import gmpy2

        from fedgrove.crypto import ou

        self._mpz, self._powmod = gmpy2.mpz, gmpy2.powmod
        self.scheme, self.key_bits = "ou", key_bits
        if public is None and secret is None:
            public, secret = ou.generate(key_bits)
        self._pk = secret.public if secret is not None else public
        self._sk = secret
        self._n = self._pk.n
        self._width = (key_bits + 7) // 8

    @property
    def has_secret(self):
        return self._sk is not None

    @property
    def plaintext_bits(self):
        return self._pk.plaintext_bits

    def _plaintexts(self, values) -> list[int]:
        try:
            return self._pk.check_plaintexts(values)
        except ValueError as exc:
            raise ProtocolError(f"cannot encrypt: {exc}") from None

    def encrypt(self, values):
        values = self._plaintexts(values)
        data = self._sk.encrypt(values) if self._sk is not None else self._pk.encrypt(values)
        return Ciphertexts("gmpy2", data, len(data))

    def select_sums(self, ct, groups, for_key_holder=False):
        n, data, out, fresh = self._n, ct.data, [], []
        for g in IndexGroups.of(groups, ct.size).lists():
            if g:
                acc = data[g[0]]
                for i in g[1:]:
                    acc = acc * data[i] % n
            else:  # the key holder's: the trivial encryption of 0; anyone else's: a fresh one (below)
                acc = self._mpz(1)
                if not for_key_holder:
                    fresh.append(len(out))
            out.append(acc)
        for i, z in zip(fresh, self.encrypt([0] * len(fresh)).data):
            out[i] = z
        return Ciphertexts("gmpy2", out, len(out))

    def add(self, a, b):
        n = self._n
        return Ciphertexts("gmpy2", [x * y % n for x, y in zip(a.data, b.data)], a.size)

    def mul_scalar(self, ct, factors):
        n, powmod = self._n, self._powmod  # a negative factor raises the inverse (every ciphertext is a unit)
        return Ciphertexts("gmpy2", [powmod(c, int(f), n) for c, f in zip(ct.data, factors)], ct.size)

    def mul_const(self, ct, factor):
        n, f, powmod = self._n, int(factor), self._powmod
        return Ciphertexts("gmpy2", [powmod(c, f, n) for c in ct.data], ct.size)

    def add_plain(self, ct, values):
        n, pk = self._n, self._pk
        return Ciphertexts("gmpy2", [c * pk.g_pow(v) % n for c, v in zip(ct.data, self._plaintexts(values))],
                           ct.size)

    def decrypt(self, ct):
        if self._sk is None:
            raise ProtocolError("this party holds no secret key")
        return self._sk.decrypt(ct.data)

    def serialize(self, ct):
        width = self._width
        return b"".join(int(c).to_bytes(width, "big") for c in ct.data)

    def deserialize(self, data):
        width, n, mpz = self._width, self._n, self._mpz
        if len(data) % width:
            raise ProtocolError(f"malformed ciphertext block: {len(data)} bytes is not a multiple of {width}")
        vals = [mpz(int.from_bytes(data[i:i + width], "big")) for i in range(0, len(data), width)]
        if any(not 0 < v < n for v in vals):
            raise ProtocolError("malformed ciphertext block: value outside Z_n")
        return Ciphertexts("gmpy2", vals, len(vals))

    def public_bytes(self):
        pk, width = self._pk, self._width
        return _key_header("gmpy2", "ou", self.key_bits) + b"".join(int(v).to_bytes(width, "big")
                                                                     for v in (pk.n, pk.g, pk.h))


class PlainContext(HEContext):
    """No encryption at all: plaintext integers through the same interface.

    For benchmarks (the protocol's cost without cryptography) and tests only;
    it protects nothing.  ``keygen`` returns it only for ``backend="plain"``.
    """

    backend = "plain"
    costly_additions = False

    def __init__(self, scheme: str = "plain", key_bits: int = 0):
        self.scheme, self.key_bits = scheme, key_bits

    @property
    def has_secret(self):
        return True

    @property
    def plaintext_bits(self):
        return 2046

    def encrypt(self, values):
        return Ciphertexts("plain", [int(v) for v in values], len(values))

    def select_sums(self, ct, groups, for_key_holder=False):
        data = ct.data
        sums = [sum(data[i] for i in g) for g in IndexGroups.of(groups, ct.size).lists()]
        return Ciphertexts("plain", sums, len(sums))

    def add(self, a, b):
        return Ciphertexts("plain", [x + y for x, y in zip(a.data, b.data)], a.size)

    def mul_scalar(self, ct, factors):
        return Ciphertexts("plain", [x * int(f) for x, f in zip(ct.data, factors)], ct.size)

    def add_plain(self, ct, values):
        return Ciphertexts("plain", [x + int(v) for x, v in zip(ct.data, values)], ct.size)

    def decrypt(self, ct):
        return list(ct.data)

    def serialize(self, ct):
        width = 257
        return b"".join(int(v).to_bytes(width, "big", signed=True) for v in ct.data)

    def deserialize(self, data):
        width = 257
        if len(data) % width:
            raise ProtocolError("malformed plaintext block")
        return Ciphertexts("plain", [int.from_bytes(data[i:i + width], "big", signed=True)
                                     for i in range(0, len(data), width)], len(data) // width)

    def public_bytes(self):
        return _key_header("plain", "ou", 2048)


def keygen(scheme: str = "ou", key_bits: int = 2048, backend: str | None = None) -> HEContext:
    """A new key pair.  ``backend=None`` picks HEU when installed, else gmpy2 for OU and python-paillier for
    Paillier."""
    if scheme not in SCHEMES:
        raise InvalidParameterError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
    if isinstance(key_bits, bool) or not isinstance(key_bits, numbers.Integral) or key_bits not in KEY_BITS:
        raise InvalidParameterError(f"key_bits must be one of {KEY_BITS}, got {key_bits!r}")  # 2048.0: HEU's error
    key_bits = int(key_bits)
    if backend is None:
        if _heu_available():
            backend = "heu"
        elif scheme == "ou":
            backend = "gmpy2"
            _note_no_heu()
        else:
            warnings.warn(f"{_NO_HEU}: this key is python-paillier's Paillier", RuntimeWarning, stacklevel=2)
            backend = "phe"
    if backend == "heu":
        if not _heu_available():
            instead = "'gmpy2' (fedgrove's own OU)" if scheme == "ou" else "'phe' (python-paillier)"
            raise InvalidParameterError(f"backend 'heu' asked for, but {_NO_HEU}: leave the backend unset "
                                        f"([he] backend in a config) or use {instead}")
        return HEUContext(scheme, key_bits)
    if backend == "phe":
        return PheContext(scheme, key_bits)
    if backend == "gmpy2":
        if scheme != "ou":
            raise InvalidParameterError("the gmpy2 backend implements Okamoto-Uchiyama only; use scheme='ou', or "
                                        "backend 'phe' (or 'heu') for Paillier")
        return OUContext(key_bits)
    if backend == "plain":
        return PlainContext()
    raise InvalidParameterError(f"backend must be 'heu', 'gmpy2', 'phe' or 'plain' (no encryption), got {backend!r}")


_no_heu_noted = False


def _note_no_heu() -> None:
    """Once a process: OU keys come from fedgrove's own gmpy2 code, a little slower than HEU's."""
    global _no_heu_noted
    if not _no_heu_noted:
        _no_heu_noted = True
        from fedgrove.log import logger

        logger.info("%s: Okamoto-Uchiyama keys use fedgrove's gmpy2 implementation (its encrypted protocols took "
                    "1.1-1.2x HEU's time in fedgrove's benchmarks)", _NO_HEU)


# HEU's public keys in this process, by their bytes, for as long as a context holds them.  HEU builds tables
# when it loads a key (an OU-2048 key: 0.26-0.39 s, holding the interpreter's lock, and 45-48 MB; Paillier-2048
# 0.57 s and 16-20 MB; on the 2-CPU development machine): the parties of one process (an in-process federation)
# that are sent the same key share one, and a key holder's own key is there from its creation.  A party in a
# process of its own loads its key once.
_HEU_PUBLIC_KEYS: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_HEU_PUBLIC_KEYS_LOCK = threading.Lock()


def _load_heu_public_key(key: bytes):
    """HEU's public key of bytes ``key``: the one in this process, or loaded (and kept while in use)."""
    from heu import phe

    with _HEU_PUBLIC_KEYS_LOCK:  # (held while loading: a second party sent the key waits, then shares it)
        pk = _HEU_PUBLIC_KEYS.get(key)
        if pk is None:
            try:
                pk = phe.PublicKey.load_from(key)
            except Exception as exc:  # HEU raises its own runtime errors on bad bytes
                raise ProtocolError(f"malformed public key: {exc}") from None
            _HEU_PUBLIC_KEYS[key] = pk
        return pk


def _shared_heu_public_key(pk):
    """A key holder's public key ``pk``, entered as the one of its bytes (another of the same bytes stays)."""
    with _HEU_PUBLIC_KEYS_LOCK:
        return _HEU_PUBLIC_KEYS.setdefault(bytes(pk.serialize()), pk)


def _key_header(kind: str, scheme: str, key_bits: int) -> bytes:
    return f"{kind}|{scheme}|{key_bits}|".encode()


def public_context(data: bytes) -> HEContext:
    """The encrypting side of a key holder's context, from :meth:`HEContext.public_bytes`.

    The format is a short text header and the key's own serialisation (never
    pickle: the bytes come from another party)."""
    try:
        kind, scheme, bits, key = bytes(data).split(b"|", 3)
        kind, scheme, key_bits = kind.decode(), scheme.decode(), int(bits)
    except (ValueError, UnicodeDecodeError):
        raise ProtocolError("malformed public key") from None
    if scheme not in SCHEMES or key_bits not in KEY_BITS:
        raise ProtocolError(f"public key of unsupported scheme {scheme!r} / {key_bits} bits")
    if kind == "heu":
        if not _heu_available():
            instead = '[he] backend = "gmpy2"' if scheme == "ou" else '[he] backend = "phe"'
            raise ProtocolError(f"the key holder encrypts with HEU ({scheme}), which this party lacks ({_NO_HEU}): "
                                f"run this party on CPython 3.11, or give the key holder's config {instead}, "
                                f"which every party has")
        return HEUContext(scheme, key_bits, public_key=_load_heu_public_key(key))
    if kind == "plain":
        return PlainContext()
    if kind == "gmpy2":
        from fedgrove.crypto import ou

        width = (key_bits + 7) // 8
        if scheme != "ou" or len(key) != 3 * width:
            raise ProtocolError(f"malformed public key: {len(key)} bytes for a {key_bits}-bit OU key (n, G, H)")
        n, g, h = (int.from_bytes(key[i * width:(i + 1) * width], "big") for i in range(3))
        if n.bit_length() != key_bits or not (1 < g < n and 1 < h < n):
            raise ProtocolError(f"malformed public key: not a {key_bits}-bit OU key")
        return OUContext(key_bits, public=ou.PublicKey(n, g, h, key_bits))
    if kind == "phe":
        from phe import paillier

        n = int.from_bytes(key, "big")
        if n.bit_length() < key_bits - 8:
            raise ProtocolError("malformed public key: modulus too short")
        return PheContext(scheme, key_bits, public_key=paillier.PaillierPublicKey(n))
    raise ProtocolError(f"unknown public key kind {kind!r}")
