"""SimFL: the similarity found through the all-gather, what crosses party boundaries, weighted boosting."""

import numpy as np
import pytest

from fedgrove import metrics
from fedgrove.data.partition import horizontal_partition
from fedgrove.engine.gbdt import GBDTParams, train_gbdt
from fedgrove.exceptions import InvalidParameterError
from fedgrove.protocols.simfl import messages as m
from fedgrove.protocols.simfl.lsh import LSHFamily, LSHParams, quantize, similar_instances
from fedgrove.protocols.simfl.party import SimFLOptions
from fedgrove.protocols.simfl.simulate import run_simfl
from tests.conftest import make_classification


def _parts(n=3000, k=2, theta=0.8, seed=0):
    X, y = make_classification(n=n, d=8, seed=seed, missing=0.02)
    p = horizontal_partition(y, k, "unbalanced", theta=theta, seed=seed)
    return X, y, [(X[s.rows], y[s.rows], s.rows) for s in p.shards]


def test_similarity_through_the_all_gather_equals_the_centralised_computation():
    # the same hash functions on the joined table, the same global ranges: each party's similar instances are
    # those a direct computation over everyone's hash values finds
    X, y, parts = _parts(n=1200, k=3)
    out = run_simfl(parts, GBDTParams(n_estimators=1, max_depth=2))
    lo, hi = np.nanmin(X, axis=0), np.nanmax(X, axis=0)
    H = LSHFamily.draw(LSHParams(), X.shape[1]).hash(quantize(X, lo, hi, 256))
    names = [f"party{k}" for k in range(3)]
    for k, (_, _, rows) in enumerate(parts):
        sim = out["similarity"][names[k]]
        for j, (_, _, rows_j) in enumerate(parts):
            if j == k:
                continue
            np.testing.assert_array_equal(sim.similar[names[j]], similar_instances(H[rows], H[rows_j], rows_j))
            assert (sim.similar[names[j]] >= 0).mean() > 0.9


def _record(log):
    return lambda direction, peer, tag, msg: log.append((direction, type(msg), msg))


def test_only_hashes_ids_aggregated_gradients_and_trees_cross_party_boundaries():
    # besides setup (sizes, per-feature ranges, masking keys, masked label sums) a party receives hash values
    # with IDs, aggregated gradients (one vector per trainer instance) and trees: never a feature value or label
    X, y, parts = _parts(n=900, k=3)
    logs = {f"party{k}": [] for k in range(3)}
    out = run_simfl(parts, GBDTParams(n_estimators=6, max_depth=3),
                    observers={n: [_record(v)] for n, v in logs.items()})
    allowed = {m.Hello, m.CacheStatus, m.FeatureRange, m.HashTable, m.MaskingKey, m.MaskedStats,
               m.AggregatedGradients, m.TreeMessage}
    for name, log in logs.items():
        got = [(t, msg) for d, t, msg in log if d == "recv"]
        assert {t for t, _ in got} <= allowed
        k = int(name[-1])
        for t, msg in got:
            if t is m.AggregatedGradients:  # sized by the receiving trainer's instances, not the sender's
                assert msg.g.shape == (len(parts[k][0]), 1)
            if t is m.FeatureRange:
                assert msg.lo.shape == (X.shape[1],)
    models = list(out["models"].values())
    assert all(mm.to_dict() == models[0].to_dict() for mm in models)  # every party ends with the same model


def test_each_party_sends_the_gradients_of_the_model_so_far_aggregated_on_its_similar_instances():
    # Algorithm 2 from the outside: for tree t, what a party sends its trainer is, per trainer instance, the sums
    # of g and h (logistic loss) of its own instances similar to it, at the scores of the final model's first t
    # trees on its rows; so a party's own routing of the others' trees and its aggregation are both checked
    X, y, parts = _parts(n=1500, k=3)
    sent = {f"party{k}": [] for k in range(3)}
    out = run_simfl(parts, GBDTParams(n_estimators=7, max_depth=4, learning_rate=0.3),
                    SimFLOptions(schedule="round-robin"),
                    observers={n: [lambda d, peer, tag, msg, log=v: d == "send" and isinstance(
                        msg, m.AggregatedGradients) and log.append((peer, msg))] for n, v in sent.items()})
    model = out["model"]
    checked = 0
    for k, (Xk, yk, _) in enumerate(parts):
        name = f"party{k}"
        assert len(sent[name]) == 7 - len(range(k, 7, 3))  # one message per tree grown by another party
        for trainer, msg in sent[name]:
            p = 1 / (1 + np.exp(-model.predict_raw(Xk, n_rounds=msg.tree)))
            similar = out["similarity"][name].similar[trainer]
            ok = similar >= 0
            n_trainer = len(parts[int(trainer[-1])][0])
            np.testing.assert_allclose(msg.g[:, 0], np.bincount(similar[ok], (p - yk)[ok], n_trainer), atol=1e-12)
            np.testing.assert_allclose(msg.h[:, 0], np.bincount(similar[ok], (p * (1 - p))[ok], n_trainer),
                                       atol=1e-12)
            checked += 1
    assert checked == 14


def test_simfl_beats_solo_and_tfl_on_unbalanced_a9a_parties(a9a):
    # the paper's unbalanced split (theta = 0.8) of an a9a subset: SimFL's test error is below each party's SOLO
    # and below TFL with the same tree schedule (blocks by data share)
    X, y = a9a.train.X[:12000], (a9a.train.y[:12000] > 0).astype(float)
    Xt, yt = a9a.test.X[:6000], (a9a.test.y[:6000] > 0).astype(float)
    p = horizontal_partition(y, 2, "unbalanced", theta=0.8, seed=0)
    parts = [(X[s.rows], y[s.rows], s.rows) for s in p.shards]
    params = GBDTParams(n_estimators=60, max_depth=6, learning_rate=0.2)

    def err(model):
        return 1 - metrics.accuracy(yt, (model.predict_raw(Xt) > 0).astype(float))

    simfl = err(run_simfl(parts, params)["model"])
    solo = [err(train_gbdt(params, Xp, yp)) for Xp, yp, _ in parts]
    from fedgrove.protocols.tfl import PartyView, train_tfl

    tfl = err(train_tfl(X, y, [PartyView(r, np.arange(X.shape[1])) for _, _, r in parts], params, schedule="blocks"))
    assert simfl < min(solo) - 0.01 and simfl < tfl - 0.01


def test_preprocessing_is_saved_and_reused_until_the_data_change(tmp_path):
    _, _, parts = _parts(n=600, k=2)
    caches = {f"party{k}": tmp_path / f"party{k}.npz" for k in range(2)}
    params = GBDTParams(n_estimators=3, max_depth=3)
    first = run_simfl(parts, params, caches=caches)
    # what a party found of the others' instances is readable by its owner only, as its model file
    assert {f.stat().st_mode & 0o777 for f in tmp_path.iterdir()} == {0o600} and len(list(tmp_path.iterdir())) == 4
    again = run_simfl(parts, params, caches=caches)
    assert not first["timings"]["party0"]["preprocess_reused"] and again["timings"]["party1"]["preprocess_reused"]
    assert again["model"].to_dict() == first["model"].to_dict()
    changed = [(parts[0][0] + 1.0, parts[0][1], parts[0][2]), parts[1]]
    assert not run_simfl(changed, params, caches=caches)["timings"]["party1"]["preprocess_reused"]


def test_tree_schedules_multiclass_and_regression():
    r = np.random.default_rng(0)
    X = r.normal(size=(900, 5))
    yc = np.digitize(X[:, 0] + X[:, 1], [-0.7, 0.7]).astype(float)
    parts = [(X[:300], yc[:300]), (X[300:], yc[300:])]  # 1:2 data shares
    out = run_simfl(parts, GBDTParams(objective="multiclass", n_classes=3, n_estimators=6, max_depth=3),
                    SimFLOptions(schedule="blocks"))
    owners = [int(t.nodes["owner"][0]) for t in out["model"].trees]
    assert owners == [0] * 6 + [1] * 12  # rounds 0-1 by party0, 2-5 by party1; three trees a round
    assert metrics.accuracy(yc, out["model"].predict(X)) > 0.7
    yr = X[:, 0] * 2 + r.normal(size=900) * 0.1
    out = run_simfl([(X[:450], yr[:450]), (X[450:], yr[450:])],
                    GBDTParams(objective="regression", n_estimators=20, max_depth=3, learning_rate=0.3),
                    SimFLOptions(schedule="round-robin"))
    assert [int(t.nodes["owner"][0]) for t in out["model"].trees[:4]] == [0, 1, 0, 1]
    assert metrics.rmse(yr, out["model"].predict(X)) < 0.5


def test_min_samples_leaf_counts_the_trainers_own_instances():
    # the trainer's histograms carry per-bin counts when min_samples_leaf > 1 (they did not: leaves of 3 rows
    # were grown with min_samples_leaf = 20); a leaf's count is the number of the trainer's own rows in it
    _, _, parts = _parts(n=1200, k=2)
    out = run_simfl(parts, GBDTParams(n_estimators=4, max_depth=6, min_samples_leaf=20))
    for tree in out["model"].trees:
        assert tree.nodes["count"][tree.is_leaf].min() >= 20
        assert tree.nodes["count"][0] == len(parts[int(tree.nodes["owner"][0])][0])


def test_bad_setups_are_refused_before_anything_is_sent():
    X, y, parts = _parts(n=300, k=2)
    with pytest.raises(InvalidParameterError, match="L < d"):
        run_simfl(parts, GBDTParams(n_estimators=1), SimFLOptions(LSHParams(n_hashes=8)))
    with pytest.raises(InvalidParameterError, match="n_classes"):
        run_simfl(parts, GBDTParams(objective="multiclass", n_estimators=1))
    # one name for two parties ran party0 alone under that name
    with pytest.raises(InvalidParameterError, match="1 name for 2 parties"):
        run_simfl(parts, GBDTParams(n_estimators=1), names=["a"])
    with pytest.raises(InvalidParameterError, match="resume must be true or false, got 'no'"):
        run_simfl(parts, GBDTParams(n_estimators=1), resume="no")  # a string was taken as true


def test_checkpoints_every_few_rounds_resume_a_party_a_checkpoint_behind_to_the_uninterrupted_model(tmp_path):
    # checkpoints after rounds 3, 6 and 7 (the last) of 7; a run of 6 rounds whose party1 stopped before
    # checkpointing round 6, which party0 had, resumed with 7: it resumes after round 3, party0 stepping back a
    # whole checkpoint, and grows the model of a run that was never stopped (and that checkpointed every round)
    import shutil

    from fedgrove.runner.checkpoint import CheckpointStore

    _, _, parts = _parts(n=600, k=2)
    params = GBDTParams(n_estimators=7, max_depth=3)
    written = []

    class Spy(CheckpointStore):
        def save(self, state, array=None):
            written.append((self.path.name, state["trees_done"]))
            super().save(state, array)

    def stores(every=3):
        out = {f"party{k}": Spy(tmp_path / f"party{k}.checkpoint.json") for k in range(2)}
        for store in out.values():
            store.every = every
        return out

    def expected(rounds):  # the states each party writes
        return sorted((f"party{k}.checkpoint.json", t) for k in range(2) for t in rounds)

    whole = run_simfl(parts, params, checkpoints=stores(1))["model"].to_dict()
    written.clear()
    assert run_simfl(parts, params, checkpoints=stores())["model"].to_dict() == whole
    assert sorted(written) == expected([3, 6, 7])
    written.clear()
    run_simfl(parts, GBDTParams(n_estimators=6, max_depth=3), checkpoints=stores())
    shutil.copyfile(tmp_path / "party1.checkpoint.prev.json", tmp_path / "party1.checkpoint.json")
    assert {n: s.trees_done(s.newest()) for n, s in stores().items()} == {"party0": 6, "party1": 3}
    written.clear()
    resumed = run_simfl(parts, params, checkpoints=stores(), resume=True)
    assert resumed["model"].to_dict() == whole
    assert sorted(written) == expected([6, 7])
    assert all(s.trees_done(s.newest()) == 7 for s in stores().values())


@pytest.mark.parametrize("behind, sampling", [("party0", {}), ("party1", {}),
                                              ("party0", {"subsample": 0.6, "colsample_bytree": 0.6})])
def test_resume_through_the_api_steps_back_a_party_a_tree_ahead_of_one_that_stopped(tmp_path, behind, sampling):
    # one party stopped after its peer checkpointed tree 4 and before it did: its newest state holds 3 trees
    # (its previous one, here); the run resumes after 3 trees, the other party stepping back, and grows the
    # uninterrupted model (with subsampling: each trainer draws again the rows and features of the rounds it
    # trained before the resume point, so that its later rounds draw what they would have)
    import shutil

    from fedgrove.runner.checkpoint import CheckpointStore

    _, _, parts = _parts(n=600, k=2)
    params = GBDTParams(n_estimators=4, max_depth=3, **sampling)

    def stores():
        return {f"party{k}": CheckpointStore(tmp_path / f"party{k}.checkpoint.json") for k in range(2)}

    whole = run_simfl(parts, params, checkpoints=stores())["model"].to_dict()
    shutil.copyfile(tmp_path / f"{behind}.checkpoint.prev.json", tmp_path / f"{behind}.checkpoint.json")
    held = {name: s.trees_done(s.newest()) for name, s in stores().items()}
    assert held[behind] == 3 and max(held.values()) == 4
    resumed = run_simfl(parts, params, checkpoints=stores(), resume=True)
    assert resumed["model"].to_dict() == whole
    assert [len(m.trees) for m in resumed["models"].values()] == [4, 4]
    assert all(s.trees_done(s.newest()) == 4 for s in stores().values())


def test_each_trainer_subsamples_its_own_rows_and_features_each_round():
    # subsample and colsample_bytree, as the engine's: a trainer grows each of its trees on a draw of its own rows
    # (the root's count) and features, from its own generator; the same seed gives the same model
    _, _, parts = _parts(n=1200, k=2)
    params = GBDTParams(n_estimators=6, max_depth=4, subsample=0.5, colsample_bytree=0.5)
    out = run_simfl(parts, params, SimFLOptions(schedule="round-robin"))
    model = out["model"]
    sizes = [len(p[0]) for p in parts]
    assert [int(t.nodes["count"][0]) for t in model.trees] == [round(0.5 * sizes[t % 2]) for t in range(6)]
    assert all(len({f for f in t.nodes["feature"] if f >= 0}) <= 4 for t in model.trees)  # 4 of 8 features
    assert run_simfl(parts, params, SimFLOptions(schedule="round-robin"))["model"].to_dict() == model.to_dict()
    whole = run_simfl(parts, GBDTParams(n_estimators=6, max_depth=4), SimFLOptions(schedule="round-robin"))
    assert [int(t.nodes["count"][0]) for t in whole["model"].trees] == [sizes[t % 2] for t in range(6)]
    assert len({f for t in whole["model"].trees for f in t.nodes["feature"] if f >= 0}) > 4
