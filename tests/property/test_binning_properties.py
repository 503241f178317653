"""Property tests (hypothesis) of the binning invariants."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fedgrove.engine.binning import BinMapper, QuantileSketch


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=2, max_size=300), st.integers(2, 255))
def test_bin_codes_agree_with_raw_thresholds(values, max_bins):
    # code <= b  <=>  x <= threshold(b): binned and raw prediction route alike
    x = np.array(values)[:, None]
    bm = BinMapper(max_bins=max_bins).fit(x)
    codes = bm.transform(x)[:, 0]
    ub = bm.bin_upper_bounds(0)
    assert codes.max() < bm.n_value_bins[0]
    for b in range(bm.n_value_bins[0]):
        np.testing.assert_array_equal(codes <= b, x[:, 0] <= ub[b])


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(-20, 20), min_size=1, max_size=200), st.integers(1, 199))
def test_sketch_merge_is_order_independent(values, cut):
    # small-cardinality sketches are exact, so any split of the data merges to the same summary
    x = np.array(values, dtype=float)
    cut = min(cut, len(x))
    a = QuantileSketch.from_column(x[:cut]).merge(QuantileSketch.from_column(x[cut:]))
    b = QuantileSketch.from_column(x[cut:]).merge(QuantileSketch.from_column(x[:cut]))
    whole = QuantileSketch.from_column(x)
    for s in (a, b):
        np.testing.assert_array_equal(s.values, whole.values)
        np.testing.assert_array_equal(s.weights, whole.weights)
