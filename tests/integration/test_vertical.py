"""Vertical node-level GBDT: lossless against the engine, prediction, what crosses party lines."""

import numpy as np
import pytest

from fedgrove.crypto.he import available_backends, keygen
from fedgrove.engine.binning import BinMapper
from fedgrove.engine.gbdt import GBDTParams, train_gbdt
from fedgrove.exceptions import InvalidParameterError
from fedgrove.protocols.vertical import messages as m
from fedgrove.protocols.vertical.simulate import run_vertical
from tests.conftest import gradient_arrays_left_alive, make_classification


def _split(X, n_parties, seed=0):
    perm = np.random.default_rng(seed).permutation(X.shape[1])
    return [np.sort(p) for p in np.array_split(perm, n_parties)]


def _oracle(X, y, parts, params):
    # the engine on the joined data, features in federation order, each party's own cut points
    Xj = np.concatenate([X[:, p] for p in parts], axis=1)
    cuts = sum([BinMapper(params.max_bins, seed=params.seed).fit(X[:, p]).cuts_ for p in parts], [])
    return train_gbdt(params, Xj, y, bin_mapper=BinMapper.from_cuts(cuts, params.max_bins)), Xj


def _assert_same_trees(fed, eng):
    assert len(fed.trees) == len(eng.trees)
    for a, b in zip(fed.trees, eng.trees):
        np.testing.assert_array_equal(a.nodes["feature"], b.nodes["feature"])
        np.testing.assert_array_equal(a.nodes["bin"], b.nodes["bin"])
        np.testing.assert_array_equal(a.nodes["missing_left"], b.nodes["missing_left"])
        np.testing.assert_allclose(a.values, b.values, rtol=0, atol=1e-9)


CASES = [("heu", "ou", 3000, 2), ("heu", "paillier", 1500, 1), ("gmpy2", "ou", 1500, 2), ("phe", "paillier", 150, 1)]


@pytest.mark.parametrize("n_parties", [2, 3])
@pytest.mark.parametrize("backend,scheme,n_rows,n_trees",
                         [c for c in CASES if c[0] in available_backends()], ids=lambda c: str(c))
def test_lossless_on_a9a(a9a, n_parties, backend, scheme, n_rows, n_trees):
    X, y = a9a.train.X[:n_rows], a9a.train.y[:n_rows]
    parts = _split(X, n_parties)
    params = GBDTParams(n_estimators=n_trees, max_depth=4)
    out = run_vertical([X[:, p] for p in parts], y, params, keygen(scheme, 2048, backend),
                       X_test_parts=[a9a.test.X[:500][:, p] for p in parts])
    eng, _ = _oracle(X, y, parts, params)
    _assert_same_trees(out["model"], eng)
    Xt = np.concatenate([a9a.test.X[:500][:, p] for p in parts], axis=1)
    np.testing.assert_allclose(out["raw"], eng.predict_raw(Xt), atol=1e-9)  # multi-party prediction


@pytest.mark.parametrize("backend,scheme", [c[:2] for c in CASES if c[0] in available_backends()])
def test_lossless_on_a_small_continuous_table_whose_gradient_ciphertexts_are_shifted_into_place(
        shifted_orders, backend, scheme):
    # 120 rows of 18 continuous columns, a row or two a bin: more bin sums than gradient ciphertexts, so the passive
    # parties multiply the ciphertexts by 2^W, 2^2W, ... instead of the sums (HEContext.compressed_sums);
    # the trees are still the engine's
    r = np.random.default_rng(9)
    X = r.normal(size=(120, 18))
    X[r.random(X.shape) < 0.05] = np.nan
    y = (np.nan_to_num(X[:, 0]) + np.nan_to_num(X[:, 3]) + r.normal(size=120) > 0).astype(float)
    parts = _split(X, 3, seed=2)
    params = GBDTParams(n_estimators=2, max_depth=4)
    out = run_vertical([X[:, p] for p in parts], y, params, keygen(scheme, 2048, backend),
                       X_test_parts=[X[:, p] for p in parts])
    assert any(shifted_orders) and shifted_orders.count(True) >= len(shifted_orders) // 2
    eng, Xj = _oracle(X, y, parts, params)
    _assert_same_trees(out["model"], eng)
    np.testing.assert_allclose(out["raw"], eng.predict_raw(Xj), atol=1e-9)


def test_several_instances_per_gradient_ciphertext_are_lossless_and_send_fewer_bytes(a9a):
    """Instances packed several to a gradient ciphertext (Paillier's default, 3: its cases above run so) give
    the same trees and a smaller gradient message; a count whose layout the key's plaintexts cannot hold is
    refused."""
    from fedgrove.protocols.vertical.active import default_rows_per_ciphertext, packer_for

    X, y = a9a.train.X[:1200], a9a.train.y[:1200]
    parts = _split(X, 2)
    params = GBDTParams(n_estimators=2, max_depth=4)
    he = keygen("ou")
    eng, _ = _oracle(X, y, parts, params)
    sizes = {}
    for k in (1, 2):
        seen = []
        out = run_vertical([X[:, p] for p in parts], y, params, he, rows_per_ciphertext=k,
                           observers={"party1": [lambda d, peer, tag, msg: seen.append(msg)]})
        _assert_same_trees(out["model"], eng)
        sizes[k] = [len(x.ciphertexts) for x in seen if isinstance(x, m.EncryptedGradients)]
        assert len(sizes[k]) == 2
    assert sizes[2][0] < 0.55 * sizes[1][0]
    for k in (0, 3):  # OU's 683-bit plaintexts hold no whole bin of three 175-bit positions with partners
        with pytest.raises(InvalidParameterError, match="rows_per_ciphertext must be an integer from 1 to 16"):
            run_vertical([X[:, p] for p in parts], y, params, he, rows_per_ciphertext=k)
    packer = packer_for("binary", y)
    assert default_rows_per_ciphertext(he, packer) == (3 if he.scheme == "paillier" else 1)
    assert default_rows_per_ciphertext(keygen("ou", 2048, "plain"), packer) == 1


def test_column_sampling_is_lossless_and_passive_parties_sum_only_the_sampled_features(a9a):
    """colsample_bytree: the active party draws the engine's features each round and tells each passive party
    which of its own are sampled; those sum only their bins (with OU, whose additions search row patterns), so
    they send less, and the trees are the engine's.  A request naming features the party lacks is refused."""
    from fedgrove.exceptions import ProtocolError
    from fedgrove.protocols.vertical.passive import encrypted_histograms

    X, y = a9a.train.X[:1200], a9a.train.y[:1200]
    parts = _split(X, 3)
    he = keygen("ou")
    sent, requests = {}, []
    for colsample in (1.0, 0.3):
        params = GBDTParams(n_estimators=3, max_depth=4, colsample_bytree=colsample)
        out = run_vertical([X[:, p] for p in parts], y, params, he,
                           observers={"party1": [lambda d, peer, tag, msg: requests.append(msg)
                                                 if isinstance(msg, m.HistogramRequest) else None]})
        _assert_same_trees(out["model"], _oracle(X, y, parts, params)[0])
        sent[colsample] = out["stats"]["party1"]["total_sent"] + out["stats"]["party2"]["total_sent"]
    assert sent[0.3] < 0.6 * sent[1.0], sent
    sampled = [r for r in requests if r.sampled]
    assert sampled and all(len(r.features) < len(parts[1]) for r in sampled)
    assert not any(r.sampled for r in requests[:len(requests) - len(sampled)])  # (colsample 1: none)
    with pytest.raises(ProtocolError, match=r"histogram request for features \[7\] outside its 5"):
        encrypted_histograms("party1", [0], {0: np.arange(3)}, np.zeros((3, 5), dtype=np.uint8),
                             np.arange(0, 36, 6), None, keygen("ou", 2048, "plain"), None, features=[7])


def test_row_subsampling_is_lossless_and_encrypts_only_the_sampled_instances(a9a):
    """subsample: the active party draws the engine's rows each round and encrypts only their gradients (the
    passive parties grow the tree on them), then routes every instance with the passive parties' go-left bits
    at their splits; the trees and training scores are the engine's."""
    X, y = a9a.train.X[:1200], a9a.train.y[:1200]
    parts = _split(X, 2)
    he = keygen("ou")
    sizes = {}
    for subsample in (1.0, 0.5):
        seen = []
        params = GBDTParams(n_estimators=3, max_depth=4, subsample=subsample, colsample_bytree=0.7)
        out = run_vertical([X[:, p] for p in parts], y, params, he, X_test_parts=[X[:, p] for p in parts],
                           observers={"party1": [lambda d, peer, tag, msg: seen.append(msg)]})
        eng, Xj = _oracle(X, y, parts, params)
        _assert_same_trees(out["model"], eng)
        np.testing.assert_allclose(out["raw"], eng.predict_raw(Xj), rtol=1e-9, atol=1e-9)
        grads = [x for x in seen if isinstance(x, m.EncryptedGradients)]
        sizes[subsample] = sum(len(x.ciphertexts) for x in grads)
        assert all(x.sampled == (subsample < 1) and len(x.rows) == (600 if subsample < 1 else 0) for x in grads)
        assert sum(isinstance(x, m.PredictBits) for x in seen) == (3 if subsample < 1 else 0) + 1  # (+ predict)
    assert sizes[0.5] < 0.55 * sizes[1.0]


@pytest.mark.parametrize("objective", ["multiclass", "regression"])
def test_lossless_multiclass_and_regression_with_missing_values(objective):
    r = np.random.default_rng(4)
    X = r.normal(size=(1200, 6))
    X[r.random(X.shape) < 0.1] = np.nan
    base = np.nan_to_num(X[:, 0]) + np.nan_to_num(X[:, 4]) * 0.8
    y = np.digitize(base, [-0.5, 0.6]).astype(float) if objective == "multiclass" else base * 3 + r.normal(size=1200)
    parts = _split(X, 2, seed=1)
    params = GBDTParams(objective, n_estimators=2, max_depth=3, max_bins=32)
    out = run_vertical([X[:, p] for p in parts], y, params, keygen("ou"), X_test_parts=[X[:, p] for p in parts])
    eng, Xj = _oracle(X, y, parts, params)
    _assert_same_trees(out["model"], eng)
    np.testing.assert_allclose(out["raw"], eng.predict_raw(Xj), atol=1e-9)
    # the active party's importance covers every party's features, as the engine's on the joined table
    np.testing.assert_array_equal(out["model"].feature_importance("split"), eng.feature_importance("split"))
    np.testing.assert_allclose(out["model"].feature_importance("gain"), eng.feature_importance("gain"), rtol=1e-9)
    assert out["model"].feature_labels() == [f"party{k}:{j}" for k, p in enumerate(parts) for j in range(len(p))]


def test_no_party_holds_a_trees_gradient_ciphertexts_when_the_next_trees_come(monkeypatch):
    # the active party's array once its bytes are sent, a passive party's once its tree is grown (before, each
    # held two trees' arrays at once, about 1.7 kB an instance with HEU's OU: 1,189 MB peak against 959 MB now
    # for 200,000 rows x 20 features, 3 trees, in one process)
    X, y = make_classification(300, 6, seed=4)
    alive = gradient_arrays_left_alive(monkeypatch, {300})
    out = run_vertical([X[:, :3], X[:, 3:]], y, GBDTParams(n_estimators=4, max_depth=3),
                       keygen("ou", 2048, "plain"))
    assert out["model"].n_trees == 4 and not alive, alive


def test_passive_parties_see_only_ciphertexts_and_node_sets(a9a):
    X, y = a9a.train.X[:800], a9a.train.y[:800]
    parts = _split(X, 2)
    seen = []
    observers = {"party1": [lambda direction, peer, tag, msg: seen.append((direction, msg))]}
    out = run_vertical([X[:, p] for p in parts], y, GBDTParams(n_estimators=1, max_depth=3), keygen("ou"),
                       observers=observers)
    received = [msg for d, msg in seen if d == "recv"]
    allowed = (m.PublicKey, m.Start, m.EncryptedGradients, m.HistogramRequest, m.SplitQuery, m.LayerPartition,
               m.TreeEnd, m.TrainingDone)
    assert received and all(isinstance(x, allowed) for x in received)
    for x in received:  # no float array (plaintext gradients, labels) ever reaches a passive party
        for value in vars(x).values():
            assert not (isinstance(value, np.ndarray) and value.dtype.kind == "f")
    # the active party's tree holds no threshold of the passive party's splits
    tree = out["model"].trees[0]
    owned = tree.nodes["owner"] == 1
    assert owned.any() and np.isnan(tree.nodes["threshold"][owned]).all()
    assert out["passive_models"]["party1"].splits  # ...which the passive party keeps


def test_protocol_parameters_are_checked():
    with pytest.raises(InvalidParameterError, match="min_samples_leaf=1"):
        run_vertical([np.zeros((10, 2)), np.zeros((10, 2))], np.zeros(10), GBDTParams(min_samples_leaf=5),
                     keygen("ou"))


def test_parties_holding_different_instances_are_stopped():
    from fedgrove.exceptions import ProtocolError
    from fedgrove.protocols.vertical.active import VerticalActive
    from fedgrove.protocols.vertical.passive import VerticalPassive
    from fedgrove.transport.inprocess import InProcessHub, run_parties

    r = np.random.default_rng(0)
    X, y = r.normal(size=(50, 4)), (r.random(50) < 0.5).astype(float)
    hub = InProcessHub(["a", "p"])
    roles = {"a": lambda ch: VerticalActive(ch, X[:, :2], y, ["p"], GBDTParams(n_estimators=1), keygen("ou"),
                                            ids=np.arange(50)).fit(),
             "p": lambda ch: VerticalPassive(ch, X[:, 2:], "a", ids=np.arange(1, 51)).fit()}
    with pytest.raises(ProtocolError, match="p holds a different set of instances"):
        run_parties(hub, roles, timeout=10)


def test_test_files_holding_other_instances_are_refused_at_prediction():
    # test files with the same number of rows but other instances were predicted row against unrelated row
    from fedgrove.exceptions import ProtocolError
    from fedgrove.protocols.vertical.active import predict_active
    from fedgrove.protocols.vertical.passive import answer_predict
    from fedgrove.transport.inprocess import InProcessHub, run_parties

    r = np.random.default_rng(0)
    X, y = r.normal(size=(60, 4)), (r.random(60) < 0.5).astype(float)
    out = run_vertical([X[:, :2], X[:, 2:]], y, GBDTParams(n_estimators=2, max_depth=2), keygen("ou", 2048, "plain"))
    model, part = out["model"], out["passive_models"]["party1"]

    def predict(active_ids, passive_ids):
        hub = InProcessHub(["party0", "party1"])
        roles = {"party0": lambda ch: predict_active(ch, ["party1"], model, X[:, :2], active_ids),
                 "party1": lambda ch: answer_predict(ch, "party0", part, X[:, 2:], passive_ids)}
        return run_parties(hub, roles, timeout=10)[0]["party0"]

    np.testing.assert_array_equal(predict(np.arange(60), np.arange(60)), predict(None, None))  # same IDs: as before
    with pytest.raises(ProtocolError, match="party1: its test instances are not party0's"):
        predict(np.arange(60), np.arange(100, 160))
    with pytest.raises(ProtocolError, match="party0 asked to predict 60 test instances, party1's test data holds 59"):
        hub = InProcessHub(["party0", "party1"])
        run_parties(hub, {"party0": lambda ch: predict_active(ch, ["party1"], model, X[:, :2]),
                          "party1": lambda ch: answer_predict(ch, "party0", part, X[1:, 2:])}, timeout=10)



def test_a_passive_party_frame_sorted_apart_is_refused_as_misaligned():
    # run_vertical matches the parties' rows by position: a passive party's DataFrame shuffled on its own trained
    # on misaligned rows without a word; so did the federated forest's
    import pandas as pd

    from fedgrove import ForestParams, run_federated_forest
    from fedgrove.exceptions import DataError

    r = np.random.default_rng(3)
    X = pd.DataFrame(r.normal(size=(80, 4)), columns=list("abcd"))
    y = pd.Series((X["a"] > 0).astype(int))
    parts = [X[["a", "b"]], X[["c", "d"]].sample(frac=1, random_state=0)]
    with pytest.raises(DataError, match=r"X_parts\[1\] and y are pandas objects with different row labels"):
        run_vertical(parts, y, GBDTParams(n_estimators=1, max_depth=2), keygen("ou", 2048, "plain"))
    with pytest.raises(DataError, match=r"X_parts\[1\] and y are pandas objects with different row labels"):
        run_federated_forest(parts, y, ForestParams(n_estimators=1, max_depth=2), mode="shared")


def test_text_in_a_feature_holders_part_is_refused_naming_the_party():
    # the passive party, the forest's client and the HybridTree guest raised numpy's bare "could not convert
    # string to float" from inside their thread; the active party named it
    from fedgrove import ForestParams, run_federated_forest, run_hybridtree
    from fedgrove.exceptions import DataError

    X = np.random.default_rng(0).normal(size=(50, 3))
    y = (X[:, 0] > 0).astype(float)
    text = X.astype(object)
    text[0, 0] = "a"
    plain = keygen("ou", 2048, "plain")
    said = r"X holds 'a', not a number \(NaN for missing values; text columns need encoding first"
    with pytest.raises(DataError, match="party1's " + said):
        run_vertical([X, text], y, GBDTParams(n_estimators=1), plain)
    with pytest.raises(DataError, match="client1's " + said):
        run_federated_forest([X, text], y, ForestParams(n_estimators=1), plain)
    with pytest.raises(DataError, match="guest0's " + said):
        run_hybridtree(X, y, [(text[:20], np.arange(20))], GBDTParams(n_estimators=1), plain, 1, 1)


def test_feature_holders_read_pandas_nullable_and_time_columns_as_the_engine_does():
    # a passive party's test frame with an Int64 column holding <NA>, or timestamps, raised TypeError from pandas
    # (float() of NAType or Timestamp) where the engine, and the party's own training frame, read them; complex
    # numbers lost their imaginary part without a word
    import pandas as pd

    from fedgrove.exceptions import DataError

    r = np.random.default_rng(1)
    n = 80
    active = pd.DataFrame(r.normal(size=(n, 2)), columns=["a", "b"])
    y = (active["a"] > 0).astype(int)
    when = pd.Series(pd.date_range("2020-01-01", periods=n, freq="D")).sample(frac=1, random_state=0)
    counts = pd.array(r.integers(0, 5, n).tolist(), dtype="Int64")
    counts[::7] = pd.NA
    passive = pd.DataFrame({"when": when.to_numpy(), "count": counts})
    as_floats = pd.DataFrame({"when": when.to_numpy().astype("datetime64[s]").astype(np.int64).astype(float),
                              "count": counts.to_numpy(dtype=np.float64, na_value=np.nan)})
    params = GBDTParams(n_estimators=2, max_depth=3, max_bins=8)
    plain = keygen("ou", 2048, "plain")
    framed = run_vertical([active, passive], y, params, plain, X_test_parts=[active, passive])
    numbers = run_vertical([active, as_floats], y, params, plain, X_test_parts=[active, as_floats])
    np.testing.assert_array_equal(framed["raw"], numbers["raw"])
    with pytest.raises(DataError, match="party1's test X holds complex numbers"):
        run_vertical([active, as_floats], y, params, plain, X_test_parts=[active, as_floats + 1j])


def test_a_test_set_too_large_for_one_answer_is_predicted_in_chunks_with_the_same_scores(monkeypatch):
    # the passive parties' go-left bits of every owned split and test row were one message, which grows with
    # trees x rows (past the 2 GB message limit at about a million rows and 500 trees); since then the active
    # party asks about chunks of rows, each answer within MAX_PREDICT_BYTES: 64 bytes here, a few dozen rows
    import fedgrove.protocols as protocols
    from fedgrove.crypto.he import PlainContext
    from fedgrove.protocols.vertical import passive

    X, y = make_classification(n=400, d=6, seed=3)
    XT = make_classification(n=203, d=6, seed=4)[0]
    cols = [[0, 1], [2, 3], [4, 5]]
    params = GBDTParams(n_estimators=4, max_depth=3, max_bins=16)
    whole = run_vertical([X[:, c] for c in cols], y, params, PlainContext(), X_test_parts=[XT[:, c] for c in cols])
    eng, _ = _oracle(X, y, cols, params)
    np.testing.assert_allclose(whole["raw"], eng.predict_raw(XT[:, sum(cols, [])]), atol=1e-9)
    monkeypatch.setattr(protocols, "MAX_PREDICT_BYTES", 64)
    monkeypatch.setattr(passive, "MAX_PREDICT_BYTES", 64)
    asked = []
    out = run_vertical([X[:, c] for c in cols], y, params, PlainContext(), X_test_parts=[XT[:, c] for c in cols],
                       observers={"party1": [lambda d, peer, tag, msg: asked.append(msg)
                                             if d == "recv" and isinstance(msg, m.PredictRequest) else None]})
    np.testing.assert_array_equal(out["raw"], whole["raw"])
    most = max(sum(int(((t.nodes["feature"] >= 0) & (t.nodes["owner"] == k)).sum()) for t in out["model"].trees)
               for k in (1, 2))  # the splits of the passive party that answers for the most
    step = 64 * 8 // most // 8 * 8
    assert 8 <= step <= 101  # three chunks or more
    assert [(r.start, r.stop) for r in asked] == [(a, min(203, a + step)) for a in range(0, 203, step)]
