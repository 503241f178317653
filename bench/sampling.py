"""What row and column subsampling buy the encrypted protocols: seconds and bytes per tree, in one run.

a9a, OU-2048 (HEU), the same trees for every setting: the vertical protocol
(2 parties, the columns split at random, depth 6) and HybridTree (the
paper's split: five guests, host depth 5 + guest depth 2, learning rate 0.1).
Each protocol runs with no sampling, ``subsample = 0.5``,
``colsample_bytree = 0.5`` and both, in turn, ``--repeats`` times; it reports
the median tree's seconds (the median over the runs), bytes per tree (all
parties), the test AUC, and each
setting's ratios to the unsampled run of the same protocol.  Writes
bench/results/sampling.json (or ``--out``).

    python bench/sampling.py [--trees 10 --repeats 3 --threads 2 --out FILE]
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results" / "sampling.json"
SETTINGS = {"none": (1.0, 1.0), "subsample 0.5": (0.5, 1.0), "colsample_bytree 0.5": (1.0, 0.5),
            "both 0.5": (0.5, 0.5)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trees", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=RESULTS, help=f"where to write the figures (default {RESULTS})")
    args = ap.parse_args()

    import numba

    numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))
    from fedgrove import metrics
    from fedgrove.crypto.he import keygen
    from fedgrove.data import load_dataset
    from fedgrove.engine.gbdt import GBDTParams
    from fedgrove.experiments import hybridtree as exp
    from fedgrove.experiments.report import machine
    from fedgrove.protocols.vertical.simulate import run_vertical

    he = keygen("ou", 2048, "heu")
    ds = load_dataset("a9a")
    X, y, Xt, yt = ds.train.X, ds.train.y, ds.test.X, ds.test.y
    perm = np.random.default_rng(0).permutation(X.shape[1])
    parts = [np.sort(p) for p in np.array_split(perm, 2)]

    def vertical(subsample, colsample):
        params = GBDTParams(n_estimators=args.trees, max_depth=6, n_threads=args.threads, subsample=subsample,
                            colsample_bytree=colsample)
        out = run_vertical([X[:, p] for p in parts], y, params, he, X_test_parts=[Xt[:, p] for p in parts],
                           timeout=3600)
        return out, metrics.auc(yt, 1 / (1 + np.exp(-np.asarray(out["raw"]).ravel())))

    @dataclass
    class Sampled(exp.Config):
        subsample: float = 1.0
        colsample_bytree: float = 1.0

        def params(self, depth=None, n_trees=None):
            return replace(super().params(depth, n_trees), subsample=self.subsample,
                           colsample_bytree=self.colsample_bytree)

    base = exp.Config(n_threads=args.threads)
    setting = exp.make_setting("a9a", X, y, Xt, yt, base.n_guests, base.seed)

    def hybrid(subsample, colsample):
        cfg = Sampled(n_threads=args.threads, subsample=subsample, colsample_bytree=colsample)
        out = exp.run_hybrid(setting, cfg, he=he, n_trees=args.trees)
        return out, metrics.auc(yt, np.asarray(out["test_raw"]).ravel())

    results = {"dataset": "a9a", "he": "ou-2048 (HEU)", "trees": args.trees, "repeats": args.repeats,
               "threads": args.threads, "machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M:%S"),
               "protocols": {}}
    score = "test_auc"
    for name, run in (("vertical", vertical), ("hybridtree", hybrid)):
        runs = {s: [] for s in SETTINGS}
        for r in range(args.repeats):
            for s, (sub, col) in SETTINGS.items():  # in turn, so that the machine's noise falls on all alike
                out, quality = run(sub, col)
                stats = out["fit_stats"] if "fit_stats" in out else out["stats"]
                runs[s].append({"seconds_per_tree": float(np.median(out["tree_seconds"])),
                                "bytes_per_tree": sum(v["total_sent"] for v in stats.values()) / args.trees,
                                score: float(quality)})
                print(f"{name} run {r + 1} {s:>22}: {runs[s][-1]['seconds_per_tree']:.3f} s/tree "
                      f"{runs[s][-1]['bytes_per_tree'] / 1e6:.2f} MB/tree {score} {quality:.4f}", flush=True)
        entry = {}
        for s in SETTINGS:
            entry[s] = {"seconds_per_tree": float(np.median([x["seconds_per_tree"] for x in runs[s]])),
                        "bytes_per_tree": float(np.median([x["bytes_per_tree"] for x in runs[s]])),
                        score: runs[s][0][score], "runs": runs[s]}
        for s in SETTINGS:
            entry[s]["time_ratio_to_none"] = entry[s]["seconds_per_tree"] / entry["none"]["seconds_per_tree"]
            entry[s]["bytes_ratio_to_none"] = entry[s]["bytes_per_tree"] / entry["none"]["bytes_per_tree"]
            print(f"{name} {s:>22}: {entry[s]['seconds_per_tree']:.3f} s/tree "
                  f"(x{entry[s]['time_ratio_to_none']:.2f}), {entry[s]['bytes_per_tree'] / 1e6:.2f} MB/tree "
                  f"(x{entry[s]['bytes_ratio_to_none']:.2f}), {score} {entry[s][score]:.4f}", flush=True)
        results["protocols"][name] = entry
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
