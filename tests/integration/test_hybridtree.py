"""HybridTree (training, hessian mode): exactness properties and what guests see."""

import json

import numpy as np
import pytest

from fedgrove.crypto.he import available_backends, keygen
from fedgrove.data.partition import hybrid_partition
from fedgrove.engine.gbdt import GBDTParams, train_gbdt
from fedgrove.exceptions import DataError, InvalidParameterError
from fedgrove.protocols.hybridtree.simulate import run_hybridtree
from tests.conftest import gradient_arrays_left_alive


@pytest.fixture(scope="module")
def setup(a9a):
    X, y = a9a.train.X[:3000], a9a.train.y[:3000]
    part = hybrid_partition(y, X.shape[1], n_guests=3, seed=1, n_host_features=40)
    host, guests = part.shards[0], part.shards[1:]
    return X[:, host.features], y, [(X[g.rows][:, g.features], g.rows) for g in guests]


PARAMS = GBDTParams(n_estimators=3, max_depth=5, learning_rate=0.3)


def test_guest_depth_zero_equals_solo_on_the_host(setup):
    Xh, y, guests = setup
    out = run_hybridtree(Xh, y, guests, PARAMS, keygen("ou"), host_depth=4, guest_depth=0, timeout=30)
    solo = train_gbdt(GBDTParams(n_estimators=3, max_depth=4, learning_rate=0.3), Xh, y)
    np.testing.assert_array_equal(out["raw"][:, 0], solo.predict_raw(Xh))


@pytest.mark.parametrize("backend", [b for b in ("heu", "gmpy2") if b in available_backends()])
def test_encrypted_run_equals_plaintext_gradient_run(setup, backend):
    Xh, y, guests = setup
    enc = run_hybridtree(Xh, y, guests, PARAMS, keygen("ou", 2048, backend), 4, 2, timeout=120)
    plain = run_hybridtree(Xh, y, guests, PARAMS, keygen("ou", 2048, "plain"), 4, 2, timeout=60)
    np.testing.assert_allclose(enc["raw"], plain["raw"], rtol=0, atol=1e-9)
    assert enc["model"].guest_values == plain["model"].guest_values
    for g in enc["guest_models"]:
        assert enc["guest_models"][g].splits == plain["guest_models"][g].splits
    # the guests' layers help: training accuracy above the host alone at the same total depth
    solo = train_gbdt(PARAMS, Xh, y)
    assert np.mean((enc["raw"][:, 0] > 0) == y) > np.mean(solo.predict(Xh) == y)


def test_encrypted_run_equals_plaintext_on_a_small_continuous_table_whose_ciphertexts_are_shifted(shifted_orders):
    # guests of 40 rows and 8 continuous columns: more bin sums than gradient ciphertexts, so they multiply the
    # ciphertexts by 2^W, 2^2W, ... instead of the sums (HEContext.compressed_sums); the model is the plain run's
    r = np.random.default_rng(6)
    X = r.normal(size=(120, 12))
    y = (X[:, 0] + X[:, 6] + X[:, 9] + r.normal(size=120) > 0).astype(float)
    rows = np.array_split(r.permutation(120), 3)
    guests = [(X[np.sort(g)][:, 4:], np.sort(g)) for g in rows]
    enc = run_hybridtree(X[:, :4], y, guests, PARAMS, keygen("ou"), 2, 2, timeout=60)
    assert any(shifted_orders)
    plain = run_hybridtree(X[:, :4], y, guests, PARAMS, keygen("ou", 2048, "plain"), 2, 2, timeout=60)
    np.testing.assert_allclose(enc["raw"], plain["raw"], rtol=0, atol=1e-9)
    assert enc["model"].guest_values == plain["model"].guest_values
    for g in enc["guest_models"]:
        assert enc["guest_models"][g].splits == plain["guest_models"][g].splits


def test_neither_host_nor_guest_holds_a_guests_gradient_ciphertexts_longer_than_needed(setup, monkeypatch):
    # the host's array for a guest once its bytes are sent (before, until the next guest's was made), a guest's
    # once its layers are grown (before, until the next tree's was read)
    Xh, y, guests = setup
    alive = gradient_arrays_left_alive(monkeypatch, {len(ids) for _, ids in guests})
    out = run_hybridtree(Xh, y, guests, PARAMS, keygen("ou", 2048, "plain"), 4, 2, timeout=60)
    assert len(out["model"].host_trees) == 3 and not alive, alive


@pytest.mark.parametrize("k", [2, 3])
def test_several_instances_per_ciphertext_give_the_same_model(setup, k):
    # rows_per_ciphertext = K: the host encrypts each guest's instances K to a ciphertext (K times fewer
    # encryptions and gradient bytes); the guests' bin sums are the same integers, so the model is the one
    # grown with an instance per ciphertext, to the bit
    Xh, y, guests = setup
    he = keygen("ou", 2048, "plain")  # OU's 682-bit plaintexts hold 2 pairs with their noise; plain holds more
    one = run_hybridtree(Xh, y, guests, PARAMS, he, 4, 2, timeout=60, rows_per_ciphertext=1)
    packed = run_hybridtree(Xh, y, guests, PARAMS, he, 4, 2, timeout=60, rows_per_ciphertext=k)
    np.testing.assert_array_equal(packed["raw"], one["raw"])
    assert packed["model"].guest_values == one["model"].guest_values
    for g in one["guest_models"]:
        assert packed["guest_models"][g].splits == one["guest_models"][g].splits
    sent = [s["bytes_sent"]["guest0"] for s in (one["stats"]["host"], packed["stats"]["host"])]
    assert sent[1] < 0.6 * sent[0]  # the gradients are most of what the host sends a guest


def test_two_instances_per_ou_ciphertext_equal_one_and_paillier_packs_three_by_default(setup):
    from fedgrove.protocols.hybridtree.host import HybridHost
    from fedgrove.transport.inprocess import InProcessHub

    Xh, y, guests = setup
    small = [(X[:300], rows[:300]) for X, rows in guests]
    enc = run_hybridtree(Xh, y, small, PARAMS, keygen("ou"), 4, 2, timeout=60, rows_per_ciphertext=2)
    one = run_hybridtree(Xh, y, small, PARAMS, keygen("ou"), 4, 2, timeout=60)
    np.testing.assert_array_equal(enc["raw"], one["raw"])
    ch = InProcessHub(["host", "guest0"]).channel("host")
    assert HybridHost(ch, Xh, y, ["guest0"], PARAMS, keygen("paillier"), 4, 2).row_packing.rows == 3
    assert HybridHost(ch, Xh, y, ["guest0"], PARAMS, keygen("ou"), 4, 2).row_packing.rows == 1
    with pytest.raises(InvalidParameterError, match="count mode encrypts one instance per ciphertext"):
        HybridHost(ch, Xh, y, ["guest0"], PARAMS, keygen("ou", 2048, "plain"), 4, 2, mode="count",
                   rows_per_ciphertext=2)
    with pytest.raises(InvalidParameterError, match="rows_per_ciphertext must be an integer"):
        HybridHost(ch, Xh, y, ["guest0"], PARAMS, keygen("ou"), 4, 2, rows_per_ciphertext=5)


def test_instances_held_by_no_guest_keep_the_host_value(setup):
    Xh, y, guests = setup
    half = [(Xg[ids < 1500], ids[ids < 1500]) for Xg, ids in guests]  # guests hold only the first half
    params = GBDTParams(n_estimators=1, max_depth=5, learning_rate=0.3)
    out = run_hybridtree(Xh, y, half, params, keygen("ou"), 4, 2, timeout=30)
    solo = train_gbdt(GBDTParams(n_estimators=1, max_depth=4, learning_rate=0.3), Xh, y)
    np.testing.assert_array_equal(out["raw"][1500:, 0], solo.predict_raw(Xh[1500:]))
    assert not np.allclose(out["raw"][:1500, 0], solo.predict_raw(Xh[:1500]))


def test_a_guest_without_instances_takes_part_and_changes_nothing(setup):
    # its block of encrypted gradients is empty: HEU 0.5 crashed the process serialising it
    Xh, y, guests = setup
    Xg, ids = guests[0]
    params = GBDTParams(n_estimators=2, max_depth=5, learning_rate=0.3)
    alone = run_hybridtree(Xh, y, guests, params, keygen("ou"), 4, 1, timeout=30)
    out = run_hybridtree(Xh, y, guests + [(Xg[:0], ids[:0])], params, keygen("ou"), 4, 1, timeout=30)
    np.testing.assert_allclose(out["raw"], alone["raw"], rtol=0, atol=1e-9)
    assert out["guest_models"]["guest3"].splits == {}
    assert all(not per_tree.get("guest3") for per_tree in out["model"].guest_values)


def test_duplicate_instance_ids_are_refused_by_party(setup):
    Xh, y, guests = setup
    Xg, ids = guests[1]
    with pytest.raises(DataError, match="instance IDs must be unique"):
        run_hybridtree(Xh, y, [guests[0], (Xg, np.where(ids == ids[1], ids[0], ids))], PARAMS, keygen("ou"), 4, 1,
                       timeout=30)


def test_fractional_or_text_instance_ids_are_refused_by_party(setup):
    # numpy cut 0.5 to 0, so a guest's rows were matched to other instances of the host without a sign
    Xh, y, guests = setup
    Xg, ids = guests[1]
    for bad, message in ((ids + 0.5, r"whole numbers.*got \d+\.5"),
                         (ids.astype(str), "must be integers, got str")):
        with pytest.raises(DataError, match=message):
            run_hybridtree(Xh, y, [guests[0], (Xg, bad)], PARAMS, keygen("ou"), 4, 1, timeout=30)
    whole = run_hybridtree(Xh, y, [guests[0], (Xg, ids.astype(float))], PARAMS, keygen("ou"), 4, 1, timeout=30)
    exact = run_hybridtree(Xh, y, guests[:2], PARAMS, keygen("ou"), 4, 1, timeout=30)
    np.testing.assert_array_equal(whole["raw"], exact["raw"])


def test_flags_and_depths_of_the_wrong_type_are_refused(setup):
    Xh, y, guests = setup
    for kw, message in ((dict(shared_only="no"), "shared_only must be true or false, got 'no'"),  # "no" was true
                        (dict(host_depth=1.5), "host_depth must be an integer, got 1.5")):  # numpy's TypeError
        args = {"host_depth": 4, "guest_depth": 1, **kw}
        with pytest.raises(InvalidParameterError, match=message):
            run_hybridtree(Xh, y, guests, PARAMS, keygen("ou"), timeout=30, **args)


def test_guests_receive_only_ciphertexts_node_sets_and_their_own_splits(setup):
    from fedgrove.protocols.hybridtree import messages as m
    from fedgrove.protocols.hybridtree.guest import HybridGuest
    from fedgrove.protocols.hybridtree.host import HybridHost
    from fedgrove.transport.inprocess import InProcessHub, run_parties

    Xh, y, guests = setup
    seen = []
    hub = InProcessHub(["host", "guest0"])

    def guest(ch):
        ch.observers.append(lambda d, peer, tag, msg: seen.append((d, msg)))
        return HybridGuest(ch, guests[0][0], guests[0][1], "host").fit()

    run_parties(hub, {"host": lambda ch: HybridHost(ch, Xh, y, ["guest0"], PARAMS, keygen("ou"), 4, 2).fit(),
                      "guest0": guest}, timeout=30)
    allowed = (m.PublicKey, m.HybridSetup, m.Start, m.NodeGradients, m.HistogramRequest, m.GuestSplits, m.TreeEnd,
               m.TrainingDone)
    received = [msg for d, msg in seen if d == "recv"]
    assert received and all(isinstance(x, allowed) for x in received)
    for x in received:  # never a float array: no plaintext gradient or label reaches a guest
        assert not any(isinstance(v, np.ndarray) and v.dtype.kind == "f" for v in vars(x).values())


def test_two_round_inference_reproduces_training_scores_and_beats_solo(a9a):
    X, y = a9a.train.X[:6000], a9a.train.y[:6000]
    Xt, yt = a9a.test.X[:3000], a9a.test.y[:3000]
    part = hybrid_partition(y, X.shape[1], n_guests=3, seed=1, n_host_features=40)
    host, guests = part.shards[0], part.shards[1:]
    train_guests = [(X[g.rows][:, g.features], g.rows) for g in guests]
    params = GBDTParams(n_estimators=10, max_depth=6, learning_rate=0.3)
    # one training, one prediction of two sets stacked (each instance's inference is its own): the training
    # instances, held by the guests that hold them in training, then test data, each instance held by one guest
    own = np.random.default_rng(0).integers(0, 3, len(Xt))
    test_guests = [(np.vstack([Xg, Xt[own == k][:, g.features]]), np.r_[rows, len(X) + np.nonzero(own == k)[0]])
                   for k, (g, (Xg, rows)) in enumerate(zip(guests, train_guests))]
    out = run_hybridtree(X[:, host.features], y, train_guests, params, keygen("ou"), 4, 2, timeout=60,
                         X_test_host=np.vstack([X[:, host.features], Xt[:, host.features]]), test_guests=test_guests)
    # predicting the training instances through host -> guests -> host gives the training scores back
    np.testing.assert_array_equal(out["test_raw"][:len(X)], out["raw"])
    # on test data the guests' layers help
    solo = train_gbdt(params, X[:, host.features], y)
    assert np.mean((out["test_raw"][len(X):, 0] > 0) == yt) > np.mean(solo.predict(Xt[:, host.features]) == yt)


@pytest.fixture(scope="module")
def overlapping(a9a):
    X, y = a9a.train.X[:2000], a9a.train.y[:2000]
    part = hybrid_partition(y, X.shape[1], n_guests=3, seed=2, n_host_features=40, overlap=0.4)
    host, guests = part.shards[0], part.shards[1:]
    return X[:, host.features], y, [(X[g.rows][:, g.features], g.rows) for g in guests]


def test_count_mode_encrypted_equals_plaintext_and_uses_h_equal_one(overlapping):
    Xh, y, guests = overlapping
    enc = run_hybridtree(Xh, y, guests, PARAMS, keygen("ou"), 4, 2, timeout=60, mode="count")
    plain = run_hybridtree(Xh, y, guests, PARAMS, keygen("ou", 2048, "plain"), 4, 2, timeout=60, mode="count")
    np.testing.assert_allclose(enc["raw"], plain["raw"], rtol=0, atol=1e-9)
    assert enc["model"].guest_values == plain["model"].guest_values
    # leaf values are -lr * G / (count + lambda): the guests' splits and counts reproduce them
    hess = run_hybridtree(Xh, y, guests, PARAMS, keygen("ou", 2048, "plain"), 4, 2, timeout=60)
    assert not np.allclose(enc["raw"], hess["raw"])
    holders = np.zeros(len(y), dtype=int)
    for _, ids in guests:
        holders[ids] += 1
    assert holders.max() >= 2  # the fixture has instances held by several guests


def test_count_mode_host_sees_only_masked_predictions_for_shared_instances(overlapping):
    """With the transparent backend the host's 'ciphertexts' are readable: per guest they are leaf value plus a
    large mask for shared instances, and only the sum over the holders is the mean's numerator."""
    from fedgrove.protocols.hybridtree import messages as m
    from fedgrove.protocols.hybridtree.guest import HybridGuest
    from fedgrove.protocols.hybridtree.host import SCALE_BITS, HybridHost
    from fedgrove.transport.inprocess import InProcessHub, run_parties

    Xh, y, guests = overlapping
    he = keygen("ou", 2048, "plain")
    seen = []
    names = [f"guest{k}" for k in range(len(guests))]
    hub = InProcessHub(["host"] + names)
    params = GBDTParams(n_estimators=1, max_depth=5, learning_rate=0.3)

    def host(ch):
        ch.observers.append(lambda d, peer, tag, msg: seen.append((peer, msg)) if d == "recv" else None)
        return HybridHost(ch, Xh, y, names, params, he, 4, 2, mode="count").fit()

    roles = {"host": host}
    for name, (Xg, ids) in zip(names, guests):
        roles[name] = (lambda Xg, ids: lambda ch: HybridGuest(ch, Xg, ids, "host").fit())(Xg, ids)
    results, _ = run_parties(hub, roles, timeout=60)
    preds = {peer: msg for peer, msg in seen if isinstance(msg, m.EncryptedPredictions)}
    assert set(preds) == set(names)
    assert not any(isinstance(msg, m.LeafAssignment) for _, msg in seen)  # no leaf membership in count mode
    scale = 2.0 ** (53 + SCALE_BITS)
    per_guest = {u: dict(zip(guests[k][1].tolist(), he.decrypt(he.deserialize(preds[u].ciphertexts))))
                 for k, u in enumerate(names)}
    holders = {}
    for k, (_, ids) in enumerate(guests):
        for i in ids.tolist():
            holders.setdefault(i, []).append(names[k])
    shared = [i for i, hs in holders.items() if len(hs) >= 2]
    single = [i for i, hs in holders.items() if len(hs) == 1]
    leaf_bound = 2.0 ** 20
    assert all(abs(per_guest[holders[i][0]][i] / scale) < leaf_bound for i in single)
    masked = [abs(per_guest[u][i] / scale) > 2.0 ** 40 for i in shared for u in holders[i]]
    assert np.mean(masked) > 0.99
    sums = [sum(per_guest[u][i] for u in holders[i]) / scale / len(holders[i]) for i in shared]
    assert all(abs(s) < leaf_bound for s in sums)


def test_inference_from_per_party_model_files(setup, tmp_path):
    """Each party saves what `fedgrove simulate` writes; two-round inference from those files alone gives the
    predictions the live parties gave after training."""
    import json

    from fedgrove.protocols.hybridtree.guest import HybridGuest
    from fedgrove.protocols.hybridtree.host import HybridHost
    from fedgrove.protocols.hybridtree.simulate import predict_hybridtree
    from fedgrove.transport.inprocess import InProcessHub, run_parties

    Xh, y, guests = setup
    names = [f"guest{k}" for k in range(len(guests))]

    def host(ch):
        role = HybridHost(ch, Xh, y, names, PARAMS, keygen("ou"), 4, 2)
        model = role.fit()
        return model.to_dict(), role.predict_raw(model, Xh)

    def guest(ch, Xg, ids):
        role = HybridGuest(ch, Xg, ids, "host")
        role.fit()
        role.predict(Xg, ids)
        return role.model_dict()

    roles = {"host": host, **{n: (lambda Xg, ids: lambda ch: guest(ch, Xg, ids))(Xg, ids)
                              for n, (Xg, ids) in zip(names, guests)}}
    results, _ = run_parties(InProcessHub(["host"] + names), roles, timeout=60)
    host_dict, live_raw = results.pop("host")
    files = {}
    for party, d in [("host", host_dict), *results.items()]:
        (tmp_path / f"{party}.json").write_text(json.dumps(d))
        files[party] = json.loads((tmp_path / f"{party}.json").read_text())
    guest_files = {n: files[n] for n in names}
    assert all("splits" in d and "guest_values" not in d for d in guest_files.values())  # guests hold no values
    # the host holds no guest split's feature or threshold: of the guests' splits, only the node numbers it
    # chose ([node, left, right]), each guest's the nodes of that guest's file
    assert "splits" not in files["host"] and "children" not in files["host"]
    for t, per_tree in enumerate(files["host"]["guest_children"]):
        for u, kids in per_tree.items():
            assert all(len(k) == 3 and all(isinstance(v, int) for v in k) for k in kids)
            assert sorted(kids) == sorted(c[1:] for c in guest_files[u]["children"] if c[0] == t)
    raw = predict_hybridtree(files["host"], guest_files, Xh, {n: g for n, g in zip(names, guests)})
    np.testing.assert_array_equal(raw, live_raw)


@pytest.mark.parametrize("mode", ["hessian", "count"])
def test_one_host_of_several_trains_on_the_instances_it_shares_with_each_guest(setup, mode):
    """Multi-host: guests hold instances of two hosts; with shared_only a host keeps, per guest, the instances
    both hold, which gives exactly the model trained on guest files cut to those instances beforehand."""
    from fedgrove.exceptions import ProtocolError

    Xh, y, guests = setup
    mine = np.arange(0, len(y), 2)  # this host's instances: every other row (the other host has the rest)
    ids = mine + 1000  # IDs that are not row numbers
    full = [(Xg, r + 1000) for Xg, r in guests]
    cut = [(Xg[np.isin(r, mine)], r[np.isin(r, mine)] + 1000) for Xg, r in guests]
    he = keygen("ou", 2048, "plain")
    a = run_hybridtree(Xh[mine], y[mine], full, PARAMS, he, 4, 2, timeout=60, mode=mode, host_ids=ids,
                       shared_only=True)
    b = run_hybridtree(Xh[mine], y[mine], cut, PARAMS, he, 4, 2, timeout=60, mode=mode, host_ids=ids)
    np.testing.assert_array_equal(a["raw"], b["raw"])
    assert a["model"].to_dict() == b["model"].to_dict()
    for g in a["guest_models"]:
        assert a["guest_models"][g].splits == b["guest_models"][g].splits
    with pytest.raises(ProtocolError, match="shared_only"):
        run_hybridtree(Xh[mine], y[mine], full, PARAMS, he, 4, 2, timeout=60, mode=mode, host_ids=ids)


def test_the_host_counts_each_guest_column_s_splits_and_their_gains(setup):
    """The host scores the guests' histograms, so it knows, per guest column, how many splits it chose there
    and their gains (fedgrove info ranks the guests' columns with the host's by them): the counts are the
    splits each guest's own file holds on that column, and survive the host file."""
    from fedgrove.protocols.hybridtree.host import HybridHostModel

    Xh, y, guests = setup
    out = run_hybridtree(Xh, y, guests, PARAMS, keygen("ou", 2048, "plain"), 4, 2, timeout=60)
    host = out["model"]
    assert host.guest_splits and sum(map(sum, host.guest_splits.values())) > 0
    for name, gm in out["guest_models"].items():
        width = gm.bin_mapper.n_features
        counts = np.bincount([f for f, _b, _ml, _thr in gm.splits.values()], minlength=width)
        assert host.guest_splits.get(name, [0] * width) == counts.tolist()
        gains = np.asarray(host.guest_gains.get(name, [0.0] * width))
        assert (gains[counts > 0] > 0).all() and (gains[counts == 0] == 0).all()
    again = HybridHostModel.from_dict(host.to_dict())
    assert again.guest_gains == host.guest_gains and again.guest_splits == host.guest_splits
    # a host file whose trees name an output the model has not was read, and predicted into the wrong column
    # (-1: the last) or raised IndexError
    from fedgrove.exceptions import ModelFormatError

    for c, said in ((-1, "tree_class holds -1, expected an output in \\[0, 0\\]"), (1, "tree_class holds 1")):
        d = json.loads(json.dumps(host.to_dict()))
        d["tree_class"][0] = c
        with pytest.raises(ModelFormatError, match=said):
            HybridHostModel.from_dict(d)
    d = json.loads(json.dumps(host.to_dict()))
    d["objective"] = ["binary"]
    with pytest.raises(ModelFormatError, match="objective \\['binary'\\]"):
        HybridHostModel.from_dict(d)


def test_a_guest_refuses_packed_instances_in_count_mode(setup):
    # count mode needs one instance per ciphertext (a masked prediction per instance): a host announcing two is
    # refused by the guest before any gradient
    from fedgrove.exceptions import ProtocolError
    from fedgrove.protocols.hybridtree import messages as m
    from fedgrove.protocols.hybridtree.guest import HybridGuest
    from fedgrove.protocols.vertical.active import packer_for
    from fedgrove.crypto.packing import RowPacking
    from fedgrove.transport.inprocess import InProcessHub, run_parties

    Xh, y, guests = setup
    he = keygen("ou")

    def host(ch):
        ch.recv("guest0", "layout", m.GuestLayout)
        packer = packer_for("binary", y)
        ch.send("guest0", "key", m.PublicKey(he.public_bytes(), packer.frac_bits, packer.value_bits,
                                             packer.count_bits, 2, RowPacking.for_packer(packer, 2).stride_bits))
        ch.send("guest0", "setup", m.HybridSetup("count", 0.3, 1.0, 53, [], [], np.zeros(0, np.int64),
                                                 np.zeros(1, np.int64)))

    with pytest.raises(ProtocolError, match="2 instances per ciphertext from host in count mode"):
        run_parties(InProcessHub(["host", "guest0"]),
                    {"host": host, "guest0": lambda ch: HybridGuest(ch, guests[0][0], guests[0][1], "host").fit()},
                    timeout=30)


def test_row_and_column_sampling_keep_the_exactness_properties_and_cut_the_traffic(setup):
    # subsample / colsample_bytree: the host draws its rows and its own features each round as the engine does on
    # the host's table (tests/property/test_lossless_random_cases.py: without guest layers the model is SOLO's with
    # the same settings), and each guest's features from the guest's own generator; the guests grow on the round's
    # rows, sum only the sampled features' bins, and route all their instances after the tree
    from dataclasses import replace

    from fedgrove.engine.gbdt import RoundSampler

    Xh, y, guests = setup
    # a guest of 20 instances: at most hand-off nodes none of its instances is drawn, and they keep the host's value
    gs = guests + [(guests[0][0][:20], guests[0][1][:20])]
    params = GBDTParams(n_estimators=3, max_depth=5, learning_rate=0.3, seed=7, subsample=0.5, colsample_bytree=0.5)
    plain = keygen("ou", 2048, "plain")
    enc = run_hybridtree(Xh, y, gs, params, keygen("ou"), 4, 2, timeout=60, X_test_host=Xh, test_guests=gs)
    out = run_hybridtree(Xh, y, gs, params, plain, 4, 2, timeout=60)
    np.testing.assert_allclose(enc["raw"], out["raw"], rtol=0, atol=1e-9)
    assert enc["model"].guest_values == out["model"].guest_values
    # two-round inference of the training instances gives the training scores back, those not drawn included
    np.testing.assert_array_equal(enc["test_raw"], enc["raw"])
    assert [t.nodes["count"][0] for t in out["model"].host_trees] == [1500] * 3
    host_draws = RoundSampler(params, len(y), Xh.shape[1])
    for tree in out["model"].host_trees:
        features = set(host_draws.next()[1].tolist())
        assert {int(f) for f in tree.nodes["feature"] if f >= 0} <= features
    for k, g in enumerate(gs):  # each guest's splits among the features the host drew for it
        draws = RoundSampler(replace(params, subsample=1.0), None, g[0].shape[1], seed=[7, 67, k])
        rounds = [set(draws.next()[1].tolist()) for _ in range(3)]
        used = out["guest_models"][f"guest{k}"].splits
        assert used and all(f in rounds[t] for (t, _), (f, *_) in used.items())
    assert len(out["model"].guest_values[0]["guest3"]) < 2 ** 4  # (some hand-off nodes got none of its rows)
    full = run_hybridtree(Xh, y, gs, replace(params, subsample=1.0, colsample_bytree=1.0), plain, 4, 2, timeout=60)
    gradients = [r["stats"]["host"]["bytes_sent"]["guest1"] for r in (out, full)]
    histograms = [r["stats"]["guest1"]["bytes_sent"]["host"] for r in (out, full)]
    # (half the gradients; on a9a's one-hot columns a node's sums are mostly its bins' count, so the sampled
    # features save a quarter of the histogram bytes here: 0.74 against 0.86 with all of them summed)
    assert gradients[0] < 0.6 * gradients[1] and histograms[0] < 0.8 * histograms[1], (gradients, histograms)


def test_count_mode_refuses_row_subsampling_by_name(setup):
    Xh, y, guests = setup
    params = GBDTParams(n_estimators=2, max_depth=3, subsample=0.5)
    with pytest.raises(InvalidParameterError, match=r"count mode does not sample rows \(subsample=0.5\)"):
        run_hybridtree(Xh, y, guests, params, keygen("ou", 2048, "plain"), 2, 1, mode="count", timeout=30)


@pytest.fixture(scope="module")
def small_files():
    """A small federation's model files (host and two guests) and their test rows."""
    from tests.conftest import make_classification

    X, y = make_classification(n=300, d=6, seed=1)
    halves = [np.arange(0, 300, 2), np.arange(1, 300, 2)]
    tests = [np.arange(0, 40, 2), np.arange(1, 40, 2)]
    out = run_hybridtree(X[:, :3], y, [(X[i][:, 3:], i) for i in halves], GBDTParams(n_estimators=3, max_bins=8),
                         keygen("ou", 2048, "plain"), 2, 2, timeout=30, X_test_host=X[:40, :3],
                         test_guests=[(X[i][:, 3:], i) for i in tests])
    return (json.loads(json.dumps(out["model"].to_dict())),
            {u: json.loads(json.dumps(g.to_dict())) for u, g in out["guest_models"].items()},
            X[:40, :3], {f"guest{k}": (X[i][:, 3:], i) for k, i in enumerate(tests)}, out["test_raw"])


def _without_guest_splits(host: dict) -> dict:
    """A host model file as written before 2026-12-07: without the guests' splits (its guests answer nodes)."""
    return {k: v for k, v in host.items() if k != "guest_children"}


@pytest.mark.parametrize("answers", ["ranks", "nodes"])
def test_a_routing_answer_naming_no_node_is_refused(monkeypatch, small_files, answers):
    # a guest's answer is a leaf (its rank below the hand-off node, or with a host model file written before
    # the ranks its node) per test instance and tree, or -1 for an instance it does not hold; -7 was read as
    # "not held", so the host's value stood in for the guest's layers without a word
    from fedgrove.exceptions import ProtocolError
    from fedgrove.protocols.hybridtree import messages as m
    from fedgrove.protocols.hybridtree.simulate import predict_hybridtree
    from tests.conftest import altering_received

    host, guests, X_test, test_guests, _ = small_files

    def negative(msg):
        leaves = msg.leaves.copy()
        leaves[0, 0] = -7
        msg.leaves = leaves
        return msg

    changed = altering_received(monkeypatch, "host", m.RouteAnswer, negative)
    what = "leaf rank" if answers == "ranks" else "node"
    with pytest.raises(ProtocolError, match=f"routing answer from guest0 names {what} -7"):
        predict_hybridtree(host if answers == "ranks" else _without_guest_splits(host), guests, X_test, test_guests,
                           timeout=30)
    assert changed


def test_guests_answer_leaf_ranks_with_the_scores_of_their_nodes_in_fewer_bytes(small_files, monkeypatch):
    # a guest's answer names each leaf by its rank below the instance's hand-off node (2 bits at guest depth 2)
    # instead of its node (a number past the host tree's nodes); a host model file written before the ranks
    # (no guest splits in it) still gets nodes; the scores are the same, and those of the live run
    from fedgrove.protocols.hybridtree import messages as m
    from fedgrove.protocols.hybridtree.simulate import predict_hybridtree
    from fedgrove.transport import codec
    from fedgrove.transport.channel import Channel

    host, guests, X_test, test_guests, live = small_files
    assert len(host["guest_children"]) == 3 and all(host["guest_children"][t] for t in range(3))
    sizes, send = {}, Channel._send_encoded

    def recording(self, peers, tag, message):
        if isinstance(message, m.RouteAnswer):
            sizes[label, self.party] = (message.leaves.copy(), len(codec.encode(message)))
        return send(self, peers, tag, message)

    monkeypatch.setattr(Channel, "_send_encoded", recording)
    label = "ranks"
    ranked = predict_hybridtree(host, guests, X_test, test_guests, timeout=30)
    label = "nodes"
    nodes = predict_hybridtree(_without_guest_splits(host), guests, X_test, test_guests, timeout=30)
    np.testing.assert_array_equal(ranked, nodes)
    # tables too large for the ranks (deep host trees, many trees and guests): nodes, the same scores
    from fedgrove.protocols.hybridtree import host as host_module

    label = "too many slots"
    monkeypatch.setattr(host_module, "RANK_SLOTS_MAX", 3 * 2 * 7 - 1)  # (3 trees, 2 guests, 7 host nodes)
    np.testing.assert_array_equal(predict_hybridtree(host, guests, X_test, test_guests, timeout=30), nodes)
    assert all(np.array_equal(sizes["too many slots", u][0], sizes["nodes", u][0]) for u in guests)
    monkeypatch.setattr(host_module, "RANK_SLOTS_MAX", 3 * 2 * 7)
    predict_hybridtree(host, guests, X_test, test_guests, timeout=30)
    assert all(np.array_equal(sizes["too many slots", u][0], sizes["ranks", u][0]) for u in guests)
    np.testing.assert_array_equal(ranked, live)
    for u in guests:
        (r_leaves, r_bytes), (n_leaves, n_bytes) = sizes["ranks", u], sizes["nodes", u]
        assert np.array_equal(r_leaves < 0, n_leaves < 0) and (r_leaves >= 0).any()
        assert r_leaves.max() <= 3 and n_leaves.max() > 3 and r_bytes < n_bytes, (r_bytes, n_bytes)


@pytest.mark.parametrize("mode, params", [
    ("count", GBDTParams(n_estimators=3, max_bins=8)),
    ("hessian", GBDTParams(n_estimators=3, max_bins=8, subsample=0.3, colsample_bytree=0.7)),
    ("hessian", GBDTParams(n_estimators=2, max_bins=8, objective="multiclass", n_classes=3)),
], ids=["count", "sampled", "multiclass"])
def test_leaf_ranks_give_the_scores_of_node_answers_in_count_mode_with_sampling_and_multiclass(mode, params):
    # count mode's leaf values come from the guests' leaves (every node they end at, hand-off nodes with nothing
    # grown below included); with subsample a guest's layers grow on the round's rows; multiclass: a tree a
    # class; in each the ranks give the live run's scores and those of a host file without the guests' splits
    from fedgrove.protocols.hybridtree.simulate import predict_hybridtree
    from tests.conftest import make_classification

    X, y = make_classification(n=400, d=6, seed=4)
    if params.objective == "multiclass":
        y = (X[:, 0] > 0).astype(float) + (X[:, 4] > 0.5)
    parts = [np.arange(0, 400, 3), np.arange(1, 400, 3), np.arange(0, 400, 2)]  # (the last overlaps both)
    tests = [np.arange(0, 60, 3), np.arange(1, 60, 3), np.arange(0, 60, 2)]
    out = run_hybridtree(X[:, :3], y, [(X[i][:, 3:], i) for i in parts], params, keygen("ou", 2048, "plain"), 2, 2,
                         timeout=60, X_test_host=X[:60, :3], test_guests=[(X[i][:, 3:], i) for i in tests],
                         mode=mode)
    host = json.loads(json.dumps(out["model"].to_dict()))
    guests = {u: json.loads(json.dumps(g.to_dict())) for u, g in out["guest_models"].items()}
    test_guests = {f"guest{k}": (X[i][:, 3:], i) for k, i in enumerate(tests)}
    ranked = predict_hybridtree(host, guests, X[:60, :3], test_guests, timeout=30)
    nodes = predict_hybridtree(_without_guest_splits(host), guests, X[:60, :3], test_guests, timeout=30)
    np.testing.assert_array_equal(ranked, out["test_raw"])
    np.testing.assert_array_equal(nodes, out["test_raw"])
    assert any(host["guest_children"])


def test_a_leaf_rank_past_the_leaves_below_its_node_is_refused_by_name(monkeypatch, small_files):
    from fedgrove.exceptions import ProtocolError
    from fedgrove.protocols.hybridtree import messages as m
    from fedgrove.protocols.hybridtree.simulate import predict_hybridtree
    from tests.conftest import altering_received

    host, guests, X_test, test_guests, _ = small_files

    def past(msg):
        leaves = msg.leaves.copy()
        row = int(np.argmax(leaves[:, 1] >= 0))
        leaves[row, 1] = 4  # (at most 4 leaves below a node at guest depth 2)
        msg.leaves = leaves
        return msg

    altering_received(monkeypatch, "host", m.RouteAnswer, past)
    with pytest.raises(ProtocolError, match=r"guest\d routed test instance \d+ of tree 1 to leaf 4 below node \d+, "
                                            r"where the host's model knows [1-4]: the host's and guest\d's model "
                                            r"files are not of one training run"):
        predict_hybridtree(host, guests, X_test, test_guests, timeout=30)


def _first(host: dict) -> list:
    """The first of guest0's splits in tree 0 of a host model file: [node, left, right]."""
    return list(host["guest_children"][0]["guest0"][0])


def _leaf(host: dict) -> int:
    """A leaf of guest0's splits in tree 0 of a host model file: a child that is not split."""
    kids = host["guest_children"][0]["guest0"]
    return min(c for _, a, b in kids for c in (a, b) if c not in {k for k, *_ in kids})


def _root_above(host: dict, node: int) -> int:
    """The hand-off node above ``node`` in guest0's splits of tree 0."""
    parent = {c: k for k, a, b in host["guest_children"][0]["guest0"] for c in (a, b)}
    while node in parent:
        node = parent[node]
    return node


@pytest.mark.parametrize("damage, expected", [
    (lambda d: d["guest_children"].pop(), "3 host trees and 2 sets of guest splits"),
    (lambda d: d["guest_children"][0]["guest0"][0].__setitem__(1, -2), "node -2 is not a non-negative integer"),
    (lambda d: d["guest_children"][0]["guest0"][0].__setitem__(2, d["guest_children"][0]["guest0"][0][1]),
     "children .* are not two distinct nodes"),
    (lambda d: d["guest_children"][0]["guest0"].append([_leaf(d), _root_above(d, _leaf(d)), 10_000]),
     r"the splits of guest0 in tree 0: its splits' children lead back to an earlier node \(a cycle\)"),
    (lambda d: d["guest_children"][0]["guest0"].append([10_002, _first(d)[1], 10_003]),
     r"the splits of guest0 in tree 0: node \d+ is the child of two splits"),
    (lambda d: d["guest_children"][0]["guest0"].append(_first(d)[:1] + [10_000, 10_001]), "a node is split twice"),
    (lambda d: d["guest_children"][0]["guest0"][0].__setitem__(0, 10_000), "hang below node 10000, which is not a "
                                                                           "leaf of the host's tree 0"),
    (lambda d: d["guest_values"][0]["guest0"].__setitem__(str(d["guest_children"][0]["guest0"][0][0]), 0.5),
     r"tree 0 holds a value for node \d+ of guest0, which is one of guest0's splits there"),
])
def test_a_host_model_file_with_damaged_guest_splits_is_refused(small_files, damage, expected):
    import copy

    from fedgrove.exceptions import ModelFormatError
    from fedgrove.protocols.hybridtree.host import HybridHostModel

    host = copy.deepcopy(small_files[0])
    damage(host)
    with pytest.raises(ModelFormatError, match=expected):
        HybridHostModel.from_dict(host)


def test_a_guest_model_file_whose_splits_share_a_child_is_refused(small_files):
    import copy

    from fedgrove.exceptions import ModelFormatError
    from fedgrove.protocols.hybridtree.guest import HybridGuest

    # (a file that passes the older checks: the children are later nodes than their splits)
    guest = copy.deepcopy(small_files[1]["guest0"])
    t, n, left, right = guest["children"][0]
    other = next(c for c in guest["children"] if c[0] == t and c[1] not in (n, left, right) and c[1] < left)
    other[2] = left
    with pytest.raises(ModelFormatError, match="is the child of two splits"):
        HybridGuest.from_model(None, guest, "host")


def test_a_test_set_too_large_for_one_message_is_routed_in_chunks_with_the_same_scores(setup, monkeypatch):
    # the host's routing request (an ID and a hand-off node per tree for every test instance) and each guest's
    # answer were one message each, growing with trees x rows; since then they go in chunks of rows within
    # MAX_PREDICT_BYTES: 2,000 bytes here, 8 + 4 x 3 bytes a row, 96 rows a chunk, 32 chunks of the 3,000
    import fedgrove.protocols as protocols
    from fedgrove.protocols.hybridtree import guest
    from fedgrove.protocols.hybridtree import messages as m
    from fedgrove.transport.channel import Channel

    Xh, y, guests = setup
    plain = keygen("ou", 2048, "plain")
    whole = run_hybridtree(Xh, y, guests, PARAMS, plain, 4, 2, timeout=60, X_test_host=Xh, test_guests=guests)
    np.testing.assert_array_equal(whole["test_raw"], whole["raw"])  # (the training instances: their scores)
    monkeypatch.setattr(protocols, "MAX_PREDICT_BYTES", 2000)
    monkeypatch.setattr(guest, "MAX_PREDICT_BYTES", 2000)
    starts, send = [], Channel._send_encoded

    def recording(self, peers, tag, message):
        if isinstance(message, m.RouteRequest):
            starts.append((message.start, len(message.ids), message.n_samples))
        return send(self, peers, tag, message)

    monkeypatch.setattr(Channel, "_send_encoded", recording)
    out = run_hybridtree(Xh, y, guests, PARAMS, plain, 4, 2, timeout=60, X_test_host=Xh, test_guests=guests)
    np.testing.assert_array_equal(out["test_raw"], whole["test_raw"])
    assert starts == [(a, min(96, 3000 - a), 3000) for a in range(0, 3000, 96)]


@pytest.mark.parametrize("tables", ["dense", "searched"])
def test_the_leaf_rank_kernels_match_their_numpy_references(small_files, tables, monkeypatch):
    # the guest's ranks of the leaves it walked to (-1 kept; 0 for a hand-off node it grew nothing below); the
    # host's nodes of those ranks give back the walked leaves, and its sum of their values by rank is its sum
    # by node (the scores exactly alike); a rank past the leaves below the hand-off node, or a leaf the host
    # has no value for, is refused by name with the scores left as they were
    from dataclasses import replace

    from fedgrove.engine import predict
    from fedgrove.engine.tree import PackedEnsemble
    from fedgrove.exceptions import ProtocolError
    from fedgrove.protocols.hybridtree.guest import (HybridGuest, _leaf_ranks, _ranks_of_leaves_numpy, _walked,
                                                     layout_leaf_ranks, ranks_of_leaves)
    from fedgrove.protocols.hybridtree.host import HybridHostModel, _add_chunk, _LeafTables, _leaves_of_ranks_numpy

    if tables == "searched":
        monkeypatch.setattr(predict, "INDEX_SLACK", 0)
        monkeypatch.setattr(predict, "INDEX_MIN", 0)
    host, guests, X_test, test_guests, _ = small_files
    model = HybridHostModel.from_dict(host)
    names = sorted(guests)
    leaf_tables = _LeafTables(model, names)
    assert leaf_tables.ranked
    rng = np.random.default_rng(5)
    X = np.resize(X_test, (400, X_test.shape[1]))
    handoff = PackedEnsemble(model.host_trees).leaves(X).astype(np.int32)
    ids, K = np.arange(400) + 3, len(model.base_score)
    ranked, walked = {}, {}
    for g, u in enumerate(names):
        guest = HybridGuest.from_model(None, guests[u], "host")
        layout = guest.model.walk_layout(range(handoff.shape[1]))
        assert (len(layout[-1]) > 0) == (tables == "dense")
        Xg = np.resize(test_guests[u][0], (400, test_guests[u][0].shape[1]))
        leaves = _walked(layout, Xg, np.arange(400), handoff)
        leaves[rng.random(leaves.shape) < 0.3] = -1
        rank = layout_leaf_ranks(layout)
        np.testing.assert_array_equal(rank, _leaf_ranks(guest.model, range(handoff.shape[1]), layout))
        assert rank.max() == 3
        ranks = ranks_of_leaves(leaves, layout, rank)
        np.testing.assert_array_equal(ranks, _ranks_of_leaves_numpy(leaves, layout, rank))
        assert ranks.min() == -1 and ranks.max() == 3 and (ranks == 0).any()
        args = (g, len(names), leaf_tables.n_slots, leaf_tables.rank_start, leaf_tables.rank_count,
                leaf_tables.rank_leaves)
        np.testing.assert_array_equal(_leaves_of_ranks_numpy(ranks, handoff, *args), leaves)  # the walked nodes
        ranked[u], walked[u] = ranks, leaves
    # some rows end at a hand-off node their guest grew nothing below (rank 0 there: the guest's value of it)
    T, G = handoff.shape[1], len(names)
    at_handoff = [leaf_tables.rank_count[(np.arange(T) * G + g) * leaf_tables.n_slots + handoff] == 0
                  for g in range(G)]
    valued = [leaf_tables.rank_start[(np.arange(T) * G + g) * leaf_tables.n_slots + handoff] > 0 for g in range(G)]
    assert all((at_handoff[g] & valued[g] & (ranked[u] == 0)).any() for g, u in enumerate(names))
    # and, in a copy of the model, such nodes without the guest's value (it held no training instance there):
    # the host's own value stands
    u = names[0]
    i, t = np.argwhere(at_handoff[0] & (ranked[u] == 0))[0]
    values = [dict(per_tree) for per_tree in model.guest_values]
    values[t][u] = {k: v for k, v in values[t][u].items() if k != handoff[i, t]}
    unvalued = replace(model, guest_values=values)
    sums = []
    for m in (unvalued, model):
        tables_m = _LeafTables(m, names)
        expected, got = np.zeros((400, K)) + 0.5, np.zeros((400, K)) + 0.5
        _add_chunk(expected, m, handoff, ids, walked, tables_m.per_tree, K)
        tables_m.add(got, m, handoff, ids, ranked, K)
        np.testing.assert_array_equal(got, expected)
        assert len(np.unique(got)) > 10
        sums.append(got)
    assert not np.array_equal(sums[0][i], sums[1][i])  # (the guest's value counted in one, not the other)
    u, g = names[1], 1
    row = int(np.argmax(ranked[u][:, 2] >= 0))
    j = (2 * len(names) + g) * leaf_tables.n_slots + int(handoff[row, 2])
    before = got.copy()
    for r in (4, 9):  # past the leaves below any node
        bad_ranks = dict(ranked)
        bad_ranks[u] = ranked[u].copy()
        bad_ranks[u][row, 2] = r
        with pytest.raises(ProtocolError, match=f"{u} routed test instance {row + 3} of tree 2 to leaf {r} below "
                                                f"node {int(handoff[row, 2])}, where the host's model knows "
                                                f"{max(int(leaf_tables.rank_count[j]), 1)}"):
            leaf_tables.add(got, model, handoff, ids, bad_ranks, K)
        np.testing.assert_array_equal(got, before)
        with pytest.raises(ValueError, match=f"rank {r} of row {row}, tree 2"):
            _leaves_of_ranks_numpy(bad_ranks[u], handoff, g, len(names), leaf_tables.n_slots,
                                   leaf_tables.rank_start, leaf_tables.rank_count, leaf_tables.rank_leaves)
    # the host's model without its value of the leaf that row reaches
    leaf = int(walked[u][row, 2])
    values = [dict(per_tree) for per_tree in model.guest_values]
    values[2][u] = {k: v for k, v in values[2][u].items() if k != leaf}
    lacking = replace(model, guest_values=values)
    with pytest.raises(ProtocolError, match=f"{u} routed test instance {row + 3} of tree 2 to its node {leaf}, "
                                            f"for which the host's model has no leaf value"):
        _LeafTables(lacking, names).add(got, lacking, handoff, ids, ranked, K)
    np.testing.assert_array_equal(got, before)


@pytest.mark.parametrize("tables", ["dense", "searched"])
def test_the_hosts_kernel_for_the_guests_leaf_values_matches_its_numpy_reference(setup, tables, monkeypatch):
    # the host's sum of prediction: per test instance and tree the mean of the leaf values of the guests that
    # routed it on (-1: a guest that does not hold it; its hand-off node: a guest that grew nothing below it),
    # else the host's value of its hand-off node; a leaf the host does not know is refused by name, the scores
    # left as they were; the leaves looked up in tables indexed by node, or (nodes numbered too sparsely for
    # such tables) searched
    from fedgrove.exceptions import ProtocolError
    from fedgrove.engine import predict
    from fedgrove.protocols.hybridtree import host as host_module
    from fedgrove.protocols.hybridtree.host import _add_chunk, _LeafTables
    from fedgrove.engine.tree import PackedEnsemble

    # the guests answer with nodes where the host's tables by rank would be too large (tested here) or the model
    # lacks the guests' splits; with ranks: test_the_leaf_rank_kernels_match_their_numpy_references
    monkeypatch.setattr(host_module, "RANK_SLOTS_MAX", 0)
    if tables == "searched":
        monkeypatch.setattr(predict, "INDEX_SLACK", 0)
        monkeypatch.setattr(predict, "INDEX_MIN", 0)
    Xh, y, guests = setup
    out = run_hybridtree(Xh, y, guests, PARAMS, keygen("ou", 2048, "plain"), 4, 2, timeout=60)
    model = out["model"]
    names = sorted(out["guest_models"])
    rng = np.random.default_rng(3)
    handoff = PackedEnsemble(model.host_trees).leaves(Xh[:500]).astype(np.int32)
    leaf_tables = _LeafTables(model, names)
    assert not leaf_tables.ranked and (len(leaf_tables.index_offsets) > 0) == (tables == "dense")
    answers = {}
    for u in names:
        leaves = np.full(handoff.shape, -1, dtype=np.int32)
        for t in range(handoff.shape[1]):
            keys = leaf_tables.per_tree[t][u][0]
            pick = rng.integers(0, 3, len(leaves))  # not held, its hand-off node, a leaf the guest grew
            leaves[pick == 1, t] = handoff[pick == 1, t]
            if len(keys):
                leaves[pick == 2, t] = rng.choice(keys, int((pick == 2).sum()))
        answers[u] = leaves
    ids = np.arange(500) + 7
    K = len(model.base_score)
    expected, got = np.zeros((500, K)) + 0.25, np.zeros((500, K)) + 0.25
    _add_chunk(expected, model, handoff, ids, answers, leaf_tables.per_tree, K)
    leaf_tables.add(got, model, handoff, ids, answers, K)
    np.testing.assert_array_equal(got, expected)
    assert len(np.unique(got)) > 10  # rows got different sums
    before = got.copy()
    for node in (10_000, int(leaf_tables.keys.max()) + 1):  # nodes no tree has: far off, and just past the last
        answers[names[1]][37, 1] = node
        with pytest.raises(ProtocolError, match=f"{names[1]} routed test instance 44 of tree 1 to its node {node}"):
            leaf_tables.add(got, model, handoff, ids, answers, K)
        np.testing.assert_array_equal(got, before)
