"""The passive side's encrypted histograms and the key holder's decoding, against plain per-bin sums."""

import numpy as np
import pytest

from fedgrove.crypto.he import keygen
from fedgrove.crypto.packing import MASK_BITS, GHPacker, RowPacking
from fedgrove.engine.binning import BinMapper
from fedgrove.exceptions import ProtocolError
from fedgrove.protocols.vertical.active import _Remote, decode_histograms
from fedgrove.protocols.vertical.passive import encrypted_histograms


def _one_hot(rng, n):
    """Rows drawn from few patterns, as one-hot categorical data (a9a): many rows share all their bins."""
    cats = rng.integers(0, 4, (n, 3))
    X = np.column_stack([cats[:, j] == k for j in range(3) for k in range(4)] + [rng.integers(0, 2, n)])
    X = X.astype(float)
    X[rng.random(n) < 0.05, -1] = np.nan
    return X


@pytest.fixture(scope="module", params=["continuous", "one-hot"])
def setting(request):
    rng = np.random.default_rng(3)
    n = 700
    if request.param == "continuous":
        X = np.column_stack([rng.normal(size=n), rng.integers(0, 3, n).astype(float), rng.exponential(size=n)])
        X[rng.random(n) < 0.1, 0] = np.nan  # missing values: their own bin
    else:
        X = _one_hot(rng, n)
    bm = BinMapper(32).fit(X)
    Xb = bm.transform(X)
    g, h = rng.normal(size=n), rng.random(n)
    node_of = rng.integers(0, 5, n)
    rows = {k: np.nonzero(node_of == k)[0] for k in range(5)}
    return bm, Xb, g, h, rows


def _want(Xb, bm, rows, g, h, k, f):
    want = np.zeros((int(bm.n_value_bins[f]) + 1, 2))
    np.add.at(want, Xb[rows[k], f], np.column_stack([g[rows[k]], h[rows[k]]]))
    return want


def _reply(setting, nodes):
    bm, Xb, g, h, rows = setting
    he, packer = keygen("ou", 2048, "plain"), GHPacker()
    ct = he.encrypt(packer.encode(g, h))
    return he, packer, encrypted_histograms("p", nodes, rows, Xb, bm.feature_offsets, ct, he, packer)


def test_decoded_histograms_equal_plain_per_bin_sums_and_the_fullest_bin_is_left_out(setting):
    bm, Xb, g, h, rows = setting
    nodes = [3, 0, 4]
    he, packer, reply = _reply(setting, nodes)
    remote = _Remote("p", bm.n_value_bins, 0, 0)
    totals = np.array([[g[rows[k]].sum(), h[rows[k]].sum()] for k in nodes])
    hist = decode_histograms(reply, remote, totals, he, packer, "test")
    for j, k in enumerate(nodes):
        for f in range(Xb.shape[1]):
            codes = Xb[rows[k], f]
            nb = int(bm.n_value_bins[f]) + 1
            want = np.zeros((nb, 2))
            np.add.at(want, codes, np.column_stack([g[rows[k]], h[rows[k]]]))
            got = hist[j, remote.local_offsets[f]:remote.local_offsets[f + 1]]
            np.testing.assert_allclose(got, want, atol=1e-9)
            assert reply.skipped[j * Xb.shape[1] + f] == np.argmax(np.bincount(codes, minlength=nb))
    assert reply.n_sums == sum(len(np.unique(Xb[rows[k], f])) - 1 for k in nodes for f in range(Xb.shape[1]))


class _CountingPlain:
    """The plain test backend, counting the ciphertexts each stage of sums adds up (each ``select_sums`` call; the
    last stage's are summed inside ``compressed_sums``)."""

    costly_additions = True  # plan as for ciphertexts

    def __init__(self):
        self.he = keygen("ou", 2048, "plain")
        self.terms = []

    def __getattr__(self, name):
        return getattr(self.he, name)

    def select_sums(self, ct, groups, for_key_holder=False):
        self.terms.append(sum(len(g) for g in groups))
        return self.he.select_sums(ct, groups, for_key_holder)

    def compressed_sums(self, ct, groups, slot_bits, n_slots):
        self.terms.append(sum(len(g) for g in groups))
        return self.he.compressed_sums(ct, groups, slot_bits, n_slots)


def test_rows_sharing_every_bin_are_added_once():
    rng = np.random.default_rng(5)
    X = _one_hot(rng, 2000)
    bm = BinMapper(32).fit(X)
    Xb = bm.transform(X)
    g, h = rng.normal(size=len(X)), rng.random(len(X))
    rows = {0: np.arange(len(X))}
    he, packer = _CountingPlain(), GHPacker()
    reply = encrypted_histograms("p", [0], rows, Xb, bm.feature_offsets, he.encrypt(packer.encode(g, h)), he, packer)
    totals = np.array([[g.sum(), h.sum()]])
    hist = decode_histograms(reply, _Remote("p", bm.n_value_bins, 0, 0), totals, he.he, packer, "test")
    for f in range(Xb.shape[1]):
        want = np.zeros((int(bm.n_value_bins[f]) + 1, 2))
        np.add.at(want, Xb[:, f], np.column_stack([g, h]))
        np.testing.assert_allclose(hist[0, bm.feature_offsets[f]:bm.feature_offsets[f + 1]], want, atol=1e-9)
    skip = np.array([np.bincount(Xb[:, f]).argmax() for f in range(Xb.shape[1])])
    direct = int((Xb != skip).sum())  # what summing every listed row into its bins would add
    assert he.terms[0] == int((Xb != skip).any(axis=1).sum())  # first each row that is listed anywhere, once
    assert sum(he.terms) < 0.5 * direct  # all stages together (compression is not counted)


def test_distinct_rows_are_summed_straight_into_their_bins():
    rng = np.random.default_rng(8)
    X = rng.normal(size=(300, 3))
    bm = BinMapper(255).fit(X)
    Xb = bm.transform(X)
    assert len(np.unique(Xb, axis=0)) == len(Xb)  # no two rows share their bins
    g, h = rng.normal(size=len(X)), rng.random(len(X))
    he, packer = _CountingPlain(), GHPacker()
    reply = encrypted_histograms("p", [0], {0: np.arange(len(X))}, Xb, bm.feature_offsets,
                                 he.encrypt(packer.encode(g, h)), he, packer)
    skip = np.array([np.bincount(Xb[:, f]).argmax() for f in range(Xb.shape[1])])
    assert he.terms == [int((Xb != skip).sum())]  # one stage: no copies of rows that gain nothing
    hist = decode_histograms(reply, _Remote("p", bm.n_value_bins, 0, 0), np.array([[g.sum(), h.sum()]]), he.he,
                             packer, "test")
    for f in range(Xb.shape[1]):
        want = np.zeros((int(bm.n_value_bins[f]) + 1, 2))
        np.add.at(want, Xb[:, f], np.column_stack([g, h]))
        np.testing.assert_allclose(hist[0, bm.feature_offsets[f]:bm.feature_offsets[f + 1]], want, atol=1e-9)


def test_small_nodes_are_summed_straight_without_a_search():
    # a node whose straight plan adds fewer ciphertexts than plan_min_additions skips the search (which costs
    # more than it can save there): one stage, each listed row into its bins; searched, the same node takes
    # fewer additions; the histograms are the same either way
    from fedgrove.protocols.vertical.passive import PLAN_MIN_ADDITIONS

    rng = np.random.default_rng(5)
    X = _one_hot(rng, 150)
    bm = BinMapper(32).fit(X)
    Xb = bm.transform(X)
    g, h = rng.normal(size=len(X)), rng.random(len(X))
    skip = np.array([np.bincount(Xb[:, f]).argmax() for f in range(Xb.shape[1])])
    listed = int((Xb != skip).sum())
    assert listed < PLAN_MIN_ADDITIONS
    replies, terms = [], []
    for threshold in (PLAN_MIN_ADDITIONS, 0):
        he, packer = _CountingPlain(), GHPacker()
        replies.append(encrypted_histograms("p", [0], {0: np.arange(len(X))}, Xb, bm.feature_offsets,
                                            he.encrypt(packer.encode(g, h)), he, packer,
                                            plan_min_additions=threshold))
        terms.append(he.terms)
    assert terms[0] == [listed]
    assert len(terms[1]) > 1 and sum(terms[1]) < listed
    hists = [decode_histograms(r, _Remote("p", bm.n_value_bins, 0, 0), np.array([[g.sum(), h.sum()]]), he.he,
                               packer, "test") for r in replies]
    np.testing.assert_array_equal(hists[0], hists[1])


def test_nodes_with_different_plans_in_one_request():
    """A node of distinct rows (summed straight, one stage) beside nodes of repeating rows (three stages): the
    finished sums are carried forward and every node's histograms come back in request order."""
    rng = np.random.default_rng(9)
    n = 900
    X = np.column_stack([_one_hot(rng, n), rng.normal(size=n)])
    node_of = np.repeat([0, 1, 2], n // 3)
    X[node_of != 1, -1] = 0.0  # nodes 0 and 2: rows repeat; node 1: every row distinct
    bm = BinMapper(255).fit(X)
    Xb = bm.transform(X)
    g, h = rng.normal(size=n), rng.random(n)
    rows = {k: np.nonzero(node_of == k)[0] for k in range(3)}
    he, packer = _CountingPlain(), GHPacker()
    nodes = [2, 1, 0]
    reply = encrypted_histograms("p", nodes, rows, Xb, bm.feature_offsets, he.encrypt(packer.encode(g, h)), he,
                                 packer)
    assert len(he.terms) == 3
    totals = np.array([[g[rows[k]].sum(), h[rows[k]].sum()] for k in nodes])
    hist = decode_histograms(reply, _Remote("p", bm.n_value_bins, 0, 0), totals, he.he, packer, "test")
    for j, k in enumerate(nodes):
        for f in range(Xb.shape[1]):
            want = np.zeros((int(bm.n_value_bins[f]) + 1, 2))
            np.add.at(want, Xb[rows[k], f], np.column_stack([g[rows[k]], h[rows[k]]]))
            np.testing.assert_allclose(hist[j, bm.feature_offsets[f]:bm.feature_offsets[f + 1]], want, atol=1e-9)


@pytest.mark.parametrize("damage", ["skip-out-of-range", "bin-is-skipped", "not-ascending", "negative-count"])
def test_inconsistent_bin_lists_are_refused(setting, damage):
    bm, Xb, g, h, rows = setting
    he, packer, reply = _reply(setting, [1, 2])
    remote = _Remote("p", bm.n_value_bins, 0, 0)
    totals = np.array([[g[rows[k]].sum(), h[rows[k]].sum()] for k in (1, 2)])
    skipped, n_bins, bins = reply.skipped.copy(), reply.n_bins.copy(), reply.bins.copy()
    if damage == "skip-out-of-range":
        skipped[0] = bm.n_value_bins[0] + 1
    elif damage == "bin-is-skipped":
        skipped[0] = bins[0]
    elif damage == "not-ascending":  # two bins of one (node, feature) swapped
        k = int(np.nonzero(n_bins >= 2)[0][0])
        at = int(n_bins[:k].sum())
        bins[[at, at + 1]] = bins[[at + 1, at]]
    else:
        n_bins[0], n_bins[1] = -1, n_bins[1] + n_bins[0] + 1
    reply.skipped, reply.n_bins, reply.bins = skipped, n_bins, bins  # this test's own reply
    with pytest.raises(ProtocolError):
        decode_histograms(reply, remote, totals, he, packer, "test")


@pytest.mark.parametrize("role", ["vertical passive", "hybridtree guest"])
@pytest.mark.parametrize("layout", [(0, 16, 30), (53, 65, 30), (53, 16, 41)])
def test_a_party_refuses_an_out_of_range_packing_layout(role, layout):
    from fedgrove.protocols.hybridtree.guest import HybridGuest
    from fedgrove.protocols.vertical import messages as vm
    from fedgrove.protocols.vertical.passive import VerticalPassive
    from fedgrove.transport.inprocess import InProcessHub, run_parties

    X = np.random.default_rng(0).normal(size=(20, 2))
    he = keygen("ou", 2048, "plain")

    def key_holder(ch):
        ch.recv("p", "layout")
        frac, value, count = layout
        ch.send("p", "key", vm.PublicKey(he.public_bytes(), frac, value, count))

    def party(ch):
        if role == "vertical passive":
            return VerticalPassive(ch, X, "k").fit()
        return HybridGuest(ch, X, np.arange(len(X)), "k").fit()

    with pytest.raises(ProtocolError, match=r"p: packing layout .* from k is out of range"):
        run_parties(InProcessHub(["k", "p"]), {"k": key_holder, "p": party}, timeout=10)


@pytest.mark.parametrize("k", [2, 3, 4])
@pytest.mark.parametrize("plans", ["straight", "patterns"])
def test_several_instances_per_ciphertext_give_the_same_histograms(setting, k, plans):
    """K instances a ciphertext: every bin's sums per position, compressed whole bins to a plaintext, decode to
    exactly the per-bin sums (fewer and more instances than a multiple of K; nodes of any rows)."""
    bm, Xb, g, h, rows = setting
    nodes = [3, 0, 4, 1]
    he, packer = (keygen("ou", 2048, "plain") if plans == "straight" else _CountingPlain()), GHPacker()
    row_packing = RowPacking.for_packer(packer, k)
    ct = he.encrypt(row_packing.pack(packer.encode(g, h)))
    assert ct.size == -(-len(g) // k)
    # every node searched for a cheaper plan, however small (these nodes hold about 140 rows)
    reply = encrypted_histograms("p", nodes, rows, Xb, bm.feature_offsets, ct, he, packer, row_packing,
                                 plan_min_additions=0)
    plain = encrypted_histograms("p", nodes, rows, Xb, bm.feature_offsets, he.encrypt(packer.encode(g, h)), he,
                                 packer)
    assert (reply.n_sums, list(reply.bins), list(reply.skipped)) == (plain.n_sums, list(plain.bins),
                                                                      list(plain.skipped))
    assert reply.n_slots == row_packing.bins_per_plaintext(he.plaintext_bits) >= 1
    remote = _Remote("p", bm.n_value_bins, 0, 0)
    totals = np.array([[g[rows[j]].sum(), h[rows[j]].sum()] for j in nodes])
    hist = decode_histograms(reply, remote, totals, getattr(he, "he", he), packer, "test", row_packing)
    for i, j in enumerate(nodes):
        for f in range(Xb.shape[1]):
            np.testing.assert_allclose(hist[i, bm.feature_offsets[f]:bm.feature_offsets[f + 1]],
                                       _want(Xb, bm, rows, g, h, j, f), atol=1e-9)


def test_partner_positions_reach_the_key_holder_masked(setting):
    """Positions beside a bin's sum hold its instances' partners' values: the key holder must see them only
    under noise of MASK_BITS bits above their range (without it they lie below 2^W)."""
    bm, Xb, g, h, rows = setting
    he, packer = keygen("ou", 2048, "plain"), GHPacker()
    row_packing = RowPacking.for_packer(packer, 3)
    ct = he.encrypt(row_packing.pack(packer.encode(g, h)))
    reply = encrypted_histograms("p", [0, 2], rows, Xb, bm.feature_offsets, ct, he, packer, row_packing)
    v, w = row_packing.stride_bits, packer.slot_bits
    partners = []
    for start, value in zip(range(0, reply.n_sums, reply.n_slots), he.deserialize(reply.ciphertexts).data):
        n_bins = min(reply.n_slots, reply.n_sums - start)
        for q in range(n_bins * 3 + 2):
            x = ((value + (1 << (v - 1))) & ((1 << v) - 1)) - (1 << (v - 1))
            value = (value - x) >> v
            if q % 3 != 2:
                partners.append(x)
    assert len(partners) > 50
    assert all(x >= 1 << w for x in partners) and max(partners) < 1 << (w + MASK_BITS + 1)


@pytest.mark.parametrize("rows,stride,message", [(17, 0, "17 instances per ciphertext from k is out of range"),
                                                 (3, 300, "stride of 300 bits from k"),
                                                 (12, None, "do not fit the key's")])
def test_a_passive_party_refuses_a_bad_row_packing(rows, stride, message):
    from fedgrove.protocols.vertical import messages as vm
    from fedgrove.protocols.vertical.passive import VerticalPassive
    from fedgrove.transport.inprocess import InProcessHub, run_parties

    X = np.random.default_rng(0).normal(size=(20, 2))
    he = keygen("ou", 2048, "plain")
    packer = GHPacker()

    def key_holder(ch):
        ch.recv("p", "layout")
        s = RowPacking.for_packer(packer, rows).stride_bits if stride is None else stride
        ch.send("p", "key", vm.PublicKey(he.public_bytes(), packer.frac_bits, packer.value_bits, packer.count_bits,
                                         rows, s))

    with pytest.raises(ProtocolError, match=message):
        run_parties(InProcessHub(["k", "p"]), {"k": key_holder, "p": lambda ch: VerticalPassive(ch, X, "k").fit()},
                    timeout=10)
