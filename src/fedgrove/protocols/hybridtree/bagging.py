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
    paper's choice) takes the class most hosts predict, a tie to the tied
    class with the highest mean probability; ``soft`` takes the class with the
    highest mean probability.
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
    return vote_classes(np.stack([obj.transform(r) for r in raws]), vote)


def vote_classes(probas: np.ndarray, vote: str = "majority") -> np.ndarray:
    """Class codes from per-host class probabilities ``(hosts, n, classes)``: ``majority`` counts each host's
    most probable class (a tie, as two hosts that disagree make, goes to the tied class with the highest mean
    probability, then to the lowest class), ``soft`` takes the highest mean probability."""
    if vote not in VOTES:
        raise InvalidParameterError(f"vote must be one of {VOTES}, got {vote!r}")
    probas = np.asarray(probas, dtype=np.float64)
    mean = probas.mean(axis=0)
    if vote == "soft":
        return mean.argmax(axis=1)
    votes = probas.argmax(axis=2)  # (hosts, n)
    counts = np.zeros(probas.shape[1:], dtype=np.int64)
    for v in votes:
        counts[np.arange(len(v)), v] += 1
    most = counts == counts.max(axis=1, keepdims=True)
    return np.where(most, mean, -np.inf).argmax(axis=1)


def bag_prediction_files(frames: dict, vote: str = "majority"):
    """Bag the prediction tables that ``fedgrove simulate|party`` write (``<host>.predictions.csv``), one per
    host: ``frames`` maps a name (for messages) to a DataFrame.  Rows are matched by ``_id`` when every table
    has it (else by position); classification tables (``p_<class>`` columns) are voted, regression tables
    (``prediction`` only) averaged.  Returns a DataFrame: ``_id`` when known, ``prediction``, the mean class
    probabilities, and ``votes`` (majority vote: how many hosts chose the winning class)."""
    import pandas as pd

    from fedgrove.exceptions import DataError

    if vote not in VOTES:
        raise InvalidParameterError(f"vote must be one of {VOTES}, got {vote!r}")
    if len(frames) < 1:
        raise InvalidParameterError("bagging needs at least one host's predictions")
    names = list(frames)
    first = frames[names[0]]
    for name, df in frames.items():
        if "prediction" not in df.columns:
            raise DataError(f"{name}: no 'prediction' column; expected a predictions file written by fedgrove "
                            f"simulate or party")
        if sorted(df.columns) != sorted(first.columns):
            raise DataError(f"{name}: columns {list(df.columns)} differ from {names[0]}'s {list(first.columns)}")
        if len(df) != len(first):
            raise DataError(f"{name}: {len(df)} rows, {names[0]} has {len(first)}")
    ids = None
    if "_id" in first.columns:
        ids = first["_id"].to_numpy()
        for name, df in frames.items():  # another file's repeated ID was reported as one of the first's missing
            repeated = df["_id"][df["_id"].duplicated()]
            if len(repeated):
                first_id = repeated.iloc[0].item() if hasattr(repeated.iloc[0], "item") else repeated.iloc[0]
                raise DataError(f"{name}: test ID {first_id!r} appears more than once; a predictions "
                                f"file has a row per test instance")
        aligned = {}
        for name, df in frames.items():
            df = df.set_index("_id")
            missing = np.setdiff1d(ids, df.index.to_numpy())
            if len(missing):
                raise DataError(f"{name}: {len(missing)} of {names[0]}'s test IDs are missing (first: {missing[0]})")
            aligned[name] = df.loc[ids].reset_index()
        frames = aligned
    pcols = [c for c in first.columns if c.startswith("p_")]
    out = pd.DataFrame({"_id": ids}) if ids is not None else pd.DataFrame(index=range(len(first)))
    if not pcols:
        try:
            preds = np.stack([frames[n]["prediction"].to_numpy(dtype=np.float64) for n in names])
        except ValueError:
            raise DataError("predictions without p_<class> columns are averaged as a regression's values, and these "
                            "hold text: to vote on classes, give the prediction files of classifiers with their "
                            "class probabilities (the p_<class> columns that fedgrove simulate and party write)") \
                from None
        _refuse_unfinite(preds, names, "prediction")
        out["prediction"] = preds.mean(axis=0)
        return out
    try:
        probas = np.stack([frames[n][pcols].to_numpy(dtype=np.float64) for n in names])
    except ValueError:
        raise DataError(f"the class probabilities ({', '.join(pcols)}) hold text; expected numbers") from None
    _refuse_unfinite(probas, names, "class probability")
    for k, name in enumerate(names):  # a damaged file, or another tool's scores: the votes would mean nothing
        wrong = ((probas[k] < 0) | (probas[k] > 1)).any(axis=1) | (np.abs(probas[k].sum(axis=1) - 1) > 0.01)
        if wrong.any():
            row = int(np.argmax(wrong))
            raise DataError(f"{name}: row {row + 1}'s class probabilities {probas[k, row].tolist()} are not "
                            f"probabilities (each in [0, 1], summing to 1)")
    codes = vote_classes(probas, vote)
    classes = np.array([c[2:] for c in pcols], dtype=object)
    try:  # keep numeric class labels numeric
        classes = np.array([int(c) for c in classes], dtype=object)
    except ValueError:
        pass
    out["prediction"] = classes[codes]
    for k, c in enumerate(pcols):
        out[c] = probas[:, :, k].mean(axis=0)
    if vote == "majority":
        out["votes"] = (probas.argmax(axis=2) == codes[None, :]).sum(axis=0)
    return out


def _refuse_unfinite(values: np.ndarray, names: list, what: str) -> None:
    """Predictions ``(files, rows, ...)`` must be numbers: a missing one was averaged as NaN, or left out."""
    from fedgrove.exceptions import DataError

    for k, name in enumerate(names):
        bad = ~np.isfinite(values[k])
        if bad.any():
            row = int(np.nonzero(bad.reshape(len(bad), -1).any(axis=1))[0][0])
            raise DataError(f"{name}: row {row + 1} has a {what} that is missing or not finite")
