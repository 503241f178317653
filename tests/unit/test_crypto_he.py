"""Homomorphic encryption backends and the packing codec."""

import os

import numpy as np
import pytest

from fedgrove.crypto.he import IndexGroups, available_backends, keygen, public_context
from fedgrove.crypto.packing import GHPacker
from fedgrove.exceptions import InvalidParameterError, ProtocolError

BACKENDS = [(b, s) for b, s in (("heu", "ou"), ("heu", "paillier"), ("gmpy2", "ou"), ("phe", "paillier"))
            if b in available_backends()]


@pytest.fixture(scope="module", params=BACKENDS, ids=[f"{b}-{s}" for b, s in BACKENDS])
def ctx(request):
    backend, scheme = request.param
    return keygen(scheme, 2048, backend)


def test_packed_sums_decode_exactly_to_fixed_point_sums(ctx, rng):
    packer = GHPacker()
    g = rng.normal(size=300) * 3
    h = rng.random(300)
    pub = public_context(ctx.public_bytes())
    assert not pub.has_secret
    ct = pub.encrypt(packer.encode(g, h))
    groups = [list(range(0, 300, 3)), [], list(range(300)), [7]]
    sums = pub.select_sums(ct, groups)
    got = packer.decode(ctx.decrypt(ctx.deserialize(pub.serialize(sums))))
    scale = 2.0 ** packer.frac_bits
    for k, grp in enumerate(groups):  # exact integer sums, then one rounding to float
        gi = int(sum(int(v) for v in packer.encode_fixed(g[grp]))) if grp else 0
        hi = int(sum(int(v) for v in packer.encode_fixed(h[grp]))) if grp else 0
        assert got[k, 0] == gi / scale and got[k, 1] == hi / scale
        np.testing.assert_allclose(got[k], [g[grp].sum(), h[grp].sum()] if grp else [0, 0], rtol=1e-12, atol=1e-12)


def test_compressed_sums_decode_like_uncompressed(ctx, rng):
    packer = GHPacker()
    g, h = rng.normal(size=40), rng.random(40)
    ct = ctx.encrypt(packer.encode(g, h))
    groups = [[i, (i + 1) % 40] for i in range(11)]
    sums = ctx.select_sums(ct, groups)
    slots = packer.slots_per_plaintext(ctx.plaintext_bits)
    assert slots >= 3
    comp = ctx.compress(sums, packer.slot_bits, slots)
    assert comp.size == -(-11 // slots)
    np.testing.assert_array_equal(packer.decode(ctx.decrypt(comp), n_slots=slots, n_sums=11),
                                  packer.decode(ctx.decrypt(sums)))


class _Counting:
    """A context whose multiplications by a constant are counted (each is a modular exponentiation)."""

    def __init__(self, he):
        self.he, self.multiplied = he, 0

    def __getattr__(self, name):
        return getattr(self.he, name)

    def mul_const(self, ct, factor):
        self.multiplied += ct.size
        return self.he.mul_const(ct, factor)

    def compressed_sums(self, ct, groups, slot_bits, n_slots):  # the base class's, calling this mul_const
        return type(self.he).compressed_sums(self, ct, groups, slot_bits, n_slots)

    def compress(self, ct, slot_bits, n_slots):
        return type(self.he).compress(self, ct, slot_bits, n_slots)


@pytest.mark.parametrize("n_rows, n_groups", [(6, 40), (40, 6), (40, 40), (1, 9), (9, 1)])
def test_compressed_sums_either_order_gives_compress_of_the_sums(ctx, rng, n_rows, n_groups):
    # few rows and many sums: the rows are multiplied (once, kept for the next call on them); many rows and few
    # sums: the sums are (Horner's rule); the same plaintexts, empty groups and a short last output included
    packer = GHPacker()
    slots = packer.slots_per_plaintext(ctx.plaintext_bits)
    counting = _Counting(ctx)
    ct = ctx.encrypt(packer.encode(rng.normal(size=n_rows), rng.random(n_rows)))
    groups = [sorted(rng.choice(n_rows, int(rng.integers(0, min(n_rows, 4) + 1)), replace=False).tolist())
              for _ in range(n_groups)]
    groups[0] = []
    want = ctx.decrypt(ctx.compress(ctx.select_sums(ct, groups, True), packer.slot_bits, slots))
    got = counting.compressed_sums(ct, groups, packer.slot_bits, slots)
    assert got.size == -(-n_groups // slots)
    assert ctx.decrypt(got) == want
    top, n_out = min(slots, n_groups) - 1, -(-n_groups // slots)
    rows_first = top * n_rows < top * n_out
    assert counting.multiplied == top * (n_rows if rows_first else n_out)
    assert len(ct.shifted.get(packer.slot_bits, [])) == (top if rows_first else 0)
    again = counting.compressed_sums(ct, groups[::-1], packer.slot_bits, slots)  # a later layer: other sums
    assert ctx.decrypt(again) == ctx.decrypt(ctx.compress(ctx.select_sums(ct, groups[::-1], True),
                                                          packer.slot_bits, slots))
    assert counting.multiplied == top * (n_rows if rows_first else 2 * n_out)  # the kept copies cost nothing
    np.testing.assert_array_equal(packer.decode(ctx.decrypt(got), n_slots=slots, n_sums=n_groups),
                                  packer.decode(ctx.decrypt(ctx.select_sums(ct, groups, True))))


def test_index_groups_every_picks_every_step_th_group_and_pads_with_empty_ones():
    g = IndexGroups.of([[1], [], [2, 3], [4], [5, 6, 7]], 8)
    assert [x.tolist() for x in g.every(2, 0, 3)] == [[1], [2, 3], [5, 6, 7]]
    assert [x.tolist() for x in g.every(2, 1, 3)] == [[], [4], []]
    assert [x.tolist() for x in g.every(3, 2, 2)] == [[2, 3], []]


def test_key_holder_rejects_values_outside_the_expected_range(ctx):
    packer = GHPacker()
    forged = ctx.encrypt([1 << (packer.slot_bits + 5)])
    with pytest.raises(ProtocolError, match="outside the range"):
        packer.decode(ctx.decrypt(forged))
    negative_h = ctx.encrypt([-(1 << packer.shift)])
    with pytest.raises(ProtocolError, match="hessian"):
        packer.decode(ctx.decrypt(negative_h))


def test_pair_sums_are_refused_exactly_at_the_edges_of_their_layout():
    # a slot is a signed 2S + 1-bit integer holding a signed S-bit G sum and an H sum in [0, 2^(S-1)); each edge
    # by hand, one past it refused (the decoder binds these bounds once per reply)
    packer = GHPacker(frac_bits=2, value_bits=1, count_bits=1)
    s, scale = packer.shift, 2.0 ** -packer.frac_bits
    assert s == 5
    for g in (-(1 << (s - 1)), -1, 0, 1, (1 << (s - 1)) - 1):
        for h in (0, 1, (1 << (s - 1)) - 1):
            assert packer.pair_sum(g + (h << s)) == (g * scale, h * scale)
    for g in (-(1 << (s - 1)), (1 << (s - 1)) - 1):
        with pytest.raises(ProtocolError, match="hessian"):
            packer.pair_sum(g + (-1 << s))
    # above the slot: H = 2^(S-1) still fits 2S + 1 bits but not the hessian's range, 2^S not the slot
    with pytest.raises(ProtocolError, match="hessian"):
        packer.pair_sum(1 << (2 * s - 1))
    for slot in (1 << (2 * s), -(1 << (2 * s)) - 1):
        with pytest.raises(ProtocolError, match="outside the range"):
            packer.pair_sum(slot)
    # and through decode: three slots a value, the middle one's H negative
    w = packer.slot_bits
    good = [3 + (2 << s), -4 + (1 << s), 0]
    value = sum(x << (i * w) for i, x in enumerate(good))
    np.testing.assert_array_equal(packer.decode([value], n_slots=3), [[0.75, 0.5], [-1.0, 0.25], [0.0, 0.0]])
    bad = sum(x << (i * w) for i, x in enumerate([good[0], 1 + (-1 << s), 0]))
    with pytest.raises(ProtocolError, match="hessian"):
        packer.decode([bad], n_slots=3)
    # inside the range of one slot's value, but -1 and a carry: a slot more than agreed
    with pytest.raises(ProtocolError, match="more slots than agreed"):
        packer.decode([(1 << w) - 1])


def test_malformed_bytes_are_protocol_errors(ctx):
    with pytest.raises(ProtocolError):
        ctx.deserialize(b"\x01\x02garbage")
    with pytest.raises(ProtocolError):
        public_context(b"not a key")


def test_gradients_beyond_the_packable_range_are_refused():
    with pytest.raises(ProtocolError, match="packable range"):
        GHPacker().encode(np.array([1e6]), np.array([0.1]))
    with pytest.raises(ProtocolError, match="finite"):
        GHPacker().encode(np.array([np.nan]), np.array([0.1]))


def test_heu_and_phe_agree():
    # the reference backend cross-checks the fast one on the same plaintexts
    if "heu" not in available_backends():
        pytest.skip("sf-heu not installed")
    packer = GHPacker()
    r = np.random.default_rng(5)
    g, h = r.normal(size=64), r.random(64)
    groups = [list(range(k, 64, 5)) for k in range(5)]
    out = []
    for backend in ("heu", "phe"):
        c = keygen("paillier", 2048, backend)
        out.append(packer.decode(c.decrypt(c.select_sums(c.encrypt(packer.encode(g, h)), groups))))
    np.testing.assert_array_equal(out[0], out[1])


def test_bad_parameters():
    with pytest.raises(InvalidParameterError, match="scheme"):
        keygen("rsa")
    with pytest.raises(InvalidParameterError, match="key_bits"):
        keygen("ou", 1024)
    with pytest.raises(InvalidParameterError, match=r"key_bits must be one of \(2048, 3072\), got 2048.0"):
        keygen("ou", 2048.0, "phe")  # equal to 2048, it passed, then HEU refused the float with a TypeError
    with pytest.raises(InvalidParameterError, match="Paillier only"):
        keygen("ou", 2048, "phe")
    with pytest.raises(InvalidParameterError, match="Okamoto-Uchiyama only"):
        keygen("paillier", 2048, "gmpy2")


def test_without_heu_an_ou_key_is_gmpy2s_and_a_paillier_key_python_pailliers(monkeypatch, caplog):
    # what keygen gives on a Python without sf-heu's wheels (3.12, 3.13), simulated on this one
    import fedgrove.crypto.he as he

    monkeypatch.setattr(he, "_heu_available", lambda: False)
    monkeypatch.setattr(he, "_no_heu_noted", False)
    with caplog.at_level("INFO", logger="fedgrove"):
        c = he.keygen("ou", 2048)
        he.keygen("ou", 2048)
    assert (c.backend, c.scheme, c.key_bits) == ("gmpy2", "ou", 2048)
    assert c.decrypt(c.encrypt([3, 0, -12345])) == [3, 0, -12345]
    notes = [r.getMessage() for r in caplog.records if "gmpy2 implementation" in r.getMessage()]
    assert len(notes) == 1 and "sf-heu is not installed" in notes[0]  # once a process
    with pytest.warns(RuntimeWarning, match="this key is python-paillier's Paillier"):
        c = he.keygen("paillier", 2048)
    assert (c.backend, c.scheme) == ("phe", "paillier")
    # asking for HEU by name where it is missing names the cause and what to use instead (it raised
    # ModuleNotFoundError from inside HEUContext)
    with pytest.raises(InvalidParameterError, match=r"backend 'heu' asked for, but sf-heu is not installed .* "
                                                    r"use 'gmpy2' \(fedgrove's own OU\)"):
        he.keygen("ou", 2048, "heu")
    with pytest.raises(InvalidParameterError, match=r"backend 'heu' .* use 'phe' \(python-paillier\)"):
        he.keygen("paillier", 3072, "heu")


def test_a_party_without_heu_given_an_heu_key_says_what_to_change(monkeypatch):
    # a federation whose key holder runs on CPython 3.11 (HEU) and another party on 3.12 (no HEU)
    import fedgrove.crypto.he as he

    if "heu" not in available_backends():
        pytest.skip("sf-heu not installed")
    key = keygen("ou", 2048, "heu").public_bytes()
    paillier = keygen("paillier", 2048, "heu").public_bytes()
    monkeypatch.setattr(he, "_heu_available", lambda: False)
    with pytest.raises(ProtocolError, match=r"encrypts with HEU \(ou\), which this party lacks .*backend = \"gmpy2\""):
        public_context(key)
    with pytest.raises(ProtocolError, match=r"HEU \(paillier\).*backend = \"phe\""):
        public_context(paillier)


def test_vector_packer_sums_decode_exactly_compressed_or_not(ctx, rng):
    # (w, w*y, w*y^2) as Federated Forest packs them: integer counts, a signed and an unsigned fixed-point field
    # with a negative number of fractional bits (a grid coarser than 1)
    from fedgrove.crypto.packing import VectorPacker

    packer = VectorPacker((0, 20, -4), (12, 40, 60), (False, True, False))
    w = rng.integers(0, 4, 200).astype(float)
    y = rng.normal(size=200) * 1e4
    vals = np.column_stack([w, np.rint(w * y * 2 ** 20) / 2 ** 20, np.rint(w * y * y / 16) * 16])
    ct = ctx.encrypt(packer.encode(vals))
    groups = [list(range(0, 200, 2)), [], list(range(200)), [5]]
    sums = ctx.select_sums(ct, groups)
    slots = packer.slots_per_plaintext(ctx.plaintext_bits)
    expect = np.array([vals[g].sum(axis=0) if g else np.zeros(3) for g in groups])
    np.testing.assert_array_equal(packer.decode(ctx.decrypt(sums)), expect)  # grid values: float sums are exact
    comp = ctx.compress(sums, packer.slot_bits, slots)
    np.testing.assert_array_equal(packer.decode(ctx.decrypt(comp), n_slots=slots, n_sums=4), expect)


def test_vector_packer_refuses_what_does_not_fit_its_layout(ctx):
    from fedgrove.crypto.packing import VectorPacker

    packer = VectorPacker((0, 0), (8, 8), (False, False))
    with pytest.raises(ProtocolError, match="out of the packable range"):
        packer.encode(np.array([[300.0, 1.0]]))
    with pytest.raises(ProtocolError, match="out of the packable range"):
        packer.encode(np.array([[-1.0, 1.0]]))
    with pytest.raises(ProtocolError, match="does not fit"):  # a value spilling past the last field
        packer.decode(ctx.decrypt(ctx.encrypt([1 << 16])))
    with pytest.raises(ProtocolError, match="need .*-bit plaintexts"):
        VectorPacker((0,) * 40, (20,) * 40, (False,) * 40).slots_per_plaintext(683)


def test_mul_const_multiplies_every_ciphertext_by_one_factor(ctx):
    values = [-5, 0, 3, 1 << 40, -(1 << 60)]
    ct = ctx.encrypt(values)
    assert ctx.decrypt(ctx.mul_const(ct, 1 << 170)) == [v << 170 for v in values]
    assert ctx.decrypt(ctx.mul_const(ct, 3)) == ctx.decrypt(ctx.mul_scalar(ct, [3] * len(values)))


def test_add_plain_and_shared_zeros_for_the_key_holder(ctx):
    values = [-5, 0, 3, 1 << 300, -(1 << 60)]
    ct = ctx.encrypt(values)
    assert ctx.decrypt(ctx.add_plain(ct, [7, -1, 0, 1 << 200, 5])) == [2, -1, 3, (1 << 300) + (1 << 200),
                                                                       -(1 << 60) + 5]
    groups = [[0, 2], [], [4], [], [1, 1, 3]]
    want = [-2, 0, -(1 << 60), 0, 1 << 300]
    assert ctx.decrypt(ctx.select_sums(ct, groups, for_key_holder=True)) == want
    assert ctx.decrypt(ctx.select_sums(ct, groups)) == want


EMPTY_OPS = """
import sys
from fedgrove.crypto.he import keygen, public_context
he = keygen(sys.argv[2], 2048, sys.argv[1])
ct = he.encrypt([])
other = public_context(he.public_bytes())
back = other.deserialize(he.serialize(ct))
assert back.size == 0 and he.decrypt(back) == []
for out in (he.mul_const(ct, 3), he.mul_scalar(ct, []), he.add_plain(ct, []), he.add(ct, ct), he.compress(ct, 64, 4)):
    assert out.size == 0 and he.decrypt(out) == []
assert he.decrypt(other.select_sums(ct, [[], []])) == [0, 0]
assert he.decrypt(he.select_sums(ct, [[]], for_key_holder=True)) == [0]
try:
    he.select_sums(ct, [[0]])
except Exception:  # an error, not a crash
    pass
else:
    raise AssertionError("a sum of a ciphertext an empty array lacks was taken")
print("ok")
"""


@pytest.mark.parametrize("backend,scheme", BACKENDS, ids=[f"{b}-{s}" for b, s in BACKENDS])
def test_empty_ciphertext_arrays_pass_every_operation(backend, scheme):
    # a HybridTree guest holding no training instance gets an empty block of gradients: HEU 0.5 ended the
    # process with a segmentation fault serialising it (or multiplying it); run apart so a crash is a failure
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", EMPTY_OPS, backend, scheme], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), (done.returncode, done.stderr[-2000:])


SHARED_GROUPS = """
import sys
from fedgrove.crypto.he import keygen
he = keygen(sys.argv[2], 2048, sys.argv[1])
values = list(range(1000, 1600))
ct = he.encrypt(values)
shared = list(range(300, 320))  # one list object, its int objects above the small ints CPython caches
for _ in range(int(sys.argv[3])):
    sums = he.select_sums(ct, [shared] * 4000)
    assert he.decrypt(he.select_sums(sums, [[0], [1999], [3999]])) == [sum(values[300:320])] * 3
    churn = [k << 100 for k in range(20000)]  # allocations that meet memory a lost reference freed
print("ok")
"""


HEU_BACKENDS = [(b, s) for b, s in BACKENDS if b == "heu"]  # python-paillier sums in this thread


@pytest.mark.parametrize("backend,scheme", HEU_BACKENDS, ids=[f"{b}-{s}" for b, s in HEU_BACKENDS])
def test_groups_sharing_python_objects_are_summed_without_corrupting_memory(backend, scheme):
    # HEU's batch_select_sum reads the groups' lists on its own threads, without the interpreter lock: groups
    # that shared a list (or int objects) raced on its reference count and the process died later with a
    # segmentation fault (this test failed 3 runs of 3, for both schemes, on the 2-CPU machine before
    # select_sums gave each group objects of its own); run apart so a crash is a failure
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", SHARED_GROUPS, backend, scheme, "10"], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), (done.returncode, done.stderr[-2000:])


def test_empty_groups_sum_to_fresh_zeros_unless_for_the_key_holder(ctx):
    ct = ctx.encrypt([4, 5, 6])
    groups = [[], [1], [], [0, 2], []]
    fresh = ctx.select_sums(ct, groups)
    assert ctx.decrypt(fresh) == [0, 5, 0, 10, 0]
    blocks = [ctx.serialize(ctx.select_sums(ct, [[]])) for _ in range(2)]
    assert blocks[0] != blocks[1]  # HEU's own sum of an empty group is one fixed ciphertext under a key
    assert ctx.decrypt(ctx.select_sums(ct, groups, for_key_holder=True)) == [0, 5, 0, 10, 0]
    assert ctx.decrypt(ctx.select_sums(ct, [[2], [0], [2]])) == [6, 4, 6]  # one position a group: a gather
    for for_key_holder in (False, True):
        assert ctx.decrypt(ctx.select_sums(ct, [[], [1], []], for_key_holder)) == [0, 5, 0]


def test_index_groups_sum_as_the_same_groups_in_lists(ctx):
    ct = ctx.encrypt([4, 5, 6, 7])
    groups = [[0, 3], [], [2], [1, 1, 2], []]
    flat = IndexGroups(np.array([0, 3, 2, 1, 1, 2]), np.array([2, 0, 1, 3, 0]))
    assert [g.tolist() for g in flat] == groups
    for for_key_holder in (False, True):
        assert ctx.decrypt(ctx.select_sums(ct, flat, for_key_holder)) == [11, 0, 6, 16, 0]
    assert ctx.decrypt(ctx.select_sums(ct, IndexGroups([3, 0], [1, 1]))) == [7, 4]  # a gather
    with pytest.raises(ProtocolError, match="sizes summing to 3 for 2 positions"):
        IndexGroups([0, 1], [1, 2])


def test_select_sums_refuse_positions_outside_the_array(ctx):
    ct = ctx.encrypt([1, 2])
    for bad in (2, -1):
        with pytest.raises(ProtocolError, match=f"ciphertext {bad} of an array of 2"):
            ctx.select_sums(ct, [[0], [1, bad]])


HEU_THREADS = """
import os, sys
from fedgrove.crypto.he import keygen, limit_heu_threads
size = limit_heu_threads(int(sys.argv[1]))
he = keygen("ou", 2048, "heu")
he.select_sums(he.encrypt(list(range(600))), [list(range(600))] * 4)
print(size, len(os.listdir("/proc/self/task")), limit_heu_threads(5))
"""


@pytest.mark.skipif("heu" not in available_backends() or not os.path.isdir("/proc/self/task"),
                    reason="needs HEU and Linux's /proc")
def test_heu_pool_starts_with_the_threads_asked_for_unless_the_environment_says():
    # HEU's pool took every core whatever the party's n_threads; its threads are counted in /proc
    import subprocess
    import sys

    from fedgrove.crypto.he import HEU_THREADS_VARIABLE

    def run(limit, env=None):
        environ = {k: v for k, v in os.environ.items() if k != HEU_THREADS_VARIABLE}
        if env is not None:
            environ[HEU_THREADS_VARIABLE] = env
        done = subprocess.run([sys.executable, "-c", HEU_THREADS, str(limit)], capture_output=True, text=True,
                              timeout=120, env=environ)
        assert done.returncode == 0, done.stderr[-2000:]
        size, threads, later = map(int, done.stdout.split())
        return size, threads, later

    one, three, kept = run(1), run(3), run(3, env="2")
    assert (one[0], three[0], kept[0]) == (1, 3, 2)
    assert three[1] - one[1] == 2 and kept[1] - one[1] == 1  # the pool's threads
    assert (one[2], three[2], kept[2]) == (1, 3, 2)  # once started, a later limit changes nothing


def test_heu_prints_nothing_on_standard_output():
    """HEU's C++ logger announced its thread pool on stdout ("Create a fixed thread pool with size 1") in the
    middle of fedgrove's output; a process that encrypts with HEU now writes only what it prints itself."""
    import subprocess
    import sys

    if "heu" not in available_backends():
        pytest.skip("sf-heu not installed")
    code = ("from fedgrove.crypto.he import keygen\n"
            "c = keygen('ou', 2048, backend='heu')\n"
            "print('before')\n"
            "assert c.decrypt(c.encrypt(list(range(50)))) == list(range(50))\n"
            "print('after')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "before\nafter\n"
    assert "thread pool" not in done.stderr


HEU_SCHEMES = [s for b, s in BACKENDS if b == "heu"]


@pytest.mark.parametrize("scheme", HEU_SCHEMES)
def test_parties_of_one_process_share_a_loaded_heu_public_key_while_they_use_it(scheme):
    """HEU builds tables when it loads a public key (an OU-2048 key: about 0.35 s and 48 MB here): every party
    of an in-process federation that is sent the key uses the key holder's, and each still encrypts for it."""
    import gc
    import threading

    from fedgrove.crypto import he as he_module

    holder = keygen(scheme, 2048, "heu")
    sent = holder.public_bytes()
    key = sent.split(b"|", 3)[3]
    got = []
    threads = [threading.Thread(target=lambda out: out.append(public_context(sent)), args=(got,)) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 3 and all(c._public_key is holder._public_key for c in got)
    assert holder.decrypt(got[0].add(got[1].encrypt([5, -7]), got[2].encrypt([1, 2]))) == [6, -5]
    # a key loaded from bytes (its holder in another process) is loaded once and shared likewise
    public = he_module._HEU_PUBLIC_KEYS
    del got, threads
    public.pop(key)
    first, second = public_context(sent), public_context(sent)
    assert first._public_key is second._public_key and first._public_key is not holder._public_key
    assert holder.decrypt(second.encrypt([3])) == [3]
    # kept only while a context holds it: no table outlives the federations that used it
    del first, second, holder
    gc.collect()
    assert key not in public
    with pytest.raises(ProtocolError, match="malformed public key"):
        public_context(b"heu|" + scheme.encode() + b"|2048|" + b"\x00" * 40)
