"""Random forest (CART) on the histogram engine.

Classification (``gini``, ``entropy``) and regression (``mse``), bootstrap,
``max_features`` drawn per node (scikit-learn's way) or per tree (Federated
Forest's way), pre-pruning by depth, samples and impurity decrease.  Each
tree's random draws come from ``numpy.random.default_rng([seed, tree_index])``
through :func:`draw_tree`, which the Federated Forest protocol calls too, so a
federation reproduces the centralised forest tree for tree.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Callable

import numpy as np

from fedgrove.engine.binning import BinMapper, column_major
from fedgrove.engine.gbdt import check_sample_weight, check_xy, weighted_rows
from fedgrove.engine.grower import TreeGrower
from fedgrove.engine.losses import classes_from_labels
from fedgrove.engine.model import ForestModel, check_row_labels, names_of
from fedgrove.engine.params import Flag, Interval, OneOf, check_types, validate
from fedgrove.engine.splitter import CARTScorer, HistogramSplitFinder
from fedgrove.engine.sparse import table_work
from fedgrove.engine.threads import fit_threads, thread_limit
from fedgrove.exceptions import DataError, InvalidParameterError
from fedgrove.log import logger


@dataclass
class ForestParams:
    """Hyper-parameters of the random forest (names follow scikit-learn)."""

    task: str = "classification"
    n_estimators: int = 100
    criterion: str | None = None          # default: gini (classification) / mse (regression)
    max_depth: int | None = None
    min_samples_split: int = 2
    min_samples_leaf: int = 1
    min_impurity_decrease: float = 0.0
    max_features: str | int | float | None = "sqrt"
    feature_sampling: str = "node"        # "node" (scikit-learn) or "tree" (Federated Forest)
    bootstrap: bool = True
    max_bins: int = 255
    seed: int = 0
    n_threads: int | None = None

    CONSTRAINTS = {
        "task": OneOf(("classification", "regression")),
        "n_estimators": Interval(int, 1),
        "max_depth": Interval(int, 1, 64, allow_none=True),
        "min_samples_split": Interval(int, 2),
        "min_samples_leaf": Interval(int, 1),
        "min_impurity_decrease": Interval(float, 0),
        "feature_sampling": OneOf(("node", "tree")),
        "bootstrap": Flag(),
        "max_bins": Interval(int, 2, 255),
        "seed": Interval(int, 0),
        "n_threads": Interval(int, 1, allow_none=True),
    }

    def __post_init__(self):
        validate(self, self.CONSTRAINTS)
        if self.criterion is None:
            self.criterion = "gini" if self.task == "classification" else "mse"
        allowed = ("gini", "entropy") if self.task == "classification" else ("mse",)
        if self.criterion not in allowed:
            raise InvalidParameterError(f"criterion for {self.task} must be one of {list(allowed)}, "
                                        f"got {self.criterion!r}")
        mf = self.max_features
        ok = (mf is None or mf in ("sqrt", "log2") or (isinstance(mf, int) and not isinstance(mf, bool) and mf >= 1)
              or (isinstance(mf, float) and 0.0 < mf <= 1.0))
        if not ok:
            raise InvalidParameterError("max_features must be 'sqrt', 'log2', None, a positive integer or a "
                                        f"float in (0, 1], got {mf!r}")

    def n_features_drawn(self, n_features: int) -> int:
        mf = self.max_features
        if mf is None:
            k = n_features
        elif mf == "sqrt":
            k = int(math.sqrt(n_features))
        elif mf == "log2":
            k = int(math.log2(n_features))
        elif isinstance(mf, float):
            k = int(mf * n_features)
        else:
            k = mf
        return int(min(n_features, max(1, k)))

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class TreeDraw:
    """The random choices of one tree: bootstrap weights and (per-tree) features."""

    weights: np.ndarray            # float64 (n_samples,) multiplicity of each sample
    features: np.ndarray | None    # sorted feature indices (feature_sampling="tree") or None
    rng: np.random.Generator       # continues with the per-node draws


def draw_tree(params: ForestParams, tree_index: int, n_samples: int, n_features: int) -> TreeDraw:
    rng = np.random.default_rng([params.seed, tree_index])
    if params.bootstrap:
        weights = np.bincount(rng.integers(0, n_samples, n_samples), minlength=n_samples).astype(np.float64)
    else:
        weights = np.ones(n_samples)
    features = None
    if params.feature_sampling == "tree":
        features = np.sort(rng.choice(n_features, params.n_features_drawn(n_features), replace=False))
    return TreeDraw(weights, features, rng)


def node_feature_sampler(params: ForestParams, draw: TreeDraw, n_features: int) -> Callable:
    """``allowed(layer)`` for the grower: which features each node may split on."""
    k = params.n_features_drawn(n_features)
    if draw.features is not None:
        mask = np.zeros(n_features, dtype=bool)
        mask[draw.features] = True
        return lambda layer: np.broadcast_to(mask, (len(layer), n_features))

    def per_node(layer):
        # k distinct features per node: the k smallest of uniform keys (one draw for the whole layer)
        keys = draw.rng.random((len(layer), n_features))
        chosen = np.argpartition(keys, k - 1, axis=1)[:, :k] if k < n_features else None
        allowed = np.ones((len(layer), n_features), dtype=bool)
        if chosen is not None:
            allowed[:] = False
            np.put_along_axis(allowed, chosen, True, axis=1)
        return allowed

    return per_node


def forest_stats(task: str, y: np.ndarray, weights: np.ndarray, n_classes: int,
                 grid: tuple[int, int] | None = None) -> np.ndarray:
    """Per-sample statistics: weighted one-hot labels, or (w, w*y, w*y^2) on the fixed-point ``grid``
    (:func:`mse_grid`; default: computed from ``y`` and the weights' sum, the row count for bootstrap counts)."""
    if task == "classification":
        stats = np.zeros((len(y), n_classes))
        stats[np.arange(len(y)), y.astype(np.int64)] = weights
        return stats
    q1, q2 = grid if grid is not None else mse_grid(y, float(weights.sum()))
    return np.column_stack([weights, np.ldexp(np.rint(np.ldexp(weights * y, q1)), -q1),
                            np.ldexp(np.rint(np.ldexp(weights * y * y, q2)), -q2)])


def label_offset(y: np.ndarray) -> float:
    """The constant a regression forest subtracts from its labels before growing a tree, and adds back to the
    tree's values: the labels' midrange.  Node impurities are E[y^2] - E[y]^2 on a fixed-point grid scaled to
    the largest |y|, which loses a spread that is small beside the labels' size (labels 1e8 + N(0, 1): R^2 0 on
    the training rows); centred labels keep it.  The label holder of a federation computes the same constant
    from the same labels, so the trees stay the engine's."""
    y = np.asarray(y, dtype=np.float64)
    return float(y.min() / 2 + y.max() / 2) if len(y) else 0.0


def mse_grid(y: np.ndarray, total_weight: float) -> tuple[int, int]:
    """Fractional bits (possibly negative) of the grids that w*y and w*y^2 are rounded to.

    Every sum of a tree's statistics is then a multiple of the grid below
    2^52 grid units, so float64 adds and subtracts them exactly, in any order:
    histograms built here, summed by a federation in another order, or
    decrypted from fixed-point sums (Federated Forest's encrypted labels) are
    bit-identical, and so are the trees.  The rounding is below 2^-52 of the
    largest possible sum (``total_weight * max|y|``, ``total_weight *
    max y^2``).
    """
    top = float(np.max(np.abs(y))) if len(y) else 0.0
    if not np.isfinite(total_weight * top * top):  # the sums of y^2 leave float64's range
        raise DataError(f"regression labels {top:.3g} from the middle of their range overflow the squared sums of "
                        f"{total_weight:g} rows (rows x that^2 must stay below 1.8e308): divide the label by a power "
                        f"of ten, and the predictions scale back by it")
    return 52 - _bits_above(total_weight * top), 52 - _bits_above(total_weight * top * top)


def _bits_above(x: float) -> int:
    """The exponent b of the smallest power of two 2^b at or above ``x`` (0 for 0), no less than -900 so that the
    grid's scale, 2^(52 - b), is a float (Federated Forest's packing takes it): labels x 2^-k get grids x 2^-k, so a
    forest's fit does not depend on the labels' scale.  (Before, ``ceil(log2(x + 1))`` held sums below 1, labels
    spread over little, to a grid of 2^-51: labels within 1e-7 of each other fit R^2 0.)"""
    return max(int(np.ceil(np.log2(x))), -900) if x > 0 else 0


def regression_grid(y: np.ndarray, weights: np.ndarray | None = None) -> tuple[int, int]:
    """The :func:`mse_grid` of every tree of a regression forest on labels ``y`` (the rows' weights: from
    :func:`forest_weights`, None for 1 each): no tree's draws weigh more than the rows drawn among, times the
    heaviest weight, so this one grid suits every tree, as a federation's fixed-point layout must."""
    if weights is None:
        return mse_grid(y, float(len(y)))
    kept = weights > 0
    return mse_grid(y[kept], float(kept.sum()) * float(weights.max()))


def forest_weights(sample_weight: np.ndarray) -> np.ndarray:
    """Checked row weights (:func:`~fedgrove.engine.gbdt.check_sample_weight`) as a forest grows with them:
    those of positive weight rescaled to average 1 and put on the grid of :func:`on_weight_grid` for their
    count of bootstrap draws; 0 where the weight is 0, or so small beside the others that it is 0 on that grid
    (below 2^-52 of the largest total of the draws): the row is then left out before the draws, and of the
    average, as a row of weight 0 is."""
    kept = sample_weight > 0
    while True:  # (a row found negligible is left out of the average too, as a row of weight 0 is)
        w = sample_weight[kept]
        n = len(w)
        on_grid = on_weight_grid(w * (n / w.sum()), n)
        if on_grid.all():  # (the heaviest row is 1 or more: never 0)
            break
        kept[np.flatnonzero(kept)[on_grid == 0]] = False
    out = np.zeros(len(sample_weight))
    out[kept] = on_grid
    return out


def weight_fraction_bits(weights: np.ndarray) -> int:
    """The fewest bits below the binary point that hold every one of ``weights`` (from :func:`forest_weights`)
    exactly: 0 for whole numbers; at most the grid's."""
    for bits in range(0, 1100):
        scaled = np.ldexp(weights, bits)
        if np.array_equal(scaled, np.rint(scaled)):
            return bits
    raise ValueError("weights off every binary grid")  # (finite floats all lie on the grid of 2^-1074)


def on_weight_grid(weights: np.ndarray, n_draws: int) -> np.ndarray:
    """``weights`` rounded to the fixed-point grid on which every sum of ``n_draws`` of them (a tree's bootstrap
    draws) stays below 2^52 grid units, so that float64 adds and subtracts them exactly, as it does bootstrap
    counts: a child's histogram is its parent's minus its sibling's, and with weights off the grid a class
    absent from a child kept a residue of 1e-16 (an impure node, split again, and a probability of -1e-16);
    weights rescaled to average 1 only to rounding (0.001 each) are 1 again.  The rounding is below 2^-52 of
    the largest sum."""
    top = float(n_draws) * float(np.max(weights))
    q = 52 - int(np.ceil(np.log2(top + 1.0)))
    return np.ldexp(np.rint(np.ldexp(weights, q)), -q)


def train_forest(params: ForestParams, X, y, bin_mapper: BinMapper | None = None, feature_names=None,
                 progress: Callable[[int, int], None] | None = None, sample_weight=None) -> ForestModel:
    """Train a random forest; labels 0..K-1 for classification (``feature_names``: as for
    :func:`~fedgrove.engine.gbdt.train_gbdt`).

    ``sample_weight``: each row's weight, finite and non-negative.  A row of weight 0 is left out before the
    bootstrap draws (as is one below 2^-52 of the draws' total: :func:`forest_weights`); the others' weights,
    rescaled to average 1, multiply their bootstrap draws in the impurities, the leaf values,
    ``min_samples_leaf`` and ``min_samples_split`` (which therefore count rows of average weight) and the bins'
    quantiles.  As with scikit-learn's forests, a whole-number weight k is not
    k copies of the row: the bootstrap draws rows, not copies."""
    check_types("train_forest(params, X, y, ...)", params=(params, ForestParams))
    feature_names = names_of(X, feature_names)
    if sample_weight is not None:  # (check_xy compares X's and y's row labels)
        check_row_labels({"X": X, "y": y, "sample_weight": sample_weight})
    X, y = check_xy(X, y)
    if sample_weight is not None:
        sample_weight = check_sample_weight(sample_weight, len(y))
    n, n_features = X.shape
    mf = params.max_features
    if isinstance(mf, int) and not isinstance(mf, bool) and mf > n_features:
        logger.warning("max_features = %d, but the data has %d features: every tree tries all of them at every "
                       "split", mf, n_features)
    n_classes = 1
    if params.task == "classification":
        if np.any(y != np.round(y)) or y.min() < 0:
            raise DataError("classification labels must be integers 0..K-1")
        n_classes = classes_from_labels(y)  # (of every row's label, kept or not)
    if sample_weight is not None:
        X, y, sample_weight = weighted_rows(X, y, forest_weights(sample_weight))
        n = len(y)
    offset, grid = 0.0, None
    if params.task == "regression":
        offset = label_offset(y)
        y = y - offset
        grid = regression_grid(y, sample_weight)
    with thread_limit(params.n_threads):  # the binning's kernels too
        if bin_mapper is None:
            bin_mapper = BinMapper(params.max_bins, seed=params.seed).fit(X, sample_weight)
        X_binned = bin_mapper.transform(X)
    thresholds = bin_mapper.thresholds()
    X_columns = column_major(X_binned)
    model = ForestModel(params.task, n_classes, bin_mapper, params.to_dict(), feature_names)
    with fit_threads(params.n_threads, lambda: table_work(X_binned, bin_mapper.feature_offsets)):
        for t in range(params.n_estimators):
            draw = draw_tree(params, t, n, n_features)
            if sample_weight is not None:
                draw.weights *= sample_weight
            tree = grow_forest_tree(params, draw, X_binned, y, bin_mapper, thresholds, n_classes, X_columns, grid)
            if offset:
                tree.values += offset
            model.add_tree(tree)
            if progress is not None:
                progress(t + 1, params.n_estimators)
    return model


def grow_forest_tree(params, draw, X_binned, y, bin_mapper, thresholds, n_classes, X_columns=None, grid=None):
    """One tree of :func:`train_forest` (``grid``: a regression's :func:`regression_grid`; default: this tree's
    :func:`mse_grid`)."""
    stats = forest_stats(params.task, y, draw.weights, n_classes, grid)
    root = np.nonzero(draw.weights > 0)[0]
    scorer = CARTScorer(params.criterion, float(draw.weights.sum()), params.min_samples_leaf)
    finder = HistogramSplitFinder(X_binned, bin_mapper.feature_offsets, bin_mapper.missing_codes, thresholds, stats,
                                  scorer, root_samples=root,
                                  allowed=node_feature_sampler(params, draw, X_binned.shape[1]), features=draw.features,
                                  X_columns=X_columns)
    grower = TreeGrower(finder, params.max_depth, scorer.leaf_value, min_samples_split=params.min_samples_split,
                        min_split_gain=params.min_impurity_decrease, gain_inclusive=True)
    return grower.grow()
