"""Bytes every protocol sends, with the codec's packed integer arrays (``FGM4``) and without (``FGM3``).

Each protocol runs twice in this process on the same data and seed: as the codec sends, then with packing
switched off (every array as ``FGM3`` sent it: signed integers in the narrowest width that holds them, the
rest in their declared type; the reference), and the script prints both totals (all parties' bytes sent)
and their ratio.  The totals are deterministic but for the lengths of ciphertexts, keys and masked values,
which move the vertical protocol's, HybridTree's training and FV-tree's by up to about 0.7% from one run to
the next.  a9a (generated data where it is absent): the node-level vertical
protocol and HybridTree under OU-2048 (3 trees; HybridTree 5 host and 2 guest levels, three guests, then
predicting the test set), a Federated Forest (shared labels, 10 trees of depth 8, then one-round
prediction), SimFL (two parties, 20 trees of depth 8, preprocessing included), FV-tree and horizontal
histogram aggregation (two parties, 10 trees of depth 6).  Writes bench/results/bytes_sent.json.

    python3 bench/bytes_sent.py [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results" / "bytes_sent.json"


def _data():
    from fedgrove.data import load_dataset
    from fedgrove.exceptions import DataError

    try:
        ds = load_dataset("a9a")
        X, Xt = (np.asarray(a.toarray() if hasattr(a, "toarray") else a, dtype=np.float64)
                 for a in (ds.train.X, ds.test.X))
        return "a9a", X, np.asarray(ds.train.y, dtype=np.float64), Xt, 60
    except DataError:
        rng = np.random.default_rng(0)
        X, Xt = (rng.integers(0, 2, size=(n, 40)).astype(np.float64) for n in (20_000, 8_000))
        y = (X[:, :10].sum(1) + X[:, 20:30].sum(1) + rng.normal(size=len(X)) > 10).astype(np.float64)
        return "generated", X, y, Xt, 20


def _runs(X, y, Xt, cut, he):
    """(name, function returning (training bytes, prediction bytes or None)) of every protocol."""
    from fedgrove.engine.forest import ForestParams
    from fedgrove.engine.gbdt import GBDTParams
    from fedgrove.protocols.forest.simulate import run_federated_forest
    from fedgrove.protocols.fvtree.simulate import run_fvtree
    from fedgrove.protocols.horizontal.simulate import run_horizontal
    from fedgrove.protocols.hybridtree.simulate import run_hybridtree
    from fedgrove.protocols.simfl.simulate import run_simfl
    from fedgrove.protocols.vertical.simulate import run_vertical

    def total(stats):
        return sum(v["total_sent"] for v in stats.values())

    h = len(X) // 2
    halves = [(X[:h], y[:h]), (X[h:], y[h:])]
    ids, test_ids = np.arange(len(X)), np.arange(len(Xt))
    part, test_part = (np.random.default_rng(s).integers(0, 3, n) for s, n in ((0, len(X)), (1, len(Xt))))

    def vertical():
        out = run_vertical([X[:, :cut], X[:, cut:]], y, GBDTParams(n_estimators=3, max_depth=6, seed=0), he)
        return total(out["stats"]), None

    def hybridtree():
        out = run_hybridtree(X[:, :cut], y, [(X[part == k][:, cut:], ids[part == k]) for k in range(3)],
                             GBDTParams(n_estimators=3, max_depth=7, seed=0), he, 5, 2, X_test_host=Xt[:, :cut],
                             test_guests=[(Xt[test_part == k][:, cut:], test_ids[test_part == k])
                                          for k in range(3)])
        return total(out["fit_stats"]), total(out["stats"]) - total(out["fit_stats"])

    def forest():
        out = run_federated_forest([X[:, :cut], X[:, cut:]], y, ForestParams(n_estimators=10, max_depth=8, seed=0),
                                   mode="shared", X_test_parts=[Xt[:, :cut], Xt[:, cut:]])
        return total(out["fit_stats"]), total(out["stats"]) - total(out["fit_stats"])

    def simfl():
        return total(run_simfl(halves, GBDTParams(n_estimators=20, max_depth=8, seed=0))["stats"]), None

    def fvtree():
        return total(run_fvtree(halves, GBDTParams(n_estimators=10, max_depth=6, seed=0))["stats"]), None

    def horizontal():
        return total(run_horizontal(halves, GBDTParams(n_estimators=10, max_depth=6, seed=0))["stats"]), None

    return [("vertical (OU-2048, 3 trees of depth 6)", vertical),
            ("HybridTree (OU-2048, 3 trees of 5 + 2 levels, 3 guests)", hybridtree),
            ("Federated Forest (shared labels, 10 trees of depth 8)", forest),
            ("SimFL (2 parties, 20 trees of depth 8, with preprocessing)", simfl),
            ("FV-tree (2 parties, 10 trees of depth 6)", fvtree),
            ("horizontal (2 clients, 10 trees of depth 6)", horizontal)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()

    import numba

    from fedgrove.crypto.he import keygen
    from fedgrove.experiments.report import machine
    from fedgrove.transport import codec

    numba.set_num_threads(1)
    name, X, y, Xt, cut = _data()
    he = keygen("ou", 2048)
    rows = {}
    for label, run in _runs(X, y, Xt, cut, he):
        packed = run()
        saved = codec._PACK_DESCRIPTORS
        codec._PACK_DESCRIPTORS = 1 << 62  # no array saves that many bytes: none is packed (FGM3's bytes)
        try:
            plain = run()
        finally:
            codec._PACK_DESCRIPTORS = saved
        for stage, k in (("training", 0), ("prediction", 1)):
            if packed[k] is None:
                continue
            rows[f"{label}: {stage}"] = {"fgm4": packed[k], "fgm3": plain[k], "ratio": packed[k] / plain[k]}
            print(f"{label}, {stage}: {packed[k]:,} bytes against {plain[k]:,} unpacked "
                  f"({packed[k] / plain[k]:.3f}x)", flush=True)
    result = {"dataset": name, "machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M:%S"), "bytes": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
