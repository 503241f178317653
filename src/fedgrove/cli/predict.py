"""``fedgrove predict``: apply a saved model to a data file."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd
import typer

from fedgrove.cli.common import check_output_file, console, load_input, model_features, report_categories, write_data
from fedgrove.data.io import LIBSVM_BASE
from fedgrove.exceptions import InvalidParameterError, listing


def predict(
    model: Path = typer.Argument(..., help="Model file written by fedgrove train"),
    data: str = typer.Argument(..., help="Data: CSV/Parquet/LIBSVM file, or dataset:NAME[:test]"),
    output: Optional[Path] = typer.Option(None, "--out", "-o", help="Write predictions to this CSV file "
                                          "(default, or -: print them)"),
    label: Optional[str] = typer.Option(None, "--label", "-l", help="Label column to drop and score against "
                                        "(default: the model's label column, when the data has it)"),
    proba: bool = typer.Option(False, help="Output class probabilities instead of classes"),
    leaf: bool = typer.Option(False, help="Output the leaf index of every tree"),
    fmt: Optional[str] = typer.Option(None, "--format", help="csv, parquet or libsvm"),
    weight: Optional[str] = typer.Option(None, "--weight", "-w", help="Column of row weights (not a feature) that "
                                         "weigh the printed scores"),
    threads: Optional[int] = typer.Option(None, help="Threads (default: those the model was trained with, all "
                                          "cores where it names none)"),
):
    """Predict with a saved model; with --label also print test metrics (weighted by --weight)."""
    from fedgrove.engine.model import load_model

    if output is not None and str(output) == "-":  # the usual name of standard output
        output = None
    check_output_file(output, "--out", {"the model file": model, "the data file": data})
    if proba and leaf:
        raise InvalidParameterError("--proba and --leaf ask for different outputs; give one of them")
    if threads is not None and threads < 1:
        raise InvalidParameterError(f"--threads must be >= 1, got {threads}")
    m = load_model(model)
    if threads is not None:
        m.params["n_threads"] = threads
    if proba and m.classes is None:  # said before the data is read
        raise InvalidParameterError(f"--proba needs a classification model; {str(model)!r} is a regression model "
                                    f"(its predictions are the values themselves)")
    if any(t.foreign_splits for t in m.trees):  # said before the data is read: no table predicts with it
        from fedgrove.engine.tree import FEDERATED_PREDICTION
        from fedgrove.exceptions import ModelFormatError

        protocol = m.metadata.get("protocol", "federated")
        lead = ("its master" if protocol == "federated-forest" else
                f"party {m.metadata['party']!r}" if m.metadata.get("party") else "its lead party")
        raise ModelFormatError(f"{str(model)!r} is the {protocol} model of {lead}: its trees "
                               f"hold other parties' splits, whose thresholds those parties keep, "
                               f"so it predicts through its federation ({FEDERATED_PREDICTION})")
    own_label = m.metadata.get("label") if label is None else None
    table = load_input(data, label if own_label is None else own_label, fmt, split="test",
                       label_required=own_label is None, n_features=m.n_features,
                       categorical=m.metadata.get("categories") or {},  # {}: no column is one
                       libsvm_base=m.metadata.get(LIBSVM_BASE))
    report_categories(table, encoded=False)
    if weight is not None:
        from fedgrove.data.io import take_weights

        if table.y is None:
            raise InvalidParameterError(f"--weight {weight!r} weighs the scores against the labels, but {data!r} "
                                        f"has no label column; name it with --label")
        table = take_weights(table, weight, repr(data))
    X = model_features(table, m.feature_names, data)
    if m.n_features is not None and X.ndim == 2 and X.shape[1] != m.n_features:
        from fedgrove.exceptions import DataError

        hint = ("; if one of them is the label, name it with --label (a model trained in Python knows no label "
                "column)" if table.y is None and X.shape[1] == m.n_features + 1 else "")
        raise DataError(f"{data!r} has {X.shape[1]} feature columns; the model takes {m.n_features}{hint}")
    classification = m.classes is not None
    if leaf:
        leaves = m.predict_leaf(X)
        df = pd.DataFrame(leaves, columns=[f"tree{t}" for t in range(leaves.shape[1])])
    elif proba:
        p = m.predict_proba(X)
        df = pd.DataFrame(p, columns=[f"p_{c}" for c in m.classes])
    else:
        pred = m.predict(X)
        df = pd.DataFrame({"prediction": np.asarray(m.classes, dtype=object)[pred] if classification else pred})
    if table.ids is not None:
        df.insert(0, "_id", table.id_labels)
    if output is None:
        write_data(df.to_csv(index=False))
    else:
        from fedgrove.engine.model import atomic_write_text

        atomic_write_text(output, df.to_csv(index=False))
        console.print(f"wrote {len(df)} predictions to {output}")
    if table.y is not None:  # scored after the predictions are out
        console.print(score_line(m, X, table.y, table.weights)
                      + ("" if weight is None else f"  (rows weighted by {weight!r})"))


def score_line(m, X, y_true, weights=None) -> str:
    """The model's scores on rows ``X`` with labels ``y_true`` as the file writes them: accuracy, AUC, AUPRC and
    log loss (classification) or RMSE (regression), as ``fedgrove predict`` prints them; each row weighted by
    ``weights`` when given (checked non-negative, not all 0)."""
    from fedgrove import metrics

    w = weights
    if m.classes is not None:
        lookup = {c: i for i, c in enumerate(m.classes)}
        y = np.array([lookup.get(v.item() if hasattr(v, "item") else v, -1) for v in y_true], dtype=np.int64)
        p = m.predict_proba(X)
        # a class the model does not know is never predicted
        acc = metrics.accuracy(y, p.argmax(axis=1), sample_weight=w)
        line = f"accuracy {acc:.4f}"
        unseen = y < 0
        if unseen.any():  # the other measures need every row's true class among the model's
            values = list(dict.fromkeys(v.item() if hasattr(v, "item") else v for v in y_true[unseen]))
            shown = listing(values, 5, repr)
            line += (f"  ({int(unseen.sum())} of {len(y)} rows have labels the model was not trained on, "
                     f"{shown}: counted as errors; AUC and log loss left out)")
        else:
            if p.shape[1] == 2 and metrics.ranks_defined(y, w):
                line += (f"  auc {metrics.auc(y, p, sample_weight=w):.4f}  "
                         f"auprc {metrics.auprc(y, p, sample_weight=w):.4f}")
            elif p.shape[1] == 2:
                line += (f"  (AUC and AUPRC left out: every label{'' if w is None else ' of positive weight'} is "
                         f"{m.classes[metrics.weighed_labels(y, w)[0]]!r})")
            line += f"  logloss {metrics.log_loss(y, p, sample_weight=w):.4f}"
    else:
        line = f"rmse {metrics.rmse(y_true.astype(float), m.predict(X), sample_weight=w):.6g}"
    return line
