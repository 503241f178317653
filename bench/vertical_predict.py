"""Vertical GBDT prediction: the federation's one round against the engine's prediction, in one run.

A label holder and two passive parties (a9a's columns in three parts, or generated data where a9a is absent)
train unencrypted (prediction sends no ciphertexts: the key does not change it), then predict the test rows
in process: the passive parties send the go-left bits of their splits, the label holder routes.  The
reference is the engine's model of the same trees (lossless) predicting the joined test columns.  Both
predictions are checked to agree to 1e-9; medians of ``--repeats`` runs; the bytes each party sent in one
prediction.

    python3 bench/vertical_predict.py [--trees 30] [--depth 6] [--rows 50000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results" / "vertical_predict.json"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trees", type=int, default=30)
    ap.add_argument("--depth", type=int, default=6)
    ap.add_argument("--rows", type=int, default=50_000, help="test rows (a9a's test set repeated to this many)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()

    import numba

    numba.set_num_threads(1)
    from fedgrove.crypto.he import PlainContext
    from fedgrove.data import load_dataset
    from fedgrove.engine.gbdt import GBDTParams, train_gbdt
    from fedgrove.exceptions import DataError
    from fedgrove.protocols.vertical.active import predict_active
    from fedgrove.protocols.vertical.passive import answer_predict
    from fedgrove.protocols.vertical.simulate import run_vertical
    from fedgrove.transport.inprocess import InProcessHub, run_parties

    try:
        ds = load_dataset("a9a")
        X, y, X_test, name = ds.train.X, ds.train.y, ds.test.X, "a9a"
        X, X_test = (np.asarray(a.toarray() if hasattr(a, "toarray") else a, dtype=np.float64) for a in (X, X_test))
    except DataError:
        rng = np.random.default_rng(0)
        X, X_test = rng.normal(size=(20_000, 30)), rng.normal(size=(10_000, 30))
        y, name = (X[:, :10].sum(1) + X[:, 20:].sum(1) + rng.normal(size=len(X)) > 0).astype(float), "generated"
    X_test = np.resize(X_test, (args.rows, X.shape[1]))
    cols = np.array_split(np.arange(X.shape[1]), 3)
    params = GBDTParams(n_estimators=args.trees, max_depth=args.depth, seed=0, n_threads=1)
    out = run_vertical([X[:, c] for c in cols], y, params, PlainContext())
    model, passives = out["model"], out["passive_models"]
    names = ["party0", *passives]
    engine = train_gbdt(params, X, y)

    sent = {}  # bytes each party sent in the last prediction

    def federated():
        roles = {names[0]: lambda ch: predict_active(ch, names[1:], model, X_test[:, cols[0]])}
        for k, who in enumerate(names[1:], 1):
            roles[who] = lambda ch, k=k, who=who: answer_predict(ch, names[0], passives[who], X_test[:, cols[k]])
        results, channels = run_parties(InProcessHub(names), roles, 300)
        sent.update({who: ch.stats.as_dict()["total_sent"] for who, ch in channels.items()})
        return results[names[0]]

    raw, ref = federated(), engine.predict_raw(X_test)  # (first calls: kernels compiled or loaded)
    gap = float(np.max(np.abs(raw.reshape(ref.shape) - ref), initial=0.0))
    if gap > 1e-9:  # (the leaf values to 1e-9, as the tests hold them: gradients travel in fixed point)
        raise SystemExit(f"the federation's predictions differ from the engine's (by up to {gap:.3g})")
    times = {"federated": [], "engine": []}
    for _ in range(args.repeats):
        for key, fn in (("federated", federated), ("engine", lambda: engine.predict_raw(X_test))):
            t0 = time.perf_counter()
            fn()
            times[key].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    splits = {who: len(m.splits) for who, m in passives.items()}
    result = {"dataset": name, "test_rows": args.rows, "trees": args.trees, "depth": args.depth, "threads": 1,
              "repeats": args.repeats, "passive_splits": splits,
              "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
              "date": time.strftime("%Y-%m-%d %H:%M:%S"), "median_seconds": med,
              "ratio_federated_over_engine": med["federated"] / med["engine"], "bytes_sent": sent, "runs": times,
              "max_gap_to_engine": gap}
    print(f"{name}: {args.rows} test rows, {args.trees} trees of depth {args.depth}, passive splits {splits}: "
          f"federated {med['federated']:.3f} s, engine {med['engine']:.3f} s, "
          f"ratio {result['ratio_federated_over_engine']:.1f}x; bytes sent {sent}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
