"""Evaluation metrics (thin wrappers over scikit-learn with input checks).

scikit-learn is imported at the first score, not with this module: the engine imports this module, and
scikit-learn's import (scipy's with it) took 0.7-1.0 s of every ``fedgrove train`` that scores nothing.
"""

from __future__ import annotations

import numpy as np

from fedgrove.exceptions import DataError, InvalidParameterError


def _skm():
    from sklearn import metrics

    return metrics


def accuracy(y_true, y_pred, sample_weight=None) -> float:
    return float(_skm().accuracy_score(y_true, y_pred, sample_weight=sample_weight))


def error_rate(y_true, y_pred, sample_weight=None) -> float:
    return 1.0 - accuracy(y_true, y_pred, sample_weight)


def weighed_labels(y_true, sample_weight=None) -> np.ndarray:
    """The labels a score weighted by ``sample_weight`` counts: those of the rows of positive weight (all
    without weights)."""
    y = np.asarray(y_true)
    return y if sample_weight is None else y[np.asarray(sample_weight) > 0]


def ranks_defined(y_true, sample_weight=None) -> bool:
    """Whether AUC and AUPRC are defined for these labels (of the rows of positive weight): they rank the
    positives above the negatives, so both classes must be present."""
    return len(np.unique(weighed_labels(y_true, sample_weight))) >= 2


def _need_both_classes(y_true, name: str, sample_weight=None) -> None:
    if not ranks_defined(y_true, sample_weight):
        values = np.unique(weighed_labels(y_true, sample_weight))
        held = f"only the class {values[0].item()!r}" if len(values) else "no rows"
        raise DataError(f"{name} is undefined for labels that hold {held}"
                        f"{'' if sample_weight is None else ' in the rows of positive weight'}: it needs both "
                        f"classes")


def auc(y_true, score, sample_weight=None) -> float:
    _need_both_classes(y_true, "AUC", sample_weight)
    score = np.asarray(score)
    if score.ndim == 2:
        if score.shape[1] == 2:
            score = score[:, 1]
        else:
            return float(_skm().roc_auc_score(y_true, score, multi_class="ovr", sample_weight=sample_weight))
    return float(_skm().roc_auc_score(y_true, score, sample_weight=sample_weight))


def auprc(y_true, score, sample_weight=None) -> float:
    _need_both_classes(y_true, "AUPRC", sample_weight)
    score = np.asarray(score)
    if score.ndim == 2:
        score = score[:, 1]
    return float(_skm().average_precision_score(y_true, score, sample_weight=sample_weight))


def log_loss(y_true, proba, sample_weight=None) -> float:
    proba = np.asarray(proba)
    if proba.ndim == 1:
        proba = np.column_stack([1 - proba, proba])
    return float(_skm().log_loss(y_true, proba, labels=np.arange(proba.shape[1]), sample_weight=sample_weight))


def rmse(y_true, y_pred, sample_weight=None) -> float:
    squares = (np.asarray(y_true, dtype=float) - np.asarray(y_pred, dtype=float)) ** 2
    return float(np.sqrt(np.average(squares, weights=sample_weight)))


# name -> (function, takes probabilities?, higher is better?); every function takes ``sample_weight=``
METRICS = {
    "accuracy": (accuracy, False, True),
    "error": (error_rate, False, False),
    "auc": (auc, True, True),
    "auprc": (auprc, True, True),
    "logloss": (log_loss, True, False),
    "mlogloss": (log_loss, True, False),
    "rmse": (rmse, False, False),
}


def get_metric(name: str):
    if name not in METRICS:
        raise InvalidParameterError(f"metric must be one of {sorted(METRICS)}, got {name!r}")
    return METRICS[name]
