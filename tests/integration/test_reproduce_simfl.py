"""`fedgrove reproduce simfl --quick`: every experiment runs end to end; the report says what it ran."""

import json

import pytest

from fedgrove.cli.main import main


def test_quick_reproduce_writes_report_results_and_plots(a9a, tmp_path, capsys):
    out = tmp_path / "res"
    code = main(["reproduce", "simfl", "--quick", "--datasets", "a9a", "--out", str(out), "--no-progress"])
    assert code == 0, capsys.readouterr().err
    res = json.loads((out / "results.json").read_text())["datasets"]["a9a"]
    t2 = res["table2"]
    assert len(t2["SimFL_runs"]) == 2 and t2["SimFL"][1] <= t2["SimFL"][0] <= t2["SimFL"][2]
    assert len(t2["SOLO"]) == 2 and 0 < t2["ALL-IN"] < 50 and "TFL_round_robin" in t2
    assert set(res["figure2"]) == {"0.7", "0.9"} and set(res["figure3"]) == {"2", "4"}
    assert len(res["figure4"]["4"]["SOLO"]) == 4
    cost = res["table4"]
    assert cost["parties"] == 4 and cost["SimFL_s"] > 0 and cost["prep_MB_per_party"] > 0 and cost["MB_per_tree"] > 0
    # Table 2 again with ThunderGBM's defaults: squared error on the 0/1 labels, errors judged at 0.5
    tg = res["table2_tgbm"]
    assert set(tg) == {"1.0", "0.9"}
    for r in tg.values():
        assert len(r["SimFL_runs"]) == 2 and len(r["SOLO"]) == 2 and 0 < r["ALL-IN"] < 50 and 0 < r["TFL"] < 50
    assert tg["1.0"]["ALL-IN"] != t2["ALL-IN"]
    # ... and for other draws of the data: seed 0 is table2_tgbm itself, seed 1 another split and partition
    by_seed = res["table2_tgbm_seeds"]
    assert set(by_seed) == {"0", "1"} and set(by_seed["1"]) == {"1.0", "0.9"}
    assert by_seed["0"] == tg
    assert by_seed["1"]["0.9"]["ALL-IN"] != tg["0.9"]["ALL-IN"]
    report = (out / "report.md").read_text()
    for title in ("Table 2", "Table 3", "Figure 2", "Figure 3", "Figure 4", "Table 4", "Quick run", "17.0 (16.7-17.2)",
                  "Table 2 with ThunderGBM's defaults", "Learning rate 0.9:",
                  "other draws of the data", "SimFL's gap to ALL-IN over the seeds"):
        assert title in report
    assert (out / "a9a-figure3.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_test_error_of_a_regression_on_01_labels_cuts_at_one_half():
    import numpy as np

    from fedgrove.engine.gbdt import GBDTParams, train_gbdt
    from fedgrove.experiments.simfl import _err

    rng = np.random.default_rng(0)
    X = rng.normal(size=(400, 3))
    y = (X[:, 0] > 0.3).astype(float)  # 38% ones: a cut at 0 would call nearly everything 1
    reg = train_gbdt(GBDTParams(objective="regression", n_estimators=20, max_depth=3, learning_rate=0.5), X, y)
    pred = (reg.predict(X) > 0.5).astype(float)
    assert _err(reg, X, y) == 100.0 * np.mean(pred != y) < 5.0
    clf = train_gbdt(GBDTParams(n_estimators=20, max_depth=3, learning_rate=0.5), X, y)
    assert _err(clf, X, y) == 100.0 * np.mean((clf.predict_raw(X).reshape(-1) > 0) != y)


def test_results_already_in_the_folder_are_kept_unless_merged_into_or_overwritten(cod_rna, tmp_path, capsys):
    out = tmp_path / "res"
    quick = ["reproduce", "simfl", "--quick", "--datasets", "cod-rna", "--out", str(out), "--no-progress"]
    assert main(quick + ["--experiments", "table2"]) == 0
    first = json.loads((out / "results.json").read_text())
    capsys.readouterr()
    # a second run into the same folder would have replaced them: refused before any work, saying what is there
    assert main(quick + ["--experiments", "table3"]) == 2
    err = capsys.readouterr().err
    assert "holds the results of an earlier run" in err and "cod-rna: table2" in err and "--merge" in err
    assert json.loads((out / "results.json").read_text()) == first
    assert main(quick + ["--experiments", "table3", "--merge", "--seed", "1"]) == 2  # other settings: refused
    assert "seed: 0 there, 1 here" in capsys.readouterr().err
    assert main(quick + ["--experiments", "table3", "--merge"]) == 0
    merged = json.loads((out / "results.json").read_text())
    assert merged["datasets"]["cod-rna"]["table2"] == first["datasets"]["cod-rna"]["table2"]
    assert "table3" in merged["datasets"]["cod-rna"] and set(merged["datasets"]["cod-rna"]["seconds"]) == {
        "table2", "table3"}
    assert "table3 on cod-rna" in merged["machine"]["note"]
    report = (out / "report.md").read_text()
    assert "Table 2" in report and "Table 3" in report
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == []  # the merge's own folder is gone
    assert main(quick + ["--experiments", "table3", "--overwrite"]) == 0
    assert "table2" not in json.loads((out / "results.json").read_text())["datasets"]["cod-rna"]


def test_a_folder_with_results_is_refused_before_any_data_is_read(tmp_path, capsys):
    out = tmp_path / "res"
    out.mkdir()
    earlier = {"config": {"quick": False}, "machine": {"date": "2026-01-02 03:04:05"},
               "datasets": {"a9a": {"n_train": 1, "table2": {}, "seconds": {"table2": 1.0}}}}
    (out / "results.json").write_text(json.dumps(earlier))
    code = main(["reproduce", "simfl", "--quick", "--out", str(out), "--no-progress"])
    assert code == 2
    assert "(2026-01-02 03:04:05; a9a: table2)" in capsys.readouterr().err
    assert main(["reproduce", "simfl", "--quick", "--out", str(out), "--merge", "--no-progress"]) == 2
    assert "quick: False there, True here" in capsys.readouterr().err
    assert json.loads((out / "results.json").read_text()) == earlier


def test_lists_of_datasets_and_experiments_name_each_once():
    # "--experiments table2,table2" ran table2 twice
    from fedgrove.cli.reproduce import _split
    from fedgrove.exceptions import InvalidParameterError

    assert _split("table3, table2,table3", ("table2", "table3", "figure2"), "--experiments") == ["table3", "table2"]
    assert _split(None, ("a9a", "cod-rna"), "--datasets") == ["a9a", "cod-rna"]
    with pytest.raises(InvalidParameterError, match="--datasets must be a comma-separated subset of a9a, cod-rna"):
        _split(",", ("a9a", "cod-rna"), "--datasets")
