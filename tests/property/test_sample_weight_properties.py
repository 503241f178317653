"""Property test (hypothesis): a boosting model trained with whole-number weights is the model trained on that
many copies of each row, whatever the data, objective and settings."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fedgrove.engine.gbdt import GBDTParams, train_gbdt


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(5, 250), d=st.integers(1, 6),
       objective=st.sampled_from(["binary", "multiclass", "regression"]), max_bins=st.sampled_from([2, 7, 255]),
       missing=st.sampled_from([0.0, 0.2]), distinct=st.sampled_from([3, 1000]), depth=st.integers(1, 5),
       min_child_weight=st.sampled_from([1e-3, 0.5, 3.0]), colsample=st.sampled_from([1.0, 0.5]),
       reg_lambda=st.sampled_from([0.0, 1.0]), max_weight=st.integers(1, 5))
def test_whole_number_weights_are_copies(seed, n, d, objective, max_bins, missing, distinct, depth,
                                         min_child_weight, colsample, reg_lambda, max_weight):
    r = np.random.default_rng(seed)
    X = r.integers(0, distinct, (n, d)) / distinct + r.normal(size=(n, d)) * (distinct > 3)
    X[r.random((n, d)) < missing] = np.nan
    signal = np.nan_to_num(X[:, 0]) + 0.5 * r.normal(size=n)
    y = {"binary": (signal > np.median(signal)) * 1.0, "multiclass": np.digitize(signal, np.quantile(signal, [.3, .7])),
         "regression": signal * 3}[objective].astype(float)
    w = r.integers(0, max_weight + 1, n)
    w[r.integers(n)] = max(1, w.max())  # some row has a positive weight
    params = GBDTParams(objective, n_estimators=5, max_depth=depth, max_bins=max_bins, learning_rate=0.3,
                        min_child_weight=min_child_weight, colsample_bytree=colsample, reg_lambda=reg_lambda,
                        n_classes=3 if objective == "multiclass" else None, seed=seed % 1000)
    weighted = train_gbdt(params, X, y, sample_weight=w)
    copies = train_gbdt(params, np.repeat(X, w, axis=0), np.repeat(y, w))
    assert [c.tolist() for c in weighted.bin_mapper.cuts_] == [c.tolist() for c in copies.bin_mapper.cuts_]
    for a, b in zip(weighted.trees, copies.trees):
        np.testing.assert_array_equal(a.nodes["feature"], b.nodes["feature"])
        np.testing.assert_array_equal(a.nodes["threshold"], b.nodes["threshold"])
    np.testing.assert_allclose(weighted.predict_raw(X), copies.predict_raw(X), rtol=1e-8, atol=1e-9)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(5, 200), d=st.integers(1, 5),
       task=st.sampled_from(["classification", "regression"]), bootstrap=st.booleans(),
       sampling=st.sampled_from(["node", "tree"]), scale=st.sampled_from([1e-3, 1.0, 7.0]))
def test_a_forests_zero_weights_remove_rows_and_a_common_factor_changes_nothing(seed, n, d, task, bootstrap,
                                                                               sampling, scale):
    from fedgrove.engine.forest import ForestParams, train_forest

    r = np.random.default_rng(seed)
    X = r.normal(size=(n, d))
    y = (X[:, 0] > 0) * 1.0 if task == "classification" else X[:, 0] * 2 + r.normal(size=n)
    keep = r.random(n) < 0.7
    keep[0] = True
    if task == "classification":
        keep[np.argmax(y)] = True  # the largest class stays, so both forests have the same classes
    params = ForestParams(task, n_estimators=3, max_depth=4, bootstrap=bootstrap, feature_sampling=sampling,
                          seed=seed % 1000)
    a = train_forest(params, X, y, sample_weight=keep * scale)
    b = train_forest(params, X[keep], y[keep])
    # (probabilities: a class vote tied at 1/2 falls either way when a weight of 1 is 1 only to rounding)
    out = (lambda m: m.predict_proba(X)) if task == "classification" else (lambda m: m.predict(X))
    np.testing.assert_allclose(out(a), out(b), rtol=1e-9, atol=1e-12)
    if task == "classification":  # uneven weights sum exactly too: no class keeps a residue of rounding
        proba = train_forest(params, X, y, sample_weight=r.uniform(0.01, 10, n) ** 2 * keep).predict_proba(X)
        assert proba.min() >= 0 and not ((proba > 0) & (proba < 1e-12)).any()
