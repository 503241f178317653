"""TFL (tree-level boosting) and multi-host bagging."""

import numpy as np
import pytest

from fedgrove.engine.gbdt import GBDTParams, train_gbdt
from fedgrove.exceptions import InvalidParameterError
from fedgrove.protocols.hybridtree.bagging import bag_predictions
from fedgrove.protocols.tfl import PartyView, train_tfl, tree_schedule


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(1200, 6))
    y = (X[:, 0] + X[:, 3] - 0.5 * X[:, 5] + 0.3 * rng.normal(size=1200) > 0).astype(float)
    return X, y


@pytest.mark.parametrize("min_samples_leaf", [1, 40])
def test_one_party_holding_everything_is_the_engine(data, min_samples_leaf):
    # min_samples_leaf > 1 needs per-bin counts in the histograms (TFL grew without them and ignored it)
    X, y = data
    params = GBDTParams(n_estimators=6, max_depth=5, min_samples_leaf=min_samples_leaf)
    tfl = train_tfl(X, y, [PartyView(np.arange(len(y)), np.arange(6))], params)
    engine = train_gbdt(params, X, y)
    np.testing.assert_array_equal(tfl.predict_raw(X), engine.predict_raw(X))
    assert min(t.nodes["count"][t.is_leaf].min() for t in tfl.trees) >= min_samples_leaf


def test_each_tree_uses_only_its_partys_rows_and_columns(data):
    X, y = data
    views = [PartyView(np.arange(0, 400), np.array([0, 1])), PartyView(np.arange(400, 1200), np.array([3, 4, 5]))]
    model = train_tfl(X, y, views, GBDTParams(n_estimators=4, max_depth=3))
    for t, tree in enumerate(model.trees):
        inner = tree.nodes[tree.nodes["feature"] >= 0]
        party = t % 2
        assert set(inner["feature"]) <= set(views[party].features.tolist())
        assert np.all(inner["owner"] == party)
        assert tree.nodes["count"][0] == len(views[party].rows)
    # the second party's first tree starts from the first party's tree's scores: it is not its own SOLO tree
    solo = train_gbdt(GBDTParams(n_estimators=1, max_depth=3), X[400:][:, [3, 4, 5]], y[400:])
    assert not np.allclose(model.trees[1].values, solo.trees[0].values)


def test_a_dataframe_s_column_names_are_kept_and_matched_when_predicting(data):
    # the model predicted a DataFrame by position: another column order gave other predictions, silently
    import pandas as pd

    X, y = data
    frame = pd.DataFrame(X, columns=[f"f{j}" for j in range(6)])
    views = [PartyView(np.arange(0, 600), np.array([0, 1, 2])), PartyView(np.arange(600, 1200), np.array([3, 4, 5]))]
    model = train_tfl(frame, y, views, GBDTParams(n_estimators=4, max_depth=3))
    assert model.feature_names == list(frame.columns)
    np.testing.assert_array_equal(model.predict_raw(frame[frame.columns[::-1]]), model.predict_raw(X))


def test_each_party_subsamples_its_own_rows_and_features_each_round(data):
    # subsample and colsample_bytree were refused; each party now draws, from its own generator, the rows (of
    # its own: the root's count) and features (of its own columns) of each round it grows
    X, y = data
    views = [PartyView(np.arange(0, 800), np.array([0, 1, 2, 3])), PartyView(np.arange(800, 1200), np.arange(6))]
    params = GBDTParams(n_estimators=4, max_depth=3, subsample=0.5, colsample_bytree=0.5)
    model = train_tfl(X, y, views, params)
    assert [int(t.nodes["count"][0]) for t in model.trees] == [400, 200, 400, 200]
    used = [{int(f) for f in t.nodes["feature"] if f >= 0} for t in model.trees]
    assert all(u <= {0, 1, 2, 3} and len(u) <= 2 for u in used[0::2]) and all(len(u) <= 3 for u in used[1::2])
    assert train_tfl(X, y, views, params).to_dict() == model.to_dict()


def test_tree_schedules():
    assert tree_schedule(5, [10, 10]) == [0, 1, 0, 1, 0]
    assert tree_schedule(10, [100, 300, 600], "blocks") == [0] + [1] * 3 + [2] * 6
    assert len(tree_schedule(7, [1, 1, 1], "blocks")) == 7
    with pytest.raises(InvalidParameterError, match="schedule"):
        tree_schedule(3, [1], "random")


def test_bagging_majority_soft_and_mean():
    # three hosts, two instances: majority says class 1 for instance 0 although the mean probability says 0
    raws = [np.array([[0.1], [-3.0]]), np.array([[0.1], [-3.0]]), np.array([[-5.0], [3.0]])]
    np.testing.assert_array_equal(bag_predictions(raws, "binary"), [1, 0])
    np.testing.assert_array_equal(bag_predictions(raws, "binary", vote="soft"), [0, 0])
    # a tie (two hosts that disagree) goes to the tied class with the higher mean probability, not the lowest
    # class: with two hosts, ties to class 0 made the bagged accuracy fall below either host's
    multi = [np.array([[2.0, 0, 0]]), np.array([[0, 3.0, 0]])]
    np.testing.assert_array_equal(bag_predictions(multi, "multiclass"), [1])
    np.testing.assert_array_equal(bag_predictions([np.array([[-0.5]]), np.array([[2.0]])], "binary"), [1])
    np.testing.assert_array_equal(bag_predictions([np.array([[-2.0]]), np.array([[0.5]])], "binary"), [0])
    # exactly equal: the lowest class
    np.testing.assert_array_equal(bag_predictions([np.array([[2.0, 0, 0]]), np.array([[0, 2.0, 0]])],
                                                  "multiclass"), [0])
    np.testing.assert_allclose(bag_predictions([np.array([1.0, 2.0]), np.array([3.0, 6.0])], "regression"), [2, 4])
    with pytest.raises(InvalidParameterError, match="vote"):
        bag_predictions(raws, "binary", vote="median")


def test_prediction_files_that_cannot_be_bagged_are_named():
    # a repeated ID in a second file was reported as one of the first's IDs missing; a missing or non-finite
    # prediction or probability was averaged in (NaN, or left out of the mean), and scores outside [0, 1]
    # gave "probabilities" above 1
    import pandas as pd

    from fedgrove.exceptions import DataError
    from fedgrove.protocols.hybridtree.bagging import bag_prediction_files

    def table(p, ids=(0, 1, 2)):
        p = np.asarray(p, dtype=float)
        return pd.DataFrame({"_id": list(ids), "prediction": np.where(p > 0.5, "yes", "no"), "p_no": 1 - p,
                             "p_yes": p})

    good = table([0.2, 0.6, 0.9])
    assert list(bag_prediction_files({"a": good, "b": table([0.4, 0.7, 0.3])})["prediction"]) == ["no", "yes", "yes"]
    cases = [({"a": good, "b": table([0.4, 0.7, 0.1], ids=(0, 1, 0))}, "b: test ID 0 appears more than once"),
             ({"a": good, "b": table([0.4, np.nan, 0.1])}, "b: row 2 has a class probability that is missing"),
             ({"a": good, "b": table([0.4, 1.3, 0.1])}, r"b: row 2's class probabilities \[-0.3.*, 1.3\] are not "
                                                        r"probabilities"),
             ({"a": good, "b": good.assign(p_yes=[0.5, 0.5, 0.5])}, "b: row 1's class probabilities"),
             ({"a": pd.DataFrame({"_id": [0, 1], "prediction": [1.0, 2.0]}),
               "b": pd.DataFrame({"_id": [0, 1], "prediction": [1.0, np.inf]})}, "b: row 2 has a prediction that is")]
    for frames, said in cases:
        with pytest.raises(DataError, match=said):
            bag_prediction_files(frames)
