"""Print the README's benchmark tables from bench/results/*.json (markdown)."""

from __future__ import annotations

import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def engine_table() -> str:
    path = RESULTS / "engine.json"
    if not path.exists():
        return "_bench/results/engine.json not found: run `python3 bench/engine.py`._"
    r = json.loads(path.read_text())
    s = r["settings"]
    lines = [
        f"Measured on {r['machine']['platform']} ({r['machine']['cpus']} CPUs), "
        f"{s['threads']} threads, OMP_WAIT_POLICY {s.get('omp_wait_policy', 'unset')}; "
        f"fit time is the median of the repeats shown.",
        "",
        "| dataset | measured | repeats | metric | fedgrove | LightGBM | XGBoost | fit s fedgrove | fit s LightGBM "
        "| fit s XGBoost "
        "| fit ratio fedgrove/LightGBM | predict s fedgrove / LightGBM | peak RSS MB fedgrove / LightGBM |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, e in r["datasets"].items():
        f, lg, xg = e["fedgrove"], e["lightgbm"], e.get("xgboost")
        lines.append(
            f"| {name} | {e.get('date', r['date'])} | {e.get('repeats', '?')} | {f['metric']} | {f['value']:.4f} | "
            f"{lg['value']:.4f} | "
            f"{xg['value']:.4f} | {f['fit_s']:.2f} | {lg['fit_s']:.2f} | {xg['fit_s']:.2f} | "
            f"{e['ratio_fedgrove_over_lightgbm']['fit']:.2f} | {f['predict_s']:.3f} / {lg['predict_s']:.3f} | "
            f"{f['peak_rss_mb']:.0f} / {lg['peak_rss_mb']:.0f} |")
    nc = r.get("numba_cache")
    if nc:
        lines += ["", f"Second process start: recompiled kernels: {nc['second_start_recompiled'] or 'none'} "
                      f"(start-up with a tiny fit {nc['second_start_s']:.2f} s)."]
    return "\n".join(lines)


def vertical_table() -> str:
    path = RESULTS / "vertical.json"
    if not path.exists():
        return "_bench/results/vertical.json not found: run `python3 bench/vertical.py`._"
    r = json.loads(path.read_text())
    ref = r["fedtree_reference_s_per_tree"]["threads_2"]
    lines = [f"Measured on {r['machine']['platform']} ({r['machine']['cpus']} CPUs), {r['threads']} threads, "
             f"a9a, {r['parties']} parties, depth {r['depth']}.", "",
             "| variant | measured | trees run | s/tree | MB/tree | test AUC | plaintext AUC (same trees) "
             "| FedTree HE s/tree / ours |",
             "|---|---|---|---|---|---|---|---|"]
    for name, v in r["variants"].items():
        lines.append(f"| {name} | {v.get('date', r['date'])} | {v['trees']} | {v['seconds_per_tree']:.2f} | "
                     f"{v['bytes_per_tree'] / 1e6:.2f} | "
                     f"{v['test_auc']:.4f} | {v.get('plaintext_auc_same_trees', v['test_auc']):.4f} | "
                     + (f"{ref / v['seconds_per_tree']:.2f}" if name != "plain" else "-") + " |")
    tp = r.get("he_throughput")
    if tp:
        lines += ["", "Homomorphic-encryption throughput on 2048-bit keys, packed (g, h) plaintexts "
                      "(values per second, 2 threads for HEU):", "",
                  "| backend | encrypt | add | decrypt |", "|---|---|---|---|"]
        for name, t in tp.items():
            lines.append(f"| {name} | {t['encrypt_per_s']:,.0f} | {t['add_per_s']:,.0f} | {t['decrypt_per_s']:,.0f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    import sys

    print(vertical_table() if "vertical" in sys.argv[1:] else engine_table())
