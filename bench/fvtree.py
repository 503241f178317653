"""FV-tree's cost per tree against PV-tree, histogram aggregation and SimFL, by number of instances (a9a).

The FGBDT-Chain paper claims FV-tree's communication per tree does not grow
with the number of instances (parties exchange votes and the histograms of
two candidate features, never per-instance values).  This script measures,
for each method, the bytes every party sends per tree (summed over parties)
and the wall-clock seconds per tree, on a9a's training split (75%, seeded)
subsampled to ``--fractions`` of its rows, with four parties and the paper's
unbalanced partition (theta 0.8).  Setup work (PSDs and their endorsement,
SimFL's hashing, cut points) is excluded by differencing: each method is run
with ``--base`` trees and with ``--base + --trees`` trees, and the per-tree
figures are the differences divided by ``--trees``.  Seconds are medians of
``--repeats`` pairs of runs; the centralised engine's seconds per tree on the
union of the same rows is measured in the same script and every method's
time is also given as a ratio to it.  Every party runs in its own thread
with a one-thread kernel; messages go through the real codec.  Writes
bench/results/fvtree.json.

    python bench/fvtree.py [--fractions 0.25,0.5,1 --parties 4 --trees 10 --base 2 --repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results" / "fvtree.json"
METHODS = ("FV-tree", "PV-tree", "Histogram aggregation", "SimFL")


def _total_sent(stats: dict) -> float:
    return float(sum(s["total_sent"] for s in stats.values()))


def _run(method: str, X, y, parts, params) -> tuple[float, float, int]:
    """(seconds, bytes sent by all parties, split nodes in the model) of one training run."""
    from fedgrove.protocols.fvtree.party import FVTreeOptions
    from fedgrove.protocols.fvtree.simulate import run_fvtree
    from fedgrove.protocols.horizontal.simulate import run_horizontal
    from fedgrove.protocols.simfl.simulate import run_simfl

    t0 = time.perf_counter()
    if method in ("FV-tree", "PV-tree"):
        out = run_fvtree([(X[r], y[r]) for r in parts], params,
                         FVTreeOptions(refit=method == "FV-tree", noise="public"), timeout=3600)
    elif method == "Histogram aggregation":
        out = run_horizontal([(X[r], y[r]) for r in parts], params, timeout=3600)
    else:
        out = run_simfl([(X[r], y[r], r) for r in parts], params, timeout=3600)
    secs = time.perf_counter() - t0
    splits = sum(t.n_nodes - t.n_leaves for t in out["model"].trees)
    return secs, _total_sent(out["stats"]), splits


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="a9a")
    ap.add_argument("--fractions", default="0.25,0.5,1")
    ap.add_argument("--parties", type=int, default=4)
    ap.add_argument("--theta", type=float, default=0.8)
    ap.add_argument("--trees", type=int, default=10, help="trees measured (the difference of the two runs)")
    ap.add_argument("--base", type=int, default=2, help="trees of the shorter run")
    ap.add_argument("--depth", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--methods", default=",".join(METHODS))
    args = ap.parse_args()
    methods = [m.strip() for m in args.methods.split(",")]
    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        ap.error(f"unknown method(s) {unknown}; expected some of {list(METHODS)}")

    import numba

    numba.set_num_threads(1)
    from fedgrove.engine.gbdt import GBDTParams, train_gbdt
    from fedgrove.experiments import simfl as exp

    cfg = exp.Config()
    X_all, y_all, _, _ = exp.load(args.dataset, cfg)

    def params(n):
        return GBDTParams(n_estimators=n, max_depth=args.depth, learning_rate=0.1, max_bins=32, n_threads=1,
                          seed=0)

    train_gbdt(params(2), X_all[:2000], y_all[:2000])  # compile the kernels outside the timings
    warm = exp.partition(y_all[:2000], args.parties, args.theta, cfg.seed)
    for m in methods:
        _run(m, X_all[:2000], y_all[:2000], warm, params(1))
    out = {"dataset": args.dataset, "parties": args.parties, "theta": args.theta, "depth": args.depth,
           "trees_measured": args.trees, "base_trees": args.base, "repeats": args.repeats, "threads": 1,
           "max_bins": 32, "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
           "date": time.strftime("%Y-%m-%d %H:%M:%S"), "by_instances": {}}
    for frac in (float(f) for f in args.fractions.split(",")):
        n = int(round(frac * len(y_all)))
        rows = np.sort(np.random.default_rng(7).choice(len(y_all), n, replace=False)) if n < len(y_all) \
            else np.arange(len(y_all))
        X, y = X_all[rows], y_all[rows]
        parts = exp.partition(y, args.parties, args.theta, cfg.seed)
        eng = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            train_gbdt(params(args.base), X, y)
            t1 = time.perf_counter()
            train_gbdt(params(args.base + args.trees), X, y)
            eng.append(((time.perf_counter() - t1) - (t1 - t0)) / args.trees)
        row = {"engine_seconds_per_tree": float(np.median(eng)), "methods": {}}
        for m in methods:
            secs, nbytes, nsplit = [], [], []
            for _ in range(args.repeats):
                s0, b0, k0 = _run(m, X, y, parts, params(args.base))
                s1, b1, k1 = _run(m, X, y, parts, params(args.base + args.trees))
                secs.append((s1 - s0) / args.trees)
                nbytes.append((b1 - b0) / args.trees)
                nsplit.append((k1 - k0) / args.trees)
            spt = float(np.median(secs))
            bpt, spl = float(np.median(nbytes)), float(np.median(nsplit))
            row["methods"][m] = {"bytes_per_tree": bpt, "splits_per_tree": spl,
                                 "bytes_per_split": bpt / spl if spl else None, "seconds_per_tree": spt,
                                 "ratio_to_engine": spt / row["engine_seconds_per_tree"], "runs_seconds": secs}
            print(f"n={n}: {m}: {row['methods'][m]['bytes_per_tree'] / 1e3:.1f} kB/tree ({spl:.0f} splits), "
                  f"{spt * 1e3:.0f} ms/tree "
                  f"(x{row['methods'][m]['ratio_to_engine']:.1f} the engine)", flush=True)
        out["by_instances"][str(n)] = row
    ns = sorted(out["by_instances"], key=int)
    if len(ns) > 1:
        out["bytes_growth_smallest_to_largest"] = {
            m: out["by_instances"][ns[-1]]["methods"][m]["bytes_per_tree"]
            / out["by_instances"][ns[0]]["methods"][m]["bytes_per_tree"] for m in methods}
        print(f"bytes per tree, {ns[-1]} over {ns[0]} instances: "
              + ", ".join(f"{m} x{g:.2f}" for m, g in out["bytes_growth_smallest_to_largest"].items()))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=2))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
