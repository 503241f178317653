"""Print the benchmark tables of docs/benchmarks.md from bench/results/*.json (markdown)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def engine_table(file: str = "engine.json", command: str = "python3 bench/engine.py") -> str:
    path = RESULTS / file
    if not path.exists():
        return f"_bench/results/{file} not found: run `{command}`._"
    r = json.loads(path.read_text())
    s = r["settings"]
    threads = f"{s['threads']} thread{'s' if s['threads'] != 1 else ''}"
    lines = [
        f"Measured on {r['machine']['platform']} ({r['machine']['cpus']} CPUs), "
        f"{threads}, OMP_WAIT_POLICY {s.get('omp_wait_policy', 'unset')}; "
        f"fit time is the median of the repeats shown; since 2026-11-23 20:29 each process first runs a tiny fit "
        f"(its seconds in the warm-up column; rows without one were timed cold, one-off costs included).",
        "",
        "| dataset | measured | repeats | metric | fedgrove | LightGBM | XGBoost | fit s fedgrove | fit s LightGBM "
        "| fit s XGBoost "
        "| fit ratio fedgrove/LightGBM | predict s fedgrove / LightGBM | peak RSS MB fedgrove / LightGBM "
        "| warm-up s fedgrove / LightGBM |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, e in r["datasets"].items():
        f, lg, xg = e["fedgrove"], e["lightgbm"], e.get("xgboost")
        warm = f"{f['warmup_s']:.2f} / {lg['warmup_s']:.2f}" if "warmup_s" in f else "- (cold)"
        lines.append(
            f"| {name} | {e.get('date', r['date'])} | {e.get('repeats', '?')} | {f['metric']} | {f['value']:.4f} | "
            f"{lg['value']:.4f} | "
            f"{xg['value']:.4f} | {f['fit_s']:.2f} | {lg['fit_s']:.2f} | {xg['fit_s']:.2f} | "
            f"{e['ratio_fedgrove_over_lightgbm']['fit']:.2f} | {f['predict_s']:.3f} / {lg['predict_s']:.3f} | "
            f"{f['peak_rss_mb']:.0f} / {lg['peak_rss_mb']:.0f} | {warm} |")
    nc = r.get("numba_cache")
    if nc:
        lines += ["", f"Second process start: recompiled kernels: {nc['second_start_recompiled'] or 'none'} "
                      f"(start-up with a tiny fit {nc['second_start_s']:.2f} s)."]
    return "\n".join(lines)


def vertical_table(file: str = "vertical.json", command: str = "python3 bench/vertical.py") -> str:
    path = RESULTS / file
    if not path.exists():
        return f"_bench/results/{file} not found: run `{command}`._"
    r = json.loads(path.read_text())
    ref = r["fedtree_reference_s_per_tree"]["threads_2"]
    lines = [f"Measured on {r['machine']['platform']} ({r['machine']['cpus']} CPUs), {r['threads']} threads, "
             f"a9a, {r['parties']} parties, depth {r['depth']}.", "",
             "| variant | measured | trees run | instances per gradient ciphertext | s/tree (median; each run) "
             "| MB/tree | test AUC | plaintext AUC (same trees) | FedTree HE s/tree / ours |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, v in r["variants"].items():
        each = v.get("seconds_per_tree_runs", [v["seconds_per_tree"]])
        lines.append(f"| {name} | {v.get('date', r['date'])} | {v['trees']} | {v.get('rows_per_ciphertext', 1)} "
                     f"| {v['seconds_per_tree']:.2f} "
                     f"({'; '.join(f'{x:.2f}' for x in each)}) | "
                     f"{v['bytes_per_tree'] / 1e6:.2f} | "
                     f"{v['test_auc']:.4f} | {v.get('plaintext_auc_same_trees', v['test_auc']):.4f} | "
                     + (f"{ref / v['seconds_per_tree']:.2f}" if name != "plain" else "-") + " |")
    tp = r.get("he_throughput")
    if tp:
        when = r.get("he_throughput_measured")
        lines += ["", "Homomorphic-encryption throughput on 2048-bit keys, packed (g, h) plaintexts "
                      "(values per second, 2 threads for HEU" + (f"; measured {when['date']}" if when else "")
                  + "):", "",
                  "| backend | encrypt | add | decrypt |", "|---|---|---|---|"]
        for name, t in tp.items():
            lines.append(f"| {name} | {t['encrypt_per_s']:,.0f} | {t['add_per_s']:,.0f} | {t['decrypt_per_s']:,.0f} |")
    bd = r.get("ou_breakdown")
    if bd:
        lines += ["", f"Where an OU-2048 tree's time goes ({bd['trees']} trees, {bd['date']}, "
                      f"{bd['seconds_per_tree']:.2f} s/tree with the operations timed; `select_sums` is the passive "
                      "party's homomorphic bin sums"
                      + (f", {bd['bin_sum_terms_per_tree']:,.0f} ciphertexts added up per tree"
                         if "bin_sum_terms_per_tree" in bd else "")
                      + ", `compress` packs them for decryption):", "",
                  "| " + " | ".join(bd["per_tree"]) + " |", "|" + "---|" * len(bd["per_tree"]),
                  "| " + " | ".join(f"{x:.3f}" for x in bd["per_tree"].values()) + " |"]
    ab = r.get("paillier_rows")
    if ab:
        lines += ["", f"HEU Paillier-2048 with one and with several instances per gradient ciphertext "
                      f"({ab['trees']} trees a run, alternately, {ab['date']}; each HE operation timed, seconds per "
                      f"tree of the median run):", ""] + _rows_table(ab)
    for key in ("ou_rows", "ou_rows_synthetic"):
        ab = r.get(key)
        if ab:
            lines += ["", f"HEU OU-2048 with one and with two instances per gradient ciphertext (`[he] "
                          f"rows_per_ciphertext = 2`; {ab.get('data', 'a9a')}; {ab['trees']} trees a run, "
                          f"alternately, {ab['date']}; each HE operation timed, seconds per tree of the median "
                          f"run):", ""] + _rows_table(ab)
    return "\n".join(lines)


def _rows_table(ab: dict) -> list[str]:
    """One row per number of instances per ciphertext: its seconds per tree, MB per tree where counted, and
    each HE operation's seconds in the median run."""
    ops = list(dict.fromkeys(op for runs in ab["per_tree"].values() for run in runs for op in run))
    ops = [op for op in ops if not op.startswith("other")] + [op for op in ops if op.startswith("other")]
    mb = "bytes_per_tree" in ab
    lines = ["| instances per ciphertext | s/tree (median; each run) | " + ("MB/tree | " if mb else "")
             + " | ".join(ops) + " |", "|" + "---|" * (len(ops) + 2 + mb)]
    for k, runs in ab["seconds_per_tree_runs"].items():
        mid = ab["per_tree"][k][sorted(range(len(runs)), key=runs.__getitem__)[len(runs) // 2]]
        lines.append(f"| {k} | {ab['seconds_per_tree'][k]:.2f} ({'; '.join(f'{x:.2f}' for x in runs)}) | "
                     + (f"{ab['bytes_per_tree'][k] / 1e6:.2f} | " if mb else "")
                     + " | ".join(f"{mid.get(op, 0.0):.3f}" for op in ops) + " |")
    return lines


def forest_table() -> str:
    path = RESULTS / "forest.json"
    if not path.exists():
        return "_bench/results/forest.json not found: run `python3 bench/forest.py`._"
    r = json.loads(path.read_text())
    e = r["variants"]["engine"]
    lines = [f"Measured {r['date']} on {r['machine']['platform']} ({r['machine']['cpus']} CPUs), {r['threads']} "
             f"thread(s), spambase ({r['n_train']} train / {r['n_test']} test rows), {r['clients']} clients, "
             f"unlimited depth, per-tree feature draws; training time the median of {r['repeats']} runs. The "
             f"engine's centralised forest: {e['seconds_per_tree']:.3f} s/tree, accuracy {e['accuracy']:.4f}; every "
             f"federated forest below predicts exactly as it.", "",
             "| variant | trees | s/tree | x engine | MB/tree | one-round predict s / messages / MB "
             "| classical predict s / messages / MB |", "|---|---|---|---|---|---|---|"]
    for name, v in r["variants"].items():
        if name == "engine":
            continue
        o, c = v["prediction"]["one-round"], v["prediction"]["classical"]
        lines.append(f"| {name} | {v['trees']} | {v['seconds_per_tree']:.3f} | {v['ratio_to_engine']:.1f} | "
                     f"{v['bytes_per_tree'] / 1e6:.2f} | {o['seconds']:.3f} / {o['messages']} / "
                     f"{o['bytes'] / 1e6:.2f} | "
                     f"{c['seconds']:.3f} / {c['messages']} / {c['bytes'] / 1e6:.2f} |")
    return "\n".join(lines)


def simfl_table() -> str:
    paths = [RESULTS / "simfl.json", RESULTS / "simfl_cod-rna.json", RESULTS / "simfl_tgbm.json"]
    if not paths[0].exists():
        return "_bench/results/simfl.json not found: run `python3 bench/simfl.py`._"
    lines = []
    for path in (p for p in paths if p.exists()):
        r = json.loads(path.read_text())
        s = r["median_seconds"]
        alone = r.get("median_seconds_trees_alone")
        runs = r["runs"]
        ratios = [b / a for a, b in zip(runs["SOLO"], runs["SimFL"])]
        each = "; ".join(f"{x:.2f}" for x in ratios)
        paired = statistics.median(ratios)
        lines += [
            f"Measured {r['date']} on {r['machine']['platform']} ({r['machine']['cpus']} CPUs), {r['threads']} "
            f"thread(s), {r['dataset']}, {r['parties']} parties ({r['partition']}), {r['trees']} trees of depth "
            f"{r['depth']}"
            + (f", the paper's engine settings as inferred (squared error, gamma {r['gamma']}, learning rate "
               f"{r['learning_rate']})" if r.get("settings") == "tgbm" else "")
            + f", medians of {r['repeats']} runs (`{path.relative_to(RESULTS.parent.parent)}`).", "",
            "| SOLO training s | ALL-IN training s | SimFL training s | SimFL / SOLO (target <= 1.1): of the medians, "
            "median of the runs' (each run) "
            "| trees alone: SOLO s, SimFL s, ratio | round trip ms a tree | preprocessing s "
            "| preprocessing MB sent per party | MB per tree | nodes per tree SOLO / SimFL |",
            "|---|---|---|---|---|---|---|---|---|---|",
            f"| {s['SOLO_training']:.2f} | {s['ALL-IN_training']:.2f} | {s['SimFL_training']:.2f} | "
            f"{r['ratio_simfl_over_solo']:.2f}, {paired:.2f} ({each}) | "
            + (f"{alone['SOLO']:.2f}, {alone['SimFL']:.2f}, {r['ratio_simfl_over_solo_trees_alone']:.2f} | "
               if alone else "- | ")
            + (f"{r['round_trip_ms_per_tree']:.2f} | " if "round_trip_ms_per_tree" in r else "- | ")
            + f"{s['SimFL_preprocessing']:.2f} | "
            f"{r['preprocessing_bytes_sent_per_party'] / 1e6:.2f} | {r['bytes_per_tree'] / 1e6:.3f} | "
            + (f"{r['mean_nodes_per_tree']['SOLO']:.0f} / {r['mean_nodes_per_tree']['SimFL']:.0f} |"
               if "mean_nodes_per_tree" in r else "- |"), ""]
    return "\n".join(lines[:-1])


def fvtree_table() -> str:
    path = RESULTS / "fvtree.json"
    if not path.exists():
        return "_bench/results/fvtree.json not found: run `python3 bench/fvtree.py`._"
    r = json.loads(path.read_text())
    ns = sorted(r["by_instances"], key=int)
    methods = list(r["by_instances"][ns[0]]["methods"])
    lines = [f"Measured {r['date']} on {r['machine']['platform']} ({r['machine']['cpus']} CPUs), {r['dataset']}, "
             f"{r['parties']} parties (theta {r['theta']}), depth {r['depth']}, {r['max_bins']} bins, one kernel "
             f"thread a party; per tree over {r['trees_measured']} trees (setup excluded), medians of "
             f"{r['repeats']} runs.", "",
             "| training rows | method | kB per tree | splits per tree | kB per split | ms per tree | x engine |",
             "|---|---|---|---|---|---|---|"]
    for n in ns:
        row = r["by_instances"][n]
        for m in methods:
            v = row["methods"][m]
            lines.append(f"| {n} | {m} | {v['bytes_per_tree'] / 1e3:.0f} | {v['splits_per_tree']:.0f} | "
                         f"{v['bytes_per_split'] / 1e3:.1f} | {v['seconds_per_tree'] * 1e3:.0f} | "
                         f"{v['ratio_to_engine']:.1f} |")
    g = r.get("bytes_growth_smallest_to_largest")
    if g:
        lines += ["", f"Bytes per tree from {ns[0]} to {ns[-1]} rows: "
                  + ", ".join(f"{m} x{x:.2f}" for m, x in g.items()) + "."]
    return "\n".join(lines)


TABLES = {"engine": engine_table,
          "engine-passive": lambda: engine_table("engine_passive.json", "python3 bench/engine.py --omp-wait-policy "
                                                 "PASSIVE --out bench/results/engine_passive.json"),
          "engine-1thread": lambda: engine_table("engine_1thread.json", "python3 bench/engine.py --threads 1 "
                                                 "--omp-wait-policy PASSIVE --out bench/results/engine_1thread.json"),
          "vertical": vertical_table,
          "vertical-gmpy2": lambda: vertical_table("vertical_gmpy2.json", "python3 bench/vertical.py --trees-plain 0 "
                                                   "--trees-ou 10 --trees-paillier 0 --trees-phe 0 --trees-gmpy2 10 "
                                                   "--breakdown-trees 0 --out bench/results/vertical_gmpy2.json"),
          "forest": forest_table, "simfl": simfl_table,
          "fvtree": fvtree_table}

if __name__ == "__main__":
    import sys

    name = sys.argv[1] if len(sys.argv) > 1 else "engine"
    if name not in TABLES:
        sys.exit(f"no tables for {name!r}: give one of {', '.join(TABLES)}")
    print(TABLES[name]())
