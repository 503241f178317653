"""Encrypted histograms on a small table: the order of compression the code chooses against Horner's rule alone.

On a small table of continuous columns a party sends many more bin sums than
it holds gradient ciphertexts (a bin holds a row or two), and packing the sums
into plaintexts (multiplying them by ``2^W``) is most of a tree's time.
``HEContext.compressed_sums`` then multiplies the gradient ciphertexts instead
(docs/protocols.md, Compression).  This script runs, in one process,
federations like the README's quick start on scikit-learn's bundled
breast-cancer table (no download): the vertical protocol (3 parties, 20 trees of depth 4,
learning rate 0.3) and HybridTree (a host and 3 guests, 2 + 2 layers, 20
trees), each with the code as it is ("auto") and with ``compressed_sums``
held to Horner's rule ("horner", the reference), runs alternating.  It
reports the median seconds, the multiplications by a constant per run, the
ratio horner/auto, and checks that both orders train the same model (the
same training scores).  80% of the rows train (a seeded draw: 455 rows).
Writes bench/results/small_tables.json (or ``--out``).

    python bench/small_tables.py [--repeats 3] [--he ou|paillier] [--backend heu|phe]
                                 [--protocols vertical,hybridtree] [--out FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from pathlib import Path

import numpy as np

from fedgrove.crypto import he as he_module
from fedgrove.crypto.he import keygen
from fedgrove.data.partition import hybrid_partition, vertical_partition
from fedgrove.engine.gbdt import GBDTParams
from fedgrove.experiments.report import machine, write_json
from fedgrove.protocols.hybridtree.simulate import run_hybridtree
from fedgrove.protocols.vertical.simulate import run_vertical

RESULTS = Path(__file__).resolve().parent / "results" / "small_tables.json"
PARAMS = dict(n_estimators=20, learning_rate=0.3)


def table(seed: int = 0):
    from sklearn.datasets import load_breast_cancer

    X, y = load_breast_cancer(return_X_y=True)
    keep = np.sort(np.random.default_rng(seed).permutation(len(y))[:int(round(0.8 * len(y)))])
    return X[keep].astype(np.float64), y[keep].astype(np.float64)


class Counted:
    """Counts the ciphertexts multiplied by a constant (``mul_const``) on every context class while active."""

    def __init__(self):
        self.count = 0
        self._saved = []

    def __enter__(self):
        for cls in (c for c in vars(he_module).values() if isinstance(c, type)
                    and issubclass(c, he_module.HEContext) and "mul_const" in vars(c)):
            original = vars(cls)["mul_const"]

            def counting(ctx, ct, factor, _original=original):
                self.count += ct.size
                return _original(ctx, ct, factor)

            self._saved.append((cls, original))
            cls.mul_const = counting
        return self

    def __exit__(self, *exc):
        for cls, original in self._saved:
            cls.mul_const = original


class HornerOnly:
    """``compressed_sums`` held to Horner's rule (the order before the choice): the reference."""

    def __enter__(self):
        self._saved = he_module.HEContext.compressed_sums

        def horner(ctx, ct, groups, slot_bits, n_slots):
            return ctx.compress(ctx.select_sums(ct, groups, True), slot_bits, n_slots)

        he_module.HEContext.compressed_sums = horner
        return self

    def __exit__(self, *exc):
        he_module.HEContext.compressed_sums = self._saved


def run(protocol: str, X, y, scheme: str, backend: str):
    params = GBDTParams(max_depth=4, **PARAMS)
    if protocol == "vertical":
        part = vertical_partition(len(y), X.shape[1], 3, seed=0)
        parts = [X[:, s.features] for s in part.shards]
        return run_vertical(parts, y, params, keygen(scheme, 2048, backend), X_test_parts=parts)["raw"]
    part = hybrid_partition(y, X.shape[1], n_guests=3, seed=0)
    host, guests = part.shards[0], part.shards[1:]
    out = run_hybridtree(X[:, host.features], y, [(X[g.rows][:, g.features], g.rows) for g in guests], params,
                         keygen(scheme, 2048, backend), host_depth=2, guest_depth=2)
    return out["raw"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--he", default="ou", choices=["ou", "paillier"])
    ap.add_argument("--backend", default="heu", choices=["heu", "phe"])
    ap.add_argument("--protocols", default="vertical,hybridtree")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    if args.repeats < 1:
        ap.error(f"--repeats must be at least 1, got {args.repeats}")
    if args.backend == "phe" and args.he != "paillier":
        ap.error("--backend phe implements Paillier only: add --he paillier")
    protocols = args.protocols.split(",")
    for protocol in protocols:
        if protocol not in ("vertical", "hybridtree"):
            ap.error(f"--protocols: unknown protocol {protocol!r} (vertical, hybridtree)")
    X, y = table()
    results = {}
    for protocol in protocols:
        seconds = {"auto": [], "horner": []}
        multiplications, scores = {}, {}
        for r in range(args.repeats):
            for order in (("auto", "horner") if r % 2 == 0 else ("horner", "auto")):
                with Counted() as counted, HornerOnly() if order == "horner" else contextlib.nullcontext():
                    t = time.perf_counter()
                    raw = run(protocol, X, y, args.he, args.backend)
                    seconds[order].append(time.perf_counter() - t)
                multiplications[order] = counted.count
                scores.setdefault(order, raw)
                print(f"{protocol} {order}: {seconds[order][-1]:.2f} s, {counted.count} multiplications", flush=True)
        same = bool(np.array_equal(scores["auto"], scores["horner"]))
        if not same:
            raise SystemExit(f"{protocol}: the two orders trained different models")
        med = {k: statistics.median(v) for k, v in seconds.items()}
        results[protocol] = {"median_seconds": med, "runs": seconds, "multiplications_per_run": multiplications,
                             "ratio_horner_over_auto": med["horner"] / med["auto"], "same_model": same}
        print(f"{protocol}: auto {med['auto']:.2f} s, horner {med['horner']:.2f} s, "
              f"horner/auto {med['horner'] / med['auto']:.2f}x; multiplications {multiplications['auto']} "
              f"against {multiplications['horner']}; the same model", flush=True)
    out = {"table": "breast cancer (scikit-learn), 455 training rows x 30 features", "he": args.he,
           "backend": args.backend, "key_bits": 2048, "repeats": args.repeats, "trees": PARAMS["n_estimators"],
           "machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M:%S"), "results": results}
    write_json(args.out, out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
