"""Sample weights in the engine: a boosting weight of k trains as k copies of the row, a weight of 0 as its
removal; a forest leaves out the rows of weight 0 and weights the others' bootstrap draws; bad weights are
refused by name."""

import numpy as np
import pytest

from fedgrove.engine.binning import BinMapper, QuantileSketch
from fedgrove.engine.forest import ForestParams, train_forest
from fedgrove.engine.gbdt import GBDTParams, train_gbdt
from fedgrove.exceptions import DataError, InvalidParameterError
from tests.conftest import make_classification


def _splits(model):
    """Every tree's features, thresholds and leaf layout: the models' shape, without the leaf values' last bits."""
    return [(t.nodes["feature"].tolist(), np.nan_to_num(t.nodes["threshold"], nan=np.inf).tolist())
            for t in model.trees]


def _data(objective, n=500, seed=0):
    X, y = make_classification(n, 6, seed=seed, missing=0.05)
    if objective == "multiclass":
        y = y + (X[:, 3] > 0.4)
    elif objective == "regression":
        y = np.nan_to_num(X[:, 0]) * 2 + np.nan_to_num(X[:, 1]) ** 2
    return X, y


@pytest.mark.parametrize("objective", ["binary", "multiclass", "regression"])
def test_a_whole_number_weight_is_that_many_copies_of_the_row(objective):
    # 500 rows of continuous values: more distinct values than bins, so the cut points are weighted quantiles
    X, y = _data(objective)
    w = np.random.default_rng(1).integers(0, 4, len(y))
    params = GBDTParams(objective, n_estimators=12, max_depth=4, max_bins=32, min_child_weight=0.5)
    weighted = train_gbdt(params, X, y, sample_weight=w)
    copies = train_gbdt(params, np.repeat(X, w, axis=0), np.repeat(y, w))
    assert [c.tolist() for c in weighted.bin_mapper.cuts_] == [c.tolist() for c in copies.bin_mapper.cuts_]
    np.testing.assert_allclose(weighted.base_score, copies.base_score, rtol=1e-12)
    assert _splits(weighted) == _splits(copies)
    np.testing.assert_allclose(weighted.predict_raw(X), copies.predict_raw(X), rtol=1e-9, atol=1e-12)
    # and the weights change the model: unweighted, it is another one
    assert _splits(train_gbdt(params, X, y)) != _splits(weighted)


def test_a_weight_of_zero_removes_the_row_and_ones_change_nothing():
    X, y = _data("binary")
    params = GBDTParams(n_estimators=8, max_depth=4, subsample=0.7, colsample_bytree=0.8, seed=4)
    keep = np.random.default_rng(2).random(len(y)) < 0.8
    a = train_gbdt(params, X, y, sample_weight=keep.astype(float))
    b = train_gbdt(params, X[keep], y[keep])
    np.testing.assert_array_equal(a.predict_raw(X), b.predict_raw(X))
    np.testing.assert_array_equal(train_gbdt(params, X, y, sample_weight=np.ones(len(y))).predict_raw(X),
                                  train_gbdt(params, X, y).predict_raw(X))


def test_weights_move_the_base_score_and_the_fit_towards_heavy_rows():
    X, y = _data("binary")
    w = np.where(y == 1, 5.0, 1.0)
    model = train_gbdt(GBDTParams(n_estimators=5, max_depth=3), X, y, sample_weight=w)
    p = w[y == 1].sum() / w.sum()
    np.testing.assert_allclose(model.base_score, [np.log(p / (1 - p))])
    plain = train_gbdt(GBDTParams(n_estimators=5, max_depth=3), X, y)
    assert model.predict_proba(X)[:, 1].mean() > plain.predict_proba(X)[:, 1].mean() + 0.1


def test_the_class_count_comes_from_every_label_kept_or_not():
    X, y = _data("multiclass")
    w = (y != 2).astype(float)  # class 2 has no weight: still a class of the model
    model = train_gbdt(GBDTParams("multiclass", n_estimators=3, max_depth=3), X, y, sample_weight=w)
    assert model.n_classes == 3 and model.predict_proba(X).shape == (len(y), 3)
    assert model.predict_proba(X)[:, 2].max() < 0.01


def test_a_weighted_sketch_is_the_sketch_of_the_copies():
    col = np.array([3.0, np.nan, 1.0, 2.0, 1.0, 5.0])
    w = np.array([2.0, 7.0, 1.0, 0.0, 3.0, 0.5])
    s = QuantileSketch.from_column(col, weights=w)
    assert s.values.tolist() == [1.0, 3.0, 5.0] and s.weights.tolist() == [4.0, 2.0, 0.5]
    rows = np.random.default_rng(0).normal(size=(3000, 2))
    counts = np.random.default_rng(1).integers(0, 3, 3000)
    weighted = BinMapper(16).fit(rows, counts.astype(float))
    copies = BinMapper(16).fit(np.repeat(rows, counts, axis=0))
    assert [c.tolist() for c in weighted.cuts_] == [c.tolist() for c in copies.cuts_]


@pytest.mark.parametrize("task", ["classification", "regression"])
def test_a_forest_leaves_out_zero_weights_and_is_unchanged_by_a_common_factor(task):
    X, y = _data("binary" if task == "classification" else "regression", n=300)
    params = ForestParams(task, n_estimators=6, max_depth=6, seed=3)
    keep = np.random.default_rng(5).random(len(y)) < 0.7
    a = train_forest(params, X, y, sample_weight=keep * 1.0)
    b = train_forest(params, X[keep], y[keep])
    np.testing.assert_array_equal(a.predict(X), b.predict(X))
    # weights are rescaled to average 1: 0.01 each (a user's normalised weights) grows the unweighted forest
    np.testing.assert_allclose(train_forest(params, X, y, sample_weight=np.full(len(y), 0.01)).predict(X),
                               train_forest(params, X, y).predict(X), rtol=1e-9, atol=1e-12)
    # a weight below 2^-52 of the bootstraps' total is 0 on the forest's grid: the row is left out as one of
    # weight 0 is, of the draws and of the weights' average (whose rescaling is what the forest grows with)
    tiny = np.where(keep, 1.0, 1e-300)
    assert np.array_equal(train_forest(params, X, y, sample_weight=tiny).predict(X), a.predict(X))


def test_a_forests_leaves_follow_the_weights():
    X, y = _data("binary", n=300)
    params = ForestParams(n_estimators=10, max_depth=2, seed=1)
    w = np.where(y == 1, 4.0, 1.0)
    heavy = train_forest(params, X, y, sample_weight=w).predict_proba(X)[:, 1].mean()
    assert heavy > train_forest(params, X, y).predict_proba(X)[:, 1].mean() + 0.1


@pytest.mark.parametrize("bad, message", [
    (np.ones(7), r"one weight per row of X, shape \(300,\), got shape \(7,\)"),
    (np.ones((300, 2)), r"shape \(300,\), got shape \(300, 2\)"),
    (np.r_[np.ones(299), -1.0], r"finite and non-negative, got -1.0 in row 299"),
    (np.r_[np.nan, np.ones(299)], r"finite and non-negative, got nan in row 0"),
    (np.zeros(300), r"zero in all 300 rows"),
    (np.full(300, 1e307), r"sum overflows"),
    (np.array(["a"] * 300), r"sample_weight .*'a'"),
])
def test_bad_weights_are_refused_by_name(bad, message):
    X, y = _data("binary", n=300)
    with pytest.raises(DataError, match=message):
        train_gbdt(GBDTParams(n_estimators=2), X, y, sample_weight=bad)
    with pytest.raises(DataError, match=message):
        train_forest(ForestParams(n_estimators=2), X, y, sample_weight=bad)


def test_heavy_weights_that_would_overflow_the_regression_sums_are_refused():
    X, y = _data("regression", n=300)
    with pytest.raises(DataError, match=r"over .* summed weights would overflow"):
        train_gbdt(GBDTParams("regression", n_estimators=2), X, y * 1e140, sample_weight=np.full(300, 1e12))


def test_a_column_of_weights_and_a_list_are_taken():
    X, y = _data("binary", n=300)
    params = GBDTParams(n_estimators=3)
    w = np.random.default_rng(0).random(300)
    ref = train_gbdt(params, X, y, sample_weight=w).predict_raw(X)
    np.testing.assert_array_equal(train_gbdt(params, X, y, sample_weight=w[:, None]).predict_raw(X), ref)
    np.testing.assert_array_equal(train_gbdt(params, X, y, sample_weight=w.tolist()).predict_raw(X), ref)


def test_a_series_of_weights_must_line_up_with_the_rows():
    import pandas as pd

    X, y = _data("binary", n=300)
    frame = pd.DataFrame(X, index=np.arange(300) + 1000)
    w = pd.Series(np.linspace(0.5, 2, 300), index=frame.index[::-1])  # the same rows, in the other order
    with pytest.raises(DataError, match=r"sample_weight and X are pandas objects with different row labels"):
        train_gbdt(GBDTParams(n_estimators=2), frame, y, sample_weight=w)
    with pytest.raises(DataError, match=r"sample_weight and X are pandas objects with different row labels"):
        train_forest(ForestParams(n_estimators=2), frame, y, sample_weight=w)
    aligned = train_gbdt(GBDTParams(n_estimators=2), frame, y, sample_weight=w.loc[frame.index])
    np.testing.assert_array_equal(aligned.predict_raw(X), train_gbdt(GBDTParams(n_estimators=2), X, y,
                                                                     sample_weight=w.to_numpy()[::-1]).predict_raw(X))


def _eval_trace(params, X, y, eval_set, eval_sample_weight=None):
    scores = []
    model = train_gbdt(params, X, y, eval_set=eval_set, eval_sample_weight=eval_sample_weight,
                       callbacks=[lambda env: scores.append(env.eval_result)])
    return model, scores


@pytest.mark.parametrize("objective, metric", [("binary", "logloss"), ("binary", "auc"), ("binary", "error"),
                                               ("regression", "rmse")])
def test_validation_weights_of_zero_and_one_score_the_rows_of_one(objective, metric):
    X, y = _data(objective, n=700)
    fit, val = slice(0, 400), slice(400, 700)
    mask = np.random.default_rng(3).random(300) < 0.6
    params = GBDTParams(objective, n_estimators=40, max_depth=3, learning_rate=0.5, eval_metric=metric,
                        early_stopping_rounds=3)
    a, sa = _eval_trace(params, X[fit], y[fit], (X[val], y[val]), mask * 1.0)
    b, sb = _eval_trace(params, X[fit], y[fit], (X[val][mask], y[val][mask]))
    np.testing.assert_allclose(sa, sb, rtol=1e-12)
    assert a.best_iteration == b.best_iteration
    unweighted = _eval_trace(params, X[fit], y[fit], (X[val], y[val]))[1]
    assert not np.allclose(unweighted[: len(sa)], sa[: len(unweighted)])


def test_the_weighted_validation_metric_is_scikit_learns():
    from sklearn.metrics import log_loss

    X, y = _data("binary", n=600)
    w = np.random.default_rng(4).uniform(0, 3, 200)
    model, scores = _eval_trace(GBDTParams(n_estimators=5, max_depth=3), X[:400], y[:400], (X[400:], y[400:]), w)
    assert scores[-1] == pytest.approx(log_loss(y[400:], model.predict_proba(X[400:]), sample_weight=w), rel=1e-12)


def test_ranking_scores_need_both_classes_among_the_rows_of_positive_weight():
    # AUC and AUPRC with weights that leave one class: scikit-learn gave NaN with a warning; now refused as the
    # unweighted ones are
    from fedgrove import metrics

    y, score = np.array([0, 1, 1]), np.array([0.1, 0.5, 0.9])
    assert metrics.ranks_defined(y) and not metrics.ranks_defined(y, [0, 1, 2])
    for name, f in (("AUC", metrics.auc), ("AUPRC", metrics.auprc)):
        with pytest.raises(DataError, match=rf"{name} is undefined for labels that hold only the class 1 in the rows "
                                            r"of positive weight"):
            f(y, score, sample_weight=np.array([0.0, 1.0, 2.0]))
    assert metrics.auc(y, score, sample_weight=np.array([1.0, 1.0, 0.0])) == 1.0


def test_bad_validation_weights_are_refused_by_name():
    X, y = _data("binary", n=300)
    params = GBDTParams(n_estimators=2, eval_metric="auc")
    with pytest.raises(InvalidParameterError, match=r"eval_sample_weight weighs eval_set's rows: give eval_set"):
        train_gbdt(params, X, y, eval_sample_weight=np.ones(10))
    with pytest.raises(DataError, match=r"eval_sample_weight must hold one weight per row of eval_set's X, shape "
                                        r"\(100,\), got shape \(7,\)"):
        train_gbdt(params, X[:200], y[:200], eval_set=(X[200:], y[200:]), eval_sample_weight=np.ones(7))
    one_class = (y[200:] == 1) * 1.0
    with pytest.raises(DataError, match=r"'auc' needs both classes in eval_set's rows of positive weight, which "
                                        r"hold only \[1.0\]"):
        train_gbdt(params, X[:200], y[:200], eval_set=(X[200:], y[200:]), eval_sample_weight=one_class)
