"""GBDT against LightGBM as an oracle, and the engine's own contracts.

Like scikit-learn's test_compare_lightgbm: both libraries get the same
pre-binned data (our bin codes, fewer distinct values than LightGBM's bins),
so any difference comes from the boosting itself.  LightGBM keeps gradients in
float32, so near-tied candidates in tiny nodes can go either way; leaves of at
least 20 samples (both libraries) keep the comparison about the algorithm.
"""

import re

import lightgbm as lgb
import numpy as np
import pytest

from fedgrove.engine.binning import BinMapper
from fedgrove.engine.gbdt import GBDTParams, train_gbdt
from fedgrove.engine.tree import PackedEnsemble
from tests.conftest import make_classification


MIN_LEAF = 20


def _lgb(objective, Xb, y, n_estimators, depth, n_classes=None, base_zero=False, weight=None, min_leaf=MIN_LEAF,
         min_hessian=1e-3):
    params = dict(objective=objective, num_leaves=2 ** depth, max_depth=depth, learning_rate=0.1, max_bin=256,
                  min_data_in_bin=1, lambda_l2=1.0, min_sum_hessian_in_leaf=min_hessian, min_data_in_leaf=min_leaf,
                  num_threads=1, verbose=-1, deterministic=True, boost_from_average=not base_zero,
                  feature_pre_filter=False)
    if n_classes:
        params["num_class"] = n_classes
    return lgb.train(params, lgb.Dataset(Xb.astype(np.float64), y, weight=weight), num_boost_round=n_estimators)


def test_binary_matches_lightgbm_on_a9a(a9a):
    X, y = a9a.train.X[:20000], a9a.train.y[:20000]
    bm = BinMapper().fit(X)
    Xb = bm.transform(X)
    params = GBDTParams("binary", n_estimators=10, max_depth=5, min_samples_leaf=MIN_LEAF)
    ours = train_gbdt(params, Xb.astype(float), y)
    theirs = _lgb("binary", Xb, y, 10, 5)
    Xt = bm.transform(a9a.test.X).astype(float)
    p_ours, p_lgb = ours.predict_raw(Xt), theirs.predict(Xt, raw_score=True)
    assert np.median(np.abs(p_ours - p_lgb)) < 1e-3
    assert np.mean(np.abs(p_ours - p_lgb)) < 0.01
    assert np.mean((p_ours > 0) == (p_lgb > 0)) > 0.99


def test_weighted_binary_matches_lightgbms_weighted_fit_on_a9a(a9a):
    # the same bins (pre-binned codes), LightGBM's weights: weighted gradients, hessians and starting score.
    # One row a leaf at least: LightGBM's min_data_in_leaf estimates a weighted leaf's rows from its hessians
    X, y = a9a.train.X[:20000], a9a.train.y[:20000]
    bm = BinMapper().fit(X)
    Xb = bm.transform(X)
    w = np.random.default_rng(0).uniform(0.2, 5.0, len(y)) * np.where(y == 1, 2.0, 1.0)
    params = GBDTParams("binary", n_estimators=10, max_depth=5, min_samples_leaf=1, min_child_weight=1.0)
    ours = train_gbdt(params, Xb.astype(float), y, sample_weight=w)
    theirs = _lgb("binary", Xb, y, 10, 5, weight=w, min_leaf=1, min_hessian=1.0)
    Xt = bm.transform(a9a.test.X).astype(float)
    p_ours, p_lgb = ours.predict_raw(Xt), theirs.predict(Xt, raw_score=True)
    assert np.median(np.abs(p_ours - p_lgb)) < 1e-3
    assert np.mean(np.abs(p_ours - p_lgb)) < 0.01
    assert np.mean((p_ours > 0) == (p_lgb > 0)) > 0.99
    unweighted = train_gbdt(params, Xb.astype(float), y).predict_raw(Xt)
    assert np.mean(np.abs(unweighted - p_lgb)) > 0.1  # (the weights matter: without them it is another model)


def test_multiclass_matches_lightgbm_on_waveform(waveform):
    X, y = waveform.train.X, waveform.train.y
    Xb = BinMapper(max_bins=63).fit_transform(X).astype(float)
    params = GBDTParams("multiclass", n_estimators=10, max_depth=4, base_score=0.0, min_samples_leaf=MIN_LEAF)
    ours = train_gbdt(params, Xb, y)
    theirs = _lgb("multiclass", Xb, y, 10, 4, n_classes=3, base_zero=True)
    p_ours, p_lgb = ours.predict_proba(Xb), theirs.predict(Xb)
    assert np.mean(np.abs(p_ours - p_lgb)) < 0.01
    assert np.mean(p_ours.argmax(1) == p_lgb.argmax(1)) > 0.98


def test_regression_matches_lightgbm():
    r = np.random.default_rng(3)
    X = r.normal(size=(4000, 8))
    y = X[:, 0] * 3 + np.sin(3 * X[:, 1]) + X[:, 2] * X[:, 3] + 0.1 * r.normal(size=4000)
    Xb = BinMapper(max_bins=63).fit_transform(X).astype(float)
    ours = train_gbdt(GBDTParams("regression", n_estimators=10, max_depth=5, min_samples_leaf=MIN_LEAF), Xb, y)
    theirs = _lgb("regression", Xb, y, 10, 5)
    p_ours, p_lgb = ours.predict(Xb), theirs.predict(Xb)
    assert np.mean(np.isclose(p_ours, p_lgb, rtol=1e-3, atol=1e-3)) > 0.95
    rmse = lambda p: np.sqrt(np.mean((p - y) ** 2))  # noqa: E731
    assert abs(rmse(p_ours) - rmse(p_lgb)) < 0.005 * rmse(p_lgb)


def test_same_seed_same_model_with_subsampling():
    X, y = make_classification(3000)
    p = GBDTParams(n_estimators=8, max_depth=4, subsample=0.7, colsample_bytree=0.5, seed=7)
    a, b = train_gbdt(p, X, y), train_gbdt(p, X, y)
    c = train_gbdt(GBDTParams(n_estimators=8, max_depth=4, subsample=0.7, colsample_bytree=0.5, seed=8), X, y)
    np.testing.assert_array_equal(a.predict_raw(X), b.predict_raw(X))
    assert not np.array_equal(a.predict_raw(X), c.predict_raw(X))


def test_a_subsample_is_not_reordered_by_the_trees_grown_on_it():
    # the splitter partitioned its rows in the caller's array: a multiclass round's subsample came reordered to
    # its next class's tree (the same rows, summed in another order), and a federation that sends the sample
    # to its parties in sorted order could not match it
    from fedgrove.engine.binning import BinMapper
    from fedgrove.engine.grower import TreeGrower
    from fedgrove.engine.splitter import GBDTScorer, HistogramSplitFinder

    X, y = make_classification(600)
    bm = BinMapper(32).fit(X)
    rows = np.sort(np.random.default_rng(0).choice(600, 300, replace=False))
    kept = rows.copy()
    scorer = GBDTScorer(1.0, 0.0, 1e-3, 1)
    finder = HistogramSplitFinder(bm.transform(X), bm.feature_offsets, bm.missing_codes, bm.thresholds(),
                                  np.column_stack([y - 0.5, np.full(600, 0.25)]), scorer, root_samples=rows)
    assert TreeGrower(finder, 4, scorer.leaf_value).grow().n_nodes > 3
    np.testing.assert_array_equal(rows, kept)


def _finder(X, bm, stats, **kw):
    from fedgrove.engine.splitter import GBDTScorer, HistogramSplitFinder

    return HistogramSplitFinder(bm.transform(X), bm.feature_offsets, bm.missing_codes, bm.thresholds(), stats,
                                GBDTScorer(1.0, 0.0, 1e-3, 1), **kw)


@pytest.mark.parametrize("subsample", [False, True])
def test_finders_reusing_buffers_grow_the_trees_fresh_buffers_grow(subsample):
    # the engine's trees share one FinderBuffers: each finder must start from its own rows and statistics,
    # whatever the last one left in them, and leave the caller's rows as they were
    from fedgrove.engine.grower import TreeGrower
    from fedgrove.engine.splitter import FinderBuffers

    X, y = make_classification(2000, missing=0.05)
    bm = BinMapper(64).fit(X)
    rng = np.random.default_rng(1)
    buffers = FinderBuffers(2000, 2)
    for _ in range(3):
        stats = np.column_stack([y - rng.random(2000), rng.random(2000) + 0.1])
        rows = np.sort(rng.choice(2000, 1200, replace=False)) if subsample else None
        kept = None if rows is None else rows.copy()
        fresh = TreeGrower(_finder(X, bm, stats, root_samples=rows), 5, lambda s: -s[:, 0] / (s[:, 1] + 1)).grow()
        reused_finder = _finder(X, bm, stats, root_samples=rows, buffers=buffers)
        reused = TreeGrower(reused_finder, 5, lambda s: -s[:, 0] / (s[:, 1] + 1)).grow()
        assert fresh.n_nodes > 7
        for field in fresh.nodes.dtype.names:
            np.testing.assert_array_equal(fresh.nodes[field], reused.nodes[field])
        np.testing.assert_array_equal(fresh.values, reused.values)
        if rows is not None:
            np.testing.assert_array_equal(rows, kept)
        # the finder grew in the shared buffers, not in arrays of its own
        assert np.shares_memory(reused_finder._indices[0], buffers.indices[0])


@pytest.mark.parametrize("n_stats", [2, 3])
def test_statistics_written_into_the_buffers_grow_the_tree_a_separate_array_grows(n_stats):
    # the engine writes a tree's statistics (every row, in order) straight into the buffers it grows in, and the
    # finder does not copy them; (g, h, 1) when row counts are needed
    from fedgrove.engine.grower import TreeGrower
    from fedgrove.engine.histogram import fill_stats
    from fedgrove.engine.splitter import FinderBuffers

    X, y = make_classification(2000, missing=0.05)
    bm = BinMapper(64).fit(X)
    rng = np.random.default_rng(2)
    buffers = FinderBuffers(2000, n_stats)
    for _ in range(2):
        g, h = y - rng.random(2000), rng.random(2000) + 0.1
        separate = np.column_stack([g, h, np.ones(2000)][:n_stats])
        fresh = TreeGrower(_finder(X, bm, separate), 5, lambda s: -s[:, 0] / (s[:, 1] + 1)).grow()
        fill_stats(buffers.root_stats(), g, h)
        np.testing.assert_array_equal(buffers.root_stats(), separate)
        in_place = TreeGrower(_finder(X, bm, buffers.root_stats(), buffers=buffers), 5,
                              lambda s: -s[:, 0] / (s[:, 1] + 1)).grow()
        assert fresh.n_nodes > 7
        for field in fresh.nodes.dtype.names:
            np.testing.assert_array_equal(fresh.nodes[field], in_place.nodes[field])
        np.testing.assert_array_equal(fresh.values, in_place.values)


@pytest.mark.parametrize("min_samples_leaf", [1, 5])
def test_a_local_grower_grows_tree_after_tree_as_a_fresh_one_grows_each(min_samples_leaf):
    # SimFL's and TFL's parties grow every tree in one LocalGrower's buffers, on every row (written straight into
    # them) or on a subsample, one after the other
    from fedgrove.engine.gbdt import LocalGrower

    X, y = make_classification(1500, missing=0.05)
    p = GBDTParams(max_depth=5, min_samples_leaf=min_samples_leaf)
    rng = np.random.default_rng(4)
    bm = BinMapper(p.max_bins).fit(X)
    reused = LocalGrower(X, p, bm)
    for rows in (None, np.sort(rng.choice(1500, 900, replace=False)), None):
        g, h = y - rng.random(1500), rng.random(1500) + 0.1
        a, finder = reused.grow(g, h, rows)
        b = LocalGrower(X, p, bm).grow(g, h, rows)[0]
        assert a.n_nodes > 7
        for field in a.nodes.dtype.names:
            np.testing.assert_array_equal(a.nodes[field], b.nodes[field])
        np.testing.assert_array_equal(a.values, b.values)
        assert np.shares_memory(finder._indices[0], reused.buffers.indices[0])


def test_buffers_too_small_for_a_tree_are_refused():
    from fedgrove.engine.splitter import FinderBuffers

    X, y = make_classification(300)
    bm = BinMapper(16).fit(X)
    stats = np.column_stack([y - 0.5, np.full(300, 0.25)])
    with pytest.raises(ValueError, match="FinderBuffers for 200 rows of 2 statistics cannot hold a tree on 300"):
        _finder(X, bm, stats, buffers=FinderBuffers(200, 2))
    with pytest.raises(ValueError, match="with 3 statistics"):
        _finder(X, bm, np.column_stack([stats, np.ones(300)]), buffers=FinderBuffers(300, 2))


@pytest.mark.parametrize("objective, k", [("binary", 1), ("multiclass", 4), ("regression", 1)])
def test_gradients_written_into_given_arrays_equal_fresh_ones(objective, k):
    from fedgrove.engine.losses import objective_for

    rng = np.random.default_rng(3)
    y = rng.integers(0, 4 if objective == "multiclass" else 2, 500).astype(float)
    obj = objective_for(objective, 4 if objective == "multiclass" else None, y)
    raw_by_class = rng.normal(size=(k, 500))
    g, h = obj.gradients_by_class(y, raw_by_class)
    out = (np.full((k, 500), np.nan), np.full((k, 500), np.nan))
    got = obj.gradients_by_class(y, raw_by_class, out=out)
    assert got[0] is out[0] and got[1] is out[1]
    np.testing.assert_array_equal(out[0], g)
    np.testing.assert_array_equal(out[1], h)
    wanted = rf"out must be two writable C-contiguous float64 arrays of shape \({k}, 500\)"
    with pytest.raises(ValueError, match=wanted):
        obj.gradients_by_class(y, raw_by_class, out=(np.empty((k, 499)), np.empty((k, 500))))


def test_early_stopping_truncates_to_best_iteration():
    X, y = make_classification(4000, seed=1)
    Xv, yv = make_classification(2000, seed=2)
    m = train_gbdt(GBDTParams(n_estimators=400, max_depth=6, learning_rate=0.5, early_stopping_rounds=5), X, y,
                   eval_set=(Xv, yv))
    assert m.best_iteration is not None and m.n_rounds == m.best_iteration + 1 < 400


def test_leaf_indices_reconstruct_raw_margins():
    X, y = make_classification(1000, missing=0.05)
    m = train_gbdt(GBDTParams(n_estimators=6, max_depth=3), X, y)
    leaves = m.predict_leaf(X)
    assert leaves.shape == (1000, 6)
    raw = m.base_score[0] + sum(m.trees[t].values[leaves[:, t], 0] for t in range(6))
    np.testing.assert_allclose(raw, m.predict_raw(X))
    assert all(m.trees[t].is_leaf[leaves[:, t]].all() for t in range(6))


def test_missing_values_learn_a_direction():
    r = np.random.default_rng(0)
    X = r.normal(size=(3000, 2))
    y = (X[:, 0] > 0).astype(float)
    X[y == 1, 1] = np.nan  # missingness alone predicts the label
    X[:, 0] = r.normal(size=3000)
    m = train_gbdt(GBDTParams(n_estimators=5, max_depth=2), X, y)
    assert np.mean(m.predict(X) == y) > 0.99


def test_rows_of_a_missing_bin_judged_empty_take_their_sums_to_the_child_they_go_to():
    # saturated predictions give rows g = +-1 and h ~ 1e-15: a missing bin holding only such rows reads as empty by
    # its hessian, and its rows go to the child with the larger hessian sum, not where the scan put them (left,
    # here: their g = +1 pulls that way).  The children's statistics, and so their leaf values, were the scan's:
    # -1.45 and 0.2 here for rows whose own values are -0.45 and -0.467 (found by the random lossless cases, seed
    # 35, where the vertical protocol's histograms of the actual rows then disagreed with the engine's)
    from fedgrove.engine.grower import TreeGrower
    from fedgrove.engine.splitter import GBDTScorer, HistogramSplitFinder

    X = np.array([[0.0], [0.0], [1.0], [1.0], [1.0], [np.nan], [np.nan]])
    g = np.array([0.5, 0.4, -0.3, -0.2, -0.1, 1.0, 1.0])
    h = np.array([1.0, 1.0, 1.0, 1.0, 1.0, 1e-15, 1e-15])
    bm = BinMapper(16).fit(X)
    finder = HistogramSplitFinder(bm.transform(X), bm.feature_offsets, bm.missing_codes, bm.thresholds(),
                                  np.column_stack([g, h]), GBDTScorer(0.0, 0.0, 1e-3, 1))
    tree = TreeGrower(finder, 1, lambda s: -s[..., 0] / s[..., 1]).grow()
    assert tree.nodes["feature"][0] == 0 and not tree.nodes["missing_left"][0]  # to the larger child
    for leaf in np.nonzero(tree.is_leaf)[0]:
        rows = finder.node_samples(leaf)
        np.testing.assert_allclose(tree.values[leaf, 0], -g[rows].sum() / h[rows].sum(), rtol=1e-12)
    assert sorted(finder.node_samples(tree.nodes["right"][0]).tolist()) == [2, 3, 4, 5, 6]


def test_training_raw_scores_equal_prediction():
    # the in-training update from node segments equals predicting the trees afterwards
    X, y = make_classification(2000, missing=0.1)
    bm = BinMapper().fit(X)
    m = train_gbdt(GBDTParams(n_estimators=4, max_depth=4), X, y, bin_mapper=bm)
    leaves = PackedEnsemble(m.trees).leaves_binned(bm.transform(X), bm.missing_codes)
    np.testing.assert_allclose(m.raw_from_leaves(leaves), m.predict_raw(X))


@pytest.mark.parametrize("objective, n_classes", [("binary", None), ("multiclass", 4), ("regression", None)])
def test_raw_scores_add_tree_by_tree(objective, n_classes):
    # the kernel adds each tree's leaf value in tree order, as adding one tree at a time does: bit for bit
    X, y = make_classification(1500, missing=0.05)
    if objective == "multiclass":
        y = (np.abs(np.nan_to_num(X[:, 0]) * 3).astype(int) % 4).astype(float)
    m = train_gbdt(GBDTParams(objective, n_classes=n_classes, n_estimators=6, max_depth=3), X, y)
    leaves = PackedEnsemble(m.trees).leaves(X)
    for n_rounds in (None, 2):
        n_trees = len(m.trees) if n_rounds is None else n_rounds * m.n_outputs
        want = np.tile(m.base_score, (len(X), 1))
        for t in range(n_trees):
            want[:, m.tree_class[t]] += m.trees[t].values[leaves[:, t], 0]
        got = m.raw_from_leaves(leaves, n_rounds)
        assert np.array_equal(got.reshape(len(X), -1), want)
        # predicting routes and adds in one pass, without the leaf matrix: the same scores
        assert np.array_equal(m.predict_raw(X, n_rounds).reshape(len(X), -1), want)


def test_raw_from_leaves_refuses_a_leaf_outside_its_tree():
    X, y = make_classification(300)
    m = train_gbdt(GBDTParams(n_estimators=3, max_depth=2), X, y)
    leaves = PackedEnsemble(m.trees).leaves(X)
    leaves[17, 1] = m.trees[1].n_nodes
    with pytest.raises(ValueError, match=f"leaf {m.trees[1].n_nodes} of sample 17 is outside tree 1"):
        m.raw_from_leaves(leaves)
    with pytest.raises(ValueError, match="one column per tree"):
        m.raw_from_leaves(leaves[:, :2])


def test_bad_parameters_name_the_value():
    from fedgrove.exceptions import InvalidParameterError

    with pytest.raises(InvalidParameterError, match="learning_rate must be > 0, got -1"):
        GBDTParams(learning_rate=-1)
    with pytest.raises(InvalidParameterError, match="objective must be one of"):
        GBDTParams(objective="poisson")
    # NaN passed every bound (min_child_weight NaN grew no split); infinity gave NaN scores
    for name in ("learning_rate", "reg_lambda", "gamma", "min_child_weight"):
        for bad in (float("nan"), float("inf")):
            with pytest.raises(InvalidParameterError, match=f"{name} must be a finite number, got {bad}"):
                GBDTParams(**{name: bad})


def test_early_stopping_without_an_eval_set_is_refused():
    from fedgrove.exceptions import InvalidParameterError

    X, y = make_classification(100)
    with pytest.raises(InvalidParameterError, match="early_stopping_rounds=2 watches a validation set"):
        train_gbdt(GBDTParams(n_estimators=5, early_stopping_rounds=2), X, y)  # it trained every round
    with pytest.raises(InvalidParameterError, match="eval_set must be a pair .* XGBoost's list of pairs"):
        train_gbdt(GBDTParams(n_estimators=5), X, y, eval_set=[(X, y)])


def test_labels_of_two_columns_are_refused():
    from fedgrove.exceptions import DataError

    X, y = make_classification(100)
    # flattened, one-hot labels read as twice the rows ("X has 100 rows but y has 200")
    with pytest.raises(DataError, match=r"got shape \(100, 2\); one-hot labels are y.argmax\(axis=1\)"):
        train_gbdt(GBDTParams(n_estimators=2), X, np.eye(2)[y.astype(int)])
    with pytest.raises(DataError, match=r"got shape \(1, 100\); one row of labels is y.reshape\(-1\)"):
        train_gbdt(GBDTParams(n_estimators=2), X, y[None, :])
    assert train_gbdt(GBDTParams(n_estimators=2), X, y[:, None]).n_trees == 2


def test_regression_labels_too_large_for_float64_sums_are_refused():
    from fedgrove.engine.forest import ForestParams, train_forest
    from fedgrove.exceptions import DataError

    X, _ = make_classification(200)
    y = X[:, 0] * 1e160  # GBDT's gains were NaN (no split, a RuntimeWarning); the forest raised OverflowError
    with pytest.raises(DataError, match=r"regression labels spread over .* rows would overflow .* divide the label"):
        train_gbdt(GBDTParams(objective="regression", n_estimators=2), X, y)
    with pytest.raises(DataError, match=r"from the middle of their range overflow the squared sums of 200 rows"):
        train_forest(ForestParams(task="regression", n_estimators=2), X, y)
    m = train_gbdt(GBDTParams(objective="regression", n_estimators=20), X, X[:, 0] * 1e140)  # still in range
    assert np.corrcoef(m.predict(X), X[:, 0])[0, 1] > 0.9


def test_regression_labels_too_close_together_are_warned_of(caplog):
    # a GBDT's split search's tie tolerance is absolute below gains of 1e-3: labels of spread 1e-5 gave a fit of
    # R^2 0.57 where the same labels times 2^20 gave 0.9976 (bench/label_scale.py), without a word; a forest's
    # fit does not depend on the labels' scale (test_forest: ..._equivariant_...), so it says nothing
    import logging

    from fedgrove.engine.forest import ForestParams, train_forest

    X, _ = make_classification(200)
    small = X[:, 0] * 1e-6
    with caplog.at_level(logging.WARNING, logger="fedgrove"):
        train_gbdt(GBDTParams(objective="regression", n_estimators=2), X, small, eval_set=(X, small))
        train_forest(ForestParams(task="regression", n_estimators=2), X, small)
        train_gbdt(GBDTParams(objective="regression", n_estimators=2), X, X[:, 0])
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1, said  # once for the GBDT, not for its evaluation set, the forest nor labels of spread ~5
    assert all(re.match(r"regression labels spread over only \d\.\d+e-06: .* multiply the label by 1e6", m)
               for m in said), said


def test_numpy_numbers_in_the_settings_are_python_numbers():
    # a search grid's np.int64 reached JSON (FV-tree's ledger: "Object of type int64 is not JSON serializable")
    # or was refused (LSHParams n_bins: "must be an integer")
    import json

    from fedgrove.protocols.fvtree.party import FVTreeOptions
    from fedgrove.protocols.simfl.lsh import LSHParams

    for settings in (GBDTParams(n_estimators=np.int64(3), learning_rate=np.float32(0.5), subsample=np.float64(1)),
                     FVTreeOptions(n_candidates=np.int64(2), threshold=np.float64(1.0), verify=np.bool_(True)),
                     LSHParams(n_hashes=np.int64(5), r=np.float32(4.0), n_bins=np.int64(64))):
        values = vars(settings)
        assert not any(isinstance(v, np.generic) for v in values.values()), values
        json.dumps({k: v for k, v in values.items() if not hasattr(v, "__dataclass_fields__")})


def test_pandas_nullable_columns_read_their_na_as_missing():
    # a DataFrame of Int64/Float64/boolean columns was refused: "X holds <NA>, not a number (NaN for missing...)"
    import pandas as pd

    df = pd.DataFrame({"a": pd.array([1, None, 3, 4] * 25, dtype="Int64"),
                       "b": pd.array([0.5, 1.5, None, 2.0] * 25, dtype="Float64"),
                       "c": pd.array([True, False, None, True] * 25, dtype="boolean")})
    y = pd.Series(pd.array([0, 1, 0, 1] * 25, dtype="Int64"))
    m = train_gbdt(GBDTParams(n_estimators=3), df, y)
    X = df.to_numpy(dtype=np.float64, na_value=np.nan)
    np.testing.assert_array_equal(m.predict_raw(df), train_gbdt(GBDTParams(n_estimators=3), X, y.to_numpy(
        dtype=np.float64)).predict_raw(X))


def test_labels_in_a_categorical_series_and_complex_features(tmp_path):
    # a Series of category dtype holding the class codes trains as its codes' numbers; complex features are
    # refused (float64 dropped their imaginary parts without a word)
    import pandas as pd

    from fedgrove.exceptions import DataError

    X, y = make_classification(100)
    codes = pd.Series(pd.Categorical(y.astype(int)))
    np.testing.assert_array_equal(train_gbdt(GBDTParams(n_estimators=2), X, codes).predict_raw(X),
                                  train_gbdt(GBDTParams(n_estimators=2), X, y).predict_raw(X))
    with pytest.raises(DataError, match="X holds complex numbers, expected real ones"):
        train_gbdt(GBDTParams(n_estimators=2), X + 1j, y)
    with pytest.raises(DataError, match="X holds complex numbers"):
        train_gbdt(GBDTParams(n_estimators=2), pd.DataFrame({"a": X[:, 0] + 1j, "b": X[:, 1]}), y)


def test_no_rows_give_no_predictions():
    X, y = make_classification(100)
    for params in (GBDTParams(objective="binary", n_estimators=2), GBDTParams(objective="multiclass", n_classes=3,
                                                                               n_estimators=2)):
        m = train_gbdt(params, X, y if params.objective == "binary" else np.arange(100) % 3)
        k = 2 if params.objective == "binary" else 3
        assert m.predict_proba(X[:0]).shape == (0, k)  # a reshape to (0, -1) raised ValueError
        assert m.predict(X[:0]).shape == (0,)


def test_arguments_in_the_wrong_order_and_undefined_metrics_are_named():
    from fedgrove import metrics
    from fedgrove.engine.forest import train_forest
    from fedgrove.exceptions import DataError, InvalidParameterError
    from fedgrove.runner.roles import test_scores

    X, y = make_classification(100)
    # train_gbdt(X, y, params) said "X must be a non-empty 2-D array, got shape (100,)" about y
    with pytest.raises(InvalidParameterError, match=r"params must be a GBDTParams, got ndarray"):
        train_gbdt(X, y, GBDTParams())
    with pytest.raises(InvalidParameterError, match=r"params must be a ForestParams, got GBDTParams"):
        train_forest(GBDTParams(), X, y)
    # AUC and AUPRC of one class were NaN and 0 behind a scikit-learn warning
    one = np.zeros(20)
    assert not metrics.ranks_defined(one) and metrics.ranks_defined(y)
    for f in (metrics.auc, metrics.auprc):
        with pytest.raises(DataError, match=r"undefined for labels that hold only the class 0\.0: it needs both"):
            f(one, np.linspace(0, 1, 20))
    with pytest.raises(DataError, match=r"eval_metric 'auc' needs both classes in eval_set's labels, which hold "
                                        r"only \[0\.0\]"):
        train_gbdt(GBDTParams(n_estimators=2, eval_metric="auc"), X, y, eval_set=(X[:20], one))
    proba = np.column_stack([np.full(20, 0.4), np.full(20, 0.6)])
    assert test_scores(proba, one, True) == {"test_accuracy": 0.0}  # a party's statistics leave AUC out
    assert set(test_scores(proba, np.arange(20) % 2, True)) == {"test_accuracy", "test_auc"}


def test_binary_labels_are_checked():
    from fedgrove.exceptions import DataError

    X, y = make_classification(100)
    with pytest.raises(DataError, match="labels 0/1"):
        train_gbdt(GBDTParams(n_estimators=1), X, y + 1)
    y[3] = np.nan
    with pytest.raises(DataError, match="NaN"):
        train_gbdt(GBDTParams(n_estimators=1), X, y)


def test_a_class_count_that_looks_like_a_quantity_is_warned_about(caplog):
    # labels 0, 50, 99 make 100 classes (a tree each per round): probably a quantity, not classes
    import logging

    from fedgrove.engine.forest import ForestParams, train_forest

    X, y = make_classification(90)
    with caplog.at_level(logging.WARNING, logger="fedgrove"):
        train_gbdt(GBDTParams(objective="multiclass", n_estimators=1, max_depth=2), X, y * 3)  # 0, 3: 4 classes
        assert not caplog.records
        y = np.array([0.0, 50.0, 99.0])[np.arange(90) % 3]
        model = train_gbdt(GBDTParams(objective="multiclass", n_estimators=1, max_depth=2), X, y)
        train_forest(ForestParams(n_estimators=1, max_depth=2), X, y)
    assert model.n_classes == 100 and len(caplog.records) == 2
    assert all("100 classes, from the largest label 99 (3 distinct values in 90 rows)" in r.getMessage()
               and "if the label is a quantity, train for regression" in r.getMessage() for r in caplog.records)


@pytest.mark.slow
def test_full_size_a9a_metric_within_0002_of_lightgbm(a9a):
    # the benchmark's setting (100 trees, depth 8) on raw features, each library binning its own way
    from fedgrove import metrics

    X, y, Xt, yt = a9a.train.X, a9a.train.y, a9a.test.X, a9a.test.y
    ours = train_gbdt(GBDTParams("binary", n_estimators=100, max_depth=8), X, y)
    theirs = lgb.train(dict(objective="binary", num_leaves=256, max_depth=8, learning_rate=0.1, lambda_l2=1.0,
                            min_data_in_leaf=1, min_sum_hessian_in_leaf=1e-3, verbose=-1, num_threads=2),
                       lgb.Dataset(X, y), 100)
    assert abs(metrics.auc(yt, ours.predict_proba(Xt)) - metrics.auc(yt, theirs.predict(Xt))) < 0.002


def test_gamma_is_compared_with_half_the_gain_that_lightgbm_uses():
    # one feature, two values; with base score 0 the squared-error gradients are -y and the hessians 1:
    # the root split's gain is 1/2 [n^2/(n+1) + n^2/(n+1)] = 100/11 = 9.09 for n = 10 (LightGBM's: 18.18)
    X = np.repeat([0.0, 1.0], 10).reshape(-1, 1)
    y = np.repeat([-1.0, 1.0], 10)

    def n_nodes(gamma):
        p = GBDTParams(objective="regression", n_estimators=1, learning_rate=1.0, max_depth=1, reg_lambda=1.0,
                       gamma=gamma, min_child_weight=0.0, base_score=0.0)
        return train_gbdt(p, X, y).trees[0].n_nodes

    def lgb_leaves(min_gain):
        m = lgb.LGBMRegressor(n_estimators=1, learning_rate=1.0, max_depth=1, num_leaves=2, reg_lambda=1.0,
                              min_split_gain=min_gain, min_child_samples=1, min_child_weight=0.0,
                              boost_from_average=False, verbose=-1).fit(X, y)
        return m.booster_.dump_model()["tree_info"][0]["num_leaves"]

    assert (n_nodes(9.0), n_nodes(9.2)) == (3, 1)
    assert (lgb_leaves(18.0), lgb_leaves(18.4)) == (2, 1)


def test_a_dataframe_with_timestamps_trains_and_predicts_as_the_loader_reads_it():
    # train_gbdt refused a DataFrame's timestamps ("X holds Timestamp(...), not a number") that load_table
    # reads as seconds since 1970-01-01 UTC: both now read them alike
    import pandas as pd

    from fedgrove.data.io import table_from_frame

    r = np.random.default_rng(0)
    df = pd.DataFrame({"when": pd.Timestamp("2020-01-01") + pd.to_timedelta(r.integers(0, 1000, 300), unit="D"),
                       "took": pd.to_timedelta(r.integers(0, 60, 300), unit="s"), "x": r.normal(size=300)})
    y = (df["when"] > pd.Timestamp("2021-01-01")).to_numpy().astype(int)
    model = train_gbdt(GBDTParams(objective="binary", n_estimators=5), df, y)
    X = table_from_frame(df).X
    assert X[0, 0] == (df["when"][0] - pd.Timestamp("1970-01-01")).total_seconds()
    np.testing.assert_array_equal(model.predict_proba(df), model.predict_proba(X))
    assert (model.predict(df) == y).mean() > 0.95


def test_pandas_rows_that_do_not_line_up_are_refused_and_a_reset_index_is_positional():
    # X and y are matched by position: a y shuffled on its own (its index a permutation of X's) trained on
    # misaligned labels without a word; a y given reset_index(drop=True) is read by position, as numpy's
    import pandas as pd

    from fedgrove.exceptions import DataError
    from fedgrove.engine.model import check_row_labels

    r = np.random.default_rng(0)
    X = pd.DataFrame(r.normal(size=(200, 3)), columns=["a", "b", "c"], index=r.permutation(400)[:200])
    y = pd.Series((X["a"] > 0).astype(int), index=X.index)
    params = GBDTParams(n_estimators=2, max_depth=2)
    train_gbdt(params, X, y)
    train_gbdt(params, X, y.reset_index(drop=True))
    for bad in (y.sample(frac=1, random_state=1), y.set_axis(X.index + 1000)):
        with pytest.raises(DataError, match=r"y and X are pandas objects with different row labels \(index\): rows "
                                            r"are matched by position.*y.loc\[X.index\]"):
            train_gbdt(params, X, bad)
    with pytest.raises(DataError, match=r"X_parts\[1\] and X_parts\[0\]"):
        check_row_labels({"X_parts[0]": X, "X_parts[1]": X.sample(frac=1, random_state=2)})
