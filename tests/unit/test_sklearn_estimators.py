"""The scikit-learn estimators: scikit-learn's own estimator checks, and a thin layer over the engine (the
same trees as train_gbdt / train_forest on the encoded labels, bit for bit)."""

import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from sklearn.model_selection import GridSearchCV, cross_val_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils.estimator_checks import parametrize_with_checks

from fedgrove.engine.forest import ForestParams, train_forest
from fedgrove.engine.gbdt import GBDTParams, train_gbdt
from fedgrove.engine.model import load_model
from fedgrove.exceptions import DataError, InvalidParameterError
from fedgrove.sklearn import GBDTClassifier, GBDTRegressor, RandomForestClassifier, RandomForestRegressor
from tests.conftest import make_classification


# few, shallow trees: the checks are about the estimator contract (fitted attributes, errors, invariances, a
# score above scikit-learn's bar on easy data), not about accuracy
def _expected_failures(estimator):
    """A forest's bootstrap draws rows, not copies of them, so a whole-number weight k is not k copies (as in
    scikit-learn's own forests, whose checks expect the same failure); the boosting estimators pass."""
    if isinstance(estimator, (RandomForestClassifier, RandomForestRegressor)):
        why = "the bootstrap draws rows, not copies: a weight of k is not k copies of the row"
        return {"check_sample_weight_equivalence_on_dense_data": why,
                "check_sample_weight_equivalence_on_sparse_data": why}
    return {}


@parametrize_with_checks([GBDTClassifier(n_estimators=8, max_depth=3, learning_rate=0.5),
                          GBDTRegressor(n_estimators=8, max_depth=3, learning_rate=0.5),
                          RandomForestClassifier(n_estimators=5, max_depth=6),
                          RandomForestRegressor(n_estimators=5, max_depth=6)],
                         expected_failed_checks=_expected_failures)
def test_passes_scikit_learns_estimator_checks(estimator, check):
    check(estimator)


def _three_classes(n=400, seed=0):
    X, y = make_classification(n, 6, seed=seed)
    y = y.astype(int) + (X[:, 2] > 0.5)  # 0, 1, 2
    return X, y


@pytest.mark.parametrize("n_classes", [2, 3])
def test_classifier_is_train_gbdt_on_encoded_labels(n_classes):
    # string labels in any order map to 0..K-1 by sorted class; the model is the engine's, bit for bit
    X, y = _three_classes() if n_classes == 3 else make_classification(400, 6, seed=1)
    names = np.array(["cat", "ant", "bee"])[: n_classes][y.astype(int)]
    est = GBDTClassifier(n_estimators=6, max_depth=4, seed=3).fit(X, names)
    objective = "multiclass" if n_classes == 3 else "binary"
    ref = train_gbdt(GBDTParams(objective, n_estimators=6, max_depth=4, seed=3,
                                n_classes=n_classes if n_classes == 3 else None),
                     X, np.searchsorted(np.sort(np.unique(names)), names))
    assert est.classes_.tolist() == sorted(set(names.tolist()))
    np.testing.assert_array_equal(est.predict_proba(X), ref.predict_proba(X))
    assert est.predict(X).tolist() == est.classes_[ref.predict(X)].tolist()
    np.testing.assert_array_equal(est.decision_function(X), ref.predict_raw(X))
    assert est.model_.classes == est.classes_.tolist()


def test_regressor_and_forests_are_the_engines_models():
    X, y = make_classification(300, 5, seed=2)
    target = X[:, 0] * 3 + X[:, 1] ** 2
    gbdt = GBDTRegressor(n_estimators=7, max_depth=3, reg_lambda=2.0, seed=1).fit(X, target)
    ref = train_gbdt(GBDTParams("regression", n_estimators=7, max_depth=3, reg_lambda=2.0, seed=1), X, target)
    np.testing.assert_array_equal(gbdt.predict(X), ref.predict(X))

    rf = RandomForestRegressor(n_estimators=4, max_depth=5, seed=4).fit(X, target)
    ref = train_forest(ForestParams("regression", n_estimators=4, max_depth=5, seed=4), X, target)
    np.testing.assert_array_equal(rf.predict(X), ref.predict(X))

    labels = np.where(y == 1, "yes", "no")
    rf = RandomForestClassifier(n_estimators=4, criterion="entropy", seed=5).fit(X, labels)
    ref = train_forest(ForestParams(n_estimators=4, criterion="entropy", seed=5), X, y)  # "no" < "yes"
    np.testing.assert_array_equal(rf.predict_proba(X), ref.predict_proba(X))
    assert set(rf.predict(X)) <= {"yes", "no"}


def test_feature_importances_are_gain_shares():
    X, y = make_classification(300, 5, seed=6)
    X[:, 4] = 0.0  # a constant column: never split on
    for est in (GBDTClassifier(n_estimators=5), RandomForestClassifier(n_estimators=5)):
        imp = est.fit(X, y).feature_importances_
        gain = est.model_.feature_importance("gain")
        assert imp.shape == (5,) and imp[4] == 0.0
        np.testing.assert_allclose(imp, gain / gain.sum())
        assert imp.sum() == pytest.approx(1.0)


def test_early_stopping_on_an_eval_set_with_class_names():
    X, y = make_classification(600, 6, seed=7)
    names = np.where(y == 1, "pos", "neg")
    est = GBDTClassifier(n_estimators=300, learning_rate=0.5, max_depth=6, early_stopping_rounds=5,
                         eval_metric="logloss")
    est.fit(X[:400], names[:400], eval_set=(X[400:], names[400:]))
    assert est.best_iteration_ is not None and est.best_iteration_ < 299
    assert est.model_.n_rounds == est.best_iteration_ + 1
    with pytest.raises(DataError, match=r"classes the training labels lack: \['maybe'\]"):
        est.fit(X[:400], names[:400], eval_set=(X[400:], np.where(y[400:] == 1, "maybe", "neg")))
    with pytest.raises(InvalidParameterError, match="eval_set must be a pair"):
        est.fit(X, names, eval_set=[(X, names)] * 3)
    with pytest.raises(InvalidParameterError, match="early_stopping_rounds=5 watches a validation set"):
        est.fit(X, names)
    # the regressor's validation labels are numbers
    target = X[:, 0] + 0.1 * X[:, 1]
    reg = GBDTRegressor(n_estimators=300, learning_rate=0.5, early_stopping_rounds=5)
    reg.fit(X[:400], target[:400], eval_set=(X[400:], target[400:]))
    assert reg.best_iteration_ is not None and reg.model_.n_rounds == reg.best_iteration_ + 1 < 300
    with pytest.raises(InvalidParameterError, match="eval_set must be a pair"):
        reg.fit(X, target, eval_set=X)


def test_bad_parameters_fail_at_fit_naming_the_value():
    X, y = make_classification(100, 3, seed=8)
    with pytest.raises(InvalidParameterError, match="max_depth"):
        GBDTClassifier(max_depth=0).fit(X, y)
    with pytest.raises(InvalidParameterError, match="max_features"):
        RandomForestClassifier(max_features="most").fit(X, y)
    with pytest.raises(DataError, match="needs at least 2 classes in y, got 1 class: 'a'"):
        GBDTClassifier().fit(X, np.full(100, "a"))


def test_text_or_category_features_are_refused_naming_every_such_column_and_how_to_encode_them():
    X, y = make_classification(100, 3, seed=8)
    frame = pd.DataFrame(X, columns=["a", "b", "c"])
    frame["colour"] = pd.Categorical(np.where(y == 1, "red", "blue"))
    frame["town"] = np.where(X[:, 0] > 0, "Ayr", "Oban")
    frame["codes"] = np.arange(100).astype(object)  # numbers held as objects are numbers
    for est in (GBDTClassifier(), RandomForestRegressor()):
        with pytest.raises(ValueError, match=r"columns 'colour', 'town' of X hold text or categories \(could "
                                             r"not convert string to float: '(red|blue)'\); .*OrdinalEncoder"):
            est.fit(frame, y)
    with pytest.raises(ValueError, match=r"columns 3, 4 \(counted from 0\) of X hold"):
        GBDTClassifier().fit(frame.to_numpy(), y)
    fitted = GBDTClassifier(n_estimators=2).fit(frame[["a", "codes"]], y)
    with pytest.raises(ValueError, match="column 'codes' of X holds text"):
        fitted.predict(frame[["a", "town"]].set_axis(["a", "codes"], axis=1))
    infinite = frame[["a", "b"]].copy()
    infinite.iloc[3, 1] = np.inf
    with pytest.raises(ValueError, match="^Input X contains infinity"):  # no text: scikit-learn's own message
        GBDTClassifier().fit(infinite, y)


def test_dataframe_columns_name_the_saved_models_features(tmp_path):
    # the model file is the CLI's: `fedgrove predict` reads it and prints the class names
    X, y = make_classification(300, 4, seed=9)
    frame = pd.DataFrame(X, columns=["age", "height", "weight", "score"])
    est = GBDTClassifier(n_estimators=5).fit(frame, np.where(y == 1, "high", "low"))
    assert est.feature_names_in_.tolist() == ["age", "height", "weight", "score"]
    path = tmp_path / "model.json"
    est.model_.save(path)
    loaded = load_model(path)
    assert loaded.feature_names == ["age", "height", "weight", "score"]
    np.testing.assert_array_equal(loaded.predict_proba(X), est.predict_proba(frame))
    data = tmp_path / "test.csv"
    frame.iloc[:5].to_csv(data, index=False)
    out = subprocess.run([sys.executable, "-m", "fedgrove.cli.main", "predict", str(path), str(data)],
                         capture_output=True, text=True, check=True).stdout.split()
    assert out[1:] == est.predict(frame.iloc[:5]).tolist()


def test_works_in_pipelines_and_searches():
    X, y = make_classification(300, 5, seed=10)
    scores = cross_val_score(make_pipeline(StandardScaler(), GBDTClassifier(n_estimators=20)), X, y, cv=3)
    assert scores.mean() > 0.8
    xor = (X[:, 0] > 0) != (X[:, 1] > 0)  # stumps cannot learn it
    search = GridSearchCV(RandomForestClassifier(n_estimators=10), {"max_depth": [1, 8]}, cv=3).fit(X, xor)
    assert search.best_params_ == {"max_depth": 8} and search.best_score_ > 0.8


def test_sample_weights_reach_the_engine_and_a_pipeline():
    X, y = make_classification(300, 5, seed=11)
    w = np.random.default_rng(0).integers(0, 4, 300).astype(float)
    names = np.where(y == 1, "pos", "neg")
    est = GBDTClassifier(n_estimators=6, max_depth=3).fit(X, names, sample_weight=w)
    ref = train_gbdt(GBDTParams(n_estimators=6, max_depth=3), X, y, sample_weight=w)
    np.testing.assert_array_equal(est.predict_proba(X), ref.predict_proba(X))
    assert not np.array_equal(est.predict_proba(X), GBDTClassifier(n_estimators=6, max_depth=3)
                              .fit(X, names).predict_proba(X))
    rf = RandomForestRegressor(n_estimators=3, seed=2).fit(X, X[:, 0], sample_weight=w)
    np.testing.assert_array_equal(rf.predict(X), train_forest(ForestParams("regression", n_estimators=3, seed=2),
                                                              X, X[:, 0], sample_weight=w).predict(X))
    pipe = make_pipeline(StandardScaler(), GBDTClassifier(n_estimators=6, max_depth=3))
    pipe.fit(X, names, gbdtclassifier__sample_weight=w)  # (only the step named takes them)
    scaled = pipe[0].transform(X)
    alone = GBDTClassifier(n_estimators=6, max_depth=3).fit(scaled, names, sample_weight=w)
    np.testing.assert_array_equal(pipe.predict_proba(X), alone.predict_proba(scaled))
    with pytest.raises(DataError, match=r"sample_weight must hold one weight per row of X, shape \(300,\)"):
        est.fit(X, names, sample_weight=w[:10])
    # the validation rows' weights reach the engine's metric
    params = GBDTParams("regression", n_estimators=60, learning_rate=0.5, early_stopping_rounds=3)
    wv = np.random.default_rng(1).uniform(0, 2, 100)
    reg = GBDTRegressor(n_estimators=60, learning_rate=0.5, early_stopping_rounds=3)
    reg.fit(X[:200], X[:200, 0], eval_set=(X[200:], X[200:, 0]), eval_sample_weight=wv)
    ref = train_gbdt(params, X[:200], X[:200, 0], eval_set=(X[200:], X[200:, 0]), eval_sample_weight=wv)
    assert reg.best_iteration_ == ref.best_iteration
    np.testing.assert_array_equal(reg.predict(X), ref.predict(X))


@pytest.mark.parametrize("cls", [GBDTClassifier, RandomForestClassifier])
def test_class_weights_multiply_the_sample_weights(cls):
    X, y = make_classification(400, 5, seed=12)
    rare = (y == 1) & (np.arange(400) % 4 != 0)  # most of class 1 relabelled: 1 in 4 of them stays "rare"
    names = np.where((y == 1) & ~rare, "rare", "common")
    kw = dict(n_estimators=6, max_depth=3, seed=1)
    balanced = cls(class_weight="balanced", **kw).fit(X, names)
    share = {c: (names == c).mean() for c in ("common", "rare")}
    w = np.array([1 / (2 * share[c]) for c in names])
    np.testing.assert_allclose(balanced.predict_proba(X), cls(**kw).fit(X, names, sample_weight=w).predict_proba(X),
                               rtol=1e-12, atol=1e-15)
    recall = {e: np.mean(m.predict(X)[names == "rare"] == "rare")
              for e, m in (("plain", cls(**kw).fit(X, names)), ("balanced", balanced))}
    assert recall["balanced"] > recall["plain"]
    sw = np.random.default_rng(0).uniform(0.5, 2, 400)
    given = cls(class_weight={"rare": 3.0}, **kw).fit(X, names, sample_weight=sw)  # "common" weighs 1
    np.testing.assert_allclose(given.predict_proba(X),
                               cls(**kw).fit(X, names, sample_weight=sw * np.where(names == "rare", 3.0, 1.0))
                               .predict_proba(X), rtol=1e-12, atol=1e-15)
    with pytest.raises(InvalidParameterError, match=r"class_weight names classes that y does not hold: \['Rare'\]"):
        cls(class_weight={"Rare": 3.0}).fit(X, names)
    with pytest.raises(InvalidParameterError, match=r"class_weight must be 'balanced', a dict .* got 'auto'"):
        cls(class_weight="auto").fit(X, names)
    with pytest.raises(InvalidParameterError, match=r"weights must be non-negative numbers, got \{'rare': -1\}"):
        cls(class_weight={"rare": -1}).fit(X, names)
