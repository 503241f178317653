"""Trained models and their versioned JSON form.

A model file is one JSON object::

    {"format": "fedgrove-model", "version": 1, "kind": "gbdt" | "forest",
     "fedgrove_version": "...", ...model fields..., "trees": [...]}

Loading a file of another format, another version or a corrupt file raises
:class:`~fedgrove.exceptions.ModelFormatError` with the reason.  Files are
written atomically (temporary file, then rename): a failed save leaves no
half-written model behind.
"""

from __future__ import annotations

import errno
import json
import os
import tempfile
from pathlib import Path

import numpy as np

from fedgrove import jsontext
from fedgrove._version import __version__
from fedgrove.engine.binning import BinMapper
from fedgrove.engine.losses import make_objective
from fedgrove.engine.predict import sum_leaf_values
from fedgrove.engine.threads import thread_limit
from fedgrove.engine.tree import FEDERATED_PREDICTION, NODE_DTYPE, PackedEnsemble, Tree
from fedgrove.exceptions import DataError, InvalidParameterError, ModelFormatError, NotFittedError

FORMAT = "fedgrove-model"
FORMAT_VERSION = 1
IMPORTANCE_KINDS = ("gain", "split")


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` so that readers see the old file or the whole new one."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one (a new file is readable
    by its owner only)."""
    path = Path(path)
    if path.is_dir():  # os.replace named the temporary file: "Is a directory: '.m.json.x1.tmp' -> 'out'"
        raise IsADirectoryError(errno.EISDIR, "is a directory, where a file name belongs", str(path))
    if not path.parent.is_dir():
        raise FileNotFoundError(errno.ENOENT, f"cannot write it: its directory {str(path.parent)!r} does not exist",
                                str(path))
    try:  # errors named the temporary file (".m.json.x1.tmp"), which the caller never asked for
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise type(exc)(exc.errno, f"cannot write it in {str(path.parent)!r}: {exc.strerror}", str(path)) from None
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def open_owner_only(path: str | os.PathLike, binary: bool = False):
    """Open ``path`` for reading and writing in place, created if missing (nothing truncated), and make it
    readable and writable by its owner only, as :func:`atomic_write_bytes` leaves the files it writes: for files
    updated in place that hold what a party learnt (a checkpoint's trees, scores and states)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.fchmod(fd, 0o600)  # (a file an earlier version, or the umask, left readable by others)
        return os.fdopen(fd, "r+b" if binary else "r+", **({} if binary else {"encoding": "utf-8"}))
    except BaseException:
        os.close(fd)
        raise


def _is_frame(X) -> bool:
    return hasattr(X, "columns") and hasattr(X, "iloc")


# what a feature matrix holding text is told
TEXT_FEATURES = ("NaN for missing values; text columns need encoding first, e.g. "
                 "fedgrove.data.io.table_from_frame(df, categorical='auto')")


def as_numbers(a, name: str, expected: str) -> np.ndarray:
    """``a`` as float64, or a DataError naming the first value that is not a number (and, for a DataFrame, its
    column).  A DataFrame's timestamps and dates are seconds since 1970-01-01 UTC and its durations seconds, as
    :func:`fedgrove.data.io.load_table` reads them."""
    if _is_frame(a):
        from fedgrove.data.io import _all_dates, as_seconds

        timed = [c for c, dtype in a.dtypes.items()  # durations, date-times, dates
                 if dtype.kind in "mM" or (dtype.kind == "O" and _all_dates(a[c]))]
        nullable = [c for c, dtype in a.dtypes.items() if _nullable_number(dtype)]
        if timed or nullable:
            a = a.copy()
            for c in timed:
                a[c] = as_seconds(a[c])
            for c in nullable:  # pandas' Int64, Float64, boolean: their <NA> is a missing value, NaN
                a[c] = a[c].to_numpy(dtype=np.float64, na_value=np.nan)
    elif hasattr(a, "dtype") and hasattr(a, "to_numpy") and _nullable_number(a.dtype):  # a Series
        a = a.to_numpy(dtype=np.float64, na_value=np.nan)
    if getattr(getattr(a, "dtype", None), "kind", "") == "c" or (_is_frame(a) and any(
            getattr(dtype, "kind", "") == "c" for dtype in a.dtypes)):  # float64 would drop the imaginary parts
        raise DataError(f"{name} holds complex numbers, expected real ones ({expected})")
    try:
        return np.asarray(a, dtype=np.float64)
    except (ValueError, TypeError):
        pass
    columns = non_number_columns(a) if _is_frame(a) else []
    if columns:
        bad = next(v for v in a[columns[0]] if not _is_number(v))
        raise DataError(f"{name} column {columns[0]!r} holds {bad!r}, not a number ({expected})") from None
    flat = np.asarray(a, dtype=object).ravel()
    bad = next((v for v in flat if not _is_number(v)), None)
    raise DataError(f"{name} holds {bad!r}, not a number ({expected})") from None


def non_number_columns(a) -> list:
    """The columns of ``a`` whose values are not all numbers: a DataFrame's names, or the positions of a 2-D
    array's; none for anything else."""
    if _is_frame(a):
        columns = [(c, a[c]) for c in a.columns]
    elif isinstance(a, np.ndarray) and a.ndim == 2 and a.dtype.kind in "OSU":
        columns = [(j, a[:, j]) for j in range(a.shape[1])]
    else:
        return []
    out = []
    for name, values in columns:
        try:
            np.asarray(values, dtype=np.float64)
        except (ValueError, TypeError):
            out.append(name)
    return out


def check_row_labels(parts: dict) -> None:
    """Tables are matched row by row, by position (X with y; vertical parties' parts with each other).  Where
    two of ``parts`` ({what: table}) are pandas objects whose row labels (index) put the same labels in another
    order, or differ where neither is the default 0..n-1, the same position holds different instances (a part
    shuffled or filtered on its own was trained on silently misaligned): refused, saying how to align them.  A
    default index beside another (a part given reset_index(drop=True)) is taken as positional, as numpy's."""
    import pandas as pd

    def default(index) -> bool:
        return isinstance(index, pd.RangeIndex) and index.start == 0 and index.step == 1

    indexed = {what: t.index for what, t in parts.items() if t is not None and hasattr(t, "index")
               and hasattr(t, "iloc")}
    if len(indexed) < 2:
        return
    (first, ref), *rest = indexed.items()
    for what, index in rest:
        if index.equals(ref) or len(index) != len(ref):  # other lengths: named by the row-count check
            continue
        permuted = index.is_unique and ref.is_unique and set(index) == set(ref)
        if permuted or not (default(index) or default(ref)):
            raise DataError(f"{what} and {first} are pandas objects with different row labels (index): rows are "
                            f"matched by position, so they would be misaligned; align them first "
                            f"(e.g. {what}.loc[{first}.index]), or reset_index(drop=True) where the order is right")


def _nullable_number(dtype) -> bool:
    """A pandas extension dtype of numbers or truth values, whose missing value is ``pd.NA``."""
    import pandas as pd

    return isinstance(dtype, pd.api.extensions.ExtensionDtype) and dtype.kind in "iufb"


def _is_number(v) -> bool:
    try:
        float(v)
        return True
    except (ValueError, TypeError):
        return False


def names_of(X, names=None) -> list[str] | None:
    """The features' names: ``names`` when given, else a DataFrame's columns, else ``None``."""
    if names is not None:
        return [str(n) for n in names]
    if _is_frame(X):
        return [str(c) for c in X.columns]
    return None


def by_names(X, names, source: str):
    """A DataFrame's columns put in the order of the features ``names`` (matched by name; columns the model
    does not use are left out; see :func:`fedgrove.data.io.column_order`); anything else as it is."""
    if names is not None and _is_frame(X):
        from fedgrove.data.io import column_order

        order = column_order(X.columns, names, source)
        if order is not None:
            return X.iloc[:, order]
    return X


class TreeEnsembleModel:
    """Common part of boosted and forest models: trees, packing, persistence."""

    kind = "base"

    def __init__(self, bin_mapper: BinMapper | None, params: dict, feature_names=None, classes=None):
        self.trees: list[Tree] = []
        self.bin_mapper = bin_mapper
        self.params = dict(params)
        self.feature_names = list(feature_names) if feature_names is not None else None
        self.classes = list(classes) if classes is not None else None
        self.metadata: dict = {}
        self.written_by: str | None = None  # the fedgrove version that saved a loaded model
        self._n_features: int | None = None  # the width of the rows a model without a bin mapper takes
        self._packed: PackedEnsemble | None = None

    @property
    def n_trees(self) -> int:
        return len(self.trees)

    def _pack(self) -> PackedEnsemble:
        if not self.trees:
            raise NotFittedError("the model has no trees")
        if self._packed is None or len(self._packed.trees) != len(self.trees):
            self._packed = PackedEnsemble(self.trees)
        return self._packed

    def _kernel_threads(self):
        """A context in which prediction's kernels run on the ``n_threads`` the model was trained with (its
        ``params``; every core where it names none), as LightGBM's and XGBoost's boosters predict on theirs."""
        n = self.params.get("n_threads")
        return thread_limit(n if isinstance(n, int) and not isinstance(n, bool) and n >= 1 else None)

    def _check_X(self, X) -> np.ndarray:
        if hasattr(X, "toarray"):
            X = X.toarray()
        X = by_names(X, self.feature_names, "the DataFrame")
        X = as_numbers(X, "X", "NaN for missing values" + (
            "; this model's text columns are encoded by fedgrove.data.io.load_table(path, "
            "categorical=model.metadata['categories'])" if self.metadata.get("categories") else ""))
        n_features = self.n_features
        if X.ndim != 2 or (n_features is not None and X.shape[1] != n_features):
            hint = "; one row is X.reshape(1, -1)" if X.ndim == 1 and len(X) == n_features else ""
            raise DataError(f"X must have shape (n_samples, {n_features}), got {X.shape}{hint}")
        return X

    @property
    def n_features(self) -> int | None:
        """How many columns the rows this model takes have: its bin mapper's; without one (models trained by
        some federated protocols) the number its trainer set, else one per owned feature or per name; None when
        the model does not know."""
        if self.bin_mapper is not None:
            return self.bin_mapper.n_features
        if self._n_features is not None:
            return self._n_features
        if self.metadata.get("feature_owners"):
            return len(self.metadata["feature_owners"])
        return len(self.feature_names) if self.feature_names is not None else None

    @n_features.setter
    def n_features(self, k: int) -> None:
        if self.bin_mapper is not None and k != self.bin_mapper.n_features:
            raise ValueError(f"the model's bin mapper has {self.bin_mapper.n_features} features, not {k}")
        self._n_features = int(k)

    def feature_importance(self, kind: str = "gain") -> np.ndarray:
        """Per feature (column of the rows the model takes), over every split of every tree: ``"gain"`` sums
        the splits' gains (boosting: the loss reduction the split scored; forest: the impurity decrease weighted
        by the node's share of the tree's samples, scikit-learn's definition), ``"split"`` counts the splits.

        A federated model's splits on other parties' features count too: the model knows the feature (its
        owner and position, ``metadata["feature_owners"]``) and the gain, not the threshold."""
        return feature_importance(self.trees, kind, self.n_features)

    def feature_labels(self) -> list[str]:
        """A name per feature for reports: the training table's column names; for a federated model without
        them, the party's own columns by name and the others' by owner and column (``party1:3``); else ``f0``,
        ``f1``, ..."""
        width = len(self.feature_importance("split"))
        if self.feature_names is not None and len(self.feature_names) == width:
            return [str(n) for n in self.feature_names]
        owners = self.metadata.get("feature_owners")
        if owners and len(owners) == width:
            me, own = self.metadata.get("party"), self.metadata.get("own_feature_names") or []
            return [str(own[j]) if party == me and j < len(own) else f"{party}:{j}" for party, j in owners]
        return [f"f{j}" for j in range(width)]

    def _check_structure(self) -> None:
        """Raise ModelFormatError where a loaded model's parts do not fit together (the prediction kernels index
        by them unchecked: a tampered file could read outside its arrays)."""

    def _check_classes(self, classification: bool) -> None:
        if not classification:
            if self.classes is not None:
                raise ModelFormatError(f"a regression model has classes {self.classes!r}")
            return
        c = self.classes
        if not all(isinstance(v, (str, int, float)) for v in c) or len(set(c)) != len(c) or len(c) != self.n_classes:
            raise ModelFormatError(f"classes {c!r}: expected {self.n_classes} distinct names or numbers")

    def _check_value_width(self, width: int) -> None:
        """Each node holds ``width`` values, and every leaf finite ones (a NaN leaf made NaN predictions, which
        the scores then refused with a traceback)."""
        for t, tree in enumerate(self.trees):
            if tree.values.shape[1] != width:
                raise ModelFormatError(f"tree {t} has {tree.values.shape[1]} values a node, expected {width}")
            bad = np.flatnonzero(tree.is_leaf & ~np.isfinite(tree.values).all(axis=1))
            if bad.size:
                raise ModelFormatError(f"tree {t}'s leaf (node {int(bad[0])}) has the value "
                                       f"{tree.values[bad[0]].tolist()}, not a finite number")

    def predict_leaf(self, X) -> np.ndarray:
        """Leaf index of every sample in every tree, shape ``(n_samples, n_trees)``."""
        X = self._check_X(X)
        with self._kernel_threads():
            return self._pack().leaves(X)

    # -- persistence ----------------------------------------------------------------------
    def _fields(self) -> dict:
        return {}

    def to_dict(self) -> dict:
        return {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "kind": self.kind,
            "fedgrove_version": __version__,
            "params": _jsonable(self.params),
            "feature_names": self.feature_names,
            "classes": _jsonable(self.classes),
            "metadata": _jsonable(self.metadata),
            "bin_mapper": self.bin_mapper.to_dict() if self.bin_mapper is not None else None,
            "n_features": self._n_features,
            **self._fields(),
            "trees": [t.to_dict() for t in self.trees],
        }

    def save(self, path) -> None:
        # (each tree's JSON text as its dict cached it: made once a run, by the first checkpoint or by this)
        atomic_write_text(path, jsontext.dumps(self.to_dict(), allow_nan=False))

    @staticmethod
    def load(path) -> "TreeEnsembleModel":
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ModelFormatError(f"model file {str(path)!r} does not exist") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ModelFormatError(f"cannot read model file {str(path)!r}: {exc}") from None
        try:
            d = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ModelFormatError(f"{str(path)!r} is not a fedgrove model file: invalid JSON ({exc})") from None
        return model_from_dict(d, source=str(path))


def feature_importance(trees: list[Tree], kind: str = "gain", width: int | None = None) -> np.ndarray:
    """Per feature over the splits of ``trees``: summed gains (``"gain"``) or their number (``"split"``); at
    least ``width`` entries (see :meth:`TreeEnsembleModel.feature_importance`)."""
    if kind not in IMPORTANCE_KINDS:
        raise InvalidParameterError(f"kind must be one of {', '.join(IMPORTANCE_KINDS)}, got {kind!r}")
    nodes = np.concatenate([t.nodes for t in trees]) if trees else np.zeros(0, dtype=NODE_DTYPE)
    nodes = nodes[nodes["feature"] >= 0]
    used = int(nodes["feature"].max()) + 1 if len(nodes) else 0
    width = used if width is None else max(width, used)
    weights = nodes["gain"] if kind == "gain" else None
    return np.bincount(nodes["feature"], weights=weights, minlength=width).astype(np.float64)


def model_from_dict(d, source: str = "model") -> TreeEnsembleModel:
    if isinstance(d, dict) and d.get("format") != FORMAT and ("party" in d and "splits" in d
                                                               or str(d.get("format", "")).startswith("fedgrove-")):
        what = f"party {d['party']}'s part" if "party" in d else f"a {d['format']} file, a party's part"
        raise ModelFormatError(f"{source!r} is {what} of a federated model, which predicts through its "
                               f"federation ({FEDERATED_PREDICTION})")
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        raise ModelFormatError(f"{source!r} is not a fedgrove model file (no \"format\": \"{FORMAT}\" field)")
    if d.get("version") != FORMAT_VERSION:
        raise ModelFormatError(f"{source!r} has model format version {d.get('version')!r}; this fedgrove "
                               f"({__version__}) reads version {FORMAT_VERSION}")
    kinds = {"gbdt": GBDTModel, "forest": ForestModel}
    if not isinstance(d.get("kind"), str) or d["kind"] not in kinds:
        raise ModelFormatError(f"{source!r} has unknown model kind {d.get('kind')!r}")
    for field, kind in (("metadata", dict), ("params", dict), ("feature_names", list), ("classes", list),
                        ("trees", list)):
        if d.get(field) is not None and not isinstance(d[field], kind):
            raise ModelFormatError(f"{source!r} is corrupt: its {field} is a {type(d[field]).__name__}, expected a "
                                   f"{kind.__name__}")
    _check_metadata(d.get("metadata") or {}, source)
    if not isinstance(d.get("fedgrove_version", ""), str):
        raise ModelFormatError(f"{source!r} is corrupt: its fedgrove_version is {d['fedgrove_version']!r}")
    try:
        try:
            model = kinds[d["kind"]]._from_dict(d)
            model._check_structure()
        except ModelFormatError as exc:  # what is wrong inside: name the file
            raise ModelFormatError(f"{source!r} is corrupt: {exc}") from None
        model.written_by = d.get("fedgrove_version")
        if d.get("n_features") is not None:  # absent from files written before 0.1.0's last changes
            model.n_features = int(d["n_features"])
        width = model.n_features
        for t, tree in enumerate(model.trees):
            if width is not None and tree.n_nodes and tree.nodes["feature"].max() >= width:
                raise ModelFormatError(f"{source!r} is corrupt: tree {t} splits on feature "
                                       f"{int(tree.nodes['feature'].max())} of a model with {width} features")
        return model
    except ModelFormatError:
        raise
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        raise ModelFormatError(f"{source!r} is corrupt: {type(exc).__name__}: {exc}") from None


def check_tree_class(tree_class: list, n_outputs: int) -> None:
    """Each tree's output column must be one of the model's: prediction adds the tree's values into it unchecked
    (a file saying otherwise crashed the process, or predicted into another column)."""
    if bad := [c for c in tree_class if not 0 <= c < n_outputs]:
        raise ModelFormatError(f"tree_class holds {bad[0]}, expected an output in [0, {n_outputs - 1}]")


def _check_metadata(meta: dict, source: str) -> None:
    """The metadata that prediction reads (the label column, the text columns' categories, a LIBSVM file's first
    index) must have the form training writes."""
    def bad(key, expected):
        raise ModelFormatError(f"{source!r} is corrupt: its metadata {key} is {meta[key]!r}, expected {expected}")

    if meta.get("label") is not None and (not isinstance(meta["label"], (str, int)) or isinstance(meta["label"], bool)):
        bad("label", "a column name or number")
    if meta.get("categories") is not None:
        from fedgrove.data.io import check_categories

        try:
            check_categories(meta["categories"])
        except DataError:
            bad("categories", "a list of distinct categories per column")
    if meta.get("libsvm_base") is not None and meta["libsvm_base"] not in (0, 1):
        bad("libsvm_base", "0 or 1")
    owners = meta.get("feature_owners")
    if owners is not None and not (isinstance(owners, list) and all(
            isinstance(o, list) and len(o) == 2 and isinstance(o[0], str) and type(o[1]) is int for o in owners)):
        bad("feature_owners", "a [party, column] pair per feature")
    if meta.get("own_feature_names") is not None and not isinstance(meta["own_feature_names"], list):
        bad("own_feature_names", "a list of names")
    clients = meta.get("clients")  # a Federated Forest master's
    if clients is not None and not (isinstance(clients, list) and all(isinstance(c, str) for c in clients)):
        bad("clients", "a list of party names")


def _jsonable(obj):
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return _jsonable(obj.tolist())
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, float) and not np.isfinite(obj):
        return None
    return obj


class GBDTModel(TreeEnsembleModel):
    """A boosted ensemble: ``raw = base_score + sum of tree values`` per output."""

    kind = "gbdt"

    def __init__(self, objective: str, n_classes: int, base_score, bin_mapper=None, params=None,
                 feature_names=None, classes=None):
        super().__init__(bin_mapper, params or {}, feature_names, classes)
        self.objective = objective
        self.n_classes = int(n_classes)
        self._obj = make_objective(objective, self.n_classes)
        self.base_score = np.asarray(base_score, dtype=np.float64).reshape(-1)
        if self.classes is None and objective != "regression":  # labels 0..K-1, as the library takes them
            self.classes = list(range(self.n_classes))
        self.tree_class: list[int] = []
        self.best_iteration: int | None = None

    @property
    def n_outputs(self) -> int:
        return self._obj.n_outputs

    @property
    def n_rounds(self) -> int:
        return len(self.trees) // self.n_outputs

    def add_tree(self, tree: Tree, output: int = 0) -> None:
        self.trees.append(tree)
        self.tree_class.append(int(output))
        self._packed = None

    def truncate(self, n_rounds: int) -> None:
        keep = n_rounds * self.n_outputs
        self.trees = self.trees[:keep]
        self.tree_class = self.tree_class[:keep]
        self._packed = None
        if self.best_iteration is not None and self.best_iteration >= n_rounds:  # its round was cut off
            self.best_iteration = None

    def predict_raw(self, X, n_rounds: int | None = None) -> np.ndarray:
        """Raw margins, shape ``(n_samples,)`` or ``(n_samples, n_classes)`` for multiclass."""
        X = self._check_X(X)
        with self._kernel_threads():
            raw = self._pack().raw_sum(X, self.tree_class, self._base(), self._n_trees(n_rounds))
        return raw[:, 0] if self.n_outputs == 1 else raw

    def _base(self) -> np.ndarray:
        return np.asarray(self.base_score, dtype=np.float64).reshape(-1)

    def _n_trees(self, n_rounds: int | None) -> int:
        return len(self.trees) if n_rounds is None else min(len(self.trees), n_rounds * self.n_outputs)

    def raw_from_leaves(self, leaves: np.ndarray, n_rounds: int | None = None) -> np.ndarray:
        """Raw margins from each sample's leaf in each tree (``leaves``: ``(n_samples, n_trees)``)."""
        n_trees = self._n_trees(n_rounds)
        leaves = np.asarray(leaves)
        if leaves.ndim != 2 or leaves.shape[1] < n_trees:
            raise ValueError(f"leaves must have one column per tree ({n_trees}), got shape {leaves.shape}")
        base = self._base()
        if n_trees == 0:
            raw = np.tile(base, (leaves.shape[0], 1))
        else:
            packed = self._pack()
            with self._kernel_threads():
                raw, bad = sum_leaf_values(np.ascontiguousarray(leaves, dtype=np.int32), packed.node_values()[:, 0],
                                           packed.tree_offsets, np.asarray(self.tree_class, dtype=np.int64), base,
                                           n_trees)
            if bad >= 0:
                t = next(t for t in range(n_trees) if not 0 <= leaves[bad, t] < self.trees[t].n_nodes)
                raise ValueError(f"leaf {int(leaves[bad, t])} of sample {bad} is outside tree {t}, which has "
                                 f"{self.trees[t].n_nodes} nodes")
        return raw[:, 0] if self.n_outputs == 1 else raw

    def predict_proba(self, X, n_rounds: int | None = None) -> np.ndarray:
        if self.objective == "regression":
            raise NotFittedError("predict_proba is only defined for classification models")
        return self.output_from_raw(self.predict_raw(X, n_rounds))

    def output_from_raw(self, raw) -> np.ndarray:
        """Class probabilities (n, K), or values (n,) for regression, from raw scores (``predict_raw``'s, or a
        federation's)."""
        raw = np.asarray(raw, dtype=np.float64)
        if self.objective == "regression":
            return raw.reshape(-1)
        return self._obj.transform(raw.reshape(len(raw), self.n_outputs))  # -1 is no width for 0 rows

    def decide(self, out: np.ndarray) -> np.ndarray:
        if self.objective == "regression":
            return out
        return np.argmax(out, axis=1)

    def predict(self, X, n_rounds: int | None = None) -> np.ndarray:
        """Class index (classification) or value (regression)."""
        if self.objective == "regression":
            return self.predict_raw(X, n_rounds)
        return self.decide(self.predict_proba(X, n_rounds))

    def _check_structure(self) -> None:
        k = self.n_outputs
        if self.base_score.shape != (k,):
            raise ModelFormatError(f"base_score has {self.base_score.size} entries, expected {k} (one per output)")
        if not np.all(np.isfinite(self.base_score)):
            raise ModelFormatError(f"base_score {self.base_score.tolist()} is not finite")
        check_tree_class(self.tree_class, k)
        self._check_classes(self.objective != "regression")
        self._check_value_width(1)
        b = self.best_iteration
        rounds = len(self.trees) // k if k else 0
        if b is not None and (isinstance(b, bool) or not isinstance(b, (int, np.integer)) or not 0 <= b < rounds):
            raise ModelFormatError(f"best_iteration {b!r} is not a round of the model's {rounds} (0-based), or null")

    def _fields(self) -> dict:
        return {"objective": self.objective, "n_classes": self.n_classes, "base_score": self.base_score.tolist(),
                "tree_class": self.tree_class, "best_iteration": self.best_iteration}

    @classmethod
    def _from_dict(cls, d: dict) -> "GBDTModel":
        bm = BinMapper.from_dict(d["bin_mapper"]) if d.get("bin_mapper") else None
        m = cls(d["objective"], d["n_classes"], d["base_score"], bm, d.get("params"), d.get("feature_names"),
                d.get("classes"))
        m.metadata = d.get("metadata") or {}
        m.best_iteration = d.get("best_iteration")
        tree_class = d["tree_class"]
        if len(tree_class) != len(d["trees"]):
            raise ModelFormatError("tree_class and trees have different lengths")
        for tree, c in zip(d["trees"], tree_class):
            m.add_tree(Tree.from_dict(tree), c)
        return m


class ForestModel(TreeEnsembleModel):
    """A random forest: class probabilities or values averaged over trees."""

    kind = "forest"

    def __init__(self, task: str, n_classes: int, bin_mapper=None, params=None, feature_names=None, classes=None):
        super().__init__(bin_mapper, params or {}, feature_names, classes)
        if task not in ("classification", "regression"):
            raise ModelFormatError(f"unknown forest task {task!r}")
        self.task = task
        self.n_classes = int(n_classes)
        if self.classes is None and task == "classification":  # labels 0..K-1, as the library takes them
            self.classes = list(range(self.n_classes))

    def add_tree(self, tree: Tree) -> None:
        self.trees.append(tree)
        self._packed = None

    def _mean_of(self, X) -> np.ndarray:
        X = self._check_X(X)
        with self._kernel_threads():
            return self._pack().mean_values(X)

    def _mean_values(self, leaves: np.ndarray) -> np.ndarray:
        acc = np.zeros((leaves.shape[0], self.trees[0].values.shape[1]))
        for t, tree in enumerate(self.trees):
            acc += tree.values[leaves[:, t]]
        return acc / len(self.trees)

    def predict_proba(self, X) -> np.ndarray:
        if self.task != "classification":
            raise NotFittedError("predict_proba is only defined for classification forests")
        return self._mean_of(X)

    def predict(self, X) -> np.ndarray:
        out = self._mean_of(X)
        return np.argmax(out, axis=1) if self.task == "classification" else out[:, 0]

    def decide(self, out):
        return np.argmax(out, axis=1) if self.task == "classification" else out

    def _check_structure(self) -> None:
        self._check_classes(self.task == "classification")
        self._check_value_width(self.n_classes if self.task == "classification" else 1)

    def _fields(self) -> dict:
        return {"task": self.task, "n_classes": self.n_classes}

    @classmethod
    def _from_dict(cls, d: dict) -> "ForestModel":
        bm = BinMapper.from_dict(d["bin_mapper"]) if d.get("bin_mapper") else None
        m = cls(d["task"], d["n_classes"], bm, d.get("params"), d.get("feature_names"), d.get("classes"))
        m.metadata = d.get("metadata") or {}
        for tree in d["trees"]:
            m.add_tree(Tree.from_dict(tree))
        return m


def load_model(path) -> TreeEnsembleModel:
    """Load a model saved by :meth:`TreeEnsembleModel.save`."""
    return TreeEnsembleModel.load(path)
