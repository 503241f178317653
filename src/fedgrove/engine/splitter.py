"""The local split finder: histograms from local data, splits chosen here.

:class:`HistogramSplitFinder` is what centralised training plugs into the
grower.  Each node owns a segment of a shared ``sample_indices`` buffer; per
layer it builds the histograms of the smaller children and obtains the larger
ones by subtraction from the parent, scores all nodes in one kernel call, and
partitions all split nodes in one kernel call.

Protocols reuse its pieces: a passive party builds histograms with
:meth:`HistogramSplitFinder.layer_histograms` and partitions with
:meth:`HistogramSplitFinder.partition`, while another party scores.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numba
import numpy as np

from fedgrove.engine.binning import Thresholds
from fedgrove.engine.grower import Layer, LayerSplits, SplitFinder
from fedgrove.engine.histogram import (add_to_segments, build_histograms, gather_rows, subtract_histograms,
                                       sum_rows)
from fedgrove.engine.partition import (partition_by_flags, partition_nodes, plan_siblings, record_segments,
                                       shared_buffer)
from fedgrove.engine.sparse import sparse_codes_for
from fedgrove.engine.threads import BIN_SCAN, one_thread_for, row_work, serial_if
from fedgrove.engine.split import CRITERIA, WEIGHT_TOL, find_splits_cart, find_splits_gbdt, resolve_missing_by_hessian


@dataclass
class GBDTScorer:
    """Second-order gain; node statistics are (G, H, count).

    Per-sample statistics are (g, h, 1), or just (g, h) when no rule needs
    per-bin counts (:attr:`hist_needs_count` is false: ``min_samples_leaf <= 1``
    and ``min_child_weight > 0``, so a child with H >= min_child_weight is never
    empty).  That makes histograms a third smaller; node counts then come from
    the partition.
    """

    reg_lambda: float = 1.0
    gamma: float = 0.0
    min_child_weight: float = 1e-3
    min_samples_leaf: float = 1.0

    @property
    def hist_needs_count(self) -> bool:
        return self.min_samples_leaf > 1 or self.min_child_weight <= 0

    def find(self, hist, rows, node_stats, feature_offsets, allowed):
        return find_splits_gbdt(hist, rows, node_stats, feature_offsets, allowed, float(self.reg_lambda),
                                float(self.gamma), float(self.min_child_weight), float(self.min_samples_leaf))

    @staticmethod
    def sample_weight(stats):
        return stats[:, 2]

    @staticmethod
    def hist_weight(hist_rows):
        """Weight of histogram bins: counts when present, else hessians."""
        return hist_rows[..., 2] if hist_rows.shape[-1] == 3 else hist_rows[..., 1]

    def leaf_value(self, stats):
        """-G / (H + lambda); 0 where H + lambda is 0 (lambda 0 and a hessian sum of 0: saturated instances, or
        FV-tree's noisy sums under differential privacy, clipped at 0), where it was an infinite value."""
        den = stats[:, 1] + self.reg_lambda
        return np.divide(-stats[:, 0], den, out=np.zeros(len(stats)), where=den > 0)


@dataclass
class CARTScorer:
    """Impurity decrease on class-weight or (w, wy, wy^2) statistics."""

    criterion: str
    root_weight: float
    min_samples_leaf: float = 1.0

    def find(self, hist, rows, node_stats, feature_offsets, allowed):
        return find_splits_cart(hist, rows, node_stats, feature_offsets, allowed, CRITERIA[self.criterion],
                                float(self.root_weight), float(self.min_samples_leaf))

    def sample_weight(self, stats):
        return stats[..., 0] if self.criterion == "mse" else stats.sum(axis=-1)

    hist_weight = sample_weight

    def splittable(self, stats):
        """Impure nodes only (scikit-learn's rule: impurity above machine epsilon; under ``mse`` relative to the
        node's mean square, so the rule holds at any label scale)."""
        stats = np.atleast_2d(stats)
        if self.criterion == "mse":
            w = stats[:, 0]
            safe = np.where(w > 0, w, 1.0)
            square = stats[:, 2] / safe
            var = square - (stats[:, 1] / safe) ** 2
            return var > np.finfo(np.float64).eps * square
        return (stats > 0).sum(axis=1) > 1

    def leaf_value(self, stats):
        if self.criterion == "mse":
            w = stats[:, 0]
            return np.where(w > 0, stats[:, 1] / np.where(w > 0, w, 1.0), 0.0)[:, None]
        tot = stats.sum(axis=1, keepdims=True)
        return stats / np.where(tot > 0, tot, 1.0)


AllowedFn = Callable[[Layer], np.ndarray]


class FinderBuffers:
    """Row buffers that a run of :class:`HistogramSplitFinder` s over one table reuses, one finder after another
    (a finder writes into them until the next one is made): two copies of the rows' indices and of their
    statistics, which each layer's partition moves between.  Fresh buffers for every tree of a fit cost page
    faults that took longer than filling them (kddcup99's 23 trees a round: 42 -> 10 ms a round to set the
    finders up, by hand, 2 threads).

    n_rows : the most rows a tree grows on;  n_stats : the statistics per row
    """

    def __init__(self, n_rows: int, n_stats: int):
        self.n_rows, self.n_stats = int(n_rows), int(n_stats)
        self.indices = (np.empty(self.n_rows, dtype=np.int64), np.empty(self.n_rows, dtype=np.int64))
        self.stats = (np.empty((self.n_rows, self.n_stats)), np.empty((self.n_rows, self.n_stats)))
        self.every_row = np.arange(self.n_rows, dtype=np.int64)

    def root_stats(self) -> np.ndarray:
        """Where a caller may write the statistics ``(n_rows, n_stats)`` of a tree on every row in order, to give
        them to the finder as its ``stats`` (the finder then does not copy them)."""
        return self.stats[0]

    def take(self, root_samples, n_rows: int, n_stats: int):
        """Two index buffers and two statistics buffers for a tree on ``root_samples`` (None: all ``n_rows``
        rows, in order), the first index buffer holding them."""
        m = n_rows if root_samples is None else len(root_samples)
        if n_stats != self.n_stats or m > self.n_rows or (root_samples is None and n_rows != self.n_rows):
            raise ValueError(f"FinderBuffers for {self.n_rows} rows of {self.n_stats} statistics cannot hold a "
                             f"tree on {m} of {n_rows} rows with {n_stats} statistics")
        indices = [self.indices[0][:m], self.indices[1][:m]]
        np.copyto(indices[0], self.every_row if root_samples is None else root_samples, casting="same_kind")
        return indices, [self.stats[0][:m], self.stats[1][:m]]


class HistogramSplitFinder(SplitFinder):
    """Split finder over local binned data.

    Parameters
    ----------
    X_binned : uint8 (n_samples, n_features), row-major
    feature_offsets, missing_codes : from the :class:`~fedgrove.engine.binning.BinMapper`
    thresholds : list of arrays, ``thresholds[f][b]`` = raw threshold of "bin <= b"
    stats : float64 (n_samples, k)   per-sample statistics: (g, h[, 1]) or CART's
    scorer : GBDTScorer or CARTScorer
    root_samples : int array, rows in the root (default: all)
    allowed : callable(Layer) -> bool (n_nodes, n_features), default: all features
    X_columns : the same codes in column-major order (``column_major``, as ``np.asfortranarray``), used
        by the partition kernel: reading one feature of a node's sorted rows
        then touches few cache lines.  Default: ``X_binned`` itself.
    features : features whose histograms are built (default: all).  Histograms
        of larger children come from subtraction, so every node must have the
        histograms of every feature any of its descendants may use: a per-node
        draw restricts only the split search, a per-tree subset can go here.
    sparse : build the histograms of a sparse table from its non-default codes
        (:mod:`fedgrove.engine.sparse`; the table's layout is computed once
        and remembered while the array lives, so pass False for a table used
        for one tree only).
    buffers : :class:`FinderBuffers` to grow in instead of fresh ones (for a run of trees over one table:
        this finder's partitions overwrite what the last finder given them knew of its rows).
    root_histogram : ``(n_bins, n_stats)``: the root's histogram for ``features``, already built (the engine
        builds a multiclass round's roots together: :func:`~fedgrove.engine.sparse.root_histograms_by_class`).
    """

    def __init__(self, X_binned, feature_offsets, missing_codes, thresholds, stats, scorer,
                 root_samples=None, allowed: AllowedFn | None = None, owner: int = -1, features=None,
                 X_columns=None, sparse: bool = True, buffers: FinderBuffers | None = None,
                 root_histogram: np.ndarray | None = None):
        self.X_binned = X_binned
        self.X_columns = X_binned if X_columns is None else X_columns
        self.feature_offsets = np.asarray(feature_offsets, dtype=np.int32)
        self.missing_codes = np.asarray(missing_codes, dtype=np.int32)
        self.thresholds = thresholds
        stats = np.ascontiguousarray(stats, dtype=np.float64)
        self.scorer = scorer
        self.n_features = X_binned.shape[1]
        self.allowed_fn = allowed
        self.features = np.arange(self.n_features, dtype=np.int64) if features is None else \
            np.ascontiguousarray(features, dtype=np.int64)
        self.owner = owner
        # two (indices, statistics in index order) buffers; each layer's partition
        # writes into the buffer its parents are not in
        if buffers is None:
            # (a copy of the caller's rows: the partitions below write into this buffer, which reordered a
            # subsample that the engine then gave the next class's tree)
            root = np.arange(X_binned.shape[0], dtype=np.int64) if root_samples is None else \
                np.array(root_samples, dtype=np.int64)
            self._indices = [root, np.empty_like(root)]
            self._stats = [np.empty((len(root), stats.shape[1])), np.empty((len(root), stats.shape[1]))]
        else:
            self._indices, self._stats = buffers.take(root_samples, X_binned.shape[0], stats.shape[1])
            root = self._indices[0]
        if not (buffers is not None and root_samples is None and stats is buffers.stats[0]):
            gather_rows(stats, root, self._stats[0])  # (else the caller wrote them there: every row, in order)
        self.count_from_segments = isinstance(scorer, GBDTScorer) and stats.shape[1] == 2
        self.n_stats = stats.shape[1] + (1 if self.count_from_segments else 0)
        # node -> (start, end, buffer) of its samples: rows of ``_seg`` by node id (-1: no such node)
        self._seg = np.full((64, 3), -1, dtype=np.int64)
        self._seg[0] = (0, len(root), 0)
        # sparse tables (most codes their feature's most frequent one): histograms from the other codes only
        self._sparse = sparse_codes_for(X_binned, self.feature_offsets) if sparse else None
        self._hist = None          # histograms of the current layer
        self._root_histogram = root_histogram
        self._hist_row = np.zeros(0, dtype=np.int64)  # by node id: its row in ``_hist``
        self._pending: np.ndarray | None = None  # rows (parent, left, right) of the last partition

    # -- SplitFinder -------------------------------------------------------------------
    def root_stats(self):
        total = sum_rows(self._stats[0])
        if self.count_from_segments:
            total = np.append(total, float(len(self._indices[0])))
        return total

    def sample_weight(self, stats):
        return self.scorer.sample_weight(np.atleast_2d(stats))

    def splittable(self, stats):
        fn = getattr(self.scorer, "splittable", None)
        return np.ones(len(stats), dtype=bool) if fn is None else fn(stats)

    def serial_layer(self, layer: Layer) -> bool:
        """One thread for a layer of little work where the threads sleep between kernels
        (:func:`~fedgrove.engine.threads.one_thread_for` over the rows of its nodes)."""
        return one_thread_for(lambda: self._work_of(layer.node_ids))

    def _work_of(self, node_ids) -> float:
        """The histogram work of the given nodes' samples (:func:`~fedgrove.engine.threads.row_work`; a node without
        a segment here, a protocol's remote one, has none)."""
        ids = np.asarray(node_ids, dtype=np.int64)
        seg = self._seg[ids[(ids >= 0) & (ids < len(self._seg))]]
        codes = self._sparse.entries_per_row if self._listed(len(self.features)) else float(len(self.features))
        return row_work(int(np.maximum(seg[:, 1] - seg[:, 0], 0).sum()), codes)

    def allowed(self, layer: Layer) -> np.ndarray:
        if self.allowed_fn is None:
            return np.ones((len(layer), self.n_features), dtype=np.bool_)
        # a writable copy: a broadcast mask of one node is already contiguous but read-only, for which numba
        # compiles the split search again
        return np.array(self.allowed_fn(layer), dtype=np.bool_, order="C")

    def find_splits(self, layer: Layer) -> LayerSplits:
        allowed = self.allowed(layer)
        hist = self.layer_histograms(layer, self.features)
        rows = np.arange(len(layer), dtype=np.int64)
        # (in a layer of many rows, the search over its nodes' bins may still be little work)
        with serial_if(one_thread_for(BIN_SCAN * len(layer) * float(self.feature_offsets[-1]))):
            gain, feature, bins, missing_left, left = self.scorer.find(hist, rows, layer.stats, self.feature_offsets,
                                                                       allowed)
        if isinstance(self.thresholds, Thresholds):
            threshold = self.thresholds.at_splits(feature, bins)
        else:
            threshold = np.full(len(layer), np.nan)
            ok = feature >= 0
            if ok.any():
                threshold[ok] = raw_thresholds(self.thresholds, feature[ok], bins[ok])
        splits = LayerSplits(gain, feature, bins, missing_left, left, threshold,
                             np.full(len(layer), self.owner, dtype=np.int32))
        self._resolve_missing_direction(splits, layer)
        return splits

    def apply_splits(self, layer, split_rows, splits, child_ids, masks=None):
        """Partition the split nodes (by the local codes, or by given left ``masks``) and record the children."""
        ids = layer.node_ids[split_rows]
        if masks is None:
            mids = self._split_positions(ids, splits, split_rows)
        else:
            mids = self.partition_by_masks(ids, masks)
        counts = self._record(ids, child_ids, mids)
        pending = np.empty((len(ids), 3), dtype=np.int64)  # (np.column_stack: 5 us a layer)
        pending[:, 0] = ids
        pending[:, 1:] = np.asarray(child_ids).reshape(-1, 2)
        self._pending = pending
        if self.count_from_segments:
            child = np.empty((2 * len(ids), 3))
            child[0::2] = splits.left_stats[split_rows]
            child[1::2] = layer.stats[split_rows] - splits.left_stats[split_rows]
            child[:, 2] = counts
            return child
        return None

    def _record(self, ids, child_ids, mids) -> np.ndarray:
        """Register the children's segments of split nodes ``ids``; returns the children's sizes (left, right of
        the first node, then of the second, ...)."""
        child_ids = np.ascontiguousarray(child_ids, dtype=np.int64).reshape(-1, 2)
        if len(child_ids):
            self._reserve(int(child_ids.max()) + 1)
        counts = np.empty(2 * len(child_ids))
        record_segments(self._seg, np.ascontiguousarray(ids, dtype=np.int64), child_ids,
                        np.ascontiguousarray(mids, dtype=np.int64), counts)
        return counts

    def _reserve(self, n_nodes: int) -> None:
        if n_nodes > len(self._seg):
            grown = np.full((max(n_nodes, 2 * len(self._seg)), 3), -1, dtype=np.int64)
            grown[:len(self._seg)] = self._seg
            self._seg = grown

    @property
    def segments(self) -> "_Segments":
        """The nodes' segments: ``node in segments``, ``segments[node]`` -> (start, end, buffer).  A fresh view
        each time (a view kept on the finder would make a reference cycle and keep every finder's buffers alive
        until the garbage collector runs)."""
        return _Segments(self)

    def has_node(self, node_id: int) -> bool:
        """Whether the node exists (has a segment of samples).  (Plain Python: protocols ask it of every node a
        peer names, and an array round trip per node cost more than the rest of the check.)"""
        n = int(node_id)
        return 0 <= n < len(self._seg) and bool(self._seg[n, 0] >= 0)

    def unknown_nodes(self, node_ids) -> list[int]:
        """Those of ``node_ids`` that are no node of this tree (for a protocol to refuse a peer's plan)."""
        ids = np.asarray(node_ids, dtype=np.int64).reshape(-1)
        inside = (ids >= 0) & (ids < len(self._seg))
        known = np.zeros(len(ids), dtype=bool)
        known[inside] = self._seg[ids[inside], 0] >= 0
        return ids[~known].tolist()

    def next_node_id(self) -> int:
        """One more than the largest node id so far: where a layer's children are numbered from."""
        return int(np.nonzero(self._seg[:, 0] >= 0)[0].max()) + 1

    # -- pieces protocols reuse -----------------------------------------------------------
    def node_samples(self, node_id: int) -> np.ndarray:
        """Row indices of the training samples in a node (a view; do not modify)."""
        s, e, buf = self.segments[int(node_id)]
        return self._indices[buf][s:e]

    def histograms_of(self, node_ids, features=None) -> np.ndarray:
        """Histograms of the given nodes (rows in the given order), built from their samples."""
        features = self.features if features is None else np.ascontiguousarray(features, dtype=np.int64)
        hist = np.zeros((len(node_ids), int(self.feature_offsets[-1]), self._stats[0].shape[1]))
        node_ids = np.asarray(node_ids, dtype=np.int64)
        for buf, k in self._by_buffer(node_ids):
            self._build(buf, node_ids[k], k, features, hist)
        return hist

    def _build(self, buf, node_ids, out_rows, features, out) -> None:
        """Histograms of nodes ``node_ids`` (all in buffer ``buf``) into ``out[out_rows]``, from the sparse codes
        or the dense table."""
        seg = self._seg[node_ids]
        starts, ends = np.ascontiguousarray(seg[:, 0]), np.ascontiguousarray(seg[:, 1])
        out_rows = np.ascontiguousarray(out_rows, dtype=np.int64)
        if self._listed(len(features)):
            used = np.zeros(self.n_features, dtype=np.bool_)
            used[features] = True
            self._sparse.build(self._indices[buf], starts, ends, self._stats[buf], self.feature_offsets, used, out,
                               out_rows)
        else:
            build_histograms(self.X_binned, self._indices[buf], starts, ends, self._stats[buf], self.feature_offsets,
                             features, out, out_rows, numba.get_num_threads())

    def _listed(self, n_used: int) -> bool:
        """Whether histograms of ``n_used`` features are summed from the table's listed codes (sparse)."""
        return self._sparse is not None and self._sparse.worth_it(n_used)

    def record_children(self, node_ids, child_ids, mids) -> None:
        """Register children segments after a partition done outside :meth:`apply_splits`."""
        if len(node_ids):
            self._record(node_ids, child_ids, mids)

    def add_node_values(self, target: np.ndarray, column: int, node_ids, values) -> None:
        """``target[samples of node k, column] += values[k]`` (e.g. leaf values into raw scores)."""
        seg = self._seg[np.asarray(node_ids, dtype=np.int64)]
        add_to_segments(target, column, self._indices[0], self._indices[1], np.ascontiguousarray(seg[:, 0]),
                        np.ascontiguousarray(seg[:, 1]), np.ascontiguousarray(seg[:, 2]),
                        np.asarray(values, dtype=np.float64))

    def layer_histograms(self, layer: Layer, features: np.ndarray) -> np.ndarray:
        """Histograms of the layer's nodes, rows in layer order; smaller siblings built, larger subtracted."""
        features = np.ascontiguousarray(features, dtype=np.int64)
        n = len(layer)
        total_bins = int(self.feature_offsets[-1])
        # every row is filled below (built, or subtracted from a filled parent) for the features in use
        hist = np.empty((n, total_bins, self._stats[0].shape[1]))
        row_of, build, parent_nodes, small_rows, large_rows = self._plan(layer, self._hist is not None)
        node_ids = np.asarray(layer.node_ids, dtype=np.int64)
        # what was built and what subtracted, for protocols that mirror it on remote features
        self.last_build_rows = sorted(build.tolist())
        if self._root_histogram is not None and len(build) == 1 and node_ids[build[0]] == 0:
            hist[build[0]] = self._root_histogram  # the root's, built beforehand
            self._root_histogram = None
            build = build[:0]
        # (in a layer of many rows, the smaller siblings built may hold few)
        with serial_if(one_thread_for(lambda: self._work_of(node_ids[build]))):
            for buf, k in self._by_buffer(node_ids[build]):
                self._build(buf, node_ids[build[k]], build[k], features, hist)
        parent_rows = self._hist_row[parent_nodes]
        if len(parent_rows):
            subtract_histograms(self._hist, parent_rows, hist, small_rows, large_rows)
        self._hist = hist
        self._hist_row = row_of
        self._pending = None
        self.last_pairs = list(zip(parent_rows.tolist(), small_rows.tolist(), large_rows.tolist()))
        return hist

    def plan_layer(self, layer: Layer, have_parents: bool) -> tuple[list, list, list, list]:
        """Which rows of ``layer`` are built from samples and which are subtracted from their parent.

        Returns (rows to build, parent node ids, smaller-child rows, larger-child rows): of two siblings
        both in the layer the one with fewer samples (ties: left) is built and the other is its parent's
        histogram minus it; every other node is built.  A party that builds histograms of the same nodes
        for another party to subtract (encrypted ones) calls this to build exactly what that party expects.
        """
        return tuple(a.tolist() for a in self._plan(layer, have_parents)[1:])

    def _plan(self, layer: Layer, have_parents: bool):
        """:meth:`plan_layer` as int64 arrays, after the layer's row of each node id (-1: not in it)."""
        pending = self._pending if self._pending is not None and have_parents else np.zeros((0, 3), dtype=np.int64)
        return plan_siblings(pending, self._seg, np.ascontiguousarray(layer.node_ids, dtype=np.int64))

    def _split_positions(self, node_ids, splits, split_rows) -> np.ndarray:
        """Partition the split nodes; a protocol's finder overrides this when other parties own splits."""
        return self.partition(node_ids, splits.feature[split_rows], splits.bin[split_rows],
                              splits.missing_left[split_rows])

    def left_mask(self, node_id: int, feature: int, bin_: int, missing_left: bool) -> np.ndarray:
        """Which of the node's samples (in :meth:`node_samples` order) a local split sends left."""
        codes = self.X_binned[self.node_samples(node_id), feature]
        return np.where(codes == self.missing_codes[feature], bool(missing_left), codes <= bin_)

    def partition_by_masks(self, node_ids, masks) -> np.ndarray:
        """Split nodes by given left masks (in :meth:`node_samples` order); returns the split positions."""
        node_ids = np.asarray(node_ids, dtype=np.int64).reshape(-1)
        if len(masks) != len(node_ids):
            raise ValueError(f"{len(masks)} masks for {len(node_ids)} nodes")
        if unknown := self.unknown_nodes(node_ids):
            raise KeyError(unknown[0])
        seg = self._seg[node_ids]
        masks = [np.asarray(mask, dtype=bool).reshape(-1) for mask in masks]
        for nid, mask, (s, e, _) in zip(node_ids.tolist(), masks, seg.tolist()):
            if len(mask) != e - s:
                raise ValueError(f"mask for node {nid} has {len(mask)} entries, the node has {e - s} samples")
        mids = np.empty(len(node_ids), dtype=np.int64)
        for buf, k in self._by_buffer(node_ids):
            flags = np.concatenate([masks[i] for i in k.tolist()]) if len(k) else np.zeros(0, dtype=bool)
            mids[k] = partition_by_flags(self._indices[buf], self._stats[buf], self._indices[1 - buf],
                                         self._stats[1 - buf], np.ascontiguousarray(seg[k, 0]),
                                         np.ascontiguousarray(seg[k, 1]), flags)
        return mids

    def partition(self, node_ids, features, bins, missing_left) -> np.ndarray:
        """Split the nodes' segments (into the other buffer); returns where each right part starts."""
        features = np.asarray(features, dtype=np.int64)
        bins = np.asarray(bins, dtype=np.int64)
        missing_left = np.asarray(missing_left, dtype=np.bool_)
        node_ids = np.asarray(node_ids, dtype=np.int64)
        mids = np.empty(len(node_ids), dtype=np.int64)
        for buf, k in self._by_buffer(node_ids):
            seg = self._seg[node_ids[k]]
            starts, ends = np.ascontiguousarray(seg[:, 0]), np.ascontiguousarray(seg[:, 1])
            mids[k] = partition_nodes(self.X_columns, self._indices[buf], self._stats[buf], self._indices[1 - buf],
                                      self._stats[1 - buf], starts, ends, features[k], bins[k], missing_left[k],
                                      self.missing_codes)
        return mids

    def _by_buffer(self, node_ids: np.ndarray) -> list[tuple[int, np.ndarray]]:
        """Positions in ``node_ids`` grouped by the buffer holding the node, buffers ascending (a layer
        normally uses one)."""
        if not len(node_ids):
            return []
        b = shared_buffer(self._seg, np.ascontiguousarray(node_ids, dtype=np.int64))  # (the numpy test: 2.5 us)
        if b >= 0:
            return [(int(b), np.arange(len(node_ids), dtype=np.int64))]
        bufs = self._seg[node_ids, 2]
        return [(b, np.nonzero(bufs == b)[0]) for b in (0, 1) if (bufs == b).any()]

    def _resolve_missing_direction(self, splits: LayerSplits, layer: Layer) -> None:
        resolve_missing_direction(splits, layer, self._hist, self.feature_offsets, self.scorer)


def resolve_missing_direction(splits: LayerSplits, layer: Layer, hist, feature_offsets, scorer) -> None:
    """Where a node had no missing values, send them to the child with more samples (ties: left), judged as
    :func:`absent_missing_left` judges it."""
    if isinstance(scorer, GBDTScorer) and not scorer.hist_needs_count and _kernel_ready(splits, layer, hist):
        # the engine's case, one kernel: the numpy steps below cost 24 us a layer, most of it calls
        resolve_missing_by_hessian(hist, np.asarray(feature_offsets, dtype=np.int64), splits.feature,
                                   splits.left_stats, layer.stats, splits.missing_left)
        return
    ok = np.nonzero(splits.feature >= 0)[0]
    if not len(ok):
        return
    miss_bins = feature_offsets[splits.feature[ok] + 1] - 1
    miss = hist[ok, miss_bins, :]
    no_missing, left = absent_missing_left(miss, splits.left_stats[ok], layer.stats[ok], scorer)
    # a missing bin judged empty by its hessian may still hold rows whose hessians are all but 0 (saturated
    # predictions: g = +-1, h ~ 1e-15); they go where the missing values now go, and their sums with them, so
    # that the children's statistics are those of their rows (they were the scan's: a child's leaf value then
    # counted gradients of rows in its sibling)
    moved = np.nonzero(no_missing & (left != splits.missing_left[ok].astype(bool)))[0]
    if len(moved):
        k = min(miss.shape[1], splits.left_stats.shape[1])
        sign = np.where(left[moved], 1.0, -1.0)[:, None]
        splits.left_stats[ok[moved], :k] += sign * miss[moved, :k]
    splits.missing_left[ok[no_missing]] = left[no_missing]


def _kernel_ready(splits: LayerSplits, layer: Layer, hist) -> bool:
    """Whether the arrays are of the types :func:`resolve_missing_by_hessian` is compiled for (a protocol's may
    be views or other types: they take the numpy steps)."""
    f64 = np.dtype(np.float64)
    return (isinstance(hist, np.ndarray) and hist.ndim == 3 and hist.dtype == f64 and hist.shape[2] >= 2
            and hist.flags.c_contiguous and splits.left_stats.dtype == f64 and splits.left_stats.ndim == 2
            and splits.left_stats.flags.c_contiguous and splits.left_stats.shape[1] >= 2
            and isinstance(layer.stats, np.ndarray) and layer.stats.dtype == f64 and layer.stats.ndim == 2
            and layer.stats.flags.c_contiguous and layer.stats.shape[1] >= 2
            and splits.feature.dtype == np.int32 and splits.feature.flags.c_contiguous
            and splits.missing_left.dtype == np.bool_ and splits.missing_left.flags.c_contiguous
            and len(hist) == len(splits.feature) == len(splits.left_stats) == len(layer.stats)
            == len(splits.missing_left))


def absent_missing_left(miss, left_stats, node_stats, scorer):
    """For candidate splits (one per row): whether the node had no missing values (``miss``: its missing bin's
    sums) and, if so, whether missing values go left (the child with more samples; ties go left, up to rounding
    of histograms summed in another order).

    The scorer's parameters decide how, whatever columns a party's histograms hold, so every party that chooses
    splits decides as the engine does: a GBDT whose histograms need no counts (:attr:`GBDTScorer.hist_needs_count`
    false) reads "more samples" from hessians, and a missing bin as empty when its hessian sum is within
    ``WEIGHT_TOL`` of the node's (a larger child's histogram is its parent's minus its sibling's, so an empty bin
    can hold 4e-16 in one summation order and 0 in another; the gradient sum is no guide, its rounding scales
    with the gradients' size).  Otherwise counts (or CART weights) decide."""
    if isinstance(scorer, GBDTScorer) and not scorer.hist_needs_count:
        no_missing = np.abs(miss[:, 1]) <= WEIGHT_TOL * np.abs(node_stats[:, 1])
        lw, tw = left_stats[:, 1], node_stats[:, 1]
    else:
        no_missing = scorer.hist_weight(miss) <= 0
        lw = scorer.sample_weight(left_stats)
        tw = scorer.sample_weight(node_stats)
    return no_missing, lw >= (tw - lw) - WEIGHT_TOL * np.abs(tw)


class _Segments:
    """Read-only view of a finder's node segments: ``node_id in segments``, ``segments[node_id]`` ->
    (start, end, buffer)."""

    def __init__(self, finder: HistogramSplitFinder):
        self._finder = finder

    def __contains__(self, node_id) -> bool:
        return self._finder.has_node(int(node_id))

    def __getitem__(self, node_id) -> tuple[int, int, int]:
        n = int(node_id)
        seg = self._finder._seg
        if not 0 <= n < len(seg):
            raise KeyError(node_id)
        s, e, buf = seg[n].tolist()
        if s < 0:
            raise KeyError(node_id)
        return s, e, buf


def raw_thresholds(thresholds, features, bins) -> np.ndarray:
    """``thresholds[f][b]`` for each (feature, bin) pair; ``thresholds``: per-feature arrays, or
    :class:`~fedgrove.engine.binning.Thresholds` (one vectorised lookup)."""
    if isinstance(thresholds, Thresholds):
        return thresholds.lookup(features, bins)
    return np.array([thresholds[f][b] for f, b in zip(features.tolist(), bins.tolist())], dtype=np.float64)
