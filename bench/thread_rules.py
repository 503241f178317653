"""The engine's one-thread rules on many threads: launch costs, the sleeping-threads judgement, and fit times.

Run once per ``OMP_WAIT_POLICY`` (it must be set before numba loads: unset, then ``PASSIVE``), on a machine of
many cores.  Reports numba's threading layer, the launch cost the engine measures on 2, 4, 8 and 16 threads
(``threads.launch_cost``), whether it judges the threads to sleep between launches, and its one-thread line per
thread count; then the fit time (median of ``--repeats``) of a GBDT of depth 8 on a9a and cod-rna (50 trees) and
on kddcup99's first 100,000 rows (5 rounds of 23 classes) for each configuration of ``--configs``: ``N:judged``
(N threads, the rules as the engine judged), ``N:off`` (the rules never applied: threads counted as spinning),
``N:on`` (always applied: counted as sleeping).  ``--lightgbm`` adds LightGBM on 1 and the most threads as a
reference.  Every configuration grows the same model; only the time differs.  Writes JSON to ``--out``.

    OMP_WAIT_POLICY=PASSIVE NUMBA_NUM_THREADS=16 python bench/thread_rules.py --out /tmp/passive.json
        [--configs 1:off,16:judged,16:off,4:judged,4:off --repeats 3 --lightgbm]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

CASES = (("a9a", None, 50), ("cod-rna", None, 50), ("kddcup99", 100_000, 5))


def parse_configs(text: str) -> list[tuple[int, str]]:
    configs = []
    for item in text.split(","):
        n, _, rule = item.strip().partition(":")
        if not n.isdigit() or int(n) < 1 or rule not in ("judged", "off", "on"):
            raise SystemExit(f"--configs: {item!r} is not N:judged, N:off or N:on with N a thread count >= 1")
        configs.append((int(n), rule))
    return configs


def median_seconds(f, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return round(statistics.median(times), 3)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default="1:off,16:judged,16:off,4:judged,4:off")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--lightgbm", action="store_true")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    configs = parse_configs(args.configs)
    if args.repeats < 1:
        raise SystemExit(f"--repeats: {args.repeats} is not a count >= 1")

    import numba

    from fedgrove.data import load_dataset
    from fedgrove.engine import threads
    from fedgrove.engine.gbdt import GBDTParams, train_gbdt

    top = numba.config.NUMBA_NUM_THREADS
    if max(n for n, _ in configs) > top:
        raise SystemExit(f"--configs asks for {max(n for n, _ in configs)} threads; numba has {top} "
                         "(set NUMBA_NUM_THREADS)")
    out = {"policy": os.environ.get("OMP_WAIT_POLICY", "unset"), "cpus": os.cpu_count(), "numba_threads": top,
           "python": sys.version.split()[0], "configs": args.configs, "repeats": args.repeats}
    threads.launch_cost(2)
    out["layer"] = numba.threading_layer()
    counts = [n for n in (2, 4, 8, 16) if n <= top]
    out["launch_us"] = {n: round(threads.launch_cost(n) * 1e6, 1) for n in counts}
    threads._sleep = None
    judged = out["judged_sleeping"] = threads.threads_sleep()
    out["serial_work"] = {n: threads.serial_work(n) for n in counts}
    print(out, flush=True)
    for name, rows, trees in CASES:
        ds = load_dataset(name)
        X, y = (ds.train.X[:rows], ds.train.y[:rows]) if rows else (ds.train.X, ds.train.y)
        objective = "multiclass" if ds.n_classes > 2 else "binary"
        train_gbdt(GBDTParams(objective=objective, n_estimators=1, max_depth=2, n_threads=top), X[:2000], y[:2000])
        row = {}
        for n, rule in configs:
            threads._sleep = {"judged": judged, "off": False, "on": True}[rule]
            params = GBDTParams(objective=objective, n_estimators=trees, max_depth=8, n_threads=n)
            row[f"{n} {rule}"] = median_seconds(lambda p=params: train_gbdt(p, X, y), args.repeats)
        threads._sleep = judged
        if args.lightgbm:
            import lightgbm as lgb

            for n in (1, top):
                prm = dict(objective=objective, num_class=ds.n_classes if ds.n_classes > 2 else 1, max_depth=8,
                           num_leaves=256, learning_rate=0.1, max_bin=255, lambda_l2=1.0,
                           min_sum_hessian_in_leaf=1e-3, min_data_in_leaf=1, num_threads=n, verbose=-1)
                row[f"lightgbm {n}"] = median_seconds(
                    lambda p=prm: lgb.train(p, lgb.Dataset(X, y), num_boost_round=trees), args.repeats)
        out[name] = row
        print(name, row, flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
