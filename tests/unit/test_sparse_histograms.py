"""Histograms from the non-default codes of sparse tables: against the dense kernel, and in the engine."""

import gc

import numpy as np
import pytest

from fedgrove.engine import histogram, sparse
from fedgrove.engine.binning import BinMapper
from fedgrove.engine.gbdt import GBDTParams, train_gbdt
from tests.unit.test_kernels import _segments


def _sparse_data(rng, n=4000, d=12):
    # one-hot-like columns (mostly 0), a column mostly missing, one dense numeric column
    X = (rng.random((n, d)) < 0.08).astype(float)
    X[:, 4] *= rng.integers(1, 6, n)             # several non-default values
    X[rng.random(n) < 0.9, 7] = np.nan           # the most frequent code is the missing one
    X[:, 10] = rng.normal(size=n)                # dense: every code but one is listed
    bm = BinMapper(max_bins=31).fit(X)
    return bm, bm.transform(X)


@pytest.mark.parametrize("n_stats", [2, 3, 4])
@pytest.mark.parametrize("subset", [False, True])
def test_sparse_kernel_equals_the_dense_one(rng, n_stats, subset):
    bm, Xb = _sparse_data(rng)
    offsets = np.asarray(bm.feature_offsets, dtype=np.int32)
    d = Xb.shape[1]
    idx, starts, ends = _segments(rng, len(Xb), 6)
    stats = rng.normal(size=(len(Xb), n_stats))
    feats = np.array([0, 4, 7, 10, 11], dtype=np.int64) if subset else np.arange(d, dtype=np.int64)
    used = np.zeros(d, dtype=np.bool_)
    used[feats] = True
    rows = np.array([5, 0, 2, 1, 3, 4], dtype=np.int64)
    dense = np.full((6, offsets[-1], n_stats), 7.0)
    histogram.build_histograms(Xb, idx, starts, ends, stats, offsets, feats, dense, rows, 1)
    reference = np.full_like(dense, 7.0)
    histogram.build_histograms_reference(Xb, idx, starts, ends, stats, offsets, feats, reference, rows)
    default, listed = sparse._default_codes(Xb, offsets.astype(np.int64))
    assert listed.sum() == (Xb != default).sum()
    for got in _sparse_like_dense(Xb, offsets, idx, starts, ends, stats, used, rows, dense, (1, 3), atol=1e-10):
        np.testing.assert_allclose(got, reference, rtol=1e-12, atol=1e-10)  # and the numpy reference


def _sparse_like_dense(Xb, offsets, idx, starts, ends, stats, used, rows, dense, block_counts, atol):
    """The sparse kernel's histograms for each number of blocks, checked against the dense kernel's: an unused
    feature's bins left alone (they start at 7), the listed bins bit for bit (summed in the dense kernel's
    order), each default bin (total minus the rest) to rounding, and the same sums whatever the blocks."""
    default, listed = sparse._default_codes(Xb, offsets.astype(np.int64))
    defaults = offsets[:-1] + default
    results = []
    for n_blocks in block_counts:
        codes = sparse.SparseCodes(Xb, offsets, default, listed, n_blocks)
        got = np.full_like(dense, 7.0)
        codes.build(idx, starts, ends, stats, offsets, used, got, rows)
        for f in range(Xb.shape[1]):
            bins = np.arange(offsets[f], offsets[f + 1])
            if not used[f]:
                assert (got[:, bins] == 7.0).all()
                continue
            rest = bins[bins != defaults[f]]
            np.testing.assert_array_equal(got[:, rest], dense[:, rest])
            np.testing.assert_allclose(got[:, defaults[f]], dense[:, defaults[f]], rtol=1e-12, atol=atol)
        results.append(got)
    for got in results[1:]:
        np.testing.assert_array_equal(got, results[0])  # the same sums whatever the number of threads
    return results


@pytest.mark.parametrize("n_stats", [2, 3])
@pytest.mark.parametrize("subset", [False, True])
def test_a_node_of_every_row_in_order_is_summed_entry_by_entry_as_the_dense_kernel_sums_it(rng, n_stats, subset):
    # a tree's root (every row of the table, in order) is summed entry by entry instead of row by row; here it
    # sits after a node of every row out of order (summed row by row; its stats start at row n), beside a part of
    # that node, and chunks of rows give the totals: every listed bin bit for bit the dense kernel's
    bm, Xb = _sparse_data(rng, n=9000)
    n, d = Xb.shape
    offsets = np.asarray(bm.feature_offsets, dtype=np.int32)
    order = rng.permutation(n)
    idx = np.concatenate([order, np.arange(n), order]).astype(np.int64)
    starts, ends = np.array([0, n, 2 * n + 3]), np.array([n, 2 * n, 3 * n])
    stats = rng.normal(size=(3 * n, n_stats))
    feats = np.array([0, 4, 7, 10], dtype=np.int64) if subset else np.arange(d, dtype=np.int64)
    used = np.zeros(d, dtype=np.bool_)
    used[feats] = True
    rows = np.array([2, 0, 1], dtype=np.int64)
    dense = np.full((3, offsets[-1], n_stats), 7.0)
    histogram.build_histograms(Xb, idx, starts, ends, stats, offsets, feats, dense, rows, 1)
    results = _sparse_like_dense(Xb, offsets, idx, starts, ends, stats, used, rows, dense, (1, 2, 5), atol=1e-9)
    # the totals' chunks: the node of every row in order gets those of its rows' stats
    np.testing.assert_allclose(results[0][0, offsets[10]:offsets[11]].sum(axis=0), stats[n:2 * n].sum(axis=0))


def test_default_codes_are_each_features_most_frequent_code_across_blocks_of_features(rng):
    # features are counted 64 at a time (one table of counters for all of a wide table's features missed the
    # cache): each feature's default must be its own most frequent code, the lowest on a tie, over many blocks
    n, d = 300, 150
    sizes = rng.integers(2, 257, d)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    Xb = np.minimum((rng.random((n, d)) ** 3 * sizes).astype(np.int64), sizes - 1).astype(np.uint8)
    Xb[:, 64] = 0
    Xb[:, 65] = np.arange(n) % 2  # a tie: the lower code
    Xb[:, 149] = sizes[149] - 1
    default, listed = sparse._default_codes(Xb, offsets)
    for f in range(d):
        counts = np.bincount(Xb[:, f], minlength=256)
        assert default[f] == np.argmax(counts) and listed[f] == n - counts.max(), f


def test_a_default_bin_no_row_of_the_node_has_stays_exactly_zero(rng):
    Xb = np.zeros((100, 2), dtype=np.uint8)
    Xb[:30, 0] = 1           # feature 0: default 0; rows 0-29 have code 1
    Xb[::5, 1] = 1
    offsets = np.array([0, 2, 4], dtype=np.int32)
    codes = sparse.SparseCodes(Xb, offsets, np.array([0, 0]), np.array([30, 20]), 1)
    idx = np.arange(100, dtype=np.int64)
    stats = rng.normal(size=(100, 2)) * 1e3
    out = np.full((2, 4, 2), 7.0)
    # node 0: rows 0-29, all with feature 0's non-default code; node 1: the rest
    codes.build(idx, np.array([0, 30]), np.array([30, 100]), stats, offsets, np.ones(2, dtype=np.bool_), out,
                np.array([0, 1]))
    assert (out[0, 0] == 0.0).all()
    np.testing.assert_allclose(out[1, 0], stats[30:].sum(axis=0))
    assert (out[1, 1] == 0.0).all()


def test_only_sparse_enough_tables_get_the_sparse_kernel(rng):
    bm, Xb = _sparse_data(rng)
    codes = sparse.sparse_codes_for(Xb, bm.feature_offsets)
    assert codes is not None and codes.density < sparse.DENSITY_LIMIT
    # listing every entry of a row must cost less than reading the codes of the features in use
    assert codes.worth_it(Xb.shape[1]) and not codes.worth_it(1)
    assert sparse.sparse_codes_for(Xb, bm.feature_offsets) is codes            # remembered
    dense_bm = BinMapper(max_bins=31).fit(rng.normal(size=(500, 4)))
    dense = dense_bm.transform(rng.normal(size=(500, 4)))
    assert sparse.sparse_codes_for(dense, dense_bm.feature_offsets) is None
    key = id(Xb)
    del Xb, codes
    gc.collect()
    assert key not in sparse._CACHE                                          # forgotten with the array


@pytest.mark.parametrize("objective", ["binary", "multiclass", "regression"])
def test_the_engine_grows_the_same_trees_either_way(rng, objective, monkeypatch):
    n = 3000
    X = (rng.random((n, 30)) < 0.1).astype(float)
    X[:, 0] = rng.normal(size=n)
    score = X[:, 0] + X[:, 1:6].sum(axis=1) - X[:, 6:9].sum(axis=1)
    y = {"binary": (score > 0.5).astype(float), "regression": score + rng.normal(size=n) * 0.1,
         "multiclass": np.digitize(score, [0.0, 1.0]).astype(float)}[objective]
    params = GBDTParams(objective, n_estimators=10, max_depth=5, colsample_bytree=0.8, n_threads=1)
    quick = train_gbdt(params, X, y)
    bm = BinMapper(params.max_bins).fit(X)
    assert sparse.sparse_codes_for(bm.transform(X), bm.feature_offsets) is not None  # the sparse kernel is used
    monkeypatch.setattr(sparse, "DENSITY_LIMIT", -1.0)   # every table dense
    slow = train_gbdt(params, X, y)
    for a, b in zip(quick.trees, slow.trees):
        np.testing.assert_array_equal(a.nodes["feature"], b.nodes["feature"])
        np.testing.assert_array_equal(a.nodes["bin"], b.nodes["bin"])
        np.testing.assert_allclose(a.values, b.values, rtol=0, atol=1e-9)


def test_votes_break_near_ties_as_the_split_search_does():
    # two mirrored one-hot columns have the same gain up to the order their sums were taken in
    from fedgrove.engine.split import TIE_TOL, best_index
    from fedgrove.protocols.fvtree.privacy import NoPrivacy

    g = 12.345678
    assert best_index([g, g * (1 + 1e-12), 3.0]) == 0          # argmax would say 1
    assert best_index([3.0, g, g * (1 + 10 * TIE_TOL)]) == 2    # a real difference still wins
    assert best_index([-np.inf, -np.inf]) == -1
    assert NoPrivacy().vote(np.array([g, g * (1 + 1e-12)]), 0, 2) == 0


@pytest.mark.parametrize("subset", [False, True])
def test_a_rounds_roots_built_together_equal_each_class_root_built_alone(rng, subset):
    # one pass over the entries for every class's root: the same sums in the same order, so the same bits
    bm, Xb = _sparse_data(rng, n=5000)
    n, d = Xb.shape
    offsets = np.asarray(bm.feature_offsets, dtype=np.int32)
    k = 5
    g, h = rng.normal(size=(k, n)), rng.random((k, n))
    feats = np.array([0, 1, 2, 4, 5, 7, 8, 10, 11], dtype=np.int64) if subset else np.arange(d, dtype=np.int64)
    used = np.zeros(d, dtype=np.bool_)
    used[feats] = True
    together = sparse.root_histograms_by_class(Xb, offsets, g, h, feats)
    assert together.shape == (k, offsets[-1], 2)
    codes = sparse.sparse_codes_for(Xb, offsets)
    bins = np.concatenate([np.arange(offsets[f], offsets[f + 1]) for f in feats])
    for c in range(k):
        alone = np.zeros((1, offsets[-1], 2))
        codes.build(np.arange(n, dtype=np.int64), np.array([0]), np.array([n]), np.column_stack([g[c], h[c]]),
                    offsets, used, alone, np.array([0]))
        np.testing.assert_array_equal(together[c, bins], alone[0, bins])
    assert not np.array_equal(together[0, bins], together[1, bins])


def test_a_table_too_dense_for_the_sparse_kernel_gets_no_batched_roots(rng):
    X = rng.normal(size=(500, 4))
    bm = BinMapper(max_bins=31).fit(X)
    g = rng.normal(size=(3, 500))
    assert sparse.root_histograms_by_class(bm.transform(X), bm.feature_offsets, g, g, np.arange(4)) is None


@pytest.mark.parametrize("colsample", [1.0, 0.6])
def test_the_engine_grows_the_same_multiclass_trees_with_its_roots_built_together_or_alone(rng, colsample,
                                                                                           monkeypatch):
    from fedgrove.engine import gbdt

    n = 3000
    X = (rng.random((n, 30)) < 0.1).astype(float)
    X[:, 0] = rng.normal(size=n)
    score = X[:, 0] + X[:, 1:6].sum(axis=1) - X[:, 6:9].sum(axis=1)
    y = np.digitize(score, [0.0, 0.7, 1.5]).astype(float)
    params = GBDTParams("multiclass", n_classes=4, n_estimators=6, max_depth=5, colsample_bytree=colsample,
                        n_threads=2)
    calls = []
    batched = gbdt.root_histograms_by_class

    def counted(*args):
        out = batched(*args)
        calls.append(out is not None)
        return out

    monkeypatch.setattr(gbdt, "root_histograms_by_class", counted)
    together = train_gbdt(params, X, y)
    assert calls == [True] * 6                     # every round's roots were built together
    monkeypatch.setattr(gbdt, "root_histograms_by_class", lambda *args: None)
    alone = train_gbdt(params, X, y)
    assert len(together.trees) == len(alone.trees) == 24
    for a, b in zip(together.trees, alone.trees):
        for field in a.nodes.dtype.names:
            np.testing.assert_array_equal(a.nodes[field], b.nodes[field])
        np.testing.assert_array_equal(a.values, b.values)
