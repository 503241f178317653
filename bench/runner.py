"""What `fedgrove simulate` adds around a protocol: each party's kernel threads, in one run.

SimFL on the whole a9a training file (`fedgrove partition dataset:a9a
--scheme horizontal --parties 2 --protocol simfl`), ``--trees`` trees of
depth 8, learning rate 0.1, run by `fedgrove simulate` in a fresh process
each time (checkpoints after every tree, as always): with each party's
kernel threads left to the runner (this machine's cores shared by the
parties) and with ``[params] n_threads`` set to every core for each party
(what every party took before 2026-11-25), alternately, ``--repeats`` times;
then the same two settings as two `fedgrove party` processes on 127.0.0.1
(gRPC with mutual TLS).  Reports each party's training seconds (the slower
party's; preprocessing excluded), medians and their ratio, and checks that
every run gives the same model file.  Needs the a9a file in the data
directory.  Writes bench/results/runner.json.

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
    rows = {f"{mode}_{kind}": [] for mode in ("simulate", "party") for kind in ("shared", "every_core")}
    models = {}
    with tempfile.TemporaryDirectory() as tmp:
        parts = Path(tmp) / "parts"
        _fedgrove("partition", "dataset:a9a", "--scheme", "horizontal", "--parties", "2", "--protocol", "simfl",
                  "--out", str(parts))
        base = (parts / "federation.toml").read_text()
        params = f"n_estimators = {args.trees}\nmax_depth = 8\nlearning_rate = 0.1\n"
        base = re.sub(r"n_estimators = \d+\nmax_depth = \d+\nlearning_rate = [0-9.]+\n", params, base)
        if params not in base:
            raise SystemExit("the [params] partition wrote are not the ones this script expects")
        extra = {"shared": "", "every_core": f"n_threads = {cores}\n"}
        _fedgrove("certs", "party0", "party1", "--out", str(parts / "certs"))
        for _ in range(args.repeats):
            for key in rows:
                mode, kind = key.split("_", 1)
                out = parts / f"runs-{key}"
                text = base.replace(params, params + extra[kind]).replace('dir = "runs"', f'dir = "{out.name}"')
                if mode == "simulate":
                    (parts / f"{key}.toml").write_text(text)
                    _fedgrove("simulate", str(parts / f"{key}.toml"))
                else:
                    _two_processes(parts, text, out)
                rows[key].append(max(json.loads((out / f"party{k}.stats.json").read_text())["train_seconds"]
                                     for k in (0, 1)))
                model = json.loads((out / "party0.model.json").read_text())
                model["params"].pop("n_threads", None)  # the one setting the runs differ in
                models[key] = json.dumps(model, sort_keys=True)
                print(f"{key}: {rows[key][-1]:.2f} s", flush=True)
    if len(set(models.values())) != 1:
        raise SystemExit("the runs wrote different models")
    med = {k: float(np.median(v)) for k, v in rows.items()}
    res = {"protocol": "simfl", "dataset": "a9a (whole training file)", "parties": 2, "trees": args.trees,
           "depth": 8, "cores": cores, "repeats": args.repeats, "machine": machine(),
           "median_training_seconds": med,
           "ratio_every_core_over_shared": {mode: med[f"{mode}_every_core"] / med[f"{mode}_shared"]
                                            for mode in ("simulate", "party")},
           "runs": rows}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    write_json(RESULTS, res)
    for mode in ("simulate", "party"):
        print(f"SimFL through `fedgrove {mode}`, {args.trees} trees: {med[mode + '_shared']:.2f} s with the cores "
              f"shared, {med[mode + '_every_core']:.2f} s with every core for each party "
              f"(x{res['ratio_every_core_over_shared'][mode]:.2f})")
    print(f"wrote {RESULTS}")


def _two_processes(parts: Path, federation: str, out: Path) -> None:
    """The federation's two parties as `fedgrove party` processes on 127.0.0.1 (gRPC, mutual TLS), from the
    [federation] and [params] of ``federation`` (the text `fedgrove partition` wrote, as edited)."""
    import socket

    shared = federation[federation.index("[federation]"):federation.index("[[party]]")]
    socks = [socket.socket() for _ in range(2)]  # both bound at once: two different free ports
    for sock in socks:
        sock.bind(("127.0.0.1", 0))
    ports = [sock.getsockname()[1] for sock in socks]
    for sock in socks:
        sock.close()
    procs = []
    for k in (0, 1):
        peer = 1 - k
        (parts / f"party{k}.toml").write_text(
            f'[party]\nname = "party{k}"\nrole = "party"\ndata = "party{k}.csv"\nlabel = "label"\n'
            f'listen = "127.0.0.1:{ports[k]}"\ncerts = "certs"\n\n[peers]\nparty{peer} = "127.0.0.1:{ports[peer]}"\n'
            f'\n[roles]\nparty{peer} = "party"\n\n{shared}\n[output]\ndir = "{out.name}"\n')
        cmd = [sys.executable, "-m", "fedgrove.cli.main", "party", str(parts / f"party{k}.toml")]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    for proc in procs:
        text, _ = proc.communicate(timeout=600)
        if proc.returncode != 0:
            raise SystemExit(f"fedgrove party failed ({proc.returncode}):\n{text}")


if __name__ == "__main__":
    main()
