"""Text labels in federations: `federation.classes` gives every party the same codes, and the predictions and
models carry the names."""

import json
import os
import re

import numpy as np
import pandas as pd
import pytest

from fedgrove.cli.main import main

GRADES = ["low", "mid", "high"]


def _grades(n=360, seed=1):
    r = np.random.default_rng(seed)
    X = r.normal(size=(n, 3))
    df = pd.DataFrame(X, columns=["a", "b", "c"])
    df["grade"] = np.select([X[:, 0] < -0.5, X[:, 0] < 0.5], ["low", "mid"], "high")
    return df


def _party_block(name, role, data=None, test=None, label=None):
    lines = ["[[party]]", f'name = "{name}"', f'role = "{role}"']
    lines += [f'data = "{data}"'] if data else []
    lines += [f'test = "{test}"'] if test else []
    lines += [f'label = "{label}"'] if label else []
    return "\n".join(lines)


def _config(tmp_path, protocol, parties, classes=None, params="", extra=""):
    head = [f'[federation]\nprotocol = "{protocol}"\nseed = 0\ntimeout = 60']
    if classes is not None:
        head.append("classes = [" + ", ".join(f'"{c}"' if isinstance(c, str) else str(c).lower()
                                              for c in classes) + "]")
    text = "\n".join(head) + f"\n\n[params]\n{params}\n\n{extra}\n\n" + "\n\n".join(parties) + \
        '\n\n[output]\ndir = "runs"\n'
    path = tmp_path / "federation.toml"
    path.write_text(text)
    return path


def _horizontal(tmp_path, df, label, test_from=300):
    """Two clients (rows 0-179 and 180 to ``test_from``) and an aggregator; rows from ``test_from`` on are
    written to test.csv.  Returns the [[party]] blocks."""
    df.iloc[:180].to_csv(tmp_path / "p0.csv", index=False)
    df.iloc[180:test_from].to_csv(tmp_path / "p1.csv", index=False)
    df.iloc[test_from:].to_csv(tmp_path / "test.csv", index=False)
    return [_party_block("aggregator", "aggregator"), _party_block("party0", "client", "p0.csv", label=label),
            _party_block("party1", "client", "p1.csv", label=label)]


def test_horizontal_text_labels_need_the_class_list_and_then_keep_the_names(tmp_path, capsys):
    df = _grades()
    parties = _horizontal(tmp_path, df, "grade")
    params = 'objective = "multiclass"\nn_estimators = 8\nmax_depth = 3'
    cfg = _config(tmp_path, "horizontal", parties, params=params + "\nn_classes = 3")
    assert main(["simulate", str(cfg)]) != 0
    err = capsys.readouterr().err
    assert "holds text" in err and 'classes = ["high", "low", "mid"]' in err
    assert not (tmp_path / "runs" / "party0.model.json").exists()
    cfg = _config(tmp_path, "horizontal", parties, classes=GRADES, params=params)  # n_classes from the list
    assert main(["simulate", str(cfg)]) == 0, capsys.readouterr().err
    model = json.loads((tmp_path / "runs" / "party0.model.json").read_text())
    assert model["classes"] == GRADES and model["n_classes"] == 3
    out = tmp_path / "pred.csv"
    assert main(["predict", str(tmp_path / "runs" / "party0.model.json"), str(tmp_path / "test.csv"), "-l", "grade",
                 "-o", str(out)]) == 0
    got = pd.read_csv(out)["prediction"]
    assert set(got) <= set(GRADES) and (got.to_numpy() == df.iloc[300:]["grade"].to_numpy()).mean() > 0.8
    # without -l: the party's model names its label column (before, the column was taken for a feature and its
    # text refused)
    capsys.readouterr()
    assert main(["predict", str(tmp_path / "runs" / "party0.model.json"), str(tmp_path / "test.csv")]) == 0
    assert "accuracy" in capsys.readouterr().err
    assert json.loads((tmp_path / "runs" / "aggregator.model.json").read_text())["metadata"].get("label") is None


def test_a_label_outside_the_class_list_is_named(tmp_path, capsys):
    df = _grades()
    df.loc[7, "grade"] = "top"
    parties = _horizontal(tmp_path, df, "grade", test_from=len(df))
    cfg = _config(tmp_path, "horizontal", parties, classes=GRADES, params='objective = "multiclass"')
    assert main(["simulate", str(cfg)]) != 0
    err = capsys.readouterr().err
    assert "'top' (data row 8)" in err and "not in federation.classes" in err


@pytest.mark.parametrize("classes, params, message", [
    (["a"], "", "two or more classes"),
    (["a", 1], "", "not both"),
    ([True, False], "", "by label (numbers"),
    ([-1, -1.0], "", "lists a class twice"),
    (["a", "a"], "", "lists a class twice"),
    (["a", "b", "c"], "", "objective is 'binary'"),
    (["a", "b"], 'objective = "regression"', "for classification"),
    (["a", "b", "c"], 'objective = "multiclass"\nn_classes = 4', "n_classes is 4"),
])
def test_bad_class_lists_are_refused_before_anything_runs(tmp_path, capsys, classes, params, message):
    parties = [_party_block("aggregator", "aggregator"), _party_block("party0", "client", "p0.csv", label="y")]
    cfg = _config(tmp_path, "horizontal", parties, classes=classes, params=params)
    assert main(["simulate", str(cfg)]) != 0
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("classes", [["no", "yes"], [-1, 1]])  # names, and numbers other than the codes
def test_vertical_predictions_carry_the_classes(tmp_path, capsys, classes):
    df = _grades(300)
    df["ok"] = np.where(df["a"] + df["b"] > 0, classes[1], classes[0])
    df.insert(0, "_id", np.arange(len(df)))
    df.iloc[:240][["_id", "a", "ok"]].to_csv(tmp_path / "active.csv", index=False)
    df.iloc[:240][["_id", "b", "c"]].to_csv(tmp_path / "passive.csv", index=False)
    df.iloc[240:][["_id", "a", "ok"]].to_csv(tmp_path / "active_test.csv", index=False)
    df.iloc[240:][["_id", "b", "c"]].to_csv(tmp_path / "passive_test.csv", index=False)
    parties = [_party_block("active", "active", "active.csv", "active_test.csv", "ok"),
               _party_block("passive", "passive", "passive.csv", "passive_test.csv")]
    cfg = _config(tmp_path, "vertical", parties, classes=classes, params="n_estimators = 10\nmax_depth = 3",
                  extra='[he]\nbackend = "plain"')
    assert main(["simulate", str(cfg)]) == 0, capsys.readouterr().err
    pred = pd.read_csv(tmp_path / "runs" / "active.predictions.csv")
    assert list(pred.columns) == ["_id", "prediction"] + [f"p_{c}" for c in classes]
    truth = df.set_index("_id").loc[pred["_id"], "ok"].to_numpy()
    assert set(pred["prediction"]) <= set(classes) and (pred["prediction"].to_numpy() == truth).mean() > 0.85
    stats = json.loads((tmp_path / "runs" / "active.stats.json").read_text())
    assert stats["test_accuracy"] == pytest.approx((pred["prediction"].to_numpy() == truth).mean())


def test_a_forest_keeps_an_output_for_a_listed_class_its_labels_lack(tmp_path, capsys):
    df = _grades(300)
    train = df[df["grade"] != "high"].iloc[:200].copy()  # no "high" row: the forest still has three outputs
    train.insert(0, "_id", np.arange(len(train)))
    train[["_id", "a", "grade"]].to_csv(tmp_path / "c0.csv", index=False)
    train[["_id", "b", "c"]].to_csv(tmp_path / "c1.csv", index=False)
    parties = [_party_block("master", "master"), _party_block("c0", "client", "c0.csv", label="grade"),
               _party_block("c1", "client", "c1.csv")]
    cfg = _config(tmp_path, "federated-forest", parties, classes=GRADES, params="n_estimators = 4\nmax_depth = 3",
                  extra='[he]\nbackend = "plain"')
    assert main(["simulate", str(cfg)]) == 0, capsys.readouterr().err
    model = json.loads((tmp_path / "runs" / "master.model.json").read_text())
    assert model["classes"] == GRADES and model["n_classes"] == 3


def _signs(n=360, seed=2):
    """LIBSVM's binary labels, -1 and 1."""
    df = _grades(n, seed).drop(columns="grade")
    df["y"] = np.where(df["a"] + df["b"] > 0, 1, -1)
    return df


def test_numeric_labels_that_are_not_class_codes_need_the_class_list(tmp_path, capsys):
    # before, the engine refused them with "binary objective needs labels 0/1", without saying what to do
    df = _signs()
    parties = _horizontal(tmp_path, df, "y")
    params = "n_estimators = 10\nmax_depth = 3"
    assert main(["simulate", str(_config(tmp_path, "horizontal", parties, params=params))]) != 0
    err = " ".join(capsys.readouterr().err.split())
    assert "holds the labels -1, 1, but a binary model takes its classes as the codes 0, 1" in err
    assert "[federation] classes = [-1, 1]" in err and 'objective = "regression"' in err
    assert main(["simulate", str(_config(tmp_path, "horizontal", parties, ["no", "yes"], params))]) != 0
    err = " ".join(capsys.readouterr().err.split())
    assert "holds numbers, but federation.classes lists class names" in err and "classes = [-1, 1]" in err
    assert main(["simulate", str(_config(tmp_path, "horizontal", parties, [0, 1], params))]) != 0
    # either party may be first to say so
    assert re.search(r"holds -1 \(data row \d+\), which is not in federation.classes \[0, 1\]", capsys.readouterr().err)
    assert main(["simulate", str(_config(tmp_path, "horizontal", parties, [1, -1], params))]) == 0  # 1 is code 0
    capsys.readouterr()
    model = json.loads((tmp_path / "runs" / "party0.model.json").read_text())
    assert model["classes"] == [1, -1]
    out = tmp_path / "pred.csv"
    assert main(["predict", str(tmp_path / "runs" / "party0.model.json"), str(tmp_path / "test.csv"), "-o",
                 str(out), "--proba"]) == 0
    assert "accuracy" in capsys.readouterr().err
    p = pd.read_csv(out)
    assert list(p.columns) == ["p_1", "p_-1"]
    assert (np.where(p["p_1"] > 0.5, 1, -1) == df.iloc[300:]["y"].to_numpy()).mean() > 0.85
    # multiclass labels 1, 2, 3: the codes would be 0, 1, 2
    df["y"] = np.select([df["a"] < -0.5, df["a"] < 0.5], [1, 2], 3)
    _horizontal(tmp_path, df, "y")
    params = 'objective = "multiclass"\nn_classes = 3\nn_estimators = 5\nmax_depth = 3'
    assert main(["simulate", str(_config(tmp_path, "horizontal", parties, params=params))]) != 0
    assert "[federation] classes = [1, 2, 3]" in " ".join(capsys.readouterr().err.split())
    assert main(["simulate", str(_config(tmp_path, "horizontal", parties, [1, 2, 3], params))]) == 0
    assert json.loads((tmp_path / "runs" / "party1.model.json").read_text())["classes"] == [1, 2, 3]


@pytest.mark.parametrize("labels, note", [([-1, 1], "classes = [-1, 1]"), ([1, 2, 3], "classes = [1, 2, 3]"),
                                          ([0, 1], None), ([0.5, 1.5, 2.25], None)])
def test_partition_of_numeric_labels_that_are_not_codes_says_which_class_list(tmp_path, capsys, labels, note):
    df = _signs(120).drop(columns="y")
    df["y"] = np.resize(labels, len(df))
    df.to_csv(tmp_path / "d.csv", index=False)
    assert main(["partition", str(tmp_path / "d.csv"), "-l", "y", "--scheme", "horizontal", "-p", "2",
                 "-o", str(tmp_path / "parts")]) == 0
    err = " ".join(capsys.readouterr().err.split())
    if note is None:
        assert "classes =" not in err
    else:
        assert f"the labels are not the class codes 0, 1, ...: for classification, a federation on these files " \
               f"needs, in every party's config, [federation] {note}" in err


def test_partition_of_text_labels_says_which_class_list_the_federation_needs(tmp_path, capsys):
    _grades().to_csv(tmp_path / "grades.csv", index=False)
    assert main(["partition", str(tmp_path / "grades.csv"), "-l", "grade", "--scheme", "horizontal", "-p", "2",
                 "-o", str(tmp_path / "parts")]) == 0
    assert '[federation] classes = ["high", "low", "mid"]' in " ".join(capsys.readouterr().err.split())


@pytest.mark.parametrize("scheme, labels, note", [
    ("horizontal", [0, 1, 2], True), ("horizontal", [0, 1], False), ("vertical", [0, 1, 2], False)])
def test_partition_of_multiclass_codes_by_samples_says_the_number_of_classes(tmp_path, capsys, scheme, labels,
                                                                             note):
    # parties holding samples must be given n_classes for multiclass (one may lack a class); the partition says
    # so, with how many classes each holds, where the federation would otherwise stop on it
    df = _signs(120).drop(columns="y")
    df["y"] = np.resize(labels, len(df))
    df.to_csv(tmp_path / "d.csv", index=False)
    args = ["partition", str(tmp_path / "d.csv"), "-l", "y", "--scheme", scheme, "-p", "2",
            "-o", str(tmp_path / "parts")]
    assert main(args + (["--mode", "dirichlet", "--beta", "0.1"] if scheme == "horizontal" else [])) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert "the label column is 'y' (label = \"y\" in a labelled party's config)" in err  # the configs need it
    assert main(["info", str(tmp_path / "parts")]) == 0
    assert f"{scheme} partition of 120 samples, label column 'y'" in capsys.readouterr().out
    if not note:
        assert "n_classes" not in err
        return
    m = re.search(r"the labels are the codes of 3 classes: a multiclass federation on these files needs, in every "
                  r"party's config, \[params\] n_classes = 3 \(a party may lack some classes; classes held: "
                  r"party0 (\d), party1 (\d)\)", err)
    assert m, err
    manifest = json.loads((tmp_path / "parts" / "manifest.json").read_text())
    for k, held in enumerate(m.groups()):
        part = pd.read_csv(tmp_path / "parts" / manifest["parties"][k]["file"])
        assert int(held) == part["y"].nunique()


def test_info_on_a_vertical_active_model_counts_every_party_features_and_says_how_it_predicts(tmp_path, capsys):
    df = _grades(200)
    df["ok"] = np.where(df["a"] + df["b"] > 0, "yes", "no")
    df.insert(0, "_id", np.arange(len(df)))
    df[["_id", "a", "ok"]].to_csv(tmp_path / "active.csv", index=False)
    df[["_id", "b", "c"]].to_csv(tmp_path / "passive.csv", index=False)
    parties = [_party_block("active", "active", "active.csv", label="ok"),
               _party_block("passive", "passive", "passive.csv")]
    cfg = _config(tmp_path, "vertical", parties, classes=["no", "yes"], params="n_estimators = 5\nmax_depth = 3",
                  extra='[he]\nbackend = "plain"')
    assert main(["simulate", str(cfg)]) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert main(["info", str(tmp_path / "runs" / "active.model.json")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "3 (active: 1, passive: 2)" in out and "None" not in out.split("classes")[0]
    assert "the vertical protocol, active's copy" in out and "through the federation" in out
    import fedgrove

    assert f"saved by fedgrove │ {fedgrove.__version__}" in out
    # its own column by name, the passive party's by owner and position (the active party never sees its names)
    top = out.split("top features by gain │")[1].split("│")[0]
    assert "a " in top and "passive:0" in top and "active:" not in top
    assert main(["info", str(tmp_path / "runs" / "passive.model.json")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    used = out.split("its most used features │")[1].split("│")[0]
    assert "b (" in used and "splits)" in used and "column" not in used
    # the run's output directory: each party's statistics, as simulate printed them, and its model files
    assert main(["info", str(tmp_path / "runs")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "per-party communication" in out and "│ active │ active │" in out and "│ passive │ passive │" in out
    assert "model files: active.model.json, passive.model.json" in out
    # statistics another run with other parties left in the folder are not mixed in
    ghost = json.loads((tmp_path / "runs" / "passive.stats.json").read_text())
    ghost.update(party="ghost", federation=["ghost", "other"])
    (tmp_path / "runs" / "ghost.stats.json").write_text(json.dumps(ghost))
    os.utime(tmp_path / "runs" / "ghost.stats.json", (1, 1))
    assert main(["info", str(tmp_path / "runs")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "left out: the statistics of ghost, from an earlier run" in out and "│ ghost │" not in out
    assert main(["info", str(tmp_path)]) == 3  # a directory with neither a run nor a partition
    assert "holds neither a partition (manifest.json) nor a federation run's statistics" in capsys.readouterr().err
