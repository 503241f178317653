"""Depth-wise tree growth driven by a pluggable split finder.

The grower owns the tree's shape: the frontier (open nodes of the current
layer), node records, stopping rules and leaf values.  *Where* histograms come
from and *who* chooses a split is the :class:`SplitFinder`'s business: the local
:class:`~fedgrove.engine.splitter.HistogramSplitFinder` for centralised
training, and protocol-specific finders in :mod:`fedgrove.protocols` whose
histograms come from other parties.  One call of :meth:`SplitFinder.find_splits`
covers a whole layer, so a federated finder needs one round per layer.

A protocol may grow a few layers here (:meth:`TreeGrower.grow_layer`), read the
frontier and hand its nodes to another party, as HybridTree does.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable

import numpy as np

from fedgrove.engine.threads import serial_if
from fedgrove.engine.tree import LEAF, NODE_DTYPE, Tree


@dataclass
class Layer:
    """The open nodes of one depth: tree node ids and their statistics."""

    node_ids: np.ndarray  # int64 (n,)
    stats: np.ndarray     # float64 (n, n_stats)
    depth: int

    def __len__(self) -> int:
        return int(self.node_ids.shape[0])


@dataclass
class LayerSplits:
    """The best split found for each node of a layer (``feature == -1``: none)."""

    gain: np.ndarray
    feature: np.ndarray
    bin: np.ndarray
    missing_left: np.ndarray
    left_stats: np.ndarray
    threshold: np.ndarray   # NaN where the deciding party does not know it
    owner: np.ndarray       # party holding each split feature, -1 centralised

    @classmethod
    def empty(cls, n: int, n_stats: int) -> "LayerSplits":
        return cls(np.full(n, -np.inf), np.full(n, LEAF, dtype=np.int32), np.zeros(n, dtype=np.int32),
                   np.zeros(n, dtype=bool), np.zeros((n, n_stats)), np.full(n, np.nan),
                   np.full(n, -1, dtype=np.int32))


class SplitFinder(ABC):
    """Builds histograms and chooses splits for the grower."""

    n_stats: int

    @abstractmethod
    def root_stats(self) -> np.ndarray:
        """Statistics of the root node, shape ``(n_stats,)``."""

    @abstractmethod
    def find_splits(self, layer: Layer) -> LayerSplits:
        """Best split for every node of ``layer``."""

    @abstractmethod
    def apply_splits(self, layer: Layer, split_rows: np.ndarray, splits: LayerSplits,
                     child_ids: np.ndarray) -> np.ndarray | None:
        """Partition the nodes ``layer.node_ids[split_rows]``; children get ``child_ids[k] = (left, right)``.

        The next layer handed to :meth:`find_splits` lists the children in this
        order: left, right of the first split node, then of the second, ...
        May return the children's statistics (same order) when the partition
        knows them better than the histograms did (exact counts); else None.
        """

    @abstractmethod
    def sample_weight(self, stats: np.ndarray) -> np.ndarray:
        """(Weighted) sample count of nodes with statistics ``stats`` (n, n_stats)."""

    def splittable(self, stats: np.ndarray) -> np.ndarray:
        """Which nodes could gain from a split at all (default: all); pure CART nodes cannot."""
        return np.ones(len(stats), dtype=bool)

    def serial_layer(self, layer: Layer) -> bool:
        """Whether the kernels that split ``layer`` are better run on one thread (default: never)."""
        return False


class TreeGrower:
    """Grow one tree layer by layer.

    Parameters
    ----------
    finder : SplitFinder
    max_depth : int or None
        Depth of the deepest leaf (root has depth 0); ``None``: grow until no
        node can split.
    leaf_value : callable
        Maps node statistics ``(n, n_stats)`` to leaf values ``(n, n_outputs)``.
    min_samples_split : float
        A node with fewer (weighted) samples is a leaf.
    min_split_gain : float
        A split is kept only when its gain exceeds this value (>= for CART's
        ``min_impurity_decrease``, see ``gain_inclusive``).
    """

    def __init__(self, finder: SplitFinder, max_depth: int | None, leaf_value: Callable[[np.ndarray], np.ndarray],
                 min_samples_split: float = 2.0, min_split_gain: float = 0.0, gain_inclusive: bool = False):
        self.finder = finder
        self.max_depth = max_depth
        self.leaf_value = leaf_value
        self.min_samples_split = min_samples_split
        self.min_split_gain = min_split_gain
        self.gain_inclusive = gain_inclusive
        # node records, one plain array per field (grown by doubling); the tree's structured array is made once,
        # by finish: per-layer writes to plain arrays cost less than to a structured array's fields
        self._n = 0
        self._fields: dict[str, np.ndarray] = {}
        self._node_stats = np.empty((0, 0))
        self.frontier: Layer | None = None

    # -- node bookkeeping ------------------------------------------------------------
    def _reserve(self, n_more: int, n_stats: int) -> None:
        need = self._n + n_more
        cap = len(self._node_stats)
        if need <= cap:
            return
        cap = max(need, 2 * cap, 64)
        if self.max_depth is not None and self.max_depth < 30:  # a depth-limited tree has at most 2^(d+1) - 1
            most = 2 ** (self.max_depth + 1) - 1
            # up to depth 10 (2,047 nodes, about 120 kB) all at once: growing 64 -> 511 for depth 8 took three
            # copies a tree, 4 ms of a9a's 100-tree fit
            cap = max(need, most if self.max_depth <= 10 else min(cap, most))
        grown = {}
        for name in NODE_DTYPE.names:
            a = np.empty(cap, dtype=NODE_DTYPE[name])
            if name in self._fields:
                a[:self._n] = self._fields[name][:self._n]
            grown[name] = a
        self._fields = grown
        stats = np.empty((cap, n_stats))
        if self._n:
            stats[:self._n] = self._node_stats[:self._n]
        self._node_stats = stats

    def _new_nodes(self, stats: np.ndarray, depth: int) -> np.ndarray:
        k = len(stats)
        self._reserve(k, stats.shape[1])
        first, end = self._n, self._n + k
        f = self._fields
        for name in ("feature", "left", "right"):
            f[name][first:end] = LEAF
        f["bin"][first:end] = 0
        f["threshold"][first:end] = np.nan
        f["missing_left"][first:end] = 0
        f["gain"][first:end] = 0.0
        f["owner"][first:end] = -1
        f["depth"][first:end] = depth
        f["count"][first:end] = self.finder.sample_weight(stats)
        self._node_stats[first:end] = stats
        self._n = end
        return np.arange(first, end, dtype=np.int64)

    def _all_nodes(self) -> np.ndarray:
        nodes = np.empty(self._n, dtype=NODE_DTYPE)
        for name in NODE_DTYPE.names:
            nodes[name] = self._fields[name][:self._n]
        return nodes

    # -- growth ---------------------------------------------------------------------
    def start(self) -> Layer:
        root = np.asarray(self.finder.root_stats(), dtype=np.float64)[None, :]
        ids = self._new_nodes(root, 0)
        self.frontier = Layer(ids, root, 0)
        return self.frontier

    @property
    def done(self) -> bool:
        return self.frontier is None or len(self.frontier) == 0

    def grow_layer(self) -> Layer:
        """Split the frontier once; returns the new frontier (possibly empty).  On one thread where the finder
        says so (:meth:`SplitFinder.serial_layer`): the same tree, in less time."""
        with serial_if(self.finder.serial_layer(self.frontier)):
            return self._grow_layer()

    def _grow_layer(self) -> Layer:
        layer = self.frontier
        if self.max_depth is not None and layer.depth >= self.max_depth:
            return self._close(layer)
        can_split = (self.finder.sample_weight(layer.stats) >= self.min_samples_split) & \
            self.finder.splittable(layer.stats)
        # only nodes that may split are searched (and get histograms); the others are leaves now
        open_rows = np.nonzero(can_split)[0]
        if not len(open_rows):
            return self._close(layer)
        if len(open_rows) == len(layer):
            searched = layer
            splits = found = self.finder.find_splits(searched)
        else:
            searched = Layer(layer.node_ids[open_rows], layer.stats[open_rows], layer.depth)
            found = self.finder.find_splits(searched)
            splits = LayerSplits.empty(len(layer), layer.stats.shape[1])
            for name in ("gain", "feature", "bin", "missing_left", "left_stats", "threshold", "owner"):
                getattr(splits, name)[open_rows] = getattr(found, name)
        if self.gain_inclusive:
            good = splits.gain >= self.min_split_gain
        else:
            good = splits.gain > self.min_split_gain
        rows = np.nonzero(can_split & good & (splits.feature != LEAF) & (splits.gain > 0))[0]
        first = self._n
        child_ids = np.arange(first, first + 2 * len(rows), dtype=np.int64).reshape(-1, 2)
        exact = None
        if len(rows):
            # the finder sees the searched layer: translate rows into it
            if searched is layer:
                exact = self.finder.apply_splits(searched, rows, found, child_ids)
            else:
                pos = np.full(len(layer), -1, dtype=np.int64)
                pos[open_rows] = np.arange(len(open_rows))
                exact = self.finder.apply_splits(searched, pos[rows], found, child_ids)
        if exact is not None:
            child_stats = np.asarray(exact, dtype=np.float64)
        else:  # the scan's sums (a finder that knows the children's exact statistics returns those instead)
            child_stats = np.empty((2 * len(rows), layer.stats.shape[1]))
            child_stats[0::2] = splits.left_stats[rows]
            child_stats[1::2] = layer.stats[rows] - splits.left_stats[rows]
        self._new_nodes(child_stats, layer.depth + 1)
        f = self._fields
        ids = layer.node_ids[rows]
        f["feature"][ids] = splits.feature[rows]
        f["bin"][ids] = splits.bin[rows]
        f["threshold"][ids] = splits.threshold[rows]
        f["missing_left"][ids] = splits.missing_left[rows]
        f["gain"][ids] = splits.gain[rows]
        f["owner"][ids] = splits.owner[rows]
        f["left"][ids] = child_ids[:, 0]
        f["right"][ids] = child_ids[:, 1]
        self.frontier = Layer(child_ids.reshape(-1), child_stats, layer.depth + 1)
        return self.frontier

    def _close(self, layer: Layer) -> Layer:
        """Every node of ``layer`` stays a leaf: the frontier becomes empty."""
        self.frontier = Layer(np.zeros(0, dtype=np.int64), np.zeros((0, layer.stats.shape[1])), layer.depth + 1)
        return self.frontier

    def grow(self) -> Tree:
        """Grow from the root until no node can split; return the tree."""
        if self.frontier is None:
            self.start()
        while not self.done:
            self.grow_layer()
        return self.finish()

    def node_stats(self) -> np.ndarray:
        return self._node_stats[:self._n].copy()

    def finish(self) -> Tree:
        nodes = self._all_nodes()
        stats = self._node_stats[:self._n]
        values = np.asarray(self.leaf_value(stats), dtype=np.float64).reshape(len(nodes), -1).copy()  # (its own)
        return Tree(nodes, values)
