"""The grower's protocol seams: layer-by-layer growth, frontier hand-off, pluggable split finders."""

import numpy as np
import pytest

from fedgrove.engine.binning import BinMapper
from fedgrove.engine.grower import Layer, LayerSplits, TreeGrower
from fedgrove.engine.splitter import GBDTScorer, HistogramSplitFinder
from fedgrove.engine.tree import PackedEnsemble
from fedgrove.exceptions import ModelFormatError
from tests.conftest import make_classification


def _finder(X, y, cls=HistogramSplitFinder, **kw):
    bm = BinMapper().fit(X)
    Xb = bm.transform(X)
    g = 0.5 - y
    stats = np.column_stack([g, np.full(len(y), 0.25), np.ones(len(y))])
    thresholds = [bm.bin_upper_bounds(f) for f in range(X.shape[1])]
    return cls(Xb, bm.feature_offsets, bm.missing_codes, thresholds, stats, GBDTScorer(min_samples_leaf=5), **kw)


def test_layer_by_layer_growth_equals_full_growth_and_exposes_node_samples():
    X, y = make_classification(3000, missing=0.05)
    scorer = GBDTScorer(min_samples_leaf=5)
    full = TreeGrower(_finder(X, y), 6, scorer.leaf_value).grow()
    finder = _finder(X, y)
    grower = TreeGrower(finder, 6, scorer.leaf_value)
    grower.start()
    for _ in range(3):
        grower.grow_layer()
    frontier = grower.frontier
    assert frontier.depth == 3 and len(frontier) > 0
    # the frontier's sample sets are disjoint and their sizes match the node statistics
    sets = [finder.node_samples(n) for n in frontier.node_ids]
    assert sum(len(s) for s in sets) == len(np.unique(np.concatenate(sets)))
    np.testing.assert_array_equal([len(s) for s in sets], frontier.stats[:, 2])
    while not grower.done:
        grower.grow_layer()
    part = grower.finish()
    for name in part.nodes.dtype.names:  # field by field: NaN thresholds of leaves compare equal
        np.testing.assert_array_equal(part.nodes[name], full.nodes[name])
    np.testing.assert_array_equal(part.values, full.values)


class _RemoteThresholds(HistogramSplitFinder):
    """A finder as another party would see it: splits chosen here, thresholds stay with their owner."""

    def find_splits(self, layer):
        splits = super().find_splits(layer)
        splits.threshold[:] = np.nan
        splits.owner[splits.feature >= 0] = 1
        return splits


def test_a_plugged_finder_drives_the_same_grower():
    X, y = make_classification(2000)
    scorer = GBDTScorer(min_samples_leaf=5)
    local = TreeGrower(_finder(X, y), 4, scorer.leaf_value).grow()
    remote = TreeGrower(_finder(X, y, _RemoteThresholds), 4, scorer.leaf_value).grow()
    internal = ~remote.is_leaf
    np.testing.assert_array_equal(remote.nodes["feature"], local.nodes["feature"])
    np.testing.assert_array_equal(remote.nodes["bin"], local.nodes["bin"])
    assert np.isnan(remote.nodes["threshold"][internal]).all() and (remote.nodes["owner"][internal] == 1).all()
    # binned routing still works; raw routing needs the owner's thresholds
    bm = BinMapper().fit(X)
    np.testing.assert_array_equal(PackedEnsemble([remote]).leaves_binned(bm.transform(X), bm.missing_codes),
                                  PackedEnsemble([local]).leaves(X))
    with pytest.raises(ModelFormatError, match="another party"):
        PackedEnsemble([remote]).leaves(X)


def test_pure_nodes_are_leaves_without_a_search():
    # CART: a node holding one class cannot gain from a split, so it gets no histogram and no search
    from fedgrove.engine.forest import ForestParams, draw_tree, grow_forest_tree

    r = np.random.default_rng(0)
    X = r.normal(size=(400, 3))
    y = (X[:, 0] > 0.5).astype(float)  # the first split separates the classes completely
    bm = BinMapper().fit(X)
    params = ForestParams(n_estimators=1, max_features=None, bootstrap=False)
    searched = []
    original = HistogramSplitFinder.find_splits

    def spy(self, layer):
        searched.append(len(layer))
        return original(self, layer)

    HistogramSplitFinder.find_splits = spy
    try:
        tree = grow_forest_tree(params, draw_tree(params, 0, 400, 3), bm.transform(X), y, bm,
                                [bm.bin_upper_bounds(f) for f in range(3)], 2)
    finally:
        HistogramSplitFinder.find_splits = original
    assert searched == [1] and tree.n_leaves == 2


def test_flat_thresholds_match_the_per_feature_lists_and_refuse_a_bin_out_of_range():
    X, _ = make_classification(500, missing=0.05)
    bm = BinMapper(max_bins=16).fit(X)
    table = bm.thresholds()
    rng = np.random.default_rng(0)
    features = rng.integers(0, X.shape[1], 200)
    bins = np.array([rng.integers(0, len(bm.bin_upper_bounds(f))) for f in features])
    expected = [bm.bin_upper_bounds(f)[b] for f, b in zip(features, bins)]
    np.testing.assert_array_equal(table.lookup(features, bins), expected)
    assert [list(t) for t in table] == [list(bm.bin_upper_bounds(f)) for f in range(X.shape[1])]
    last = len(bm.bin_upper_bounds(3))
    with pytest.raises(IndexError, match=f"bin {last} out of range for feature 3"):
        table.lookup([3], [last])
    # a layer's thresholds (one kernel): the same values, NaN where a node has no split, the same refusals
    no_split = rng.random(200) < 0.3
    at = table.at_splits(np.where(no_split, -1, features).astype(np.int32), bins.astype(np.int32))
    np.testing.assert_array_equal(at[~no_split], np.asarray(expected)[~no_split])
    assert np.isnan(at[no_split]).all()
    with pytest.raises(IndexError, match=f"bin {last} out of range for feature 3"):
        table.at_splits([0, 3], [0, last])
    with pytest.raises(IndexError, match="bin -1 out of range for feature 3"):
        table.at_splits([3], [-1])
    with pytest.raises(IndexError, match=f"feature {X.shape[1]} out of range"):
        table.at_splits([X.shape[1]], [0])


def test_a_tree_is_the_same_from_threshold_lists_or_the_flat_table():
    X, y = make_classification(2000, missing=0.05)
    scorer = GBDTScorer(min_samples_leaf=5)
    from_lists = TreeGrower(_finder(X, y), 6, scorer.leaf_value).grow()
    finder = _finder(X, y)
    finder.thresholds = BinMapper().fit(X).thresholds()
    from_table = TreeGrower(finder, 6, scorer.leaf_value).grow()
    assert (from_lists.nodes["feature"] >= 0).sum() > 10
    assert from_lists.nodes.tobytes() == from_table.nodes.tobytes()  # leaves' thresholds are NaN
    np.testing.assert_array_equal(from_lists.values, from_table.values)


def test_node_segments_answer_membership_and_lookup_for_grown_nodes_only():
    X, y = make_classification(2000)
    scorer = GBDTScorer(min_samples_leaf=5)
    finder = _finder(X, y)
    tree = TreeGrower(finder, 3, scorer.leaf_value).grow()
    for node in range(tree.n_nodes):
        assert node in finder.segments
        start, end, _ = finder.segments[node]
        assert end - start == tree.nodes["count"][node] == len(finder.node_samples(node))
    for missing in (tree.n_nodes, 10 ** 6, -1):
        assert missing not in finder.segments
        with pytest.raises(KeyError):
            finder.segments[missing]


def test_splitting_by_given_masks_refuses_masks_that_do_not_fit_the_nodes():
    X, y = make_classification(500)
    finder = _finder(X, y)
    finder.root_stats()
    layer = Layer(np.array([0], dtype=np.int64), np.zeros((1, 1)), 0)
    with pytest.raises(ValueError, match="mask for node 0 has 499 entries, the node has 500 samples"):
        finder.partition_by_masks([0], [np.ones(499, dtype=bool)])
    with pytest.raises(ValueError, match="1 masks for 2 nodes"):
        finder.partition_by_masks([0, 1], [np.ones(500, dtype=bool)])
    with pytest.raises(KeyError):
        finder.partition_by_masks([7], [np.ones(500, dtype=bool)])
    left = X[:, 0] <= np.median(X[:, 0])
    finder.apply_splits(layer, np.array([0]), LayerSplits.empty(1, 1), np.array([[1, 2]]),
                        masks=[left[finder.node_samples(0)]])
    assert sorted(finder.node_samples(1).tolist()) == np.nonzero(left)[0].tolist()
    assert sorted(finder.node_samples(2).tolist()) == np.nonzero(~left)[0].tolist()


def test_a_grown_tree_leaves_no_reference_cycle_holding_the_finders_buffers():
    # boosting makes a finder per tree and class; one kept alive by a cycle holds its sample buffers and
    # histograms until the garbage collector runs (kddcup99's 2,300 trees took 3 GB that way)
    import gc
    import weakref

    X, y = make_classification(1000)
    scorer = GBDTScorer(min_samples_leaf=5)
    gc.disable()
    try:
        finder = _finder(X, y)
        TreeGrower(finder, 4, scorer.leaf_value).grow()
        assert 0 in finder.segments
        alive = weakref.ref(finder)
        del finder
        assert alive() is None
    finally:
        gc.enable()


@pytest.mark.parametrize("n_stats", [2, 3])
def test_the_missing_direction_kernel_decides_and_moves_sums_as_the_numpy_steps(n_stats):
    # the engine resolves a layer's missing directions in one kernel; a protocol's arrays of other types take the
    # numpy steps: both must leave the same bits (empty missing bins, bins of 1e-15 hessians judged empty, ties
    # of the children's hessians, splits the scan sent the other way, nodes without a split)
    from fedgrove.engine.grower import Layer, LayerSplits
    from fedgrove.engine.splitter import resolve_missing_direction

    rng = np.random.default_rng(3)
    n, offsets = 400, np.array([0, 5, 9, 16], dtype=np.int32)
    hist = rng.normal(size=(n, 16, 2))
    hist[..., 1] = np.abs(hist[..., 1])
    node = np.abs(rng.normal(size=(n, n_stats))) * 10
    feature = rng.integers(-1, 3, n).astype(np.int32)
    miss = offsets[np.maximum(feature, 0) + 1] - 1
    empty = rng.random(n) < 0.6
    hist[np.arange(n)[empty], miss[empty], :] = 0.0
    tiny = empty & (rng.random(n) < 0.3)  # saturated rows: gradients of 1, hessians all but 0
    hist[np.arange(n)[tiny], miss[tiny], 0] = rng.choice([-1.0, 2.0], tiny.sum())
    hist[np.arange(n)[tiny], miss[tiny], 1] = 1e-15
    left = rng.random((n, n_stats)) * node
    tie = rng.random(n) < 0.2
    left[tie, 1] = node[tie, 1] / 2
    scorer = GBDTScorer(reg_lambda=1.0)
    assert not scorer.hist_needs_count

    def resolved(hist_in):
        splits = LayerSplits(rng.normal(size=n), feature.copy(), np.zeros(n, dtype=np.int32),
                             np.random.default_rng(4).random(n) < 0.5, left.copy(), np.full(n, np.nan),
                             np.full(n, -1, dtype=np.int32))
        resolve_missing_direction(splits, Layer(np.arange(n), node.copy(), 2), hist_in, offsets, scorer)
        return splits

    from fedgrove.engine.splitter import _kernel_ready

    # arrays as the engine has them go to the kernel; a layout it is not compiled for goes the numpy way
    probe, layer = resolved(hist), Layer(np.arange(n), node.copy(), 2)
    assert _kernel_ready(probe, layer, hist) and not _kernel_ready(probe, layer, np.asfortranarray(hist))
    kernel = resolved(hist)
    numpy_steps = resolved(np.asfortranarray(hist))  # not C-contiguous: the numpy steps
    assert np.array_equal(kernel.missing_left, numpy_steps.missing_left)
    assert np.array_equal(kernel.left_stats, numpy_steps.left_stats)
    before = np.random.default_rng(4).random(n) < 0.5
    assert (kernel.missing_left != before).sum() > 20  # directions were changed
    assert not np.array_equal(kernel.left_stats, left)  # and sums moved
