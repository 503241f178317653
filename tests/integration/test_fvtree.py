"""FV-tree / FGBDT-Chain: the voting reduction against the engine, verification, the ledger, differential privacy."""

import json
import shutil
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from fedgrove.data.partition import horizontal_partition
from fedgrove.engine.gbdt import GBDTParams, train_gbdt
from fedgrove.exceptions import InvalidParameterError, LedgerError, PrivacyBudgetError
from fedgrove.ledger.verify import compare_replicas, verify_ledger
from fedgrove.protocols.fvtree.party import FVTreeOptions
from fedgrove.protocols.fvtree.privacy import DPOptions
from fedgrove.protocols.fvtree.simulate import run_fvtree
from tests.conftest import make_classification, replaying_own_rows


def _parts(n=3000, k=3, theta=0.7, seed=1):
    X, y = make_classification(n=n, d=6, seed=seed, missing=0.03)
    p = horizontal_partition(y, k, "unbalanced", theta=theta, seed=0)
    return [(X[s.rows], y[s.rows]) for s in p.shards]


def _three_class_parts(n=3000, k=3, seed=1):
    """``k`` balanced parties of a three-class problem (make_classification's signal cut in three)."""
    r = np.random.default_rng(seed)
    X = r.normal(size=(n, 6))
    y = np.digitize(X[:, 0] + 0.7 * X[:, 1] * X[:, 2] + 0.3 * r.normal(size=n), [-0.5, 0.5]).astype(float)
    p = horizontal_partition(y, k, "balanced", seed=0)
    return [(X[s.rows], y[s.rows]) for s in p.shards]


def test_with_every_feature_a_candidate_the_splits_are_the_engines(tmp_path):
    # no voting approximation (every feature gets histograms), no DP, verification off: every node's split equals
    # the centralised engine's on the union with the federation's cut points; leaf values up to summation order
    parts = _parts()
    params = GBDTParams(n_estimators=4, max_depth=4, learning_rate=0.3, max_bins=32)
    out = run_fvtree(parts, params, FVTreeOptions(n_candidates=None, verify=False))
    ref = train_gbdt(params, np.vstack([a for a, _ in parts]), np.concatenate([b for _, b in parts]),
                     bin_mapper=out["model"].bin_mapper)
    for a, b in zip(out["model"].trees, ref.trees):
        for col in ("feature", "bin", "left", "right", "missing_left", "count"):
            np.testing.assert_array_equal(a.nodes[col], b.nodes[col])
        np.testing.assert_allclose(a.values, b.values, rtol=1e-9, atol=1e-12)
    models = list(out["models"].values())
    assert all(m.to_dict() == models[0].to_dict() for m in models)  # every party holds the same model


def test_with_row_subsampling_the_splits_are_the_engines_on_the_rows_the_parties_drew(monkeypatch):
    # subsample: every party draws its own rows each round ([seed, 67, its place]); with every feature a candidate
    # and no DP the trees are the engine's on the union of those rows (a multiclass round's trees all on them)
    import fedgrove.engine.gbdt as gbdt

    parts = _three_class_parts(n=1800)
    params = GBDTParams("multiclass", n_classes=3, n_estimators=3, max_depth=3, learning_rate=0.3, max_bins=16,
                        seed=4, subsample=0.5, colsample_bytree=0.7)
    fed = run_fvtree(parts, params, FVTreeOptions(n_candidates=None, verify=False))["model"]
    with monkeypatch.context() as mp:
        mp.setattr(gbdt, "RoundSampler", replaying_own_rows([len(b) for _, b in parts]))
        ref = train_gbdt(params, np.vstack([a for a, _ in parts]), np.concatenate([b for _, b in parts]),
                         bin_mapper=fed.bin_mapper)
    for a, b in zip(fed.trees, ref.trees, strict=True):
        for col in ("feature", "bin", "left", "right", "missing_left", "count"):
            np.testing.assert_array_equal(a.nodes[col], b.nodes[col])
        np.testing.assert_allclose(a.values, b.values, rtol=1e-9, atol=1e-12)
    assert [t.nodes["count"][0] for t in fed.trees] == [sum(round(0.5 * len(b)) for _, b in parts)] * 9


def test_with_dp_and_row_subsampling_a_tree_grows_on_the_sampled_rows_of_its_part(monkeypatch):
    # under DP a round's rows are its part of the ensemble's disjoint parts; subsample keeps the party's own draw
    # of them (the parts stay disjoint, so the ensemble's trees still compose in parallel)
    import fedgrove.protocols.fvtree.party as party
    from fedgrove.engine.gbdt import RoundSampler
    from fedgrove.protocols.fvtree.privacy import DifferentialPrivacy

    seen, finder = [], party.HistogramSplitFinder

    def spy(*args, root_samples=None, **kw):
        seen.append(root_samples)
        return finder(*args, root_samples=root_samples, **kw)

    monkeypatch.setattr(party, "HistogramSplitFinder", spy)
    parts = _parts(n=1500)
    params = GBDTParams(n_estimators=4, max_depth=2, max_bins=16, seed=2, subsample=0.5)
    dp = DPOptions(epsilon=20.0, trees_per_ensemble=2)
    run_fvtree(parts, params, FVTreeOptions(verify=False, dp=dp))
    rounds = DifferentialPrivacy(dp, 4, 2, seed=None)  # (its parts of the rows)
    for i, (_, yp) in enumerate(parts):
        own = RoundSampler(params, len(yp), 6, seed=[2, 67, i])
        want = [np.intersect1d(rounds.rows_of_tree(t, len(yp), [2, 59, i]), own.next()[0]) for t in range(4)]
        assert all(abs(len(w) - len(yp) / 4) < 0.1 * len(yp) for w in want)  # half of half of the party's rows
        assert all(any(r is not None and np.array_equal(w, r) for r in seen) for w in want), i
    assert len(seen) == 3 * 4


def test_with_lambda_zero_contributions_are_numbers_and_the_ledger_verifies(tmp_path):
    # lambda 0 (LightGBM's default) made every split Shapley value NaN (0/0 for a coalition without instances
    # on a side), and the ledger then failed its own verification
    out = run_fvtree(_parts(n=600), GBDTParams(n_estimators=2, max_depth=3, reg_lambda=0.0),
                     FVTreeOptions(verify=False), ledger_dir=tmp_path)
    assert all(np.all(np.isfinite(p.contributions)) for p in out["parties"].values())
    summary = verify_ledger(tmp_path / "party0.ledger.sqlite")
    assert sum(c["shapley"] for c in summary.contributions.values()) > 0


@pytest.fixture(scope="module")
def a9a_parties(a9a):
    y = (a9a.train.y > 0).astype(float)
    p = horizontal_partition(y, 4, "unbalanced", theta=0.8, seed=0)
    return [(a9a.train.X[s.rows], y[s.rows]) for s in p.shards]


def test_honest_skewed_parties_are_endorsed_and_a_doubled_histogram_is_refused(a9a_parties, tmp_path):
    # a9a, four parties with the paper's unbalanced split (theta = 0.8), default threshold: nobody honest is refused;
    # a party that doubles its histograms is refused every time, so its inflated split contribution is never
    # recorded, and the ledger still verifies
    params = GBDTParams(n_estimators=2, max_depth=4, learning_rate=0.3)
    honest = run_fvtree(a9a_parties, params, FVTreeOptions())
    assert honest["model"].metadata["rejected_histograms"] == 0

    def doubling(party):
        party.privacy.histogram = lambda rows, depth, k, n: np.asarray(rows) * 2.0

    out = run_fvtree(a9a_parties, params, FVTreeOptions(), ledger_dir=tmp_path, tamper={"party2": doubling})
    summary = verify_ledger(tmp_path / "party0.ledger.sqlite")
    assert summary.uploads["party2"]["accepted"] == 0 and summary.uploads["party2"]["refused"] > 0
    assert summary.contributions["party2"]["shapley"] == 0.0
    assert all(summary.uploads[q]["refused"] == 0 for q in ("party0", "party1", "party3"))
    assert out["model"].metadata["contributions"]["party2"]["shapley"] == 0.0


@pytest.fixture(scope="module")
def ledger_file(tmp_path_factory):
    d = tmp_path_factory.mktemp("ledger")
    run_fvtree(_parts(n=1500), GBDTParams(n_estimators=2, max_depth=3, max_bins=16), FVTreeOptions(threshold=5.0),
               ledger_dir=d)
    return d / "party1.ledger.sqlite"


def _tampered(ledger_file, tmp_path, sql: str):
    path = tmp_path / "copy.sqlite"
    shutil.copy(ledger_file, path)
    db = sqlite3.connect(path)
    db.execute("DROP TRIGGER records_no_update")
    db.execute("DROP TRIGGER records_no_delete")
    db.executescript(sql)
    db.commit()
    db.close()
    return path


def test_replicas_agree_and_verify(ledger_file):
    summary = verify_ledger(ledger_file)
    other = verify_ledger(ledger_file.parent / "party0.ledger.sqlite")
    assert summary.head == other.head and summary.n_records == other.n_records
    assert summary.kinds["ContributionRecord"] > 0 and summary.kinds["Endorsement"] > 0
    total = sum(c["shapley"] for c in summary.contributions.values())
    assert total > 0


def test_records_cut_from_a_replicas_end_are_found_by_comparing_replicas(ledger_file, tmp_path, capsys):
    # what remains of a replica whose last records were deleted is a whole chain: alone it verifies; beside
    # another party's replica, `fedgrove ledger verify` names the cut; two runs' ledgers are not replicas
    from fedgrove.cli.main import main

    n = verify_ledger(ledger_file).n_records
    cut = _tampered(ledger_file, tmp_path, f"DELETE FROM records WHERE seq > {n - 3}")
    assert verify_ledger(cut).n_records == n - 3
    others = [str(ledger_file.parent / f"party{k}.ledger.sqlite") for k in (0, 2)]
    assert main(["ledger", "verify", *others, str(ledger_file)]) == 0
    assert "the 3 replicas hold the same records" in capsys.readouterr().out
    assert main(["ledger", "verify", others[0], str(cut)]) == 8
    assert f"copy.sqlite holds {n - 3} records" in capsys.readouterr().err
    edited = _tampered(ledger_file, tmp_path, "UPDATE records SET body = body || x'00' WHERE seq = 5")
    with pytest.raises(LedgerError, match="differ from record 5 on"):
        compare_replicas([ledger_file, edited])


@pytest.mark.parametrize("sql,message", [
    # the body's last byte changed (a binary body may end in 0x7f already: the edit failed to edit once in a while)
    ("UPDATE records SET body = substr(body, 1, length(body) - 1) || CASE substr(body, -1) WHEN x'7f' THEN x'7e' "
     "ELSE x'7f' END WHERE seq = 40", "record 40 .*edited"),
    ("DELETE FROM records WHERE seq = 30", "record 31 .*sequence number"),
    ("UPDATE records SET seq = -1 WHERE seq = 20; UPDATE records SET seq = 20 WHERE seq = 21; "
     "UPDATE records SET seq = 21 WHERE seq = -1", "record 20 .*link"),
    ("UPDATE records SET signature = zeroblob(64) WHERE seq = 12", "record 12 .*"),
])
def test_tampering_is_detected_at_the_first_bad_record(ledger_file, tmp_path, sql, message):
    with pytest.raises(LedgerError, match=message):
        verify_ledger(_tampered(ledger_file, tmp_path, sql))


def test_a_forged_signature_with_a_recomputed_chain_is_refused(ledger_file, tmp_path):
    # rewrite a histogram upload, re-sign it with a fresh key and recompute every hash after it: the chain is
    # whole again, but the signature is not its author's
    from fedgrove.crypto.signing import SigningKey
    from fedgrove.ledger.store import chain_hash, open_records, signed_bytes

    recs = open_records(ledger_file)
    target = next(r for r in recs if r.kind == "HistogramUpload")
    forged_body = bytes(target.body)[:-8] + b"\x00" * 8
    forged_sig = SigningKey().sign(signed_bytes(target.kind, target.author, forged_body))
    path = tmp_path / "forged.sqlite"
    shutil.copy(ledger_file, path)
    db = sqlite3.connect(path)
    db.execute("DROP TRIGGER records_no_update")
    prev = bytes(recs[target.seq - 2].hash)
    for r in recs[target.seq - 1:]:
        body, sig = (forged_body, forged_sig) if r.seq == target.seq else (bytes(r.body), bytes(r.signature))
        h = chain_hash(prev, r.kind, r.author, body, sig)
        db.execute("UPDATE records SET body = ?, signature = ?, prev_hash = ?, hash = ? WHERE seq = ?",
                   (body, sig, prev, h, r.seq))
        prev = h
    db.commit()
    db.close()
    with pytest.raises(LedgerError, match=f"record {target.seq} .*signature does not verify"):
        verify_ledger(path)


def _resigned(ledger_file, tmp_path, kind: str, change) -> Path:
    """The ledger rewritten by parties that hold every key: the first ``kind`` record's body goes through
    ``change``, every record is signed again (fresh keys in the request and memberships) and endorsements name
    the new uploads' digests, so the chain and every signature are whole and only the content is wrong."""
    import dataclasses
    import hashlib

    from fedgrove.crypto.signing import SigningKey
    from fedgrove.ledger import records as rec
    from fedgrove.ledger.store import Ledger, open_records, sign_record

    keys, digests, changed = {}, {}, False
    path = tmp_path / f"resigned-{kind}.sqlite"
    path.unlink(missing_ok=True)
    out = Ledger(path)
    for r in open_records(ledger_file):
        body, author = r.message(), r.author
        key = keys.setdefault(author, SigningKey())
        if isinstance(body, rec.ModelRequest):
            body = dataclasses.replace(body, requester_key=key.public_bytes())
        elif isinstance(body, rec.Membership):
            body = dataclasses.replace(body, key=key.public_bytes())
        elif isinstance(body, rec.Endorsement):
            body = dataclasses.replace(body, digest=digests[body.tree, body.layer, body.sender])
        if r.kind == kind and not changed:
            body, changed = change(body), True
        kind_, raw, sig = sign_record(key, author, body)
        if isinstance(body, rec.HistogramUpload):
            digests[body.tree, body.layer, author] = hashlib.sha256(raw).digest()
        out.append(kind_, author, raw, sig)
    out.close()
    return path


def _replace(**fields):
    import dataclasses

    return lambda body: dataclasses.replace(body, **{k: f(body) for k, f in fields.items()})


@pytest.mark.parametrize("kind,change,message", [
    ("ModelRequest", _replace(parties=lambda b: []), "record 1 .*must name the parties"),
    ("ModelRequest", _replace(parties=lambda b: b.parties + b.parties[1:2]), "record 1 .*names a party twice"),
    ("ModelRequest", _replace(options_json=lambda b: "{nope"), "record 1 .*options are not JSON"),
    ("ModelRequest", _replace(options_json=lambda b: "[]"), "record 1 .*options must be a JSON object"),
    ("ModelRequest", _replace(params_json=lambda b: '{"reg_lambda": "x"}'), "reg_lambda = 'x', not a number"),
    ("ModelRequest", _replace(requester_key=lambda b: b"abc"), "record 1 .*32 bytes, this one 3"),
    ("Binning", _replace(n_bins=lambda b: b.n_bins[:1]), r"Binning.*1 bin counts for 6 features"),
    ("VoteRecord", _replace(features=lambda b: b.features[:0]), r"VoteRecord.*votes 0 times for 1 nodes"),
    ("VoteRecord", _replace(nodes=lambda b: [n + 7 for n in b.nodes]), "vote record of this layer has no vote"),
    ("HistogramUpload", _replace(offsets=lambda b: b.offsets[:0]), "offsets do not cut its histogram rows"),
    ("HistogramUpload", _replace(candidates=lambda b: b.candidates + 99), "candidate features are not"),
    ("HistogramUpload", _replace(nodes=lambda b: [n + 7 for n in b.nodes]), "upload has no histograms of this"),
    ("SplitRecord", _replace(accepted=lambda b: b.accepted[:0]), r"SplitRecord.*accepted has 0 entries"),
    ("SplitRecord", _replace(features=lambda b: b.features * 0 - 1), "splits on a feature outside 0-5"),
    ("ContributionRecord", _replace(vote=lambda b: b.vote[:0]), r"its vote is \(0, 3\)"),
])
def test_a_ledger_signed_by_its_parties_with_malformed_content_is_refused_naming_the_record(
        ledger_file, tmp_path, kind, change, message):
    # parties that sign what they write can still write nonsense: the check names the record and what is wrong
    # in it (a LedgerError, exit code 8) where it raised IndexError, ValueError or JSONDecodeError, or a
    # ProtocolError for a short key
    from fedgrove.cli.main import main

    assert verify_ledger(_resigned(ledger_file, tmp_path, "none", None)).n_records > 40  # re-signing alone is fine
    path = _resigned(ledger_file, tmp_path, kind, change)
    with pytest.raises(LedgerError, match=message):
        verify_ledger(path)
    assert main(["ledger", "verify", str(path)]) == 8


def test_more_parties_than_a_ledger_can_name_are_refused_before_training(tmp_path):
    # split records hold sets of parties as bit masks in a signed 64-bit word: with 64 parties FV-tree grew its
    # first tree and then failed with OverflowError ("Python int too large to convert to C long")
    X, y = make_classification(n=64 * 10, d=3, seed=1)
    parts = [(X[k::64], y[k::64]) for k in range(64)]
    params = GBDTParams(n_estimators=1, max_depth=2, max_bins=8)
    with pytest.raises(InvalidParameterError, match="ledger of at most 63 parties .* this federation has 64"):
        run_fvtree(parts, params, FVTreeOptions(), ledger_dir=tmp_path)


@pytest.mark.parametrize("kind,change,message", [
    # one number short broadcast into the sums: every party's base score came out wrong, silently
    ("LabelStats", lambda msg: setattr(msg, "stats", msg.stats[:-1]) or msg,
     "the label statistics from party1 are not 2 finite numbers"),
    # a feature's range short: numpy's concatenation error
    ("Hello", lambda msg: setattr(msg, "lo", msg.lo[:-1]) or msg, "the hello from party1 does not hold a range"),
])
def test_a_peers_setup_message_of_the_wrong_length_is_refused(monkeypatch, kind, change, message):
    from fedgrove.exceptions import ProtocolError
    from fedgrove.protocols.fvtree import messages as fm
    from tests.conftest import altering_received

    parts = _parts(n=600)
    changed = altering_received(monkeypatch, "party0", getattr(fm, kind), change)
    with pytest.raises(ProtocolError, match=message):
        run_fvtree(parts, GBDTParams(n_estimators=1, max_depth=2, max_bins=8), FVTreeOptions(threshold=5.0),
                   timeout=30)
    assert changed


def test_dp_accountant_spends_exactly_the_budget_and_refuses_more():
    # trees of full depth: every depth of every tree spends its share; two ensembles of three trees on disjoint
    # thirds of the data spend epsilon in total
    parts = _parts(n=6000, k=2, theta=0.6)
    params = GBDTParams(n_estimators=6, max_depth=2, learning_rate=0.3, max_bins=8)
    dp = DPOptions(epsilon=4.0, trees_per_ensemble=3)
    out = run_fvtree(parts, params, FVTreeOptions(use_psd=False, refit=False, verify=False, dp=dp))
    for party in out["parties"].values():
        assert party.privacy.accountant.spent == pytest.approx(4.0)
    assert "epsilon spent 4 of 4" in out["model"].metadata["privacy"]
    too_few = DPOptions(epsilon=4.0, trees_per_ensemble=3, n_ensembles=1)  # budget for one ensemble, two needed
    with pytest.raises(PrivacyBudgetError, match="over the budget of 4"):
        run_fvtree(parts, params, FVTreeOptions(use_psd=False, refit=False, verify=False, dp=too_few))


def test_dp_multiclass_spends_exactly_the_budget_with_a_rounds_class_trees_in_sequence(monkeypatch):
    # a multiclass round grows one tree per class on the round's part of the data: the three trees compose in
    # sequence (each spends epsilon / n_ensembles / 3), two ensembles of two rounds in parallel within, so the
    # whole run spends epsilon exactly (the class trees as parallel branches would spend a third of it); one
    # ensemble's budget for two is refused
    from fedgrove.protocols.fvtree.privacy import DifferentialPrivacy

    asked = []
    rows_of_tree = DifferentialPrivacy.rows_of_tree
    monkeypatch.setattr(DifferentialPrivacy, "rows_of_tree",
                        lambda self, t, n, seed: asked.append(t) or rows_of_tree(self, t, n, seed))
    parts = _three_class_parts(n=6000, k=2)
    params = GBDTParams(objective="multiclass", n_classes=3, n_estimators=4, max_depth=2, learning_rate=0.3,
                        max_bins=8)
    opts = dict(use_psd=False, refit=False, verify=False)
    out = run_fvtree(parts, params, FVTreeOptions(**opts, dp=DPOptions(epsilon=4.0, trees_per_ensemble=2)))
    assert len(out["model"].trees) == 12
    # every tree of a round on the round's rows (its branch of the ensemble's parallel block), each party
    assert sorted(asked) == sorted([r for r in range(4) for _ in range(3)] * 2)
    for party in out["parties"].values():
        assert party.privacy.accountant.spent == pytest.approx(4.0)
    assert "epsilon spent 4 of 4" in out["model"].metadata["privacy"]
    too_few = DPOptions(epsilon=4.0, trees_per_ensemble=2, n_ensembles=1)
    with pytest.raises(PrivacyBudgetError, match="over the budget of 4"):
        run_fvtree(parts, params, FVTreeOptions(**opts, dp=too_few))


def test_dp_multiclass_learns_more_the_larger_epsilon():
    # three classes of about a third each: the noisy model at epsilon 64 is far above chance (0.70-0.72 over three
    # draws of the training rows, by hand), at epsilon 2 it is 0.35-0.44
    parts = _three_class_parts(n=15000, k=3)
    X_test, y_test = _three_class_parts(n=3000, k=1, seed=9)[0]
    params = GBDTParams(objective="multiclass", n_classes=3, n_estimators=10, max_depth=3, learning_rate=0.3,
                        max_bins=16)
    accuracy = {}
    for eps in (2.0, 64.0):
        opts = FVTreeOptions(verify=False, noise="public", dp=DPOptions(epsilon=eps, trees_per_ensemble=5))
        model = run_fvtree(parts, params, opts)["model"]
        accuracy[eps] = float(np.mean(model.predict(X_test) == y_test))
    assert accuracy[64.0] > max(accuracy[2.0] + 0.1, 0.65), accuracy


def test_dp_leaf_values_are_bounded_by_leaf_clip_at_no_cost_in_budget():
    # a small epsilon on few rows: noisy hessian sums near zero would give huge leaves; leaf_clip bounds them
    # (post-processing: the accountant's total is unchanged)
    parts = _parts(n=1200, k=2, theta=0.6)
    params = GBDTParams(n_estimators=3, max_depth=3, learning_rate=0.3, max_bins=8)
    opts = dict(use_psd=False, refit=False, verify=False, noise="public")  # the same noise draws every run
    big = []
    for clip in (0.5, None):
        out = run_fvtree(parts, params, FVTreeOptions(**opts, dp=DPOptions(epsilon=0.5, leaf_clip=clip)))
        leaves = np.concatenate([t.values[t.is_leaf].ravel() for t in out["model"].trees])
        big.append(np.abs(leaves).max())
        for party in out["parties"].values():
            assert 0 < party.privacy.accountant.spent <= 0.5 + 1e-9  # less when a tree stops early
    assert big[0] <= 0.3 * 0.5 + 1e-12
    assert big[1] > 0.3 * 0.5  # without the bound the noise pushes some leaf beyond it
    with pytest.raises(InvalidParameterError, match="leaf_clip"):
        DPOptions(epsilon=1.0, leaf_clip=0.0)

def test_dp_with_lambda_zero_and_no_leaf_clip_gives_finite_leaves():
    # the noisy hessian sum of a node, clipped at 0, over lambda 0 gave a leaf of -G/0 = +-inf: every
    # prediction the model made was infinite.  Such a leaf now gets 0 (its sums say nothing)
    params = GBDTParams(n_estimators=3, max_depth=3, learning_rate=0.3, max_bins=8, reg_lambda=0.0)
    opts = FVTreeOptions(use_psd=False, refit=False, verify=False, noise="public",
                         dp=DPOptions(epsilon=0.1, leaf_clip=None))
    parts = _parts(n=300, k=3, theta=0.6)
    model = run_fvtree(parts, params, opts)["model"]
    assert all(np.all(np.isfinite(t.values)) for t in model.trees)
    assert np.all(np.isfinite(model.predict_raw(parts[0][0])))


def test_dp_that_leaves_every_tree_without_a_split_says_so(caplog):
    # tiny parties and a small budget: the noise leaves no split with a positive gain; the model is a constant,
    # which the parties are told instead of finding out from its predictions
    import logging

    parts = _parts(n=160, k=2, theta=0.6)
    params = GBDTParams(n_estimators=4, max_depth=3, learning_rate=0.3, max_bins=8)
    opts = FVTreeOptions(use_psd=False, refit=False, verify=False, noise="public",
                         dp=DPOptions(epsilon=0.2, trees_per_ensemble=4))
    with caplog.at_level(logging.WARNING, logger="fedgrove"):
        out = run_fvtree(parts, params, opts)
    assert all(t.n_nodes == 1 for t in out["model"].trees)
    said = [r.getMessage() for r in caplog.records if "no tree has a split" in r.getMessage()]
    assert len(said) == len(parts)  # each party says it
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="fedgrove"):
        run_fvtree(parts, params, FVTreeOptions(use_psd=False, refit=False, verify=False))  # no DP: splits
    assert not [r for r in caplog.records if "no tree has a split" in r.getMessage()]


def test_a_model_left_without_splits_by_refused_uploads_names_the_endorsements_not_the_noise(caplog):
    # with DP each tree sees 1/trees_per_ensemble of a party's rows: too few per bin for the others' estimates,
    # so the endorsements refused every upload, even at epsilon 1e6, and the warning blamed the noise and
    # advised a larger epsilon, which changes nothing
    import logging

    parts = _parts(n=1200, k=2, theta=0.6)
    params = GBDTParams(n_estimators=5, max_depth=3, learning_rate=0.3, max_bins=64)
    opts = FVTreeOptions(noise="public", dp=DPOptions(epsilon=1e6))
    with caplog.at_level(logging.WARNING, logger="fedgrove"):
        out = run_fvtree(parts, params, opts)
    assert all(t.n_nodes == 1 for t in out["model"].trees)
    said = [r.getMessage() for r in caplog.records if "no tree has a split" in r.getMessage()]
    assert len(said) == len(parts) and all("the parties' endorsements refused 10 of 10 histogram uploads" in w
                                           and "1/5 of them to a tree" in w and "fewer trees per ensemble" in w
                                           and "epsilon" not in w for w in said), said
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="fedgrove"):  # every tree on all the rows: the roots are endorsed
        out = run_fvtree(parts, params, FVTreeOptions(noise="public", dp=DPOptions(epsilon=1e6, n_ensembles=5,
                                                                                   trees_per_ensemble=1)))
    assert all(t.n_nodes > 1 for t in out["model"].trees)
    assert not [r for r in caplog.records if "no tree has a split" in r.getMessage()]


def test_pv_tree_and_top_two_voting_run_and_learn():
    parts = _parts(n=4000, k=4, theta=0.8)
    X = np.vstack([a for a, _ in parts])
    y = np.concatenate([b for _, b in parts])
    params = GBDTParams(n_estimators=10, max_depth=3, learning_rate=0.3, max_bins=16)
    for refit in (True, False):
        model = run_fvtree(parts, params, FVTreeOptions(refit=refit, threshold=5.0))["model"]
        assert np.mean((model.predict_raw(X) > 0) == y) > 0.75


def test_cli_trains_with_dp_verifies_the_ledger_and_stops_rather_than_overspend(tmp_path, capsys):
    # the example config with differential privacy: training prints the accountant's total and writes a ledger
    # that `fedgrove ledger verify` accepts (exit 0) and rejects once edited (exit 8); a budget too small for the
    # trees asked for stops training with exit 7; a finished run resumes to the same files, a new one cannot
    import re

    from sklearn.datasets import load_breast_cancer

    from fedgrove.cli.main import main

    load_breast_cancer(as_frame=True).frame.to_csv(tmp_path / "cancer.csv", index=False)
    assert main(["partition", str(tmp_path / "cancer.csv"), "-l", "target", "--scheme", "horizontal", "--mode",
                 "unbalanced", "-p", "4", "--test-fraction", "0.2", "-o", str(tmp_path / "parts")]) == 0
    toml = (Path(__file__).parents[2] / "examples" / "fvtree" / "federation.toml").read_text()
    toml = re.sub(r"n_estimators = \d+", "n_estimators = 4", toml)
    # public noise: the same draws every run, so the budget check below does not depend on luck
    toml = toml.replace("[fvtree]\n", '[fvtree]\nnoise = "public"\n')
    dp = "[fvtree.dp]\nepsilon = 8.0\ntrees_per_ensemble = 2\n"
    (tmp_path / "fed.toml").write_text(toml.replace("[params]", dp + "\n[params]"))
    assert main(["simulate", str(tmp_path / "fed.toml")]) == 0
    printed = capsys.readouterr().out
    assert "party2: epsilon spent" in printed
    stats = json.loads((tmp_path / "runs" / "simulated" / "party2.stats.json").read_text())
    spent = float(re.match(r"epsilon spent (\S+) of 8 ", stats["privacy"]).group(1))
    assert 0 < spent <= 8 and stats["ledger_records"] > 0  # small data: trees stop early, depths left unspent
    ledger = tmp_path / "runs" / "simulated" / "party2.ledger.sqlite"
    assert main(["ledger", "verify", str(ledger)]) == 0
    assert main(["ledger", "show", str(ledger), "--png", str(tmp_path / "c.png")]) == 0
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"
    assert main(["ledger", "verify", str(_tampered(ledger, tmp_path, "UPDATE records SET author = 'party9' "
                                                                    "WHERE seq = 9"))]) == 8
    assert main(["simulate", str(tmp_path / "fed.toml")]) == 2  # the ledger files exist: refused, not appended to
    model = (tmp_path / "runs" / "simulated" / "party2.model.json").read_bytes()
    assert main(["simulate", str(tmp_path / "fed.toml"), "--resume"]) == 0  # a finished run: nothing to grow
    assert (tmp_path / "runs" / "simulated" / "party2.model.json").read_bytes() == model
    assert main(["ledger", "verify", str(ledger)]) == 0
    capsys.readouterr()
    fresh = toml.replace("[params]", dp + "\n[params]").replace('dir = "runs/simulated"', 'dir = "runs/new"')
    (tmp_path / "fresh.toml").write_text(fresh)
    assert main(["simulate", str(tmp_path / "fresh.toml"), "--resume"]) == 2  # nothing to resume from
    assert re.search(r"--resume: \S+party\d\.ledger\.sqlite from the interrupted run is missing",
                     capsys.readouterr().err)
    # stumps: the root's queries always spend the whole depth's share, so the first ensemble spends all of a
    # budget set for one, whatever the noise, and the second ensemble's first query is refused
    over = dp.replace("trees_per_ensemble = 2\n", "trees_per_ensemble = 2\nn_ensembles = 1\n")
    (tmp_path / "over.toml").write_text(toml.replace("[params]", over + "\n[params]")
                                        .replace("max_depth = 3", "max_depth = 1")
                                        .replace('dir = "runs/simulated"', 'dir = "runs/over"'))
    assert main(["simulate", str(tmp_path / "over.toml")]) == 7
    assert "over the budget of 8" in capsys.readouterr().err


class _Stop(Exception):
    pass


def _interrupted_then_resumed(tmp_path, params, options, lagging: str, at: int, every: int = 1, parts=None):
    """An uninterrupted run, and a run in which ``lagging`` dies while checkpointing round ``at`` (the others have
    checkpointed it) then resumed, every party checkpointing after every ``every`` rounds; both with the same
    signing keys.  Returns both runs' outputs and the records of each party's two ledgers."""
    from fedgrove.crypto.signing import SigningKey
    from fedgrove.ledger.store import open_records
    from fedgrove.runner.checkpoint import CheckpointStore

    class DiesAt(CheckpointStore):
        def save(self, state, array=None):
            if state["trees_done"] == at:
                raise _Stop(f"killed before checkpointing round {at}")
            super().save(state, array)

    parts = _parts(n=1500) if parts is None else parts
    names = ["party0", "party1", "party2"]

    def keys():
        return {n: SigningKey.from_seed(bytes([k + 1]) * 32) for k, n in enumerate(names)}

    (tmp_path / "full").mkdir()
    (tmp_path / "res").mkdir()
    full = run_fvtree(parts, params, options, ledger_dir=tmp_path / "full", keys=keys())
    def stores(lagging=None):
        out = {n: (DiesAt if n == lagging else CheckpointStore)(tmp_path / "res" / f"{n}.checkpoint.json")
               for n in names}
        for store in out.values():
            store.every = every
        return out

    with pytest.raises(_Stop):
        run_fvtree(parts, params, options, ledger_dir=tmp_path / "res", keys=keys(), checkpoints=stores(lagging))
    done = {n: json.loads((tmp_path / "res" / f"{n}.checkpoint.json").read_text())["trees_done"] for n in names}
    assert done == {n: at - every if n == lagging else at for n in names}
    stores = stores()
    resumed = run_fvtree(parts, params, options, ledger_dir=tmp_path / "res", keys=keys(), checkpoints=stores,
                         resume=True)

    def records(run, n):
        return [(r.kind, r.author, r.body, r.signature, r.hash) for r in open_records(tmp_path / run /
                                                                                      f"{n}.ledger.sqlite")]
    return full, resumed, {n: (records("full", n), records("res", n)) for n in names}


@pytest.mark.parametrize("dp,at,every", [(None, 3, 1), (DPOptions(epsilon=8.0, trees_per_ensemble=2), 4, 1),
                                         (DPOptions(epsilon=8.0, trees_per_ensemble=2), 3, 1), (None, 4, 2),
                                         (DPOptions(epsilon=8.0, trees_per_ensemble=2), 3, 3)])
def test_an_interrupted_run_resumes_to_the_model_and_ledger_of_an_uninterrupted_one(tmp_path, dp, at, every):
    # one party dies before checkpointing a round the others checkpointed: the federation resumes one checkpoint
    # back (those parties step back: ledger truncated, model and scores rolled back; under DP the accountant and
    # the noise stream too, inside an ensemble (at = 4: three rounds done, two per ensemble; at = 3 with a
    # checkpoint every 3 rounds: to the setup) or between two); checkpoints every round or every 2 or 3
    params = GBDTParams(n_estimators=6, max_depth=3, learning_rate=0.3, max_bins=16)
    full, resumed, ledgers = _interrupted_then_resumed(tmp_path, params, FVTreeOptions(dp=dp), "party1", at,
                                                       every)
    assert resumed["model"].to_dict() == full["model"].to_dict()
    for n, (a, b) in ledgers.items():
        assert a == b, n
    assert verify_ledger(tmp_path / "res" / "party2.ledger.sqlite")
    if dp is not None:
        for n, party in resumed["parties"].items():
            assert party.privacy.accountant.spent == full["parties"][n].privacy.accountant.spent
            assert party.privacy.report() == full["parties"][n].privacy.report()


def test_an_interrupted_run_with_row_and_column_sampling_resumes_to_the_uninterrupted_one(tmp_path):
    # colsample_bytree: every party draws the round's features from the seed, and (subsample) its own rows from
    # its own generator; the resumed run draws the skipped rounds' again, so its later rounds vote among the
    # uninterrupted run's features, on its rows
    params = GBDTParams(n_estimators=6, max_depth=3, learning_rate=0.3, max_bins=16, colsample_bytree=0.5,
                        subsample=0.7)
    full, resumed, ledgers = _interrupted_then_resumed(tmp_path, params, FVTreeOptions(), "party1", 4)
    assert resumed["model"].to_dict() == full["model"].to_dict()
    for n, (a, b) in ledgers.items():
        assert a == b, n
    per_tree = [{int(f) for f in t.nodes["feature"] if f >= 0} for t in full["model"].trees]
    assert all(len(f) <= 3 for f in per_tree) and len(set().union(*per_tree)) > 3  # 3 of 6 features a round


@pytest.mark.parametrize("at", [2, 3])
def test_an_interrupted_multiclass_run_with_dp_resumes_to_the_uninterrupted_one(tmp_path, at):
    # three trees a round, two rounds an ensemble: a party dies before checkpointing round ``at``, the others
    # step back to the round before, inside the first ensemble (at = 2) or between the two (at = 3), and the run
    # ends with the uninterrupted model, ledgers and budget spent
    params = GBDTParams(objective="multiclass", n_classes=3, n_estimators=4, max_depth=2, learning_rate=0.3,
                        max_bins=16)
    options = FVTreeOptions(verify=False, dp=DPOptions(epsilon=8.0, trees_per_ensemble=2))
    full, resumed, ledgers = _interrupted_then_resumed(tmp_path, params, options, "party1", at,
                                                       parts=_three_class_parts(n=6000))
    assert len(full["model"].trees) == 12 and all(t.n_nodes > 1 for t in full["model"].trees)
    assert resumed["model"].to_dict() == full["model"].to_dict()
    for n, (a, b) in ledgers.items():
        assert a == b, n
    assert verify_ledger(tmp_path / "res" / "party0.ledger.sqlite")
    for n, party in resumed["parties"].items():
        assert party.privacy.accountant.spent == full["parties"][n].privacy.accountant.spent > 0
        assert party.privacy.report() == full["parties"][n].privacy.report()


def test_resume_is_refused_where_it_cannot_reproduce_the_run(tmp_path):
    from fedgrove.crypto.signing import SigningKey
    from fedgrove.exceptions import ProtocolError
    from fedgrove.runner.checkpoint import CheckpointStore

    parts = _parts(n=900)
    params = GBDTParams(n_estimators=2, max_depth=2, max_bins=8)
    names = ["party0", "party1", "party2"]
    keys = {n: SigningKey.from_seed(bytes([k + 1]) * 32) for k, n in enumerate(names)}

    def stores():
        return {n: CheckpointStore(tmp_path / f"{n}.checkpoint.json") for n in names}

    run_fvtree(parts, params, FVTreeOptions(), ledger_dir=tmp_path, keys=keys, checkpoints=stores())
    # exact (unseeded) DP noise cannot be drawn again
    unseeded = FVTreeOptions(dp=DPOptions(epsilon=1.0, seeded=False))
    with pytest.raises(InvalidParameterError, match="seeded = false"):
        run_fvtree(parts, params, unseeded, ledger_dir=tmp_path, keys=keys, checkpoints=stores(), resume=True)
    # other data than the checkpoint's
    changed = [(parts[0][0] + 1.0, parts[0][1])] + parts[1:]
    with pytest.raises(InvalidParameterError, match="party0: checkpoint .* another run"):
        run_fvtree(changed, params, FVTreeOptions(), ledger_dir=tmp_path, keys=keys, checkpoints=stores(),
                   resume=True)

    # a checkpoint lost while its ledger holds trees: nothing to resume from, and the ledger is not wiped
    (tmp_path / "party2.checkpoint.json").rename(tmp_path / "party2.saved.json")
    n_records = verify_ledger(tmp_path / "party2.ledger.sqlite").n_records
    with pytest.raises(InvalidParameterError, match="party2: no checkpoint to resume from, but its ledger holds"):
        run_fvtree(parts, params, FVTreeOptions(), ledger_dir=tmp_path, keys=keys, checkpoints=stores(),
                   resume=True)
    assert verify_ledger(tmp_path / "party2.ledger.sqlite").n_records == n_records
    (tmp_path / "party2.saved.json").rename(tmp_path / "party2.checkpoint.json")
    # one party starts afresh, the others resume
    def afresh(party):
        fit = party.fit
        party.fit = lambda checkpoint, resume, progress: fit(checkpoint, False, progress)

    with pytest.raises(ProtocolError, match="some parties resume and some start afresh"):
        run_fvtree(parts, params, FVTreeOptions(), keys=keys, checkpoints=stores(), resume=True,
                   tamper={"party1": afresh})


def test_cli_warns_when_uploads_are_refused(tmp_path, capsys):
    # the example with 64 bins a feature: about 100 rows a party leave most bins empty or single, every honest
    # upload's overlap distance exceeds the threshold, every upload is refused and the trees cannot split; the
    # run says so (once, not per party) instead of ending with a constant model silently
    import re

    from sklearn.datasets import load_breast_cancer

    from fedgrove.cli.main import main

    load_breast_cancer(as_frame=True).frame.to_csv(tmp_path / "cancer.csv", index=False)
    assert main(["partition", str(tmp_path / "cancer.csv"), "-l", "target", "--scheme", "horizontal", "--mode",
                 "unbalanced", "-p", "4", "--test-fraction", "0.2", "-o", str(tmp_path / "parts")]) == 0
    toml = (Path(__file__).parents[2] / "examples" / "fvtree" / "federation.toml").read_text()
    toml = re.sub(r"n_estimators = \d+", "n_estimators = 2", toml).replace("max_bins = 8", "max_bins = 64")
    (tmp_path / "fed.toml").write_text(toml.replace("[fvtree]\n", '[fvtree]\nnoise = "public"\n'))  # same draws
    capsys.readouterr()
    assert main(["simulate", str(tmp_path / "fed.toml")]) == 0
    printed = capsys.readouterr().out
    assert printed.count("warning: histogram uploads refused") == 1
    stats = json.loads((tmp_path / "runs" / "simulated" / "party1.stats.json").read_text())
    refused = {q: n for q, n in stats["refused_uploads"].items() if n}
    assert refused and stats["uploads_per_party"] >= 2
    assert ", ".join(f"{q} {n} of {stats['uploads_per_party']}" for q, n in refused.items()) in printed


def test_psd_and_dp_noise_are_secret_to_each_party_unless_public():
    # default: a party's PSD noise (and seeded DP noise) comes from its own signing key, so the others cannot
    # recompute and remove it from what it shares; "public" draws it from the config's seed (research runs)
    from fedgrove.crypto.signing import SigningKey
    from fedgrove.protocols.fvtree.psd import PSD

    parts = _parts(n=900)
    params = GBDTParams(n_estimators=1, max_depth=2, max_bins=8, seed=5)
    names = ["party0", "party1", "party2"]

    def psd_counts(options, keys=None):
        out = run_fvtree(parts, params, options, keys=keys)
        return {n: out["parties"]["party0"].peers[n].psd.counts for n in names}, out

    fixed = {n: SigningKey.from_seed(bytes([k + 7]) * 32) for k, n in enumerate(names)}
    a, _ = psd_counts(FVTreeOptions(), fixed)
    b, _ = psd_counts(FVTreeOptions(), fixed)
    c, out = psd_counts(FVTreeOptions())  # other keys
    for n in names:
        np.testing.assert_array_equal(a[n], b[n])  # the same key: the same noise (a resumed run needs this)
        assert not np.array_equal(a[n], c[n])
    # what another party could compute from the public seed is not what party1 shared
    p1 = out["parties"]["party1"]
    public = PSD.build(p1.X, p1.y, p1.lo, p1.hi, 8, 1.0, np.random.default_rng([5, 53]),
                       np.random.default_rng([5, 54, 1]))
    assert not np.array_equal(public.counts, c["party1"])
    pub, _ = psd_counts(FVTreeOptions(noise="public"))
    np.testing.assert_array_equal(pub["party1"], public.counts)  # public: anyone can recompute it
    with pytest.raises(InvalidParameterError, match="noise must be 'secret' or 'public'"):
        FVTreeOptions(noise="shared")


def test_a_run_refused_before_its_first_record_leaves_no_ledger_to_block_the_next(tmp_path, capsys):
    # multiclass without n_classes is refused as the parties start: their ledgers are empty and go, so the
    # corrected config runs without --resume (it was told the append-only ledger existed)
    import re

    from sklearn.datasets import load_wine

    from fedgrove.cli.main import main

    load_wine(as_frame=True).frame.to_csv(tmp_path / "wine.csv", index=False)
    assert main(["partition", str(tmp_path / "wine.csv"), "-l", "target", "--scheme", "horizontal", "-p", "4",
                 "-o", str(tmp_path / "parts")]) == 0
    toml = (Path(__file__).parents[2] / "examples" / "fvtree" / "federation.toml").read_text()
    toml = re.sub(r"n_estimators = \d+", "n_estimators = 2", toml).replace('"binary"', '"multiclass"')
    toml = re.sub(r'\ntest = "[^"]*"', "", toml)
    (tmp_path / "fed.toml").write_text(toml)
    capsys.readouterr()
    assert main(["simulate", str(tmp_path / "fed.toml")]) == 2
    assert "[params] n_classes = K" in capsys.readouterr().err
    assert not list((tmp_path / "runs" / "simulated").glob("*.ledger.*"))
    (tmp_path / "fed.toml").write_text(toml.replace('"multiclass"', '"multiclass"\nn_classes = 3'))
    assert main(["simulate", str(tmp_path / "fed.toml")]) == 0, capsys.readouterr().err
    assert main(["ledger", "verify", str(tmp_path / "runs" / "simulated" / "party0.ledger.sqlite")]) == 0
