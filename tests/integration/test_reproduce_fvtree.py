"""`fedgrove reproduce fvtree --quick`: every experiment runs end to end; the report says what it ran."""

import json

from fedgrove.cli.main import main
from fedgrove.cli.reproduce import merge_results
from fedgrove.experiments import fvtree as exp


def test_quick_reproduce_writes_report_results_and_plots(a9a, tmp_path, capsys):
    out = tmp_path / "res"
    code = main(["reproduce", "fvtree", "--quick", "--datasets", "a9a", "--out", str(out), "--no-progress"])
    assert code == 0, capsys.readouterr().err
    res = json.loads((out / "results.json").read_text())["datasets"]["a9a"]
    f6 = res["figure6"]
    assert set(f6["FV-tree"]) == {"2", "4", "6", "8", "10"} and len(f6["Standalone"]) == 4
    assert abs(f6["FV-tree_loss_points"] - (f6["FV-tree"]["10"] - f6["Centralized"]["10"])) < 1e-9
    assert set(res["figure7"]) == {"0.7", "0.9"} and set(res["figure8"]) == {"2", "4"}
    f9 = res["figure9"]["by_epsilon"]
    assert all(v["epsilon_spent"] == float(e) for e, v in f9.items()) and len(f9["2.0"]["errors"]) == 2
    report = (out / "report.md").read_text()
    for title in ("Figure 6", "Figure 7", "Figure 8", "Figure 9", "Quick run", "accuracy loss"):
        assert title in report
    assert (out / "a9a-figure9.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # results merged from several runs say in the report when each part ran
    full = json.loads((out / "results.json").read_text())
    exp.write_report(merge_results(full, full, "figure9 on a9a"), out)
    assert f"Runs: {full['machine']['date']}: the rest; figure9 on a9a: " in (out / "report.md").read_text()
