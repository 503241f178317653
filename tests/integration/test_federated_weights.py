"""Row weights in the federated protocols: a horizontal client's and the vertical active party's weights give the
engine's weighted trees (``train_gbdt(..., sample_weight=)``), from Python and from a config's ``weight``; a
HybridTree host's give its weighted SOLO without guest layers."""

import json
import re

import numpy as np
import pandas as pd
import pytest

from fedgrove.cli.main import main
from fedgrove.crypto.he import keygen
from fedgrove.engine.binning import BinMapper
from fedgrove.engine.gbdt import GBDTParams, train_gbdt
from fedgrove.engine.model import load_model
from fedgrove.exceptions import DataError, InvalidParameterError
from fedgrove.protocols.horizontal.simulate import run_horizontal
from fedgrove.protocols.vertical import messages as vm
from fedgrove.protocols.vertical.simulate import run_vertical


def _same_trees(fed, eng):
    assert len(fed.trees) == len(eng.trees)
    for a, b in zip(fed.trees, eng.trees):
        for name in ("feature", "bin", "missing_left", "left", "right", "count"):
            np.testing.assert_array_equal(a.nodes[name], b.nodes[name], err_msg=name)
        np.testing.assert_allclose(a.values, b.values, rtol=0, atol=1e-9)


def _differ(a, b) -> bool:
    return any(len(s.nodes) != len(t.nodes) or not np.allclose(s.values, t.values) for s, t in zip(a.trees, b.trees))


def _task(objective, n=1200, seed=3):
    r = np.random.default_rng(seed)
    X = r.normal(size=(n, 6))
    X[r.random(X.shape) < 0.1] = np.nan
    signal = np.nan_to_num(X[:, 0]) + 0.5 * np.nan_to_num(X[:, 4]) + 0.5 * r.normal(size=n)
    y = {"binary": (signal > 0).astype(float), "multiclass": np.digitize(signal, [-0.6, 0.6]).astype(float),
         "regression": 3 * signal}[objective]
    w = r.integers(0, 5, size=n) * r.uniform(0.5, 3, size=n)  # a fifth of the rows of weight 0
    return X, y, w


@pytest.mark.parametrize("objective,subsample", [("binary", 1.0), ("multiclass", 1.0), ("regression", 0.7)])
def test_horizontal_clients_weights_give_the_engines_weighted_trees(objective, subsample):
    X, y, w = _task(objective)
    data = [(X[k::3], y[k::3], w[k::3]) for k in range(3)]
    params = GBDTParams(objective, n_estimators=4, max_depth=4, max_bins=32, seed=2, subsample=subsample,
                        n_classes=3 if objective == "multiclass" else None)
    fed = run_horizontal(data, params)["model"]
    Xu, yu, wu = (np.concatenate([d[k] for d in data]) for k in range(3))
    if subsample < 1:  # each client draws its own rows (of positive weight): the engine replays those draws
        import fedgrove.engine.gbdt as gbdt
        from tests.conftest import replaying_own_rows

        sizes = [int((d[2] > 0).sum()) for d in data]
        kept = wu > 0
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(gbdt, "RoundSampler", replaying_own_rows(sizes))
            eng = train_gbdt(params, Xu[kept], yu[kept], sample_weight=wu[kept], bin_mapper=fed.bin_mapper)
    else:
        eng = train_gbdt(params, Xu, yu, sample_weight=wu, bin_mapper=fed.bin_mapper)
        # the clients' weighted sketches merge to the engine's weighted cut points on the union
        whole = BinMapper(32).fit(Xu[wu > 0], wu[wu > 0])
        for a, b in zip(fed.bin_mapper.cuts_, whole.cuts_):
            np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(fed.base_score, eng.base_score, rtol=0, atol=1e-12)
    _same_trees(fed, eng)
    assert fed.trees[0].nodes["count"][0] == ((wu > 0).sum() if subsample == 1 else
                                              sum(round(subsample * s) for s in sizes))
    assert _differ(fed, run_horizontal([d[:2] for d in data], params)["model"])  # the weights matter


def test_a_clients_bad_weights_are_refused_naming_them():
    X, y, w = _task("binary", n=300)
    params = GBDTParams(n_estimators=1, max_depth=2)
    with pytest.raises(DataError, match=r"one weight per row of X, shape \(150,\), got shape \(149,\)"):
        run_horizontal([(X[:150], y[:150], w[:149]), (X[150:], y[150:])], params)
    with pytest.raises(DataError, match="zero in all 150 rows"):
        run_horizontal([(X[:150], y[:150], np.zeros(150)), (X[150:], y[150:])], params)
    with pytest.raises(InvalidParameterError, match=r"client_data\[0\] must be a tuple \(X, y\) or \(X, y, "
                                                    r"sample_weight\), got 4 items"):
        run_horizontal([(X, y, w, w)], params)


def _vertical_oracle(X, y, w, parts, params):
    # the active party's (parts[0]'s) cut points weighted (it holds the weights), the passive parties' not
    keep = w > 0
    cuts = sum([BinMapper(params.max_bins, seed=params.seed).fit(X[keep][:, parts[0]], w[keep]).cuts_]
               + [BinMapper(params.max_bins, seed=params.seed).fit(X[:, p]).cuts_ for p in parts[1:]], [])
    Xj = np.concatenate([X[:, p] for p in parts], axis=1)
    return train_gbdt(params, Xj, y, sample_weight=w, bin_mapper=BinMapper.from_cuts(cuts, params.max_bins))


@pytest.mark.parametrize("objective,subsample", [("binary", 1.0), ("binary", 0.7), ("regression", 1.0)])
def test_the_vertical_active_partys_weights_give_the_engines_weighted_trees(objective, subsample):
    X, y, w = _task(objective)
    parts = [np.array([1, 4, 5]), np.array([0, 2, 3])]
    params = GBDTParams(objective, n_estimators=3, max_depth=4, max_bins=32, seed=2, subsample=subsample)
    seen = []
    out = run_vertical([X[:, p] for p in parts], y, params, keygen("ou", 2048), sample_weight=w,
                       observers={"party1": [lambda d, peer, tag, msg: seen.append(msg)]})
    _same_trees(out["model"], _vertical_oracle(X, y, w, parts, params))
    # the instances of weight 0 are left out as a subsample leaves instances out: none is encrypted
    grads = [msg for msg in seen if isinstance(msg, vm.EncryptedGradients)]
    kept = np.nonzero(w > 0)[0]
    assert len(grads) == 3 and all(g.sampled and np.isin(g.rows, kept).all() for g in grads)
    assert all(g.n == (len(kept) if subsample == 1 else round(subsample * len(kept))) for g in grads)
    plain = run_vertical([X[:, p] for p in parts], y, params, keygen("ou", 2048))["model"]
    assert _differ(out["model"], plain)


def test_large_vertical_weights_widen_the_packed_gradients_and_stay_exact():
    from fedgrove.protocols.vertical.active import packer_for

    X, y, w = _task("binary", n=600)
    w = w * 1e4
    assert packer_for("binary", y, w).value_bits == 17 > packer_for("binary", y).value_bits == 1
    parts = [np.array([0, 1, 2]), np.array([3, 4, 5])]
    params = GBDTParams(n_estimators=2, max_depth=3, max_bins=16, min_child_weight=1.0)
    for scheme in ("ou", "paillier"):
        out = run_vertical([X[:, p] for p in parts], y, params, keygen(scheme, 2048), sample_weight=w)
        _same_trees(out["model"], _vertical_oracle(X, y, w, parts, params))


@pytest.mark.parametrize("subsample", [1.0, 0.7])
def test_the_hybridtree_hosts_weights_give_its_weighted_solo_and_leave_weight_0_out(subsample):
    # the host's weights: without guest layers its model is the engine's weighted SOLO; with them the encrypted
    # run is the plaintext-gradient run, the weights change it, and the labels of instances of weight 0 do not
    from dataclasses import replace

    from fedgrove.protocols.hybridtree.simulate import run_hybridtree

    X, y, w = _task("binary")
    r = np.random.default_rng(0)
    guests = [(X[rows][:, 3:], rows) for rows in (np.sort(r.choice(len(y), 700, replace=False)) for _ in range(2))]
    params = GBDTParams(n_estimators=3, learning_rate=0.3, max_bins=32, seed=2, subsample=subsample)
    ou, plain = keygen("ou", 2048), keygen("ou", 2048, "plain")
    solo = run_hybridtree(X[:, :3], y, guests, params, ou, 3, 0, sample_weight=w)
    np.testing.assert_array_equal(
        solo["raw"][:, 0], train_gbdt(replace(params, max_depth=3), X[:, :3], y, sample_weight=w).predict_raw(X[:, :3]))
    enc = run_hybridtree(X[:, :3], y, guests, params, ou, 3, 2, sample_weight=w)
    text = run_hybridtree(X[:, :3], y, guests, params, plain, 3, 2, sample_weight=w)
    np.testing.assert_allclose(enc["raw"], text["raw"], rtol=0, atol=1e-9)
    assert enc["model"].guest_values == text["model"].guest_values and any(enc["model"].guest_values)
    flipped = np.where(w == 0, 1 - y, y)
    other = run_hybridtree(X[:, :3], flipped, guests, params, plain, 3, 2, sample_weight=w)
    np.testing.assert_array_equal(other["raw"][w > 0], text["raw"][w > 0])
    unweighted = run_hybridtree(X[:, :3], y, guests, params, plain, 3, 2)
    assert not np.allclose(unweighted["raw"], text["raw"])
    with pytest.raises(InvalidParameterError, match="count mode takes no row weights"):
        run_hybridtree(X[:, :3], y, guests, replace(params, subsample=1.0), plain, 3, 2, mode="count",
                       sample_weight=w)


def test_gradients_too_wide_to_pack_are_refused_by_the_key_holder_naming_the_cause():
    # a passive party refused the layout (value bits over 64) and the active party's run stopped with "packing
    # layout ... from party0 is out of range": regression labels of 1e25 did so before weights existed
    from fedgrove.protocols.hybridtree.simulate import run_hybridtree

    X, y, _ = _task("binary", n=200)
    params = GBDTParams(n_estimators=1, max_depth=2)
    he = keygen("ou", 2048)
    parts = [X[:, :3], X[:, 3:]]
    for y_, w, objective, message in [
            (y, np.full(200, 1e20), "binary", r"Weights up to 1e\+20 give gradients up to 2\^67, beyond the 2\^64 "
                                              r"the encrypted gradients hold: divide the weights by a power of ten"),
            (X[:, 0] * 1e25, None, "regression", r"Regression labels up to \S+ from their mean give gradients up "
                                                 r"to 2\^\d+, .* divide the labels by a power of ten"),
            (X[:, 0] * 1e10, np.full(200, 1e15), "regression", r"from their mean and weights up to 1e\+15 give .* "
                                                               r"divide the labels or the weights by")]:
        with pytest.raises(DataError, match=message):
            run_vertical(parts, np.nan_to_num(y_), GBDTParams(objective, n_estimators=1, max_depth=2), he,
                         sample_weight=w)
    with pytest.raises(DataError, match="Regression labels up to"):
        run_hybridtree(parts[0], np.nan_to_num(X[:, 0]) * 1e25, [(parts[1][:100], np.arange(100))],
                       GBDTParams("regression", n_estimators=1, max_depth=2), he, 1, 1)
    w = np.full(200, 2.0 ** 62)  # the widest weights the packing holds are lossless still
    _same_trees(run_vertical(parts, y, params, he, sample_weight=w)["model"],
                _vertical_oracle(X, y, w, [np.arange(3), np.arange(3, 6)], params))


def _files(tmp_path, protocol):
    r = np.random.default_rng(6)
    n = 360
    X = r.normal(size=(n, 4))
    df = pd.DataFrame(X, columns=["a", "b", "c", "d"])
    df["y"] = (X[:, 0] + 0.5 * X[:, 2] + 0.4 * r.normal(size=n) > 0).astype(int)
    df["w"] = r.integers(0, 4, size=n) * 0.5
    df.insert(0, "_id", np.arange(n))
    train, test = df.iloc[:300], df.iloc[300:]
    if protocol == "horizontal":
        train.iloc[:150].to_csv(tmp_path / "p0.csv", index=False)
        train.iloc[150:].to_csv(tmp_path / "p1.csv", index=False)
        test.to_csv(tmp_path / "test.csv", index=False)
        parties = [("aggregator", "aggregator", None, None)] + [
            (f"p{k}", "client", f"p{k}.csv", "test.csv") for k in range(2)]
    else:  # the label holder's rows shuffled: sorted by _id, the weights with them
        train[["_id", "a", "b", "y", "w"]].sample(frac=1, random_state=1).to_csv(tmp_path / "act.csv", index=False)
        train[["_id", "c", "d"]].to_csv(tmp_path / "pas.csv", index=False)
        test[["_id", "a", "b", "y", "w"]].to_csv(tmp_path / "act-test.csv", index=False)
        test[["_id", "c", "d"]].to_csv(tmp_path / "pas-test.csv", index=False)
        roles = ("active", "passive") if protocol == "vertical" else ("client", "client")
        parties = [("act", roles[0], "act.csv", "act-test.csv"), ("pas", roles[1], "pas.csv", "pas-test.csv")]
        if protocol == "federated-forest":
            parties.insert(0, ("master", "master", None, None))
    text = f'[federation]\nprotocol = "{protocol}"\ntimeout = 60\n[he]\nscheme = "ou"\n' \
           f'[params]\nn_estimators = 4\nmax_depth = 3\nmax_bins = 16\n'
    for name, role, data, test_file in parties:
        text += f'[[party]]\nname = "{name}"\nrole = "{role}"\n'
        if data:
            text += f'data = "{data}"\ntest = "{test_file}"\n'
            if name != "pas":
                text += 'label = "y"\nweight = "w"\n'
    if protocol == "horizontal":
        text = text.replace('[he]\nscheme = "ou"\n', "")
    (tmp_path / "fed.toml").write_text(text + '[output]\ndir = "runs"\n')
    return train, test


@pytest.mark.parametrize("protocol", ["horizontal", "vertical"])
def test_a_configs_weight_column_weighs_the_rows_and_is_no_feature(tmp_path, capsys, protocol):
    train, test = _files(tmp_path, protocol)
    assert main(["simulate", str(tmp_path / "fed.toml")]) == 0
    out = "".join(capsys.readouterr())
    lead = "p0" if protocol == "horizontal" else "act"
    model = load_model(tmp_path / "runs" / f"{lead}.model.json")
    assert model.metadata["weight"] == "w"
    params = GBDTParams(n_estimators=4, max_depth=3, max_bins=16)
    if protocol == "horizontal":
        assert model.feature_names == ["a", "b", "c", "d"]
        fed = run_horizontal([(train.iloc[s][["a", "b", "c", "d"]].to_numpy(), train.iloc[s]["y"].to_numpy(float),
                               train.iloc[s]["w"].to_numpy()) for s in (slice(0, 150), slice(150, 300))], params)
        _same_trees(model, fed["model"])
    else:
        assert model.metadata["own_feature_names"] == ["a", "b"]
        X = train[["a", "b", "c", "d"]].to_numpy()
        _same_trees(model, _vertical_oracle(X, train["y"].to_numpy(float), train["w"].to_numpy(),
                                            [np.array([0, 1]), np.array([2, 3])], params))
    # the test file holds the weight column too: it is no feature there, and it weighs the test scores
    pred = pd.read_csv(tmp_path / "runs" / f"{lead}.predictions.csv")
    assert len(pred) == len(test) and (pred["_id"].to_numpy() == test["_id"].to_numpy()).all()
    stats = json.loads((tmp_path / "runs" / f"{lead}.stats.json").read_text())
    from fedgrove import metrics

    right = (pred["prediction"].to_numpy() == test["y"].to_numpy())
    assert stats["test_accuracy"] == pytest.approx(np.average(right, weights=test["w"]))
    assert stats["test_accuracy"] > 0.75
    assert stats["test_auc"] == pytest.approx(metrics.auc(test["y"].to_numpy(), pred["p_1"].to_numpy(),
                                                          sample_weight=test["w"].to_numpy()))
    assert stats["test_weight"] == "w" and stats["test_accuracy"] != pytest.approx(right.mean())
    assert re.search(rf"{lead}: 60 predictions in .*, rows weighted by 'w'\)", " ".join(out.split())), out
    assert main(["info", str(tmp_path / "runs" / f"{lead}.model.json")]) == 0
    assert re.search(r"weight column\s+│ w\s", capsys.readouterr().out)
    if protocol == "horizontal":  # a client's whole model predicts alone, the weight column left out
        assert main(["predict", str(tmp_path / "runs" / "p0.model.json"), str(tmp_path / "test.csv"), "-l", "y",
                     "-o", str(tmp_path / "alone.csv")]) == 0
        assert "columns the model does not use, left out: w" in capsys.readouterr().err
        np.testing.assert_array_equal(pd.read_csv(tmp_path / "alone.csv")["prediction"], pred["prediction"])


def test_a_weight_on_a_role_that_takes_none_is_refused(tmp_path, capsys):
    _files(tmp_path, "vertical")
    cfg = tmp_path / "fed.toml"
    cfg.write_text(cfg.read_text().replace('data = "pas.csv"\n', 'data = "pas.csv"\nweight = "c"\n'))
    assert main(["simulate", str(cfg)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "party pas: weight = 'c': the vertical protocol's passive takes no row weights (they are taken by the " \
           "horizontal protocol's client; the vertical protocol's active; the hybridtree protocol's host; the " \
           "federated-forest protocol's client with the labels; the simfl protocol's party); remove it" in err
    _files(tmp_path, "vertical")
    cfg.write_text(cfg.read_text().replace('weight = "w"', 'weight = "nope"'))
    assert main(["simulate", str(cfg)]) != 0
    assert "party act: weight column 'nope' not found in" in " ".join(capsys.readouterr().err.split())
    assert not (tmp_path / "runs" / "act.model.json").exists()


# ------------------------------------------------------------------------------------------ Federated Forest
def _forest_oracle(parts, y, w, holder, params):
    """The engine's weighted forest on the clients' columns side by side, with the federation's cut points: the
    label holder's fitted on its rows of positive weight, weighted as the forest weighs them; the others' not
    (``w`` None: the unweighted forest, every client's cut points its own)."""
    from fedgrove.engine.forest import forest_weights, train_forest

    fw = None if w is None else forest_weights(w)
    cuts = []
    for k, X in enumerate(parts):
        bins = BinMapper(params.max_bins, seed=params.seed)
        cuts += (bins.fit(X[fw > 0], fw[fw > 0]) if k == holder and fw is not None else bins.fit(X)).cuts_
    return train_forest(params, np.hstack(parts), y, sample_weight=w,
                        bin_mapper=BinMapper.from_cuts(cuts, params.max_bins))


def _same_forest(fed, eng):
    assert fed.n_trees == eng.n_trees
    for a, b in zip(fed.trees, eng.trees):
        for name in ("feature", "left", "right", "missing_left", "count", "gain"):
            np.testing.assert_array_equal(a.nodes[name], b.nodes[name], err_msg=name)
        np.testing.assert_array_equal(a.values, b.values)


FOREST_CASES = [("binary", "encrypted", {}), ("multiclass", "shared", dict(feature_sampling="node")),
                ("regression", "encrypted", dict(task="regression")),
                ("regression", "shared", dict(task="regression", bootstrap=False, feature_sampling="node"))]


@pytest.mark.parametrize("objective,mode,extra", FOREST_CASES, ids=[f"{o}-{m}" for o, m, _ in FOREST_CASES])
def test_the_forest_label_holders_weights_give_the_engines_weighted_forest(objective, mode, extra):
    from fedgrove.engine.forest import ForestParams
    from fedgrove.protocols.forest import messages as fm
    from fedgrove.protocols.forest.simulate import run_federated_forest

    X, y, w = _task(objective, n=900)
    parts = [X[:, [0, 5]], X[:, [1, 2]], X[:, [3, 4]]]
    params = ForestParams(**{"n_estimators": 3, "max_depth": 5, "max_bins": 32, "seed": 4, **extra})
    he = keygen("ou", 2048) if mode == "encrypted" else None
    seen = []
    out = run_federated_forest(parts, y, params, he, mode=mode, label_holder=1, X_test_parts=parts, sample_weight=w,
                               observers={"client2": [lambda d, peer, tag, msg: seen.append(msg)]})
    ref = _forest_oracle(parts, y, w, 1, params)
    _same_forest(out["model"], ref)
    expect = ref.predict(np.hstack(parts)) if objective == "regression" else ref.predict_proba(np.hstack(parts))
    np.testing.assert_array_equal(out["predictions"]["one-round"], expect)
    # the other clients learn which instances weigh 0 (never drawn), and in encrypted mode no more of the weights
    starts = [msg for msg in seen if isinstance(msg, fm.TreeStart)]
    assert len(starts) == 3 and all((s.weights[w == 0] == 0).all() and (s.weights[w > 0] > 0).any() for s in starts)
    labels = [msg for msg in seen if isinstance(msg, (fm.EncryptedLabelStats, fm.SharedLabels))]
    if mode == "encrypted":
        assert [s.n for s in labels] == [int((s.weights > 0).sum()) for s in starts]
    else:  # the trusted setting: the labels and the weights are shared with every client
        assert len(labels) == 1 and np.array_equal(labels[0].w > 0, w > 0)
    plain = run_federated_forest(parts, y, params, he, mode=mode, label_holder=1)["model"]
    assert _differ(out["model"], plain)


def test_forest_weights_that_are_whole_pack_as_counts_and_negligible_ones_weigh_0():
    from fedgrove.engine.forest import ForestParams, forest_weights
    from fedgrove.protocols.forest.client import label_packer
    from fedgrove.protocols.forest.simulate import run_federated_forest

    X, y, _ = _task("multiclass", n=600)
    # equal weights are the unweighted forest, in the unweighted layout; others take the fraction bits they need
    # (weights 1 and 3 are 0.5 and 1.5 at an average of 1: one bit), a 52-bit grid's at most
    for task in ("classification", "regression"):
        assert label_packer(task, y, 3, forest_weights(np.full(600, 2.5))) == label_packer(task, y, 3)
    assert label_packer("classification", y, 3, forest_weights(np.where(np.arange(600) % 2, 1.0, 3.0))).frac_bits \
        == (1, 1, 1)
    assert label_packer("classification", y, 3, forest_weights(np.arange(600) / 7.0)).frac_bits[0] \
        + label_packer("classification", y, 3, forest_weights(np.arange(600) / 7.0)).int_bits[0] == 52
    parts = [X[:, :3], X[:, 3:]]
    params = ForestParams(n_estimators=3, max_depth=4, max_bins=16, seed=1)
    he = keygen("ou", 2048)
    _same_forest(run_federated_forest(parts, y, params, he, sample_weight=np.full(600, 2.5))["model"],
                 run_federated_forest(parts, y, params, he)["model"])
    # a weight below 2^-52 of the bootstraps' total is 0 on the forest's grid: left out as a weight of 0 is
    w = np.ones(600)
    w[::7] = 1e-30
    tiny = run_federated_forest(parts, y, params, he, sample_weight=w)["model"]
    _same_forest(tiny, run_federated_forest(parts, y, params, he, sample_weight=np.where(w < 1, 0.0, 1.0))["model"])
    _same_forest(tiny, _forest_oracle(parts, y, w, 0, params))


def test_forest_weights_go_to_the_label_holder_and_bad_ones_are_refused():
    from fedgrove.protocols.forest.client import ForestClient
    from fedgrove.transport.inprocess import InProcessHub

    X, y, _ = _task("binary", n=100)
    ch = InProcessHub(["master", "c"]).channel("c")
    with pytest.raises(InvalidParameterError, match="c: row weights belong with the labels, and this client holds "
                                                    "none: give them to the label holder"):
        ForestClient(ch, X, "master", sample_weight=np.ones(100))
    with pytest.raises(DataError, match=r"must hold one weight per row of c's X, shape \(100,\), got shape \(99,\)"):
        ForestClient(ch, X, "master", y=y, sample_weight=np.ones(99))
    with pytest.raises(DataError, match="must be finite and non-negative, got -1.0 in row 3"):
        ForestClient(ch, X, "master", y=y, sample_weight=np.where(np.arange(100) == 3, -1.0, 1.0))


def test_a_forest_label_holders_weight_column_weighs_the_forest_and_its_test_scores(tmp_path, capsys):
    from fedgrove.protocols.forest.simulate import run_federated_forest
    from fedgrove.runner.config import load_federation

    train, test = _files(tmp_path, "federated-forest")
    cfg = tmp_path / "fed.toml"
    assert main(["simulate", str(cfg)]) == 0
    out = " ".join("".join(capsys.readouterr()).split())
    model = load_model(tmp_path / "runs" / "master.model.json")
    assert model.metadata["weighted_by"] == "act"
    fed = run_federated_forest([train[["a", "b"]].to_numpy(), train[["c", "d"]].to_numpy()], train["y"].to_numpy(),
                               load_federation(cfg).make_params(), keygen("ou", 2048),
                               sample_weight=train["w"].to_numpy())
    _same_forest(model, fed["model"])
    # the label holder scores the master's predictions of its test rows, weighted by the test file's weights
    pred = pd.read_csv(tmp_path / "runs" / "master.predictions.csv")
    right = pred["prediction"].to_numpy() == test["y"].to_numpy()
    stats = json.loads((tmp_path / "runs" / "act.stats.json").read_text())
    assert stats["test_weight"] == "w" and stats["test_accuracy"] == pytest.approx(np.average(right, weights=test["w"]))
    assert stats["test_accuracy"] != pytest.approx(right.mean())
    assert re.search(r"act: accuracy \S+ auc \S+, rows weighted by 'w' on its 60 test rows", out), out
    assert main(["info", str(tmp_path / "runs" / "master.model.json")]) == 0
    assert re.search(r"row weights\s+│ act's \(the label holder's\)", capsys.readouterr().out)
    # the weights go with the labels: a client without them is refused one
    cfg.write_text(cfg.read_text().replace('data = "pas.csv"\n', 'data = "pas.csv"\nweight = "c"\n'))
    assert main(["simulate", str(cfg)]) == 2
    assert "party pas: weight = 'c', but no label: a Federated Forest's row weights go with its labels; move the " \
           "weight to the label holder" in " ".join(capsys.readouterr().err.split())


def test_weighted_class_counts_too_wide_for_the_key_are_refused_naming_the_weights_bits():
    # weighted class counts carry the weights' fraction bits: 14 classes fit a Paillier plaintext, not an OU one
    from fedgrove.engine.forest import ForestParams
    from fedgrove.protocols.forest.simulate import run_federated_forest

    r = np.random.default_rng(2)
    X = r.normal(size=(300, 4))
    y = np.arange(300) % 14.0
    w = r.uniform(0.5, 2, 300)
    params = ForestParams(n_estimators=1, max_depth=2, max_bins=8)
    with pytest.raises(InvalidParameterError, match=r"client0: 14 classes need \d+-bit plaintexts to encrypt each "
                                                    r"instance's weighted class counts \(\d+ bits below the binary "
                                                    r"point each, for the row weights\); the OU key gives"):
        run_federated_forest([X[:, :2], X[:, 2:]], y, params, keygen("ou", 2048), sample_weight=w)
    out = run_federated_forest([X[:, :2], X[:, 2:]], y, params, keygen("paillier", 2048), sample_weight=w)
    _same_forest(out["model"], _forest_oracle([X[:, :2], X[:, 2:]], y, w, 0, params))


# ------------------------------------------------------------------------------------------------------ SimFL
def test_simfl_weights_of_whole_numbers_are_copies_of_the_rows():
    # a weight k is k copies of the row and 0 its removal, as in the engine: copies hash alike, so a peer's
    # instance finds the first copy similar (the lowest ID) and every copy sends its sums to the same instance;
    # the weighted run is the run on the copies, tree for tree (the schedule in turn: blocks follow row counts)
    from fedgrove.protocols.simfl.party import SimFLOptions
    from fedgrove.protocols.simfl.simulate import run_simfl

    X, y, _ = _task("binary", n=500)
    w = np.random.default_rng(8).integers(0, 4, 500)
    halves = [slice(0, 240), slice(240, 500)]
    params = GBDTParams(n_estimators=6, max_depth=3, max_bins=32, learning_rate=0.3, seed=1)
    options = SimFLOptions(schedule="round-robin")
    weighted = run_simfl([(X[s], y[s]) for s in halves], params, options,
                         sample_weight=[w[s].astype(float) for s in halves])
    copies = run_simfl([(np.repeat(X[s], w[s], axis=0), np.repeat(y[s], w[s])) for s in halves], params, options)
    a, b = weighted["model"], copies["model"]
    assert a.n_trees == b.n_trees == 6
    for s, t in zip(a.trees, b.trees):
        for name in ("feature", "threshold", "missing_left", "left", "right"):
            np.testing.assert_array_equal(s.nodes[name], t.nodes[name], err_msg=name)
        np.testing.assert_allclose(s.values, t.values, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(a.predict_raw(X), b.predict_raw(X), rtol=1e-9, atol=1e-12)
    # the rows of weight 0 are left out of the similarity search too, and the weights changed the model
    similar = weighted["similarity"]["party0"].similar["party1"]  # per row of party0's, one of party1's or -1
    assert len(similar) == (w[halves[0]] > 0).sum() and similar.max() < (w[halves[1]] > 0).sum()
    assert _differ(a, run_simfl([(X[s], y[s]) for s in halves], params, options)["model"])


def test_simfl_bad_weights_are_refused_naming_them():
    from fedgrove.protocols.simfl.simulate import run_simfl

    X, y, _ = _task("binary", n=100)
    params = GBDTParams(n_estimators=1, max_depth=2)
    parts = [(X[:50], y[:50]), (X[50:], y[50:])]
    with pytest.raises(InvalidParameterError, match="sample_weight must be a list of one party's weights \\(or "
                                                    "None\\) per part, 2, got list of 1"):
        run_simfl(parts, params, sample_weight=[np.ones(50)])
    with pytest.raises(DataError, match="must be finite and non-negative, got -1.0 in row 0"):
        run_simfl(parts, params, sample_weight=[None, -np.ones(50)])
