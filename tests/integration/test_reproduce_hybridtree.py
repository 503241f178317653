"""`fedgrove reproduce hybridtree --quick`: every experiment runs end to end and the report holds what it says."""

import json

import numpy as np

from fedgrove.cli.main import main
from fedgrove.cli.reproduce import merge_results
from fedgrove.experiments import hybridtree as exp


def test_quick_reproduce_writes_report_results_and_plots(a9a, tmp_path, capsys):
    out = tmp_path / "res"
    code = main(["reproduce", "hybridtree", "--quick", "--datasets", "a9a", "--out", str(out), "--no-progress"])
    assert code == 0, capsys.readouterr().err
    res = json.loads((out / "results.json").read_text())["datasets"]["a9a"]
    assert set(exp.EXPERIMENTS) <= set(res)
    t1 = res["table1"]
    for method in exp.METHODS:
        assert t1[method] is not None
    assert len(t1["VFL_all"]) == 5 and t1["VFL"] == [min(t1["VFL_all"]), max(t1["VFL_all"])]
    assert 0.6 < t1["ALL-IN"] <= 1.0 and res["split"]["n_host_features"] == exp.HOST_FEATURES["a9a"]
    assert len(res["table3"]["HybridTree_per_host"]) == 5
    cost = res["table2"]
    assert cost["HybridTree"]["bytes_per_tree"] > 0 and cost["VFL_merged_guest"]["bytes_per_tree"] > 0
    assert set(res["figure6"]) == {"5", "10"} and set(res["figure8"]) == {"0.5", "5.0"}
    assert set(res["ablation"]) == {f"{h}+{g}" for h, g in exp.ABLATION_DEPTHS} | {"5+2 count mode"}
    seed1 = res["seeds"]["1"]
    assert seed1["gap_points"] == 100 * (seed1["ALL-IN"] - seed1["HybridTree"])
    assert seed1["ALL-IN"] != t1["ALL-IN"]  # another seed: another training sample (quick) and host features
    same = exp.seed_run("a9a", exp.Config(**exp.QUICK))  # seed 0 again: Table 1's runs, exactly
    assert (same["ALL-IN"], same["SOLO"], same["HybridTree"]) == (t1["ALL-IN"], t1["SOLO"], t1["HybridTree"])
    report = (out / "report.md").read_text()
    for title in ("Table 1", "Table 2", "Table 3", "Table 6", "Figure 6", "Figure 8", "Ablation", "Quick run",
                  "other seeds"):
        assert title in report
    assert f"{t1['HybridTree']:.3f}" in report and "0.832" in report  # ours beside the paper's
    for png in ("a9a-figure6.png", "a9a-figure8.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # results merged from several runs say in the report when each part ran
    full = json.loads((out / "results.json").read_text())
    merged = merge_results(full, full, "table1 on a9a")
    merged["reruns"] = [{"experiments": ["table1"], "machine": {"date": "2026-01-02 03:04:05"}, "note": "checked"}]
    exp.write_report(merged, out)
    report = (out / "report.md").read_text()
    assert f"Runs: {full['machine']['date']}: the rest; table1 on a9a: " in report
    assert "Rerun 2026-01-02 03:04:05: table1 (checked)." in report


def test_ablation_without_guest_layers_is_solo_on_the_host(a9a):
    cfg = exp.Config(**exp.QUICK)
    X, y, Xt, yt = exp.load("a9a", cfg)
    s = exp.make_setting("a9a", X, y, Xt, yt, 5, 0)
    from dataclasses import replace

    from fedgrove.engine.gbdt import train_gbdt

    raw = exp.run_hybrid(s, replace(cfg, host_depth=7, guest_depth=0))["test_raw"]
    solo = train_gbdt(cfg.params(), X[:, s.host_features], y).predict_raw(Xt[:, s.host_features])
    np.testing.assert_array_equal(raw[:, 0], solo)


def test_bad_choices_are_refused(capsys, tmp_path):
    assert main(["reproduce", "nopaper", "--out", str(tmp_path)]) == 2
    assert main(["reproduce", "hybridtree", "--datasets", "mnist", "--out", str(tmp_path)]) == 2
    assert "a9a, cod-rna" in capsys.readouterr().err
