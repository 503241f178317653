"""``fedgrove bag``: combine several hosts' prediction files (multi-host HybridTree)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np
import typer

from fedgrove.cli.common import check_output_file, console, load_input, write_data


def bag(
    predictions: list[Path] = typer.Argument(..., help="Prediction files (<host>.predictions.csv), one per host"),
    vote: str = typer.Option("majority", help="majority (the paper's) or soft (highest mean probability); "
                             "regression predictions are averaged"),
    output: Optional[Path] = typer.Option(None, "--out", "-o", help="Write the bagged predictions to this CSV "
                                          "file (default: print them)"),
    truth: Optional[str] = typer.Option(None, "--truth", help="A test file with the labels (and _id) to score "
                                        "the bagged predictions against"),
    label: Optional[str] = typer.Option(None, "--label", "-l", help="Label column of --truth (default: last "
                                        "column)"),
    fmt: Optional[str] = typer.Option(None, "--format", help="csv, parquet or libsvm for --truth (default: "
                                      "from extension)"),
):
    """Bag the predictions of several hosts' HybridTree federations (each host trained with its guests and
    predicted the same test instances): majority or soft vote, or the mean for regression."""
    import pandas as pd

    from fedgrove.data.io import read_csv
    from fedgrove.engine.model import atomic_write_text
    from fedgrove.exceptions import DataError, InvalidParameterError
    from fedgrove.protocols.hybridtree.bagging import VOTES, bag_prediction_files

    if vote not in VOTES:
        raise InvalidParameterError(f"--vote must be one of {', '.join(VOTES)}, got {vote!r}")
    if truth is None:  # they were ignored: the predictions went unscored without a word
        for flag, value in (("--label", label), ("--format", fmt)):
            if value is not None:
                raise InvalidParameterError(f"{flag} describes the --truth file, and none is given: add --truth "
                                            f"TEST_FILE to score the bagged predictions, or leave {flag} out")
    check_output_file(output, "--out", {"the --truth file": truth,
                                        **{f"a prediction file ({p})": p for p in predictions}})
    frames = {}
    for path in predictions:
        if str(path) in frames or any(path.resolve() == Path(p).resolve() for p in frames):
            raise InvalidParameterError(f"prediction file {path} is given twice; give each host's file once")
        if not path.is_file():
            raise DataError(f"prediction file {path} not found")
        try:
            frames[str(path)] = read_csv(path)
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
            raise DataError(f"{path}: not a readable CSV file ({exc})") from None
    df = bag_prediction_files(frames, vote)
    if len(frames) == 1:  # nothing to vote over: the one host's predictions pass through
        console.print(f"note: one prediction file: its predictions are passed through unchanged; bagging "
                      f"combines several hosts' files ({next(iter(frames))} and the others')")
    if truth is not None:
        _score(df, load_input(truth, -1 if label is None else label, fmt, split="test"), truth)
    if output is None:
        write_data(df.to_csv(index=False))
    else:
        atomic_write_text(output, df.to_csv(index=False))
        console.print(f"bagged {len(frames)} hosts' predictions of {len(df)} instances into {output}")


def _score(df, table, source: str) -> None:
    from fedgrove import metrics
    from fedgrove.exceptions import DataError

    if table.y is None:
        raise DataError(f"{source}: no label column to score against")
    y = np.asarray(table.y)
    if "_id" in df.columns and table.ids is not None:
        from fedgrove.data.io import id_codes

        pos = {int(i): k for k, i in enumerate(table.ids)}
        codes, _ = id_codes(df["_id"].to_numpy(), source)
        missing = [v for v, c in zip(df["_id"], codes) if int(c) not in pos]
        if missing:
            raise DataError(f"{source}: test ID {missing[0]} of the predictions is missing")
        y = y[[pos[int(c)] for c in codes]]
    elif len(y) != len(df):
        raise DataError(f"{source}: {len(y)} rows for {len(df)} predictions")
    pred = df["prediction"].to_numpy()
    classes = [c[2:] for c in df.columns if c.startswith("p_")]
    if classes:
        from fedgrove.data.io import label_text

        odd = [v for v in dict.fromkeys(label_text(v) for v in y) if v not in classes]
        if odd:  # the last column of a file without the label (a guest's) is a feature
            shown = ", ".join(repr(v) for v in odd[:3])
            raise DataError(f"{source}: label column {table.label_name!r} holds values that are not classes of the "
                            f"predictions ({', '.join(classes)}): {shown}; name the label column with --label")
        try:
            hit = np.asarray(pred, dtype=np.float64) == np.asarray(y, dtype=np.float64)
        except (TypeError, ValueError):
            hit = np.asarray(pred).astype(str) == np.asarray(y).astype(str)
        console.print(f"bagged accuracy {float(np.mean(hit)):.4f} on {len(y)} instances")
    else:
        console.print(f"bagged rmse {metrics.rmse(np.asarray(y, dtype=np.float64), pred.astype(float)):.6g} "
                      f"on {len(y)} instances")
