"""Every numba kernel against its numpy reference, on random inputs."""

import numpy as np
import pytest

from fedgrove.engine import histogram, partition, predict, split
from fedgrove.engine.binning import BinMapper


def _data(rng, n=3000, d=7, missing=0.1):
    X = rng.normal(size=(n, d))
    X[:, 3] = rng.integers(0, 3, n)  # few distinct values
    X[rng.random(X.shape) < missing] = np.nan
    bm = BinMapper(max_bins=31).fit(X)
    return X, bm, bm.transform(X)


def _segments(rng, n, k):
    idx = rng.permutation(n).astype(np.int64)
    bounds = np.sort(rng.choice(np.arange(1, n), k - 1, replace=False))
    starts = np.concatenate([[0], bounds]).astype(np.int64)
    ends = np.concatenate([bounds, [n]]).astype(np.int64)
    for s, e in zip(starts, ends):
        idx[s:e] = np.sort(idx[s:e])
    return idx, starts, ends


@pytest.mark.parametrize("n_stats", [2, 3, 4])
@pytest.mark.parametrize("n_threads", [1, 3])
def test_build_histograms_matches_reference(rng, n_stats, n_threads):
    X, bm, Xb = _data(rng)
    idx, starts, ends = _segments(rng, len(X), 5)
    stats = rng.normal(size=(len(X), n_stats))  # ordered: row i belongs to idx[i]
    feats = np.array([0, 2, 3, 6], dtype=np.int64)
    rows = np.array([4, 0, 2, 1, 3], dtype=np.int64)
    out_a = np.full((5, bm.feature_offsets[-1], n_stats), 7.0)
    out_b = np.full_like(out_a, 7.0)
    histogram.build_histograms(Xb, idx, starts, ends, stats, bm.feature_offsets, feats, out_a, rows, n_threads)
    histogram.build_histograms_reference(Xb, idx, starts, ends, stats, bm.feature_offsets, feats, out_b, rows)
    np.testing.assert_allclose(out_a, out_b, rtol=1e-12, atol=1e-12)


def test_build_histograms_root_fast_path_matches_reference(rng):
    # one node over consecutive rows takes the no-gather path
    X, bm, Xb = _data(rng)
    idx = np.arange(len(X), dtype=np.int64)
    stats = rng.normal(size=(len(X), 3))
    feats = np.arange(Xb.shape[1], dtype=np.int64)
    a = np.zeros((1, bm.feature_offsets[-1], 3))
    b = np.zeros_like(a)
    one = np.array([0], dtype=np.int64)
    histogram.build_histograms(Xb, idx, one * 0, one * 0 + len(X), stats, bm.feature_offsets, feats, a, one, 2)
    histogram.build_histograms_reference(Xb, idx, one * 0, one * 0 + len(X), stats, bm.feature_offsets, feats, b, one)
    np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def test_subtraction_matches_reference(rng):
    parent = rng.normal(size=(3, 50, 3))
    child_a = rng.normal(size=(6, 50, 3))
    child_b = child_a.copy()
    args = (np.array([2, 0], dtype=np.int64), None, np.array([1, 4], dtype=np.int64), np.array([0, 5], dtype=np.int64))
    histogram.subtract_histograms(parent, args[0], child_a, args[2], args[3])
    histogram.subtract_histograms_reference(parent, args[0], child_b, args[2], args[3])
    np.testing.assert_array_equal(child_a, child_b)
    np.testing.assert_allclose(child_a[0] + child_a[1], parent[2])


@pytest.mark.parametrize("n_rows, n_columns, n_groups", [(0, 1, 3), (1, 2, 1), (5000, 1, 700), (5000, 3, 40)])
def test_grouped_sums_equal_bincount_to_the_bit(rng, n_rows, n_columns, n_groups):
    # SimFL's aggregation: per group, the sums of the rows sent to it, in row order, so each sum is bincount's
    # bit for bit (the aggregated gradients, and so the models, do not change with the kernel); groups that
    # receive no row stay zero, and rows not listed are not added
    values = rng.normal(size=(n_rows + 10, n_columns)) * 10.0 ** rng.integers(-8, 8, size=(n_rows + 10, 1))
    rows = rng.permutation(n_rows + 10)[:n_rows].astype(np.int64)
    groups = rng.integers(0, max(1, n_groups // 2), size=n_rows).astype(np.int64)  # half the groups get none
    out = histogram.grouped_sums(values, rows, groups, n_groups)
    assert out.shape == (n_groups, n_columns)
    np.testing.assert_array_equal(out, histogram.grouped_sums_reference(values, rows, groups, n_groups))
    np.testing.assert_array_equal(out[max(1, n_groups // 2):], 0.0)


def _random_layer_hist(rng, bm, Xb, n_nodes, stats):
    idx, starts, ends = _segments(rng, len(Xb), n_nodes)
    hist = np.zeros((n_nodes, bm.feature_offsets[-1], stats.shape[1]))
    feats = np.arange(Xb.shape[1], dtype=np.int64)
    histogram.build_histograms_reference(Xb, idx, starts, ends, stats[idx], bm.feature_offsets, feats, hist,
                                         np.arange(n_nodes))
    node_stats = np.array([stats[idx[s:e]].sum(axis=0) for s, e in zip(starts, ends)])
    return hist, node_stats


@pytest.mark.parametrize("params", [(1.0, 0.0, 1e-3, 1.0), (0.0, 0.5, 5.0, 20.0)])
@pytest.mark.parametrize("with_count", [True, False])
def test_gbdt_split_search_matches_reference(rng, params, with_count):
    X, bm, Xb = _data(rng)
    p = 1 / (1 + np.exp(-rng.normal(size=len(X))))
    stats = np.column_stack([p - (rng.random(len(X)) < 0.4), p * (1 - p), np.ones(len(X))])
    hist, node_stats = _random_layer_hist(rng, bm, Xb, 4, stats)
    if not with_count:
        hist = np.ascontiguousarray(hist[..., :2])
    allowed = rng.random((4, Xb.shape[1])) < 0.8
    rows = np.arange(4, dtype=np.int64)
    a = split.find_splits_gbdt(hist, rows, node_stats, bm.feature_offsets, allowed, *params)
    b = split.find_splits_gbdt_reference(hist, rows, node_stats, bm.feature_offsets, allowed, *params)
    for x, y in zip(a, b):
        np.testing.assert_allclose(np.asarray(x, dtype=float), np.asarray(y, dtype=float), rtol=1e-9)
    assert (a[1] >= 0).any()



def test_split_search_without_counts_equals_with_counts_when_counts_are_not_needed(rng):
    # min_samples_leaf <= 1 and min_child_weight > 0: (g, h) histograms choose the same splits as (g, h, count)
    X, bm, Xb = _data(rng)
    p = 1 / (1 + np.exp(-rng.normal(size=len(X))))
    stats = np.column_stack([p - (rng.random(len(X)) < 0.4), p * (1 - p), np.ones(len(X))])
    hist, node_stats = _random_layer_hist(rng, bm, Xb, 6, stats)
    allowed = np.ones((6, Xb.shape[1]), dtype=bool)
    rows = np.arange(6, dtype=np.int64)
    args = (rows, node_stats, bm.feature_offsets, allowed, 1.0, 0.0, 1e-3, 1.0)
    a = split.find_splits_gbdt(hist, *args)
    b = split.find_splits_gbdt(np.ascontiguousarray(hist[..., :2]), *args)
    for x, y in zip(a[:4], b[:4]):
        np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(a[4][:, :2], b[4][:, :2])
    assert np.isnan(b[4][:, 2]).all()


@pytest.mark.parametrize("criterion", ["gini", "entropy", "mse"])
def test_cart_split_search_matches_reference(rng, criterion):
    X, bm, Xb = _data(rng)
    w = rng.integers(0, 3, len(X)).astype(float)
    if criterion == "mse":
        yv = X[:, 0] * 2 + rng.normal(size=len(X))
        yv = np.nan_to_num(yv)
        stats = np.column_stack([w, w * yv, w * yv * yv])
    else:
        cls = rng.integers(0, 3, len(X))
        stats = np.zeros((len(X), 3))
        stats[np.arange(len(X)), cls] = w
    hist, node_stats = _random_layer_hist(rng, bm, Xb, 3, stats)
    allowed = np.ones((3, Xb.shape[1]), dtype=bool)
    rows = np.arange(3, dtype=np.int64)
    code = split.CRITERIA[criterion]
    a = split.find_splits_cart(hist, rows, node_stats, bm.feature_offsets, allowed, code, w.sum(), 2.0)
    b = split.find_splits_cart_reference(hist, rows, node_stats, bm.feature_offsets, allowed, code, w.sum(), 2.0)
    for x, y in zip(a, b):
        np.testing.assert_allclose(np.asarray(x, dtype=float), np.asarray(y, dtype=float), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("kernel, n, n_stats", [("codes", 100_000, 2), ("codes", 100_000, 3), ("codes", 140_000, 2),
                                               ("flags", 20_000, 2), ("flags", 20_000, 3)])
def test_partition_matches_reference(rng, kernel, n, n_stats):
    # by codes: several tasks per node; (g, h) or three statistics; a table past the prefetching size (2^17 rows);
    # by flags: a Federated Forest client or a vertical label holder splits nodes by a peer's masks (the nodes'
    # masks concatenated in order), to the same segments as the owner's split by its codes
    X, bm, Xb = _data(rng, n=n)
    idx, starts, ends = _segments(rng, len(X), 3)
    feats = np.array([0, 3, 5], dtype=np.int64)
    bins = np.array([10, 1, 3], dtype=np.int64)
    ml = np.array([True, False, True])
    stats = rng.normal(size=(len(idx), n_stats))
    a_idx, b_idx = np.full_like(idx, -1), np.full_like(idx, -1)
    a_st, b_st = np.zeros_like(stats), np.zeros_like(stats)
    if kernel == "codes":
        ma = partition.partition_nodes(np.asfortranarray(Xb), idx, stats, a_idx, a_st, starts, ends, feats, bins, ml,
                                       bm.missing_codes)
    else:
        flags = np.concatenate([np.where(Xb[idx[s:e], f] == bm.missing_codes[f], m, Xb[idx[s:e], f] <= b)
                                for s, e, f, b, m in zip(starts, ends, feats, bins, ml)])
        ma = partition.partition_by_flags(idx, stats, a_idx, a_st, starts, ends, flags)
    mb = partition.partition_nodes_reference(Xb, idx, stats, b_idx, b_st, starts, ends, feats, bins, ml,
                                             bm.missing_codes)
    np.testing.assert_array_equal(ma, mb)
    np.testing.assert_array_equal(a_idx, b_idx)
    np.testing.assert_array_equal(a_st, b_st)  # statistics travel with their samples
    assert (a_idx >= 0).all() and 0 < (ma - starts).min() and (ends - ma).min() > 0  # both sides non-empty


def test_predict_kernels_match_reference(rng):
    from fedgrove.engine.gbdt import GBDTParams, train_gbdt

    X, bm, Xb = _data(rng)
    y = (np.nan_to_num(X[:, 0]) > 0).astype(float)
    model = train_gbdt(GBDTParams(n_estimators=5, max_depth=4), X, y, bin_mapper=bm)
    pk = model._pack()
    a = predict.predict_leaves(X, pk.feature, pk.threshold, pk.missing_left, pk.left, pk.right, pk.tree_offsets)
    b = predict.predict_leaves_reference(X, pk.feature, pk.threshold, pk.missing_left, pk.left, pk.right,
                                         pk.tree_offsets)
    c = pk.leaves_binned(Xb, bm.missing_codes)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a, c)  # raw thresholds and bin thresholds route identically


def test_one_pass_predictions_are_the_reference_leaves_values_added_in_tree_order(rng):
    # rows go down each tree 6 side by side, a lane whose row is at its leaf taking the next row, 64 rows to a
    # task: row counts around those, leaves at unequal depths, missing values both ways, several classes and a
    # forest's rows of values; the sums must be the reference leaves' values added in tree order, to the bit
    from fedgrove.engine.forest import ForestParams, train_forest
    from fedgrove.engine.gbdt import GBDTParams, train_gbdt

    X, bm, _ = _data(rng)
    y = rng.integers(0, 3, len(X)).astype(float)
    gbdt = train_gbdt(GBDTParams("multiclass", n_classes=3, n_estimators=4, max_depth=5, min_child_weight=5.0),
                      X, y, bin_mapper=bm)
    forest = train_forest(ForestParams("classification", n_estimators=6, max_depth=6, seed=1), X, y)
    for model in (gbdt, forest):
        pk = model._pack()
        for n in (0, 1, 5, 6, 7, 63, 64, 65, 1000):
            part = np.ascontiguousarray(X[:n])
            leaves = predict.predict_leaves_reference(part, pk.feature, pk.threshold, pk.missing_left, pk.left,
                                                      pk.right, pk.tree_offsets)
            np.testing.assert_array_equal(
                predict.predict_leaves(part, pk.feature, pk.threshold, pk.missing_left, pk.left, pk.right,
                                       pk.tree_offsets), leaves)
            values = pk.node_values()
            if model is gbdt:  # bin codes route as the raw values do
                np.testing.assert_array_equal(pk.leaves_binned(bm.transform(part), bm.missing_codes), leaves)
                classes = np.arange(len(pk.trees)) % 3
                base = np.array([0.5, -1.0, 0.25])
                expected = np.tile(base, (n, 1))
                for t in range(len(pk.trees)):
                    expected[:, classes[t]] += values[pk.tree_offsets[t] + leaves[:, t], 0]
                got = predict.predict_raw_sum(part, pk.feature, pk.threshold, pk.missing_left, pk.left, pk.right,
                                              pk.tree_offsets, values[:, 0], classes, base, len(pk.trees))
            else:
                expected = np.zeros((n, values.shape[1]))
                for t in range(len(pk.trees)):
                    expected += values[pk.tree_offsets[t] + leaves[:, t]]
                expected /= len(pk.trees)
                got = predict.predict_mean_values(part, pk.feature, pk.threshold, pk.missing_left, pk.left,
                                                  pk.right, pk.tree_offsets, values)
            np.testing.assert_array_equal(got, expected)
    # leaves at unequal depths in a tree
    assert any(len(set(t.nodes["depth"][t.is_leaf])) > 1 for t in gbdt.trees + forest.trees)
    assert np.isnan(X).any()


def _route_with_bits(cols, trees, slot, bits, missing, binned):
    """The kernel's routing of ``trees`` (a PackedEnsemble's flat arrays) with packed peer ``bits``."""
    from fedgrove.engine.tree import PackedEnsemble

    pk = PackedEnsemble(trees)
    packed = np.packbits(bits, axis=1)
    packed.setflags(write=False)  # (as the masks come: read from the bytes received)
    return predict.leaves_with_peer_bits(np.ascontiguousarray(cols), pk.feature, pk.bin if binned else pk.threshold,
                                         pk.missing_left, pk.left, pk.right, slot, pk.tree_offsets, len(trees), packed,
                                         missing if binned else None)


@pytest.mark.parametrize("binned", [False, True])
@pytest.mark.parametrize("n", [1, 63, 3000])
def test_routing_with_a_peers_bits_follows_the_bits_at_its_splits_and_the_columns_elsewhere(rng, binned, n):
    # a vertical label holder's routing through several trees: some splits decided by a peer's go-left bits (here
    # random, so that they disagree with the columns; packed, rows that do not fill the last byte or block), the
    # rest by its own raw values or bin codes, missing values both ways
    from fedgrove.engine.gbdt import GBDTParams, train_gbdt
    from fedgrove.engine.tree import PackedEnsemble

    X, bm, Xb = _data(rng)
    y = (np.nan_to_num(X[:, 0]) + np.nan_to_num(X[:, 1]) > 0).astype(float)
    trees = train_gbdt(GBDTParams(n_estimators=4, max_depth=5), X, y, bin_mapper=bm).trees
    X, Xb = X[:n], Xb[:n]
    pk = PackedEnsemble(trees)
    split = np.flatnonzero(pk.feature >= 0)
    peer = split[::2]
    slot = np.full(len(pk.feature), -1, dtype=np.int64)
    slot[peer] = np.arange(len(peer))[::-1]  # rows of the bits in any order
    bits = rng.random((len(peer), n)) < 0.5
    cols, cuts = (Xb, pk.bin) if binned else (X, pk.threshold)
    missing = np.asarray(bm.missing_codes, dtype=np.int64) if binned else np.zeros(0, dtype=np.int64)
    expected = np.zeros((n, len(trees)), dtype=np.int64)
    for t in range(len(trees)):
        b0 = pk.tree_offsets[t]
        for i in range(n):
            k = 0
            while pk.feature[b0 + k] >= 0:
                j = b0 + k
                if slot[j] >= 0:
                    go = bits[slot[j], i]
                else:
                    x = cols[i, pk.feature[j]]
                    gone = x == missing[pk.feature[j]] if binned else np.isnan(x)
                    go = bool(pk.missing_left[j]) if gone else x <= cuts[j]
                k = pk.left[j] if go else pk.right[j]
            expected[i, t] = k
    out = _route_with_bits(cols, trees, slot, bits, missing, binned)
    np.testing.assert_array_equal(out, expected)
    # with no split the peer's, the engine's routing; with the bits the columns' decisions, the same again
    engine = pk.leaves(X)
    if n > 1:
        assert not np.array_equal(out, engine)  # the bits were followed
    own = np.full(len(slot), -1, dtype=np.int64)
    np.testing.assert_array_equal(_route_with_bits(cols, trees, own, bits[:0], missing, binned), engine)
    f, t = pk.feature[peer], pk.threshold[peer]
    true_bits = np.where(np.isnan(X[:, f]), pk.missing_left[peer], X[:, f] <= t).T[::-1]
    np.testing.assert_array_equal(_route_with_bits(cols, trees, slot, true_bits, missing, binned), engine)
    if n == 3000:
        assert np.isnan(X[:, pk.feature[split]]).any()  # missing values at the splits


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 1000])
def test_packed_go_left_bits_are_numpys_packed_masks(rng, n):
    # a feature holder's answer: each split's go-left mask over the rows, packed; NaN both ways, rows that do not
    # fill the last byte, a column read by several splits
    X = rng.normal(size=(n, 5))
    X[rng.random(X.shape) < 0.2] = np.nan
    features = np.array([0, 3, 3, 4, 1], dtype=np.int64)
    thresholds = rng.normal(size=5)
    missing_left = np.array([1, 0, 1, 0, 1], dtype=np.uint8)
    out = np.full((5, (n + 7) // 8), 0xAA, dtype=np.uint8)
    predict.pack_go_left(np.asfortranarray(X), features, thresholds, missing_left, out)
    for j in range(5):
        x = X[:, features[j]]
        mask = np.where(np.isnan(x), bool(missing_left[j]), x <= thresholds[j])
        assert out[j].tobytes() == np.packbits(mask).tobytes()
    if n >= 1000:
        assert np.isnan(X).any() and 0 < np.unpackbits(out).mean() < 1


@pytest.mark.parametrize("n", [0, 1, 13, 1000])
def test_a_passive_partys_answer_sends_each_distinct_mask_once_and_each_split_its_own(rng, n):
    # splits that repeat a condition (another tree's split on the same feature and threshold), splits whose
    # masks are equal on these rows though their conditions differ, and distinct ones; what the label holder
    # reads back is each split's own packed mask
    from fedgrove.engine.binning import BinMapper
    from fedgrove.protocols.vertical import messages as m
    from fedgrove.protocols.vertical.passive import PassiveModel

    X = rng.normal(size=(n, 3))
    X[rng.random(X.shape) < 0.2] = np.nan
    conditions = [(0, True, 0.1), (0, True, 0.1), (1, False, -0.3), (2, True, 0.4), (0, True, 0.1),
                  (1, False, 50.0), (1, False, 60.0), (2, False, 0.4)]  # 50 and 60: every value goes left
    splits = {(t, 2 * t): (f, 1, ml, thr) for t, (f, ml, thr) in enumerate(conditions)}
    model = PassiveModel("p", BinMapper(max_bins=8).fit(rng.normal(size=(20, 3))), splits)
    keys = sorted(splits)
    bits, which = model.packed_go_left(X, keys)
    assert len(which) == len(keys) and len(bits) == len({bytes(b) for b in bits})  # each mask once
    expected = [np.packbits(np.where(np.isnan(X[:, f]), ml, X[:, f] <= thr)).tobytes()
                for f, _b, ml, thr in (splits[k] for k in keys)]
    assert [bits[j] for j in which] == expected
    assert len(bits) == len(set(expected)) < len(keys)
    packed = m.packed_masks(bits, n)
    assert [packed[j].tobytes() for j in which] == expected
    assert m.distinct_masks(np.zeros((0, 4), dtype=np.uint8)) == ([], [])


@pytest.mark.parametrize("n", [1, 13, 16])
def test_packed_masks_refuse_a_wrong_length_and_bits_past_the_last_row(n):
    from fedgrove.exceptions import ProtocolError
    from fedgrove.protocols.vertical import messages as m

    width = (n + 7) // 8
    good = np.packbits(np.ones(n, dtype=bool)).tobytes()
    assert m.packed_masks([good, bytes(width)], n).tolist() == [list(good), [0] * width]
    for bad in (good + b"\x00", good[:-1]):
        with pytest.raises(ProtocolError, match=f"a mask of {len(bad)} bytes does not describe {n} instances"):
            m.packed_masks([bytes(width), bad], n)
    if n % 8:  # the padding after the last row must be clear
        with pytest.raises(ProtocolError, match=f"a mask of {width} bytes does not describe {n} instances"):
            m.packed_masks([good[:-1] + bytes([good[-1] | 1])], n)


@pytest.mark.parametrize("indexed", [True, False])
@pytest.mark.parametrize("binned", [False, True])
def test_walking_down_a_guests_splits_matches_the_reference_and_a_walk_by_hand(rng, binned, indexed, monkeypatch):
    # a HybridTree guest's layers under the host's hand-off nodes: three trees of splits (one with none),
    # start nodes that are splits, leaves of the guest's layers, or nodes the guest does not know (they stay,
    # within the ids the layout indexes or past them), missing values both ways; the kernel, its numpy
    # reference and a walk node by node agree, the start nodes looked up by id or (ids too sparse) searched
    from fedgrove.engine.binning import BinMapper
    from fedgrove.protocols.vertical.passive import PassiveModel

    if not indexed:
        monkeypatch.setattr(predict, "INDEX_SLACK", 0)
        monkeypatch.setattr(predict, "INDEX_MIN", 0)

    X = rng.normal(size=(500, 4))
    X[rng.random(X.shape) < 0.15] = np.nan
    bm = BinMapper(max_bins=15).fit(X)
    codes = bm.transform(X)
    splits, children = {}, {}
    for t, (roots, depth) in enumerate([([3, 4], 2), ([], 0), ([0], 3)]):
        frontier, nxt = list(roots), 100 * (t + 1)
        for _ in range(depth):
            new = []
            for node in frontier:
                f = int(rng.integers(0, 4))
                b = int(rng.integers(0, bm.n_value_bins[f]))
                splits[(t, node)] = (f, b, bool(rng.integers(0, 2)), bm.threshold(f, b))
                children[(t, node)] = (nxt, nxt + 1)
                new += [nxt, nxt + 1]
                nxt += 2
            frontier = new
    model = PassiveModel("g", bm, splits, children)
    known = [[n for (tt, n) in splits if tt == t] + [k for (tt, _), kids in children.items() if tt == t for k in kids]
             for t in range(3)]
    start = np.column_stack([rng.choice(known[t] + [5, 7, 99, max(known[t]) + 1, 10_000], size=len(X)) if known[t]
                             else rng.integers(0, 9, size=len(X)) for t in range(3)])
    rows = rng.permutation(len(X))[:300]
    cols, missing = (codes, bm.missing_codes) if binned else (X, np.zeros(0, dtype=np.int64))
    expected = start[: len(rows)].copy()
    for j, i in enumerate(rows):
        for t in range(3):
            node = expected[j, t]
            while (t, node) in splits:
                f, b, ml, thr = splits[(t, node)]
                x = cols[i, f]
                gone = (x == missing[f]) if binned else np.isnan(x)
                go = ml if gone else x <= (b if binned else thr)
                node = children[(t, node)][0 if go else 1]
            expected[j, t] = node
    layout = model.walk_layout(range(3), binned=binned)
    assert (len(layout[-1]) > 0) == indexed
    missing = np.asarray(missing, dtype=np.int64)
    start = np.ascontiguousarray(start[: len(rows)], dtype=np.int64)
    out = np.empty_like(start)
    predict.walk_down(np.ascontiguousarray(cols), rows.astype(np.int64), start, *layout, missing, out)
    np.testing.assert_array_equal(out, expected)
    np.testing.assert_array_equal(predict.walk_down_reference(cols, rows, start, *layout, missing), expected)
    assert (expected != start).any() and (expected == start).any()  # rows that moved and rows that stayed
    # children that lead back to an earlier node: -2, not a walk that never ends
    node_ids, offsets, feature, threshold, missing_left, left, right, index, index_offsets = layout
    loop = left.copy()
    loop[left >= 0] = np.flatnonzero(left >= 0)  # every split's left child: itself
    args = (node_ids, offsets, feature, threshold, np.ones_like(missing_left), loop, loop, index, index_offsets,
            missing)
    predict.walk_down(np.ascontiguousarray(cols), rows.astype(np.int64), start, *args, out)
    assert (out == -2).any()
    np.testing.assert_array_equal(predict.walk_down_reference(cols, rows, start, *args), out)


@pytest.mark.parametrize("distinct", [3, 300, 1_000_000])
def test_ranked_routing_matches_raw_routing(rng, distinct):
    # RankedRows (ranks of a table's distinct values, uint8/uint16/uint32 by how many) must send every row to the
    # leaf that routing the raw values sends it to, NaN included, and its kernel must match its numpy reference
    from fedgrove.engine.gbdt import GBDTParams, train_gbdt
    from fedgrove.engine.tree import PackedEnsemble, RankedRows, Tree

    n = 80_000 if distinct > 70_000 else 4000  # 80,000 rows hold over 65,535 distinct values of 10^6
    X = rng.integers(0, distinct, size=(n, 5)).astype(float) / 7.0
    X[rng.random(X.shape) < 0.1] = np.nan
    y = (np.nan_to_num(X[:, 0]) + rng.normal(size=n) > np.nanmedian(X[:, 0])).astype(float)
    model = train_gbdt(GBDTParams(n_estimators=3, max_depth=5, max_bins=63), X, y)
    ranked = RankedRows(X)
    assert ranked.ranks.dtype == {3: np.uint8, 300: np.uint16, 1_000_000: np.uint32}[distinct]
    trees = list(model.trees)
    # thresholds equal to a value, between values, beyond every value and infinite
    t = trees[0]
    nodes = t.nodes.copy()
    internal = np.nonzero(nodes["feature"] >= 0)[0]
    nodes["threshold"][internal[:4]] = [X[0, 0] if not np.isnan(X[0, 0]) else 1.0, -np.inf, np.inf, 1e9]
    nodes["feature"][internal[:4]] = [0, 1, 2, 3]
    trees.append(Tree(nodes, t.values))
    for tree in trees:
        expected = PackedEnsemble([tree]).leaves(X)[:, 0]
        np.testing.assert_array_equal(ranked.leaves(tree), expected)
        layout = ranked.layout(tree)
        np.testing.assert_array_equal(predict.predict_leaves_ranked_reference(ranked.ranks, *layout), expected)
        np.testing.assert_array_equal(predict.predict_leaves_ranked(ranked.ranks, *layout), expected)
        for n_blocks in (1, 3, 7):  # rows partitioned in blocks of their own (one per thread), any number
            np.testing.assert_array_equal(predict.predict_leaves_ranked(ranked.ranks, *layout, n_blocks=n_blocks),
                                          expected)


def test_ranked_routing_refuses_unknown_thresholds(rng):
    from fedgrove.engine.tree import NODE_DTYPE, RankedRows, Tree
    from fedgrove.exceptions import ModelFormatError

    nodes = np.zeros(3, dtype=NODE_DTYPE)
    nodes["feature"] = [0, -1, -1]
    nodes["left"], nodes["right"] = [1, -1, -1], [2, -1, -1]
    nodes["threshold"] = [np.nan, 0, 0]
    with pytest.raises(ModelFormatError, match="thresholds belong to another party"):
        RankedRows(rng.normal(size=(10, 2))).leaves(Tree(nodes, np.zeros((3, 1))))


@pytest.mark.parametrize("n, k", [(1, 2), (700, 3), (1537, 23)])
def test_class_major_softmax_gradients_equal_row_major(rng, n, k):
    """The engine's class-major multiclass gradients are the row-major kernel's, bit for bit (the protocols use
    the row-major one and must grow the engine's trees), whatever the rows' count against the block size."""
    from fedgrove.engine.losses import make_objective

    raw = rng.normal(scale=3.0, size=(n, k))
    y = rng.integers(0, k, n).astype(np.float64)
    obj = make_objective("multiclass", k)
    g, h = obj.gradients(y, raw)
    gc, hc = obj.gradients_by_class(y, np.ascontiguousarray(raw.T))
    assert gc.shape == hc.shape == (k, n)
    assert np.array_equal(gc, g.T) and np.array_equal(hc, h.T)


@pytest.mark.parametrize("objective", ["binary", "regression"])
def test_single_output_gradients_by_class_are_the_transposed_gradients(rng, objective):
    from fedgrove.engine.losses import make_objective

    raw = rng.normal(size=(50, 1))
    y = (rng.random(50) < 0.5).astype(np.float64)
    obj = make_objective(objective)
    g, h = obj.gradients(y, raw)
    gc, hc = obj.gradients_by_class(y, raw.T.copy())
    assert np.array_equal(gc, g.T) and np.array_equal(hc, h.T)


def test_plan_siblings_builds_the_smaller_child_of_each_pair_and_every_unpaired_node():
    from fedgrove.engine.partition import plan_siblings

    seg = np.full((12, 3), -1, dtype=np.int64)
    # node: (start, end, buffer); parents 0, 1, 2 split into (3, 4), (5, 6), (7, 8)
    for node, (s, e) in {3: (0, 10), 4: (10, 14), 5: (14, 20), 6: (20, 26), 7: (26, 30), 8: (30, 40),
                         9: (40, 50)}.items():
        seg[node] = (s, e, 1)
    pending = np.array([[0, 3, 4], [1, 5, 6], [2, 7, 8]], dtype=np.int64)
    # the layer lacks node 7 (its parent's other child, 8, is alone) and holds node 9, nobody's child
    layer = np.array([3, 4, 5, 6, 8, 9], dtype=np.int64)
    row_of, build, parents, small, large = plan_siblings(pending, seg, layer)
    assert row_of.tolist()[:10] == [-1, -1, -1, 0, 1, 2, 3, -1, 4, 5]
    # pair (3, 4): 4 is smaller; pair (5, 6): a tie goes to the left child, 5
    assert build.tolist() == [1, 2, 4, 5]
    assert parents.tolist() == [0, 1] and small.tolist() == [1, 2] and large.tolist() == [0, 3]
    # with no partition to follow, every node is built
    _, build, parents, _, _ = plan_siblings(np.zeros((0, 3), dtype=np.int64), seg, layer)
    assert build.tolist() == list(range(len(layer))) and len(parents) == 0


def test_record_segments_gives_children_their_parts_in_the_other_buffer():
    from fedgrove.engine.partition import record_segments

    seg = np.full((8, 3), -1, dtype=np.int64)
    seg[1] = (0, 10, 0)
    seg[2] = (10, 25, 0)
    counts = np.empty(4)
    record_segments(seg, np.array([1, 2]), np.array([[3, 4], [5, 6]]), np.array([4, 10]), counts)
    assert seg[3:7].tolist() == [[0, 4, 1], [4, 10, 1], [10, 10, 1], [10, 25, 1]]
    assert counts.tolist() == [4, 6, 0, 15]


def test_logistic_gradients_are_the_two_branch_sigmoid_bit_for_bit(rng):
    """The kernel takes one exponential and a select; its numbers are those of the textbook two-branch stable
    sigmoid, 1/(1+exp(-r)) for r >= 0 and exp(r)/(1+exp(r)) below (the engine's models and every protocol that
    reproduces them depend on these bits)."""
    import math

    from fedgrove.engine.losses import make_objective

    raw = np.concatenate([rng.normal(scale=4.0, size=997), [0.0, -0.0, 1e-300, -1e-300, 40.0, -40.0, 800.0, -800.0]])
    y = (rng.random(len(raw)) < 0.5).astype(np.float64)
    g, h = make_objective("binary").gradients(y, raw[:, None])
    for i, r in enumerate(raw):
        p = 1.0 / (1.0 + math.exp(-r)) if r >= 0.0 else math.exp(r) / (1.0 + math.exp(r))
        assert g[i, 0] == p - y[i] and h[i, 0] == p * (1.0 - p), (i, r)


@pytest.mark.parametrize("n_stats", [1, 2, 3])
@pytest.mark.parametrize("n", [0, 1, 4095, 4096 * 3 + 7, 300_001])
def test_sum_rows_and_gather_rows_match_numpy(rng, n, n_stats):
    # sum_rows adds fixed chunks of rows (at most 64, at least 4,096 rows each but the last) in parallel, (g, h)
    # in registers; each chunk's rows in order, then the chunks in order: the same bits as that order in numpy
    stats = rng.normal(size=(n, n_stats)) * 10.0 ** rng.integers(-3, 4, size=(n, 1))
    n_chunks = max(1, min(64, n // 4096))
    size = (n + n_chunks - 1) // n_chunks
    expected = np.zeros(n_stats)
    for k in range(n_chunks):
        part = np.zeros(n_stats)
        for row in stats[k * size:(k + 1) * size]:
            part += row
        expected += part
    np.testing.assert_array_equal(histogram.sum_rows(stats), expected)
    idx = rng.permutation(n)[: n // 2].astype(np.int64)
    out = np.empty((len(idx), n_stats))
    histogram.gather_rows(stats, idx, out)
    np.testing.assert_array_equal(out, stats[idx])


def test_shared_buffer_names_the_one_buffer_of_a_layer_or_none():
    from fedgrove.engine.partition import shared_buffer

    seg = np.array([[0, 10, 0], [0, 4, 1], [4, 10, 1], [0, 2, 0], [2, 4, 0]], dtype=np.int64)
    assert shared_buffer(seg, np.array([0], dtype=np.int64)) == 0
    assert shared_buffer(seg, np.array([1, 2], dtype=np.int64)) == 1
    assert shared_buffer(seg, np.array([3, 4], dtype=np.int64)) == 0
    assert shared_buffer(seg, np.array([3, 2], dtype=np.int64)) == -1  # the first node's buffer is not all
    assert shared_buffer(seg, np.array([1, 2, 4], dtype=np.int64)) == -1  # nor is one that differs last


@pytest.mark.parametrize("with_count", [True, False])
@pytest.mark.parametrize("missing", [0.0, 0.1])
@pytest.mark.parametrize("params", [(1.0, 0.0, 1e-3, 1.0), (0.0, 0.5, 5.0, 20.0), (1.0, 0.0, 1e-3, 3.0)])
@pytest.mark.parametrize("tiny", ["none", "rows with missing values", "every row"])
@pytest.mark.parametrize("n_nodes", [12, 400])
def test_wide_features_scanned_in_passes_choose_as_bin_by_bin_to_the_bit(rng, with_count, missing, params, tiny,
                                                                          n_nodes):
    # gbdt_pair_splits scans features of WIDE_BINS value bins or more in passes (prefix sums, vectorised gains,
    # then the choice); every (node, feature) pair's gain, bin, direction and left sums must be the bin-by-bin
    # scan's bits, or a model would change with the table's widest feature.  Features of 2-63 value bins,
    # many nodes (more pairs than a thread's run), some features not allowed, gains that tie (repeated
    # columns), near-ties of the two missing directions (rows with missing values whose gradients and
    # hessians are a billionth of the others'), and gains that are all rounding (every gradient 1e-12: only
    # the gain floor tells them from splits); 400 nodes of 10 rows on average leave most bins empty, whose
    # candidates the passes skip (an empty bin's is the one before it again), and rows of zero gradient and
    # hessian make bins that only their count keeps
    X = rng.normal(size=(4000, 9))
    X[:, 2] = rng.integers(0, 3, len(X))
    X[:, 5] = X[:, 4]  # the same candidates twice: ties go to the lower feature either way
    X[rng.random(X.shape) < missing] = np.nan
    bm = BinMapper(max_bins=63).fit(X)
    Xb = bm.transform(X)
    widths = np.diff(bm.feature_offsets) - 1
    assert widths.min() < split.WIDE_BINS <= widths.max()
    p = 1 / (1 + np.exp(-rng.normal(size=len(X))))
    stats = np.column_stack([p - (rng.random(len(X)) < 0.4), p * (1 - p), np.ones(len(X))])
    if tiny == "rows with missing values":
        stats[np.isnan(X).any(axis=1), :2] *= 1e-9
    elif tiny == "every row":
        stats[:, 0] *= 1e-12
    else:  # rows with zero gradient and hessian: a bin of only such rows is empty but for its count
        stats[rng.random(len(X)) < 0.2, :2] = 0.0
    hist, node_stats = _random_layer_hist(rng, bm, Xb, n_nodes, stats)
    if not with_count:
        hist = np.ascontiguousarray(hist[..., :2])
    allowed = rng.random((n_nodes, Xb.shape[1])) < 0.9
    args = (hist, np.arange(n_nodes, dtype=np.int64), node_stats, bm.feature_offsets, allowed, *params)
    by_bin = split.gbdt_pair_splits(*args, 10**6)
    for wide_bins in (split.WIDE_BINS, 1):
        passes = split.gbdt_pair_splits(*args, wide_bins)
        for a, b in zip(by_bin, passes):
            np.testing.assert_array_equal(a, b)
    if tiny == "every row":
        assert (by_bin[0] == -np.inf).all()
    elif n_nodes == 12 or params[2] < 1.0:  # (nodes of 10 rows rarely leave 20 a side)
        assert (by_bin[0] > -np.inf).sum() > 50
        if tiny == "none":
            assert by_bin[2].any() == (missing > 0)
    np.testing.assert_array_equal(split.gbdt_pair_splits(*args)[1], by_bin[1])  # the default threshold


@pytest.mark.parametrize("criterion", ["gini", "entropy", "mse"])
@pytest.mark.parametrize("missing", [0.0, 0.1])
@pytest.mark.parametrize("min_samples_leaf", [1.0, 30.0])
@pytest.mark.parametrize("tiny", [False, True])
def test_wide_features_in_cart_split_search_choose_as_bin_by_bin_to_the_bit(rng, criterion, missing,
                                                                          min_samples_leaf, tiny):
    # cart_pair_splits scans wide features in passes too under gini and mse (entropy keeps the bin-by-bin
    # scan), each impurity in _impurity's operations and order: the same bits as the bin-by-bin scan (three
    # classes, some of them absent from a node's rows; regression statistics), with ties (a repeated
    # column), bootstrap-like weights (0-2) and near-ties of the two missing directions (rows with missing
    # values weighing a billionth)
    X = rng.normal(size=(4000, 9))
    X[:, 2] = rng.integers(0, 3, len(X))
    X[:, 5] = X[:, 4]
    X[rng.random(X.shape) < missing] = np.nan
    bm = BinMapper(max_bins=63).fit(X)
    Xb = bm.transform(X)
    w = rng.integers(0, 3, len(X)).astype(float)
    if tiny:
        w[np.isnan(X).any(axis=1)] *= 1e-9
    if criterion == "mse":
        yv = X[:, 0] * 2 + rng.normal(size=len(X))
        yv = np.nan_to_num(yv)
        stats = np.column_stack([w, w * yv, w * yv * yv])
    else:
        cls = np.where(X[:, 1] > 1.0, 2, rng.integers(0, 2, len(X)))  # class 2 only where x1 > 1
        stats = np.zeros((len(X), 3))
        stats[np.arange(len(X)), cls] = w
    hist, node_stats = _random_layer_hist(rng, bm, Xb, 12, stats)
    allowed = rng.random((12, Xb.shape[1])) < 0.9
    code = split.CRITERIA[criterion]
    args = (hist, np.arange(12, dtype=np.int64), node_stats, bm.feature_offsets, allowed, code, w.sum(),
            min_samples_leaf)
    by_bin = split.cart_pair_splits(*args, 10**6)
    for wide_bins in (split.WIDE_BINS, 1):
        passes = split.cart_pair_splits(*args, wide_bins)
        for a, b in zip(by_bin, passes):
            np.testing.assert_array_equal(a, b)
    assert (by_bin[0] > -np.inf).sum() > 50
    if missing and not tiny:
        assert by_bin[2].any()
