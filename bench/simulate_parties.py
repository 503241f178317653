"""Peak memory and time of an in-process HybridTree federation: a host and several guests in one process.

A host and ``--guests`` guests in one process (as ``fedgrove simulate`` and
the Python API run them), OU-2048 (HEU where installed), synthetic rows
(``--rows`` x 20 features: 8 at the host, 12 at every guest, each guest
holding an equal share of the instances), ``--trees`` trees of 3 + 2 layers.
Each measurement runs in a fresh process (peak RSS is per process): its peak
memory, the wall time from the key's creation to the trained model, and the
host's seconds a tree.  ``--compare DIR`` runs the same with another
checkout's ``src`` on ``PYTHONPATH`` (a ``git worktree`` of an earlier
commit), alternately with this one, so that a change is measured on the same
machine in one run; medians of ``--repeats``.  Writes
bench/results/simulate_parties.json (or ``--out``).

    python bench/simulate_parties.py [--guests 5 --rows 2000 --trees 3 --repeats 3 --compare ../old/src]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from statistics import median

RESULTS = Path(__file__).resolve().parent / "results" / "simulate_parties.json"
SRC = Path(__file__).resolve().parent.parent / "src"

CHILD = """
import json, resource, sys, time
import numpy as np
from fedgrove.crypto.he import keygen
from fedgrove.engine.gbdt import GBDTParams
from fedgrove.protocols.hybridtree.simulate import run_hybridtree
n, n_guests, trees = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
r = np.random.default_rng(0)
X = r.normal(size=(n, 20))
y = (X[:, 0] + X[:, 12] - X[:, 17] > 0).astype(float)
shares = np.array_split(r.permutation(n), n_guests)
t0 = time.perf_counter()
out = run_hybridtree(X[:, :8], y, [(X[ids][:, 8:], ids) for ids in shares],
                     GBDTParams(n_estimators=trees, max_bins=32, learning_rate=0.3, n_threads=1),
                     keygen("ou", 2048), host_depth=3, guest_depth=2)
seconds = time.perf_counter() - t0
print(json.dumps({"peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "seconds": seconds,
                  "tree_seconds": [float(s) for s in out["tree_seconds"]], "trees": len(out["model"].host_trees)}))
"""


def run(src: Path, rows: int, guests: int, trees: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(src)}
    done = subprocess.run([sys.executable, "-c", CHILD, str(rows), str(guests), str(trees)], env=env,
                          capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"the run with {src} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--guests", type=int, default=5)
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--trees", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--compare", type=Path, help="another checkout's src folder, measured alternately")
    ap.add_argument("--out", type=Path, default=RESULTS, help=f"where to write the figures (default {RESULTS})")
    args = ap.parse_args()
    if args.guests < 1 or args.rows < 10 * args.guests or args.trees < 1 or args.repeats < 1:
        ap.error(f"need --guests >= 1, --rows >= 10 a guest, --trees >= 1 and --repeats >= 1; got {args.guests}, "
                 f"{args.rows}, {args.trees}, {args.repeats}")

    sys.path.insert(0, str(SRC))
    from fedgrove.experiments.report import machine, write_json

    sources = {"this": SRC} | ({"compare": args.compare.resolve()} if args.compare else {})
    runs = {name: [] for name in sources}
    for src in sources.values():  # unrecorded: fills numba's cache of that source (compiling takes memory)
        run(src, 10 * args.guests, args.guests, 1)
    for _ in range(args.repeats):
        for name, src in sources.items():
            got = run(src, args.rows, args.guests, args.trees)
            runs[name].append(got)
            print(f"{name}: peak {got['peak_mb']:.0f} MB, {got['seconds']:.2f} s (trees "
                  f"{', '.join(f'{s:.2f}' for s in got['tree_seconds'])} s)", flush=True)
    medians = {name: {"peak_mb": median(r["peak_mb"] for r in rs), "seconds": median(r["seconds"] for r in rs)}
               for name, rs in runs.items()}
    for name, m in medians.items():
        print(f"{name}: median peak {m['peak_mb']:.0f} MB, {m['seconds']:.2f} s")
    if "compare" in medians:
        print(f"this / compare: memory {medians['this']['peak_mb'] / medians['compare']['peak_mb']:.2f}x, time "
              f"{medians['this']['seconds'] / medians['compare']['seconds']:.2f}x")
    result = {"machine": machine(), "guests": args.guests, "rows": args.rows, "features": 20, "host_features": 8,
              "he": "ou-2048", "trees": args.trees, "depth": "3 + 2", "threads": 1,
              "sources": {k: str(v) for k, v in sources.items()}, "medians": medians, "runs": runs}
    write_json(args.out, result)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
