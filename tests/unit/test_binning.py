import numpy as np
import pytest

from fedgrove.engine.binning import _FEW_DISTINCT, BinMapper, QuantileSketch, _few_distinct, column_major
from fedgrove.exceptions import InvalidParameterError


def test_sketch_is_exact_and_mergeable_for_few_distinct_values(rng):
    # below max_size a sketch is (distinct values, counts); merging parts equals sketching the whole
    x = rng.integers(0, 50, size=10_000).astype(float)
    whole = QuantileSketch.from_column(x)
    merged = QuantileSketch.from_column(x[:3000]).merge(QuantileSketch.from_column(x[3000:]))
    np.testing.assert_array_equal(whole.values, merged.values)
    np.testing.assert_array_equal(whole.weights, merged.weights)
    assert whole.total_weight == 10_000


def test_merged_sketch_quantiles_are_close_to_exact(rng):
    # large columns: cut points from merged party sketches have small rank error
    x = rng.normal(size=200_000)
    parts = np.array_split(x, 4)
    sk = QuantileSketch.from_column(parts[0])
    for p in parts[1:]:
        sk = sk.merge(QuantileSketch.from_column(p))
    assert sk.values.size <= sk.max_size
    cuts = sk.cut_points(64)
    ranks = np.searchsorted(np.sort(x), cuts) / x.size
    expected = np.arange(1, 64) / 64
    assert np.abs(ranks - expected).max() < 0.01


def test_missing_and_constant_features():
    X = np.array([[1.0, 5.0], [np.nan, 5.0], [3.0, 5.0], [2.0, np.nan]])
    bm = BinMapper(max_bins=16).fit(X)
    assert list(bm.n_value_bins) == [3, 1]
    Xb = bm.transform(X)
    assert Xb[1, 0] == bm.missing_codes[0] and Xb[3, 1] == bm.missing_codes[1]
    assert set(Xb[[0, 1, 2], 1]) <= {0, 1} and Xb[0, 1] == 0  # the constant feature has one value bin


def test_max_bins_is_validated():
    with pytest.raises(InvalidParameterError, match="max_bins"):
        BinMapper(max_bins=300)
    with pytest.raises(InvalidParameterError, match="max_bins"):
        BinMapper(max_bins=1)


def test_sketches_of_parties_give_common_cut_points(rng):
    # a horizontal federation: parties share sketches, not values, and agree on the cut points
    X = rng.normal(size=(5000, 3))
    a, b = BinMapper(subsample=None), BinMapper(subsample=None)
    merged = [sa.merge(sb) for sa, sb in zip(a.sketches(X[:2000]), b.sketches(X[2000:]))]
    common = BinMapper().fit_sketches(merged)
    again = BinMapper().fit_sketches([sb.merge(sa) for sa, sb in zip(a.sketches(X[:2000]), b.sketches(X[2000:]))])
    for c1, c2 in zip(common.cuts_, again.cuts_):
        np.testing.assert_array_equal(c1, c2)
    assert all(len(c) == 254 for c in common.cuts_)


def test_cut_points_dict_is_reused_while_the_cuts_keep_their_content():
    # a model's checkpoint after every tree holds its BinMapper: one dict (and JSON text) while nothing changes,
    # a new one when a cut point does
    import json

    X = np.random.default_rng(0).normal(size=(500, 3))
    bm = BinMapper(16).fit(X)
    first = bm.to_dict()
    assert bm.to_dict() is first
    assert json.loads(json.dumps(first)) == {"max_bins": 16, "cuts": [c.tolist() for c in bm.cuts_]}
    bm.cuts_[1][0] -= 1.0
    second = bm.to_dict()
    assert second is not first and second["cuts"][1][0] == first["cuts"][1][0] - 1.0
    assert BinMapper.from_dict(json.loads(json.dumps(second))).to_dict() == second


@pytest.mark.parametrize("lo, hi", [(1e308, 1.7e308), (-1.7e308, -1e308), (5e-324, 1e-323),
                                    (1.0, float(np.nextafter(1.0, 2.0))), (-1.7e308, 1.7e308)])
def test_a_cut_parts_neighbouring_values_at_the_ends_of_the_float_range(lo, hi):
    # (lo + hi) / 2 overflowed to infinity above 9e307 (a warning, and a cut that parted nothing) and can round up
    # to hi between neighbouring floats (the subnormals 5e-324 and 1e-323 shared a bin): the engine could not
    # split a feature that separates the labels perfectly
    from fedgrove.engine.gbdt import GBDTParams, train_gbdt

    X = np.column_stack([np.tile([lo, hi], 50), np.zeros(100)])
    y = np.tile([0.0, 1.0], 50)
    cuts = BinMapper(8).fit(X).cuts_[0]
    assert len(cuts) == 1 and lo <= cuts[0] < hi
    with np.errstate(over="raise"):
        model = train_gbdt(GBDTParams(n_estimators=2, max_depth=1), X, y)
    assert (model.predict(X) == y).all()


@pytest.mark.parametrize("layout", ["C", "F", "strided"])
@pytest.mark.parametrize("weighted", [False, True])
def test_sketches_of_a_table_are_each_columns_own_sketch(layout, weighted):
    # the table's columns are sketched in blocks (sorted together, their runs counted by a kernel) since a wide
    # table's column-by-column reading was slow: every sketch must be the one its column gives alone, across
    # blocks, with missing values, ties, all-missing and constant columns, compressed and exact sketches
    rng = np.random.default_rng(5)
    X = rng.normal(size=(700, 2 * 150 + 1))
    X[:, 1::3] = np.round(X[:, 1::3] * 3)  # ties
    X[rng.random(X.shape) < 0.15] = np.nan
    X[:, 7] = np.nan
    X[:, 70] = 2.5
    X[:, 131] = np.where(rng.random(700) < 0.5, -0.0, 0.0)
    # columns of few distinct values are counted in one pass (up to _FEW_DISTINCT of them), the others sorted:
    # exactly 32, a 33rd met only in the last row, a 33rd met after the first 32 rows, two values and missing
    X[:, 200] = rng.permutation(np.arange(700) % 32) * 0.5 - 3.0
    X[:, 202] = np.append(rng.permutation(np.arange(699) % 32), 40.0)
    X[:, 204] = np.append(np.arange(32.0), rng.integers(0, 33, 668))
    X[:, 206] = np.where(rng.random(700) < 0.2, np.nan, rng.integers(0, 2, 700) * 7.0)
    if layout == "F":
        X = np.asfortranarray(X)
    elif layout == "strided":
        X = X[:, ::2]
    w = rng.integers(0, 3, len(X)).astype(float) if weighted else None
    for size in (2048, 50):  # exact (at most 700 distinct values), and compressed
        got = BinMapper(subsample=None, sketch_size=size).sketches(X, w)
        assert len(got) == X.shape[1]
        for j, sketch in enumerate(got):
            alone = QuantileSketch.from_column(X[:, j], size, w)
            assert sketch.max_size == size
            assert sketch.values.dtype == alone.values.dtype and sketch.weights.dtype == alone.weights.dtype
            assert np.array_equal(sketch.values, alone.values) and np.array_equal(sketch.weights, alone.weights), j
    n_distinct = _few_distinct(X, _FEW_DISTINCT)[2]
    distinct = np.array([len(np.unique(col[~np.isnan(col)])) for col in X.T])
    assert np.array_equal(n_distinct, np.where(distinct <= _FEW_DISTINCT, distinct, -1))
    assert (n_distinct == _FEW_DISTINCT).any() and ((distinct == _FEW_DISTINCT + 1) & (n_distinct == -1)).any()
    assert BinMapper().sketches(np.zeros((0, 3))) and BinMapper().sketches(np.zeros((4, 0))) == []


@pytest.mark.parametrize("shape", [(0, 5), (5, 0), (1, 1), (63, 65), (130, 200), (1000, 3)])
def test_column_major_is_numpys_column_major_copy(shape):
    rng = np.random.default_rng(shape[0])
    X = rng.integers(0, 256, shape).astype(np.uint8)
    for given in (X, np.asfortranarray(X), X[::2], X[:, 1:]):  # row-major (tiled), column-major, views
        got = column_major(given)
        assert got.flags.f_contiguous and got.dtype == given.dtype and np.array_equal(got, given)
    assert np.shares_memory(column_major(X), X) == np.shares_memory(np.asfortranarray(X), X)  # a copy as numpy's


@pytest.mark.parametrize("order", ["C", "F"])
def test_bin_codes_are_searchsorted_of_the_cuts_with_nan_last(rng, order):
    # the codes are found for 8 values of a feature in lock step, in blocks of 256 rows: every row count around
    # those sizes, constant and all-missing features, few distinct values, values equal to a cut
    n = 256 * 3 + 13
    X = rng.normal(size=(n, 6))
    X[rng.random(X.shape) < 0.05] = np.nan
    X[:, 1] = 2.0                       # constant: no cuts
    X[::5, 1] = np.nan
    X[:, 2] = np.nan                    # all missing
    X[:, 3] = rng.integers(0, 4, n)     # few values: each value equal to a cut or above all
    bm = BinMapper(max_bins=32).fit(X)
    X[:40, 0] = bm.cuts_[0][rng.integers(0, len(bm.cuts_[0]), 40)]  # values on the cuts
    for rows in (n, 256, 255, 8, 7, 1, 0):
        part = np.array(X[:rows], order=order)
        codes = bm.transform(part)
        expected = np.stack([np.where(np.isnan(part[:, j]), len(c) + 1, np.searchsorted(c, part[:, j], side="left"))
                             for j, c in enumerate(bm.cuts_)], axis=1).reshape(rows, X.shape[1])
        np.testing.assert_array_equal(codes, expected)
    assert [len(c) for c in bm.cuts_][1:3] == [0, 0]
