"""Trees as structured arrays.

A :class:`Tree` is one structured array of nodes (:data:`NODE_DTYPE`, one
record per node, children by index) plus a ``values`` matrix (one row per node,
one column per output: 1 for boosting and regression, ``n_classes`` for a
classification forest).  The same arrays go to disk, to the wire and to the
prediction kernels.

``threshold`` is NaN where the holder of the tree does not know it: in
vertical protocols only the party that owns a split feature stores its
threshold (``owner`` names that party; -1 means a centralised tree).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedgrove.engine.predict import (predict_leaves, predict_leaves_binned, predict_leaves_ranked, predict_mean_values,
                                     predict_raw_sum, rank_cuts)
from fedgrove.exceptions import DataError, ModelFormatError
from fedgrove.jsontext import FrozenJSON

NODE_DTYPE = np.dtype([
    ("feature", np.int32),       # split feature, -1 for a leaf
    ("bin", np.int32),           # split bin: code <= bin goes left
    ("threshold", np.float64),   # raw threshold: x <= threshold goes left
    ("missing_left", np.uint8),  # where NaN goes
    ("left", np.int32),
    ("right", np.int32),
    ("gain", np.float64),
    ("count", np.float64),       # (weighted) number of training samples
    ("depth", np.int32),
    ("owner", np.int32),         # party holding the split, -1 if centralised
])
LEAF = -1
# how a model whose trees hold other parties' splits is applied
FEDERATED_PREDICTION = ("list each party's test file (test = ...) in the federation's configs and run `fedgrove "
                        "simulate CONFIG --predict` or `fedgrove party CONFIG --predict`")
FOREIGN_SPLITS = ("this tree holds splits whose thresholds belong to another party; predict through the federation "
                  f"instead ({FEDERATED_PREDICTION})")


def _unchangeable(a: np.ndarray) -> bool:
    """Whether nothing can write to ``a``'s data: it and every array it views are read-only, down to one that
    holds its own data or to immutable bytes (a message's buffer)."""
    while not a.flags.writeable:
        base = a.base
        if base is None or type(base) is bytes:
            return True
        if not isinstance(base, np.ndarray):
            return False
        a = base
    return False


@dataclass
class Tree:
    nodes: np.ndarray   # NODE_DTYPE
    values: np.ndarray  # float64 (n_nodes, n_outputs)

    def __post_init__(self):
        if self.nodes.dtype != NODE_DTYPE:
            raise ModelFormatError("tree nodes do not have the fedgrove node layout")
        if self.values.ndim != 2 or self.values.shape[0] != self.nodes.shape[0]:
            raise ModelFormatError("tree values must be (n_nodes, n_outputs)")

    @property
    def n_nodes(self) -> int:
        return int(self.nodes.shape[0])

    @property
    def is_leaf(self) -> np.ndarray:
        return self.nodes["feature"] == LEAF

    @property
    def foreign_splits(self) -> bool:
        """Whether some split's threshold belongs to another party (NaN here): the tree predicts only through its
        federation."""
        return bool(np.isnan(self.nodes["threshold"][self.nodes["feature"] >= 0]).any())

    @property
    def n_leaves(self) -> int:
        return int(self.is_leaf.sum())

    @property
    def max_depth(self) -> int:
        return int(self.nodes["depth"].max())

    def to_dict(self) -> dict:
        """The tree as JSON-ready data: a :class:`~fedgrove.jsontext.FrozenJSON`, the same object (and JSON
        text) while the tree's arrays keep their content, so rewriting a checkpoint re-encodes only new trees.
        Do not modify the returned dict.

        Once made, the dict vouches for the arrays by making them read-only (those that hold their own data;
        writing to them raises ValueError): change a tree by giving it new arrays (``tree.values = ...``), or
        set an array writeable again, after which the next call compares its content with the dict's."""
        nodes, values = self.nodes, self.values
        memo = self.__dict__.get("_dict_memo")
        # a party checkpoints its whole model after every tree, so this runs trees^2 / 2 times a run: the arrays
        # the dict was made from, still read-only to the bottom, cannot have changed (0.2 us against 1.1 us for
        # comparing their bytes with a copy, itself ~30x cheaper than hashing them)
        if memo is not None and memo[2] is nodes and memo[3] is values and _unchangeable(nodes) \
                and _unchangeable(values):
            return memo[1]
        key = (nodes.dtype, values.shape, nodes.tobytes(), values.tobytes())
        if memo is not None and memo[0] == key:
            d = memo[1]
        else:
            # (the node columns spell out their non-finite values; leaf values are finite but for a defect)
            d = FrozenJSON({"nodes": {n: _encode_column(nodes[n]) for n in NODE_DTYPE.names},
                            "values": values.tolist()}, finite=bool(np.isfinite(values).all()))
        for a in (nodes, values):
            if a.flags.owndata:
                a.flags.writeable = False
        self.__dict__["_dict_memo"] = (key, d, nodes, values)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Tree":
        try:
            cols = d["nodes"]
            n = len(cols["feature"])
            nodes = np.zeros(n, dtype=NODE_DTYPE)
            for name in NODE_DTYPE.names:
                kind = NODE_DTYPE[name]
                if kind.kind in "iu":  # checked before the cast: numpy 1 wrapped -1 into a uint8 (255)
                    col = np.asarray(cols[name])  # JSON true and false read as 1 and 0 beside numbers: refused
                    info = np.iinfo(kind)
                    if col.size and (col.dtype.kind not in "iu" or col.min() < info.min or col.max() > info.max
                                     or bool in set(map(type, cols[name]))):
                        raise ModelFormatError(f"node column {name!r} holds a value that is not an integer in "
                                               f"[{info.min}, {info.max}]")
                else:
                    col = [np.nan if v is None else _decode_float(v) for v in cols[name]]
                if len(col) != n:
                    raise ModelFormatError(f"node column {name!r} has {len(col)} entries, expected {n}")
                nodes[name] = np.asarray(col, dtype=kind)
            values = np.array(d["values"], dtype=np.float64).reshape(n, -1).copy()  # (its own data, not a view)
        except (KeyError, TypeError, ValueError, OverflowError) as exc:
            raise ModelFormatError(f"malformed tree record: {exc}") from exc
        tree = cls(nodes, values)
        tree.validate()
        return tree

    def validate(self) -> None:
        """Check the features (a column, or -1 for a leaf) and the child links: every internal node points at
        two later nodes, and no node is the child of two (the routing kernels follow each node's rows from its
        one parent)."""
        n = self.n_nodes
        if np.any(self.nodes["feature"] < LEAF):
            raise ModelFormatError(f"tree has a negative split feature {int(self.nodes['feature'].min())}")
        internal = ~self.is_leaf
        idx = np.nonzero(internal)[0]
        children = []
        for side in ("left", "right"):
            child = self.nodes[side][internal]
            if np.any(child <= idx) or np.any(child >= n):
                raise ModelFormatError("tree has a child index out of range")
            children.append(child)
        if np.bincount(np.concatenate(children), minlength=n).max() > 1:
            raise ModelFormatError("tree has a node that is the child of two nodes")


def _encode_column(col: np.ndarray) -> list:
    out = col.tolist()
    if col.dtype.kind == "f":  # JSON has no NaN or infinity: null, "inf", "-inf" (only those entries are visited)
        for i in np.flatnonzero(~np.isfinite(col)).tolist():
            out[i] = None if out[i] != out[i] else ("inf" if out[i] > 0 else "-inf")
    return out


def _decode_float(v):
    if v == "inf":
        return np.inf
    if v == "-inf":
        return -np.inf
    return v


class PackedEnsemble:
    """Flat node arrays of several trees, ready for the prediction kernels."""

    def __init__(self, trees: list[Tree]):
        self.trees = trees
        sizes = [t.n_nodes for t in trees]
        self.tree_offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        nodes = np.concatenate([t.nodes for t in trees]) if trees else np.zeros(0, dtype=NODE_DTYPE)
        self.feature = np.ascontiguousarray(nodes["feature"])
        self.bin = np.ascontiguousarray(nodes["bin"])
        self.threshold = np.ascontiguousarray(nodes["threshold"])
        self.missing_left = np.ascontiguousarray(nodes["missing_left"]).astype(np.bool_)
        self.left = np.ascontiguousarray(nodes["left"])
        self.right = np.ascontiguousarray(nodes["right"])
        self.width = int(self.feature.max()) + 1 if len(self.feature) else 0  # columns a row needs at least
        self._node_values: np.ndarray | None = None  # the trees' values end to end, made when first needed

    def leaves(self, X: np.ndarray) -> np.ndarray:
        """Leaf index (local to each tree) per sample and tree, from raw features."""
        if not self.trees:
            return np.zeros((X.shape[0], 0), dtype=np.int32)
        X = self._routable(X)
        return predict_leaves(X, self.feature, self.threshold, self.missing_left, self.left, self.right,
                              self.tree_offsets)

    def raw_sum(self, X: np.ndarray, tree_class, base, n_trees: int) -> np.ndarray:
        """``base`` plus the first ``n_trees`` trees' leaf values (their first output), each added to column
        ``tree_class[t]``: a GBDT's raw scores without the leaf matrix."""
        X = self._routable(X)
        return predict_raw_sum(X, self.feature, self.threshold, self.missing_left, self.left, self.right,
                               self.tree_offsets, self.node_values()[:, 0], np.asarray(tree_class, dtype=np.int64),
                               np.asarray(base, dtype=np.float64), int(n_trees))

    def node_values(self) -> np.ndarray:
        """The trees' value rows end to end, ``(total nodes, outputs)``, in the order of the node arrays."""
        if self._node_values is None:
            self._node_values = np.ascontiguousarray(np.concatenate([t.values for t in self.trees]),
                                                     dtype=np.float64)
        return self._node_values

    def mean_values(self, X: np.ndarray) -> np.ndarray:
        """The mean over the trees of each row's leaf value row (a forest's prediction), in one pass."""
        return predict_mean_values(self._routable(X), self.feature, self.threshold, self.missing_left, self.left,
                                   self.right, self.tree_offsets, self.node_values())

    def _routable(self, X) -> np.ndarray:
        if np.isnan(self.threshold[self.feature >= 0]).any():
            raise ModelFormatError(FOREIGN_SPLITS)
        if not (isinstance(X, np.ndarray) and X.dtype == np.float64 and X.flags.f_contiguous):
            X = np.ascontiguousarray(X, dtype=np.float64)  # row-major, or column-major as given (faster for one tree)
        if X.ndim != 2 or X.shape[1] < self.width:  # the kernels do not check bounds
            raise DataError(f"the trees split on feature {self.width - 1}: rows need at least {self.width} "
                            f"columns, got shape {X.shape}")
        return X

    def leaves_binned(self, X_binned: np.ndarray, missing_codes: np.ndarray) -> np.ndarray:
        if not self.trees:
            return np.zeros((X_binned.shape[0], 0), dtype=np.int32)
        return predict_leaves_binned(X_binned, self.feature, self.bin, self.missing_left, self.left, self.right,
                                     np.asarray(missing_codes, dtype=np.int32), self.tree_offsets)


class RankedRows:
    """A fixed table prepared for routing many single trees with raw thresholds through it.

    Each value is replaced by its rank among the distinct values of its
    feature in this table, in a column-major array of the smallest unsigned
    type that holds them (NaN gets the type's largest value).  A tree's
    threshold becomes the rank of the last distinct value <= it, so every row
    reaches the same leaf as :meth:`PackedEnsemble.leaves` on the raw table;
    the rows are partitioned node by node (:func:`predict_leaves_ranked`), each
    node reading its column forwards in small integers.  Used by protocols
    that route each new tree of another party through their rows.
    """

    def __init__(self, X: np.ndarray):
        X = np.asarray(X, dtype=np.float64)
        assert X.ndim == 2, X.shape
        uniques = [np.unique(col[~np.isnan(col)]) for col in X.T]
        most = max((len(u) for u in uniques), default=0)
        dtype = next(t for t in (np.uint8, np.uint16, np.uint32) if most < np.iinfo(t).max)
        self.missing_rank = int(np.iinfo(dtype).max)
        self.ranks = np.empty(X.shape, dtype=dtype, order="F")
        for f, (col, u) in enumerate(zip(X.T, uniques)):
            missing = np.isnan(col)
            self.ranks[:, f] = np.where(missing, self.missing_rank, np.searchsorted(u, np.where(missing, 0.0, col)))
        self.offsets = np.concatenate([[0], np.cumsum([len(u) for u in uniques])]).astype(np.int64)
        self.uniques = np.concatenate(uniques) if uniques else np.zeros(0)

    def leaves(self, tree: Tree) -> np.ndarray:
        """Leaf index per row (int32), as ``PackedEnsemble([tree]).leaves(X)`` gives on the raw table."""
        n = tree.nodes
        internal = n["feature"] >= 0
        if tree.foreign_splits:
            raise ModelFormatError(FOREIGN_SPLITS)
        if internal.any() and n["feature"][internal].max() >= self.ranks.shape[1]:
            raise ModelFormatError(f"tree splits on feature {int(n['feature'].max())} of a table with "
                                   f"{self.ranks.shape[1]} features")
        return predict_leaves_ranked(self.ranks, *self.layout(tree))

    def layout(self, tree: Tree) -> tuple:
        """The tree as :func:`predict_leaves_ranked` takes it: thresholds as rank cuts, leaves pointing to
        themselves (a cut of -1 sends every value right, and both ways lead back to the leaf)."""
        n = tree.nodes
        leaf = n["feature"] < 0
        own = np.arange(len(n), dtype=np.int32)
        cut = rank_cuts(self.uniques, self.offsets, np.ascontiguousarray(n["feature"]),
                        np.ascontiguousarray(n["threshold"]))
        return (np.where(leaf, 0, n["feature"]).astype(np.int32), cut,
                n["missing_left"].astype(np.bool_), np.where(leaf, own, n["left"]).astype(np.int32),
                np.where(leaf, own, n["right"]).astype(np.int32), self.missing_rank)
