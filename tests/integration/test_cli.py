"""The CLI end to end, in-process through ``main(argv)`` (same code path as the
console script), plus one real subprocess to check the installed command."""

import io
import json
import re
import subprocess
import sys
import warnings

import numpy as np
import pandas as pd
import pytest

from fedgrove.cli.main import main


@pytest.fixture
def csv(tmp_path):
    r = np.random.default_rng(0)
    X = r.normal(size=(400, 4))
    df = pd.DataFrame(X, columns=["a", "b", "c", "d"])
    df["label"] = np.where(X[:, 0] + X[:, 1] > 0, "yes", "no")
    path = tmp_path / "train.csv"
    df.to_csv(path, index=False)
    return path


def run(argv, capsys):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_classifier_trained_in_python_is_predicted_as_one(tmp_path, capsys):
    # a model saved by the library had no class names: fedgrove predict printed an RMSE for a binary model and
    # refused --proba as "a regression model"; and without --label, the label was taken for a fourth feature
    from fedgrove import GBDTParams, train_gbdt

    r = np.random.default_rng(1)
    X = r.normal(size=(300, 3))
    y = (X[:, 0] + r.normal(size=300) * 0.5 > 0).astype(int)
    pd.DataFrame(np.column_stack([X, y]), columns=["a", "b", "c", "label"]).to_csv(tmp_path / "d.csv", index=False)
    train_gbdt(GBDTParams(n_estimators=5), X, y).save(tmp_path / "m.json")
    code, _, err = run(["predict", tmp_path / "m.json", tmp_path / "d.csv", "-l", "label", "--proba", "-o",
                        tmp_path / "p.csv"], capsys)
    assert code == 0, err
    assert re.search(r"accuracy 0\.9\d+  auc", err) and "rmse" not in err, err
    assert list(pd.read_csv(tmp_path / "p.csv").columns) == ["p_0", "p_1"]
    code, _, err = run(["predict", tmp_path / "m.json", tmp_path / "d.csv"], capsys)
    assert code != 0 and "'" + str(tmp_path / "d.csv") + "' has 4 feature columns; the model takes 3; if one of " \
        "them is the label, name it with --label" in " ".join(err.split()), err


def test_train_predict_info_partition(csv, tmp_path, capsys):
    model = tmp_path / "m.json"
    code, _, err = run(["train", csv, "-m", model, "-l", "label", "-n", "20", "--max-depth", "3", "-q"], capsys)
    assert code == 0, err
    assert "trained gbdt (binary)" in err
    preds = tmp_path / "p.csv"
    code, _, err = run(["predict", model, csv, "-l", "label", "-o", preds], capsys)
    assert code == 0, err
    assert "accuracy" in err
    got = pd.read_csv(preds)["prediction"]
    truth = pd.read_csv(csv)["label"]
    assert (got == truth).mean() > 0.9
    code, out, _ = run(["info", model], capsys)
    assert code == 0 and "gbdt" in out
    code, _, err = run(["train", csv, "-m", tmp_path / "f.json", "-l", "label", "--algorithm", "forest", "-n", "5",
                        "-q", "--max-features", "9"], capsys)
    assert code == 0, err
    assert "trained forest (classification, 2 classes)" in err  # it said "multiclass" of two classes
    assert "max_features = 9, but the data has 4 features: every tree tries all of them" in err
    parts = tmp_path / "parts"
    code, _, err = run(["partition", csv, "-o", parts, "--scheme", "hybrid", "-p", "3", "-l", "label"], capsys)
    assert code == 0, err
    assert sorted(p.name for p in parts.iterdir()) == ["guest0.csv", "guest1.csv", "guest2.csv", "host.csv",
                                                       "manifest.json"]
    code, out, _ = run(["info", parts], capsys)
    assert code == 0 and "hybrid partition" in out
    share = (pd.read_csv(csv)["label"] == "no").mean()  # the host's classes, as the partition printed them
    mix = f"no {100 * share:.0f}%, yes {100 * (1 - share):.0f}%"
    assert mix in out and f"+ label ({mix})" in err
    # a party's file is shown as that party's, with its label column (it was taken as a feature)
    code, out, _ = run(["info", parts / "host.csv"], capsys)
    assert code == 0 and "(host's training file, host, of the partition in" in out
    import json

    n_host = len(json.loads((parts / "manifest.json").read_text())["parties"][0]["features"])
    assert f"400 samples x {n_host} features" in out and "label column 'label'" in out
    code, out, _ = run(["info", parts / "guest1.csv"], capsys)
    assert code == 0 and "guest1's training file, guest" in out and "label column" not in out


def test_info_on_a_data_file_without_label_says_every_column_counts_as_a_feature(csv, tmp_path, capsys):
    # it printed "400 samples x 5 features", the label among them, with no word that -l sets it apart
    df = pd.read_csv(csv)
    df["label"] = (df["label"] == "yes").astype(int)
    csv = tmp_path / "numbers.csv"
    df.to_csv(csv, index=False)
    code, out, _ = run(["info", csv], capsys)
    flat = " ".join(re.sub("[│┌┐└┘─┬┴├┤┼]", " ", out).split())  # the table's text, without its wrapping
    assert code == 0 and "400 samples x 5 features" in flat
    assert "label column none given, so every column is counted as a feature (-l COLUMN names it; `fedgrove " \
           "train` takes the last, 'label', by default)" in flat, out
    code, out, _ = run(["info", csv, "-l", "label"], capsys)
    assert code == 0 and "400 samples x 4 features" in out and "none given" not in out


@pytest.mark.parametrize("algorithm", ["gbdt", "forest"])
def test_a_weight_column_weights_the_rows_and_is_no_feature(csv, tmp_path, capsys, algorithm):
    from fedgrove.engine.forest import ForestParams, train_forest
    from fedgrove.engine.gbdt import GBDTParams, train_gbdt
    from fedgrove.engine.model import load_model

    df = pd.read_csv(csv)
    df.insert(2, "w", np.random.default_rng(3).integers(0, 4, len(df)).astype(float))
    data = tmp_path / "weighted.csv"
    df.to_csv(data, index=False)
    model = tmp_path / "m.json"
    code, _, err = run(["train", data, "-m", model, "-l", "label", "--weight", "w", "-n", "6", "--max-depth", "3",
                        "--algorithm", algorithm, "-q"], capsys)
    assert code == 0, err
    assert "400 samples x 4 features, weighted by 'w'" in err
    saved = load_model(model)
    assert saved.feature_names == ["a", "b", "c", "d"] and saved.metadata["weight"] == "w"
    code, out, _ = run(["info", model], capsys)
    assert code == 0 and re.search(r"weight column\s+│ w\s", out), out
    X, y = df[["a", "b", "c", "d"]].to_numpy(), (df["label"] == "yes").to_numpy(float)
    ref = (train_gbdt(GBDTParams(n_estimators=6, max_depth=3), X, y, sample_weight=df["w"]) if algorithm == "gbdt"
           else train_forest(ForestParams(n_estimators=6, max_depth=3), X, y, sample_weight=df["w"]))
    np.testing.assert_array_equal(saved.predict_proba(X), ref.predict_proba(X))
    code, _, err = run(["predict", model, data, "-l", "label", "-o", tmp_path / "p.csv"], capsys)
    assert code == 0, err
    assert "columns the model does not use, left out: w" in err
    # bad weights: one line, a non-zero exit, no model written
    df.loc[7, "w"] = -2.0
    df.to_csv(tmp_path / "negative.csv", index=False)
    headerless = tmp_path / "headerless.csv"
    df.drop(columns="label").assign(label=y).to_csv(headerless, index=False, header=False)
    for argv, message in [
            ([tmp_path / "negative.csv", "-w", "w"], "--weight column 'w' has -2.0 in data row 8; weights must "
                                                    "be non-negative numbers"),
            ([data, "-w", "weight"], "--weight column 'weight' not found in"),
            ([data, "-w", "label"], "--weight 'label' is the label column"),
            ([headerless, "-w", "w"], "has no column names")]:
        code, _, err = run(["train", *argv, "-l", "label" if argv[0] != headerless else "-1", "-m",
                            tmp_path / "bad.json", "-q", "--algorithm", algorithm], capsys)
        assert code != 0 and message in err and len(err.strip().splitlines()) == 1, err
        assert not (tmp_path / "bad.json").exists()


def test_predict_and_valid_weigh_their_scores_by_a_weight_column(csv, tmp_path, capsys):
    # predict --weight: scores weighted as fedgrove.metrics weighs them (weights of 0/1: the scores of the rows of
    # weight 1); train --weight with a --valid file holding the column weighs its rows in early stopping too
    from fedgrove import metrics
    from fedgrove.engine.gbdt import GBDTParams, train_gbdt
    from fedgrove.engine.model import load_model

    df = pd.read_csv(csv)
    flip = np.random.default_rng(0).random(len(df)) < 0.2  # noisy labels: early stopping stops early
    df.loc[flip, "label"] = np.where(df["label"][flip] == "yes", "no", "yes")
    df["w"] = (np.arange(len(df)) % 4 != 0).astype(float)
    train, valid = df.iloc[:250], df.iloc[250:]
    train.to_csv(tmp_path / "train.csv", index=False)
    valid.to_csv(tmp_path / "valid.csv", index=False)
    model = tmp_path / "m.json"
    code, out, err = run(["train", tmp_path / "train.csv", "-m", model, "-l", "label", "-w", "w", "-n", "40",
                          "--learning-rate", "0.2", "--valid", tmp_path / "valid.csv", "--early-stopping", "3", "-q"],
                         capsys)
    assert code == 0, err
    X, y = df[["a", "b", "c", "d"]].to_numpy(), (df["label"] == "yes").to_numpy(float)
    kept = valid["w"].to_numpy() > 0
    params = GBDTParams(n_estimators=40, learning_rate=0.2, early_stopping_rounds=3)
    ref = train_gbdt(params, X[:250], y[:250], sample_weight=train["w"], eval_set=(X[250:][kept], y[250:][kept]))
    saved = load_model(model)
    assert saved.n_trees == ref.n_trees
    unweighted = train_gbdt(params, X[:250], y[:250], sample_weight=train["w"], eval_set=(X[250:], y[250:]))
    assert unweighted.n_trees != ref.n_trees  # (so the weights decided it)
    p = saved.predict_proba(X[250:][kept])
    line = f"accuracy {metrics.accuracy(y[250:][kept], p.argmax(axis=1)):.4f} auc {metrics.auc(y[250:][kept], p):.4f}"
    assert line in " ".join(err.split()) and "(rows weighted by 'w')" in err
    code, _, err = run(["predict", model, tmp_path / "valid.csv", "-w", "w", "-o", tmp_path / "p.csv"], capsys)
    assert code == 0 and line in " ".join(err.split()) and "(rows weighted by 'w')" in err, err
    code, _, err = run(["predict", model, tmp_path / "valid.csv", "-o", tmp_path / "p.csv"], capsys)
    assert code == 0 and line not in " ".join(err.split()) and "columns the model does not use, left out: w" in err
    valid.drop(columns="w").to_csv(tmp_path / "no-w.csv", index=False)
    code, _, err = run(["train", tmp_path / "train.csv", "-m", tmp_path / "m2.json", "-l", "label", "-w", "w", "-n",
                        "3", "--valid", tmp_path / "no-w.csv", "-q"], capsys)
    assert code == 0 and "has no column 'w': its rows weigh alike" in " ".join(err.split()), err
    for argv, message in [(["-w", "nope"], "--weight column 'nope' not found in"),
                          (["-w", "w", "-l", "nope"], "label column")]:
        code, _, err = run(["predict", model, tmp_path / "valid.csv", *argv, "-o", tmp_path / "bad.csv"], capsys)
        assert code != 0 and message in err and not (tmp_path / "bad.csv").exists(), err
    valid.drop(columns="label").to_csv(tmp_path / "unlabelled.csv", index=False)
    code, _, err = run(["predict", model, tmp_path / "unlabelled.csv", "-w", "w"], capsys)
    assert code == 2 and "weighs the scores against the labels" in err, err


def test_class_weights_weigh_the_rows_of_each_class(csv, tmp_path, capsys):
    from sklearn.utils.class_weight import compute_sample_weight

    from fedgrove.engine.gbdt import GBDTParams, train_gbdt
    from fedgrove.engine.model import load_model

    df = pd.read_csv(csv)
    df["w"] = np.random.default_rng(4).uniform(0.5, 2, len(df))
    data = tmp_path / "weighted.csv"
    df.to_csv(data, index=False)
    X, y = df[["a", "b", "c", "d"]].to_numpy(), (df["label"] == "yes").to_numpy(float)
    params = GBDTParams(n_estimators=5, max_depth=3)
    for flags, weights in [(["--class-weight", "balanced"], compute_sample_weight("balanced", y)),
                           (["--class-weight", "yes=3", "-w", "w"], np.where(y == 1, 3.0, 1.0) * df["w"])]:
        model = tmp_path / "m.json"
        code, _, err = run(["train", data, "-m", model, "-l", "label", "-n", "5", "--max-depth", "3", "-q", *flags],
                           capsys)
        assert code == 0, err
        assert f"classes weighted {flags[1]}:" in err
        code, out, _ = run(["info", model], capsys)
        assert code == 0 and re.search(rf"class weights\s+│ {flags[1]}\s", out), out
        saved = load_model(model)
        assert saved.metadata["class_weight"] == flags[1]
        features = ["a", "b", "c", "d"] if "-w" in flags else ["a", "b", "c", "d", "w"]
        ref = train_gbdt(params, df[features].to_numpy(), y, sample_weight=weights)
        np.testing.assert_allclose(saved.predict_raw(df[features].to_numpy()),
                                   ref.predict_raw(df[features].to_numpy()), rtol=1e-12, atol=1e-12)
    regression = df.assign(label=X[:, 0])
    regression.to_csv(tmp_path / "regression.csv", index=False)
    for argv, code_expected, message in [
            ([data, "--class-weight", "yes=3,maybe=2"], 2, "--class-weight names classes the labels do not hold: "
                                                          "'maybe'; the classes are 'no', 'yes'"),
            ([tmp_path / "never-read.csv", "--class-weight", "yes:3"], 2, "CLASS=WEIGHT pairs, comma-separated, "
                                                                          "each weight a non-negative number, got "
                                                                          "'yes:3'"),
            ([tmp_path / "never-read.csv", "--class-weight", "yes=-1"], 2, "got 'yes=-1'"),
            ([tmp_path / "regression.csv", "--class-weight", "balanced"], 2, "regression labels have none")]:
        code, _, err = run(["train", *argv, "-l", "label", "-m", tmp_path / "bad.json", "-q"], capsys)
        assert code == code_expected and message in err and len(err.strip().splitlines()) == 1, err
        assert not (tmp_path / "bad.json").exists()


@pytest.mark.parametrize("algorithm", ["gbdt", "forest"])
def test_three_text_classes_train_a_multiclass_model_that_predicts_the_names(tmp_path, capsys, algorithm):
    r = np.random.default_rng(1)
    X = r.normal(size=(300, 3))
    df = pd.DataFrame(X, columns=["a", "b", "c"])
    df["grade"] = np.select([X[:, 0] < -0.5, X[:, 0] < 0.5], ["low", "mid"], "high")
    data = tmp_path / "grades.csv"
    df.to_csv(data, index=False)
    model = tmp_path / "m.json"
    code, _, err = run(["train", data, "-m", model, "-l", "grade", "-n", "10", "--algorithm", algorithm, "-q"],
                       capsys)
    assert code == 0, err
    assert "Traceback" not in err
    assert ("trained gbdt (multiclass)" if algorithm == "gbdt" else "trained forest (classification, 3 classes)") \
        in err
    preds = tmp_path / "p.csv"
    code, _, err = run(["predict", model, data, "-o", preds], capsys)
    assert code == 0, err
    got = pd.read_csv(preds)["prediction"]
    assert set(got) == {"low", "mid", "high"}
    assert (got == df["grade"]).mean() > 0.9
    if algorithm == "gbdt":  # --valid is the boosting's early stopping
        # a validation file labelled otherwise (adult.test's '<=50K.' against '<=50K'): the training labels named
        valid = tmp_path / "valid.csv"
        df.assign(grade=df["grade"] + ".").to_csv(valid, index=False)
        code, _, err = run(["train", data, "-m", tmp_path / "v.json", "-l", "grade", "-n", "10", "--valid", valid,
                            "-q"], capsys)
        assert code != 0 and not (tmp_path / "v.json").exists()
        assert "does not occur in the training labels ('high', 'low', 'mid')" in err
    # one text class is not a classification problem: said in one line
    df.assign(grade="low").to_csv(data, index=False)
    code, _, err = run(["train", data, "-m", tmp_path / "one.json", "-l", "grade", "-q"], capsys)
    assert code != 0 and "needs at least 2 label values, got 1" in err and "Traceback" not in err


def test_info_shows_a_models_feature_importance(csv, tmp_path, capsys):
    model = tmp_path / "m.json"
    assert run(["train", csv, "-m", model, "-l", "label", "-n", "10", "--max-depth", "3", "-q"], capsys)[0] == 0
    code, out, err = run(["info", model, "--importance", "split"], capsys)
    assert code == 0, err
    top = next(line for line in out.splitlines() if "top features by gain" in line)
    assert top.split("│")[2].split()[0] in ("a", "b")  # the label is drawn from a and b
    table = out[out.index("features by split"):]
    rows = [line.split("│")[1].strip() for line in table.splitlines() if line.startswith("│")]
    assert set(rows[:2]) == {"a", "b"} and set(rows) <= {"a", "b", "c", "d"}
    code, _, err = run(["info", model, "--importance", "cover"], capsys)
    assert code == 2 and "--importance must be one of gain, split, got 'cover'" in err
    code, _, err = run(["info", csv, "--importance", "gain"], capsys)
    assert code == 2 and "is for a model file" in err
    code, _, err = run(["info", tmp_path / "missing.json"], capsys)
    assert code != 0 and "model file" in err and "does not exist" in err


def test_predict_matches_columns_by_name_and_scores_the_models_label(csv, tmp_path, capsys):
    model = tmp_path / "m.json"
    assert run(["train", csv, "-m", model, "-l", "label", "-n", "10", "-q"], capsys)[0] == 0
    expected = tmp_path / "p.csv"
    code, _, err = run(["predict", model, csv, "-l", "label", "-o", expected, "--proba"], capsys)
    assert code == 0, err
    df = pd.read_csv(csv)
    shuffled = tmp_path / "shuffled.csv"  # other column order, the label elsewhere, a column the model never saw
    df.assign(note=7)[["note", "d", "label", "b", "a", "c"]].to_csv(shuffled, index=False)
    got = tmp_path / "q.csv"
    code, _, err = run(["predict", model, shuffled, "-o", got, "--proba"], capsys)  # no --label: the model's
    assert code == 0, err
    assert "accuracy" in err and "left out: note" in err
    assert pd.read_csv(got).equals(pd.read_csv(expected))
    df.drop(columns=["c"]).to_csv(shuffled, index=False)
    code, _, err = run(["predict", model, shuffled], capsys)
    assert code == 3 and "1 of the model's 4 features is not a column of" in err and "'c'" in err
    valid = tmp_path / "valid.csv"  # the validation file of early stopping is matched by name too
    df[["label", "d", "c", "b", "a"]].to_csv(valid, index=False)
    code, _, err = run(["train", csv, "-m", tmp_path / "v.json", "-l", "label", "-n", "10", "-q", "--valid", valid,
                        "--early-stopping", "3"], capsys)
    assert code == 0, err
    code, _, err = run(["train", csv, "-m", tmp_path / "v2.json", "-l", "label", "-n", "10", "-q", "--valid", csv,
                        "--early-stopping", "3"], capsys)
    assert code == 0, err
    assert (tmp_path / "v.json").read_text() == (tmp_path / "v2.json").read_text()


def test_predict_scores_a_test_file_with_a_class_the_model_never_saw_and_writes_it_first(csv, tmp_path, capsys):
    # a label outside the model's classes stopped predict before it wrote anything
    model = tmp_path / "m.json"
    assert run(["train", csv, "-m", model, "-l", "label", "-n", "10", "-q"], capsys)[0] == 0
    df = pd.read_csv(csv)
    odd = tmp_path / "odd.csv"
    df.assign(label=np.where(np.arange(len(df)) < 8, "maybe", df["label"])).to_csv(odd, index=False)
    out = tmp_path / "p.csv"
    code, _, err = run(["predict", model, odd, "-o", out], capsys)
    assert code == 0, err
    got = pd.read_csv(out)["prediction"]
    expected = float(np.mean((got.to_numpy() == df["label"].to_numpy()) & (np.arange(len(df)) >= 8)))
    assert f"accuracy {expected:.4f}" in err
    assert "8 of 400 rows have labels the model was not trained on, 'maybe': counted as errors" in err
    assert "auc" not in err
    # flags that cannot apply are refused before the data is read
    code, _, err = run(["predict", model, tmp_path / "absent.csv", "--proba", "--leaf"], capsys)
    assert code == 2 and "--proba and --leaf ask for different outputs" in err
    assert run(["train", csv, "-m", tmp_path / "r.json", "-l", "a", "-n", "3", "-q", "--categorical", "auto"],
               capsys)[0] == 0
    code, _, err = run(["predict", tmp_path / "r.json", tmp_path / "absent.csv", "--proba"], capsys)
    assert code == 2 and "--proba needs a classification model; " in err and "is a regression model" in err


def test_predict_on_test_labels_of_one_class_leaves_auc_out_without_warnings(csv, tmp_path, capsys):
    model = tmp_path / "m.json"
    assert run(["train", csv, "-m", model, "-l", "label", "-n", "5", "-q"], capsys)[0] == 0
    df = pd.read_csv(csv)
    df[df["label"] == "yes"].to_csv(tmp_path / "yes.csv", index=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # scikit-learn's UndefinedMetricWarning reached the terminal
        code, _, err = run(["predict", model, tmp_path / "yes.csv"], capsys)
    assert code == 0, err
    assert re.search(r"accuracy \d\.\d{4}  \(AUC and AUPRC left out: every label is 'yes'\)  logloss", err), err


def test_train_scores_the_validation_file_and_early_stopping_needs_one(csv, tmp_path, capsys):
    # --valid alone trained and said nothing of it; --early-stopping without it was a data error (exit 3)
    # after the data had been read
    model = tmp_path / "v.json"
    code, out, err = run(["train", csv, "-m", model, "-l", "label", "-n", "10", "-q", "--valid", csv], capsys)
    assert code == 0, err
    line = re.search(rf"on {re.escape(str(csv))}: accuracy (\d\.\d{{4}})  auc .* logloss", out + err)
    assert line, out + err
    code, predicted, err = run(["predict", model, csv, "-o", tmp_path / "p.csv"], capsys)  # scored alike
    assert f"accuracy {line.group(1)}" in predicted + err
    code, _, err = run(["train", tmp_path / "no-such.csv", "-m", model, "-l", "label", "--early-stopping", "3"],
                       capsys)
    assert code == 2 and "--early-stopping watches a validation set: give --valid VALID_FILE too" in err, err


def test_notes_of_the_library_reach_stderr_unless_the_log_level_hides_them(csv, tmp_path, capsys):
    # early stopping is logged by the engine: the CLI shows it as a note, --log-level warning hides it
    df = pd.read_csv(csv)
    noisy = tmp_path / "noisy.csv"
    df.assign(label=np.random.default_rng(5).permutation(df["label"].to_numpy())).to_csv(noisy, index=False)
    argv = ["train", csv, "-m", tmp_path / "e.json", "-l", "label", "-n", "200", "-q", "--valid", noisy,
            "--early-stopping", "2"]
    code, _, err = run(argv, capsys)
    assert code == 0 and "note: early stopping at iteration" in err, err
    code, _, err = run(["--log-level", "warning", *argv], capsys)
    assert code == 0 and "early stopping" not in err, err
    code, _, err = run(["--log-level", "loud", *argv], capsys)
    assert code == 2 and "must be one of debug, info, warning, error" in err


def test_predict_reads_a_libsvm_file_that_never_mentions_the_last_feature(tmp_path, capsys):
    from sklearn.datasets import dump_svmlight_file

    r = np.random.default_rng(1)
    X = r.normal(size=(200, 3))
    y = np.where(X[:, 0] > 0, 1, -1)
    dump_svmlight_file(X, y, str(tmp_path / "train.svm"))
    X[:, 2] = 0  # LIBSVM leaves zeros out: this file's rows end at feature 2
    dump_svmlight_file(X, y, str(tmp_path / "test.svm"))
    model = tmp_path / "m.json"
    assert run(["train", tmp_path / "train.svm", "-m", model, "-n", "5", "-q"], capsys)[0] == 0
    code, out, err = run(["predict", model, tmp_path / "test.svm"], capsys)
    assert code == 0, err
    assert "accuracy" in err and len(out.split()) == 201
    # LIBSVM's labels are read as numbers with a decimal point; the classes are the whole numbers -1 and 1
    assert set(out.split()[1:]) == {"-1", "1"}


def test_predict_leaves_out_libsvm_features_beyond_those_of_the_training_file(tmp_path, capsys):
    # before, the file was refused ("n_features was set to 2, but input file contains 4 features"); a training
    # file without values in features 3 and 4 gives the model it would give with those columns, all zero
    from sklearn.datasets import dump_svmlight_file

    from fedgrove.data.io import load_table
    from fedgrove.engine.gbdt import GBDTParams, train_gbdt

    r = np.random.default_rng(1)
    X = r.normal(size=(200, 4))
    y = np.where(X[:, 0] + X[:, 3] > 0, 1, 0)
    dump_svmlight_file(np.where(np.arange(4) < 2, X, 0), y, str(tmp_path / "train.svm"))  # ends at feature 2
    dump_svmlight_file(X, y, str(tmp_path / "test.svm"))
    outs = []
    for width in (None, 4):
        t = load_table(tmp_path / "train.svm", n_features=width)
        assert t.n_features == (width or 2)
        model = tmp_path / f"m{width}.json"
        fitted = train_gbdt(GBDTParams(n_estimators=5, objective="binary"), t.X, t.y)
        fitted.classes = [0, 1]  # as fedgrove train keeps them
        fitted.save(model)
        code, out, err = run(["predict", model, tmp_path / "test.svm", "--proba"], capsys)
        assert code == 0, err
        assert ("left out: f2, f3" in err) == (width is None) and "accuracy" in err
        outs.append(out)
    assert outs[0] == outs[1]


def test_a_libsvm_test_file_is_read_with_the_numbering_of_the_training_file(tmp_path, capsys):
    # scikit-learn writes LIBSVM files numbered from 0; a test file whose rows never hold feature 0 read
    # alone as numbered from 1, and every feature was shifted by one: the predictions were silently wrong
    from sklearn.datasets import dump_svmlight_file

    from fedgrove import load_model

    r = np.random.default_rng(3)
    X = r.normal(size=(300, 3))
    dump_svmlight_file(X, (X[:, 0] + X[:, 1] > 0).astype(int), str(tmp_path / "train.svm"))
    Xt = r.normal(size=(40, 3))
    Xt[:, 0] = 0
    dump_svmlight_file(Xt, (Xt[:, 1] > 0).astype(int), str(tmp_path / "test.svm"))
    model = tmp_path / "m.json"
    assert run(["train", tmp_path / "train.svm", "-m", model, "-n", "10", "-q"], capsys)[0] == 0
    m = load_model(model)
    assert m.metadata["libsvm_base"] == 0 and m.feature_names == ["f0", "f1", "f2"]
    code, out, _ = run(["info", tmp_path / "train.svm"], capsys)  # labels as the file writes them (not 0.0)
    assert code == 0 and re.search(r"label column 'label' +│ 0: \d+, 1: \d+", out) and "f0, f1, f2" in out
    code, out, err = run(["predict", model, tmp_path / "test.svm", "--proba"], capsys)
    assert code == 0, err
    got = pd.read_csv(io.StringIO(out)).to_numpy()
    np.testing.assert_array_equal(got, m.predict_proba(Xt))
    # a file numbered from 1 given to a model of files numbered from 0 is refused, not shifted
    dump_svmlight_file(X, X[:, 2] > 0, str(tmp_path / "one.svm"), zero_based=False)
    assert run(["train", tmp_path / "one.svm", "-m", tmp_path / "m1.json", "-n", "2", "-q"], capsys)[0] == 0
    code, _, err = run(["predict", tmp_path / "m1.json", tmp_path / "train.svm"], capsys)
    assert code != 0 and "numbers its features from 0 (it holds index 0), but the training data numbered" in err


def test_text_columns_as_categories_through_train_predict_and_partition(tmp_path, capsys):
    import json

    r = np.random.default_rng(2)
    colour = r.choice(["red", "green", "blue"], 300)
    x = r.normal(size=300)
    df = pd.DataFrame({"colour": colour, "x": x, "label": np.where((colour == "red") ^ (x > 1), "a", "b")})
    df.to_csv(tmp_path / "train.csv", index=False)
    model = tmp_path / "m.json"
    code, _, err = run(["train", tmp_path / "train.csv", "-m", model, "-l", "label", "-n", "20", "-q"], capsys)
    assert code == 3 and "--categorical" in err
    code, _, err = run(["train", tmp_path / "train.csv", "-m", model, "-l", "label", "-n", "20", "-q",
                        "--categorical", "auto"], capsys)
    assert code == 0, err
    assert "colour (3)" in err
    assert json.loads(model.read_text())["metadata"]["categories"] == {"colour": ["blue", "green", "red"]}
    code, out, _ = run(["info", model], capsys)  # what predict will expect of a file
    shown = " ".join(out.split())
    assert code == 0 and "categories of colour │ blue, green, red" in shown and "label column │ label" in shown
    test = df.iloc[:50].copy()
    test.loc[test.index[:4], "colour"] = "violet"  # unseen in training: missing
    test[["x", "label", "colour"]].to_csv(tmp_path / "test.csv", index=False)
    code, out, err = run(["predict", model, tmp_path / "test.csv"], capsys)
    assert code == 0, err
    assert "taken as missing: colour (4 rows)" in err and "accuracy" in err
    got = pd.read_csv(__import__("io").StringIO(out))["prediction"]
    assert (got[4:] == test["label"].iloc[4:].to_numpy()).all()  # red/not-red learnt from the codes
    code, _, err = run(["partition", tmp_path / "train.csv", "-o", tmp_path / "parts", "--scheme", "horizontal",
                        "-p", "2", "-l", "label", "--categorical", "colour"], capsys)
    assert code == 0, err
    manifest = json.loads((tmp_path / "parts" / "manifest.json").read_text())
    assert manifest["categories"] == {"colour": ["blue", "green", "red"]}
    party = pd.read_csv(tmp_path / "parts" / "party0.csv")
    assert set(party["colour"]) == {0, 1, 2}
    code, out, _ = run(["info", tmp_path / "parts"], capsys)
    assert code == 0 and "categories of colour (codes 0..2): blue, green, red" in out


def test_predict_refuses_text_in_a_column_its_model_took_as_numbers(tmp_path, capsys):
    """A model trained on category codes (a party's file written by partition --categorical) knows no
    categories: text in that column, even a Parquet column declared categorical, is refused, where it was
    coded by the test file's own categories (here green 0, red 1 against the training's blue 0, green 1,
    red 2: silently wrong), and the message does not point to a --categorical that predict does not have."""
    r = np.random.default_rng(3)
    code = r.integers(0, 3, 300)  # blue, green, red
    df = pd.DataFrame({"colour": code, "x": r.normal(size=300), "label": (code == 2).astype(int)})
    df.to_csv(tmp_path / "coded.csv", index=False)
    model = tmp_path / "m.json"
    assert run(["train", tmp_path / "coded.csv", "-m", model, "-l", "label", "-n", "10", "-q"], capsys)[0] == 0
    test = pd.DataFrame({"colour": pd.Categorical(["green", "red"] * 10), "x": 0.0, "label": [0, 1] * 10})
    test.to_parquet(tmp_path / "test.parquet")
    test.assign(colour=test.colour.astype(str)).to_csv(tmp_path / "test.csv", index=False)
    for name in ("test.parquet", "test.csv"):
        code, out, err = run(["predict", model, tmp_path / name, "-o", tmp_path / "p.csv"], capsys)
        assert code == 3 and "column 'colour'" in err and "non-numeric value 'green'" in err, err
        assert "trained without it as a category" in err and "--categorical" not in err
        assert not (tmp_path / "p.csv").exists()
    test.assign(colour=np.where(test.colour == "red", 2, 1)).to_csv(tmp_path / "codes.csv", index=False)
    code, _, err = run(["predict", model, tmp_path / "codes.csv"], capsys)  # the codes it was trained on
    assert code == 0 and "accuracy 1.0000" in err


def test_a_data_file_without_a_known_extension_is_read_by_its_content_or_needs_format(csv, tmp_path, capsys):
    odd = tmp_path / "train.export"
    odd.write_bytes(csv.read_bytes())
    code, out, err = run(["info", odd, "-l", "label"], capsys)  # every line holds four commas: a CSV
    assert code == 0 and "400 samples x 4 features" in out, err
    ragged = tmp_path / "notes.export"  # a quoted comma: lines with other numbers of commas
    ragged.write_text('a,note,label\n1,"x, y",yes\n2,z,no\n')
    code, _, err = run(["info", ragged, "-l", "label"], capsys)
    assert code == 3 and "cannot tell the format of" in err and "--format" in err
    code, out, err = run(["info", ragged, "-l", "label", "--format", "csv", "--categorical", "auto"], capsys)
    assert code == 0 and "2 samples x 2 features" in out, err


def _bad_inputs(tmp_path, csv):
    df = pd.read_csv(csv)
    text = df.astype(object)
    text.loc[5, "b"] = "twelve"
    text.to_csv(tmp_path / "text.csv", index=False)
    nanlab = df.copy()
    nanlab["label"] = nanlab["label"].where(nanlab.index != 3)
    nanlab.to_csv(tmp_path / "nanlabel.csv", index=False)
    three = df.copy()
    three.loc[:10, "label"] = "maybe"
    three.to_csv(tmp_path / "three.csv", index=False)
    (tmp_path / "empty.csv").write_text("")
    (tmp_path / "broken.json").write_text('{"format": "fedgrove-model", "trees": [')
    inf = df.copy()
    inf.loc[2, "c"] = np.inf
    inf.to_csv(tmp_path / "inf.csv", index=False)
    return {
        "missing file": (["train", tmp_path / "nope.csv", "-l", "label"], 3, "does not exist"),
        "no such label": (["train", csv, "-l", "target"], 3, "label column 'target' not found"),
        "non-numeric": (["train", tmp_path / "text.csv", "-l", "label"], 3, "non-numeric value 'twelve'"),
        "nan label": (["train", tmp_path / "nanlabel.csv", "-l", "label"], 3, "missing value"),
        "binary with 3 labels": (["train", tmp_path / "three.csv", "-l", "label", "--objective", "binary"], 3,
                                 "exactly 2 label values"),
        "empty file": (["train", tmp_path / "empty.csv", "-l", "label"], 3, "is empty"),
        "infinite value": (["train", tmp_path / "inf.csv", "-l", "label"], 3, "infinite"),
        "bad parameter": (["train", csv, "-l", "label", "--learning-rate", "-1"], 2, "--learning-rate must be > 0"),
        # named by the option given, not the engine's name (n_threads), and before the data is read
        "bad threads": (["train", tmp_path / "never-read.csv", "--threads", "0"], 2, "--threads must be >= 1, got 0"),
        "bad colsample": (["train", tmp_path / "never-read.csv", "--colsample", "0"], 2, "--colsample must be > 0"),
        "bad predict threads": (["predict", tmp_path / "never-read.json", csv, "--threads", "0"], 2,
                                "--threads must be >= 1, got 0"),
        "bad objective": (["train", tmp_path / "never-read.csv", "--objective", "poisson"], 2,
                          "--objective must be auto, binary, multiclass or regression, got 'poisson'"),
        "negative seed": (["partition", tmp_path / "never-read.csv", "--scheme", "vertical", "--seed", "-1"], 2,
                          "--seed must be >= 0, got -1"),
        "negative reproduce seed": (["reproduce", "simfl", "--seed", "-1"], 2, "--seed must be >= 0, got -1"),
        "bad forest depth": (["train", tmp_path / "never-read.csv", "--algorithm", "forest", "--max-depth", "0"], 2,
                             "--max-depth must be >= 1, got 0"),
        "broken model": (["predict", tmp_path / "broken.json", csv, "-l", "label"], 4, "not a fedgrove model file"),
        # "error: Is a directory: ..." with exit 1
        "config is a folder": (["simulate", tmp_path], 2, "is a directory; give its .toml file"),
    }


@pytest.mark.parametrize("case", ["missing file", "no such label", "non-numeric", "nan label", "binary with 3 labels",
                                  "empty file", "infinite value", "bad parameter", "bad threads",
                                  "bad predict threads", "bad colsample",
                                  "bad objective", "bad forest depth", "negative seed", "negative reproduce seed",
                                  "broken model", "config is a folder"])
def test_bad_input_is_one_line_nonzero_and_writes_nothing(csv, tmp_path, capsys, case):
    argv, expected_code, message = _bad_inputs(tmp_path, csv)[case]
    before = set(tmp_path.rglob("*"))
    out_file = tmp_path / "out.json"
    argv = argv + (["-m", out_file] if argv[0] == "train" else [] if argv[0] == "simulate" else
                   ["-o", tmp_path / "out.csv"])
    code, out, err = run(argv, capsys)
    assert code == expected_code, err
    assert message in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert set(tmp_path.rglob("*")) == before  # no half-written output


def test_bag_options_of_the_truth_file_need_the_truth_file(tmp_path, capsys):
    # --label without --truth was ignored: the predictions came out unscored without a word
    preds = tmp_path / "host.predictions.csv"
    preds.write_text("_id,prediction,p_0,p_1\n0,1,0.2,0.8\n1,0,0.7,0.3\n")
    for flag, value in (("--label", "y"), ("--format", "csv")):
        code, out, err = run(["bag", preds, flag, value], capsys)
        assert code == 2 and f"{flag} describes the --truth file, and none is given" in err, err
        assert out == ""
    code, out, _ = run(["bag", preds], capsys)
    assert code == 0 and out.startswith("_id,prediction")


def test_bag_refuses_writing_over_a_prediction_file_and_says_what_text_predictions_need(tmp_path, capsys):
    # `bag a.csv b.csv -o a.csv` replaced a host's predictions with the bagged ones; class names without
    # probabilities were refused as "must be numbers (regression)", which did not say what to give
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    a.write_text("_id,prediction,p_0,p_1\n0,1,0.2,0.8\n1,0,0.7,0.3\n")
    b.write_text("_id,prediction,p_0,p_1\n0,1,0.4,0.6\n1,1,0.45,0.55\n")
    before = a.read_bytes()
    code, _, err = run(["bag", a, b, "-o", a], capsys)
    assert code == 2 and "is a prediction file" in err and "writing it would destroy it" in err, err
    assert a.read_bytes() == before
    for f in (a, b):
        f.write_text("_id,prediction\n0,yes\n1,no\n")
    code, _, err = run(["bag", a, b], capsys)
    assert code == 3 and "class probabilities (the p_<class> columns" in " ".join(err.split()), err


@pytest.mark.parametrize("command", ["train", "predict", "bag"])
def test_unwritable_output_is_refused_before_any_work(csv, tmp_path, capsys, command):
    missing = tmp_path / "no-such-dir" / "out.csv"
    if command == "train":
        argv = ["train", csv, "-l", "label", "-m", missing]
    elif command == "predict":
        model = tmp_path / "m.json"
        assert run(["train", csv, "-l", "label", "-m", model, "-n", "2", "-q"], capsys)[0] == 0
        argv = ["predict", model, csv, "-l", "label", "-o", missing]
    else:
        argv = ["bag", tmp_path / "never-read.csv", "-o", missing]
    code, _, err = run(argv, capsys)
    assert code == 2, err
    assert f"directory '{missing.parent}' does not exist" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    code, _, err = run(argv[:-1] + [tmp_path], capsys)  # a directory where a file name belongs
    assert code == 2 and "is a directory" in err, err


@pytest.mark.parametrize("command", ["partition", "certs", "reproduce"])
def test_output_directory_that_is_a_file_is_refused_before_any_work(csv, tmp_path, capsys, command):
    a_file = tmp_path / "taken"
    a_file.write_text("keep me")
    argv = {"partition": ["partition", csv, "-l", "label", "--scheme", "horizontal", "--parties", "2"],
            "certs": ["certs", "alice", "bob"],
            "reproduce": ["reproduce", "simfl", "--quick", "--no-progress"]}[command]
    for out, message in ((a_file, f"--out '{a_file}' is a file; expected a directory"),
                         (a_file / "sub", f"'{a_file}' is a file, so the directory cannot be created")):
        code, _, err = run(argv + ["-o", out], capsys)
        assert code == 2, err
        assert message in err
    assert a_file.read_text() == "keep me" and sorted(tmp_path.iterdir()) == sorted([csv, a_file])


def test_error_messages_keep_square_brackets(csv, tmp_path, capsys):
    """Config errors name TOML tables ("[hybridtree]"); the console must print them, not read them as markup."""
    config = tmp_path / "federation.toml"
    config.write_text(f'''[federation]
protocol = "hybridtree"
[hybridtree]
mode = "bogus"
[[party]]
name = "host"
role = "host"
data = "{csv.as_posix()}"
label = "label"
[[party]]
name = "guest"
role = "guest"
data = "{csv.as_posix()}"
''')
    code, _, err = run(["simulate", config], capsys)
    assert code == 2, err
    assert "error: [hybridtree] mode must be 'hessian' or 'count', got 'bogus'" in err


def test_console_script_runs_as_a_process(csv, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "fedgrove.cli.main", "train", str(csv), "-l", "nope", "-m",
                           str(tmp_path / "m.json")], capture_output=True, text=True)
    assert proc.returncode == 3
    assert "label column 'nope' not found" in proc.stderr and "Traceback" not in proc.stderr


def test_a_run_that_compiles_kernels_says_so_and_one_that_loads_them_does_not(csv, tmp_path, capsys):
    # with numba's cache in an empty folder, the first predict compiles its kernels (seconds, tens of them for a
    # fit, in which nothing else is printed) and says so once; the second loads them from that folder: no note
    import os

    from fedgrove.engine.compiling import COMPILE_NOTE

    model = tmp_path / "m.json"
    assert run(["train", csv, "-m", model, "-l", "label", "-n", "3", "-q"], capsys)[0] == 0
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba-cache")}
    errs = []
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-m", "fedgrove.cli.main", "predict", str(model), str(csv), "-l",
                               "label", "-o", str(tmp_path / "p.csv")], capture_output=True, text=True, env=env)
        assert proc.returncode == 0, proc.stderr
        errs.append(" ".join(proc.stderr.split()))
    assert errs[0].count("note: " + COMPILE_NOTE) == 1, errs[0]
    assert "compiling" not in errs[1], errs[1]


def test_names_the_terminal_cannot_encode_are_escaped_not_blamed_on_the_file(tmp_path, capsys):
    # an ASCII terminal (C locale, Python's UTF-8 mode off) and a feature named "größe": fedgrove info said the
    # model file was damaged (UnicodeEncodeError caught as a bad field) and exited 3; now the name is escaped
    import os

    r = np.random.default_rng(0)
    X = r.normal(size=(60, 2))
    pd.DataFrame({"größe": X[:, 0], "b": X[:, 1], "label": (X[:, 0] > 0).astype(int)}).to_csv(
        tmp_path / "d.csv", index=False)
    assert run(["train", tmp_path / "d.csv", "-l", "label", "-m", tmp_path / "m.json", "-n", "2", "-q"],
               capsys)[0] == 0
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONIOENCODING", "LANG")}
    env.update(LC_ALL="C", PYTHONUTF8="0", PYTHONCOERCECLOCALE="0")
    proc = subprocess.run([sys.executable, "-m", "fedgrove.cli.main", "info", str(tmp_path / "m.json")],
                          capture_output=True, env=env)
    assert proc.returncode == 0, proc.stderr
    assert b"gr\\xf6\\xdfe" in proc.stdout and b"damaged" not in proc.stderr, (proc.stdout, proc.stderr)


def test_predict_out_dash_prints_the_predictions(csv, tmp_path, capsys, monkeypatch):
    # "-" is standard output, as for most tools: a file named "-" was written in the working folder
    model = tmp_path / "m.json"
    assert run(["train", csv, "-m", model, "-l", "label", "-n", "3", "-q"], capsys)[0] == 0
    monkeypatch.chdir(tmp_path)
    code, out, err = run(["predict", model, csv, "-l", "label", "--out", "-"], capsys)
    assert code == 0, err
    assert out.splitlines()[0] == "prediction" and len(out.splitlines()) == 401
    assert not (tmp_path / "-").exists()


# click words the unknown option "No such option: --bogus" or "No such option '--bogus'" by release
@pytest.mark.parametrize("argv, message", [(["train", "--bogus"], r"No such option(: |\s*')--bogus"),
                                           (["simulate"], "Missing argument"),
                                           (["bag"], "Missing argument")])
def test_usage_errors_print_usage_and_exit_2_without_a_traceback(argv, message, capsys):
    code, out, err = run(argv, capsys)
    assert code == 2
    assert re.search(message, out + err) and "Usage: fedgrove" in out + err
    assert "Traceback" not in out + err


def test_info_on_a_ledger_file_points_to_the_ledger_commands(tmp_path, capsys):
    from fedgrove.ledger.store import Ledger

    led = Ledger(tmp_path / "party0.ledger.sqlite")
    led.append("Note", "party0", b"x", bytes(64))
    led.close()
    assert main(["info", str(tmp_path / "party0.ledger.sqlite")]) == 3
    assert "fedgrove ledger show" in capsys.readouterr().err


def test_predictions_on_standard_output_are_the_csv_unchanged(tmp_path, capsys):
    """Printed through rich, a line longer than 80 columns was wrapped (the --leaf header of 30 trees broke
    across lines) and class names such as ':cat:' became emoji."""
    import io

    r = np.random.default_rng(1)
    X = r.normal(size=(300, 3))
    df = pd.DataFrame(X, columns=["a", "b", "c"])
    df["label"] = np.where(X[:, 0] > 0, ":cat:", ":dog:")
    df.to_csv(tmp_path / "pets.csv", index=False)
    model = tmp_path / "m.json"
    assert run(["train", tmp_path / "pets.csv", "-m", model, "-n", "30", "--max-depth", "3"], capsys)[0] == 0
    code, out, _ = run(["predict", model, tmp_path / "pets.csv", "--leaf"], capsys)
    assert code == 0
    leaves = pd.read_csv(io.StringIO(out))
    assert list(leaves.columns) == [f"tree{t}" for t in range(30)] and len(leaves) == 300
    code, out, _ = run(["predict", model, tmp_path / "pets.csv"], capsys)
    assert code == 0 and set(pd.read_csv(io.StringIO(out))["prediction"]) == {":cat:", ":dog:"}


def test_regression_on_class_names_is_refused_with_the_value(csv, tmp_path, capsys):
    # it ended in a ValueError traceback from numpy
    code, _, err = run(["train", csv, "-m", tmp_path / "m.json", "--objective", "regression"], capsys)
    assert code == 3 and "needs numeric labels; the label column holds 'no'" in err and "Traceback" not in err
    assert not (tmp_path / "m.json").exists()


@pytest.mark.parametrize("algorithm,flags,named", [("forest", ["--learning-rate", "0.5", "--lambda", "2"],
                                                    "--learning-rate, --lambda are not used by --algorithm forest"),
                                                   ("gbdt", ["--max-features", "log2"],
                                                    "--max-features is not used by --algorithm gbdt")])
def test_an_option_of_the_other_algorithm_is_refused(csv, tmp_path, capsys, algorithm, flags, named):
    # it was ignored without a word: the model trained with settings other than those asked for
    code, _, err = run(["train", csv, "-m", tmp_path / "m.json", "--algorithm", algorithm, "-n", "3", *flags], capsys)
    assert code == 2 and named in err and not (tmp_path / "m.json").exists()
    code, _, err = run(["train", csv, "-m", tmp_path / "m.json", "--algorithm", algorithm, "-n", "3", "-q"], capsys)
    assert code == 0, err


def test_a_partition_replaces_the_one_before_it_and_no_other_file(csv, tmp_path, capsys):
    """A 3-party partition followed by a 2-party one into the same folder kept party2's file, whose features
    the new parties also hold; a file the partition did not write is not written over unless asked."""
    out = tmp_path / "parts"
    base = ["partition", csv, "-l", "label", "-o", out]
    assert run(base + ["--scheme", "vertical", "-p", "3", "--test-fraction", "0.2"], capsys)[0] == 0
    assert (out / "party2.csv").exists() and (out / "party2-test.csv").exists()
    code, _, err = run(base + ["--scheme", "horizontal", "-p", "2", "--test-fraction", "0.2"], capsys)
    assert code == 0 and "replaced the partition that was in" in err
    assert sorted(f.name for f in out.iterdir()) == ["manifest.json", "party0.csv", "party1.csv", "test.csv"]
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "party0.csv").write_text("my own data\n")
    code, _, err = run(["partition", csv, "-l", "label", "-o", mine, "--scheme", "vertical"], capsys)
    assert code == 2 and "holds party0.csv, which this partition would write over" in err
    assert (mine / "party0.csv").read_text() == "my own data\n" and not (mine / "manifest.json").exists()
    assert run(["partition", csv, "-l", "label", "-o", mine, "--scheme", "vertical", "--overwrite"], capsys)[0] == 0
    assert (mine / "party0.csv").read_text().startswith("_id,")


def test_partition_format_options_are_told_apart(csv, tmp_path, capsys):
    # --format is the input's format and --file-format the party files': a user who wanted Parquet party files
    # and wrote --format parquet got only "cannot read as Parquet"; a bad --file-format came after reading the data
    out = tmp_path / "parts"
    code, _, err = run(["partition", csv, "-l", "label", "-o", out, "--scheme", "vertical", "--format", "parquet"],
                       capsys)
    assert code == 3 and "as Parquet" in err and "the party files' format is --file-format" in err
    code, _, err = run(["partition", tmp_path / "no-such.csv", "-l", "label", "-o", out, "--scheme", "vertical",
                        "--file-format", "xlsx"], capsys)
    assert code == 2 and "--file-format (the party files' format) must be csv or parquet, got 'xlsx'" in err
    assert not out.exists()
    code, _, err = run(["partition", tmp_path / "no-such.csv", "-l", "label", "-o", out, "--scheme", "vertical"],
                       capsys)
    assert code != 0 and "--file-format" not in err  # no hint without --format


def test_partition_options_another_scheme_reads_are_refused(csv, tmp_path, capsys):
    # --scheme vertical --theta 0.3 wrote the vertical partition as if --theta were not there
    out = tmp_path / "parts"
    for extra, message in ((["--scheme", "vertical", "--theta", "0.3"],
                            "--theta applies to --scheme horizontal --mode unbalanced, not to this partition "
                            "(--scheme vertical): leave it out"),
                           (["--scheme", "horizontal", "--beta", "0.3"],
                            "--beta applies to --scheme horizontal --mode dirichlet or --scheme hybrid, not to this "
                            "partition (--scheme horizontal --mode balanced)"),
                           (["--scheme", "horizontal", "--overlap", "0.5"], "--overlap applies to --scheme hybrid"),
                           (["--scheme", "hybrid", "--mode", "balanced"], "--mode applies to --scheme horizontal")):
        code, _, err = run(["partition", csv, "-l", "label", "-o", out, *extra], capsys)
        assert code == 2 and message in err, err
        assert not out.exists()
    for extra in (["--scheme", "horizontal", "--mode", "dirichlet", "--beta", "0.3"],
                  ["--scheme", "hybrid", "--beta", "0.3", "--hosts", "1", "--no-drop-features"]):
        code, _, err = run(["partition", csv, "-l", "label", "-o", out, *extra], capsys)
        assert code == 0, err


@pytest.mark.parametrize("extra, message", [
    (["--scheme", "hybrid", "--hosts", "0"], "--hosts must be an integer >= 1, got 0"),
    (["--scheme", "horizontal", "--test-fraction", "1.0"], "--test-fraction must be in (0, 1) (the rows held out "
                                                             "as a test set) or 0 (none), got 1.0"),
    (["--scheme", "horizontal", "--test-fraction", "-0.2"], "--test-fraction must be in (0, 1) (the rows held "
                                                              "out as a test set) or 0 (none), got -0.2"),
    (["--scheme", "horizontal", "--test-fraction", "0.0001"], "--test-fraction 0.0001 leaves no test"),
    (["--scheme", "horizontal", "--mode", "dirichlet", "--beta", "0"], "--beta must be > 0"),
    (["--scheme", "horizontal", "--mode", "unbalanced", "--theta", "1.5"], "--theta must be in (0, 1)"),
    (["--scheme", "horizontal", "--mode", "unbalanced", "-p", "1"], "--parties must be >= 2 for the unbalanced"),
    (["--scheme", "vertical", "-p", "5"], "--parties: cannot split 4 features among 5 parties"),
    (["--scheme", "hybrid", "--overlap", "2"], "--overlap must be in [0, 1]"),
    (["--scheme", "hybrid", "--hosts", "500"], "--hosts: 100 of 500 hosts would hold no rows (host400, "),
    (["--scheme", "hybrid", "-p", "12", "--beta", "0.01"], "guests would hold no rows (guest"),
])
def test_partition_errors_name_the_option_and_no_party_is_left_without_rows(csv, tmp_path, capsys, extra, message):
    """The partition's errors named its Python parameters ("number of parties must be ... >= 1, got 0" for
    --hosts 0, "test fraction", "dirichlet beta"); --hosts beyond the rows wrote hosts without rows, and a
    skewed hybrid partition guests without rows, files that `fedgrove simulate` then refused ("has no data
    rows").  Each is now refused naming the option, before anything is written."""
    out = tmp_path / "parts"
    code, _, err = run(["partition", csv, "-l", "label", "-o", out, *extra], capsys)
    assert code == 2 and message in " ".join(err.split()), err
    assert not out.exists()


def test_an_output_file_that_is_an_input_is_refused_and_left_as_it_was(csv, tmp_path, capsys):
    """`fedgrove predict m.json data.csv -o data.csv` replaced the user's data with the predictions, and
    `train -m data.csv` would have replaced it with the model: now refused before anything is read or written
    (through a symbolic link too)."""
    model = tmp_path / "m.json"
    code, _, err = run(["train", csv, "-l", "label", "-m", model, "-n", "2", "-q"], capsys)
    assert code == 0, err
    data, saved = csv.read_bytes(), model.read_bytes()
    (tmp_path / "link.csv").symlink_to(csv)
    for argv, said in ((["predict", model, csv, "-o", csv], "--out '%s' is the data file this command reads" % csv),
                       (["predict", model, csv, "-o", model], "is the model file this command reads"),
                       (["train", csv, "-l", "label", "-m", tmp_path / "link.csv"], "is the training data")):
        code, _, err = run(argv, capsys)
        assert code == 2 and said in " ".join(err.split()), err
        assert csv.read_bytes() == data and model.read_bytes() == saved
    code, _, err = run(["train", csv, "-l", "label", "-m", tmp_path / "v.json", "--valid", csv], capsys)
    assert code == 0, err  # the validation file may be the training file; the model goes elsewhere
    other = tmp_path / "other.csv"
    other.write_bytes(data)
    code, _, err = run(["train", csv, "-l", "label", "-m", other, "--valid", other], capsys)
    assert code == 2 and "is the validation data (--valid) this command reads" in " ".join(err.split()), err
    assert other.read_bytes() == data


def test_long_messages_stay_on_one_line(csv, tmp_path, capsys):
    # rich wraps at 80 columns without a terminal: a path or a metric broken across lines defeats grep
    parts = tmp_path / ("a-folder-whose-name-is-long-enough-to-push-the-line-past-eighty-columns" * 2)
    code, out, err = run(["partition", csv, "-o", parts, "--scheme", "horizontal", "-p", "2", "-l", "label"],
                         capsys)
    assert code == 0, err
    assert f"manifest.json to {parts}" in out + err
    code, _, err = run(["partition", csv, "-o", parts, "--scheme", "horizontal", "-p", "2", "--mode", "unbalanced",
                        "--categorical", "label", "-l", "a"], capsys)
    assert code != 0 and "distinct values: use mode balanced (or dirichlet, for label skew over several classes)" in err


def test_an_interrupted_command_exits_130_not_0(csv, tmp_path, capsys, monkeypatch):
    # typer turns Ctrl-C into an exit code that main() used to drop: an interrupted run exited 0, as if finished
    import fedgrove.engine.gbdt as gbdt

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(gbdt, "train_gbdt", interrupted)
    code, _, err = run(["train", csv, "-m", tmp_path / "m.json", "-l", "label", "-q"], capsys)
    assert code == 130 and "interrupted" in err and not (tmp_path / "m.json").exists()


def test_version_prints_the_version_and_exits_0(capsys):
    import fedgrove

    code, out, err = run(["--version"], capsys)
    assert code == 0 and out.strip() == fedgrove.__version__, err  # it said "Missing command", exit 2


def test_an_unknown_dataset_name_lists_the_names_and_how_to_name_a_test_part(tmp_path, capsys):
    # "dataset:a9a.t" (the test file's name) is no dataset; the error says how to ask for a9a's test part
    code, _, err = run(["train", "dataset:a9a.t", "-m", tmp_path / "m.json"], capsys)
    assert code == 3
    assert "unknown dataset 'a9a.t'; available: a9a," in err and "dataset:NAME:test" in err
    assert not (tmp_path / "m.json").exists()


def test_progress_is_written_as_lines_where_stderr_is_no_terminal(csv, tmp_path, capsys, monkeypatch):
    import fedgrove.cli.common as common

    # a quick run says nothing between its start and its result
    code, _, err = run(["train", csv, "-m", tmp_path / "m.json", "-l", "label", "-n", "30"], capsys)
    assert code == 0 and "boosting:" not in err
    # a long one (here: every update counts as late) notes its progress in plain lines, which a log keeps
    monkeypatch.setattr(common, "PROGRESS_FIRST", 0.0)
    monkeypatch.setattr(common, "PROGRESS_EVERY", 0.0)
    code, _, err = run(["train", csv, "-m", tmp_path / "m.json", "-l", "label", "-n", "30"], capsys)
    assert code == 0, err
    lines = [x for x in err.splitlines() if x.startswith("boosting: ")]
    assert lines[0].startswith("boosting: 1/30 (0:00:") and lines[-1].startswith("boosting: 29/30 ")
    assert "\x1b[" not in err  # no terminal codes in the log


def test_info_describes_a_checkpoint_and_a_party_statistics_file(tmp_path, capsys):
    # both sit in every run's output directory; info called them "not a fedgrove model file"
    import json

    from fedgrove.runner.checkpoint import CheckpointStore

    store = CheckpointStore(tmp_path / "party0.checkpoint.json")
    store.run = {"party": "party0", "role": "active", "data_sha256": "ab" * 32,
                 "settings": {"federation.protocol": "vertical", "federation.seed": 0.0, "params.max_depth": 4.0},
                 "reads": {"label": "y", "weight": "w", "categorical": None, "n_features": None, "libsvm_base": None}}
    store.save({"trees_done": 7, "model": {}})
    code, out, err = run(["info", tmp_path / "party0.checkpoint.json"], capsys)
    assert code == 0, err
    text = " ".join((out + err).split())
    for shown in ("party party0, active", "protocol │ vertical", "trees done │ 7", "params.max_depth │ 4 ",
                  "data read with │ label 'y', weight 'w' ", "--resume",
                  "state │ matches the SHA-256 its run wrote with it"):
        assert shown in text, shown
    (tmp_path / "party0.stats.json").write_text(json.dumps(
        {"party": "party0", "role": "active", "seconds": 3.2, "total_sent": 2_500_000, "total_received": 10_000,
         "messages_sent": 16, "rounds": 30}))
    code, out, err = run(["info", tmp_path / "party0.stats.json"], capsys)
    assert code == 0, err
    assert "│ party0 │ active │ 3.2" in out + err and "2.50" in out + err
    (tmp_path / "other.checkpoint.json").write_text("[1, 2]")
    code, _, err = run(["info", tmp_path / "other.checkpoint.json"], capsys)
    assert code != 0 and "not a fedgrove checkpoint" in err
    # a newest state cut short, or changed, is named, with the whole state before it that --resume takes instead
    store.save({"trees_done": 8, "model": {}})
    path, whole = tmp_path / "party0.checkpoint.json", (tmp_path / "party0.checkpoint.json").read_text()
    for cut, said in ((whole[:40], "cannot be read (Unterminated string"),
                      (whole.replace('"trees_done": 8', '"trees_done": 9'), "does not match the SHA-256")):
        path.write_text(cut)
        code, _, err = run(["info", path], capsys)
        err = " ".join(err.split())
        assert code == 3 and f"checkpoint {path} {said}" in err, err
        assert f"--resume takes the state before it instead, {path.with_suffix('.prev.json')} (7 trees)" in err
    (tmp_path / "party0.checkpoint.prev.json").write_text(whole[:40])  # neither whole: no way back named
    code, _, err = run(["info", path], capsys)
    assert code == 3 and "is damaged" in err and "--resume takes" not in err
    path.write_text(whole)
    # a run's folder with checkpoints but no statistics (a run stopped before its end) is named as such
    stopped = tmp_path / "stopped"
    stopped.mkdir()
    (tmp_path / "party0.checkpoint.json").rename(stopped / "party0.checkpoint.json")
    code, _, err = run(["info", stopped], capsys)
    assert code != 0 and "holds checkpoints of party0 but no run's statistics" in " ".join(err.split())


@pytest.mark.parametrize("group", [[], ["ledger"], ["datasets"]])
def test_command_list_shows_each_summary_on_one_line(group, monkeypatch, capsys):
    # Typer lists a command by its docstring's first paragraph, line breaks kept: `bag`, `ledger verify` and
    # `datasets download` showed theirs broken mid-sentence however wide the terminal
    import inspect

    import typer

    from fedgrove.cli import main as cli_main

    monkeypatch.setenv("COLUMNS", "400")
    app = cli_main.app
    for name in group:
        app = next(g.typer_instance for g in app.registered_groups if g.name == name)
    commands = app.registered_commands
    assert len(commands) >= 2
    with pytest.raises(SystemExit):
        typer.main.get_command(cli_main.app)([*group, "--help"], prog_name="fedgrove")
    out = capsys.readouterr().out
    for c in commands:
        summary = " ".join(inspect.cleandoc(c.callback.__doc__).split("\n\n")[0].split())
        assert summary in out, (c.callback.__name__, out)


def test_info_counts_a_multiclass_models_trees_in_rounds(tmp_path, capsys, monkeypatch):
    # -n 4 on three classes gives 12 trees; info said "trees 12" beside the 4 the user asked for
    r = np.random.default_rng(1)
    X = r.normal(size=(300, 3))
    df = pd.DataFrame(X, columns=["a", "b", "c"])
    df["label"] = np.digitize(X[:, 0], [-0.5, 0.5])
    df.to_csv(tmp_path / "t.csv", index=False)
    monkeypatch.setenv("COLUMNS", "200")
    code, _, err = run(["train", tmp_path / "t.csv", "-m", tmp_path / "m.json", "-l", "label", "-n", "4", "-q"],
                       capsys)
    assert code == 0, err
    code, out, _ = run(["info", tmp_path / "m.json"], capsys)
    assert code == 0 and "12 (4 rounds of 3, a tree a class)" in out


def test_training_again_in_a_run_folder_leaves_nothing_that_reads_as_this_runs(csv, tmp_path, capsys):
    # an earlier model's predictions would sit beside the new model as if they were its; an FV-tree ledger
    # (append-only: kept) beside a SimFL model is named as the earlier run's
    parts = tmp_path / "parts"
    code, _, err = run(["partition", csv, "-l", "label", "--scheme", "horizontal", "--parties", "2", "-o", parts],
                       capsys)
    assert code == 0, err
    config = tmp_path / "federation.toml"
    config.write_text("[federation]\nprotocol = \"simfl\"\nclasses = [\"no\", \"yes\"]\n[params]\nn_estimators = 3\n"
                      "max_depth = 2\n" + "".join(f'[[party]]\nname = "p{k}"\nrole = "party"\n'
                                                  f'data = "{(parts / f"party{k}.csv").as_posix()}"\n'
                                                  'label = "label"\n' for k in range(2))
                      + f'[output]\ndir = "{(tmp_path / "run").as_posix()}"\n')
    (tmp_path / "run").mkdir()
    stale = tmp_path / "run" / "p0.predictions.csv"
    stale.write_text("_id,prediction\n1,yes\n")
    ledger = tmp_path / "run" / "p1.ledger.sqlite"
    ledger.write_bytes(b"an earlier run's")
    code, _, err = run(["simulate", config], capsys)
    assert code == 0, err
    assert not stale.exists() and f"p0: removed {stale}, which an earlier model wrote" in " ".join(err.split())
    assert ledger.read_bytes() == b"an earlier run's"
    assert f"p1: {ledger} is an earlier FV-tree run's ledger, not this simfl run's" in " ".join(err.split())


@pytest.mark.parametrize("scheme, protocol", [("vertical", "vertical"), ("vertical", "federated-forest"),
                                              ("horizontal", "horizontal"), ("horizontal", "simfl"),
                                              ("horizontal", "fvtree"), ("hybrid", "hybridtree")])
def test_partition_writes_a_federation_config_that_simulate_runs(tmp_path, capsys, scheme, protocol):
    # with --protocol the partition's folder holds a config naming every party, its role, files, label column and
    # what the labels need (here text classes: the class list), so that simulate runs on it as it stands
    r = np.random.default_rng(3)
    X = r.normal(size=(400, 6))
    df = pd.DataFrame(X, columns=[f"x{j}" for j in range(6)])
    df["outcome"] = np.where(X[:, 0] + X[:, 3] > 0, "up", "down")
    df.to_csv(tmp_path / "d.csv", index=False)
    parts = tmp_path / "parts"
    code, out, err = run(["partition", tmp_path / "d.csv", "-l", "outcome", "--scheme", scheme, "-p", "3",
                          "--test-fraction", "0.2", "-o", parts, "--protocol", protocol], capsys)
    assert code == 0, err
    config = (parts / "federation.toml").read_text()
    # the summary names every party of the config with the config's role (it gave the scheme's: "active" for a
    # Federated Forest client, and no line for its master)
    listed = {tuple(line.split()[:2]) for line in (out + err).splitlines() if line.startswith("  ")}
    assert set(re.findall(r'name = "(\w+)"\nrole = "(\w+)"', config)) == listed, out + err
    assert f'protocol = "{protocol}"' in config and 'classes = ["down", "up"]' in config
    # the note on the class list says that the config written gives it (it read as if still to be written)
    assert ('[federation] classes = ["down", "up"] (the order gives the codes 0, 1, ...) (federation.toml, written '
            'below, gives it)') in " ".join((out + err).split())
    if protocol == "hybridtree":  # trees of depth 4, as the others' (its max_depth was ignored: 5 + 2 layers)
        from fedgrove.runner.config import load_federation

        cfg = load_federation(parts / "federation.toml")
        assert (cfg.hybridtree["host_depth"], cfg.hybridtree["guest_depth"]) == (2, 2)
    code, out, err = run(["simulate", parts / "federation.toml"], capsys)
    assert code == 0, err
    scores = [float(a) for a in re.findall(r"accuracy (0\.\d+)", out + err)]
    assert scores and min(scores) > 0.85, out + err


@pytest.mark.parametrize("scheme,protocol", [("vertical", "vertical"), ("horizontal", "horizontal"),
                                             ("hybrid", "hybridtree"), ("vertical", "federated-forest"),
                                             ("horizontal", "simfl")])
def test_partition_keeps_a_weight_column_with_the_label_and_its_config_weighs_the_rows(tmp_path, capsys, scheme,
                                                                                       protocol):
    # --weight: the column goes beside the label in the labelled parties' files (train and test), is no party's
    # feature, and the config written with --protocol names it; the federation then trains the weighted model
    from fedgrove.engine.model import load_model

    r = np.random.default_rng(3)
    X = r.normal(size=(400, 6))
    df = pd.DataFrame(X, columns=[f"x{j}" for j in range(6)])
    df.insert(2, "w", r.integers(0, 3, 400) * 0.5)
    df["y"] = (X[:, 0] + X[:, 3] > 0).astype(int)
    df.to_csv(tmp_path / "d.csv", index=False)
    parts = tmp_path / "parts"
    code, out, err = run(["partition", tmp_path / "d.csv", "-l", "y", "-w", "w", "--scheme", scheme, "-p", "2",
                          "--test-fraction", "0.2", "-o", parts, "--protocol", protocol], capsys)
    assert code == 0, err
    assert "+ label and weights" in out + err
    manifest = json.loads((parts / "manifest.json").read_text())
    assert manifest["weight"] == "w" and all("w" not in e["features"] for e in manifest["parties"])
    for e in manifest["parties"]:
        for name in (e["file"], e.get("test_file") or manifest.get("test_file")):
            frame = pd.read_csv(parts / name)
            assert ("w" in frame.columns) == e["has_label"] == ("y" in frame.columns), (name, list(frame.columns))
            if e["has_label"]:
                np.testing.assert_array_equal(frame["w"], df.set_index(np.arange(400)).loc[frame["_id"], "w"])
    config = (parts / "federation.toml").read_text()
    assert config.count('weight = "w"') == sum(e["has_label"] for e in manifest["parties"])
    # three trees tell weighted from unweighted (the encrypted protocols' 20 took half a minute of the suite)
    assert re.search(r"\nn_estimators = \d+\n", config), config
    config = re.sub(r"\nn_estimators = \d+\n", "\nn_estimators = 3\n", config)
    (parts / "federation.toml").write_text(config)
    first = manifest["parties"][0]  # labelled in both schemes: info shows its weights apart from its features
    code, out, err = run(["info", parts / first["file"]], capsys)
    weights = pd.read_csv(parts / first["file"])["w"]
    assert code == 0 and f"weight column 'w' │ sum {weights.sum():.6g}, {int((weights == 0).sum())} rows of " \
                         f"weight 0" in out and f"x {len(first['features'])} features" in out, out + err
    code, out, err = run(["simulate", parts / "federation.toml"], capsys)
    assert code == 0, err
    lead = next(e["name"] for e in manifest["parties"] if e["has_label"])
    if protocol in ("vertical", "horizontal", "simfl"):
        assert load_model(parts / "runs" / f"{lead}.model.json").metadata["weight"] == "w"
    else:  # a HybridTree host's file (a part of a federated model, without metadata), or a forest's master's
        # model (which never sees the weights): the weights changed it
        (parts / "plain.toml").write_text(config.replace('weight = "w"\n', "").replace('dir = "runs"', 'dir = "plain"'))
        assert run(["simulate", parts / "plain.toml"], capsys)[0] == 0
        file, key = (f"{lead}.model.json", "host_trees") if protocol == "hybridtree" else ("master.model.json", "trees")
        trees = [json.loads((parts / d / file).read_text())[key] for d in ("runs", "plain")]
        if protocol != "hybridtree":
            assert load_model(parts / "runs" / "master.model.json").metadata["weighted_by"] == lead
        assert trees[0] != trees[1]
    for argv, message in [(["--scheme", "horizontal", "--protocol", "fvtree"], "the fvtree protocol takes no row "
                                                                               "weights; the horizontal, vertical, "
                                                                               "hybridtree, federated-forest, simfl "
                                                                               "protocols do")]:
        code, _, err = run(["partition", tmp_path / "d.csv", "-l", "y", "-w", "w", "-o", tmp_path / "no", *argv],
                           capsys)
        assert code == 2 and message in " ".join(err.split()) and not (tmp_path / "no").exists(), err


def test_fv_tree_uploads_refused_under_dp_are_reported_with_what_helps(tmp_path, capsys):
    # under DP each tree sees 1/trees_per_ensemble of a party's rows, too few per bin for the endorsements: the
    # run said "a larger epsilon" would help (it does not: 1e6 here) and did not name trees_per_ensemble
    r = np.random.default_rng(5)
    X = r.normal(size=(600, 4))
    df = pd.DataFrame(X, columns=[f"x{j}" for j in range(4)])
    df["y"] = (X[:, 0] + r.normal(size=600) > 0).astype(int)
    df.to_csv(tmp_path / "d.csv", index=False)
    parts = tmp_path / "parts"
    code, _, err = run(["partition", tmp_path / "d.csv", "-l", "y", "--scheme", "horizontal", "-p", "2", "-o", parts,
                        "--protocol", "fvtree"], capsys)
    assert code == 0, err
    config = parts / "federation.toml"
    config.write_text(config.read_text().replace("max_bins = 8", "max_bins = 64")
                      + "\n[fvtree.dp]\nepsilon = 1e6\ntrees_per_ensemble = 5\n")
    code, out, err = run(["simulate", config], capsys)
    said = " ".join((out + err).split())
    assert code == 0, err
    assert "party0: no tree has a split: the parties' endorsements refused" in said, said
    assert "a larger epsilon" not in said
    assert "histogram uploads refused by the parties' endorsements: party0 " in said
    assert "fewer [fvtree.dp] trees_per_ensemble or verify = false" in said


def test_info_names_a_damaged_manifest_stats_or_checkpoint_file(tmp_path, capsys):
    # fields of the wrong form in the files fedgrove writes (damaged, or edited by hand) raised KeyError, TypeError
    # or rich's NotRenderableError from fedgrove info (found by mutating them)
    r = np.random.default_rng(6)
    df = pd.DataFrame(r.normal(size=(200, 3)), columns=["a", "b", "c"])
    df["y"] = (df["a"] > 0).astype(int)
    df.to_csv(tmp_path / "d.csv", index=False)
    parts = tmp_path / "parts"
    code, _, err = run(["partition", tmp_path / "d.csv", "-l", "y", "--scheme", "horizontal", "-p", "2", "-o", parts,
                        "--protocol", "horizontal"], capsys)
    assert code == 0, err
    code, _, err = run(["simulate", parts / "federation.toml"], capsys)
    assert code == 0, err
    runs = parts / "runs"
    manifest = json.loads((parts / "manifest.json").read_text())
    manifest["parties"][1]["features"] = 3
    (parts / "manifest.json").write_text(json.dumps(manifest))
    stats = next(runs.glob("*.stats.json"))
    s = json.loads(stats.read_text())
    s["seconds"] = [1]
    stats.write_text(json.dumps(s))
    checkpoint = next(runs.glob("*.checkpoint.json"))
    c = json.loads(checkpoint.read_text())
    c["run"]["data_sha256"] = 7
    checkpoint.write_text(json.dumps(c))
    for target, said in ((parts, "manifest.json' is damaged: party #1's features is 3"),
                         (stats, f"{stats} is damaged (the run writes it): TypeError"),
                         (runs, f"{runs} is damaged (one of its <party>.stats.json files"),
                         (checkpoint, f"{checkpoint} does not match the SHA-256 its run wrote with it (cut short "
                                      "by a crash, or changed since); --resume takes the state before it instead, "
                                      f"{checkpoint.with_suffix('.prev.json')} (")):
        code, out, err = run(["info", target], capsys)
        assert code != 0 and said in " ".join(err.split()) and "Traceback" not in err, (target, out, err)
    del c["state_sha256"]  # as a checkpoint written before its state carried a digest: its fields are checked
    checkpoint.write_text(json.dumps(c))
    code, out, err = run(["info", checkpoint], capsys)
    assert code == 3 and f"{checkpoint} is damaged (`fedgrove simulate`" in " ".join(err.split()), (out, err)


def test_info_names_a_damaged_model_or_party_model_file(tmp_path, capsys):
    # a federated model's metadata or a party's part of one, edited by hand or damaged, raised TypeError or
    # ValueError from fedgrove info (found by mutating them)
    from fedgrove import GBDTParams, keygen, run_vertical

    r = np.random.default_rng(7)
    X, y = r.normal(size=(120, 4)), (r.random(120) > 0.5).astype(int)
    out = run_vertical([X[:, :2], X[:, 2:]], y, GBDTParams(n_estimators=2, max_depth=2), keygen("ou", 2048, "plain"))
    whole = out["model"].to_dict()
    whole["metadata"] = {**whole["metadata"], "feature_owners": [["party0"], ["party1", 0]]}
    (tmp_path / "active.model.json").write_text(json.dumps(whole))
    part = json.loads(json.dumps(out["passive_models"]["party1"].to_dict()))
    part["bin_mapper"] = 3
    (tmp_path / "passive.model.json").write_text(json.dumps(part))
    for name, said in (("active.model.json", "its metadata feature_owners is [['party0'], ['party1', 0]], expected "
                                             "a [party, column] pair per feature"),
                       ("passive.model.json", "passive.model.json is damaged (the party that trained it writes it)")):
        code, out_, err = run(["info", tmp_path / name], capsys)
        assert code != 0 and said in " ".join(err.split()) and "Traceback" not in err, (name, out_, err)


def test_a_damaged_active_model_file_is_named_when_the_federation_predicts_from_it(tmp_path, capsys):
    # a split of another party's column marked as the active party's own read outside its rows: IndexError
    r = np.random.default_rng(8)
    df = pd.DataFrame(r.normal(size=(200, 6)), columns=list("abcdef"))
    df["y"] = (df["a"] + df["e"] > 0).astype(int)
    df.to_csv(tmp_path / "d.csv", index=False)
    parts = tmp_path / "parts"
    assert run(["partition", tmp_path / "d.csv", "-l", "y", "--scheme", "vertical", "-p", "3", "-o", parts,
                "--protocol", "vertical", "--test-fraction", "0.2"], capsys)[0] == 0
    config = parts / "federation.toml"
    config.write_text(config.read_text().replace("n_estimators = 20", "n_estimators = 3"))
    code, _, err = run(["simulate", config], capsys)
    assert code == 0, err
    model = next((parts / "runs").glob("party0.model.json"))
    d = json.loads(model.read_text())
    nodes = next(t["nodes"] for t in d["trees"] if any(o > 0 for o in t["nodes"]["owner"]))
    k = next(i for i, o in enumerate(nodes["owner"]) if o > 0 and nodes["feature"][i] >= 2)
    nodes["owner"][k] = 0
    model.write_text(json.dumps(d))
    code, _, err = run(["simulate", config, "--predict"], capsys)
    said = " ".join(err.split())
    assert code != 0 and "splits on its own column" in said and "is the model file this party's" in said, err


def test_partition_protocol_refusals_and_the_config_goes_with_its_partition(tmp_path, capsys):
    data = tmp_path / "d.csv"
    pd.DataFrame({"a": np.arange(60.0), "y": np.arange(60) % 2}).to_csv(data, index=False)
    parts = tmp_path / "parts"
    code, _, err = run(["partition", data, "-l", "y", "--scheme", "vertical", "-o", parts, "--protocol", "simfl"],
                       capsys)
    assert code == 2 and "--protocol 'simfl' does not run on a vertical partition; expected vertical or " \
                         "federated-forest" in err and not parts.exists()
    code, _, err = run(["partition", data, "-l", "y", "--scheme", "hybrid", "--hosts", "2", "-o", parts,
                        "--protocol", "hybridtree"], capsys)
    assert code == 2 and "write a config per host" in err and not parts.exists()
    code, _, err = run(["partition", data, "-l", "y", "--scheme", "horizontal", "-o", parts, "--protocol", "simfl"],
                       capsys)
    assert code == 0 and (parts / "federation.toml").exists()
    # a partition written over it without --protocol takes the config away with the files it named
    code, _, err = run(["partition", data, "-l", "y", "--scheme", "horizontal", "-p", "3", "-o", parts], capsys)
    assert code == 0 and not (parts / "federation.toml").exists()
    # a federation.toml that no partition wrote is not written over
    (parts / "federation.toml").write_text("# mine\n")
    code, _, err = run(["partition", data, "-l", "y", "--scheme", "horizontal", "-o", parts, "--protocol", "simfl"],
                       capsys)
    assert code != 0 and "federation.toml" in err and (parts / "federation.toml").read_text() == "# mine\n"


def test_a_hybridtree_config_s_rows_per_ciphertext_reaches_the_host(tmp_path, capsys):
    # [he] rows_per_ciphertext applies to HybridTree's host too: two OU instances a ciphertext train the model of
    # one, file for file; five do not fit OU's plaintexts and the run says so (HEU's OU, or gmpy2's without HEU)
    r = np.random.default_rng(4)
    X = r.normal(size=(300, 6))
    df = pd.DataFrame(X, columns=[f"x{j}" for j in range(6)])
    df["y"] = (X[:, 0] + X[:, 4] > 0).astype(int)
    df.to_csv(tmp_path / "d.csv", index=False)
    parts = tmp_path / "parts"
    code, _, err = run(["partition", tmp_path / "d.csv", "-l", "y", "--scheme", "hybrid", "-p", "3", "-o", parts,
                        "--protocol", "hybridtree"], capsys)
    assert code == 0, err
    base = (parts / "federation.toml").read_text()
    assert "[he]" not in base and "n_estimators = 20\n" in base
    # four trees on 16 bins show it (20 on 255 bins took half a minute: the guests' encrypted histograms)
    base = base.replace("n_estimators = 20\n", "n_estimators = 4\nmax_bins = 16\n")
    models, sent = {}, {}
    for k in (1, 2, 5):
        out = parts / f"runs{k}"
        config = parts / f"k{k}.toml"
        assert base.count('dir = "runs"') == 1
        config.write_text(base.replace('dir = "runs"', f'dir = "runs{k}"')
                          + f'\n[he]\nscheme = "ou"\nrows_per_ciphertext = {k}\n')
        code, _, err = run(["simulate", config], capsys)
        if k == 5:
            said = " ".join(err.split())  # OU-2048's plaintexts: 682 or 683 bits by HEU's key, gmpy2's 681
            most = re.search(r"rows_per_ciphertext must be an integer from 1 to 16 whose packed pairs fit the key's "
                             r"68[123]-bit plaintexts \(at most (\d+) with this key and these gradients\), got 5", said)
            assert code != 0 and most and 2 <= int(most.group(1)) < 5, said  # (2 fits: it ran)
            continue
        assert code == 0, err
        models[k] = sorted((p.name, p.read_bytes()) for p in out.glob("*.model.json"))
        sent[k] = json.loads((out / "host.stats.json").read_text())["total_sent"]
    assert len(models[1]) == 4 and models[1] == models[2]
    assert sent[2] < 0.7 * sent[1]  # half the gradient ciphertexts


def test_a_named_dataset_keeps_its_own_class_labels(tmp_path, capsys, monkeypatch):
    """`fedgrove train dataset:NAME` gave the model the loader's codes 0, 1, ... as its classes: a model of
    ionosphere predicted 0/1 where the file says b/g (and a9a 0/1 where a9a's file, read directly, gives -1/1;
    kddcup99 0..22 for 'back', ..., 'warezmaster').  Now the classes are the file's own."""
    from fedgrove import load_model

    rows = np.random.default_rng(0).normal(size=(60, 34)).round(4)
    labels = np.where(rows[:, 0] > 0, "g", "b")
    folder = tmp_path / "data" / "ionosphere"
    folder.mkdir(parents=True)
    (folder / "ionosphere.data").write_text("".join(",".join(map(str, r)) + f",{c}\n" for r, c in zip(rows, labels)))
    monkeypatch.setenv("FEDGROVE_DATA_DIR", str(tmp_path / "data"))
    code, _, err = run(["train", "dataset:ionosphere", "-m", tmp_path / "m.json", "-n", "5", "-q"], capsys)
    assert code == 0, err
    assert load_model(tmp_path / "m.json").classes == ["b", "g"]
    code, _, err = run(["predict", tmp_path / "m.json", "dataset:ionosphere:train", "-o", tmp_path / "p.csv"],
                       capsys)
    assert code == 0, err
    predicted = pd.read_csv(tmp_path / "p.csv")["prediction"]
    assert set(predicted) == {"b", "g"} and (predicted == labels).mean() > 0.9
    assert "accuracy" in err  # scored against the dataset's own labels
    code, out, err = run(["info", "dataset:ionosphere"], capsys)
    assert code == 0 and "b: " in out and "g: " in out, out + err


@pytest.mark.skipif(__import__("numba").config.NUMBA_NUM_THREADS < 2, reason="needs two numba threads")
def test_predict_runs_on_the_models_threads_unless_told(csv, tmp_path, capsys, monkeypatch):
    import numba

    from fedgrove.engine.tree import PackedEnsemble

    seen = []
    raw_sum = PackedEnsemble.raw_sum

    def spy(self, *args):
        seen.append(numba.get_num_threads())
        return raw_sum(self, *args)

    monkeypatch.setattr(PackedEnsemble, "raw_sum", spy)
    model = tmp_path / "m.json"
    assert run(["train", csv, "-l", "label", "-n", "3", "--threads", "1", "-m", model], capsys)[0] == 0
    for extra, expected in (([], 1), (["--threads", "2"], 2)):
        seen.clear()
        code, out, err = run(["predict", model, csv, "-o", tmp_path / "p.csv"] + extra, capsys)
        assert code == 0, err
        assert seen and set(seen) == {expected}


def test_a_run_that_fails_leaves_no_empty_output_directory_but_keeps_one_with_files(tmp_path, capsys):
    # a party's data file with text in a feature column: the run stopped before writing anything, and left the
    # empty runs/ it had created
    r = np.random.default_rng(7)
    df = pd.DataFrame(r.normal(size=(120, 3)), columns=["a", "b", "c"])
    df["y"] = (df["a"] > 0).astype(int)
    df.to_csv(tmp_path / "d.csv", index=False)
    parts = tmp_path / "parts"
    code, _, err = run(["partition", tmp_path / "d.csv", "-l", "y", "--scheme", "horizontal", "-p", "2", "-o", parts,
                        "--protocol", "simfl"], capsys)
    assert code == 0, err
    config = parts / "federation.toml"
    config.write_text(config.read_text().replace('dir = "runs"', 'dir = "runs/first"'))
    bad = pd.read_csv(parts / "party1.csv")
    bad["b"] = bad["b"].astype(str)
    bad.loc[2, "b"] = "twelve"
    bad.to_csv(parts / "party1.csv", index=False)
    code, _, err = run(["simulate", config], capsys)
    assert code == 3 and "non-numeric value 'twelve'" in err, err
    assert not (parts / "runs").exists()
    (parts / "runs" / "first").mkdir(parents=True)
    (parts / "runs" / "first" / "keep.txt").write_text("a file of the user's")
    code, _, err = run(["simulate", config], capsys)
    assert code == 3 and (parts / "runs" / "first" / "keep.txt").read_text() == "a file of the user's"


def test_a_federations_test_scores_print_an_rmse_to_six_significant_digits():
    # an RMSE is in the labels' units: labels of about 1e-9 printed "rmse 0.0000" (four decimals, as accuracies
    # and AUCs print); fedgrove predict prints six significant digits, and so does a federation's summary now
    from fedgrove.cli.federation import scores_text

    assert scores_text({"test_rmse": 5.4975e-08}) == "rmse 5.4975e-08"
    assert scores_text({"test_rmse": 61.0912345}) == "rmse 61.0912"
    assert scores_text({"test_accuracy": 0.97222, "test_auc": 0.995}) == "accuracy 0.9722  auc 0.9950"
