"""Loading and writing tables: CSV, Parquet, LIBSVM.

Every loader returns a :class:`Table`: a float64 feature matrix (NaN for
missing values), an optional label vector, the feature names and, for files
written by the partition simulators, the global instance IDs (column ``_id``).
Problems with the input raise :class:`~fedgrove.exceptions.DataError` with a
message that names the file, the column and the bad value.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from fedgrove.exceptions import DataError, InvalidParameterError, listing
from fedgrove.log import logger

ID_COLUMN = "_id"
# what a file that is not UTF-8 is told (a spreadsheet's export in Latin-1 or Windows-1252, say)
NOT_UTF8 = "; fedgrove reads text files as UTF-8: save it as UTF-8 (e.g. iconv -f latin1 -t utf-8)"
LIBSVM_BASE = "libsvm_base"  # Table.meta's and a model's metadata key: the index of a LIBSVM file's first feature
FORMATS = ("csv", "parquet", "libsvm")
_DECIMAL_COMMA = re.compile(r"[+-]?\d+,\d+(e[+-]?\d+)?", re.IGNORECASE)  # 17,99 or 1,5E-3
_THOUSANDS = re.compile(r"[+-]?\d{1,3}(,\d{3})+(\.\d+)?")  # 1,234,567 or 12,345.5 (or 1,234: either)
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?(Z|[+-]\d{2}:?\d{2})?)?")  # ISO 8601
_EXTENSIONS = {
    ".csv": "csv", ".tsv": "csv", ".txt": "csv", ".data": "csv", ".parquet": "parquet", ".pq": "parquet",
    ".libsvm": "libsvm", ".svm": "libsvm", ".svmlight": "libsvm",
}


@dataclass
class Table:
    X: np.ndarray
    y: np.ndarray | None
    feature_names: list[str]
    label_name: str | None = None
    ids: np.ndarray | None = None
    meta: dict = field(default_factory=dict)
    named: bool = True  # feature names come from the file (False: headerless CSV or LIBSVM, names made up)
    categories: dict = field(default_factory=dict)  # {column: its categories}: the column holds their codes
    unseen: dict = field(default_factory=dict)  # {column: values not among given categories (now missing)}
    # text instance IDs as the file wrote them (``ids`` then holds their 63-bit digests, see :func:`id_codes`)
    id_text: np.ndarray | None = None
    # a LIBSVM file's features beyond the ``n_features`` asked for (a model's), left out: a training file
    # without values there gives the same model as one that has those columns, all zero
    left_out: list = field(default_factory=list)
    weights: np.ndarray | None = None  # each row's weight, from a column :func:`take_weights` took out of X
    weight_name: str | None = None  # that column's name (written back by :func:`write_table`)

    @property
    def label_column(self) -> str:
        """The name a written file gives the label column."""
        return self.label_name or "label"

    @property
    def id_labels(self) -> np.ndarray | None:
        """The instance IDs as the file wrote them: text IDs as text, numbers as numbers (for output files)."""
        return self.id_text if self.id_text is not None else self.ids

    @property
    def n_samples(self) -> int:
        return int(self.X.shape[0])

    @property
    def n_features(self) -> int:
        return int(self.X.shape[1])

    def subset(self, rows=None, features=None, with_label: bool = True) -> "Table":
        rows = slice(None) if rows is None else rows
        feats = np.arange(self.n_features) if features is None else np.asarray(features)
        names = [self.feature_names[j] for j in feats]
        X = self.X[rows] if features is None else self.X[rows][:, feats]
        return Table(X, self.y[rows] if (with_label and self.y is not None) else None,
                     names, self.label_name if with_label else None,
                     None if self.ids is None else self.ids[rows], named=self.named,
                     categories={c: v for c, v in self.categories.items() if c in names},
                     id_text=None if self.id_text is None else self.id_text[rows], meta=dict(self.meta),
                     # the weights go with the labels (a vertical partition's label holder's)
                     weights=self.weights[rows] if (with_label and self.weights is not None) else None,
                     weight_name=self.weight_name if with_label else None)

    def features_as(self, names, source: str = "the data") -> tuple[np.ndarray, list[str]]:
        """The feature matrix with its columns in the order of ``names`` (a model's features), and the
        columns left out.  See :func:`column_order`."""
        order = column_order(self.feature_names, names, source) if self.named else None
        if order is None:
            return self.X, list(self.left_out)
        left_out = sorted(set(self.feature_names) - set(names), key=self.feature_names.index)
        return self.X[:, order], list(self.left_out) + left_out


def take_weights(table: Table, column: str, source: str, option: str = "--weight") -> Table:
    """The table without its column ``column``, whose values become the rows' ``weights`` (checked as the engine
    checks them); ``option`` is what the messages call the setting that named the column (``--weight``, or a
    party config's ``weight``)."""
    from fedgrove.engine.gbdt import check_sample_weight

    if not table.named:
        raise InvalidParameterError(f"{option} {column!r} names a column, but {source} has no column names (a "
                                    f"LIBSVM file or a CSV without a header row): give the file a header")
    if column == table.label_name:
        raise InvalidParameterError(f"{option} {column!r} is the label column; name the column of weights")
    if column not in table.feature_names:
        raise DataError(f"{option} column {column!r} not found in {source}; its columns: "
                        f"{listing(table.feature_names, show=repr)}")
    if column in table.categories:
        raise DataError(f"{option} column {column!r} holds text, expected non-negative numbers")
    j = table.feature_names.index(column)
    bad = np.nonzero(~(table.X[:, j] >= 0))[0]  # (NaN is no weight, nor is an infinite one below)
    if len(bad):
        value = table.X[bad[0], j]
        raise DataError(f"{option} column {column!r} has {'no value' if np.isnan(value) else repr(float(value))} "
                        f"in data row {bad[0] + 1}; weights must be non-negative numbers")
    weights = check_sample_weight(table.X[:, j], table.n_samples, f"{option} column {column!r}", source)
    if table.n_features == 1:
        raise DataError(f"{option} column {column!r} is the only column besides the label: no feature is left")
    rest = [k for k in range(table.n_features) if k != j]
    return replace(table, X=np.ascontiguousarray(table.X[:, rest]),
                   feature_names=[table.feature_names[k] for k in rest], weights=weights, weight_name=column,
                   categories=dict(table.categories))


def column_order(columns, names, source: str = "the data") -> np.ndarray | None:
    """Positions in ``columns`` of the features ``names`` a model was trained on, matched by name, so that a
    file whose columns are in another order, or that has columns the model does not use, is read right.

    A name matches its column exactly, or else the one column that equals it without surrounding spaces (a CSV
    reader drops a header's leading spaces, a Parquet file keeps them: ``" age"`` is ``"age"`` there).

    ``None`` means "by position": no names to match, or none of them among the columns (a model trained on
    a file without a header).  Raises :class:`DataError` when only some of the names are there.
    """
    if names is None:
        return None
    columns, names = [str(c) for c in columns], [str(n) for n in names]
    index = {c: j for j, c in enumerate(columns)}
    trimmed: dict[str, list[int]] = {}
    for j, c in enumerate(columns):
        trimmed.setdefault(c.strip(), []).append(j)
    taken = {index[n] for n in names if n in index}
    for n in names:
        hits = trimmed.get(n.strip(), []) if n not in index else []
        if len(hits) == 1 and hits[0] not in taken:
            index[n] = hits[0]
            taken.add(hits[0])
    missing = [n for n in names if n not in index]
    if len(missing) == len(names):
        return None
    if missing:
        shown = listing(missing, show=repr)
        verb = "is not a column" if len(missing) == 1 else "are not columns"
        raise DataError(f"{len(missing)} of the model's {len(names)} features {verb} of {source}: {shown}")
    if len(set(names)) != len(names):
        return None  # a model with repeated names can only be applied by position
    return np.array([index[n] for n in names], dtype=np.int64)


def detect_format(path: str | os.PathLike) -> str:
    name = Path(path).name.lower()
    if name.endswith(".gz"):
        name = name[:-3]
    ext = Path(name).suffix
    if ext in _EXTENSIONS:
        return _EXTENSIONS[ext]
    sniffed = _sniff_format(Path(path))
    if sniffed is not None:
        return sniffed
    raise DataError(f"cannot tell the format of {str(path)!r} from its extension (known: "
                    f"{', '.join(sorted(_EXTENSIONS))}, optionally .gz) or its first line; give it as one of "
                    f"{', '.join(FORMATS)} (--format on the command line, format= in Python)")


# a LIBSVM row: a label, then index:value pairs in increasing order (checked on reading)
_LIBSVM_ROW = re.compile(r"\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?(\s+\d+:\S+)+\s*")


def _sniff_format(path: Path) -> str | None:
    """The format of a file whose extension does not tell it, from its content: Parquet's magic bytes, first
    lines that are LIBSVM rows (LIBSVM's own files are named ``a9a``, ``cod-rna.t``, ``a1a.t``), or first lines
    that hold the same number of commas, tabs or semicolons (``kddcup.data_10_percent``); None when none of
    these (or the file cannot be read here: the caller's error says what to do)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(4)
        if head == b"PAR1":
            return "parquet"
        if (head[:2] == b"\x1f\x8b") != path.name.lower().endswith(".gz"):  # read by its name: gzip only as .gz
            return None
        lines = _first_lines(path, 5)
    except (OSError, DataError, EOFError):
        return None
    if all(_LIBSVM_ROW.fullmatch(line) for line in lines):
        return "libsvm"
    for sep in (",", "\t", ";"):  # the same number of one separator on every line: a CSV (UCI's kddcup.data)
        if lines[0].count(sep) >= 1 and all(line.count(sep) == lines[0].count(sep) for line in lines):
            return "csv"
    return None


def load_table(path, label: str | int | None = None, format: str | None = None, header: bool | None = None,
               n_features: int | None = None, ids: bool = True, label_required: bool = True,
               categorical=None, libsvm_base: int | None = None, allow_empty: bool = False) -> Table:
    """Load a table.

    Parameters
    ----------
    path : file path (``.gz`` accepted for CSV and LIBSVM)
    label : label column name or 0-based index (negative counts from the end);
        ``None`` for CSV/Parquet means "no label".  LIBSVM files always carry one.
    format : "csv", "parquet" or "libsvm"; default from the extension.
    header : CSV only; ``None`` detects a header row (a first row that is not all numbers).
    n_features : LIBSVM only; number of features (files may not mention the last ones).
    libsvm_base : LIBSVM only; the index of the first feature, 0 or 1 (a model's training file's,
        ``Table.meta["libsvm_base"]``); ``None``: 1, the format's own, unless the file holds index 0.
    ids : use a column named ``_id`` as instance IDs when present.
    label_required : when false, a label *name* the file does not have means "no label" (test files that
        may or may not carry the label), instead of an error.
    categorical : how text columns become features (CSV/Parquet): ``None`` refuses them (naming the first
        value); ``"auto"`` encodes every column with a value that is not a number; a list of names encodes
        those columns (numbers in them taken as labels, e.g. postcodes); a dict ``{column: categories}``
        (a model's ``metadata["categories"]``) encodes with those, and a value not among them becomes
        missing (counted in ``Table.unseen``).  A category's code is its position among the column's
        distinct values sorted as text (``Table.categories``); missing values stay missing.
    allow_empty : CSV/Parquet only; a file of column names and no rows is a table of no rows (a HybridTree
        guest's part of a test set it holds none of), where by default it is refused.
    """
    path = Path(path)
    if not path.exists():
        raise DataError(f"data file {str(path)!r} does not exist")
    if path.is_dir():
        raise DataError(f"{str(path)!r} is a directory, expected a data file")
    fmt = format or detect_format(path)
    if fmt not in FORMATS:
        raise DataError(f"format must be one of {FORMATS}, got {fmt!r}")
    if path.stat().st_size == 0:
        raise DataError(f"data file {str(path)!r} is empty")
    if fmt == "libsvm":
        if libsvm_base not in (None, 0, 1):
            raise DataError(f"libsvm_base must be 0, 1 or None, got {libsvm_base!r}")
        return _load_libsvm(path, n_features, libsvm_base)
    if fmt == "parquet":
        _parquet_names(path)  # refuses a repeated column name before pyarrow's own, less clear, error
        try:
            df = pd.read_parquet(path)
        except Exception as exc:  # pyarrow raises many types for corrupt files
            raise DataError(f"cannot read {str(path)!r} as Parquet: {exc}") from None
        if len(df) == 0 and not allow_empty:
            raise DataError(f"data file {str(path)!r} has no data rows")
    else:
        df = _read_csv(path, header, allow_empty=allow_empty)
        _note_index_column(df, path)
    if not label_required and isinstance(label, str) and label not in [str(c) for c in df.columns]:
        label = None
    return table_from_frame(df, label, source=str(path), ids=ids, categorical=categorical)


def _note_index_column(df: pd.DataFrame, path: Path) -> None:
    """Warn when the first column has no name and holds the row numbers 0..n-1: a DataFrame's index written by
    ``to_csv`` without ``index=False``, which would be learned from as a feature (and leaks the row order)."""
    first = df.iloc[:, 0] if df.shape[1] else None
    if first is not None and str(df.columns[0]).startswith("Unnamed: 0") and \
            np.array_equal(first.to_numpy(), np.arange(len(df))):
        logger.warning("%s: its first column has no name and holds the row numbers 0..%d (a DataFrame index "
                       "written without index=False); it is read as a feature: drop it, or write the file with "
                       "index=False", path, len(df) - 1)


def infer_objective(y: np.ndarray) -> str:
    """binary for two label values, multiclass for text labels or at most 100 integers, else regression."""
    y = np.asarray(y)
    if y.dtype.kind in "fiub":
        values = np.unique(y)
        if len(values) == 2:
            return "binary"
        if len(values) <= 100 and np.all(values == np.round(values)):
            return "multiclass"
        return "regression"
    return "binary" if len(set(y.tolist())) == 2 else "multiclass"  # class names: classification


def label_text(v) -> str:
    """A label as a file or a config writes it: a number as -1, not -1.0; a class name as itself."""
    if isinstance(v, (str, bytes)) or not np.issubdtype(type(v), np.number):
        return str(v)
    return str(int(v)) if float(v).is_integer() else repr(float(v))


def _first_lines(path: Path, n: int = 21) -> list[str]:
    """The first ``n`` lines of a text file that are not blank (at least one)."""
    import gzip

    opener = gzip.open if path.name.lower().endswith(".gz") else open
    lines = []
    try:
        with opener(path, "rt", encoding="utf-8") as fh:
            for line in fh:
                if line.strip():
                    lines.append(line)
                    if len(lines) == n:
                        break
    except UnicodeDecodeError as exc:
        raise DataError(f"cannot read {str(path)!r} as text: {exc}{NOT_UTF8}") from None
    except OSError as exc:
        raise DataError(f"cannot read {str(path)!r} as text: {exc}") from None
    if not lines:
        raise DataError(f"data file {str(path)!r} is empty")
    return lines


def _separator(path: Path) -> str:
    """The separator of a CSV file: of ``, tab ; |``, the one its first line holds most often (among those
    every line holds); whitespace when its first line holds none.  A first line without any, above lines that
    each hold one in equal numbers (a title line, such as UCI's adult.test begins with), is refused: read as the
    header, it would make every row one text column."""
    import csv

    lines = _first_lines(path)
    first, below = lines[0], lines[1:]
    seps = [",", "\t", ";", "|"]
    everywhere = [c for c in seps if all(c in line for line in lines)]
    if everywhere:
        return max(everywhere, key=first.count)
    shared = [c for c in seps if below and all(c in line for line in below)]
    if shared:
        sep = max(shared, key=below[0].count)
        widths = {len(row) for row in csv.reader(below, delimiter=sep)}
        if sep not in first and len(widths) == 1:
            raise DataError(f"the first line of {str(path)!r}, {first.strip()[:60]!r}, has no {sep!r} where the "
                            f"lines below it have {widths.pop()} fields each: it is neither a header nor a row; "
                            f"remove it")
    sep = max(seps, key=first.count)
    if first.count(sep):
        return sep
    return r"\s+" if len(first.split()) > 1 else ","


def feature_columns(path, label=None, format: str | None = None, weight: str | None = None) -> list[str] | None:
    """The feature names of a data file, read from its header alone (no data rows are parsed): every column
    but the instance IDs, ``label`` and ``weight`` (a column of row weights); ``None`` for a file without names
    (LIBSVM, CSV without a header)."""
    path = Path(path)
    fmt = format or detect_format(path)
    if fmt == "libsvm" or not path.is_file() or path.stat().st_size == 0:
        return None
    if fmt == "parquet":
        columns = _parquet_names(path)
    else:
        df = _read_csv(path, None, nrows=1)
        if df.attrs.get("named", True) is False:
            return None
        columns = [str(c) for c in df.columns]
    try:  # a name, or an index as in a party config ("-1")
        label = _resolve_label(columns, label, str(path))
    except DataError:
        label = None
    return [c for c in columns if c not in (ID_COLUMN, label, weight)]


def _parquet_names(path: Path) -> list[str]:
    """The column names of a Parquet file, from its schema (no data read), but pandas' saved index."""
    import pyarrow.parquet as pq

    try:
        names = [str(c) for c in pq.read_schema(path).names if c != "__index_level_0__"]
    except Exception as exc:  # pyarrow raises many types for corrupt files
        raise DataError(f"cannot read {str(path)!r} as Parquet: {exc}") from None
    refuse_repeated_names(names, str(path))
    return names


def refuse_repeated_names(names, source: str) -> None:
    """Refuse two columns with one name: a label or feature named by it would be ambiguous, and pandas would
    quietly rename the second (``a.1``) in a CSV file.  Empty names (pandas' ``Unnamed: j``) are not compared."""
    seen: dict[str, int] = {}
    for j, name in enumerate(names):
        if name == "":
            continue
        if name in seen:
            raise DataError(f"{source!r} has two columns named {name!r} (columns {seen[name] + 1} and {j + 1}); "
                            f"give each column its own name")
        seen[name] = j


def exact_float_options(pandas_version: str) -> dict:
    """The ``read_csv`` options that read every float exactly as written, on pandas ``pandas_version``.

    pandas before 3.1 parses CSV floats by default with a fast parser that is one unit in the last place off for
    some values (a party's file would not read back the floats the partitioner wrote, and a lossless protocol's
    trees could then differ from the engine's on the unpartitioned file): pandas 3.0.6 read 32,380 of 100,000
    normal floats written in shortest form one off (by hand).  Exact parsing (``round_trip``) costs pandas 2
    about 3.4x (4 million floats: 1.9 s against 0.55 s with pandas 2.1, by hand); 3.1's default is exact, and
    fast, and deprecates the option."""
    major_minor = tuple(int(v) for v in re.findall(r"\d+", pandas_version)[:2])
    return {"float_precision": "round_trip"} if major_minor < (3, 1) else {}


_EXACT_FLOATS = exact_float_options(pd.__version__)


def read_csv(path, **options) -> pd.DataFrame:
    """``pandas.read_csv`` that reads every float exactly as written, on every pandas fedgrove supports."""
    return pd.read_csv(path, **options, **_EXACT_FLOATS)


def _read_csv(path: Path, header: bool | None, nrows: int | None = None, allow_empty: bool = False) -> pd.DataFrame:
    sep = _separator(path)
    try:
        if header is None:
            header = _has_header(read_csv(path, header=None, nrows=50, sep=sep, skipinitialspace=True,
                                          na_values=["?", "NA", "NaN", "nan", ""]))
        df = read_csv(path, header=0 if header else None, sep=sep, skipinitialspace=True,
                      na_values=["?", "NA", "NaN", "nan", ""], nrows=nrows)
        # the names as written: pandas renames a repeated one (a, a.1)
        names = read_csv(path, header=None, nrows=1, sep=sep, skipinitialspace=True, dtype=str,
                         keep_default_na=False).iloc[0] if header else []
    except pd.errors.EmptyDataError:
        raise DataError(f"data file {str(path)!r} is empty") from None
    except (pd.errors.ParserError, UnicodeDecodeError, ValueError) as exc:
        hint = NOT_UTF8 if isinstance(exc, UnicodeDecodeError) else ""
        raise DataError(f"cannot parse {str(path)!r} as CSV: {exc}{hint}") from None
    refuse_repeated_names([str(v) for v in names], str(path))
    if nrows is None and df.shape[1] > 1 and df.iloc[:, -1].isna().any():  # pandas fills a short row's end
        _refuse_short_rows(path, sep, df.shape[1], header)
    if not header:
        df.columns = [f"f{j}" for j in range(df.shape[1])]
        df.attrs["named"] = False
    if df.shape[0] == 0 and not (allow_empty and header):
        raise DataError(f"data file {str(path)!r} has no data rows")
    return df


def _refuse_short_rows(path: Path, sep: str, width: int, header: bool) -> None:
    """Refuse a row with fewer fields than the file's columns: pandas reads it with its last columns missing,
    as if its values were not shifted (a field left out, a line cut short).  Only asked when the last column
    has a missing value, which every short row gives it; a missing value is an empty field (``1,,3``, ``1,2,``).
    Lines are counted by their separators (0.38 s for a 147 MB file, timed by hand, where pandas took 0.7-1.2 s
    to read it), and read as CSV, quotes and all, once a line holds a quote."""
    import csv
    import gzip

    opener = gzip.open if path.name.lower().endswith(".gz") else open
    spaces = sep == r"\s+"

    def refuse(line: int, row: list[str]) -> None:
        shown = (" " if spaces else sep).join(row)
        empty = "" if spaces else f"an empty field (1{sep}{sep}3) or "
        raise DataError(f"line {line} of {str(path)!r} has {len(row)} field{'s' if len(row) > 1 else ''} "
                        f"({shown[:60]!r}) where the {'header' if header else 'first row'} has {width}: a field "
                        f"left out would shift the values that follow it; write each missing value as {empty}'?'")

    with opener(path, "rt", encoding="utf-8", newline="") as fh:
        quoted = False
        for k, line in enumerate(fh, 1):
            if not spaces and '"' in line:
                quoted = True  # a quoted field may hold the separator or a line break: read as CSV below
                break
            if (len(line.split()) if spaces else line.count(sep) + 1) < width and line.strip():
                refuse(k, line.split() if spaces else [v.strip() for v in line.rstrip("\r\n").split(sep)])
    if quoted:
        with opener(path, "rt", encoding="utf-8", newline="") as fh:
            rows = csv.reader(fh, delimiter=sep, skipinitialspace=True)
            for row in rows:
                if len(row) < width and any(v.strip() for v in row):  # blank lines are skipped, as by pandas
                    refuse(rows.line_num, row)


def _has_header(head: pd.DataFrame) -> bool:
    """Whether the first of these rows (read without a header) names the columns.  Not when it is all
    numbers; yes when it has text in a column whose other values are all numbers.  Text only in columns of
    text (a headerless file of categories, such as UCI's adult.data) is a record, unless the file has no
    numbers at all, the first row is all text and none of its values comes again below it."""
    first = head.iloc[0]
    text_first = (pd.to_numeric(first, errors="coerce").isna() & first.notna()).to_numpy()
    if not text_first.any():
        return False
    body = head.iloc[1:]
    if body.empty:
        return True
    numeric_body = np.array([bool(pd.to_numeric(body[c].dropna(), errors="coerce").notna().all())
                             and body[c].notna().any() for c in body.columns])
    if (text_first & numeric_body).any():
        return True
    return bool(text_first[first.notna().to_numpy()].all()) and not numeric_body.any() and \
        _all_distinct_from_body(first, body)


def _all_distinct_from_body(first: pd.Series, body: pd.DataFrame) -> bool:
    """A first row of text that repeats no value of its column below it reads as names, not as a record."""
    return all(first.iloc[j] not in set(body.iloc[:, j].dropna().astype(str)) for j in range(len(first))
               if pd.notna(first.iloc[j]))


def _resolve_label(columns: list[str], label, source: str) -> str | None:
    if label is None:
        return None
    if isinstance(label, str) and label in columns:
        return label
    if isinstance(label, str):
        trimmed = [c for c in columns if str(c).strip() == label.strip()]
        if len(trimmed) == 1:  # as column_order matches features: a CSV header loses its leading spaces
            return trimmed[0]
        try:
            label = int(label)
        except ValueError:
            shown = listing(columns, 20, show=repr)
            near = [c for c in columns if str(c).strip().casefold() == label.strip().casefold()]
            hint = f"; did you mean {near[0]!r}?" if len(near) == 1 else ""
            raise DataError(f"label column {label!r} not found in {source!r}; columns are: {shown}{hint}") from None
    if -len(columns) <= label < len(columns):
        return columns[label]
    raise DataError(f"label column index {label} is out of range for {source!r}, which has {len(columns)} columns")


_WHOLE = re.compile(r"[+-]?[0-9]+")


def text_id_code(value: str) -> int:
    """A text instance ID's 63-bit code: the first 8 bytes of its SHA-256 (domain-tagged), so that every party
    gives the same ID the same code."""
    digest = hashlib.sha256(b"fedgrove/id/v1|" + value.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def id_codes(values, source: str = "table") -> tuple[np.ndarray, np.ndarray | None]:
    """Instance IDs as int64 codes, and the text IDs (None when the IDs are whole numbers).  Whole numbers, as
    numbers or as text, are their own codes; any other ID (``cust-17``, ``17.5``) is coded by
    :func:`text_id_code` of its text.  The protocols align, intersect and sort by the codes; output files keep
    the text."""
    values = np.asarray(values)
    if values.dtype.kind in "iu":
        return values.astype(np.int64), None
    if values.dtype.kind == "f" and np.all(np.isfinite(values)) and np.all(values == np.round(values)) \
            and np.all(np.abs(values) < 2.0 ** 63):
        return values.astype(np.int64), None
    # a whole float (1.0 beside 2.5 in one column) is written as the whole number, as another party writes it
    text = np.array([str(int(v)) if isinstance(v, float) and v.is_integer() and abs(v) < 2.0 ** 63 else str(v)
                     for v in values.tolist()], dtype=object)
    # a whole number written as text (another party's file may hold it as a number) keeps its value
    codes = np.fromiter((int(v) if _WHOLE.fullmatch(v) and abs(int(v)) < 2 ** 63 else text_id_code(v)
                         for v in text), dtype=np.int64, count=len(text))
    uniq, counts = np.unique(codes, return_counts=True)
    if (counts > 1).any():  # 7 and 007 (one number written two ways), or a shared digest (never seen)
        code = uniq[np.argmax(counts > 1)]
        a, b = text[np.nonzero(codes == code)[0][:2]]
        raise DataError(f"column {ID_COLUMN!r} of {source!r}: IDs {a!r} and {b!r} name one instance (the same "
                        f"whole number, or text with the same digest); give each instance one ID")
    return codes, text


def table_from_frame(df: pd.DataFrame, label=None, source: str = "table", ids: bool = True,
                     categorical=None) -> Table:
    df = df.copy()
    df.columns = [str(c) for c in df.columns]
    refuse_repeated_names(list(df.columns), source)
    label_name = _resolve_label(list(df.columns), label, source)
    id_values = id_text = None
    if ids and ID_COLUMN in df.columns and label_name != ID_COLUMN:
        id_values = df.pop(ID_COLUMN).to_numpy()
        if pd.isna(id_values).any() or len(pd.unique(id_values)) != len(id_values):
            raise DataError(f"column {ID_COLUMN!r} of {source!r} must hold unique, non-empty instance IDs")
        id_values, id_text = id_codes(id_values, source)
    y = None
    if label_name is not None:
        y = df.pop(label_name).to_numpy()
        if pd.isna(y).any():
            bad = int(np.nonzero(pd.isna(y))[0][0])
            raise DataError(f"label column {label_name!r} of {source!r} has a missing value (data row {bad + 1})")
    given = _categorical_spec(categorical, list(df.columns), source)
    X = np.empty(df.shape, dtype=np.float64)
    categories, unseen = {}, {}
    for j, col in enumerate(df.columns):
        values = df[col]
        if col in given:
            X[:, j], categories[col], n_unseen = _encode(values, given[col])
            if n_unseen:
                unseen[col] = n_unseen
            continue
        if isinstance(values.dtype, pd.CategoricalDtype) and not isinstance(categorical, dict):
            # a column the file itself declares categorical (Parquet, pandas): its categories, sorted as text
            X[:, j], categories[col], _ = _encode(values, sorted({_as_text(c) for c in values.cat.categories}))
            continue
        seconds = as_seconds(values)
        if seconds is not None:
            X[:, j] = seconds
            continue
        numeric = pd.to_numeric(values, errors="coerce")
        bad = numeric.isna() & values.notna()
        if bad.any() and isinstance(values[bad].iloc[0], (list, tuple, dict, set, np.ndarray)):
            row = int(np.nonzero(bad.to_numpy())[0][0])
            value = values.iloc[row]
            kind = "records" if isinstance(value, dict) else "lists"  # a Parquet struct, or list (an ndarray)
            shown = value.tolist() if isinstance(value, np.ndarray) else value
            raise DataError(f"column {col!r} of {source!r} holds {kind} (data row {row + 1}: {shown!r}), a nested "
                            f"column: fedgrove reads flat columns of numbers, text or dates; give each element a "
                            f"column of its own")
        if bad.any() and categorical == "auto":
            X[:, j], categories[col], _ = _encode(values, None)
            continue
        if bad.any():
            row = int(np.nonzero(bad.to_numpy())[0][0])
            value = values.iloc[row]
            hint = (" (this model was trained without it as a category)" if isinstance(categorical, dict) else
                    "; or encode text columns as categories: --categorical auto (or the column names) on the "
                    "command line, categorical = \"auto\" in a federation party's [[party]] table, "
                    "categorical='auto' in Python")
            if isinstance(value, str) and _THOUSANDS.fullmatch(value.strip()):
                hint = ("; it looks like a number written with thousands separators (or, with one comma, a "
                        "decimal comma): write it without separators and with a decimal point")
            elif isinstance(value, str) and _DECIMAL_COMMA.fullmatch(value.strip()):  # a European spreadsheet's
                hint = "; it looks like a number written with a decimal comma: write it with a decimal point"
            elif isinstance(value, str) and _DATE.fullmatch(value.strip()) and not isinstance(categorical, dict):
                hint = ("; it looks like a date: write it as a number, such as seconds since 1970-01-01 UTC (how "
                        "fedgrove reads the timestamps of a Parquet file or a DataFrame), or as a Parquet "
                        "timestamp")
            elif label_name is None and col == df.columns[-1] and not isinstance(categorical, dict):
                hint += (f"; if it is the label column, name it: --label {col} on the command line, "
                         f"label={col!r} in Python")
            raise DataError(f"column {col!r} of {source!r} has a non-numeric value {value!r} "
                            f"(data row {row + 1}); features must be numbers (empty or '?' for missing){hint}")
        X[:, j] = numeric.to_numpy(dtype=np.float64)
    if np.isinf(X).any():
        row, j = (int(k[0]) for k in np.nonzero(np.isinf(X)))
        raise DataError(f"column {df.columns[j]!r} of {source!r} has an infinite value, {float(X[row, j])!r} (data row "
                        f"{row + 1}); features must be finite numbers (empty or '?' for missing)")
    return Table(X, y, list(df.columns), label_name, id_values, id_text=id_text,
                 named=bool(df.attrs.get("named", True)),
                 categories=categories, unseen=unseen)


def as_seconds(values: pd.Series) -> np.ndarray | None:
    """A date-time or date column (Parquet's timestamps and dates, a DataFrame's) as seconds since 1970-01-01 UTC
    (a date: its midnight), a duration column as seconds; None for any other column.  Read as numbers they were
    counts of the column's unit, which differs between pandas 2 (a DataFrame's: nanoseconds) and 3
    (microseconds), and between Parquet files (the writer's): a model, or a party, given the other would have
    read values a thousand times off."""
    if pd.api.types.is_datetime64_any_dtype(values):
        if getattr(values.dt, "tz", None) is not None:
            values = values.dt.tz_convert("UTC").dt.tz_localize(None)
        return ((values - pd.Timestamp("1970-01-01")) / pd.Timedelta(seconds=1)).to_numpy(dtype=np.float64)
    if pd.api.types.is_timedelta64_dtype(values):
        return (values / pd.Timedelta(seconds=1)).to_numpy(dtype=np.float64)
    if values.dtype.kind == "O" and _all_dates(values):  # Parquet's date32/date64, read as datetime.date objects
        return as_seconds(pd.to_datetime(values))
    return None


def _all_dates(values: pd.Series) -> bool:
    """A column of calendar dates (``datetime.date``, not date-times) and missing values, with at least one date."""
    import datetime

    present = values[values.notna()]
    return len(present) > 0 and all(type(v) is datetime.date for v in present)


def check_categories(categories) -> None:
    """Refuse given categories that are not a table of, per column, a list of distinct names: a list would be
    read as the names of columns to find categories in, a string as its letters, and a name given twice shifts
    the codes of those after it."""
    if not isinstance(categories, dict):
        raise DataError(f"the categories are {str(categories)[:60]}, expected each text column's categories, "
                        f"{{column: [category, ...]}}")
    for c, cats in categories.items():
        if not isinstance(cats, (list, tuple)) or any(isinstance(v, (bool, list, dict)) or v is None for v in cats):
            raise DataError(f"the categories of column {str(c)!r} must be a list of category names, got "
                            f"{str(cats)[:60]!r}")
        if len({str(v) for v in cats}) != len(cats):
            raise DataError(f"the categories of column {str(c)!r} name one category twice: {list(cats)[:20]}")


def _categorical_spec(categorical, columns: list[str], source: str) -> dict:
    """{column: its given categories, or None to find them} of the columns to encode by name."""
    if categorical is None or categorical == "auto":
        return {}
    if isinstance(categorical, str):
        raise DataError(f"categorical must be None, 'auto', a list of column names or a dict of categories, "
                        f"got {categorical!r}")
    spec = dict(categorical) if isinstance(categorical, dict) else {str(c): None for c in categorical}
    if isinstance(categorical, dict):  # a model's categories: columns it does not see are matched by name later
        check_categories(spec)
        return {str(c): [str(v) for v in cats] for c, cats in spec.items() if str(c) in columns}
    missing = [c for c in spec if c not in columns]
    if missing:
        raise DataError(f"categorical column(s) {', '.join(map(repr, missing))} not found in {source!r}")
    return spec


def _encode(values: pd.Series, categories):
    """Codes of a column's values (as text) among ``categories`` (default: its distinct values, sorted)."""
    present = values.notna().to_numpy()
    text = values[present].map(_as_text)
    if categories is None:
        categories = sorted(set(text))
    index = {c: k for k, c in enumerate(categories)}
    codes = np.full(len(values), np.nan)
    found = text.map(index)
    codes[np.nonzero(present)[0]] = found.to_numpy(dtype=np.float64)
    return codes, list(categories), int(found.isna().sum())


def _as_text(v) -> str:
    """A category as text: 7 and 7.0 (an integer column read as float) are the same category."""
    if isinstance(v, (float, np.floating)) and float(v).is_integer():
        return str(int(v))
    return str(v)


def libsvm_layout(path) -> tuple[int, int]:
    """How a LIBSVM file numbers its features: (its width, the index of its first feature).  The width spans
    its largest feature index; the first index is 0 when the file holds index 0, else 1 (the format's own).
    Read without densifying."""
    X, _, base = _read_libsvm(Path(path), None)
    return int(X.shape[1]), base


def _read_libsvm(path: Path, base: int | None):
    """(sparse X, y, first feature index) of a LIBSVM file.  ``base`` None finds the numbering: from 1, the
    format's own, unless the file holds index 0.  A file from 0 without index 0 (every row's first feature
    zero) cannot show its numbering: a test file is read with its training file's (``base``), or its features
    would shift by one."""
    from sklearn.datasets import load_svmlight_file

    try:  # read by index as written (column j is index j): one parse tells the numbering too
        X, y = load_svmlight_file(str(path), zero_based=True)
    except (ValueError, RuntimeError, UnicodeDecodeError) as exc:
        where = _libsvm_fault(path)  # scikit-learn's reader names the bad text but not its line
        raise DataError(f"cannot parse {str(path)!r} as LIBSVM: {where or exc}") from None
    except OverflowError:  # an index beyond 2^31 (scikit-learn's reader raised it from its C code)
        raise DataError(f"cannot parse {str(path)!r} as LIBSVM: a feature index is too large (at most "
                        f"2147483647); is the file LIBSVM (label index:value ...)?") from None
    holds_zero = bool((X.indices == 0).any())
    if base == 1 and holds_zero:
        raise DataError(f"{str(path)!r} numbers its features from 0 (it holds index 0), but the training "
                        f"data numbered them from 1: write both with one numbering (scikit-learn's "
                        f"dump_svmlight_file numbers from 0 unless given zero_based=False)")
    if base is None:
        base = 0 if holds_zero else 1
    return (X if base == 0 else X[:, 1:]), y, base


def _libsvm_lines(path: Path):
    """(line number, text) of each line of a LIBSVM file that holds a row: its comment (from '#') cut off, blank
    lines left out, as scikit-learn's reader counts its rows.  Read only to say where a fault is."""
    import bz2
    import gzip

    name = path.name.lower()
    opener = gzip.open if name.endswith(".gz") else bz2.open if name.endswith(".bz2") else open
    with opener(path, "rt", encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            text = line.split("#", 1)[0].strip()
            if text:
                yield number, text


def _libsvm_fault(path: Path) -> str | None:
    """Where and how the first malformed line of a LIBSVM file is malformed, or None when no line is (the
    reader's own message is then all there is to say)."""
    expected = "; expected a label, then index:value pairs with increasing whole-number indices"
    try:
        for number, text in _libsvm_lines(path):
            label, *pairs = text.split()
            try:
                float(label)
            except ValueError:
                return f"line {number}: the label {label!r} is not a number{expected}"
            previous = -1
            for pair in pairs:
                index, colon, value = pair.partition(":")
                if index == "qid" and colon:  # a ranking file's query id, which the reader skips
                    continue
                if not colon or not index.isdigit():
                    return f"line {number}: {pair!r} is not index:value{expected}"
                try:
                    float(value)
                except ValueError:
                    return f"line {number}: the value {value!r} of index {index} is not a number{expected}"
                if int(index) <= previous:
                    return (f"line {number}: index {index} follows index {previous}{expected}")
                previous = int(index)
    except (OSError, EOFError, ValueError):  # an unreadable or broken compressed file: the reader's message says
        return None
    return None


def _libsvm_line(path: Path, row: int) -> int | None:
    """The line number of a LIBSVM file's data row ``row`` (0-based), or None when it cannot be read again."""
    try:
        for k, (number, _) in enumerate(_libsvm_lines(path)):
            if k == row:
                return number
    except (OSError, EOFError, ValueError):
        return None
    return None


def _refuse_non_finite(path: Path, X, y, base: int) -> None:
    """A LIBSVM file's infinite values (scikit-learn's reader takes 'inf' and 1e500) and missing or infinite
    labels are refused as a CSV's are, naming the row, its line and the feature."""
    bad = np.nonzero(~np.isfinite(y))[0]
    if len(bad):
        row = int(bad[0])
        line = _libsvm_line(path, row)
        raise DataError(f"data row {row + 1}{f' (line {line})' if line else ''} of {str(path)!r} has the label "
                        f"{float(y[row])!r}; labels must be finite numbers")
    bad = np.nonzero(np.isinf(X.data))[0]
    if len(bad):
        k = int(bad[0])
        row = int(np.searchsorted(X.indptr, k, side="right")) - 1
        line = _libsvm_line(path, row)
        raise DataError(f"feature index {int(X.indices[k]) + base} of {str(path)!r} has an infinite value, "
                        f"{float(X.data[k])!r} (data row {row + 1}{f', line {line}' if line else ''}); features "
                        f"must be finite numbers (nan for missing)")


def _refuse_too_wide(path: Path, X, width: int, base: int) -> None:
    """fedgrove holds features densely: a file whose largest index asks for more memory than the machine has
    (one stray index of 1e8 made two rows 1.6 GB) is refused, naming that index, before any of it is allocated."""
    need = X.shape[0] * width * 8
    try:
        have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # not on this system: the allocation says so itself
        return
    if need > have:
        cols = X.indices
        row = int(np.searchsorted(X.indptr, int(np.argmax(cols)), side="right")) if len(cols) else 0
        raise DataError(f"{str(path)!r} read densely ({X.shape[0]} rows x {width} features) needs "
                        f"{need / 1e9:.3g} GB, more than this machine's {have / 1e9:.3g} GB: its largest feature "
                        f"index is {X.shape[1] - 1 + base} (data row {row}); is that index right?")


def _load_libsvm(path: Path, n_features: int | None, base: int | None = None) -> Table:
    X, y, base = _read_libsvm(path, base)  # as wide as the file's largest feature index
    if X.shape[0] == 0:
        raise DataError(f"data file {str(path)!r} has no data rows")
    _refuse_non_finite(path, X, y, base)
    width = n_features if n_features is not None else X.shape[1]
    _refuse_too_wide(path, X, width, base)
    names = [f"f{j + base}" for j in range(max(X.shape[1], n_features or 0))]  # the file's own indices
    left_out = []
    if n_features is not None and X.shape[1] > n_features:  # values where a model's training file had none
        left_out = [names[j] for j in np.unique(X[:, n_features:].nonzero()[1]) + n_features]
        X = X[:, :n_features]
    X = X.toarray()
    if n_features is not None and X.shape[1] < n_features:  # a file that does not mention the last features
        X = np.hstack([X, np.zeros((X.shape[0], n_features - X.shape[1]))])
    return Table(X, np.asarray(y, dtype=np.float64), names[:X.shape[1]], "label", named=False, left_out=left_out,
                 meta={LIBSVM_BASE: base})


def write_table(table: Table, path, format: str | None = None) -> None:
    """Write a table (IDs as ``_id`` first, then features, then the weights, then the label), atomically."""
    path = Path(path)
    fmt = format or detect_format(path)
    df = pd.DataFrame(table.X, columns=table.feature_names)
    if table.ids is not None:
        df.insert(0, ID_COLUMN, table.id_labels)
    if table.weights is not None:
        df[table.weight_name or "weight"] = table.weights
    if table.y is not None:
        df[table.label_column] = table.y
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        if fmt == "parquet":
            df.to_parquet(tmp, index=False)
        elif fmt == "csv":
            df.to_csv(tmp, index=False)  # each float as the shortest text that reads back as the same float
        else:
            raise DataError(f"cannot write format {fmt!r}; use csv or parquet")
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
