"""Pieces both roles of the horizontal protocol share."""

from __future__ import annotations

import numpy as np

from fedgrove.engine.gbdt import GBDTParams
from fedgrove.exceptions import InvalidParameterError
from fedgrove.protocols import NEEDS_N_CLASSES, refuse_unsupported


def label_stats_length(params: GBDTParams) -> int:
    """Length of the label-statistics vector: per-class counts (+ n) or (sum y, n)."""
    return (params.n_classes + 1) if params.objective == "multiclass" else 2


def label_stats(params: GBDTParams, y: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """A client's label statistics: per-class counts and the row count, or (sum y, row count); with
    ``weights``, weighted counts and sums and the weights' total (the engine's weighted base score)."""
    total = float(len(y)) if weights is None else float(weights.sum())
    if params.objective == "multiclass":
        return np.append(np.bincount(y.astype(np.int64), weights=weights, minlength=params.n_classes)
                         [:params.n_classes], total).astype(np.float64)
    return np.array([float(np.sum(y) if weights is None else np.dot(weights, y)), total])


def base_score(params: GBDTParams, stats: np.ndarray) -> np.ndarray:
    """The engine's ``init_score`` computed from aggregated label statistics."""
    if params.base_score != "auto":
        k = params.n_classes if params.objective == "multiclass" else 1
        return np.full(k, float(params.base_score))
    n = stats[-1]
    if params.objective == "multiclass":
        return np.log(np.clip(stats[:-1] / n, 1e-15, None))
    mean = stats[0] / n
    if params.objective == "binary":
        p = np.clip(mean, 1e-15, 1 - 1e-15)
        return np.array([np.log(p / (1 - p))])
    return np.array([mean])


def check_params(params: GBDTParams) -> None:
    if params.objective == "multiclass" and params.n_classes is None:
        raise InvalidParameterError(f"the horizontal protocol's multiclass needs {NEEDS_N_CLASSES}")
    refuse_unsupported(params, "the horizontal protocol")


def column_bins(offsets: np.ndarray, columns) -> np.ndarray:
    """The histogram bins of ``columns`` (sorted feature indices), in order: what a tree's histograms hold."""
    return np.concatenate([np.arange(offsets[f], offsets[f + 1]) for f in columns]).astype(np.int64)
