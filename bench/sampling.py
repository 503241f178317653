"""What row and column subsampling buy the protocols: seconds and bytes per tree, in one run.

a9a, the same trees for every setting.  Encrypted (OU-2048, HEU): the
vertical protocol (2 parties, the columns split at random, depth 6) and
HybridTree (the paper's split: five guests, host depth 5 + guest depth 2,
learning rate 0.1).  Horizontal (no encryption of gradients): histogram
aggregation with secure aggregation and FV-tree (its defaults, public noise),
4 parties with SimFL's unbalanced partition (theta 0.8), depth 6, 32 bins.
Each protocol runs with no sampling, ``subsample = 0.5``,
``colsample_bytree = 0.5`` and both, in turn, ``--repeats`` times; it reports
the median tree's seconds (the median over the runs), bytes per tree (all
parties), the test AUC, and each setting's ratios to the unsampled run of
the same protocol.  The horizontal protocols report no per-tree times, so
their seconds and bytes per tree are the differences between a run of
``--trees`` + 2 trees and one of 2, over ``--trees`` (setup left out).
Writes bench/results/sampling.json (or ``--out``); ``--protocols`` runs some
of them and keeps the others' figures already in that file.

    python bench/sampling.py [--trees 10 --repeats 3 --threads 2 --protocols vertical,hybridtree,horizontal,fvtree]
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results" / "sampling.json"
PROTOCOLS = ("vertical", "hybridtree", "horizontal", "fvtree")
SETTINGS = {"none": (1.0, 1.0), "subsample 0.5": (0.5, 1.0), "colsample_bytree 0.5": (1.0, 0.5),
            "both 0.5": (0.5, 0.5)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trees", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=RESULTS, help=f"where to write the figures (default {RESULTS})")
    ap.add_argument("--protocols", default=",".join(PROTOCOLS))
    args = ap.parse_args()
    chosen = [p.strip() for p in args.protocols.split(",")]
    unknown = sorted(set(chosen) - set(PROTOCOLS))
    if unknown:
        ap.error(f"unknown protocol(s) {unknown}; expected some of {list(PROTOCOLS)}")

    import numba

    numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))
    from fedgrove import metrics
    from fedgrove.crypto.he import keygen
    from fedgrove.data import load_dataset
    from fedgrove.engine.gbdt import GBDTParams
    from fedgrove.experiments import hybridtree as exp
    from fedgrove.experiments import simfl as hexp
    from fedgrove.experiments.report import machine
    from fedgrove.protocols.fvtree.party import FVTreeOptions
    from fedgrove.protocols.fvtree.simulate import run_fvtree
    from fedgrove.protocols.horizontal.simulate import run_horizontal
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

    rows = hexp.partition(y, 4, 0.8, 0)
    base_trees, warmed = 2, set()

    def horizontal(name):
        def run(subsample, colsample):
            def params(n):
                return GBDTParams(n_estimators=n, max_depth=6, max_bins=32, n_threads=args.threads, seed=0,
                                  subsample=subsample, colsample_bytree=colsample)

            def once(n):
                t0 = time.perf_counter()
                if name == "horizontal":
                    out = run_horizontal([(X[r], y[r]) for r in rows], params(n), timeout=3600)
                else:
                    out = run_fvtree([(X[r], y[r]) for r in rows], params(n), FVTreeOptions(noise="public"),
                                     timeout=3600)
                return time.perf_counter() - t0, sum(v["total_sent"] for v in out["stats"].values()), out

            if name not in warmed:  # compile the protocol's kernels outside the timings
                once(1)
                warmed.add(name)
            s0, b0, _ = once(base_trees)
            s1, b1, out = once(base_trees + args.trees)
            raw = np.asarray(out["model"].predict_raw(Xt)).ravel()
            return ((s1 - s0) / args.trees, (b1 - b0) / args.trees), metrics.auc(yt, raw)
        return run

    results = json.loads(args.out.read_text()) if args.out.exists() else {}
    common = {k: results.pop(k) for k in ("he", "trees", "repeats", "threads", "machine", "date") if k in results}
    for entry in results.setdefault("protocols", {}).values():  # a file written before the figures were per protocol
        for k, v in common.items():
            entry.setdefault(k, v)
    results["dataset"] = "a9a"
    score = "test_auc"
    runners = {"vertical": vertical, "hybridtree": hybrid, "horizontal": horizontal("horizontal"),
               "fvtree": horizontal("fvtree")}
    for name in chosen:
        run = runners[name]
        runs = {s: [] for s in SETTINGS}
        for r in range(args.repeats):
            for s, (sub, col) in SETTINGS.items():  # in turn, so that the machine's noise falls on all alike
                out, quality = run(sub, col)
                if isinstance(out, tuple):  # a horizontal protocol's (seconds, bytes) per tree
                    seconds, nbytes = out
                else:
                    stats = out["fit_stats"] if "fit_stats" in out else out["stats"]
                    seconds = float(np.median(out["tree_seconds"]))
                    nbytes = sum(v["total_sent"] for v in stats.values()) / args.trees
                runs[s].append({"seconds_per_tree": seconds, "bytes_per_tree": nbytes, score: float(quality)})
                print(f"{name} run {r + 1} {s:>22}: {runs[s][-1]['seconds_per_tree']:.3f} s/tree "
                      f"{runs[s][-1]['bytes_per_tree'] / 1e6:.2f} MB/tree {score} {quality:.4f}", flush=True)
        entry = {"he": "ou-2048 (HEU)" if name in ("vertical", "hybridtree") else None, "trees": args.trees,
                 "repeats": args.repeats, "threads": args.threads, "machine": machine(),
                 "date": time.strftime("%Y-%m-%d %H:%M:%S")}
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
