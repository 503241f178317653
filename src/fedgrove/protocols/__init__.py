"""Federated protocols: one folder per protocol, ``messages.py`` plus one file per role.

Protocols import the engine, the Channel API and crypto, never a concrete
transport, so the same role code runs in-process and over gRPC.
"""

import hashlib

import numpy as np

from fedgrove.engine.model import check_row_labels
from fedgrove.exceptions import DataError, InvalidParameterError, ProtocolError

#: the most bytes of prediction answers (go-left bits, leaf sets, routed leaves) one party sends in one message:
#: a larger test set is asked about in chunks of rows (vertical GBDT, HybridTree, Federated Forest)
MAX_PREDICT_BYTES = 32 * 1024 * 1024


def prediction_chunks(n: int, bits_per_row: int) -> list[tuple[int, int]]:
    """Consecutive ``(start, stop)`` ranges of ``n`` test rows whose answers of ``bits_per_row`` bits a row keep a
    message within :data:`MAX_PREDICT_BYTES`: multiples of 8 rows, at least 8; one range unless the test set
    and the model are large (``(0, 0)`` for no rows)."""
    step = max(8, (MAX_PREDICT_BYTES * 8) // max(1, int(bits_per_row)) // 8 * 8)
    return [(start, min(n, start + step)) for start in range(0, max(n, 1), step)]


# horizontal peers see only their own labels, which may lack a class: the count is given, never inferred
NEEDS_N_CLASSES = ("the number of classes, the same at every party (a party's labels may lack a class): "
                   "GBDTParams(n_classes=K), or in a federation config [params] n_classes = K (or [federation] "
                   "classes = [...])")


def check_parts(parts, what: str, form: str, sizes: tuple = (2,), n: int | None = None) -> None:
    """Refuse, naming ``what`` and the expected ``form``, a simulation's per-party list whose items are not
    tuples of one of ``sizes`` items, or (``n``) that does not have ``n`` of them: they failed deep inside a
    party's thread as an IndexError or an unpacking error."""
    if not isinstance(parts, (list, tuple)):
        raise InvalidParameterError(f"{what} must be a list with one {form} per party, got {type(parts).__name__}")
    if n is not None and len(parts) != n:
        raise InvalidParameterError(f"{what} has {len(parts)} items for {n} parties: give one {form} per party, in "
                                    f"the parties' order")
    for k, part in enumerate(parts):
        if not isinstance(part, (list, tuple)) or len(part) not in sizes:
            got = f"{len(part)} items" if isinstance(part, (list, tuple)) else type(part).__name__
            raise InvalidParameterError(f"{what}[{k}] must be {form}, got {got}")


def check_vertical_rows(y, X_parts, X_test_parts=None) -> None:
    """A vertical simulation's parts are matched by position: pandas parts (and labels) must line up
    (:func:`~fedgrove.engine.model.check_row_labels`), the test parts among themselves."""
    check_row_labels({"y": y, **{f"X_parts[{k}]": x for k, x in enumerate(X_parts)}})
    if X_test_parts is not None:
        check_row_labels({f"X_test_parts[{k}]": x for k, x in enumerate(X_test_parts)})


def check_ids_everywhere(has_ids: dict, what: str = "file") -> None:
    """Refuse parties of which some have instance IDs and some not: those with IDs sort their rows by ID, the
    others keep them in their order, so rows would be matched to other instances without a word."""
    with_ids = [p for p, has in has_ids.items() if has]
    without = [p for p, has in has_ids.items() if not has]
    def whose(parties: list) -> str:
        return f"{parties[0]}'s {what} has" if len(parties) == 1 else f"the {what}s of {', '.join(parties)} have"

    if with_ids and without:
        raise ProtocolError(f"{whose(with_ids)} instance IDs (an _id column) and {whose(without)} none: give every "
                            f"party's {what} the _id column, or none (rows are then matched by position)")


def party_names(names, n: int, prefix: str, what: str) -> list[str]:
    """A simulation's party names: ``names`` (one for each of the ``n`` items of ``what``, the per-party list)
    or ``prefix`` + 0, 1, ...  A shorter list left the parties beyond it out of the federation without a sign;
    a longer one failed as an IndexError inside a party."""
    if names is None:
        return [f"{prefix}{k}" for k in range(n)]
    names = list(names)
    if len(names) != n:
        raise InvalidParameterError(f"{len(names)} name{'' if len(names) == 1 else 's'} for {n} parties: give one "
                                    f"name for each item of {what}, in its order")
    return names


def instance_ids(ids, n_rows: int, party: str) -> np.ndarray | None:
    """A party's instance IDs as int64, refused unless they are integers (floats only with whole values: 0.5
    was cut to 0 and matched to another party's instance 0), one per row and no two equal (rows sharing an ID
    would be matched to the same row of another party); None stays None."""
    if ids is None:
        return None
    given = np.asarray(ids).reshape(-1)
    kind = given.dtype.kind if given.size else "i"  # no IDs: of no type
    if kind not in "iuf":
        odd = next((v for v in given.tolist() if not isinstance(v, int) or isinstance(v, bool)), None)
        raise DataError(f"{party}: instance IDs must be integers, got {given.dtype.name} values such as {odd!r}; "
                        f"map other IDs to integers the same way at every party (a data file's _id column may hold "
                        f"text: fedgrove codes it alike everywhere)")
    if kind == "f":
        bad = ~np.isfinite(given) | (given != np.round(given)) | (np.abs(given) >= 2.0 ** 63)
    else:
        bad = given > np.iinfo(np.int64).max if kind == "u" else np.zeros(given.shape, dtype=bool)
    if bad.any():
        raise DataError(f"{party}: instance IDs must be whole numbers that fit in a signed 64-bit integer, got "
                        f"{given[bad].tolist()[0]!r}")
    ids = given.astype(np.int64)
    if len(ids) != n_rows:
        raise DataError(f"{party}: {len(ids)} instance IDs for {n_rows} rows")
    values, counts = np.unique(ids, return_counts=True)
    if len(values) != len(ids):
        raise DataError(f"{party}: instance IDs must be unique; {int(values[counts > 1][0])} is given to "
                        f"{int(counts.max())} rows")
    return ids


def features_digest(names) -> bytes:
    """A hash of a party's feature names in their order (and of its categorical columns' categories: see
    :func:`fedgrove.runner.roles.schema`; empty when its data has no names), so that parties meant to hold
    the same features can check that they do, in the same order, without sending the names."""
    if names is None:
        return b""
    return hashlib.sha256("\x1f".join(str(n) for n in names).encode()).digest()


def peer_tree(columns: dict, values: np.ndarray, where: str, n_features: int):
    """The tree a peer sent as node columns (``columns``: NODE_DTYPE field -> one value a node; fields not given
    are 0), refused as :func:`check_peer_tree` says, or when its columns and values differ in length."""
    from fedgrove.engine.tree import NODE_DTYPE, Tree

    n = len(columns["feature"])
    if any(len(col) != n for col in columns.values()) or values.shape[0] != n:
        raise ProtocolError(f"{where}: the tree's columns have different lengths")
    nodes = np.zeros(n, dtype=NODE_DTYPE)
    for name, col in columns.items():
        nodes[name] = col
    tree = Tree(nodes, np.ascontiguousarray(values))
    check_peer_tree(tree, where, n_features)
    return tree


def check_peer_tree(tree, where: str, n_features: int) -> None:
    """Refuse a tree a peer sent unless it is one this party can route and score: children that form a tree,
    internal nodes splitting on one of this party's ``n_features`` features, one finite value a node (the
    boosting protocols send a tree per output).
    The routing and scoring kernels index by a tree's features and children unchecked (numba does not check
    bounds), so a tree outside these read and wrote past their arrays."""
    from fedgrove.exceptions import ModelFormatError

    if tree.n_nodes == 0:
        raise ProtocolError(f"{where}: the tree has no node")
    try:
        tree.validate()
    except ModelFormatError as exc:
        raise ProtocolError(f"{where}: {exc}") from None
    if (top := int(tree.nodes["feature"].max())) >= n_features:
        raise ProtocolError(f"{where}: the tree splits on feature {top}; this party has {n_features}")
    if tree.values.shape[1] != 1 or not np.isfinite(tree.values).all():
        raise ProtocolError(f"{where}: the tree's values are {tree.values.shape[1]} a node (expected 1), or not "
                            f"all finite")


def peer_sketches(values, weights, lengths, where: str, n_features: int | None = None) -> list:
    """A peer's quantile sketches (``lengths[f]`` (value, weight) pairs for feature ``f``, concatenated), refused
    unless they are ``n_features`` (when given) summaries of finite values with positive finite weights."""
    from fedgrove.engine.binning import QuantileSketch

    lengths = np.asarray(lengths)
    if (n_features is not None and len(lengths) != n_features) or np.any(lengths < 0) \
            or int(lengths.sum()) != len(values) or len(weights) != len(values):
        raise ProtocolError(f"{where}: sketches of {len(lengths)} features with {len(values)} values and "
                            f"{len(weights)} weights do not match their lengths"
                            + (f" and the {n_features} features" if n_features is not None else ""))
    if not (np.isfinite(values).all() and np.isfinite(weights).all() and np.all(weights > 0)):
        raise ProtocolError(f"{where}: sketches must hold finite values with positive finite weights")
    bounds = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return [QuantileSketch(values[a:b], weights[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]


def check_split_lists(where: str, open_nodes, **lists) -> None:
    """A peer's per-node lists (``nodes`` first, then features, bins, children ...), refused unless they are of
    one length, the ``nodes`` are distinct and among ``open_nodes``, and the children (``left``, ``right``, when
    given) are distinct new nodes: zipped unchecked, lists of unequal lengths were taken as far as the shortest."""
    lengths = {k: len(v or []) for k, v in lists.items()}
    if len(set(lengths.values())) > 1:
        raise ProtocolError(f"{where}: lists of different lengths {lengths}")
    nodes = list(lists["nodes"] or [])
    if len(set(nodes)) != len(nodes) or any(n not in open_nodes for n in nodes):
        raise ProtocolError(f"{where}: nodes {nodes} are not distinct open nodes of the tree")
    children = list(lists.get("left") or []) + list(lists.get("right") or [])
    if len(set(children)) != len(children) or any(c in open_nodes or c in nodes for c in children):
        raise ProtocolError(f"{where}: children {children} are not distinct new nodes")


def check_same_width(widths: dict) -> None:
    """Refuse parties meant to hold the same features that hold different numbers of them (``widths``: party ->
    its number of features)."""
    if len(set(widths.values())) > 1:
        raise ProtocolError(f"the parties hold different numbers of features: {dict(sorted(widths.items()))}; a "
                            f"LIBSVM file is as wide as its largest feature index (it leaves zeros out), so give "
                            f"parties with LIBSVM files the same n_features = ... in their [[party]] tables")


def check_same_features(digests: dict) -> None:
    """Refuse parties whose feature names differ, in names or in order (parties without names pass): their
    columns would be mixed up feature by feature without any other sign."""
    groups: dict[bytes, list[str]] = {}
    for party, digest in digests.items():
        if digest:
            groups.setdefault(bytes(digest), []).append(party)
    if len(groups) > 1:
        shown = " | ".join(", ".join(sorted(g)) for g in sorted(groups.values()))
        raise ProtocolError(f"the parties' feature columns differ in names or order, or in a categorical column's "
                            f"categories, or in their LIBSVM files' first feature index (parties that agree: "
                            f"{shown}); every party must hold the same features in the same column order, and the "
                            f"same categories (list them in every party's config: categorical = {{column = [...]}}; "
                            f"each party's log notes the categories it found); a LIBSVM file numbered from 0 whose "
                            f"rows never hold feature 0 reads as numbered from 1 (give its party libsvm_base = 0)")


def refuse_unsupported(params, protocol: str) -> None:
    """Refuse, by name, the boosting settings a federated protocol does not implement and would otherwise ignore:
    early stopping and its metric (a federation trains without a validation set).  (Row and column subsampling
    every boosting protocol implements: each draws rows and features every round with
    :class:`~fedgrove.engine.gbdt.RoundSampler`.)"""
    if params.early_stopping_rounds:
        raise InvalidParameterError(f"early stopping is not supported by {protocol}: a federation trains without a "
                                    f"validation set (early_stopping_rounds={params.early_stopping_rounds}; "
                                    f"remove it)")
    if params.eval_metric is not None:
        raise InvalidParameterError(f"eval_metric is not used by {protocol}: it scores a validation set, and a "
                                    f"federation trains without one (eval_metric={params.eval_metric!r}; remove "
                                    f"it; test predictions are scored by accuracy and AUC, or RMSE)")


def with_kernel_threads(roles: dict, n_threads: int | None) -> dict:
    """Each party's role run with at most ``n_threads`` numba kernel threads (``None``: as many as this thread
    has), for the in-process ``run_*`` functions: numba's setting is per thread, so each party's is its own.
    ``fedgrove simulate`` sets them itself (:func:`fedgrove.runner.run.kernel_threads`)."""
    from fedgrove.engine.threads import thread_limit

    def limited(fn):
        def run(ch):
            with thread_limit(n_threads):
                return fn(ch)
        return run
    return {name: limited(fn) for name, fn in roles.items()}
