"""Peak memory of a vertical federation in one process: two parties, OU-2048, synthetic rows.

Each measurement runs in a fresh process (peak RSS is per process): first a run on ``--base-rows`` rows
(the process's own cost: interpreter, numba's kernels, HEU, the key), then the run on ``--rows``; their
difference over the extra rows is the memory a row costs at its peak.  ``--compare DIR`` runs the same in a
second process with another checkout's ``src`` on ``PYTHONPATH`` (e.g. a ``git worktree`` of an earlier
commit), alternately with this one, so that a change's effect is measured on the same machine in one run.
Writes bench/results/memory.json.

    python bench/memory.py [--rows 200000 --base-rows 12500 --trees 3 --repeats 1 --compare ../old/src]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "memory.json"
SRC = Path(__file__).resolve().parent.parent / "src"

CHILD = """
import json, resource, sys
import numpy as np
from fedgrove.crypto.he import keygen
from fedgrove.engine.gbdt import GBDTParams
from fedgrove.protocols.vertical.simulate import run_vertical
n, trees = int(sys.argv[1]), int(sys.argv[2])
X = np.random.default_rng(0).normal(size=(n, 20))
y = (X[:, 0] + X[:, 15] > 0).astype(float)
out = run_vertical([X[:, :10], X[:, 10:]], y, GBDTParams(n_estimators=trees, max_depth=4, max_bins=32, n_threads=2),
                   keygen("ou", 2048))
print(json.dumps({"peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "trees": out["model"].n_trees}))
"""


def peak(src: Path, rows: int, trees: int) -> float:
    env = {**os.environ, "PYTHONPATH": str(src)}
    done = subprocess.run([sys.executable, "-c", CHILD, str(rows), str(trees)], env=env, capture_output=True,
                          text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])["peak_mb"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--base-rows", type=int, default=12_500)
    ap.add_argument("--trees", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--compare", type=Path, help="another checkout's src folder, measured alternately")
    args = ap.parse_args()

    from fedgrove.experiments.report import machine, write_json

    sources = {"this": SRC} | ({"compare": args.compare.resolve()} if args.compare else {})
    runs = {name: [] for name in sources}
    for _ in range(args.repeats):
        for name, src in sources.items():
            base, full = peak(src, args.base_rows, args.trees), peak(src, args.rows, args.trees)
            runs[name].append({"base_peak_mb": base, "peak_mb": full,
                               "kb_per_row": (full - base) * 1024 / (args.rows - args.base_rows)})
            print(f"{name}: {args.base_rows} rows {base:.0f} MB, {args.rows} rows {full:.0f} MB peak "
                  f"({runs[name][-1]['kb_per_row']:.2f} kB a row)", flush=True)
    result = {"machine": machine(), "rows": args.rows, "base_rows": args.base_rows, "features": 20,
              "parties": 2, "he": "ou-2048", "trees": args.trees, "depth": 4,
              "sources": {k: str(v) for k, v in sources.items()}, "runs": runs}
    write_json(RESULTS, result)
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
