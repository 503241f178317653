"""Multi-host HybridTree: each host trains with the guests holding its instances;
predictions of the hosts' models are combined by bagging."""

from __future__ import annotations

import numpy as np

from fedgrove.engine.losses import make_objective
from fedgrove.exceptions import InvalidParameterError

VOTES = ("majority", "soft")


def bag_predictions(raws: list[np.ndarray], objective: str, n_classes: int | None = None,
                    vote: str = "majority") -> np.ndarray:
    """Combine the raw scores of several hosts' models.

    Regression: the mean prediction.  Classification: ``majority`` (the
    paper's choice) takes the class most hosts predict, ties to the lowest
    class; ``soft`` takes the class with the highest mean probability.
    Returns predicted values (regression) or class codes.
    """
    if vote not in VOTES:
        raise InvalidParameterError(f"vote must be one of {VOTES}, got {vote!r}")
    if not raws:
        raise InvalidParameterError("bagging needs at least one host's predictions")
    raws = [np.asarray(r, dtype=np.float64).reshape(len(r), -1) for r in raws]
    if objective == "regression":
        return np.mean([r[:, 0] for r in raws], axis=0)
    obj = make_objective(objective, n_classes or (raws[0].shape[1] if objective == "multiclass" else 2))
    probas = [obj.transform(r) for r in raws]  # (n, classes) each
    probas = np.stack(probas)  # (hosts, n, classes)
    if vote == "soft":
        return probas.mean(axis=0).argmax(axis=1)
    votes = probas.argmax(axis=2)  # (hosts, n)
    counts = np.zeros(probas.shape[1:], dtype=np.int64)
    for v in votes:
        counts[np.arange(len(v)), v] += 1
    return counts.argmax(axis=1)
