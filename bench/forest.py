"""Federated Forest benchmark: training and prediction cost, with and without label encryption, in one run.

spambase (80% train / 20% test, seed 0), two clients with half of the
features each (random), the paper's per-tree feature draw, unlimited depth.
Variants, each a real federation through the in-process transport:

* ``engine``: the centralised forest (the oracle, and the time reference);
* ``shared``: the paper's trusted setting, labels shared with every client;
* ``encrypted-ou``: the label holder encrypts label statistics with HEU
  Okamoto-Uchiyama 2048 and scores the other client's encrypted histograms;
* ``encrypted-paillier``: the same with HEU Paillier 2048 (fewer trees).

For each: training seconds per tree (median of ``--repeats`` runs) and its
ratio to the engine's, bytes per tree (all parties), and for prediction of
the test rows, one-round against classical: seconds, messages and bytes.
Every federated forest's predictions are checked to equal the engine's.
Writes bench/results/forest.json.

    python bench/forest.py [--trees 20 --trees-paillier 3 --repeats 3 --threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results" / "forest.json"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trees", type=int, default=20)
    ap.add_argument("--trees-paillier", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()

    import numba

    numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))
    from fedgrove.crypto.he import available_backends, keygen
    from fedgrove.data import load_dataset
    from fedgrove.engine.forest import ForestParams, train_forest
    from fedgrove.protocols.forest.simulate import run_federated_forest

    ds = load_dataset("spambase")
    X, y = ds.train.X, ds.train.y
    r = np.random.default_rng(0)
    order = r.permutation(len(y))
    n_test = len(y) // 5
    test, train = np.sort(order[:n_test]), np.sort(order[n_test:])
    halves = [np.sort(h) for h in np.array_split(r.permutation(X.shape[1]), 2)]
    parts = [X[train][:, h] for h in halves]
    tests = [X[test][:, h] for h in halves]
    joined, joined_test = np.hstack(parts), np.hstack(tests)

    results = {"dataset": "spambase", "clients": 2, "n_train": len(train), "n_test": len(test),
               "threads": args.threads, "repeats": args.repeats,
               "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
               "date": time.strftime("%Y-%m-%d %H:%M:%S"), "variants": {}}

    def params(trees):
        return ForestParams(n_estimators=trees, feature_sampling="tree", seed=0, n_threads=args.threads)

    engine = {}
    for trees in sorted({args.trees, args.trees_paillier}):
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            model = train_forest(params(trees), joined, y[train])
            times.append(time.perf_counter() - t0)
        engine[trees] = (float(np.median(times)) / trees, model.predict_proba(joined_test))
    results["variants"]["engine"] = {"trees": args.trees, "seconds_per_tree": engine[args.trees][0],
                                     "accuracy": float(np.mean(engine[args.trees][1].argmax(1) == y[test]))}
    print(f"{'engine':>20}: {engine[args.trees][0]:.3f} s/tree", flush=True)

    variants = [("shared", "shared", None, args.trees), ("encrypted-ou", "encrypted", "ou", args.trees),
                ("encrypted-paillier", "encrypted", "paillier", args.trees_paillier)]
    for name, mode, scheme, trees in variants:
        if trees <= 0 or (scheme is not None and "heu" not in available_backends()):
            continue
        runs = []
        for _ in range(args.repeats):
            he = keygen(scheme, 2048) if scheme else None
            out = run_federated_forest(parts, y[train], params(trees), he, mode=mode, X_test_parts=tests,
                                       methods=("one-round", "classical"), timeout=3600)
            if not np.array_equal(out["predictions"]["one-round"], engine[trees][1]):
                raise SystemExit(f"{name}: predictions differ from the engine's forest")
            runs.append(out)
        fit = float(np.median([o["fit_seconds"] for o in runs])) / trees
        last = runs[-1]
        entry = {"trees": trees, "runs": len(runs), "seconds_per_tree": fit,
                 "seconds_per_tree_runs": [o["fit_seconds"] / trees for o in runs],
                 "ratio_to_engine": fit / engine[trees][0],
                 "bytes_per_tree": sum(s["total_sent"] for s in last["fit_stats"].values()) / trees,
                 "bytes_per_tree_per_party": {k: s["total_sent"] / trees for k, s in last["fit_stats"].items()},
                 "predictions_equal_engine": True,
                 "prediction": {m: {"seconds": s["seconds"], "messages": s["messages"], "bytes": s["bytes"]}
                                for m, s in last["predict_stats"].items()}}
        results["variants"][name] = entry
        p = entry["prediction"]
        print(f"{name:>20}: {fit:.3f} s/tree ({entry['ratio_to_engine']:.1f}x engine), "
              f"{entry['bytes_per_tree'] / 1e6:.2f} MB/tree; predict one-round {p['one-round']['seconds']:.3f} s "
              f"{p['one-round']['messages']} msgs, classical {p['classical']['seconds']:.3f} s "
              f"{p['classical']['messages']} msgs", flush=True)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
