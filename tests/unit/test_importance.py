"""Feature importance of models, and the width of the rows a model takes when it has no bin mapper."""

import json

import numpy as np
import pytest

from fedgrove.engine.forest import ForestParams, train_forest
from fedgrove.engine.gbdt import GBDTParams, train_gbdt
from fedgrove.engine.model import GBDTModel, load_model
from fedgrove.engine.tree import NODE_DTYPE, Tree
from fedgrove.exceptions import DataError, InvalidParameterError
from fedgrove.protocols.simfl.simulate import run_simfl
from tests.conftest import make_classification


def test_gain_and_split_importance_sum_the_splits_and_cover_unused_trailing_features():
    X, y = make_classification(n=800, d=5, seed=1)
    X[:, 4] = 1.0  # a constant last column: never split, still reported
    model = train_gbdt(GBDTParams(n_estimators=8, max_depth=3), X, y)
    splits = [t.nodes[t.nodes["feature"] >= 0] for t in model.trees]
    gain, count = model.feature_importance("gain"), model.feature_importance("split")
    assert gain.shape == count.shape == (5,)
    for f in range(5):
        assert count[f] == sum(int((s["feature"] == f).sum()) for s in splits)
        assert gain[f] == pytest.approx(sum(float(s["gain"][s["feature"] == f].sum()) for s in splits))
    assert count[4] == 0 and gain[4] == 0
    assert count[0] > 0 and gain[0] == gain.max()  # y is driven by feature 0 most
    assert model.feature_labels() == ["f0", "f1", "f2", "f3", "f4"]
    with pytest.raises(InvalidParameterError, match="'cover'"):
        model.feature_importance("cover")


def test_a_forest_tree_grown_to_purity_has_the_root_impurity_as_its_total_gain():
    # scikit-learn's importance: impurity decreases weighted by the node's share of the samples; over a tree
    # whose leaves are pure they add up to the root's Gini impurity
    X, y = make_classification(n=300, d=4, seed=2)
    forest = train_forest(ForestParams(n_estimators=1, bootstrap=False, max_features=None), X, y)
    tree = forest.trees[0]
    leaves = tree.values[tree.is_leaf]
    assert np.all(leaves.max(axis=1) == 1.0)  # pure
    p = np.bincount(y.astype(int)) / len(y)
    assert forest.feature_importance("gain").sum() == pytest.approx(1.0 - np.sum(p ** 2), rel=1e-12)
    assert forest.feature_importance("split").sum() == (~tree.is_leaf).sum()


def test_a_simfl_model_knows_its_width_and_refuses_narrower_rows(tmp_path):
    X, y = make_classification(n=400, d=6, seed=3)
    params = GBDTParams(n_estimators=3, max_depth=3, max_bins=16)
    model = run_simfl([(X[0::2], y[0::2]), (X[1::2], y[1::2])], params)["model"]
    assert model.n_features == 6
    assert model.feature_importance().shape == (6,)
    with pytest.raises(DataError, match=r"\(n_samples, 6\)"):
        model.predict(X[:, :4])
    path = tmp_path / "simfl.json"
    model.save(path)
    assert load_model(path).n_features == 6
    np.testing.assert_array_equal(load_model(path).predict_raw(X), model.predict_raw(X))


def test_a_model_without_any_width_refuses_rows_too_narrow_for_its_splits(tmp_path):
    # a file written before models recorded their width: the trees' own features bound the rows
    nodes = np.zeros(3, dtype=NODE_DTYPE)
    nodes[0] = (3, 0, 0.5, 0, 1, 2, 1.0, 10, 0, -1)
    nodes[1] = (-1, 0, np.nan, 0, -1, -1, 0.0, 5, 1, -1)
    nodes[2] = (-1, 0, np.nan, 0, -1, -1, 0.0, 5, 1, -1)
    model = GBDTModel("regression", 1, [0.0])
    model.add_tree(Tree(nodes, np.array([[0.0], [-1.0], [1.0]])))
    d = model.to_dict()
    del d["n_features"]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(d))
    old = load_model(path)
    assert old.n_features is None
    with pytest.raises(DataError, match="at least 4 columns"):
        old.predict(np.zeros((2, 3)))
    np.testing.assert_array_equal(old.predict(np.array([[0, 0, 0, 0.0], [0, 0, 0, 1.0]])), [-1.0, 1.0])
    assert old.feature_importance("split").tolist() == [0, 0, 0, 1]
