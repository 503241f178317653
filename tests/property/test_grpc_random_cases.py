"""Every protocol on small random federations: `fedgrove simulate` (one process) and the parties' own configs run
over gRPC with mutual TLS (each party in a thread of this process, as `fedgrove party` runs it) must write the
same model files and predictions, byte for byte.

The fixed examples' runs over gRPC check this on one table each; here each seed draws a table (40-200 rows of
mixed scales, missing values, few-valued and constant columns, a column of text categories, text IDs), labels
(binary, three classes or regression, as codes or class names), parameters, protocol options and a split of the
data between two to four parties (instances in each party's own order, test files included, in CSV or Parquet),
so that what only some data or settings reach (a guest holding no test instance, one ciphertext for several
rows, PSI alignment, count mode, the classical forest prediction, DP noise, a schedule in blocks, split Shapley
contributions, subsampling, row weights) travels over the real transport too.  The parties then predict again over
gRPC from their model files alone (`fedgrove party --predict`), which must write the same predictions.
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pandas as pd
import pytest

from fedgrove.exceptions import DataError
from tests.integration.test_federation_processes import _federation_configs, _parties_over_grpc_in_threads
from tests.property import random_features

PROTOCOLS = ("vertical", "hybridtree", "horizontal", "federated-forest", "simfl", "fvtree")
#: seed 0 in every run, the others marked slow: 1 and 2, or up to FEDGROVE_PROPERTY_SEEDS (exclusive) when set
SEEDS = [0] + [pytest.param(s, marks=pytest.mark.slow)
               for s in range(1, int(os.environ.get("FEDGROVE_PROPERTY_SEEDS", "3")))]


def _table(rs, objective: str, n: int):
    """A random table: features of mixed scales with missing values, and labels of ``objective``."""
    X = random_features(rs, n, int(rs.integers(3, 7)), missing=0.3)
    d = X.shape[1]
    signal = np.nan_to_num(X[:, 0]) / (np.nanstd(X[:, 0]) + 1e-12) + rs.normal(size=n)
    if objective == "binary":
        y = (signal > 0).astype(int)
        y[:2] = [0, 1]
    elif objective == "multiclass":
        y = np.digitize(signal, [-0.5, 0.5])
        y[:3] = [0, 1, 2]
    else:
        y = signal * 3 + 10
    return pd.DataFrame(X, columns=[f"f{j}" for j in range(d)]), y


def _case(rs, protocol: str, trees: int | None = None):
    """A random federation of ``trees`` rounds (else 1-3): the parties, {name: (role, training frame, test frame
    (None: no data), whether it holds the label, lines of its [[party]] table)}, and the config's other tables,
    {table: {key: value}}, which every party shares."""
    objective = str(rs.choice(["binary", "multiclass", "regression"]))
    n, n_test = int(rs.integers(40, 200)), int(rs.integers(5, 40))
    X, y = _table(rs, objective, n + n_test)
    X.insert(0, "_id", rs.permutation(10 * (n + n_test))[:n + n_test])
    vertical = protocol in ("vertical", "federated-forest", "hybridtree")
    if vertical and rs.random() < 0.3:  # instance IDs as text: every party codes them alike
        X["_id"] = "c-" + X["_id"].astype(str)
    options, extra = {}, ""
    if rs.random() < 0.3:  # a feature of text categories (and missing values)
        X["f0"] = np.where(np.isnan(X["f0"]), None, rs.choice(["red", "green", "blue"], len(X)))
        extra = 'categorical = "auto"\n' if vertical else 'categorical = {f0 = ["blue", "green", "red"]}\n'
    if objective != "regression" and rs.random() < 0.3:  # class names, in the order of their codes
        names = ["no", "yes"] if objective == "binary" else ["a", "b", "c"]
        y = np.asarray(names)[y]
        options["federation"] = {"classes": names}
    X["label"] = y
    train, test = X.iloc[:n], X.iloc[n:]
    d = X.shape[1] - 2
    k = int(rs.integers(2, 4 if protocol != "fvtree" else 5))
    params = {"objective": objective, "n_estimators": trees or int(rs.integers(1, 4)),
              "max_depth": int(rs.integers(1, 5)),
              "learning_rate": float(rs.choice([0.1, 0.3, 1.0])), "max_bins": int(rs.choice([2, 4, 16, 64])),
              "seed": int(rs.integers(0, 100))}
    if protocol == "federated-forest":  # a forest's parameters: fedgrove.engine.forest.ForestParams
        params = {"task": "regression" if objective == "regression" else "classification",
                  **{k: params[k] for k in ("n_estimators", "max_depth", "max_bins", "seed")},
                  "max_features": "sqrt" if rs.random() < 0.5 else 1.0, "bootstrap": bool(rs.random() < 0.7)}
    else:
        params["reg_lambda"] = float(rs.choice([0.0, 1.0, 5.0]))
        params["min_child_weight"] = float(rs.choice([1e-3, 1.0]))
    if objective == "multiclass" and protocol != "federated-forest":
        params["n_classes"] = 3
    if protocol in ("vertical", "horizontal", "fvtree") and rs.random() < 0.3:  # the engine's features each round
        params["colsample_bytree"] = 0.5
    if protocol in ("vertical", "horizontal", "fvtree") and rs.random() < 0.3:  # rows each round: the engine's
        # (vertical), each party its own (horizontal, FV-tree)
        params["subsample"] = 0.7
    if protocol == "simfl" and rs.random() < 0.3:  # each trainer its own rows and features each round
        params.update(subsample=0.7, colsample_bytree=0.6)
    parties = {}

    def rows(frame, cols, label):  # a party's part: its columns, in its own order of the instances
        part = frame[["_id", *cols, *(["label"] if label else [])]]
        return part.iloc[rs.permutation(len(part))]

    def holder(role, frame, test_frame, label):  # a party: (role, training frame, test frame, label?, config)
        categorical = frame is not None and "f0" in frame and not pd.api.types.is_numeric_dtype(frame["f0"])
        return role, frame, test_frame, label, extra if categorical else ""

    if protocol in ("vertical", "federated-forest", "hybridtree"):
        groups = [list(g) for g in np.array_split(rs.permutation(d), min(k, d)) if len(g)]
        cols = [[f"f{j}" for j in sorted(g)] for g in groups]
        if protocol == "hybridtree":
            del params["max_depth"]
            options["hybridtree"] = {"host_depth": int(rs.integers(1, 4)), "guest_depth": int(rs.integers(0, 3)),
                                     "mode": str(rs.choice(["hessian", "count"]))}
            if rs.random() < 0.3:  # the host's rows and features each round, and each guest's features
                params["colsample_bytree"] = 0.6
                if options["hybridtree"]["mode"] == "hessian":  # (count mode samples no rows)
                    params["subsample"] = 0.7
            parties["host"] = holder("host", rows(train, cols[0], True), rows(test, cols[0], False), True)
            for g, c in enumerate(cols[1:]):
                keep = rs.random(n) < rs.uniform(0.3, 1.0)  # a guest holds some of the instances
                keep_test = rs.random(n_test) < rs.uniform(0.0, 1.0)
                parties[f"guest{g}"] = holder("guest", rows(train[keep], c, False), rows(test[keep_test], c, False),
                                              False)
        else:
            lead, other = ("active", "passive") if protocol == "vertical" else ("client", "client")
            if protocol == "federated-forest":
                parties["master"] = holder("master", None, None, False)
                options["forest"] = {"label_mode": str(rs.choice(["encrypted", "shared"])),
                                     "prediction": str(rs.choice(["one-round", "classical"]))}
                params["feature_sampling"] = str(rs.choice(["tree", "node"]))
            for p, c in enumerate(cols):
                parties[f"party{p}"] = holder(lead if p == 0 else other, rows(train, c, p == 0),
                                              rows(test, c, False), p == 0)
            if protocol == "vertical" and rs.random() < 0.5:  # each party holds some instances the others lack
                options.setdefault("federation", {})["align"] = "psi"
                for p in list(parties)[1:]:
                    role, frame, t, label, more = parties[p]
                    parties[p] = (role, frame.iloc[:-int(rs.integers(1, 5))], t, label, more)
        count_mode = options.get("hybridtree", {}).get("mode") == "count"  # (one instance a ciphertext)
        if protocol != "federated-forest" and not count_mode and rs.random() < 0.5:
            options["he"] = {"rows_per_ciphertext": int(rs.integers(1, 3))}  # (OU-2048 holds two)
    else:
        features = [f"f{j}" for j in range(d)]
        shares = rs.dirichlet(np.full(k, 2.0)) * 0.7 + 0.3 / k
        cut = np.r_[0, np.round(np.cumsum(shares) * n).astype(int)]
        cut[-1] = n
        if protocol == "horizontal":
            parties["aggregator"] = holder("aggregator", None, None, False)
            if rs.random() < 0.3:
                options["horizontal"] = {"contributions": True}
        for p in range(k):
            part = train.iloc[cut[p]:cut[p + 1]]
            if objective == "binary" and part["label"].nunique() < 2:
                part = pd.concat([part, train.iloc[:2]])  # (rows 0 and 1 hold both classes)
            role = "client" if protocol == "horizontal" else "party"
            parties[f"party{p}"] = holder(role, rows(part, features, True).drop(columns="_id"),
                                          test[features].copy(), True)
        if protocol == "simfl":
            options["simfl"] = {"distribution": str(rs.choice(["cauchy", "gaussian"])),
                                "schedule": str(rs.choice(["blocks", "round-robin"])), "n_bins": 32,
                                "n_hashes": int(rs.integers(1, d)) if d > 1 else 1, "force": d == 1}
        elif protocol == "fvtree":
            options["fvtree"] = {"n_candidates": str(rs.choice(["all", "2"])), "refit": bool(rs.random() < 0.5),
                                 "psd_depth": int(rs.integers(1, 5)), "verify": bool(rs.random() < 0.5),
                                 "threshold": 10.0, "noise": "public"}
            if options["fvtree"]["n_candidates"] == "2":
                options["fvtree"]["n_candidates"] = 2
            if rs.random() < 0.3:
                options["fvtree.dp"] = {"epsilon": 5.0, "trees_per_ensemble": params["n_estimators"],
                                        "n_ensembles": 1, "seeded": True}
    if protocol in ("horizontal", "federated-forest"):  # (its master or aggregator holds no test file)
        options.setdefault("federation", {})["predict"] = True
    # row weights (a quarter 0) for some of the parties that take them: the label holders of the vertical
    # protocols (a HybridTree host in hessian mode), every horizontal client and SimFL party
    wr = np.random.default_rng(int(rs.integers(2 ** 32)))
    for name, (role, frame, test_frame, label, more) in parties.items():
        takes = label and protocol != "fvtree" and options.get("hybridtree", {}).get("mode") != "count"
        if takes and wr.random() < 0.4:
            w = np.where(wr.random(len(frame)) < 0.25, 0.0, wr.choice([0.5, 1.0, 2.0, 3.0], len(frame)))
            w[0] = max(w[0], 1.0)
            parties[name] = (role, frame.assign(w=w), test_frame, label, more + 'weight = "w"\n')
    sections = {"federation": {"protocol": protocol, "seed": int(rs.integers(0, 1000)), "timeout": 60,
                               **options.pop("federation", {})},
                **({"he": {"scheme": "ou", "key_bits": 2048, **options.pop("he", {})}}
                   if protocol in ("vertical", "hybridtree", "federated-forest") else {}),
                "params": params, **options}
    return parties, sections


def _toml(sections: dict) -> str:
    def value(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return f'"{v}"' if isinstance(v, str) else repr(v)

    return "".join(f"[{name}]\n" + "".join(f"{k} = {value(v)}\n" for k, v in table.items()) + "\n"
                   for name, table in sections.items())


def _write(tmp_path, parties: dict, sections: dict, parquet=()) -> None:
    """The parties' files (CSV, Parquet for those in ``parquet``), certificates, the federation config (output
    ``sim``) and each party's own config (output ``grpc``)."""
    lines = {}
    for n, (_, frame, test, label, more) in parties.items():
        lines[n] = more
        if frame is not None:
            ext = "parquet" if n in parquet else "csv"
            for suffix, table in (("", frame), ("-test", test)):
                path = tmp_path / f"{n}{suffix}.{ext}"
                table.to_parquet(path, index=False) if n in parquet else table.to_csv(path, index=False)
            lines[n] += f'data = "{n}.{ext}"\ntest = "{n}-test.{ext}"\n'
        if label:
            lines[n] += 'label = "label"\n'
    _federation_configs(tmp_path, {n: p[0] for n, p in parties.items()}, lines, _toml(sections))


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("seed", SEEDS)
def test_a_random_federation_writes_the_same_files_in_one_process_and_over_grpc(tmp_path, protocol, seed):
    from fedgrove.cli.main import main

    rs = np.random.default_rng([seed, PROTOCOLS.index(protocol)])
    parties, sections = _case(rs, protocol)
    _write(tmp_path, parties, sections, parquet={n for n in parties if rs.random() < 0.3})
    case = (tmp_path / "federation.toml").read_text()
    assert main(["simulate", str(tmp_path / "federation.toml")]) == 0, case
    _parties_over_grpc_in_threads(tmp_path, list(parties))
    # the models, predictions and SimFL's similarities; not statistics, checkpoints or ledgers (times, keys)
    written = sorted(f.name for f in (tmp_path / "sim").iterdir()
                     if f.name.endswith((".model.json", ".predictions.csv", ".simfl-prep.npz", ".simfl-prep.json")))
    assert any(w.endswith(".model.json") for w in written), written
    assert any(w.endswith(".predictions.csv") for w in written), written
    for name in written:
        sim, grpc_run = (tmp_path / d / name for d in ("sim", "grpc"))
        assert grpc_run.exists(), (name, case)
        if name.endswith(".simfl-prep.json"):  # (its preprocessing's seconds differ)
            a, b = (json.loads(f.read_text()) for f in (sim, grpc_run))
            assert a.pop("seconds") >= 0 and b.pop("seconds") >= 0 and a == b, (name, case)
        else:
            assert sim.read_bytes() == grpc_run.read_bytes(), (name, case)
    # and `fedgrove party --predict` over gRPC, from the model files alone, predicts the same
    predictions = sorted((tmp_path / "grpc").glob("*.predictions.csv"))
    for f in predictions:
        f.unlink()
    _parties_over_grpc_in_threads(tmp_path, list(parties), predict_only=True)
    for f in predictions:
        assert f.exists() and f.read_bytes() == (tmp_path / "sim" / f.name).read_bytes(), (f.name, case)


class _Killed(Exception):
    pass


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("seed", SEEDS)
def test_a_random_federation_stopped_mid_training_resumes_to_the_uninterrupted_files(tmp_path, monkeypatch, protocol,
                                                                                     seed):
    # one party fails while checkpointing a random tree (the others stop at once, some a checkpoint further);
    # every party restarted with --resume, in one process or over gRPC (a random half of the cases), must write
    # the files of a run that was never stopped; the parties checkpoint after every round or every 2 or 3
    rs = np.random.default_rng([seed, PROTOCOLS.index(protocol), 1])
    parties, sections = _case(rs, protocol, trees=int(rs.integers(2, 5)))
    every = int(np.random.default_rng([seed, PROTOCOLS.index(protocol), 4]).integers(1, 4))
    sections["federation"]["checkpoint_every"] = every
    if every > 1:  # (more rounds than a checkpoint's)
        sections["params"]["n_estimators"] += every
        if "fvtree.dp" in sections:
            sections["fvtree.dp"]["trees_per_ensemble"] = sections["params"]["n_estimators"]
    _write(tmp_path, parties, sections, parquet={n for n in parties if rs.random() < 0.3})

    def choose(done):  # a party that checkpoints more than one tree, and the tree it stops at
        victim = str(rs.choice(sorted(n for n in done if done[n] > 1)))
        return victim, int(rs.integers(1, done[victim]))

    over_grpc = np.random.default_rng([seed, PROTOCOLS.index(protocol), 2]).random() >= 0.5
    torn = np.random.default_rng([seed, PROTOCOLS.index(protocol), 3]).random() < 0.5
    _stopped_and_resumed(tmp_path, monkeypatch, protocol, sections, choose, over_grpc, torn)


def test_a_hybridtree_federation_whose_guests_grow_no_layers_resumes_from_the_hosts_checkpoint(tmp_path,
                                                                                                monkeypatch):
    # guest_depth = 0: the guests take part in no tree and never checkpoint; the host resumes where it stopped
    # (the resume agreement counted the guests' missing checkpoints as none, and the federation trained afresh)
    rs = np.random.default_rng(3)
    parties, sections = _case(rs, "hybridtree", trees=4)
    sections["hybridtree"]["guest_depth"] = 0
    assert sections["params"]["objective"] != "multiclass" and len(parties) > 1
    _write(tmp_path, parties, sections)
    _stopped_and_resumed(tmp_path, monkeypatch, "hybridtree", sections, lambda done: ("host", 3), False)
    _stopped_and_resumed(tmp_path, monkeypatch, "hybridtree", sections, lambda done: ("host", 2), True, torn=True)


def _stopped_and_resumed(tmp_path, monkeypatch, protocol, sections, choose, over_grpc: bool,
                         torn: bool = False) -> None:
    """Train the federation written in ``tmp_path`` uninterrupted (into sim/), then again (into stopped/) with
    the party ``choose(done)`` names ({party: trees its checkpoint holds at the end}: (party, tree)) failing
    at its first checkpoint of at least that tree (``torn``: halfway through writing its state, where that is
    written in place, after its run's first), then resume it (in one process, or ``over_grpc`` with the
    parties' own configs); every model and prediction file must be the uninterrupted run's."""
    import fedgrove.runner.checkpoint as checkpoint
    from fedgrove.runner.checkpoint import CheckpointStore
    from fedgrove.runner.config import load_federation
    from fedgrove.runner.run import simulate

    fed = tmp_path / "federation.toml"
    case = fed.read_text().replace('dir = "stopped"', 'dir = "sim"')
    fed.write_text(case)
    for d in ("sim", "stopped"):
        shutil.rmtree(tmp_path / d, ignore_errors=True)
    simulate(load_federation(fed))  # into sim/
    fed.write_text(case.replace('dir = "sim"', 'dir = "stopped"'))
    parties = [p.name for p in load_federation(fed).parties]
    done = {n: json.loads((tmp_path / "sim" / f"{n}.checkpoint.json").read_text())["trees_done"] for n in parties
            if (tmp_path / "sim" / f"{n}.checkpoint.json").exists()}  # (a HybridTree guest of no layers has none)
    victim, at = choose(done)
    save = CheckpointStore.save

    killed = []

    in_place = checkpoint._write_in_place
    cut = []  # the victim's state file, where its writing was cut short

    def dies(self, state, array=None):  # at its first checkpoint of at least ``at`` trees (multiclass: rounds)
        if self.path.name == f"{victim}.checkpoint.json" and state.get("trees_done", 0) >= at:
            killed.append(state["trees_done"])
            message = f"{victim} killed while checkpointing tree {state['trees_done']}"
            if torn and self._text is not None:
                def cut_short(path, text):  # the state before it whole, the newest half written
                    if path != self.path:
                        return in_place(path, text)
                    with open(path, "r+") as fh:
                        fh.write(text[:len(text) // 2])
                    cut.append(path)
                    raise _Killed(message)

                monkeypatch.setattr(checkpoint, "_write_in_place", cut_short)
                try:
                    save(self, state, array)
                finally:
                    monkeypatch.setattr(checkpoint, "_write_in_place", in_place)
            raise _Killed(message)
        return save(self, state, array)

    monkeypatch.setattr(CheckpointStore, "save", dies)
    with pytest.raises(_Killed, match="killed while checkpointing"):  # (the first failure: the victim's)
        simulate(load_federation(fed))
    assert len(killed) == 1 and killed[0] <= done[victim], (killed, victim, case)  # (its last checkpoint too)
    monkeypatch.setattr(CheckpointStore, "save", save)

    def states(cut_short=()):  # each party's newest checkpoint state in stopped/ (None: none yet; ``cut_short``:
        # parties whose newest does not hold together, the state before it)
        files = {n: tmp_path / "stopped" / f"{n}.checkpoint{'.prev' if n in cut_short else ''}.json" for n in done}
        return {n: json.loads(f.read_text()) if f.exists() else None for n, f in files.items()}

    if cut:  # (torn, where the victim had written a state before: its run's first replaces the file whole)
        with pytest.raises((json.JSONDecodeError, DataError)):  # (resume falls back to the state before it)
            checkpoint.check_state_digest(json.loads(cut[0].read_text()), cut[0])
        before = states(cut_short=[victim])
    else:
        before = states()
    if not over_grpc:
        simulate(load_federation(fed), resume=True)
    else:  # the parties' own configs over gRPC resume what stopped in one process
        for n in parties:
            config = tmp_path / f"{n}.toml"
            config.write_text(config.read_text().replace('dir = "grpc"', 'dir = "stopped"'))
        _parties_over_grpc_in_threads(tmp_path, parties, resume=True)
    one_tree_a_round = sections["params"].get("objective") != "multiclass" or protocol == "federated-forest"
    if one_tree_a_round and all(st is not None and st["trees_done"] for st in before.values()):
        # every party holds a tree: the federation resumed (the same tree logs), it did not train afresh
        after = states()
        assert all(after[n]["tree_log"]["file"] == before[n]["tree_log"]["file"] for n in done), \
            (victim, at, {n: (before[n]["trees_done"], before[n]["tree_log"], after[n]["tree_log"]) for n in done},
             case)
    written = sorted(f.name for f in (tmp_path / "sim").iterdir()
                     if f.name.endswith((".model.json", ".predictions.csv")))
    assert written, case
    for name in written:
        assert (tmp_path / "sim" / name).read_bytes() == (tmp_path / "stopped" / name).read_bytes(), \
            (name, victim, at, case)
