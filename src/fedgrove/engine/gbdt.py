"""Gradient-boosted decision trees on the histogram engine.

Functional core: :func:`train_gbdt` takes :class:`GBDTParams` and arrays and
returns a :class:`~fedgrove.engine.model.GBDTModel`.  Objectives: ``binary``
(logistic), ``multiclass`` (softmax, one tree per class per round),
``regression`` (squared error).  Early stopping raises
:class:`EarlyStopException` from a callback, as LightGBM does.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Callable

import numpy as np

from fedgrove.engine.binning import BinMapper, column_major
from fedgrove.engine.grower import TreeGrower
from fedgrove.engine.histogram import fill_stats
from fedgrove.engine.losses import check_gradient_range, objective_for
from fedgrove.engine.model import TEXT_FEATURES, GBDTModel, as_numbers, by_names, check_row_labels, names_of
from fedgrove.engine.params import Interval, OneOf, check_types, validate
from fedgrove.engine.sparse import root_histograms_by_class, table_work
from fedgrove.engine.splitter import FinderBuffers, GBDTScorer, HistogramSplitFinder
from fedgrove.engine.tree import PackedEnsemble
from fedgrove.engine.threads import fit_threads, thread_limit
from fedgrove.exceptions import DataError, InvalidParameterError
from fedgrove.log import logger
from fedgrove.metrics import get_metric, ranks_defined, weighed_labels


@dataclass
class GBDTParams:
    """Hyper-parameters of gradient boosting (names follow XGBoost/LightGBM).

    ``gamma`` is the least gain a split must have, the gain being
    ``1/2 [G_L^2/(H_L+lambda) + G_R^2/(H_R+lambda) - G^2/(H+lambda)]`` as in
    the papers; XGBoost's and LightGBM's gains lack the 1/2, so their
    ``gamma`` / ``min_gain_to_split`` of g is fedgrove's g/2.  A split below
    it is not made (XGBoost prunes the grown tree instead).
    """

    objective: str = "binary"
    n_estimators: int = 100
    learning_rate: float = 0.1
    max_depth: int = 6
    reg_lambda: float = 1.0
    gamma: float = 0.0
    min_child_weight: float = 1e-3
    min_samples_leaf: int = 1
    max_bins: int = 255
    subsample: float = 1.0
    colsample_bytree: float = 1.0
    base_score: float | str = "auto"
    n_classes: int | None = None
    early_stopping_rounds: int | None = None
    eval_metric: str | None = None
    seed: int = 0
    n_threads: int | None = None

    CONSTRAINTS = {
        "objective": OneOf(("binary", "multiclass", "regression")),
        "n_estimators": Interval(int, 1),
        "learning_rate": Interval(float, 0, None, low_open=True),
        "max_depth": Interval(int, 1, 64),
        "reg_lambda": Interval(float, 0),
        "gamma": Interval(float, 0),
        "min_child_weight": Interval(float, 0),
        "min_samples_leaf": Interval(int, 1),
        "max_bins": Interval(int, 2, 255),
        "subsample": Interval(float, 0, 1, low_open=True),
        "colsample_bytree": Interval(float, 0, 1, low_open=True),
        "n_classes": Interval(int, 2, allow_none=True),
        "early_stopping_rounds": Interval(int, 1, allow_none=True),
        "seed": Interval(int, 0),
        "n_threads": Interval(int, 1, allow_none=True),
    }

    def __post_init__(self):
        validate(self, self.CONSTRAINTS)
        if not (self.base_score == "auto" or (isinstance(self.base_score, (int, float))
                                              and np.isfinite(self.base_score))):
            raise InvalidParameterError(f"base_score must be 'auto' or a finite number, got {self.base_score!r}")
        if self.eval_metric is not None:
            get_metric(self.eval_metric)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class CallbackEnv:
    """What a callback sees after each boosting round."""

    iteration: int
    n_iterations: int
    eval_result: float | None
    model: GBDTModel
    elapsed: float


class EarlyStopException(Exception):
    def __init__(self, best_iteration: int, best_score: float):
        super().__init__(best_iteration)
        self.best_iteration = best_iteration
        self.best_score = best_score


def early_stopping(rounds: int, higher_is_better: bool) -> Callable[[CallbackEnv], None]:
    state = {"best": None, "best_iter": -1}

    def _callback(env: CallbackEnv) -> None:
        score = env.eval_result
        if score is None:
            return
        better = state["best"] is None or (score > state["best"] if higher_is_better else score < state["best"])
        if better:
            state["best"], state["best_iter"] = score, env.iteration
        elif env.iteration - state["best_iter"] >= rounds:
            raise EarlyStopException(state["best_iter"], state["best"])

    return _callback


def check_eval_pair(eval_set) -> None:
    """An ``eval_set`` is one pair (X_val, y_val)."""
    if not (isinstance(eval_set, (tuple, list)) and len(eval_set) == 2):
        sequence = isinstance(eval_set, (tuple, list))
        hint = ("; XGBoost's list of pairs holds one here: give that pair" if sequence and len(eval_set) == 1
                and isinstance(eval_set[0], (tuple, list)) else "")
        raise InvalidParameterError(f"eval_set must be a pair (X_val, y_val), got {type(eval_set).__name__}"
                                    f"{f' of {len(eval_set)} items' if sequence else ''}{hint}")


def check_xy(X, y, n_features: int | None = None):
    """Validate arrays at the public boundary."""
    check_row_labels({"X": X, "y": y})
    if hasattr(X, "toarray"):
        X = X.toarray()
    X = as_numbers(X, "X", TEXT_FEATURES)
    if X.ndim != 2 or X.shape[0] == 0 or X.shape[1] == 0:
        raise DataError(f"X must be a non-empty 2-D array, got shape {X.shape}")
    if np.isinf(X).any():
        raise DataError("X contains infinite values; use NaN for missing values")
    if n_features is not None and X.shape[1] != n_features:
        raise DataError(f"X has {X.shape[1]} features, expected {n_features}")
    if y is not None:
        y = as_numbers(y, "y", "0/1 for binary, 0..K-1 for multiclass; class names need encoding first, e.g. "
                     "numpy.unique(y, return_inverse=True)")
        if y.ndim > 2 or (y.ndim == 2 and y.shape[1] != 1):  # flattened, it read as twice the rows
            hint = ("; one-hot labels are y.argmax(axis=1)" if y.ndim == 2 and y.shape[0] == X.shape[0] else
                    "; one row of labels is y.reshape(-1)" if y.ndim == 2 and y.shape[0] == 1 else "")
            raise DataError(f"y must hold one label per row, shape (n,) or (n, 1), got shape {y.shape}{hint}")
        y = y.reshape(-1)
        if y.shape[0] != X.shape[0]:
            raise DataError(f"X has {X.shape[0]} rows but y has {y.shape[0]}")
        if not np.all(np.isfinite(y)):
            raise DataError("labels contain NaN or infinite values")
    return X, y


def check_sample_weight(sample_weight, n_rows: int, name: str = "sample_weight", of: str = "X") -> np.ndarray:
    """``sample_weight`` as a float64 copy: one finite, non-negative weight per row of ``of``, not all 0 (the
    messages call it ``name``)."""
    w = as_numbers(sample_weight, name, "one non-negative weight per row")
    if w.ndim == 2 and w.shape[1] == 1:
        w = w.reshape(-1)
    if w.shape != (n_rows,):
        raise DataError(f"{name} must hold one weight per row of {of}, shape ({n_rows},), got shape {w.shape}")
    bad = np.nonzero(~np.isfinite(w) | (w < 0))[0]
    if len(bad):
        raise DataError(f"{name} must be finite and non-negative, got {float(w[bad[0]])!r} in row {bad[0]}")
    with np.errstate(over="ignore"):  # (an overflowing sum is refused below)
        total = float(w.sum())
    if total == 0:
        raise DataError(f"{name} is zero in all {n_rows} rows: at least one row needs a positive weight")
    if not np.isfinite(total):
        raise DataError(f"{name}'s sum overflows, {total!r}: divide the weights by a common factor")
    return np.array(w, dtype=np.float64)


def weighted_rows(X, y, sample_weight):
    """``X``, ``y`` and the weights of the rows with a positive weight (a weight of 0 is the row's removal)."""
    keep = sample_weight > 0
    if keep.all():
        return X, y, sample_weight
    return X[keep], y[keep], sample_weight[keep]


def checked_weights(sample_weight, y: np.ndarray, objective: str) -> np.ndarray:
    """``sample_weight`` checked against the checked labels ``y`` (:func:`check_sample_weight`), and, for a
    regression, against the gradient sums they could reach (:func:`~fedgrove.engine.losses.check_gradient_range`):
    what the engine and the protocols' label holders weigh their rows with."""
    w = check_sample_weight(sample_weight, len(y))
    if objective == "regression":
        check_gradient_range(y[w > 0], float(w.sum()), "summed weights")
    return w


class AlignedWeights:
    """A label holder's row weights where its rows must stay in place, aligned with other parties' (the
    vertical active party, a HybridTree host): as the engine's, they scale the rows' gradients and hessians,
    their share of the holder's own cut points and of the base score, but a row of weight 0 is left out of every
    tree as a row sample leaves rows out, not removed.  ``sample_weight=None``: every row weighs 1, and each
    method gives what the unweighted protocol did."""

    def __init__(self, sample_weight, X, y, n_rows: int):
        """``X``, ``y``: the holder's tables as given (their row labels are compared with the weights')."""
        self.weights = None
        if sample_weight is not None:
            check_row_labels({"X": X, "y": y, "sample_weight": sample_weight})
            self.weights = check_sample_weight(sample_weight, n_rows)  # (a regression's range: see ``check``)
        # the rows of positive weight, when some have weight 0 (else None: every row)
        self.kept = None if self.weights is None or (self.weights > 0).all() else np.nonzero(self.weights > 0)[0]

    def bin_mapper(self, params: "GBDTParams", X: np.ndarray) -> BinMapper:
        """The holder's own cut points: fitted on its rows of positive weight, weighted."""
        rows = slice(None) if self.kept is None else self.kept
        return BinMapper(params.max_bins, seed=params.seed).fit(
            X[rows], None if self.weights is None else self.weights[rows])

    def check(self, y: np.ndarray, objective: str) -> None:
        """The weights against the checked labels (:func:`checked_weights`)."""
        if self.weights is not None:
            checked_weights(self.weights, y, objective)

    def init_score(self, objective, y: np.ndarray) -> np.ndarray:
        """``objective``'s base score over the rows of positive weight (summed as the engine sums them)."""
        rows = slice(None) if self.kept is None else self.kept
        return objective.init_score(y[rows], None if self.weights is None else self.weights[rows])

    def n_drawn(self, n_rows: int) -> int:
        """How many rows a round's row sample draws among: those of positive weight."""
        return n_rows if self.kept is None else len(self.kept)

    def rows(self, sample: np.ndarray | None) -> np.ndarray | None:
        """A round's rows (``sample``: a :class:`RoundSampler` draw among the rows of positive weight, None for
        all) as positions among every row; None: every row."""
        if self.kept is None:
            return sample
        return self.kept if sample is None else self.kept[sample]

    def scale(self, g: np.ndarray, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per-row (n, K) gradients and hessians times the rows' weights."""
        if self.weights is None:
            return g, h
        return g * self.weights[:, None], h * self.weights[:, None]


class LocalGrower:
    """Grows boosting trees on one fixed table from the g and h it is given each time: bins fitted once (or
    given), the engine's histogram splitter and grower, on the rows and features a caller's
    :class:`RoundSampler` drew (default: all).  Protocols whose parties grow whole trees on their own rows from
    gradients the engine does not compute (SimFL's weighted ones, TFL's turns) use it; ``bench/simfl.py``
    regrows a run's trees with it to time them without messages."""

    def __init__(self, X, params: GBDTParams, bin_mapper: BinMapper | None = None):
        self.params = params
        self.bin_mapper = bin_mapper or BinMapper(params.max_bins, seed=params.seed).fit(X)
        self.X_binned = self.bin_mapper.transform(X)
        self.X_columns = column_major(self.X_binned)
        self.thresholds = self.bin_mapper.thresholds()
        self.scorer = GBDTScorer(params.reg_lambda, params.gamma, params.min_child_weight, params.min_samples_leaf)
        # every tree grows in the same buffers (fresh ones cost page faults)
        self.buffers = FinderBuffers(len(self.X_binned), 3 if self.scorer.hist_needs_count else 2)

    def grow(self, g: np.ndarray, h: np.ndarray, rows: np.ndarray | None = None,
             features: np.ndarray | None = None):
        """One tree (bin and raw thresholds) and the splitter that grew it, which knows each of ``rows``' leaf
        (None: every row) until the next call (the trees grow in the same buffers); ``features``: the only ones
        it may split on (None: all)."""
        p, bm, scorer = self.params, self.bin_mapper, self.scorer
        # (g, h[, 1]: counts for min_samples_leaf); on every row, in order, straight into the buffers the tree
        # grows in, as the engine's rounds write theirs
        stats = self.buffers.root_stats() if rows is None else np.empty((len(g), self.buffers.n_stats))
        fill_stats(stats, np.ascontiguousarray(g, dtype=np.float64), np.ascontiguousarray(h, dtype=np.float64))
        allowed = None if features is None else mask_for_every_node(feature_mask(features, self.X_binned.shape[1]))
        finder = HistogramSplitFinder(self.X_binned, bm.feature_offsets, bm.missing_codes, self.thresholds,
                                      stats, scorer, root_samples=rows, allowed=allowed, features=features,
                                      X_columns=self.X_columns, buffers=self.buffers)
        tree = TreeGrower(finder, p.max_depth, lambda s: p.learning_rate * scorer.leaf_value(s),
                          min_samples_split=2 * p.min_samples_leaf).grow()
        return tree, finder


class RoundSampler:
    """The rows (``subsample``) and features (``colsample_bytree``) each boosting round draws, from one generator
    seeded with ``params.seed``, rows first: the engine and the federated protocols that sample columns draw
    the same features round by round, so that a lossless protocol still grows the engine's trees.  A run that
    resumes after some rounds draws (and drops) theirs again, so that its later rounds draw what they would
    have."""

    def __init__(self, params: GBDTParams, n_rows: int | None, n_features: int, seed=None):
        """``seed``: the generator's seed (default ``params.seed``; a party sampling its own rows gives one of
        its own, e.g. ``[params.seed, party]``)."""
        self.subsample, self.colsample = params.subsample, params.colsample_bytree
        if self.subsample < 1.0 and n_rows is None:
            raise InvalidParameterError("row subsampling needs the number of rows")
        self.n_rows, self.n_features = n_rows, n_features
        self.rng = np.random.default_rng(params.seed if seed is None else seed)

    def next(self) -> tuple[np.ndarray | None, np.ndarray | None]:
        """The next round's sorted rows and features (None: all)."""
        rows = features = None
        if self.subsample < 1.0:
            n = self.n_rows
            rows = np.sort(self.rng.choice(n, max(1, int(round(self.subsample * n))), replace=False))
        if self.colsample < 1.0:
            k = max(1, int(round(self.colsample * self.n_features)))
            features = np.sort(self.rng.choice(self.n_features, k, replace=False))
        return rows, features

    def feature_mask(self, features: np.ndarray | None) -> np.ndarray:
        """Which of the ``n_features`` a round's ``features`` allow (all for None)."""
        return feature_mask(features, self.n_features)


def feature_mask(features: np.ndarray | None, n_features: int) -> np.ndarray:
    """Which of ``n_features`` the sampled ``features`` allow (all for None)."""
    if features is None:
        return np.ones(n_features, dtype=np.bool_)
    mask = np.zeros(n_features, dtype=np.bool_)
    mask[features] = True
    return mask


def mask_for_every_node(mask: np.ndarray):
    """A splitter's ``allowed`` callable: ``mask`` for every node of a layer."""
    return lambda layer: np.broadcast_to(mask, (len(layer), len(mask)))


def train_gbdt(params: GBDTParams, X, y, eval_set=None, callbacks=None, bin_mapper: BinMapper | None = None,
               feature_names=None, progress: Callable[[int, int], None] | None = None,
               sample_weight=None, eval_sample_weight=None) -> GBDTModel:
    """Train a GBDT model.

    Parameters
    ----------
    params : GBDTParams
    X : array (n_samples, n_features); NaN = missing
    y : array (n_samples,)   0/1 for binary, 0..K-1 for multiclass
    eval_set : (X_val, y_val) or None   used for early stopping / eval_metric
    bin_mapper : a fitted BinMapper to use (e.g. common cut points of a federation)
    feature_names : the features' names (default: a DataFrame's columns); a DataFrame given later to the
        model (or in ``eval_set``) has its columns matched to them by name
    progress : called with (iteration, n_estimators) after each round
    sample_weight : array (n_samples,) or None   each row's weight, finite and non-negative: it scales the
        row's gradient and hessian (so ``min_child_weight`` bounds a weighted hessian sum, as XGBoost's does),
        its share of the bins' quantiles and of ``base_score="auto"``; a whole-number weight k trains as k
        copies of the row would, and a row of weight 0 is left out.  ``min_samples_leaf`` counts rows.
    eval_sample_weight : array (n_val,) or None   the weights of ``eval_set``'s rows in its metric
    """
    check_types("train_gbdt(params, X, y, ...)", params=(params, GBDTParams))
    if params.early_stopping_rounds and eval_set is None:  # it trained every round without a word
        raise InvalidParameterError(f"early_stopping_rounds={params.early_stopping_rounds} watches a validation "
                                    f"set: give eval_set=(X_val, y_val)")
    if eval_set is not None:
        check_eval_pair(eval_set)
    if eval_sample_weight is not None:
        if eval_set is None:
            raise InvalidParameterError("eval_sample_weight weighs eval_set's rows: give eval_set=(X_val, y_val)")
        check_row_labels({"eval_set's X": eval_set[0], "eval_sample_weight": eval_sample_weight})
    feature_names = names_of(X, feature_names)
    if eval_set is not None and feature_names is not None:
        eval_set = (by_names(eval_set[0], feature_names, "eval_set"), *eval_set[1:])
    if sample_weight is not None:  # (check_xy compares X's and y's row labels)
        check_row_labels({"X": X, "y": y, "sample_weight": sample_weight})
    X, y = check_xy(X, y)
    objective = objective_for(params.objective, params.n_classes, y)
    y = objective.check_labels(y)
    if sample_weight is not None:
        X, y, sample_weight = weighted_rows(X, y, checked_weights(sample_weight, y, objective.name))
    with thread_limit(params.n_threads):  # the binning's kernels too
        if bin_mapper is None:
            bin_mapper = BinMapper(params.max_bins, seed=params.seed).fit(X, sample_weight)
        X_binned = bin_mapper.transform(X)
    with fit_threads(params.n_threads, lambda: table_work(X_binned, bin_mapper.feature_offsets)):
        return _boost(params, objective, bin_mapper, X_binned, y, eval_set, callbacks, feature_names, progress,
                      sample_weight, eval_sample_weight)


def _boost(params, objective, bin_mapper, X_binned, y, eval_set, callbacks, feature_names, progress,
           weights=None, eval_weights=None):
    n, n_features = X_binned.shape
    K = objective.n_outputs
    base = (objective.init_score(y, weights) if params.base_score == "auto"
            else np.full(K, float(params.base_score)))
    # scores class-major (one contiguous row per class), seen as (n, K) through ``raw``: a class's gradients
    # and its leaf-value updates then touch contiguous memory (with K columns row-major they are strided)
    raw_by_class = np.tile(base[:, None], (1, n))
    raw = raw_by_class.T
    model = GBDTModel(objective=params.objective, n_classes=objective.n_classes, base_score=base,
                      bin_mapper=bin_mapper, params=params.to_dict(), feature_names=feature_names)
    scorer = GBDTScorer(params.reg_lambda, params.gamma, params.min_child_weight, params.min_samples_leaf)
    sampler = RoundSampler(params, n, n_features)
    thresholds = bin_mapper.thresholds()
    offsets, missing_codes = bin_mapper.feature_offsets, bin_mapper.missing_codes

    callbacks = list(callbacks or [])
    val = None
    if eval_set is not None:
        Xv, yv = check_xy(eval_set[0], eval_set[1], n_features)
        yv = objective.check_labels(yv, warn=False)
        wv = None
        if eval_weights is not None:
            wv = check_sample_weight(eval_weights, len(yv), "eval_sample_weight", "eval_set's X")
        metric_name = params.eval_metric or objective.default_metric
        metric, takes_proba, higher = get_metric(metric_name)
        if metric_name in ("auc", "auprc") and not ranks_defined(yv, wv):
            held = "eval_set's labels" if wv is None else "eval_set's rows of positive weight"
            raise DataError(f"eval_metric {metric_name!r} needs both classes in {held}, which hold only "
                            f"{np.unique(weighed_labels(yv, wv)).tolist()}; use 'logloss' or 'error', or a larger "
                            f"eval_set")
        val = {"Xb": bin_mapper.transform(Xv), "y": yv, "w": wv, "raw": np.tile(base, (len(yv), 1)),
               "metric": metric, "proba": takes_proba}
        if params.early_stopping_rounds:
            callbacks.append(early_stopping(params.early_stopping_rounds, higher))

    X_columns = column_major(X_binned)
    n_stats = 3 if scorer.hist_needs_count else 2
    # every round's gradients and every tree's row buffers reuse the same memory (fresh arrays cost page faults)
    gradients = (np.empty((K, n)), np.empty((K, n)))
    buffers = FinderBuffers(n, n_stats)
    # a tree on every row writes its statistics straight into the buffers it grows in; on a subsample, here
    stats = np.empty((n, n_stats)) if params.subsample < 1.0 else None
    t0 = time.perf_counter()
    for it in range(params.n_estimators):
        g, h = objective.gradients_by_class(y, raw_by_class, out=gradients)
        if weights is not None:
            g, h = np.multiply(g, weights, out=g), np.multiply(h, weights, out=h)
        rows, features = sampler.next()
        allowed = None if features is None else mask_for_every_node(sampler.feature_mask(features))
        roots = None
        if K > 1 and rows is None and n_stats == 2:  # the round's roots in one pass over a sparse table
            roots = root_histograms_by_class(X_binned, offsets, g, h,
                                             np.arange(n_features) if features is None else features)
        tree_stats = buffers.root_stats() if rows is None else stats
        for c in range(K):
            fill_stats(tree_stats, g[c], h[c])
            finder = HistogramSplitFinder(X_binned, offsets, missing_codes, thresholds, tree_stats, scorer,
                                          root_samples=rows, allowed=allowed, features=features,
                                          X_columns=X_columns, buffers=buffers,
                                          root_histogram=None if roots is None else roots[c])
            grower = TreeGrower(finder, params.max_depth,
                                lambda s: params.learning_rate * scorer.leaf_value(s),
                                min_samples_split=2 * params.min_samples_leaf)
            tree = grower.grow()
            model.add_tree(tree, c)
            if rows is None:
                leaves = np.nonzero(tree.is_leaf)[0]
                finder.add_node_values(raw, c, leaves, tree.values[leaves, 0])
            else:
                leaf = PackedEnsemble([tree]).leaves_binned(X_binned, missing_codes)[:, 0]
                raw[:, c] += tree.values[leaf, 0]
            if val is not None:
                vleaf = PackedEnsemble([tree]).leaves_binned(val["Xb"], missing_codes)[:, 0]
                val["raw"][:, c] += tree.values[vleaf, 0]
        score = None
        if val is not None:
            out = objective.transform(val["raw"])
            if not val["proba"]:
                out = model.decide(out)
            score = val["metric"](val["y"], out, sample_weight=val["w"])
            logger.debug("iteration %d: eval %.6f", it, score)
        if progress is not None:
            progress(it + 1, params.n_estimators)
        env = CallbackEnv(it, params.n_estimators, score, model, time.perf_counter() - t0)
        try:
            for cb in callbacks:
                cb(env)
        except EarlyStopException as stop:
            model.best_iteration = stop.best_iteration
            model.truncate(stop.best_iteration + 1)
            logger.info("early stopping at iteration %d (best %d, score %.6f)", it, stop.best_iteration,
                        stop.best_score)
            break
    return model
