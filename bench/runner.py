"""What `fedgrove simulate` adds around a protocol: each party's kernel threads, in one run.

SimFL on the whole a9a training file (`fedgrove partition dataset:a9a
--scheme horizontal --parties 2 --protocol simfl`), ``--trees`` trees of
depth 8, learning rate 0.1, run by `fedgrove simulate` in a fresh process
each time (checkpoints after every tree, as always): with each party's
kernel threads left to the runner (this machine's cores shared by the
parties) and with ``[params] n_threads`` set to every core for each party
(what every party took before 2026-11-25), alternately, ``--repeats`` times.
Reports each party's training seconds (the slower party's; preprocessing
excluded), medians and their ratio, and checks that both give the same model
file.  Needs the a9a file in the data directory.  Writes
bench/results/runner.json.

    python bench/runner.py [--trees 500 --repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results" / "runner.json"


def _fedgrove(*args, cwd=None):
    out = subprocess.run([sys.executable, "-m", "fedgrove.cli.main", *args], cwd=cwd, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"fedgrove {' '.join(args)} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trees", type=int, default=500)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    from fedgrove.experiments.report import machine, write_json

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    rows, models = {"shared": [], "every_core": []}, {}
    with tempfile.TemporaryDirectory() as tmp:
        parts = Path(tmp) / "parts"
        _fedgrove("partition", "dataset:a9a", "--scheme", "horizontal", "--parties", "2", "--protocol", "simfl",
                  "--out", str(parts))
        base = (parts / "federation.toml").read_text()
        params = f"n_estimators = {args.trees}\nmax_depth = 8\nlearning_rate = 0.1\n"
        base = re.sub(r"n_estimators = \d+\nmax_depth = \d+\nlearning_rate = [0-9.]+\n", params, base)
        if params not in base:
            raise SystemExit("the [params] partition wrote are not the ones this script expects")
        configs = {"shared": base, "every_core": base.replace(params, params + f"n_threads = {cores}\n")}
        for _ in range(args.repeats):
            for kind, text in configs.items():
                cfg = parts / f"{kind}.toml"
                cfg.write_text(text.replace('dir = "runs"', f'dir = "runs-{kind}"'))
                _fedgrove("simulate", str(cfg))
                out = parts / f"runs-{kind}"
                rows[kind].append(max(json.loads((out / f"party{k}.stats.json").read_text())["train_seconds"]
                                      for k in (0, 1)))
                model = json.loads((out / "party0.model.json").read_text())
                model["params"].pop("n_threads", None)  # the one setting the runs differ in
                models[kind] = json.dumps(model, sort_keys=True)
                print(f"{kind}: {rows[kind][-1]:.2f} s", flush=True)
    if models["shared"] != models["every_core"]:
        raise SystemExit("the two runs wrote different models")
    med = {k: float(np.median(v)) for k, v in rows.items()}
    res = {"protocol": "simfl", "dataset": "a9a (whole training file)", "parties": 2, "trees": args.trees,
           "depth": 8, "cores": cores, "repeats": args.repeats, "machine": machine(),
           "median_training_seconds": med, "ratio_every_core_over_shared": med["every_core"] / med["shared"],
           "runs": rows}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    write_json(RESULTS, res)
    print(f"SimFL through `fedgrove simulate`, {args.trees} trees: {med['shared']:.2f} s with the cores shared, "
          f"{med['every_core']:.2f} s with every core for each party (x{res['ratio_every_core_over_shared']:.2f}); "
          f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
