"""Horizontal histogram aggregation with secure aggregation: lossless, and the aggregator sees masks only."""

import re

import numpy as np
import pytest

from fedgrove.crypto.secagg import FixedPoint128
from fedgrove.data.partition import horizontal_partition
from fedgrove.engine.gbdt import GBDTParams, train_gbdt
from fedgrove.protocols.horizontal import messages as m
from fedgrove.protocols.horizontal.simulate import run_horizontal
from tests.conftest import replaying_own_rows


def _same_trees(fed, eng):
    assert len(fed.trees) == len(eng.trees)
    for a, b in zip(fed.trees, eng.trees):
        for name in ("feature", "bin", "missing_left", "left", "right"):
            np.testing.assert_array_equal(a.nodes[name], b.nodes[name])
        np.testing.assert_allclose(a.values, b.values, rtol=0, atol=1e-9)


def _union(data):
    return np.concatenate([x for x, _ in data]), np.concatenate([y for _, y in data])


@pytest.mark.parametrize("n_clients,mode", [(2, "unbalanced"), (3, "dirichlet")])
def test_lossless_on_a9a(a9a, n_clients, mode):
    X, y = a9a.train.X, a9a.train.y
    parts = horizontal_partition(y, n_clients, mode, seed=1)
    data = [(X[s.rows], y[s.rows]) for s in parts.shards]
    params = GBDTParams(n_estimators=6, max_depth=6)
    out = run_horizontal(data, params)
    Xu, yu = _union(data)
    eng = train_gbdt(params, Xu, yu, bin_mapper=out["model"].bin_mapper)  # the common cut points
    _same_trees(out["model"], eng)
    for client_model in out["client_models"].values():  # every client ends with the full model
        np.testing.assert_array_equal(client_model.predict_raw(a9a.test.X), out["model"].predict_raw(a9a.test.X))


@pytest.mark.parametrize("objective", ["multiclass", "regression"])
def test_lossless_multiclass_and_regression_with_missing_values(objective):
    r = np.random.default_rng(2)
    X = r.normal(size=(3000, 5))
    X[r.random(X.shape) < 0.1] = np.nan
    base = np.nan_to_num(X[:, 0]) - np.nan_to_num(X[:, 3])
    y = np.digitize(base, [-0.7, 0.7]).astype(float) if objective == "multiclass" else base + 0.1 * r.normal(size=3000)
    data = [(X[i::3], y[i::3]) for i in range(3)]
    params = GBDTParams(objective, n_estimators=3, max_depth=4, n_classes=3 if objective == "multiclass" else None,
                        min_samples_leaf=5 if objective == "regression" else 1)
    out = run_horizontal(data, params)
    Xu, yu = _union(data)
    _same_trees(out["model"], train_gbdt(params, Xu, yu, bin_mapper=out["model"].bin_mapper))


def test_row_subsampling_grows_the_engines_trees_on_the_rows_the_clients_drew(monkeypatch):
    # subsample: each client draws its own rows every round (RoundSampler seeded [seed, 67, its place]); the trees
    # are the engine's on the union of those rows, a round's class trees all on the round's rows, and every row's
    # score (sampled or not) moves with each tree, so later rounds' gradients stay the engine's too
    from dataclasses import replace

    import fedgrove.engine.gbdt as gbdt

    r = np.random.default_rng(5)
    X = r.normal(size=(900, 5))
    y = np.digitize(X[:, 0] + 0.5 * X[:, 2] + 0.3 * r.normal(size=900), [-0.6, 0.6]).astype(float)
    data = [(X[:200], y[:200]), (X[200:550], y[200:550]), (X[550:], y[550:])]
    params = GBDTParams("multiclass", n_classes=3, n_estimators=4, max_depth=3, max_bins=16, seed=11,
                        subsample=0.6, colsample_bytree=0.6)
    fed = run_horizontal(data, params)["model"]
    Xu, yu = _union(data)
    with monkeypatch.context() as mp:
        mp.setattr(gbdt, "RoundSampler", replaying_own_rows([len(yc) for _, yc in data]))
        replayed = train_gbdt(params, Xu, yu, bin_mapper=fed.bin_mapper)
    _same_trees(fed, replayed)
    roots = [t.nodes["count"][0] for t in fed.trees]
    assert roots == [round(0.6 * 200) + round(0.6 * 350) + round(0.6 * 350)] * 12
    whole = run_horizontal(data, replace(params, subsample=1.0))["model"]
    assert whole.trees[0].nodes["count"][0] == 900
    assert [t.nodes["feature"].tolist() for t in fed.trees] != [t.nodes["feature"].tolist() for t in whole.trees]


def test_with_column_sampling_the_clients_send_the_bins_of_the_trees_features_alone():
    # colsample_bytree: the aggregator's layer plans name the tree's features and every client's masked histograms
    # hold their bins only (the bytes a tree fall with the columns), while the trees stay the engine's
    from dataclasses import replace

    from fedgrove.engine.gbdt import RoundSampler

    r = np.random.default_rng(8)
    X = r.normal(size=(600, 8))
    X[r.random(X.shape) < 0.05] = np.nan
    y = (np.nan_to_num(X[:, 1]) - np.nan_to_num(X[:, 6]) + 0.3 * r.normal(size=600) > 0).astype(float)
    data = [(X[:250], y[:250]), (X[250:], y[250:])]
    params = GBDTParams(n_estimators=3, max_depth=3, max_bins=16, seed=4, colsample_bytree=0.5)
    got = []
    out = run_horizontal(data, params, observers={"aggregator": [lambda d, peer, tag, msg: got.append((d, peer, tag,
                                                                                                        msg))]})
    fed = out["model"]
    Xu, yu = _union(data)
    _same_trees(fed, train_gbdt(params, Xu, yu, bin_mapper=fed.bin_mapper))
    sampler = RoundSampler(replace(params, subsample=1.0), None, 8)
    offsets = fed.bin_mapper.feature_offsets
    for t in range(3):
        features = sampler.next()[1]
        assert len(features) == 4 and set(fed.trees[t].nodes["feature"][fed.trees[t].nodes["feature"] >= 0]) \
            <= set(features.tolist())
        root = next(msg for d, peer, tag, msg in got if d == "recv" and peer == "client0" and tag == f"tree={t}/up")
        bins = int(sum(offsets[f + 1] - offsets[f] for f in features))
        assert root.hi.shape == (2 * bins + 1,) and bins < int(offsets[-1])  # (g, h) a bin, and the node's count
    every = run_horizontal(data, replace(params, colsample_bytree=1.0))
    assert out["stats"]["client0"]["total_sent"] < 0.75 * every["stats"]["client0"]["total_sent"]


def test_lossless_when_a_bin_sums_to_a_tiny_negative_gradient():
    # secure aggregation once decoded a bin's G of -1e-15 as -2048 (2**64 - 1 is no float64): the aggregator
    # then split on that bin with a gain of 1e6.  Found on KDD Cup 99 (23 classes, where the rare classes'
    # gradients are this small); here one row with gradient -1e-15 sits alone in a bin.
    r = np.random.default_rng(0)
    X = np.column_stack([r.normal(size=300), np.zeros(300)])
    y = np.where(np.arange(300) % 2 == 0, 1.0, -1.0)
    y[0], y[1] = 1e-15, -1e-15  # the labels sum to 0, so the base score is 0 and row 0's gradient -1e-15
    X[0, 1] = 1.0
    data = [(X[i::3], y[i::3]) for i in range(3)]
    params = GBDTParams("regression", n_estimators=2, max_depth=3)
    out = run_horizontal(data, params)
    Xu, yu = _union(data)
    eng = train_gbdt(params, Xu, yu, bin_mapper=out["model"].bin_mapper)
    assert eng.trees[0].nodes["feature"][0] == 0  # the engine's root splits on the informative feature
    _same_trees(out["model"], eng)


def test_the_aggregator_sees_only_masked_vectors(a9a):
    X, y = a9a.train.X[:3000], a9a.train.y[:3000]
    data = [(X[:1500], y[:1500]), (X[1500:], y[1500:])]
    received = []
    out = run_horizontal(data, GBDTParams(n_estimators=1, max_depth=3),
                         observers={"aggregator": [lambda d, peer, tag, msg: received.append((d, peer, tag, msg))]})
    kinds = {type(msg) for d, _, _, msg in received if d == "recv"}
    assert kinds == {m.MaskingKey, m.Sketches, m.MaskedVector}
    # a client's root-layer vector alone decodes to noise, not to its histogram
    codec = FixedPoint128()
    root = [msg for d, peer, tag, msg in received if d == "recv" and peer == "client0" and tag == "tree=0/up"][0]
    alone = codec.decode(root.hi, root.lo)
    assert np.median(np.abs(alone)) > 1e6  # masks are uniform over 2^128 / 2^53
    assert out["model"].n_trees == 1


def test_contribution_accounting_splits_every_gain_among_the_clients():
    # opt-in: the Shapley values of each split add up to its gain, so each client's total is its share of the sum
    # of all split gains; a client whose labels are pure noise contributes less than the informative ones
    from tests.conftest import make_classification

    X, y = make_classification(n=3000, d=5, seed=2)
    noisy = np.random.default_rng(0).integers(0, 2, 1000).astype(float)
    data = [(X[:1000], y[:1000]), (X[1000:2000], y[1000:2000]), (X[2000:], noisy)]
    out = run_horizontal(data, GBDTParams(n_estimators=3, max_depth=3), contributions=True)
    model = out["model"]
    total_gain = sum(float(t.nodes["gain"][~t.is_leaf].sum()) for t in model.trees)
    shap = [model.metadata["contributions"][f"client{k}"]["shapley"] for k in range(3)]
    assert sum(shap) == pytest.approx(total_gain, rel=1e-6)
    assert shap[2] < min(shap[:2])


def test_contributions_must_be_true_or_false():
    from fedgrove.exceptions import InvalidParameterError

    X = np.random.default_rng(0).normal(size=(60, 3))
    y = (X[:, 0] > 0).astype(float)
    with pytest.raises(InvalidParameterError, match="contributions must be true or false, got 'no'"):
        run_horizontal([(X[:30], y[:30]), (X[30:], y[30:])], GBDTParams(n_estimators=1), contributions="no")


def test_a_layer_plan_naming_nodes_the_tree_does_not_have_is_refused():
    # the finder's node bookkeeping is arrays read by numba kernels: a peer's plan is checked before use
    from types import SimpleNamespace

    from fedgrove.engine.binning import BinMapper
    from fedgrove.engine.splitter import GBDTScorer, HistogramSplitFinder
    from fedgrove.exceptions import ProtocolError
    from fedgrove.protocols.horizontal import messages as hm
    from fedgrove.protocols.horizontal.client import HorizontalClient

    X = np.random.default_rng(0).normal(size=(200, 3))
    bm = BinMapper(16).fit(X)
    finder = HistogramSplitFinder(bm.transform(X), bm.feature_offsets, bm.missing_codes, bm.thresholds(),
                                  np.ones((200, 2)), GBDTScorer())
    me = SimpleNamespace(ch=SimpleNamespace(party="party0"))

    def plan(**kw):
        base = dict(tree=0, layer=1, split_nodes=[0], features=[1], bins=[3], missing_left=[0], left=[1], right=[2],
                    build=[1])
        return hm.LayerPlan(**{**base, **kw})

    HorizontalClient._check_plan(me, plan(), finder)  # the root split into nodes 1 and 2
    for bad, message in [(dict(split_nodes=[5]), "not distinct nodes"), (dict(split_nodes=[-1]), "not distinct"),
                         (dict(left=[7]), "not the next 2 node ids from 1"),
                         (dict(right=[10 ** 12]), "not the next"), (dict(build=[9]), "nodes [9]"),
                         (dict(bins=[]), "lists of lengths"), (dict(columns=[2, 1]), "not distinct sorted"),
                         (dict(columns=[0, 3]), "features 0 to 2"), (dict(columns=[1, 1]), "not distinct")]:
        with pytest.raises(ProtocolError, match=message.replace("[", r"\[").replace("]", r"\]")):
            HorizontalClient._check_plan(me, plan(**bad), finder)


def _client_files(tmp_path):
    """Two clients' files and a test file with the label, of a learnable binary task."""
    import pandas as pd

    r = np.random.default_rng(4)
    X = r.normal(size=(300, 3))
    df = pd.DataFrame(X, columns=["a", "b", "c"])
    df["y"] = (X[:, 0] + 0.5 * X[:, 1] > 0).astype(int)
    df.insert(0, "_id", np.arange(len(df)))
    df.iloc[:120].to_csv(tmp_path / "p0.csv", index=False)
    df.iloc[120:240].to_csv(tmp_path / "p1.csv", index=False)
    df.iloc[240:].to_csv(tmp_path / "test.csv", index=False)
    return df.iloc[240:]


HORIZONTAL = """[federation]
protocol = "horizontal"
seed = 0
timeout = 60
[params]
n_estimators = 6
max_depth = 3
"""


def test_clients_predict_their_test_files_after_training(tmp_path, capsys):
    # before, a horizontal config with test files was refused: every client holds the whole model, so each now
    # predicts its own test file, as SimFL and FV-tree parties do, and again with --predict
    import json

    import pandas as pd

    from fedgrove.cli.main import main
    from fedgrove.engine.model import load_model

    test = _client_files(tmp_path)
    clients = "".join(f'[[party]]\nname = "party{k}"\nrole = "client"\ndata = "p{k}.csv"\nlabel = "y"\n'
                      f'test = "test.csv"\n' for k in range(2))
    cfg = tmp_path / "federation.toml"
    cfg.write_text(HORIZONTAL + '[[party]]\nname = "aggregator"\nrole = "aggregator"\n' + clients +
                   '[output]\ndir = "runs"\n')
    # --predict before any training: told to train first (it was "model file ... does not exist")
    assert main(["simulate", str(cfg), "--predict"]) != 0
    assert re.search(r"no model file \S+/runs/party\d\.model\.json; train first \(the same command without "
                     r"--predict\)", " ".join(capsys.readouterr().err.split()))
    for args in (["simulate", str(cfg)], ["simulate", str(cfg), "--predict"]):
        for f in (tmp_path / "runs").glob("*.predictions.csv"):
            f.unlink()
        assert main(args) == 0, capsys.readouterr().err
        for k in range(2):
            pred = pd.read_csv(tmp_path / "runs" / f"party{k}.predictions.csv")
            model = load_model(tmp_path / "runs" / f"party{k}.model.json")
            np.testing.assert_array_equal(pred["_id"], test["_id"])
            np.testing.assert_allclose(pred["p_1"], model.predict_proba(test[["a", "b", "c"]].to_numpy())[:, 1])
            stats = json.loads((tmp_path / "runs" / ("party%d.%s" % (
                k, "predict-stats.json" if "--predict" in args else "stats.json"))).read_text())
            accuracy = np.mean(pred["prediction"].to_numpy() == test["y"].to_numpy())
            assert stats["test_accuracy"] == pytest.approx(accuracy) and accuracy > 0.8
        assert not (tmp_path / "runs" / "aggregator.predictions.csv").exists()


def test_an_aggregator_config_without_predict_is_told_to_say_it(tmp_path):
    # one config per party: the clients list test files, so prediction is on for them; the aggregator, which has
    # no data, must say predict = true, and the refusal says so
    from fedgrove.exceptions import InvalidParameterError
    from fedgrove.runner.config import load_party
    from fedgrove.runner.run import run_role
    from fedgrove.transport.inprocess import InProcessHub, run_parties

    _client_files(tmp_path)
    names = ["aggregator", "party0", "party1"]

    def configs(aggregator_predicts):
        out = {}
        for name in names:
            if name == "aggregator":
                party = '[party]\nname = "aggregator"\nrole = "aggregator"\n'
                fed = HORIZONTAL.replace("timeout = 60\n", "timeout = 60\npredict = true\n") \
                    if aggregator_predicts else HORIZONTAL
            else:
                party = f'[party]\nname = "{name}"\nrole = "client"\ndata = "p{name[-1]}.csv"\nlabel = "y"\n' \
                        f'test = "test.csv"\n'
                fed = HORIZONTAL
            port = {n: f'"127.0.0.1:{50300 + k}"' for k, n in enumerate(names)}  # not listened on here
            peers = "[peers]\n" + "".join(f"{p} = {port[p]}\n" for p in names if p != name)
            path = tmp_path / f"{name}.toml"
            roles = "[roles]\n" + "".join(f'{p} = "{"aggregator" if p == "aggregator" else "client"}"\n'
                                           for p in names if p != name)
            path.write_text(party + f'listen = {port[name]}\ncerts = "certs"\n' + peers + roles + fed +
                            '[output]\ndir = "runs"\n')
            out[name] = load_party(path)
        return out

    def run(cfg_of):
        hub = InProcessHub(names)
        return run_parties(hub, {n: (lambda n: lambda ch: run_role(*cfg_of[n], ch))(n) for n in names},
                           timeout=30)

    with pytest.raises(InvalidParameterError, match="federation.predict") as err:
        run(configs(False))
    assert "predict = true under [federation]" in " ".join(str(err.value).split())
    assert not list((tmp_path / "runs").glob("*.model.json"))
    results, _ = run(configs(True))
    assert results["party0"]["n_test"] == results["party1"]["n_test"] == 60
    assert (tmp_path / "runs" / "party1.predictions.csv").exists()
