"""Per-tree checkpoint cost: the append-only tree log against rewriting the whole state, in one run.

Trains ``--trees`` trees of depth 8 on a9a (the engine), then saves a
checkpoint after each tree as a party does: once with
:class:`~fedgrove.runner.checkpoint.CheckpointStore` (each finished tree's
JSON appended once to a log, a small state file rewritten) and once by
rewriting the whole state atomically each time (the earlier scheme, with
each tree's JSON text cached).  Reports seconds and bytes written for each,
median of ``--repeats``.

Then what checkpoints cost a federation whose trees are cheap, as
``fedgrove simulate`` and ``fedgrove party`` run it (every party
checkpoints its whole model and scores after every tree): SimFL on a9a (75%
of the training file), two parties with a balanced partition,
``--federation-trees`` trees of depth 8, one kernel thread per party, in one
process, trained without checkpoints, with a checkpoint store per party
saving after every tree, and with stores saving after every ``--every``
trees (``[federation] checkpoint_every``), in turn, ``--repeats`` times: the
training seconds (the slower party's) of each, median, and their ratios to
the run without; the models must be equal.  Writes
bench/results/checkpoint.json.

    python bench/checkpoint.py [--trees 300 --repeats 3 --federation-trees 500 --every 10]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results" / "checkpoint.json"


def _written(d: Path, sizes: dict) -> int:
    """Bytes written since the last call: whole files that are rewritten, growth of the append-only log."""
    total = 0
    for f in d.iterdir():
        size = f.stat().st_size
        total += size - sizes.get(f.name, 0) if f.suffix == ".trees" else size
        sizes[f.name] = size
    return total


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trees", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--federation-trees", type=int, default=500, help="SimFL's trees (0: skip that part)")
    ap.add_argument("--every", type=int, default=10, help="the rounds between checkpoints of the third run")
    args = ap.parse_args()
    from fedgrove import jsontext
    from fedgrove.engine.gbdt import GBDTParams, train_gbdt
    from fedgrove.engine.model import atomic_write_text
    from fedgrove.experiments import simfl as exp
    from fedgrove.experiments.report import machine, write_json
    from fedgrove.runner.checkpoint import CheckpointStore

    X, y, _, _ = exp.load("a9a", exp.Config())
    trees = train_gbdt(GBDTParams(n_estimators=args.trees, max_depth=8), X, y).trees

    def states():
        for k in range(1, len(trees) + 1):
            yield {"trees_done": k, "model": {"trees": [t.to_dict() for t in trees[:k]]}}

    rows = {"log": [], "rewrite": []}
    written = {}
    for _ in range(args.repeats):
        for kind in rows:
            with tempfile.TemporaryDirectory() as tmp:
                d, sizes, total = Path(tmp), {}, 0
                store, path = CheckpointStore(d / "p.checkpoint.json"), d / "p.checkpoint.json"
                t0 = time.perf_counter()
                for state in states():
                    if kind == "log":
                        store.save(state)
                    else:
                        atomic_write_text(path, jsontext.dumps(state))
                    total += _written(d, sizes)
                rows[kind].append(time.perf_counter() - t0)
                written[kind] = total
    out = {"dataset": "a9a", "trees": args.trees, "depth": 8, "repeats": args.repeats, "machine": machine(),
           "median_seconds": {k: float(np.median(v)) for k, v in rows.items()},
           "mb_written": {k: v / 1e6 for k, v in written.items()},
           "runs": rows}
    out["ratio_rewrite_over_log_seconds"] = out["median_seconds"]["rewrite"] / out["median_seconds"]["log"]
    if args.federation_trees:
        out["federation"] = federation(X, y, args.federation_trees, args.repeats, args.every)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    write_json(RESULTS, out)
    print(f"{args.trees} checkpoints: tree log {out['median_seconds']['log']:.2f} s, "
          f"{out['mb_written']['log']:.1f} MB written; whole-state rewrite {out['median_seconds']['rewrite']:.2f} s, "
          f"{out['mb_written']['rewrite']:.1f} MB (x{out['ratio_rewrite_over_log_seconds']:.2f} time); wrote {RESULTS}")


def federation(X, y, n_trees: int, repeats: int, every: int) -> dict:
    """SimFL's training seconds without and with per-party checkpoints (see the module's docstring)."""
    import json

    from fedgrove.engine.gbdt import GBDTParams
    from fedgrove.experiments import simfl as exp
    from fedgrove.protocols.simfl.simulate import run_simfl
    from fedgrove.runner.checkpoint import CheckpointStore

    parts = exp.partition(y, 2, None, 0)
    params = GBDTParams(n_estimators=n_trees, max_depth=8, learning_rate=0.1, n_threads=1)
    data = [(X[p], y[p], p) for p in parts]
    run_simfl(data, GBDTParams(n_estimators=2, max_depth=3))  # compile the kernels
    every_k = f"with_every_{every}"
    rows, models = {"without": [], "with": [], every_k: []}, {}
    for _ in range(repeats):
        for kind in rows:
            with tempfile.TemporaryDirectory() as tmp:
                stores = {f"party{k}": CheckpointStore(Path(tmp) / f"party{k}.checkpoint.json") for k in (0, 1)} \
                    if kind != "without" else None
                for store in (stores or {}).values():
                    store.every = every if kind == every_k else 1
                out = run_simfl(data, params, checkpoints=stores)
            rows[kind].append(max(t["train_seconds"] for t in out["timings"].values()))
            models[kind] = json.dumps(out["model"].to_dict())
    if len(set(models.values())) != 1:
        raise SystemExit("SimFL with checkpoints grew another model than without")
    med = {k: float(np.median(v)) for k, v in rows.items()}
    res = {"protocol": "simfl", "parties": 2, "trees": n_trees, "depth": 8, "threads_per_party": 1,
           "checkpoint_every": every, "median_training_seconds": med,
           "ratio_with_over_without": med["with"] / med["without"],
           f"ratio_{every_k}_over_without": med[every_k] / med["without"], "runs": rows}
    print(f"SimFL, {n_trees} trees: training {med['without']:.2f} s without checkpoints, {med['with']:.2f} s with "
          f"one per party after every tree (x{res['ratio_with_over_without']:.2f}), {med[every_k]:.2f} s with one "
          f"after every {every} trees (x{res[f'ratio_{every_k}_over_without']:.2f})")
    return res


if __name__ == "__main__":
    main()
