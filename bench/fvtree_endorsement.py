"""FV-tree endorsement: overlap distances of honest uploads against a party that doubles its histograms.

Four parties with the paper's unbalanced partition (theta 0.8) on ``--dataset``
(cod-rna by default; 75/25 split of its training file), depth 6, 32 bins; one
party (``party1``) multiplies every histogram it uploads by 2.  Every verifier
computes the overlap distance D of every other party's upload for each layer;
with ``--threshold`` very high everything is accepted, so the run is the same
whatever the distances, and all of them are recorded.  Prints and writes
(bench/results/fvtree_endorsement.json) the honest uploads' 95th percentile
and maximum and the doubled uploads' minimum, by depth and by ranges of trees:
the default endorsement threshold must lie between them.

    python bench/fvtree_endorsement.py [--dataset cod-rna --trees 150]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results" / "fvtree_endorsement.json"


def _summary(d: np.ndarray, doubled: np.ndarray) -> dict:
    hon, dbl = d[~doubled], d[doubled]
    return {"honest_p95": float(np.percentile(hon, 95)), "honest_max": float(hon.max()),
            "doubled_min": float(dbl.min()), "n_honest": int(len(hon)), "n_doubled": int(len(dbl))}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="cod-rna")
    ap.add_argument("--trees", type=int, default=150)
    ap.add_argument("--parties", type=int, default=4)
    args = ap.parse_args()

    import numba

    numba.set_num_threads(1)
    import fedgrove.protocols.fvtree.party as fv
    from fedgrove.engine.gbdt import GBDTParams
    from fedgrove.experiments import simfl as exp
    from fedgrove.protocols.fvtree.simulate import run_fvtree

    records, sender = [], {}
    distance, endorse = fv.overlap_distance, fv._FVFinder._endorse

    def endorse_noting_senders(self, layer, got, uploads, candidates, local):
        sender.update({id(u): q for q, u in uploads.items()})
        return endorse(self, layer, got, uploads, candidates, local)

    def recorded_distance(upload, candidates, offsets, est_g, est_n):
        d = distance(upload, candidates, offsets, est_g, est_n)
        records.append((upload.tree, upload.layer, d, sender.get(id(upload)) == "party1"))
        return d

    fv._FVFinder._endorse, fv.overlap_distance = endorse_noting_senders, recorded_distance

    def double(party):
        party.privacy.histogram = lambda rows, depth, k, n: np.asarray(rows) * 2.0

    cfg = exp.Config()
    X, y, _, _ = exp.load(args.dataset, cfg)
    parts = exp.partition(y, args.parties, 0.8, cfg.seed)
    params = GBDTParams(n_estimators=args.trees, max_depth=6, learning_rate=0.1, max_bins=32)
    run_fvtree([(X[r], y[r]) for r in parts], params, fv.FVTreeOptions(threshold=1e9, noise="public"), timeout=3600,
               tamper={"party1": double})
    tree, depth, d, doubled = (np.array(c) for c in zip(*records))
    doubled = doubled.astype(bool)
    out = {"dataset": args.dataset, "parties": args.parties, "theta": 0.8, "trees": args.trees, "depth": 6,
           "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
           "date": time.strftime("%Y-%m-%d %H:%M:%S"), "default_threshold": fv.FVTreeOptions().threshold,
           "all": _summary(d, doubled), "by_depth": {}, "by_trees": {}}
    for k in np.unique(depth):
        out["by_depth"][str(int(k))] = _summary(d[depth == k], doubled[depth == k])
    for lo, hi in ((0, 10), (10, 50), (50, 100), (100, args.trees)):
        sel = (tree >= lo) & (tree < hi)
        if sel.any():
            out["by_trees"][f"{lo}-{hi}"] = _summary(d[sel], doubled[sel])
    for group in ("by_depth", "by_trees"):
        for key, v in out[group].items():
            print(f"{group[3:]} {key}: honest p95 {v['honest_p95']:.3f} max {v['honest_max']:.3f} | doubled min "
                  f"{v['doubled_min']:.3f}")
    a = out["all"]
    print(f"all: honest max {a['honest_max']:.3f}, doubled min {a['doubled_min']:.3f}, default threshold "
          f"{out['default_threshold']}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=2))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
