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


@pytest.mark.parametrize("mode", ["shared", "encrypted"])
def test_regression_labels_far_from_zero_are_centred_as_the_engine_centres_them(ou, mode):
    # the label holder subtracts the labels' midrange (the engine's label_offset) and the master adds it back
    # to each tree's values: the engine's forest, whose labels 1e8 + a small spread no longer lose the spread
    X, y = _data("regression")
    y = 1e8 + y
    parts = _parts(X)
    params = ForestParams(task="regression", n_estimators=2, max_depth=5, max_bins=16, seed=3)
    ref = train_forest(params, np.hstack(parts), y)
    out = run_federated_forest(parts, y, params, ou if mode == "encrypted" else None, mode=mode, label_holder=2,
                               X_test_parts=parts)
    _assert_same_forest(out, ref, [f"client{k}" for k in range(3)])
    np.testing.assert_array_equal(out["predictions"]["one-round"], ref.predict(np.hstack(parts)))
    assert np.var(ref.predict(np.hstack(parts))) > 0.5 * np.var(y)  # the trees learnt the spread


@pytest.mark.parametrize("mode", ["shared", "encrypted"])
@pytest.mark.parametrize("k", [-40, 50])
def test_regression_labels_of_any_scale_grow_the_engines_forest_scaled(ou, mode, k):
    # labels times 2^-40 (spread about 1e-11): the statistics' grid scales with them (2^-51 at least before), so
    # the encrypted layout's integer parts are negative numbers of bits; times 2^50 (spread about 5e16) its
    # fractional parts are, which clients refused before as a malformed layout.  The federation grows the
    # engine's forest, whose values are the unscaled forest's times 2^k
    X, y = _data("regression")
    parts = _parts(X)
    params = ForestParams(task="regression", n_estimators=2, max_depth=6, max_bins=16, seed=3)
    scaled = np.ldexp(y, k)
    ref = train_forest(params, np.hstack(parts), scaled)
    out = run_federated_forest(parts, scaled, params, ou if mode == "encrypted" else None, mode=mode,
                               label_holder=0, X_test_parts=parts)
    _assert_same_forest(out, ref, [f"client{c}" for c in range(3)])
    unscaled = train_forest(params, np.hstack(parts), y).predict(np.hstack(parts))
    np.testing.assert_array_equal(np.ldexp(out["predictions"]["one-round"], -k), unscaled)


def test_whole_number_regression_labels_are_not_warned_of_as_classes(caplog):
    # the label holder counted its whole-number labels as classes before the master had said the task, so a
    # regression forest on diabetes's labels (25 to 346) warned "347 classes ... if the label is a quantity, train
    # for regression", which it was doing; a classification forest on such labels still warns, once
    import logging

    X, y = load_diabetes(return_X_y=True)
    parts = _parts(X)
    params = ForestParams(task="regression", n_estimators=1, max_depth=2, max_bins=8, seed=0)
    with caplog.at_level(logging.WARNING, logger="fedgrove"):
        run_federated_forest(parts, y, params, None, mode="shared", label_holder=0)
    assert not [r for r in caplog.records if "classes" in r.getMessage()], caplog.records
    with caplog.at_level(logging.WARNING, logger="fedgrove"):
        run_federated_forest(parts, y, ForestParams(n_estimators=1, max_depth=2, max_bins=8, seed=0), None,
                             mode="shared", label_holder=0)
    said = [r.getMessage() for r in caplog.records if "classes" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("347 classes, from the largest label 346"), said


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


@pytest.mark.slow
def test_one_round_prediction_of_a_forest_of_over_a_hundred_thousand_leaves():
    # the leaf sets' lists were JSON in the message header, whose 1 MiB limit about 90,000 leaves passed: the
    # master refused every client's answer ("header length out of range"); 50 default trees on 20,000 rows
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(20_000, 4)), rng.integers(0, 2, 20_000).astype(float)  # noise: a leaf per few rows
    parts, test = [X[:, :2], X[:, 2:]], [X[:100, :2], X[:100, 2:]]
    params = ForestParams(n_estimators=25, seed=0, n_threads=1)
    out = run_federated_forest(parts, y, params, None, mode="shared", X_test_parts=test)
    assert sum(int(np.sum(tree.is_leaf)) for tree in out["model"].trees) > 100_000
    np.testing.assert_array_equal(out["predictions"]["one-round"], train_forest(params, X, y).predict_proba(X[:100]))


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
    # in Python: a holder outside the clients (it said 'found none'), a method misspelt (found after training),
    # a name that is the master's (one of the two ran), a string for the methods (read letter by letter)
    from fedgrove.exceptions import InvalidParameterError

    for kw, message in ((dict(label_holder=2), "label_holder must be <= 1, got 2"),
                        (dict(methods=("one-round", "oneround")), "prediction method must be .* got 'oneround'"),
                        (dict(names=["master", "b"]), "'master' is given 2 times")):
        with pytest.raises(InvalidParameterError, match=message):
            run_federated_forest(parts, y, params, None, mode="shared", X_test_parts=parts, timeout=30, **kw)
    out = run_federated_forest(parts, y, params, None, mode="shared", X_test_parts=parts, methods="classical",
                               timeout=30)
    assert list(out["predictions"]) == ["classical"]


def test_root_statistics_that_are_not_finite_numbers_are_refused(monkeypatch):
    # a NaN in the label holder's root statistics was taken: the forest's values came out NaN
    from tests.conftest import altering_received

    X, y = _data("binary")

    def poison(msg):
        stats = msg.stats.copy()
        stats[0] = np.nan
        msg.stats = stats
        return msg

    changed = altering_received(monkeypatch, "master", m.RootStats, poison)
    with pytest.raises(ProtocolError, match="root statistics from client0 are not 2 finite numbers: \\[nan"):
        run_federated_forest(_parts(X, 2), y, ForestParams(n_estimators=1, max_depth=2, seed=0), None,
                             mode="shared", timeout=30)
    assert changed


def _forest_federation(tmp_path, y, X, task, he, n_test=60):
    """Two clients (c0 holds the labels), a master, test files with IDs; returns the config's path."""
    import pandas as pd

    df = pd.DataFrame(X[:, :4], columns=list("abcd"))
    df.insert(0, "_id", np.arange(len(df)))
    df["y"] = y
    df = df.iloc[np.random.default_rng(2).permutation(len(df))]  # wine's rows come sorted by class
    train, test = df.iloc[:-n_test], df.iloc[-n_test:]
    for part, rows in (("", train), ("-test", test)):
        rows[["_id", "a", "b", "y"]].to_csv(tmp_path / f"c0{part}.csv", index=False)
        rows[["_id", "c", "d"]].to_csv(tmp_path / f"c1{part}.csv", index=False)
    cfg = tmp_path / "federation.toml"
    cfg.write_text(f'[federation]\nprotocol = "federated-forest"\nseed = 0\ntimeout = 60\n\n{he}\n\n'
                   f'[params]\ntask = "{task}"\nn_estimators = 3\nmax_depth = 3\nmax_bins = 16\n\n'
                   '[[party]]\nname = "master"\nrole = "master"\n\n'
                   '[[party]]\nname = "c0"\nrole = "client"\ndata = "c0.csv"\ntest = "c0-test.csv"\nlabel = "y"\n\n'
                   '[[party]]\nname = "c1"\nrole = "client"\ndata = "c1.csv"\ntest = "c1-test.csv"\n\n'
                   '[output]\ndir = "runs"\n')
    return cfg


@pytest.mark.parametrize("kind", ["multiclass", "regression"])
def test_the_label_holder_scores_the_masters_test_predictions(tmp_path, capsys, kind):
    # the master writes the predictions but holds no labels: the label holder, whose test file has them, is sent
    # the forest's output and scores it; the figures equal those of the master's predictions file
    import json

    import pandas as pd

    from fedgrove import metrics
    from fedgrove.cli.main import main

    X, y = _data(kind)
    task = "regression" if kind == "regression" else "classification"
    cfg = _forest_federation(tmp_path, y, X, task, '[he]\nbackend = "plain"')
    for extra in ([], ["--predict"]):
        assert main(["simulate", str(cfg), *extra]) == 0, capsys.readouterr().err
        out = capsys.readouterr().out
        preds = pd.read_csv(tmp_path / "runs" / "master.predictions.csv")
        truth = pd.read_csv(tmp_path / "c0-test.csv").set_index("_id").loc[preds["_id"], "y"].to_numpy()
        stats = json.loads((tmp_path / "runs" / f"c0.{'predict-' if extra else ''}stats.json").read_text())
        if kind == "regression":
            expect = metrics.rmse(truth, preds["prediction"].to_numpy())
            assert stats["test_rmse"] == pytest.approx(expect, rel=1e-12)
            assert f"c0: rmse {expect:.6g} on its 60 test rows (master's predictions)" in out
        else:
            expect = metrics.accuracy(truth, preds["prediction"].to_numpy())
            assert 0.5 < stats["test_accuracy"] == expect
            assert f"c0: accuracy {expect:.4f} on its 60 test rows (master's predictions)" in out
        assert "test_accuracy" not in json.loads((tmp_path / "runs" / "c1.stats.json").read_text())
    # a client's test file with as many rows but other instances: refused, saying so (it said "rows" of equal counts)
    shifted = pd.read_csv(tmp_path / "c1-test.csv")
    shifted.assign(_id=shifted["_id"] + 10_000).to_csv(tmp_path / "c1-test.csv", index=False)
    assert main(["simulate", str(cfg), "--predict"]) != 0
    assert "rows each, but other instance IDs): every client's test file must hold the same instances" in \
        capsys.readouterr().err
    # trained again without test files: the earlier model's predictions and scores go
    import re

    cfg.write_text(re.sub(r'\ntest = "[^"]*"', "", cfg.read_text()))
    assert main(["simulate", str(cfg)]) == 0, capsys.readouterr().err
    assert not list((tmp_path / "runs").glob("*predict*"))
    # the master's file holds no thresholds: fedgrove predict says so before it reads any data
    assert main(["predict", str(tmp_path / "runs" / "master.model.json"), str(tmp_path / "none.csv")]) == 4
    assert "master.model.json' is the federated-forest model of its master: its trees hold other parties' splits" \
        in capsys.readouterr().err


def test_only_the_label_holder_is_sent_the_test_predictions():
    from fedgrove.protocols.forest.client import answer_predictions
    from fedgrove.protocols.forest.master import ForestMaster
    from fedgrove.transport.inprocess import InProcessHub, run_parties

    X, y = _data("binary")
    parts = _parts(X, 2)
    out = run_federated_forest(parts, y, ForestParams(n_estimators=2, max_depth=3, seed=0), None, mode="shared",
                               label_holder=0)
    params = ForestParams(n_estimators=2, max_depth=3, seed=0)
    names = ["client0", "client1"]
    for asker in names:
        roles = {"master": lambda ch: ForestMaster(ch, names, params, "shared").predict("one-round", out["model"])}
        for k, c in enumerate(names):
            roles[c] = (lambda k, c: lambda ch: answer_predictions(ch, "master", out["client_models"][c], parts[k],
                                                                    wants_scores=c == asker))(k, c)
        if asker == "client0":
            results, _ = run_parties(InProcessHub(["master", *names]), roles, timeout=30)
            np.testing.assert_array_equal(results["client0"], results["master"])
            assert results["client1"] is None
        else:
            with pytest.raises(ProtocolError, match="client1 asked for the test predictions, which only the label "
                                                    "holder \\(client0\\) is sent"):
                run_parties(InProcessHub(["master", *names]), roles, timeout=30)


def test_more_classes_than_the_key_can_carry_are_refused_saying_what_to_do(tmp_path, capsys):
    # a quantity read as classes (labels up to 346): an OU plaintext holds no instance's class counts
    from fedgrove.cli.main import main

    X, _ = _data("binary")
    y = np.random.default_rng(0).integers(0, 300, size=len(X)).astype(float)
    cfg = _forest_federation(tmp_path, y, X, "classification", '[he]\nscheme = "ou"')
    assert main(["simulate", str(cfg)]) != 0
    captured = capsys.readouterr()
    assert ("classes need 2701-bit plaintexts to encrypt each instance's class counts; the OU key gives" in captured.err
            and 'if the label is a quantity, set [params] task = "regression"' in captured.err)
    assert not list((tmp_path / "runs").glob("*.model.json"))
