"""Vertical node-level GBDT benchmark: a9a, 2 parties, depth 6, in one run.

Variants: the same protocol without encryption (``plain``), HEU
Okamoto-Uchiyama 2048, HEU Paillier 2048, fedgrove's own Okamoto-Uchiyama
2048 on gmpy2 (the default where HEU is not installed), python-paillier 2048.  Slow
variants run fewer trees (``--trees-*``) and report per-tree figures.  Each
variant but python-paillier runs ``--repeats`` times (HEU Paillier:
``--repeats-paillier`` when given; the machine is shared and noisy) and
reports the median seconds per tree with every run's figure,
bytes per tree (all parties, both directions counted once as sent), and the
test AUC of its own run next to the plaintext run's AUC at the same number of
trees (the protocol is lossless, so they must be equal).  An extra OU run of
``--breakdown-trees`` trees times each HE operation (where a tree's time
goes); ``--paillier-rows-trees`` compares HEU Paillier with one and with the
default number of instances per gradient ciphertext (3), alternately, each
operation timed; ``--ou-rows-trees`` does the same for OU with one and two
(``[he] rows_per_ciphertext = 2``), with each layout's bytes per tree, on
a9a or (``--ou-rows-synthetic N``) on N synthetic rows.
Writes bench/results/vertical.json (or ``--out``, merging into what that file holds).

    python bench/vertical.py [--trees-plain 50 --trees-ou 50 --trees-paillier 3 --trees-gmpy2 10 --trees-phe 1
                              --repeats 3 --out FILE]

The two Okamoto-Uchiyama implementations against each other:

    python bench/vertical.py --trees-plain 0 --trees-ou 10 --trees-paillier 0 --trees-phe 0 --trees-gmpy2 10 \
        --breakdown-trees 0 --out bench/results/vertical_gmpy2.json

The issue's full run (HEU Paillier for all 50 trees, once; about 20 minutes here):

    python bench/vertical.py --trees-paillier 50 --repeats-paillier 1
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results" / "vertical.json"
FEDTREE_HE_S_PER_TREE = {"threads_2": 15.0, "threads_1": 29.0}  # measured on this machine (issue 3)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trees-plain", type=int, default=50)
    ap.add_argument("--trees-ou", type=int, default=50)
    ap.add_argument("--trees-paillier", type=int, default=3)
    ap.add_argument("--trees-phe", type=int, default=1)
    ap.add_argument("--trees-gmpy2", type=int, default=10, help="trees with fedgrove's own OU on gmpy2")
    ap.add_argument("--out", type=Path, default=RESULTS,
                    help=f"where to write (and merge) the figures (default {RESULTS})")
    ap.add_argument("--depth", type=int, default=6)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3, help="runs per variant (python-paillier: one)")
    ap.add_argument("--repeats-paillier", type=int, default=None,
                    help="runs of the HEU Paillier variant (default: --repeats)")
    ap.add_argument("--breakdown-trees", type=int, default=10,
                    help="an extra OU run of this many trees timing each HE operation (0: skip)")
    ap.add_argument("--paillier-rows-trees", type=int, default=0,
                    help="HEU Paillier runs of this many trees with 1 and with the default number of instances "
                         "per gradient ciphertext, alternately, --repeats times each, every HE operation timed "
                         "(0: skip)")
    ap.add_argument("--ou-rows-trees", type=int, default=0,
                    help="HEU OU runs of this many trees with 1 and 2 instances per gradient ciphertext, "
                         "alternately, --repeats times each, every HE operation timed and the bytes counted (0: skip)")
    ap.add_argument("--ou-rows-synthetic", type=int, default=0,
                    help="run the OU comparison on this many synthetic rows of 20 continuous features (two parties "
                         "of 10) instead of a9a (0: a9a)")
    args = ap.parse_args()

    import numba

    numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))
    from fedgrove import metrics
    from fedgrove.crypto.he import available_backends, keygen
    from fedgrove.data import load_dataset
    from fedgrove.engine.gbdt import GBDTParams
    from fedgrove.protocols.vertical.active import default_rows_per_ciphertext, packer_for
    from fedgrove.protocols.vertical.simulate import run_vertical

    ds = load_dataset("a9a")
    X, y, Xt, yt = ds.train.X, ds.train.y, ds.test.X, ds.test.y
    perm = np.random.default_rng(0).permutation(X.shape[1])
    parts = [np.sort(p) for p in np.array_split(perm, 2)]
    variants = [("plain", "plain", "plain", args.trees_plain), ("ou-2048", "heu", "ou", args.trees_ou),
                ("paillier-2048-heu", "heu", "paillier", args.trees_paillier),
                ("ou-2048-gmpy2", "gmpy2", "ou", args.trees_gmpy2),
                ("paillier-2048-phe", "phe", "paillier", args.trees_phe)]
    results = {"dataset": "a9a", "parties": 2, "depth": args.depth, "threads": args.threads,
               "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
               "date": time.strftime("%Y-%m-%d %H:%M:%S"), "fedtree_reference_s_per_tree": FEDTREE_HE_S_PER_TREE,
               "variants": {}}
    results["he_throughput"] = he_throughput(available_backends, keygen)
    results["he_throughput_measured"] = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "machine": results["machine"]}
    print("HE throughput (values/s):", json.dumps(results["he_throughput"]), flush=True)
    _save(results, args.out)
    plain_auc = {}
    for name, backend, scheme, n_trees in variants:
        if n_trees <= 0 or (backend == "heu" and "heu" not in available_backends()):
            continue
        params = GBDTParams(n_estimators=n_trees, max_depth=args.depth, n_threads=args.threads)
        he = keygen(scheme if backend != "plain" else "ou", 2048, backend)
        runs = []
        repeats = args.repeats_paillier if (scheme == "paillier" and args.repeats_paillier) else args.repeats
        for _ in range(1 if backend == "phe" else max(1, repeats)):
            t0 = time.perf_counter()
            out = run_vertical([X[:, p] for p in parts], y, params, he, X_test_parts=[Xt[:, p] for p in parts],
                               timeout=3600)
            runs.append((time.perf_counter() - t0) / n_trees)
        auc = metrics.auc(yt, 1 / (1 + np.exp(-out["raw"])))
        total_bytes = sum(s["total_sent"] for s in out["stats"].values())
        if backend == "plain":
            plain_auc[n_trees] = auc
        entry = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "trees": n_trees,
                 "rows_per_ciphertext": default_rows_per_ciphertext(he, packer_for("binary", y)),
                 "seconds_per_tree": float(np.median(runs)), "seconds_per_tree_runs": runs,
                 "bytes_per_tree": total_bytes / n_trees,
                 "test_auc": auc, "per_party_bytes_sent": {k: v["total_sent"] for k, v in out["stats"].items()}}
        if backend != "plain":
            if n_trees not in plain_auc:
                ref = run_vertical([X[:, p] for p in parts], y, params, keygen("ou", 2048, "plain"),
                                   X_test_parts=[Xt[:, p] for p in parts])
                plain_auc[n_trees] = metrics.auc(yt, 1 / (1 + np.exp(-ref["raw"])))
            entry["plaintext_auc_same_trees"] = plain_auc[n_trees]
            entry["speedup_vs_fedtree_2_threads"] = FEDTREE_HE_S_PER_TREE["threads_2"] / entry["seconds_per_tree"]
        results["variants"][name] = entry
        print(f"{name:>20}: {n_trees:3d} trees  {entry['seconds_per_tree']:7.2f} s/tree (median of {len(runs)})  "
              f"{entry['bytes_per_tree'] / 1e6:7.2f} MB/tree  AUC {auc:.4f}"
              + (f"  (plaintext {entry['plaintext_auc_same_trees']:.4f}, "
                 f"{entry['speedup_vs_fedtree_2_threads']:.1f}x FedTree)" if backend != "plain" else ""),
              flush=True)
        _save(results, args.out)
    if args.breakdown_trees > 0 and "heu" in available_backends():
        params = GBDTParams(n_estimators=args.breakdown_trees, max_depth=args.depth, n_threads=args.threads)
        results["ou_breakdown"] = ou_breakdown(lambda he: run_vertical([X[:, p] for p in parts], y, params, he,
                                                                       timeout=3600),
                                               keygen("ou", 2048, "heu"), args.breakdown_trees)
        print("OU seconds per tree by HE operation:", json.dumps(results["ou_breakdown"]["per_tree"]),
              f"(bin sums add up {results['ou_breakdown']['bin_sum_terms_per_tree']:,.0f} ciphertexts per tree)",
              flush=True)
        _save(results, args.out)
    if args.paillier_rows_trees > 0 and "heu" in available_backends():
        he = keygen("paillier", 2048, "heu")
        default = default_rows_per_ciphertext(he, packer_for("binary", y))
        params = GBDTParams(n_estimators=args.paillier_rows_trees, max_depth=args.depth, n_threads=args.threads)
        ab = rows_comparison(run_vertical, [X[:, p] for p in parts], y, params, he, (1, default), args.repeats)
        ab["ratio_default_to_one_row"] = ab["seconds_per_tree"][str(default)] / ab["seconds_per_tree"]["1"]
        results["paillier_rows"] = ab
        print(f"HEU Paillier s/tree with 1 / {default} instances per ciphertext (median of {args.repeats}): "
              f"{ab['seconds_per_tree']['1']:.2f} / {ab['seconds_per_tree'][str(default)]:.2f} "
              f"({ab['ratio_default_to_one_row']:.2f}x)", flush=True)
        _save(results, args.out)
    if args.ou_rows_trees > 0 and "heu" in available_backends():
        data, ox, oy = "a9a", [X[:, p] for p in parts], y
        if args.ou_rows_synthetic:  # many rows of continuous features, where encryption weighs more than on a9a
            rng = np.random.default_rng(0)
            Z = rng.normal(size=(args.ou_rows_synthetic, 20)).round(2)
            data, ox = f"synthetic {args.ou_rows_synthetic} x 20", [Z[:, :10], Z[:, 10:]]
            oy = (Z[:, 0] + Z[:, 10] + rng.normal(size=len(Z)) > 0).astype(float)
        params = GBDTParams(n_estimators=args.ou_rows_trees, max_depth=args.depth, n_threads=args.threads)
        ab = rows_comparison(run_vertical, ox, oy, params, keygen("ou", 2048, "heu"), (1, 2), args.repeats)
        ab.update(data=data, time_ratio_two_to_one=ab["seconds_per_tree"]["2"] / ab["seconds_per_tree"]["1"],
                  bytes_ratio_two_to_one=ab["bytes_per_tree"]["2"] / ab["bytes_per_tree"]["1"])
        results["ou_rows" if data == "a9a" else "ou_rows_synthetic"] = ab
        print(f"HEU OU s/tree with 1 / 2 instances per ciphertext ({data}, median of {args.repeats}): "
              f"{ab['seconds_per_tree']['1']:.2f} / {ab['seconds_per_tree']['2']:.2f} "
              f"({ab['time_ratio_two_to_one']:.2f}x); MB/tree {ab['bytes_per_tree']['1'] / 1e6:.2f} / "
              f"{ab['bytes_per_tree']['2'] / 1e6:.2f} ({ab['bytes_ratio_two_to_one']:.2f}x)", flush=True)
        _save(results, args.out)
    print(f"wrote {args.out}")


def rows_comparison(run_vertical, parts: list, y, params, he, counts: tuple, repeats: int) -> dict:
    """The vertical protocol with each number of instances per gradient ciphertext in ``counts``, alternately,
    ``repeats`` times: seconds per tree (each run's, their median), each HE operation's seconds
    (:func:`ou_breakdown`) and the bytes per tree (all parties)."""
    trees = params.n_estimators
    ab = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "machine": {"platform": platform.platform(),
                                                                    "cpus": os.cpu_count()},
          "trees": trees, "depth": params.max_depth, "threads": params.n_threads, "seconds_per_tree_runs": {},
          "bytes_per_tree": {}, "per_tree": {}}
    for _ in range(max(1, repeats)):
        for k in counts:
            kept = {}

            def run(h, k=k, kept=kept):
                kept["out"] = run_vertical(parts, y, params, h, timeout=3600, rows_per_ciphertext=k)

            b = ou_breakdown(run, he, trees)
            ab["seconds_per_tree_runs"].setdefault(str(k), []).append(b["seconds_per_tree"])
            ab["per_tree"].setdefault(str(k), []).append(b["per_tree"])
            ab["bytes_per_tree"][str(k)] = sum(s["total_sent"] for s in kept["out"]["stats"].values()) / trees
    ab["seconds_per_tree"] = {k: float(np.median(v)) for k, v in ab["seconds_per_tree_runs"].items()}
    return ab


def ou_breakdown(run, he, n_trees: int) -> dict:
    """Seconds per tree in each HE operation of a run (OU, or Paillier with ``--paillier-rows-trees``;
    outermost calls only, so nothing counts twice).

    ``select_sums`` called by the protocol is the passive party's homomorphic bin sums; ``compress`` includes
    the sums and scalar products it makes.  ``bin_sum_terms_per_tree`` counts the ciphertexts those bin sums
    add up (all stages).  The methods are wrapped for this run only.
    """
    import threading
    from collections import defaultdict

    from fedgrove.crypto.he import HEContext, HEUContext

    spent, calls, local = defaultdict(float), defaultdict(int), threading.local()
    terms = [0]  # ciphertexts the protocol's own select_sums calls add up (the bin sums; compression not counted)
    ops = ("encrypt", "select_sums", "compress", "add", "mul_const", "mul_scalar", "add_plain", "decrypt", "serialize",
           "deserialize")
    originals = {}
    for op in ops:
        owner = HEUContext if op in vars(HEUContext) else HEContext
        originals[op] = (owner, vars(owner)[op])

        def timed(self, *a, _f=vars(owner)[op], _op=op, **k):
            depth = getattr(local, "depth", 0)
            local.depth = depth + 1
            if _op == "select_sums" and depth == 0:
                terms[0] += sum(len(g) for g in a[1])
            t0 = time.perf_counter()
            try:
                return _f(self, *a, **k)
            finally:
                local.depth = depth
                if depth == 0:
                    spent[_op] += time.perf_counter() - t0
                    calls[_op] += 1
        setattr(owner, op, timed)
    try:
        t0 = time.perf_counter()
        run(he)
        total = time.perf_counter() - t0
    finally:
        for op, (owner, fn) in originals.items():
            setattr(owner, op, fn)
    per_tree = {op: spent[op] / n_trees for op in ops if calls.get(op)}
    per_tree["other (unencrypted protocol, messages)"] = total / n_trees - sum(per_tree.values())
    return {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "trees": n_trees, "seconds_per_tree": total / n_trees,
            "per_tree": per_tree, "calls": dict(calls), "bin_sum_terms_per_tree": terms[0] / n_trees}


def he_throughput(available_backends, keygen) -> dict:
    """Encryptions, additions and decryptions per second of each backend on 2048-bit keys (packed plaintexts)."""
    from fedgrove.crypto.packing import GHPacker

    out = {}
    rng = np.random.default_rng(0)
    for backend, scheme, n in (("heu", "ou", 4000), ("heu", "paillier", 2000), ("gmpy2", "ou", 4000),
                               ("phe", "paillier", 100)):
        if backend not in available_backends():
            continue
        he = keygen(scheme, 2048, backend)
        values = GHPacker(53, 1, 16).encode(rng.uniform(-1, 1, n), rng.uniform(0, 0.25, n))
        t0 = time.perf_counter()
        ct = he.encrypt(values)
        t1 = time.perf_counter()
        he.select_sums(ct, [list(range(n))] * 10)
        t2 = time.perf_counter()
        he.decrypt(ct)
        t3 = time.perf_counter()
        out[f"{backend}-{scheme}"] = {"encrypt_per_s": n / (t1 - t0), "add_per_s": 10 * n / (t2 - t1),
                                      "decrypt_per_s": n / (t3 - t2)}
    return out


def _save(results, path: Path = RESULTS):
    """Merge into the results file: variants not run this time keep their earlier figures."""
    path.parent.mkdir(parents=True, exist_ok=True)
    old = json.loads(path.read_text()) if path.exists() else {}
    kept = {k: {"date": old.get("date"), **v} for k, v in old.get("variants", {}).items()}
    variants = {**kept, **results["variants"]}
    extra = {k: old[k] for k in ("ou_breakdown", "paillier_rows", "ou_rows", "ou_rows_synthetic") if k in old}
    merged = {**extra, **results, "variants": variants}
    if not results["variants"]:  # the variants' machine and settings stay those of the run that measured them
        merged.update({k: old[k] for k in ("machine", "date", "depth", "threads") if k in old})
    order = {k: i for i, k in enumerate(old)}  # the file's keys stay in their order: a rerun diffs only its figures
    path.write_text(json.dumps(dict(sorted(merged.items(), key=lambda kv: order.get(kv[0], len(order)))),
                                  indent=2))


if __name__ == "__main__":
    main()
