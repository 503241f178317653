"""HybridTree training cost against the node-level vertical protocol (the paper's Table 2), in one run.

a9a by default, the paper's split (host features drawn with the seed, five
guests with equal shares of the instances), depth 5 + 2 for HybridTree and 7
for VFL, the same HE (OU-2048 by default) for both.  VFL is measured three
ways: one 2-party run (host + one guest; mean over the guests), the sum of
those runs (together they cover the instances HybridTree covers), and one run
with a single passive party holding every guest's features for every
instance.  Reports seconds and bytes per tree (all parties, and per party) and
the VFL/HybridTree ratios; the median of ``--repeats`` runs for the times.
Writes bench/results/hybridtree.json (or ``--out``).

    python bench/hybridtree.py [--dataset a9a --trees 5 --he ou|paillier|ou-gmpy2 --repeats 3 --threads 2
                                --rows-per-ciphertext K --out FILE]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results" / "hybridtree.json"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="a9a")
    ap.add_argument("--trees", type=int, default=5)
    ap.add_argument("--he", default="ou", choices=["ou", "paillier", "ou-gmpy2"],
                    help="the scheme (HEU's where installed), or ou-gmpy2: fedgrove's own OU on gmpy2")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows-per-ciphertext", type=int, default=None,
                    help="instances per gradient ciphertext for both protocols (default by scheme: 3 for Paillier, "
                         "1 for OU)")
    ap.add_argument("--out", type=Path, default=RESULTS, help=f"where to write the figures (default {RESULTS})")
    args = ap.parse_args()

    import numba

    numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))
    from fedgrove.experiments import hybridtree as exp
    from fedgrove.experiments.report import machine

    # every party's kernels (numba's setting is per thread: the parties' threads take it from their params)
    cfg = exp.Config(cost_he=args.he, cost_trees=args.trees, n_threads=args.threads,
                     rows_per_ciphertext=args.rows_per_ciphertext)
    X, y, Xt, yt = exp.load(args.dataset, cfg)
    setting = exp.make_setting(args.dataset, X, y, Xt, yt, cfg.n_guests, cfg.seed)
    runs = []
    for r in range(args.repeats):
        runs.append(exp.cost_table(setting, cfg))
        h = runs[-1]["HybridTree"]
        print(f"run {r + 1}: HybridTree {h['seconds_per_tree']:.2f} s/tree {h['bytes_per_tree'] / 1e6:.2f} MB/tree; "
              + "; ".join(f"{k} {runs[-1][k]['seconds_per_tree']:.2f} s/tree x{runs[-1][k]['speedup']:.2f} time "
                          f"x{runs[-1][k]['bytes_ratio']:.2f} bytes"
                          for k in exp.VFL_COSTS), flush=True)
    med = {}
    for key in ("HybridTree", *exp.VFL_COSTS):
        med[key] = {"seconds_per_tree": float(np.median([r[key]["seconds_per_tree"] for r in runs])),
                    "bytes_per_tree": float(np.median([r[key]["bytes_per_tree"] for r in runs]))}
    exp.add_cost_ratios(med)
    med["HybridTree"]["bytes_per_tree_per_party"] = runs[0]["HybridTree"]["bytes_per_tree_per_party"]
    med["VFL_merged_guest"]["bytes_per_tree_per_party"] = runs[0]["VFL_merged_guest"]["bytes_per_tree_per_party"]
    out = {"dataset": args.dataset, "he": f"{args.he}-2048", "trees": args.trees, "repeats": args.repeats,
           "threads": args.threads, "rows_per_ciphertext": args.rows_per_ciphertext or "by scheme",
           "split": setting.info, "machine": machine(), "median": med,
           "targets": {"speedup_vs_vfl": 4.0, "bytes_ratio_vs_vfl": 5.0},
           "paper": exp.PAPER["table2"].get(args.dataset), "runs": runs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    print(json.dumps(med, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    t0 = time.perf_counter()
    main()
    print(f"{time.perf_counter() - t0:.0f} s")
