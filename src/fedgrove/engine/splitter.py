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

from fedgrove.engine.grower import Layer, LayerSplits, SplitFinder
from fedgrove.engine.histogram import (add_to_segments, build_histograms, gather_rows, subtract_histograms,
                                       sum_rows)
from fedgrove.engine.partition import partition_nodes
from fedgrove.engine.sparse import sparse_codes_for
from fedgrove.engine.split import CRITERIA, find_splits_cart, find_splits_gbdt


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
        return -stats[:, 0] / (stats[:, 1] + self.reg_lambda)


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
        """Impure nodes only (scikit-learn's rule: impurity above machine epsilon)."""
        stats = np.atleast_2d(stats)
        if self.criterion == "mse":
            w = stats[:, 0]
            safe = np.where(w > 0, w, 1.0)
            var = stats[:, 2] / safe - (stats[:, 1] / safe) ** 2
            return var > np.finfo(np.float64).eps * np.maximum(1.0, (stats[:, 1] / safe) ** 2)
        return (stats > 0).sum(axis=1) > 1

    def leaf_value(self, stats):
        if self.criterion == "mse":
            w = stats[:, 0]
            return np.where(w > 0, stats[:, 1] / np.where(w > 0, w, 1.0), 0.0)[:, None]
        tot = stats.sum(axis=1, keepdims=True)
        return stats / np.where(tot > 0, tot, 1.0)


AllowedFn = Callable[[Layer], np.ndarray]


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
    X_columns : the same codes in column-major order (``np.asfortranarray``), used
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
    """

    def __init__(self, X_binned, feature_offsets, missing_codes, thresholds, stats, scorer,
                 root_samples=None, allowed: AllowedFn | None = None, owner: int = -1, features=None,
                 X_columns=None, sparse: bool = True):
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
        if root_samples is None:
            root_samples = np.arange(X_binned.shape[0], dtype=np.int64)
        root = np.ascontiguousarray(root_samples, dtype=np.int64)
        # two (indices, statistics in index order) buffers; each layer's partition
        # writes into the buffer its parents are not in
        self._indices = [root, np.empty_like(root)]
        self._stats = [gather_rows(stats, root), np.empty((len(root), stats.shape[1]))]
        self.count_from_segments = isinstance(scorer, GBDTScorer) and stats.shape[1] == 2
        self.n_stats = stats.shape[1] + (1 if self.count_from_segments else 0)
        self.segments: dict[int, tuple[int, int, int]] = {0: (0, len(root), 0)}  # node -> (start, end, buffer)
        # sparse tables (most codes their feature's most frequent one): histograms from the other codes only
        self._sparse = sparse_codes_for(X_binned, self.feature_offsets) if sparse else None
        self._hist = None          # histograms of the current layer
        self._hist_row: dict[int, int] = {}
        self._pending: list[tuple[int, int, int]] | None = None  # (parent, left, right)

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

    def allowed(self, layer: Layer) -> np.ndarray:
        if self.allowed_fn is None:
            return np.ones((len(layer), self.n_features), dtype=np.bool_)
        return np.ascontiguousarray(self.allowed_fn(layer), dtype=np.bool_)

    def find_splits(self, layer: Layer) -> LayerSplits:
        allowed = self.allowed(layer)
        hist = self.layer_histograms(layer, self.features)
        rows = np.arange(len(layer), dtype=np.int64)
        gain, feature, bins, missing_left, left = self.scorer.find(hist, rows, layer.stats, self.feature_offsets,
                                                                   allowed)
        splits = LayerSplits(gain, feature, bins, missing_left, left, np.full(len(layer), np.nan),
                             np.full(len(layer), self.owner, dtype=np.int32))
        ok = feature >= 0
        splits.threshold[ok] = [self.thresholds[f][b] for f, b in zip(feature[ok], bins[ok])]
        self._resolve_missing_direction(splits, layer)
        return splits

    def apply_splits(self, layer, split_rows, splits, child_ids, masks=None):
        """Partition the split nodes (by the local codes, or by given left ``masks``) and record the children."""
        ids = layer.node_ids[split_rows]
        if masks is None:
            mids = self._split_positions(ids, splits, split_rows)
        else:
            mids = self.partition_by_masks(ids, masks)
        pending = []
        counts = np.empty(2 * len(ids))
        for k, nid in enumerate(ids):
            s, e, buf = self.segments[int(nid)]
            left, right = int(child_ids[k, 0]), int(child_ids[k, 1])
            self.segments[left] = (s, int(mids[k]), 1 - buf)
            self.segments[right] = (int(mids[k]), e, 1 - buf)
            counts[2 * k], counts[2 * k + 1] = mids[k] - s, e - mids[k]
            pending.append((int(nid), left, right))
        self._pending = pending
        if self.count_from_segments:
            child = np.empty((2 * len(ids), 3))
            child[0::2] = splits.left_stats[split_rows]
            child[1::2] = layer.stats[split_rows] - splits.left_stats[split_rows]
            child[:, 2] = counts
            return child
        return None

    # -- pieces protocols reuse -----------------------------------------------------------
    def node_samples(self, node_id: int) -> np.ndarray:
        """Row indices of the training samples in a node (a view; do not modify)."""
        s, e, buf = self.segments[int(node_id)]
        return self._indices[buf][s:e]

    def histograms_of(self, node_ids, features=None) -> np.ndarray:
        """Histograms of the given nodes (rows in the given order), built from their samples."""
        features = self.features if features is None else np.ascontiguousarray(features, dtype=np.int64)
        hist = np.zeros((len(node_ids), int(self.feature_offsets[-1]), self._stats[0].shape[1]))
        for buf, group in self._by_buffer([int(i) for i in node_ids], range(len(node_ids))):
            self._build(buf, group, features, hist)
        return hist

    def _build(self, buf, group, features, out) -> None:
        """Histograms of the ``(node, row)`` pairs of ``group`` (nodes in buffer ``buf``) into ``out[row]``, from
        the sparse codes or the dense table."""
        starts = np.array([self.segments[i][0] for i, _ in group], dtype=np.int64)
        ends = np.array([self.segments[i][1] for i, _ in group], dtype=np.int64)
        out_rows = np.array([r for _, r in group], dtype=np.int64)
        if self._sparse is not None and self._sparse.worth_it(len(features)):
            used = np.zeros(self.n_features, dtype=np.bool_)
            used[features] = True
            self._sparse.build(self._indices[buf], starts, ends, self._stats[buf], self.feature_offsets, used, out,
                               out_rows)
        else:
            build_histograms(self.X_binned, self._indices[buf], starts, ends, self._stats[buf], self.feature_offsets,
                             features, out, out_rows, numba.get_num_threads())

    def record_children(self, node_ids, child_ids, mids) -> None:
        """Register children segments after a partition done outside :meth:`apply_splits`."""
        for k, nid in enumerate(node_ids):
            s, e, buf = self.segments[int(nid)]
            self.segments[int(child_ids[k][0])] = (s, int(mids[k]), 1 - buf)
            self.segments[int(child_ids[k][1])] = (int(mids[k]), e, 1 - buf)

    def add_node_values(self, target: np.ndarray, column: int, node_ids, values) -> None:
        """``target[samples of node k, column] += values[k]`` (e.g. leaf values into raw scores)."""
        segs = [self.segments[int(i)] for i in node_ids]
        add_to_segments(target, column, self._indices[0], self._indices[1],
                        np.array([s[0] for s in segs], dtype=np.int64), np.array([s[1] for s in segs], dtype=np.int64),
                        np.array([s[2] for s in segs], dtype=np.int64), np.asarray(values, dtype=np.float64))

    def layer_histograms(self, layer: Layer, features: np.ndarray) -> np.ndarray:
        """Histograms of the layer's nodes, rows in layer order; smaller siblings built, larger subtracted."""
        features = np.ascontiguousarray(features, dtype=np.int64)
        n = len(layer)
        total_bins = int(self.feature_offsets[-1])
        # every row is filled below (built, or subtracted from a filled parent) for the features in use
        hist = np.empty((n, total_bins, self._stats[0].shape[1]))
        row_of = {int(nid): r for r, nid in enumerate(layer.node_ids)}
        build, parent_nodes, small_rows, large_rows = self.plan_layer(layer, self._hist is not None)
        parent_rows = [self._hist_row[p] for p in parent_nodes]
        for buf, group in self._by_buffer([int(layer.node_ids[r]) for r in build], build):
            self._build(buf, group, features, hist)
        if parent_rows:
            subtract_histograms(self._hist, np.asarray(parent_rows, dtype=np.int64), hist,
                                np.asarray(small_rows, dtype=np.int64), np.asarray(large_rows, dtype=np.int64))
        self._hist = hist
        self._hist_row = row_of
        self._pending = None
        # what was built and what subtracted, for protocols that mirror it on remote features
        self.last_build_rows = sorted(int(r) for r in build) if len(build) else []
        self.last_pairs = list(zip(parent_rows, small_rows, large_rows))
        return hist

    def plan_layer(self, layer: Layer, have_parents: bool) -> tuple[list, list, list, list]:
        """Which rows of ``layer`` are built from samples and which are subtracted from their parent.

        Returns (rows to build, parent node ids, smaller-child rows, larger-child rows): of two siblings
        both in the layer the one with fewer samples (ties: left) is built and the other is its parent's
        histogram minus it; every other node is built.  A party that builds histograms of the same nodes
        for another party to subtract (encrypted ones) calls this to build exactly what that party expects.
        """
        row_of = {int(nid): r for r, nid in enumerate(layer.node_ids)}
        if self._pending is None or not have_parents:
            return list(range(len(layer))), [], [], []
        build, parents, small_rows, large_rows = [], [], [], []
        for parent, left, right in self._pending:
            if left not in row_of or right not in row_of:
                build += [row_of[c] for c in (left, right) if c in row_of]
                continue
            ls, le, _ = self.segments[left]
            rs, re, _ = self.segments[right]
            small, large = (left, right) if (le - ls) <= (re - rs) else (right, left)
            build.append(row_of[small])
            parents.append(parent)
            small_rows.append(row_of[small])
            large_rows.append(row_of[large])
        return build, parents, small_rows, large_rows

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
        mids = np.empty(len(node_ids), dtype=np.int64)
        for k, (nid, mask) in enumerate(zip(node_ids, masks)):
            s, e, buf = self.segments[int(nid)]
            mask = np.asarray(mask, dtype=bool)
            if mask.shape != (e - s,):
                raise ValueError(f"mask for node {nid} has {mask.shape[0]} entries, the node has {e - s} samples")
            nl = int(mask.sum())
            src_i, src_s = self._indices[buf][s:e], self._stats[buf][s:e]
            dst_i, dst_s = self._indices[1 - buf], self._stats[1 - buf]
            dst_i[s:s + nl], dst_i[s + nl:e] = src_i[mask], src_i[~mask]
            dst_s[s:s + nl], dst_s[s + nl:e] = src_s[mask], src_s[~mask]
            mids[k] = s + nl
        return mids

    def partition(self, node_ids, features, bins, missing_left) -> np.ndarray:
        """Split the nodes' segments (into the other buffer); returns where each right part starts."""
        features = np.asarray(features, dtype=np.int64)
        bins = np.asarray(bins, dtype=np.int64)
        missing_left = np.asarray(missing_left, dtype=np.bool_)
        mids = np.empty(len(node_ids), dtype=np.int64)
        for buf, group in self._by_buffer([int(i) for i in node_ids], range(len(node_ids))):
            k = np.array([r for _, r in group], dtype=np.int64)
            starts = np.array([self.segments[i][0] for i, _ in group], dtype=np.int64)
            ends = np.array([self.segments[i][1] for i, _ in group], dtype=np.int64)
            mids[k] = partition_nodes(self.X_columns, self._indices[buf], self._stats[buf], self._indices[1 - buf],
                                      self._stats[1 - buf], starts, ends, features[k], bins[k], missing_left[k],
                                      self.missing_codes)
        return mids

    def _by_buffer(self, node_ids, tags):
        """Group (node, tag) pairs by the buffer holding the node (a layer normally uses one)."""
        groups: dict[int, list] = {}
        for nid, tag in zip(node_ids, tags):
            groups.setdefault(self.segments[nid][2], []).append((nid, tag))
        return sorted(groups.items())

    def _resolve_missing_direction(self, splits: LayerSplits, layer: Layer) -> None:
        resolve_missing_direction(splits, layer, self._hist, self.feature_offsets, self.scorer,
                                  self.count_from_segments)


def resolve_missing_direction(splits: LayerSplits, layer: Layer, hist, feature_offsets, scorer,
                              count_from_segments: bool) -> None:
    """Where a node had no missing values, send them to the child with more samples (ties: left).

    Without per-bin counts (``count_from_segments``) presence of missing values is
    read from the missing bin's g/h sums and "more samples" from hessians.
    """
    ok = np.nonzero(splits.feature >= 0)[0]
    if not len(ok):
        return
    miss_bins = feature_offsets[splits.feature[ok] + 1] - 1
    no_missing, left = absent_missing_left(hist[ok, miss_bins, :], splits.left_stats[ok], layer.stats[ok], scorer,
                                           count_from_segments)
    splits.missing_left[ok[no_missing]] = left[no_missing]


def absent_missing_left(miss, left_stats, node_stats, scorer, count_from_segments: bool):
    """For candidate splits (one per row): whether the node had no missing values (``miss``: its missing bin's
    sums) and, if so, whether missing values go left (the child with more samples; ties go left, up to rounding
    of histograms summed in another order)."""
    if count_from_segments:
        no_missing = (miss[:, 0] == 0) & (miss[:, 1] == 0)
        lw, tw = left_stats[:, 1], node_stats[:, 1]
    else:
        no_missing = scorer.hist_weight(miss) <= 0
        lw = scorer.sample_weight(left_stats)
        tw = scorer.sample_weight(node_stats)
    return no_missing, lw >= (tw - lw) - 1e-9 * np.abs(tw)
