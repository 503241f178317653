"""``fedgrove train``: train a GBDT or random forest on one data file."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Optional

import typer

from fedgrove.cli.common import (CATEGORICAL_HELP, categorical_option, check_output_file, console, encode_labels,
                                 load_input, model_features, options_named, progress_bar, report_categories)
from fedgrove.data.io import LIBSVM_BASE, infer_objective, take_weights
from fedgrove.exceptions import DataError, InvalidParameterError, listing


class Algorithm(str, Enum):
    gbdt = "gbdt"
    forest = "forest"


GBDT_ONLY = {"learning_rate": "--learning-rate", "reg_lambda": "--lambda", "gamma": "--gamma",
             "subsample": "--subsample", "colsample": "--colsample", "valid": "--valid",
             "early_stopping": "--early-stopping"}
FOREST_ONLY = {"max_features": "--max-features", "criterion": "--criterion"}
# the engine's parameter names, as the command line names them
OPTION_OF = {"n_estimators": "--n-estimators", "learning_rate": "--learning-rate", "max_depth": "--max-depth",
             "reg_lambda": "--lambda", "gamma": "--gamma", "min_samples_leaf": "--min-samples-leaf",
             "max_bins": "--max-bins", "subsample": "--subsample", "colsample_bytree": "--colsample",
             "early_stopping_rounds": "--early-stopping", "seed": "--seed", "n_threads": "--threads",
             "max_features": "--max-features", "criterion": "--criterion"}


def _refuse_other_algorithms_options(ctx: typer.Context, algorithm: str) -> None:
    """An option of the other algorithm, given on the command line, would be ignored without a word."""
    other = FOREST_ONLY if algorithm == "gbdt" else GBDT_ONLY
    given = [flag for name, flag in other.items()
             if (src := ctx.get_parameter_source(name)) is not None and src.name == "COMMANDLINE"]
    if given:
        raise InvalidParameterError(f"{', '.join(given)} {'is' if len(given) == 1 else 'are'} not used by "
                                    f"--algorithm {algorithm}; "
                                    f"{'drop it' if len(given) == 1 else 'drop them'} or choose the other algorithm")


def train(
    ctx: typer.Context,
    data: str = typer.Argument(..., help="Training data: CSV/Parquet/LIBSVM file, or dataset:NAME"),
    model: Path = typer.Option(..., "--model", "-m", help="Where to write the model (JSON)"),
    label: Optional[str] = typer.Option(None, "--label", "-l", help="Label column name or 0-based index "
                                        "(default: the last column; LIBSVM files carry their label)"),
    algorithm: Algorithm = typer.Option(Algorithm.gbdt, help="gbdt or forest"),
    objective: str = typer.Option("auto", help="binary, multiclass, regression, or auto (from the labels)"),
    n_estimators: int = typer.Option(100, "--n-estimators", "-n", help="Boosting rounds / forest trees"),
    max_depth: Optional[int] = typer.Option(None, help="Maximum depth (default 6 for gbdt, unlimited for forest)"),
    learning_rate: float = typer.Option(0.1, help="Shrinkage (gbdt)"),
    reg_lambda: float = typer.Option(1.0, "--lambda", help="L2 regularisation of leaf values (gbdt)"),
    gamma: float = typer.Option(0.0, help="Minimum gain to split (gbdt); the gain has the papers' 1/2, so "
                                          "XGBoost's gamma g is g/2 here"),
    min_samples_leaf: int = typer.Option(1, help="Minimum samples per leaf"),
    max_bins: int = typer.Option(255, help="Bins per feature for non-missing values (2..255)"),
    subsample: float = typer.Option(1.0, help="Row subsampling per tree (gbdt)"),
    colsample: float = typer.Option(1.0, help="Column subsampling per tree (gbdt)"),
    max_features: str = typer.Option("sqrt", help="Features tried per split (forest): sqrt, log2, all, int, float"),
    criterion: Optional[str] = typer.Option(None, help="gini, entropy or mse (forest)"),
    weight: Optional[str] = typer.Option(None, "--weight", "-w", help="Column of row weights (not a feature): a "
                                         "whole-number weight k counts a row k times in boosting, 0 leaves it "
                                         "out; a forest weights its bootstrap draws"),
    class_weight: Optional[str] = typer.Option(None, "--class-weight", help="Weigh each class: 'balanced' "
                                               "(n_samples / (n_classes x its rows)) or CLASS=WEIGHT pairs, "
                                               "comma-separated (other classes weigh 1); multiplies --weight"),
    valid: Optional[str] = typer.Option(None, help="Validation data for early stopping (same columns)"),
    early_stopping: Optional[int] = typer.Option(None, help="Stop after this many rounds without improvement"),
    seed: int = typer.Option(0, help="Random seed"),
    threads: Optional[int] = typer.Option(None, help="Threads (default: all cores)"),
    fmt: Optional[str] = typer.Option(None, "--format", help="csv, parquet or libsvm (default: from extension)"),
    categorical: Optional[str] = typer.Option(None, help=CATEGORICAL_HELP),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar"),
):
    """Train a model on a data file and save it as JSON."""
    from fedgrove.engine.forest import ForestParams, train_forest
    from fedgrove.engine.gbdt import GBDTParams, train_gbdt

    _refuse_other_algorithms_options(ctx, algorithm.value)
    if early_stopping is not None and valid is None:  # said before the data is read
        raise InvalidParameterError("--early-stopping watches a validation set: give --valid VALID_FILE too")
    check_output_file(model, "--model", {"the training data": data, "the validation data (--valid)": valid})
    class_weights = _parse_class_weight(class_weight)
    if objective not in ("auto", "binary", "multiclass", "regression"):
        raise InvalidParameterError(f"--objective must be auto, binary, multiclass or regression, got {objective!r}")

    def make_params(objective: str, n_classes: int | None = None):
        """The algorithm's parameters; a bad value is named by its option (--threads, not n_threads)."""
        with options_named(OPTION_OF):
            if algorithm == Algorithm.gbdt:
                return GBDTParams(objective=objective, n_estimators=n_estimators, learning_rate=learning_rate,
                                  max_depth=max_depth if max_depth is not None else 6, reg_lambda=reg_lambda,
                                  gamma=gamma, min_samples_leaf=min_samples_leaf, max_bins=max_bins,
                                  subsample=subsample, colsample_bytree=colsample,
                                  early_stopping_rounds=early_stopping, seed=seed, n_threads=threads,
                                  n_classes=n_classes)
            task = "regression" if objective == "regression" else "classification"
            return ForestParams(task=task, n_estimators=n_estimators, criterion=criterion, max_depth=max_depth,
                                min_samples_leaf=min_samples_leaf, max_features=_parse_max_features(max_features),
                                max_bins=max_bins, seed=seed, n_threads=threads)

    # checked before the data is read; a forest's criterion (mse: regression) tells the task, a GBDT's is later
    make_params(objective if objective != "auto" else "regression" if criterion == "mse" else "binary",
                2 if objective == "multiclass" else None)
    table = load_input(data, label if label is not None else -1, fmt, categorical=categorical_option(categorical))
    if table.y is None:
        raise DataError("the training data has no label column; pass --label")
    report_categories(table)
    weights = None
    if weight is not None:
        table = take_weights(table, weight, data)
        weights = table.weights
    if objective == "auto":
        objective = infer_objective(table.y) if algorithm == Algorithm.gbdt else (
            "regression" if infer_objective(table.y) == "regression" else "multiclass")
    y, classes = encode_labels(table.y, objective)
    if class_weights is not None:
        weights = _weigh_classes(class_weights, y, classes, weights)
    eval_set = eval_weights = None
    if algorithm == Algorithm.gbdt:
        params = make_params(objective, len(classes) if objective == "multiclass" else None)
        if valid is not None:
            vt = load_input(valid, table.label_name if table.label_name else -1, fmt, split="test",
                            n_features=table.n_features, categorical=table.categories or None,
                            libsvm_base=table.meta.get(LIBSVM_BASE))
            if vt.y is None:
                raise DataError("the validation data has no label column")
            if weight is not None and vt.named and weight in vt.feature_names:  # weighs its rows too
                vt = take_weights(vt, weight, f"--valid {valid}")
                eval_weights = vt.weights
            elif weight is not None:
                console.print(f"note: {valid} has no column {weight!r}: its rows weigh alike")
            vy = _encode_like(vt.y, classes, objective)
            eval_set = (model_features(vt, table.feature_names, valid), vy)
        with progress_bar("boosting", n_estimators, not quiet) as update:
            fitted = train_gbdt(params, table.X, y, eval_set=eval_set, feature_names=table.feature_names,
                                progress=update, sample_weight=weights, eval_sample_weight=eval_weights)
    else:
        params = make_params(objective)
        with progress_bar("growing forest", n_estimators, not quiet) as update:
            fitted = train_forest(params, table.X, y, feature_names=table.feature_names, progress=update,
                                  sample_weight=weights)
    fitted.classes = classes
    fitted.metadata["label"] = table.label_name
    if weight is not None:
        fitted.metadata["weight"] = weight
    if class_weight is not None:
        fitted.metadata["class_weight"] = class_weight
    if LIBSVM_BASE in table.meta:  # a LIBSVM test file is read with the same numbering
        fitted.metadata[LIBSVM_BASE] = table.meta[LIBSVM_BASE]
    if table.categories:
        fitted.metadata["categories"] = table.categories
    fitted.save(model)
    if algorithm == Algorithm.forest:  # a forest has tasks, not objectives: "multiclass" for two classes misled
        objective = "regression" if objective == "regression" else f"classification, {len(classes)} classes"
    weighted = ("" if weight is None else f", weighted by {weight!r}") + (
        "" if class_weight is None else f", classes weighted {class_weight}")
    console.print(f"trained {algorithm.value} ({objective}) on {table.n_samples} samples x {table.n_features} "
                  f"features{weighted}: {fitted.n_trees} trees -> {model}")
    if eval_set is not None:  # the model as saved (early stopping: its best round), scored as predict scores it
        from fedgrove.cli.predict import score_line

        console.print(f"on {valid}: {score_line(fitted, eval_set[0], vt.y, eval_weights)}"
                      + ("" if eval_weights is None else f"  (rows weighted by {weight!r})"))


def _parse_class_weight(value: str | None):
    """``--class-weight``: None, "balanced" or {class as written: weight}."""
    if value is None or value.strip() == "balanced":
        return None if value is None else "balanced"
    pairs = {}
    for part in value.split(","):
        name, sep, number = part.partition("=")
        try:
            w = float(number) if sep and name.strip() else None
        except ValueError:
            w = None
        if w is None or not (w >= 0 and w < float("inf")):
            raise InvalidParameterError(f"--class-weight must be 'balanced' or CLASS=WEIGHT pairs, comma-separated, "
                                        f"each weight a non-negative number, got {part.strip()!r} in {value!r}")
        pairs[name.strip()] = w
    return pairs


def _weigh_classes(class_weights, codes, classes, weights):
    """Each row's weight (``weights``, or 1) times its class's, by scikit-learn's ``compute_sample_weight`` (as
    the estimators' ``class_weight``); pairs name classes as the label column writes them."""
    from sklearn.utils.class_weight import compute_sample_weight

    if classes is None:
        raise InvalidParameterError("--class-weight weighs classes, and regression labels have none; weigh the "
                                    "rows with --weight COLUMN")
    if class_weights != "balanced":
        written = [str(c) for c in classes]
        unknown = [k for k in class_weights if k not in written]
        if unknown:
            raise InvalidParameterError(f"--class-weight names classes the labels do not hold: "
                                        f"{listing(unknown, show=repr)}; the classes are {listing(written, show=repr)}")
        class_weights = {written.index(k): w for k, w in class_weights.items()}  # by class code
    row = compute_sample_weight(class_weights, codes.astype(int))
    return row if weights is None else row * weights


def _parse_max_features(value: str):
    if value in ("sqrt", "log2"):
        return value
    if value in ("all", "none", "None"):
        return None
    try:
        return int(value)
    except ValueError:
        pass
    try:
        return float(value)
    except ValueError:
        raise DataError(f"--max-features must be sqrt, log2, all, an integer or a fraction, got {value!r}") from None


def _encode_like(y, classes, objective):
    import numpy as np

    if classes is None:
        return np.asarray(y, dtype=np.float64)
    lookup = {c: i for i, c in enumerate(classes)}
    try:
        return np.array([lookup[v.item() if hasattr(v, "item") else v] for v in y], dtype=np.float64)
    except KeyError as exc:
        raise DataError(f"validation label {exc.args[0]!r} does not occur in the training labels "
                        f"({listing(classes, show=repr)})") from None
