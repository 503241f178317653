"""Federated Forest: lossless against the engine's random forest, one-round prediction, and what each party sees."""

import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer, load_diabetes, load_wine

from fedgrove.crypto.he import keygen
from fedgrove.engine.forest import ForestParams, train_forest
from fedgrove.exceptions import ProtocolError
from fedgrove.protocols.forest import messages as m
from fedgrove.protocols.forest.simulate import run_federated_forest


@pytest.fixture(scope="module")
def ou():
    return keygen("ou")


def _data(kind: str):
    if kind == "binary":
        X, y = load_breast_cancer(return_X_y=True)
    elif kind == "multiclass":
        X, y = load_wine(return_X_y=True)
    else:
        X, y = load_diabetes(return_X_y=True)
        y = y / 7.3 + np.random.default_rng(0).normal(size=len(y))  # not integers: rounding matters
    X = X.copy()
    X[::9, 1] = np.nan  # missing values in one client's feature
    return X, y.astype(float)


def _parts(X, k=3):
    cols = np.array_split(np.random.default_rng(1).permutation(X.shape[1]), k)
    return [X[:, np.sort(c)] for c in cols]


def _assert_same_forest(out, ref, names):
    """Tree for tree: the master's structure and values equal the engine's, each split's threshold is known
    to its owner only, and the master knows none."""
    model = out["model"]
    assert model.n_trees == ref.n_trees
    for t, (a, b) in enumerate(zip(model.trees, ref.trees)):
        for col in ("feature", "left", "right", "missing_left", "count", "depth", "gain"):
            np.testing.assert_array_equal(a.nodes[col], b.nodes[col], err_msg=f"tree {t} {col}")
        np.testing.assert_array_equal(a.values, b.values)
        assert np.isnan(a.nodes["threshold"]).all()
        for nid in np.nonzero(a.nodes["feature"] >= 0)[0]:
            owner = names[a.nodes["owner"][nid]]
            f, b_, ml, thr = out["client_models"][owner].splits[(t, int(nid))]
            assert thr == b.nodes["threshold"][nid] and b_ == b.nodes["bin"][nid] and ml == b.nodes["missing_left"][nid]
            assert all((t, int(nid)) not in out["client_models"][c].splits for c in names if c != owner)


CASES = [
    # (data, mode, params)
    ("binary", "shared", dict(feature_sampling="tree")),
    ("binary", "encrypted", dict(criterion="entropy", feature_sampling="tree", max_depth=None, min_samples_leaf=3,
                                 min_samples_split=7, min_impurity_decrease=1e-3)),
    ("multiclass", "encrypted", dict(feature_sampling="node", max_features=0.5)),
    ("regression", "encrypted", dict(task="regression", feature_sampling="tree", max_features=0.7)),
    ("regression", "shared", dict(task="regression", feature_sampling="node", bootstrap=False)),
]


@pytest.mark.parametrize("kind,mode,extra", CASES, ids=[f"{k}-{m}-{i}" for i, (k, m, _) in enumerate(CASES)])
def test_federated_forest_equals_the_centralised_forest_tree_for_tree(ou, kind, mode, extra):
    # the same seed gives the engine's forest on the clients' columns side by side, with the same bootstrap
    # and feature draws; classification and regression, both label modes, per-tree and per-node feature draws
    X, y = _data(kind)
    parts = _parts(X)
    params = ForestParams(**{"n_estimators": 4, "max_depth": 6, "max_bins": 32, "seed": 3, **extra})
    ref = train_forest(params, np.hstack(parts), y)
    names = [f"client{k}" for k in range(3)]
    out = run_federated_forest(parts, y, params, ou if mode == "encrypted" else None, mode=mode, label_holder=1,
                               X_test_parts=parts, methods=("one-round", "classical"))
    _assert_same_forest(out, ref, names)
    expect = ref.predict_proba(np.hstack(parts)) if kind != "regression" else ref.predict(np.hstack(parts))
    np.testing.assert_array_equal(out["predictions"]["one-round"], expect)
    np.testing.assert_array_equal(out["predictions"]["classical"], expect)
    assert out["model"].metadata["label_mode"] == mode


def test_one_round_prediction_takes_the_same_messages_whatever_the_depth_and_number_of_trees():
    # one request and one reply per client for the whole forest; the classical algorithm's messages grow with
    # depth and trees
    X, y = _data("binary")
    parts = _parts(X, 2)
    counts = {}
    for depth, trees in ((2, 2), (6, 8)):
        params = ForestParams(n_estimators=trees, max_depth=depth, max_bins=16, seed=0, feature_sampling="tree")
        out = run_federated_forest(parts, y, params, None, mode="shared", X_test_parts=parts,
                                   methods=("one-round", "classical"))
        counts[(depth, trees)] = {k: v["messages"] for k, v in out["predict_stats"].items()}
        np.testing.assert_array_equal(out["leaves"]["one-round"], out["leaves"]["classical"])
    small, large = counts[(2, 2)], counts[(6, 8)]
    assert small["one-round"] == large["one-round"] == 2 * 4  # TestHello, request, reply, done per client
    assert large["classical"] > 3 * small["classical"]


def _recorder(log):
    return lambda direction, peer, tag, msg: log.append((direction, peer, type(msg), msg))


def test_encrypted_mode_keeps_labels_and_features_where_they_belong(ou):
    # a client without labels receives no label statistic in plaintext (only ciphertexts and node lists); the
    # master receives gains, node statistics and partitions, never histograms, features or thresholds
    X, y = _data("binary")
    parts = _parts(X)
    logs = {n: [] for n in ("master", "client0", "client1", "client2")}
    params = ForestParams(n_estimators=2, max_depth=4, max_bins=16, seed=0, feature_sampling="tree")
    run_federated_forest(parts, y, params, ou, mode="encrypted", label_holder=0, X_test_parts=parts,
                         observers={n: [_recorder(log)] for n, log in logs.items()})
    plain_ok = {m.ForestSetup, m.LabelKey, m.Start, m.TreeStart, m.LayerRequest, m.EncryptedLabelStats,
                m.SplitOwners, m.SplitQuery, m.LayerPartition, m.TreeEnd, m.TrainingDone, m.LeafSetsRequest,
                m.RouteQuery, m.PredictDone}
    for name in ("client1", "client2"):
        received = [(t, msg) for d, _, t, msg in logs[name] if d == "recv"]
        assert {t for t, _ in received} <= plain_ok
        assert all(msg.stats.size == 0 for t, msg in received if t is m.LayerRequest)  # no node statistics
        assert any(t is m.EncryptedLabelStats for t, _ in received)
    master_got = {t for d, _, t, _ in logs["master"] if d == "recv"}
    assert master_got <= {m.ClientHello, m.RootStats, m.FeatureGains, m.ChildStats, m.SplitMasks, m.TestHello,
                          m.LeafSets, m.RouteBits}
    holder_got = {(peer, t) for d, peer, t, _ in logs["client0"] if d == "recv"}
    assert ("client1", m.EncryptedHistograms) in holder_got and ("client2", m.FeatureLayout) in holder_got
    assert not any(t is m.SharedLabels for log in logs.values() for _, _, t, _ in log)


def test_shared_label_mode_is_explicit_and_recorded():
    X, y = _data("binary")
    parts = _parts(X, 2)
    logs = {"client1": []}
    out = run_federated_forest(parts, y, ForestParams(n_estimators=1, max_depth=3, seed=0), None, mode="shared",
                               observers={"client1": [_recorder(logs["client1"])]})
    assert out["model"].metadata["label_mode"] == "shared"
    assert any(t is m.SharedLabels for d, _, t, _ in logs["client1"] if d == "recv")


def test_clients_must_hold_the_same_instances_and_one_of_them_the_labels():
    X, y = _data("binary")
    parts = _parts(X, 2)
    params = ForestParams(n_estimators=1, max_depth=2, seed=0)
    with pytest.raises(ProtocolError, match="different sets of instances"):
        run_federated_forest([parts[0], parts[1][:-1]], y, params, None, mode="shared", timeout=30)
    from fedgrove.protocols.forest.client import ForestClient
    from fedgrove.protocols.forest.master import ForestMaster
    from fedgrove.transport.inprocess import InProcessHub, run_parties

    roles = {"master": lambda ch: ForestMaster(ch, ["a", "b"], params, "shared").fit(),
             "a": lambda ch: ForestClient(ch, parts[0], "master", y=y).fit(),
             "b": lambda ch: ForestClient(ch, parts[1], "master", y=y).fit()}
    with pytest.raises(ProtocolError, match="exactly one client must hold the labels"):
        run_parties(InProcessHub(["master", "a", "b"]), roles, timeout=30)
