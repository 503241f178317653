"""Full-size fits on several thread counts: the same predictions, bit for bit, and each fit's time.

GBDT (20 trees of depth 8, row and column sampling 0.8, seed 1) on a9a, cod-rna, kddcup99's first 200,000 rows and
waveform, and a random forest (20 trees of depth 12) on spambase, each fitted on every count of ``--threads``
(at most ``NUMBA_NUM_THREADS``); prints each fit's seconds and the SHA-256 of its predictions on the training rows,
and whether they are the same on every count.  Writes JSON to ``--out``; exits 1 where any differ.

    NUMBA_NUM_THREADS=16 python bench/thread_counts.py --threads 1,2,4,8,16 --out FILE
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

CASES = (("a9a", "gbdt", None), ("cod-rna", "gbdt", None), ("kddcup99", "gbdt", 200_000), ("waveform", "gbdt", None),
         ("spambase", "forest", None))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", default="1,2,4,8,16")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    try:
        counts = [int(v) for v in args.threads.split(",")]
    except ValueError:
        raise SystemExit(f"--threads: {args.threads!r} is not a comma-separated list of thread counts") from None

    import numba
    import numpy as np

    from fedgrove.data import load_dataset
    from fedgrove.engine.forest import ForestParams, train_forest
    from fedgrove.engine.gbdt import GBDTParams, train_gbdt

    top = numba.config.NUMBA_NUM_THREADS
    if min(counts) < 1 or max(counts) > top:
        raise SystemExit(f"--threads: {counts} must lie in 1..{top} (NUMBA_NUM_THREADS)")
    out = {}
    for name, kind, rows in CASES:
        ds = load_dataset(name)
        X, y = (ds.train.X[:rows], ds.train.y[:rows]) if rows else (ds.train.X, ds.train.y)
        digests, seconds = {}, {}
        for n in counts:
            t0 = time.perf_counter()
            if kind == "gbdt":
                objective = "multiclass" if ds.n_classes > 2 else "binary"
                model = train_gbdt(GBDTParams(objective=objective, n_estimators=20, max_depth=8, subsample=0.8,
                                              colsample_bytree=0.8, seed=1, n_threads=n), X, y)
                pred = model.predict_raw(X)
            else:
                model = train_forest(ForestParams(n_estimators=20, max_depth=12, seed=1, n_threads=n), X, y)
                pred = model.predict_proba(X)
            seconds[n] = round(time.perf_counter() - t0, 3)
            digests[n] = hashlib.sha256(np.ascontiguousarray(pred).tobytes()).hexdigest()[:16]
            print(f"{name} {kind} threads {n}: {seconds[n]:.2f} s, predictions {digests[n]}", flush=True)
        same = len(set(digests.values())) == 1
        print(f"{name}: {'the same' if same else 'DIFFERENT'} on every thread count", flush=True)
        out[name] = {"digests": digests, "seconds": seconds, "same": same}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    print(f"wrote {args.out}")
    sys.exit(0 if all(v["same"] for v in out.values()) else 1)


if __name__ == "__main__":
    main()
