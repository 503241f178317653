"""TFL: tree-level federated boosting, the baseline HybridTree and SimFL compare against.

Each party holds labels for its own instances and boosts whole trees on its
own data in turn; a finished tree is shared with everyone, so the gradients
of the next party's tree account for all earlier trees.  Parties may hold
different instances (horizontal) and different feature sets (HybridTree's
guests, whose tables the paper assumes labelled for this baseline).

This is a simulation over the joined table: it is a reference point for
accuracy, and it trains exactly what the tree-level protocol trains (each tree
sees only its party's rows and columns), but it moves no messages.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedgrove.engine.gbdt import GBDTParams, LocalGrower, RoundSampler, check_xy
from fedgrove.engine.losses import objective_for
from fedgrove.engine.model import GBDTModel, names_of
from fedgrove.engine.params import check_types
from fedgrove.engine.tree import RankedRows, Tree
from fedgrove.exceptions import InvalidParameterError
from fedgrove.protocols import refuse_unsupported

SCHEDULES = ("round_robin", "blocks")


@dataclass
class PartyView:
    """One party's rows and columns of the joined table."""

    rows: np.ndarray
    features: np.ndarray


def tree_schedule(n_trees: int, sizes: list[int], schedule: str = "round_robin") -> list[int]:
    """Which party trains each tree: in turn, or in blocks proportional to the parties' data shares."""
    if schedule not in SCHEDULES:
        raise InvalidParameterError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    k = len(sizes)
    if schedule == "round_robin":
        return [t % k for t in range(n_trees)]
    share = np.asarray(sizes, dtype=np.float64) / float(np.sum(sizes))
    counts = np.floor(share * n_trees).astype(int)
    for j in np.argsort(-(share * n_trees - counts), kind="stable")[: n_trees - counts.sum()]:
        counts[j] += 1  # largest remainders
    return [j for j in range(k) for _ in range(counts[j])]


def train_tfl(X, y, views: list[PartyView], params: GBDTParams, schedule: str = "round_robin") -> GBDTModel:
    """Boost ``params.n_estimators`` rounds, each grown by one party on its own rows and columns.

    The returned model's trees refer to the joined table's columns, so it
    predicts on full records like the ALL-IN model (a DataFrame's columns are kept as the features' names, so
    that the model matches a DataFrame given to ``predict`` by name).
    """
    check_types("train_tfl", params=(params, GBDTParams))
    names = names_of(X)
    X, y = check_xy(X, y)
    if not views:
        raise InvalidParameterError("TFL needs at least one party")
    refuse_unsupported(params, "TFL")
    objective = objective_for(params.objective, params.n_classes, y)
    y = objective.check_labels(y)
    K = objective.n_outputs
    base = objective.init_score(y) if params.base_score == "auto" else np.full(K, float(params.base_score))
    raw = np.tile(base, (len(y), 1))
    model = GBDTModel(params.objective, objective.n_classes, base, params=params.to_dict(), feature_names=names)
    model.n_features = X.shape[1]
    prepared = []
    for v in views:
        rows, feats = np.asarray(v.rows, dtype=np.int64), np.asarray(v.features, dtype=np.int64)
        if len(rows) == 0 or len(feats) == 0:
            raise InvalidParameterError("every TFL party needs at least one row and one feature")
        # subsample / colsample_bytree: each party draws the rows and features of its rounds from its own generator
        prepared.append((rows, feats, LocalGrower(X[np.ix_(rows, feats)], params),
                         RoundSampler(params, len(rows), len(feats), seed=[params.seed, 67, len(prepared)])))
    ranked = RankedRows(X)  # each party's tree is routed through every row of the joined table
    order = tree_schedule(params.n_estimators, [len(v.rows) for v in views], schedule)
    for party in order:
        rows, feats, grower, sampler = prepared[party]
        g, h = objective.gradients(y[rows], raw[rows])
        sampled, features = sampler.next()
        for c in range(K):
            tree = _to_global_features(grower.grow(g[:, c], h[:, c], sampled, features)[0], feats, party)
            model.add_tree(tree, c)
            raw[:, c] += tree.values[ranked.leaves(tree), 0]
    return model


def _to_global_features(tree: Tree, feats: np.ndarray, party: int) -> Tree:
    nodes = tree.nodes.copy()
    internal = nodes["feature"] >= 0
    nodes["feature"][internal] = feats[nodes["feature"][internal]]
    nodes["owner"][internal] = party
    return Tree(nodes, tree.values.copy())
