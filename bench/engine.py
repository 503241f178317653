"""Engine benchmark: fedgrove vs LightGBM vs XGBoost, same settings, one script.

100 trees, depth 8, learning rate 0.1, 255 bins, lambda 1, at the same thread
count (2 by default) on a9a, cod-rna, kddcup99 (10%, 80/20 split) and a
synthetic 1,000,000 x 28 binary set.  Each (library, dataset) fit runs in a
fresh subprocess (so peak RSS is its own), after a tiny fit and prediction
with the same library (2 trees of depth 2 on 2,000 rows, timed apart as
``warmup_s``: a fresh process's one-off costs, numba loading fedgrove's cached
kernels among them, stay out of the fit and predict times); with --repeats R
the median of R runs is reported.  Also checks that a second process start reuses the numba
cache instead of recompiling.  For fedgrove it also records the launch cost the engine measured (a parallel
kernel's launch on all threads beyond one on one thread) and whether it judged the threads to sleep between
launches, which makes small work run on one thread (``--omp-wait-policy PASSIVE``).  Writes
bench/results/engine.json (or ``--out``).

    python bench/engine.py [--threads 2] [--repeats 3] [--datasets a9a,cod-rna,kddcup99,synthetic-1m]
                           [--omp-wait-policy PASSIVE --out bench/results/engine_passive.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "engine.json"
SETTINGS = dict(n_estimators=100, max_depth=8, learning_rate=0.1, max_bins=255, reg_lambda=1.0,
                min_child_weight=1e-3)


def load(name):
    import numpy as np

    from fedgrove.data import load_dataset

    if name == "synthetic-1m":
        rng = np.random.default_rng(42)
        n, d = 1_200_000, 28
        X = rng.normal(size=(n, d)).astype(np.float64)
        w = rng.normal(size=d)
        logit = X @ w / np.sqrt(d) + 0.8 * np.sin(2 * X[:, 0]) * X[:, 1] + 0.5 * (X[:, 2] > 0.5)
        y = (logit + rng.logistic(size=n) * 0.6 > 0).astype(np.float64)
        return X[:1_000_000], y[:1_000_000], X[1_000_000:], y[1_000_000:], "binary", 2
    ds = load_dataset(name)
    if ds.test is not None:
        return ds.train.X, ds.train.y, ds.test.X, ds.test.y, ds.task, ds.n_classes
    from sklearn.model_selection import train_test_split

    Xtr, Xte, ytr, yte = train_test_split(ds.train.X, ds.train.y, test_size=0.2, random_state=0)
    return Xtr, ytr, Xte, yte, ds.task, ds.n_classes


def score(task, y, proba):
    from fedgrove import metrics

    if task == "binary":
        return "auc", metrics.auc(y, proba)
    return "accuracy", metrics.accuracy(y, proba.argmax(axis=1))


def fit_and_predictor(lib, Xtr, ytr, task, n_classes, threads, s):
    """Train ``lib`` with settings ``s``; returns a function giving class probabilities for a table."""
    if lib == "fedgrove":
        from fedgrove.engine.gbdt import GBDTParams, train_gbdt

        params = GBDTParams(objective=task, n_estimators=s["n_estimators"], max_depth=s["max_depth"],
                            learning_rate=s["learning_rate"], max_bins=s["max_bins"], reg_lambda=s["reg_lambda"],
                            min_child_weight=s["min_child_weight"], n_threads=threads,
                            n_classes=n_classes if task == "multiclass" else None)
        return train_gbdt(params, Xtr, ytr).predict_proba
    if lib == "lightgbm":
        import lightgbm as lgb
        import numpy as np

        params = dict(objective="binary" if task == "binary" else "multiclass", num_leaves=2 ** s["max_depth"],
                      max_depth=s["max_depth"], learning_rate=s["learning_rate"], max_bin=s["max_bins"],
                      lambda_l2=s["reg_lambda"], min_sum_hessian_in_leaf=s["min_child_weight"], min_data_in_leaf=1,
                      num_threads=threads, verbose=-1, deterministic=True, force_row_wise=False)
        if task == "multiclass":
            params["num_class"] = n_classes
        booster = lgb.train(params, lgb.Dataset(Xtr, ytr), num_boost_round=s["n_estimators"])

        def proba(X):
            raw = booster.predict(X)
            return raw if raw.ndim == 2 else np.column_stack([1 - raw, raw])
        return proba
    if lib == "xgboost":
        import numpy as np
        import xgboost as xgb

        params = dict(objective="binary:logistic" if task == "binary" else "multi:softprob", tree_method="hist",
                      max_depth=s["max_depth"], eta=s["learning_rate"], max_bin=s["max_bins"] + 1,
                      reg_lambda=s["reg_lambda"], min_child_weight=s["min_child_weight"], nthread=threads)
        if task == "multiclass":
            params["num_class"] = n_classes
        booster = xgb.train(params, xgb.DMatrix(Xtr, ytr, nthread=threads), num_boost_round=s["n_estimators"])

        def proba(X):
            raw = booster.predict(xgb.DMatrix(X, nthread=threads))
            return raw if raw.ndim == 2 else np.column_stack([1 - raw, raw])
        return proba
    raise SystemExit(f"unknown library {lib}")


def worker(lib, dataset, threads):
    Xtr, ytr, Xte, yte, task, n_classes = load(dataset)
    # a tiny fit and prediction first, outside the timings: a fresh process pays one-off costs on its first call
    # (fedgrove: numba loading its cached kernels, about 0.3 s here), reported as warmup_s
    t0 = time.perf_counter()
    fit_and_predictor(lib, Xtr[:2000], ytr[:2000], task, n_classes, threads,
                      dict(SETTINGS, n_estimators=2, max_depth=2))(Xte[:100])
    warmup = time.perf_counter() - t0
    t0 = time.perf_counter()
    predict_proba = fit_and_predictor(lib, Xtr, ytr, task, n_classes, threads, SETTINGS)
    fit = time.perf_counter() - t0
    t0 = time.perf_counter()
    proba = predict_proba(Xte)
    pred = time.perf_counter() - t0
    metric, value = score(task, yte, proba)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    out = {"fit_s": fit, "predict_s": pred, "warmup_s": warmup, "metric": metric, "value": value, "peak_rss_mb": rss}
    if lib == "fedgrove":  # what a launch on all threads cost beyond one on one, as the engine measured it
        from fedgrove.engine import threads as engine_threads

        measured = getattr(engine_threads, "_launch_cost", None)  # (None: a source from before the measurement)
        if measured:
            out["launch_cost_us"] = 1e6 * measured[max(measured)]
            out["threads_sleep"] = bool(engine_threads._sleep)
    print(json.dumps(out))


def warm_cache_check():
    """Run a tiny fit twice in fresh processes; the second must hit the numba cache everywhere."""
    code = (
        "import json, numpy as np\n"
        "from fedgrove.engine import histogram, split, partition, predict, binning, losses, sparse, threads\n"
        "from fedgrove.engine.gbdt import GBDTParams, train_gbdt\n"
        "rng = np.random.default_rng(0); X = rng.normal(size=(500, 4)); y = (X[:, 0] > 0).astype(float)\n"
        "m = train_gbdt(GBDTParams(n_estimators=2, max_depth=3), X, y); m.predict_proba(X)\n"
        "train_gbdt(GBDTParams(n_estimators=2, max_depth=3, subsample=0.5),\n"
        "           (rng.random((500, 20)) < 0.1).astype(float), y)\n"
        "train_gbdt(GBDTParams('multiclass', n_classes=3, n_estimators=2, max_depth=3), X,\n"
        "           (np.abs(X[:, 1]) * 2).astype(int) % 3 * 1.0)\n"
        "kernels = [histogram.build_histograms, histogram.subtract_histograms, histogram.sum_rows,\n"
        "           histogram.gather_rows, histogram.add_to_segments, losses._logistic_gradients,\n"
        "           split.gbdt_pair_splits, split.reduce_pairs, partition.partition_nodes,\n"
        "           losses._softmax_gradients_by_class, binning._map_to_bins, binning._few_distinct,\n"
        "           binning._columns_transposed, binning._sorted_runs, sparse._default_codes,\n"
        "           sparse._layout, sparse.build_histograms_sparse, threads._touch]\n"
        "named = {k.__name__: k for k in kernels}\n"
        "named.update(route_leaves_binned=predict._route_leaves_binned, route_sums=predict._route_sums)\n"
        "print(json.dumps({name: [sum(k.stats.cache_hits.values()), sum(k.stats.cache_misses.values())]\n"
        "                  for name, k in named.items()}))\n"
    )
    runs = []
    for _ in range(2):
        t0 = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        runs.append({"seconds": time.perf_counter() - t0, "kernels": json.loads(out.stdout.strip().splitlines()[-1])})
    second = runs[1]["kernels"]
    return {"first_start_s": runs[0]["seconds"], "second_start_s": runs[1]["seconds"],
            "second_start_recompiled": sorted(k for k, (hits, misses) in second.items() if misses > 0),
            "second_start_cache_hits": {k: v[0] for k, v in second.items()}}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3, help="runs per (library, dataset); the median is reported")
    ap.add_argument("--datasets", default="a9a,cod-rna,kddcup99,synthetic-1m")
    ap.add_argument("--libs", default="fedgrove,lightgbm,xgboost")
    ap.add_argument("--omp-wait-policy", default=None,
                    help="OMP_WAIT_POLICY for the workers; default: unset (each worker runs alone, so OpenMP's "
                         "active waiting is the libraries' best case; PASSIVE made LightGBM 6x slower on a9a here)")
    ap.add_argument("--out", type=Path, default=RESULTS, help="results file (merged into when it exists)")
    ap.add_argument("--worker", nargs=3, metavar=("LIB", "DATASET", "THREADS"))
    args = ap.parse_args()
    if args.worker:
        worker(args.worker[0], args.worker[1], int(args.worker[2]))
        return
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    env.pop("OMP_WAIT_POLICY", None)
    if args.omp_wait_policy:
        env["OMP_WAIT_POLICY"] = args.omp_wait_policy
    results = {"settings": {**SETTINGS, "threads": args.threads, "repeats": args.repeats,
                            "omp_wait_policy": args.omp_wait_policy or "unset", "warm_up_first": True},
               "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                           "python": platform.python_version()},
               "date": time.strftime("%Y-%m-%d %H:%M:%S"), "datasets": {}}
    results["numba_cache"] = warm_cache_check()
    print("numba cache:", json.dumps(results["numba_cache"]), flush=True)
    for dataset in args.datasets.split(","):
        entry = {}
        for lib in args.libs.split(","):
            runs = []
            for _ in range(args.repeats):
                out = subprocess.run([sys.executable, __file__, "--worker", lib, dataset, str(args.threads)],
                                     capture_output=True, text=True, env=env)
                if out.returncode != 0:
                    raise SystemExit(f"{lib} on {dataset} failed:\n{out.stderr[-3000:]}")
                runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
            entry[lib] = {
                "fit_s": statistics.median(r["fit_s"] for r in runs),
                "predict_s": statistics.median(r["predict_s"] for r in runs),
                "peak_rss_mb": statistics.median(r["peak_rss_mb"] for r in runs),
                "warmup_s": statistics.median(r["warmup_s"] for r in runs),
                "metric": runs[0]["metric"], "value": runs[0]["value"],
                "fit_s_runs": [r["fit_s"] for r in runs],
            }
            if "launch_cost_us" in runs[0]:
                entry[lib]["launch_cost_us_runs"] = [r["launch_cost_us"] for r in runs]
                entry[lib]["threads_sleep_runs"] = [r["threads_sleep"] for r in runs]
            print(f"{dataset:>14} {lib:>9}: fit {entry[lib]['fit_s']:8.2f}s  predict {entry[lib]['predict_s']:6.3f}s  "
                  f"{entry[lib]['metric']} {entry[lib]['value']:.4f}  rss {entry[lib]['peak_rss_mb']:.0f} MB",
                  flush=True)
        if "fedgrove" in entry and "lightgbm" in entry:
            f, lg = entry["fedgrove"], entry["lightgbm"]
            entry["ratio_fedgrove_over_lightgbm"] = {"fit": f["fit_s"] / lg["fit_s"],
                                                      "predict": f["predict_s"] / lg["predict_s"],
                                                      "metric_diff": f["value"] - lg["value"]}
            print(f"{dataset:>14} fedgrove/LightGBM fit ratio {entry['ratio_fedgrove_over_lightgbm']['fit']:.2f}, "
                  f"metric diff {entry['ratio_fedgrove_over_lightgbm']['metric_diff']:+.4f}", flush=True)
        entry["repeats"] = args.repeats
        entry["date"] = time.strftime("%Y-%m-%d %H:%M:%S")
        results["datasets"][dataset] = entry
        _save(results, args.out)
    print(f"wrote {args.out}")


def _save(results, path: Path = RESULTS):
    """Merge into the results file: datasets measured in earlier runs are kept."""
    path.parent.mkdir(parents=True, exist_ok=True)
    merged = json.loads(path.read_text()) if path.exists() else {"datasets": {}}
    merged.update({k: v for k, v in results.items() if k != "datasets"})
    merged.setdefault("datasets", {}).update(results["datasets"])
    path.write_text(json.dumps(merged, indent=2))


if __name__ == "__main__":
    main()
