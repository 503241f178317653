"""How the engine's regression fits depend on the labels' spread, against the same labels at spread ~8.

A GBDT's split search breaks ties with a tolerance that is relative to the best gain above gains of 1e-3 and
absolute (about 1e-10) below (``fedgrove.engine.split``).  Regression labels spread over little give gains
that small.  This script fits the same table with its labels multiplied by 2^-k (exact in floating point,
so everything else about the fit is unchanged: a GBDT with lambda 0 and a forest are equivariant to that
scaling) and reports each fit's R^2 on its training rows beside the unscaled run's, and LightGBM's (one
thread) as a reference.  The engine warns of labels spread over less than
``fedgrove.engine.losses.CLOSE_LABELS`` for a GBDT; a forest's fit no longer depends on the scale (its ties
have no floor under mse, and its statistics' grid scales with the labels).

Then the same labels shifted by 0, 1e4, 1e8 and 1e12: a regression forest's impurities are E[y^2] - E[y]^2,
which loses a spread that is small beside the labels' size unless the labels are centred first (the forest
centres them on their midrange); the GBDT starts from the labels' mean.  Writes bench/results/label_scale.json.

    python bench/label_scale.py [--rows 2000 --seed 0]
"""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

import numpy as np

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

RESULTS = Path(__file__).resolve().parent / "results" / "label_scale.json"
POWERS = (0, 4, 7, 10, 14, 17, 20, 27)
OFFSETS = (0.0, 1e4, 1e8, 1e12)


def r2(y, p) -> float:
    return float(1.0 - np.mean((p - y) ** 2) / np.var(y))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    import lightgbm as lgb

    from fedgrove import ForestParams, GBDTParams, train_forest, train_gbdt
    from fedgrove.experiments.report import machine, write_json

    logging.getLogger("fedgrove").setLevel(logging.ERROR)  # the warning this script measures the reason for
    r = np.random.default_rng(args.seed)
    X = r.normal(size=(args.rows, 5))
    y0 = X[:, 0] + 0.5 * X[:, 1] ** 2 + 0.1 * r.normal(size=args.rows)

    def fits(y) -> dict:
        gbdt = train_gbdt(GBDTParams(objective="regression", n_estimators=100, learning_rate=0.1, reg_lambda=0.0,
                                     seed=args.seed, n_threads=1), X, y)
        forest = train_forest(ForestParams(task="regression", n_estimators=5, seed=args.seed, n_threads=1), X, y)
        light = lgb.LGBMRegressor(n_estimators=100, learning_rate=0.1, max_depth=6, num_leaves=64, reg_lambda=0.0,
                                  n_jobs=1, verbose=-1, random_state=args.seed).fit(X, y)
        return {"gbdt_r2": r2(y, gbdt.predict(X)), "forest_r2": r2(y, forest.predict(X)),
                "lightgbm_r2": r2(y, light.predict(X))}

    rows = [{"power": -k, "spread": float(np.ptp(y0 * 2.0 ** -k)), **fits(y0 * 2.0 ** -k)} for k in POWERS]
    shifted = [{"offset": c, **fits(y0 + c)} for c in OFFSETS]
    base = rows[0]
    for row in rows:
        row["gbdt_r2_over_unscaled"] = row["gbdt_r2"] / base["gbdt_r2"]
        row["forest_r2_over_unscaled"] = row["forest_r2"] / base["forest_r2"]
    out = {"rows": args.rows, "seed": args.seed, "machine": machine(),
           "settings": "GBDT 100 trees depth 6 lr 0.1 lambda 0; forest 5 trees; LightGBM 100 trees depth 6 "
                       "lambda 0, 1 thread; R^2 on the training rows",
           "results": rows, "shifted": shifted}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    write_json(RESULTS, out)
    print("| labels x | spread | GBDT R^2 (/ unscaled) | forest R^2 (/ unscaled) | LightGBM R^2 |")
    print("|---|---|---|---|---|")
    for row in rows:
        print(f"| 2^{row['power']} | {row['spread']:.2g} | {row['gbdt_r2']:.4f} ({row['gbdt_r2_over_unscaled']:.3f}) "
              f"| {row['forest_r2']:.4f} ({row['forest_r2_over_unscaled']:.3f}) | {row['lightgbm_r2']:.4f} |")
    print("\n| labels + | GBDT R^2 | forest R^2 | LightGBM R^2 |")
    print("|---|---|---|---|")
    for row in shifted:
        print(f"| {row['offset']:.0e} | {row['gbdt_r2']:.4f} | {row['forest_r2']:.4f} | {row['lightgbm_r2']:.4f} |")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
