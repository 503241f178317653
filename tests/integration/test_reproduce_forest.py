"""`fedgrove reproduce federated-forest --quick`: every experiment runs end to end; the report says what it ran."""

import json

from fedgrove.cli.main import main


def test_quick_reproduce_writes_report_results_and_plots(spambase, waveform, tmp_path, capsys):
    out = tmp_path / "res"
    code = main(["reproduce", "federated-forest", "--quick", "--datasets", "spambase,diabetes", "--out", str(out),
                 "--no-progress"])
    assert code == 0, capsys.readouterr().err
    res = json.loads((out / "results.json").read_text())
    t1 = res["table1"]
    assert set(t1) == {"spambase", "diabetes"}
    assert t1["spambase"]["identical_every_repeat"] and t1["diabetes"]["identical_every_repeat"]
    assert t1["spambase"]["FF"] == t1["spambase"]["NonFF"] and 0.7 < t1["spambase"]["FF"] <= 1.0
    assert t1["diabetes"]["task"] == "regression" and t1["diabetes"]["FF"] > 10  # an RMSE
    assert [r["clients"] for r in res["clients"]["rows"]] == [1, 2, 3, 4]
    pred = res["prediction"]["spambase"]
    assert pred["trees"]["4"]["one-round"]["messages"] == pred["trees"]["8"]["one-round"]["messages"]
    assert pred["trees"]["8"]["classical"]["messages"] > pred["trees"]["4"]["classical"]["messages"]
    report = (out / "report.md").read_text()
    for title in ("Table 1", "Adding clients", "one round against node by node", "Quick run", "0.844"):
        assert title in report
    for png in ("clients-metric.png", "prediction-spambase-trees.png", "prediction-waveform-depth.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_unknown_datasets_are_refused(capsys, tmp_path):
    assert main(["reproduce", "federated-forest", "--datasets", "mnist", "--out", str(tmp_path)]) == 2
    assert "spambase, ionosphere" in capsys.readouterr().err


def test_a_missing_dataset_is_named_before_any_work_or_folder(capsys, tmp_path, monkeypatch):
    # the run used to make the results folder and fail at the first missing file: after diabetes (bundled with
    # scikit-learn) had run, for the forest
    monkeypatch.setenv("FEDGROVE_DATA_DIR", str(tmp_path / "no-data"))
    out = tmp_path / "results"
    assert main(["reproduce", "simfl", "--quick", "--datasets", "a9a", "--out", str(out), "--no-progress"]) == 3
    assert "dataset 'a9a': file 'a9a' not found" in capsys.readouterr().err
    assert not out.exists()
    assert main(["reproduce", "federated-forest", "--quick", "--datasets", "diabetes,spambase", "--out", str(out),
                 "--no-progress"]) == 3
    assert "dataset 'spambase'" in capsys.readouterr().err and not out.exists()


def test_merged_experiments_join_the_earlier_ones_and_the_report_says_when_each_ran(spambase, tmp_path, capsys):
    # --merge put a Federated Forest run's experiments nowhere (its results are laid out by experiment, not by
    # dataset) while the note said they were merged, and the report said nothing of when each part ran
    out = tmp_path / "res"
    quick = ["reproduce", "federated-forest", "--quick", "--out", str(out), "--no-progress"]
    assert main(quick + ["--datasets", "diabetes", "--experiments", "table1"]) == 0
    first = json.loads((out / "results.json").read_text())
    assert "Runs:" not in (out / "report.md").read_text()  # one run: nothing to say
    capsys.readouterr()
    assert main(quick + ["--datasets", "spambase", "--experiments", "clients"]) == 2  # named, where it said none
    assert f"earlier run ({first['machine']['date']} (--quick); table1: diabetes)" in capsys.readouterr().err
    assert main(quick + ["--datasets", "spambase", "--experiments", "table1,clients", "--merge"]) == 0, \
        capsys.readouterr().err
    merged = json.loads((out / "results.json").read_text())
    assert merged["table1"]["diabetes"] == first["table1"]["diabetes"]  # the earlier dataset's entry is kept
    assert set(merged["table1"]) == {"diabetes", "spambase"} and merged["clients"]["dataset"] == "spambase"
    assert set(merged["seconds"]) == {"table1:diabetes", "table1:spambase", "clients:spambase"}
    report = (out / "report.md").read_text()
    assert "| diabetes |" in report and "| spambase |" in report and "Adding clients" in report
    assert f"Runs: {first['machine']['date']}: the rest; table1 on spambase; clients on spambase: " in report
