"""Helpers shared by CLI commands: console, progress, input resolution, label encoding."""

from __future__ import annotations

import contextlib
import inspect
import os
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from fedgrove.data.datasets import available_datasets, load_dataset
from fedgrove.data.io import Table, load_table
from fedgrove.exceptions import DataError, InvalidParameterError, listing
from fedgrove.log import NoteTimer

# markup off: messages carry user text (file names, "[output] dir"); styled lines opt in with markup=True
console = Console(stderr=True, highlight=False, markup=False, emoji=False, soft_wrap=True)
out = Console(highlight=False, markup=False, emoji=False, soft_wrap=True)


def listed(app, name: str | None = None):
    """Register a function as a command of the Typer ``app``, summarised in the command list by the first
    paragraph of its docstring on one line (Typer keeps that paragraph's line breaks there, which the list
    then shows as broken lines)."""

    def register(fn):
        first = inspect.cleandoc(fn.__doc__ or "").split("\n\n")[0]
        app.command(name, short_help=" ".join(first.split()))(fn)
        return fn

    return register


def write_data(text: str) -> None:
    """Data (CSV) on standard output exactly as given: rich's console wraps long lines at the terminal's width
    (80 columns in a pipe) and reads some text as emoji codes, which would change the data."""
    sys.stdout.write(text)
    sys.stdout.flush()


@contextlib.contextmanager
def options_named(option_of: dict):
    """An InvalidParameterError that begins with an engine parameter's name (``n_threads must be >= 1``) names
    the command-line option instead (``--threads must be >= 1``), as the user wrote it."""
    try:
        yield
    except InvalidParameterError as exc:
        text = str(exc)
        name = text.split(" ", 1)[0].rstrip(":")  # "n_parties must be ..." or "n_parties: cannot ..."
        if name not in option_of:
            raise
        raise InvalidParameterError(option_of[name] + text[len(name):]) from None

DATASET_PREFIX = "dataset:"


def load_input(source: str, label, fmt: str | None = None, split: str = "train", **options) -> Table:
    """A data file, or ``dataset:NAME`` for a named dataset (``dataset:NAME:test`` for its test part) with its
    original class labels; ``options`` go to :func:`~fedgrove.data.io.load_table` (files only)."""
    if source.startswith(DATASET_PREFIX):
        spec = source[len(DATASET_PREFIX):]
        name, _, part = spec.partition(":")
        part = part or split
        if part not in ("train", "test"):
            raise DataError(f"dataset part must be train or test, got {part!r}")
        if name not in available_datasets():
            raise DataError(f"unknown dataset {name!r}; available: {', '.join(available_datasets())} "
                            f"(a dataset's test part: {DATASET_PREFIX}NAME:test)")
        ds = load_dataset(name)
        table = ds.train if part == "train" else ds.test
        if table is None:
            raise DataError(f"dataset {name!r} has no separate test part")
        if ds.classes is not None:  # the file's own labels (a9a's -1/1, kddcup99's "smurf"), as its file gives them
            table = replace(table, y=np.asarray(ds.classes)[table.y.astype(np.int64)])
        return table
    return load_table(Path(source), label=label, format=fmt, **options)


CATEGORICAL_HELP = ("Encode text columns as categories: 'auto' (every column with a value that is not a "
                    "number) or comma-separated column names; the codes are kept in the model")


def categorical_option(value: str | None):
    """``--categorical``: None, "auto" or a list of column names."""
    if value is None:
        return None
    if value.strip() == "auto":
        return "auto"
    names = [v.strip() for v in value.split(",") if v.strip()]
    if not names:
        raise InvalidParameterError(f"--categorical must be 'auto' or comma-separated column names, got {value!r}")
    return names


def report_categories(table: Table, encoded: bool = True) -> None:
    """Notes on stderr: the columns encoded as categories (``encoded``), and values a model's categories do
    not hold."""
    if table.categories and encoded:
        shown = ", ".join(f"{c} ({len(v)})" for c, v in list(table.categories.items())[:10])
        console.print(f"encoded as categories (number of categories): {shown}"
                      + (" ..." if len(table.categories) > 10 else ""))
    if table.unseen:
        shown = ", ".join(f"{c} ({n} rows)" for c, n in table.unseen.items())
        console.print(f"note: values not seen in training, taken as missing: {shown}")


def model_features(table: Table, names, source: str) -> np.ndarray:
    """The table's features in a model's order (matched by name when the file has a header), with a note on
    stderr naming the columns the model does not use."""
    X, left_out = table.features_as(names, repr(source))
    if left_out:
        shown = listing(left_out)
        console.print(f"note: columns the model does not use, left out: {shown}")
    return X


def check_output_file(path: Path | None, option: str, reads: dict | None = None) -> None:
    """Refuse an output file that cannot be written before any work is done (not after training), or that is
    one of the files the command reads (``reads``: {what it is: path}; writing it would destroy it)."""
    if path is None:
        return
    path = Path(path)
    if path.is_dir():
        raise InvalidParameterError(f"{option} '{path}' is a directory; expected a file name")
    for what, source in (reads or {}).items():
        if source is not None and path.exists() and Path(source).exists() and os.path.samefile(path, source):
            raise InvalidParameterError(f"{option} '{path}' is {what} this command reads: writing it would destroy "
                                        f"it; choose another file")
    parent = path.parent
    if not parent.is_dir():
        raise InvalidParameterError(f"{option} '{path}': directory '{parent}' does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InvalidParameterError(f"{option} '{path}': directory '{parent}' is not writable")


def check_output_dir(path: Path, option: str) -> None:
    """Refuse an output directory that is a file, or that cannot be created or written, before any work."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise InvalidParameterError(f"{option} '{path}' is a file; expected a directory")
    existing = path
    while not existing.exists():  # the directory is created later: its nearest existing parent must allow it
        existing = existing.parent
    if not existing.is_dir():
        raise InvalidParameterError(f"{option} '{path}': '{existing}' is a file, so the directory cannot be created")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise InvalidParameterError(f"{option} '{path}': directory '{existing}' is not writable")


#: where stderr is no terminal (a log file, a service), a progress line after this many seconds, then every
#: PROGRESS_EVERY seconds: a bar is drawn on terminals only
PROGRESS_FIRST = 15.0
PROGRESS_EVERY = 60.0


@contextlib.contextmanager
def progress_bar(description: str, total: int, enabled: bool = True):
    """Yields ``update(done, total)``; draws a bar on stderr, or where stderr is no terminal writes
    ``description: done/total (elapsed)`` lines now and then (nothing for work done within PROGRESS_FIRST s)."""
    if not enabled:
        yield lambda done, tot: None
        return
    if not console.is_terminal:
        timer = NoteTimer(PROGRESS_FIRST, PROGRESS_EVERY)

        def note(done, tot):
            if done < tot and (elapsed := timer.due()) is not None:
                console.print(f"{description}: {done}/{tot} ({_elapsed(elapsed)})")
        yield note
        return
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as prog:
        task = prog.add_task(description, total=total)
        yield lambda done, tot: prog.update(task, completed=done, total=tot)


def _elapsed(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def contributions_text(contributions: dict) -> str:
    """``party0 5.33e+05 (33.6%), ...`` from a model's recorded contributions (FV-tree's total, else the split
    Shapley value, ``± its standard error`` where it was estimated by sampling), largest first."""
    value = {q: float(c.get("total", c.get("shapley", 0.0))) for q, c in contributions.items()}
    error = {q: f" ± {float(c['shapley_se']):.2g}" if "shapley_se" in c and "total" not in c else ""
             for q, c in contributions.items()}
    total = sum(value.values())
    share = (lambda v: f" ({100 * v / total:.1f}%)") if total > 0 else (lambda v: "")
    return ", ".join(f"{q} {v:.4g}{error[q]}{share(v)}" for q, v in sorted(value.items(), key=lambda kv: -kv[1]))


def encode_labels(y: np.ndarray, objective: str):
    """Class codes 0..K-1 and the original classes; regression labels pass through."""
    if objective == "regression":
        try:
            y = np.asarray(y, dtype=np.float64)
        except (TypeError, ValueError):
            bad = next(v for v in np.asarray(y, dtype=object).ravel() if not _is_number(v))
            raise DataError(f"objective 'regression' needs numeric labels; the label column holds {bad!r} (for "
                            f"class names use --objective binary, multiclass or auto)") from None
        if not np.all(np.isfinite(y)):
            raise DataError("labels contain NaN or infinite values")
        return y, None
    try:
        classes, codes = np.unique(y, return_inverse=True)
    except TypeError:
        raise DataError("labels mix types and cannot be ordered") from None
    if classes.dtype.kind == "f" and not np.all(np.isfinite(classes)):
        raise DataError("labels contain NaN or infinite values")
    if objective == "binary" and len(classes) != 2:
        raise DataError(f"objective 'binary' needs exactly 2 label values, the label column has {len(classes)}: "
                        f"{[_plain(c) for c in classes[:10]]}{' ...' if len(classes) > 10 else ''}")
    if len(classes) < 2:
        raise DataError(f"classification needs at least 2 label values, got {len(classes)}")
    return codes.astype(np.float64), [_plain(c) for c in classes]


def _is_number(v) -> bool:
    try:
        float(v)
    except (TypeError, ValueError):
        return False
    return True


def _plain(v):
    """A class as a plain Python value; a whole number read as a float (LIBSVM labels: -1.0, 1.0) as an int,
    so that predictions show -1 and 1."""
    v = v.item() if isinstance(v, np.generic) else v
    return int(v) if isinstance(v, float) and v.is_integer() else v
