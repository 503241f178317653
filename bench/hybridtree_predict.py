"""HybridTree prediction: the federation's two rounds against the engine's prediction of a model of the same size.

A host holding a9a's first 60 columns for every instance and three guests holding the other 63 for a third of
the instances each (generated data where a9a is absent) train unencrypted (prediction sends no ciphertexts:
the key does not change it), then predict the test rows repeated to ``--rows`` in process, every guest
holding every test row, from the per-party model files (their dicts): the host routes through its layers,
each guest walks its own below them, the host averages the guests' leaf values.  The reference is the
engine's prediction of a model of the same size (as many trees of ``host_depth + guest_depth`` levels,
trained on the joined columns; HybridTree's trees are not the engine's) in the same run.  Beside it, as the
paper's Table 8 compares, the node-level vertical protocol's prediction of a model of that size, trained by
the host's columns and one passive party holding the guests' columns of every instance (the VFL of
``bench/hybridtree.py``), from its parties' model files too.  Medians of ``--repeats`` runs; the bytes each
party sent in one prediction.

    python3 bench/hybridtree_predict.py [--trees 30] [--rows 50000] [--repeats 5] [--out FILE]
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

RESULTS = Path(__file__).resolve().parent / "results" / "hybridtree_predict.json"
HOST_DEPTH, GUEST_DEPTH, GUESTS = 5, 2, 3


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trees", type=int, default=30)
    ap.add_argument("--rows", type=int, default=50_000, help="test rows (a9a's test set repeated to this many)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()

    import numba

    numba.set_num_threads(1)
    from fedgrove.crypto.he import PlainContext
    from fedgrove.data import load_dataset
    from fedgrove.engine.gbdt import GBDTParams, train_gbdt
    from fedgrove.engine.model import model_from_dict
    from fedgrove.exceptions import DataError
    from fedgrove.protocols.hybridtree.guest import HybridGuest
    from fedgrove.protocols.hybridtree.host import HybridHostModel, predict_hybrid
    from fedgrove.protocols.hybridtree.simulate import run_hybridtree
    from fedgrove.protocols.vertical.active import predict_active
    from fedgrove.protocols.vertical.passive import PassiveModel, answer_predict
    from fedgrove.protocols.vertical.simulate import run_vertical
    from fedgrove.transport.inprocess import InProcessHub, run_parties

    try:
        ds = load_dataset("a9a")
        X, y, X_test, name = ds.train.X, ds.train.y, ds.test.X, "a9a"
        X, X_test = (np.asarray(a.toarray() if hasattr(a, "toarray") else a, dtype=np.float64) for a in (X, X_test))
        host_cols = 60
    except DataError:
        rng = np.random.default_rng(0)
        X, X_test = rng.normal(size=(20_000, 30)), rng.normal(size=(10_000, 30))
        y, name = (X[:, :10].sum(1) + X[:, 20:].sum(1) + rng.normal(size=len(X)) > 0).astype(float), "generated"
        host_cols = 15
    X_test = np.resize(X_test, (args.rows, X.shape[1]))
    hc, gc = slice(0, host_cols), slice(host_cols, X.shape[1])
    ids, test_ids = np.arange(len(X)), np.arange(args.rows)
    part = np.random.default_rng(0).integers(0, GUESTS, len(X))
    params = GBDTParams(n_estimators=args.trees, max_depth=HOST_DEPTH + GUEST_DEPTH, seed=0, n_threads=1)
    out = run_hybridtree(X[:, hc], y, [(X[part == k][:, gc], ids[part == k]) for k in range(GUESTS)], params,
                         PlainContext(), HOST_DEPTH, GUEST_DEPTH)
    host_file = out["model"].to_dict()
    guest_files = {u: g.to_dict() for u, g in out["guest_models"].items()}
    names = sorted(guest_files)
    engine = train_gbdt(params, X, y)
    vfl = run_vertical([X[:, hc], X[:, gc]], y, params, PlainContext(), names=["host", "guests"])
    vfl_files = vfl["model"].to_dict(), vfl["passive_models"]["guests"].to_dict()
    sent, vfl_sent = {}, {}

    def federated():
        model = HybridHostModel.from_dict(host_file)
        roles = {"host": lambda ch: predict_hybrid(ch, names, model, X_test[:, hc])}
        for u in names:
            roles[u] = lambda ch, u=u: HybridGuest.from_model(ch, guest_files[u], "host").predict(X_test[:, gc],
                                                                                                 test_ids)
        results, channels = run_parties(InProcessHub(["host"] + names), roles, 300)
        sent.update({who: ch.stats.as_dict()["total_sent"] for who, ch in channels.items()})
        return results["host"]

    def vertical():
        roles = {"host": lambda ch: predict_active(ch, ["guests"], model_from_dict(vfl_files[0]), X_test[:, hc]),
                 "guests": lambda ch: answer_predict(ch, "host", PassiveModel.from_dict(vfl_files[1]),
                                                     X_test[:, gc])}
        results, channels = run_parties(InProcessHub(["host", "guests"]), roles, 300)
        vfl_sent.update({who: ch.stats.as_dict()["total_sent"] for who, ch in channels.items()})
        return results["host"]

    raw = federated()  # (first calls: kernels compiled or loaded)
    engine.predict_raw(X_test)
    if raw.shape[0] != args.rows or not np.all(np.isfinite(raw)):
        raise SystemExit("the federation's predictions are not one finite score a test row")
    vfl_raw = vertical()
    gap = float(np.max(np.abs(vfl_raw.reshape(-1) - engine.predict_raw(X_test).reshape(-1)), initial=0.0))
    if gap > 1e-9:  # (lossless: its trees are the engine's on the joined columns, leaf values to 1e-9)
        raise SystemExit(f"the vertical protocol's predictions differ from the engine's (by up to {gap:.3g})")
    times = {"federated": [], "engine": [], "vertical": []}
    for _ in range(args.repeats):
        for key, fn in (("federated", federated), ("engine", lambda: engine.predict_raw(X_test)),
                        ("vertical", vertical)):
            t0 = time.perf_counter()
            fn()
            times[key].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    result = {"dataset": name, "test_rows": args.rows, "trees": args.trees, "host_depth": HOST_DEPTH,
              "guest_depth": GUEST_DEPTH, "guests": GUESTS, "threads": 1, "repeats": args.repeats,
              "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
              "date": time.strftime("%Y-%m-%d %H:%M:%S"), "median_seconds": med,
              "ratio_federated_over_engine": med["federated"] / med["engine"],
              "ratio_federated_over_vertical": med["federated"] / med["vertical"], "bytes_sent": sent,
              "vertical_bytes_sent": vfl_sent, "runs": times}
    print(f"{name}: {args.rows} test rows, {args.trees} trees of {HOST_DEPTH} + {GUEST_DEPTH} levels, {GUESTS} "
          f"guests: federated {med['federated']:.3f} s, engine {med['engine']:.3f} s, "
          f"ratio {result['ratio_federated_over_engine']:.1f}x; bytes sent {sent}", flush=True)
    print(f"node-level vertical protocol (host + one passive party), the same size: {med['vertical']:.3f} s "
          f"(HybridTree {result['ratio_federated_over_vertical']:.2f}x its time), bytes sent {vfl_sent}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
