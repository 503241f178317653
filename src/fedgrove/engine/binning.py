"""Binning: per-feature cut points from a mergeable quantile sketch.

A feature's cut points are computed by the party that holds the feature.  For
horizontal federations the parties must agree on *common* cut points without
showing raw values: each party summarises its column in a
:class:`QuantileSketch`, the sketches are merged (the merge is associative and
commutative), and cut points are read off the merged sketch.

Bin codes (``X_binned``, uint8) are local to each feature: a feature with
``c`` cut points has ``c + 1`` value bins coded ``0..c`` and its missing values
(NaN) are coded ``c + 1``.  Value ``x`` falls in bin ``b`` when
``cuts[b-1] < x <= cuts[b]``; a split "bin <= t" therefore equals the raw
threshold test ``x <= cuts[t]``.  At most 255 value bins per feature plus the
missing bin: 256 codes, one byte.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit, prange

from fedgrove.engine._intrinsics import PRANGE_ONLY, U0, U1
from fedgrove.exceptions import DataError, InvalidParameterError

MAX_BINS = 255
X_BINNED_DTYPE = np.uint8


def midpoints(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Cut points half-way between ``lo < hi``, each with ``lo <= cut < hi`` so that ``x <= cut`` parts the two:
    ``(lo + hi) / 2`` overflowed to infinity for values above 9e307 (and the cut parted nothing), and between
    neighbouring floats it can round up to ``hi`` (subnormals: 5e-324 and 1e-323 shared a bin); there the cut is
    ``lo``."""
    lo, hi = np.asarray(lo, dtype=np.float64), np.asarray(hi, dtype=np.float64)
    mid = lo * 0.5 + hi * 0.5
    return np.where((mid >= lo) & (mid < hi), mid, lo)


@dataclass
class QuantileSketch:
    """A weighted summary of one column, mergeable across parties.

    Holds at most ``max_size`` (value, weight) pairs, sorted by value.  While a
    column has no more than ``max_size`` distinct values the summary is exact
    (distinct values and their counts), so small-cardinality features merge
    without loss.  Beyond that the summary keeps ``max_size`` representatives
    at evenly spaced cumulative weight, each carrying the weight of the values
    it stands for; the rank error of a quantile is then at most about
    ``total_weight / max_size`` per compression step.
    """

    values: np.ndarray
    weights: np.ndarray
    max_size: int = 2048

    @classmethod
    def from_column(cls, column: np.ndarray, max_size: int = 2048,
                    weights: np.ndarray | None = None) -> "QuantileSketch":
        """The summary of ``column``'s non-missing values, each counted once or, given ``weights`` (one per
        value, non-negative), with its weight: a weight of k is k copies of the value, 0 none."""
        col = np.asarray(column, dtype=np.float64)
        present = ~np.isnan(col)
        if weights is None:
            values, counts = np.unique(col[present], return_counts=True)
            return cls(values, counts.astype(np.float64), max_size)._compressed()
        w = np.asarray(weights, dtype=np.float64)
        present &= w > 0
        values, inverse = np.unique(col[present], return_inverse=True)
        summed = np.bincount(inverse, weights=w[present], minlength=values.size)
        return cls(values, summed, max_size)._compressed()

    def merge(self, other: "QuantileSketch") -> "QuantileSketch":
        values = np.concatenate([self.values, other.values])
        weights = np.concatenate([self.weights, other.weights])
        uniq, inverse = np.unique(values, return_inverse=True)
        summed = np.bincount(inverse, weights=weights, minlength=uniq.size)
        return QuantileSketch(uniq, summed, max(self.max_size, other.max_size))._compressed()

    @property
    def total_weight(self) -> float:
        return float(self.weights.sum())

    def _compressed(self) -> "QuantileSketch":
        if self.values.size <= self.max_size:
            return self
        cum = np.cumsum(self.weights)
        total = cum[-1]
        targets = (np.arange(self.max_size) + 0.5) * (total / self.max_size)
        picks = np.unique(np.searchsorted(cum, targets, side="left"))
        picks[-1] = self.values.size - 1  # keep the maximum
        # each representative carries the weight of all values since the previous one
        weights = np.diff(np.concatenate([[0.0], cum[picks]]))
        return QuantileSketch(self.values[picks].copy(), weights, self.max_size)

    def cut_points(self, max_bins: int) -> np.ndarray:
        """Cut points giving at most ``max_bins`` value bins."""
        n = self.values.size
        if n <= 1:
            return np.empty(0, dtype=np.float64)
        if n <= max_bins:
            # every distinct value its own bin; cut half-way between neighbours
            return midpoints(self.values[:-1], self.values[1:])
        cum = np.cumsum(self.weights)
        total = cum[-1]
        ranks = np.arange(1, max_bins) * (total / max_bins)
        idx = np.searchsorted(cum, ranks, side="left")
        idx = np.unique(np.minimum(idx, n - 2))
        # cut half-way between the quantile value and the next sketch value so
        # that no sketch value sits on a cut
        return midpoints(self.values[idx], self.values[idx + 1])

    def to_dict(self) -> dict:
        return {"values": self.values.tolist(), "weights": self.weights.tolist(), "max_size": self.max_size}

    @classmethod
    def from_dict(cls, d: dict) -> "QuantileSketch":
        return cls(np.asarray(d["values"], dtype=np.float64), np.asarray(d["weights"], dtype=np.float64),
                   int(d["max_size"]))


_SKETCH_BLOCK = 64  # columns sketched together: read from a row-major table as one copy, not a strided column each
# distinct values a column's table holds in the first pass of a sketch; a column with more is sorted instead
# (a value's search in a table of m values takes about m/2 compares; sorting, about log2 of the rows)
_FEW_DISTINCT = 32


def column_major(X_binned: np.ndarray) -> np.ndarray:
    """``np.asfortranarray(X_binned)``: the bin codes in column-major order, which the partitions read one
    feature at a time.  A row-major table is copied in tiles, faster than numpy's element-by-element
    transposing copy on a wide one (10,000 x 20,000 codes: 0.22 s against 0.49 s on 2026-11-29, 0.3-0.4 s
    against 1.3-1.5 s on 2026-11-28)."""
    if X_binned.ndim != 2 or X_binned.flags.f_contiguous or not X_binned.flags.c_contiguous:
        return np.asfortranarray(X_binned)
    return _columns_transposed(X_binned, np.arange(X_binned.shape[1])).T


@njit(cache=True, nogil=True)
def _columns_transposed(X, cols):
    """``X[:, cols].T`` as a new C-contiguous array, copied in tiles (any layout of ``X``)."""
    n = X.shape[0]
    k = cols.shape[0]
    out = np.empty((k, n), dtype=X.dtype)
    tile = 64
    for r0 in range(0, n, tile):
        r1 = min(n, r0 + tile)
        for c0 in range(0, k, tile):
            c1 = min(k, c0 + tile)
            for r in range(r0, r1):
                for c in range(c0, c1):
                    out[c, r] = X[r, cols[c]]
    return out


@njit(cache=True, nogil=True)
def _few_distinct(X, limit):
    """Per column of ``X``: its distinct non-NaN values in increasing order and how often each occurs (as
    :func:`_sorted_runs` gives them), where it has at most ``limit``; ``n_distinct[j] = -1`` for a column with
    more.

    One pass over the table keeps a small table of values and counts per column; a column leaves the pass at
    its ``limit + 1``-th distinct value, so that a table of continuous columns is left after a few rows.
    One-hot and other few-valued tables need neither a transposed copy nor a sort then (a9a's 32,561 x 123
    values: 26 -> 11 ms for all sketches, one thread).  Equal values share an entry (-0.0 and 0.0 too: the
    entry keeps the first one met)."""
    n, d = X.shape
    values = np.empty((d, limit))
    counts = np.zeros((d, limit))
    n_distinct = np.zeros(d, dtype=np.int64)
    # row by row, all columns at once, which reads a row-major table in order (in blocks of 16 to 256 columns
    # it took 1.1-1.4x the time on 10,000 x 5,000 values, 0.25% of them not zero, and on a9a)
    active = np.arange(d)  # the columns still in the pass, in any order
    n_active = d
    for r in range(n):
        if n_active == 0:
            break
        k = 0
        while k < n_active:
            j = active[k]
            x = X[r, j]
            if np.isnan(x):
                k += 1
                continue
            m = n_distinct[j]
            t = 0
            while t < m and values[j, t] != x:
                t += 1
            if t < m:
                counts[j, t] += 1.0
            elif m < limit:
                values[j, m] = x
                counts[j, m] = 1.0
                n_distinct[j] = m + 1
            else:  # too many: out of the pass (the last column in it takes its place)
                n_distinct[j] = -1
                n_active -= 1
                active[k] = active[n_active]
                continue
            k += 1
    for j in range(d):  # each kept table in increasing order (its values are distinct)
        for a in range(1, n_distinct[j]):
            v, c = values[j, a], counts[j, a]
            b = a - 1
            while b >= 0 and values[j, b] > v:
                values[j, b + 1] = values[j, b]
                counts[j, b + 1] = counts[j, b]
                b -= 1
            values[j, b + 1] = v
            counts[j, b + 1] = c
    return values, counts, n_distinct


@njit(cache=True, nogil=True)
def _sorted_runs(sorted_rows):
    """Per row of ``sorted_rows`` (each sorted, NaNs last): its distinct non-NaN values and how often each
    occurs, as ``np.unique(row[~isnan(row)], return_counts=True)`` gives them, flat, with row offsets."""
    k, n = sorted_rows.shape
    offsets = np.zeros(k + 1, dtype=np.int64)
    values = np.empty(k * n, dtype=np.float64)  # at most one run per value
    counts = np.empty(k * n, dtype=np.float64)
    at = -1
    for i in range(k):
        # a run's length from where it ends: a count kept per value was a load and a store on one address per
        # value, each waiting on the last (a9a's first 64 columns, 32,561 values each: 13 -> 1.1 ms)
        j = 0
        while j < n:
            x = sorted_rows[i, j]
            if np.isnan(x):
                break
            start = j
            j += 1
            while j < n and sorted_rows[i, j] == x:
                j += 1
            at += 1
            values[at] = x
            counts[at] = j - start
        offsets[i + 1] = at + 1
    # views, not copies: the slots past ``at`` were never written, so their pages were never given memory (the
    # copies were near half the time on distinct values: 200,000 x 28 of them 81 -> 44 ms)
    return values[:at + 1], counts[:at + 1], offsets


class BinMapper:
    """Maps raw feature values to bin codes with per-feature cut points.

    Parameters
    ----------
    max_bins : int, default 255
        Number of bins for non-missing values (2..255).  Missing values take
        one extra bin, so a feature never has more than 256 codes.
    subsample : int or None, default 200_000
        Rows sampled (with ``seed``) to build the sketches; ``None`` uses all.
    seed : int, default 0
    sketch_size : int, default 2048
    """

    def __init__(self, max_bins: int = MAX_BINS, subsample: int | None = 200_000, seed: int = 0,
                 sketch_size: int = 2048):
        if not isinstance(max_bins, (int, np.integer)) or not 2 <= max_bins <= MAX_BINS:
            raise InvalidParameterError(f"max_bins must be an integer in [2, {MAX_BINS}], got {max_bins!r}")
        if subsample is not None and subsample < 1:
            raise InvalidParameterError(f"subsample must be a positive integer or None, got {subsample!r}")
        self.max_bins = int(max_bins)
        self.subsample = subsample
        self.seed = seed
        self.sketch_size = sketch_size
        self.cuts_: list[np.ndarray] | None = None

    # -- fitting -----------------------------------------------------------------
    def sketches(self, X: np.ndarray, sample_weight: np.ndarray | None = None) -> list[QuantileSketch]:
        """Per-feature sketches of ``X`` (what a party shares to agree on cut points); ``sample_weight``: each
        row's weight (checked by the caller, e.g. :func:`~fedgrove.engine.gbdt.check_sample_weight`), a row
        of weight k counting as k copies of it and one of weight 0 not at all."""
        X = _as_float_matrix(X)
        w = None if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
        if self.subsample is not None and X.shape[0] > self.subsample:
            rng = np.random.default_rng(self.seed)
            rows = np.sort(rng.choice(X.shape[0], self.subsample, replace=False))
            X = X[rows]
            w = None if w is None else w[rows]
        out = [None] * X.shape[1]
        by_column = X.flags.f_contiguous and not X.flags.c_contiguous
        if w is None and not by_column:  # the columns of few distinct values in one pass, the others sorted below
            # (a column-major table's columns are copied and sorted faster than the pass reads them: 32,561 x 123
            # values, 10% ones and the rest zeros, 10.0 ms so against 13.6 ms with the pass)
            values, counts, n_distinct = _few_distinct(X, _FEW_DISTINCT)
            for j in np.nonzero(n_distinct >= 0)[0].tolist():
                m = n_distinct[j]
                out[j] = QuantileSketch(values[j, :m].copy(), counts[j, :m].copy(), self.sketch_size)._compressed()
            rest = np.nonzero(n_distinct < 0)[0]
        else:
            rest = np.arange(X.shape[1])
        for lo in range(0, len(rest), _SKETCH_BLOCK):  # a block of columns at a time, each column contiguous
            cols = rest[lo:lo + _SKETCH_BLOCK]
            # (a column-major table keeps every column here: a slice of them is copied as it lies)
            block = np.array(X[:, cols[0]:cols[-1] + 1].T) if by_column else _columns_transposed(X, cols)
            if w is not None:
                for j, col in zip(cols.tolist(), block):
                    out[j] = QuantileSketch.from_column(col, self.sketch_size, w)
                continue
            block.sort(axis=1)  # np.unique's sort, every column at once: NaNs last
            values, counts, offsets = _sorted_runs(block)
            for j, a, b in zip(cols.tolist(), offsets[:-1].tolist(), offsets[1:].tolist()):
                out[j] = QuantileSketch(values[a:b], counts[a:b], self.sketch_size)._compressed()
        return out

    def fit(self, X: np.ndarray, sample_weight: np.ndarray | None = None) -> "BinMapper":
        return self.fit_sketches(self.sketches(X, sample_weight))

    def fit_sketches(self, sketches: list[QuantileSketch]) -> "BinMapper":
        self.cuts_ = [s.cut_points(self.max_bins) for s in sketches]
        return self

    @classmethod
    def from_cuts(cls, cuts: list[np.ndarray], max_bins: int = MAX_BINS) -> "BinMapper":
        m = cls(max_bins=max_bins)
        m.cuts_ = [np.asarray(c, dtype=np.float64) for c in cuts]
        for j, c in enumerate(m.cuts_):
            if c.ndim != 1 or not np.isfinite(c).all() or c.size > max_bins - 1 or \
                    (c.size > 1 and np.any(np.diff(c) <= 0)):
                raise InvalidParameterError(f"cut points of feature {j} must be a list of finite numbers, strictly "
                                            f"increasing and at most {max_bins - 1}, got {str(c.tolist())[:60]}")
        return m

    # -- layout ------------------------------------------------------------------
    @property
    def n_features(self) -> int:
        self._check_fitted()
        return len(self.cuts_)

    @property
    def n_value_bins(self) -> np.ndarray:
        """Value bins per feature (missing bin excluded)."""
        self._check_fitted()
        return np.array([c.size + 1 for c in self.cuts_], dtype=np.int32)

    @property
    def missing_codes(self) -> np.ndarray:
        """The bin code of NaN for each feature (= its number of value bins)."""
        return self.n_value_bins

    @property
    def feature_offsets(self) -> np.ndarray:
        """Offsets of each feature's bins in a flat histogram (value bins + missing bin)."""
        return np.concatenate([[0], np.cumsum(self.n_value_bins + 1)]).astype(np.int32)

    def bin_upper_bounds(self, feature_idx: int) -> np.ndarray:
        """Raw threshold for "bin <= t": ``cuts[t]``; the last value bin maps to +inf."""
        self._check_fitted()
        return np.concatenate([self.cuts_[feature_idx], [np.inf]])

    def threshold(self, feature_idx: int, bin_idx: int) -> float:
        return float(self.bin_upper_bounds(feature_idx)[bin_idx])

    def thresholds(self) -> "Thresholds":
        """Every feature's :meth:`bin_upper_bounds`, for the split finders (made once per training)."""
        return Thresholds([self.bin_upper_bounds(f) for f in range(self.n_features)])

    # -- transform ----------------------------------------------------------------
    def transform(self, X: np.ndarray) -> np.ndarray:
        """Bin ``X``; returns a row-major uint8 array (one sample's codes contiguous)."""
        self._check_fitted()
        X = _as_float_matrix(X)
        if X.shape[1] != len(self.cuts_):
            raise DataError(f"X has {X.shape[1]} features, the bin mapper was fitted on {len(self.cuts_)}")
        n_cuts = np.array([c.size for c in self.cuts_], dtype=np.int64)
        cut_offsets = np.concatenate([[0], np.cumsum(n_cuts)]).astype(np.int64)
        flat_cuts = np.concatenate(self.cuts_ + [np.empty(0)]).astype(np.float64)
        return _map_to_bins(X, flat_cuts, cut_offsets)

    def fit_transform(self, X: np.ndarray) -> np.ndarray:
        return self.fit(X).transform(X)

    def to_dict(self) -> dict:
        """The cut points as JSON-ready data: a :class:`~fedgrove.jsontext.FrozenJSON`, the same object while
        they keep their content (a model's checkpoints, one after every tree, store it once).  Do not modify
        the returned dict."""
        from fedgrove.jsontext import memoised

        self._check_fitted()
        key = (self.max_bins, tuple(len(c) for c in self.cuts_), b"".join(c.tobytes() for c in self.cuts_))
        return memoised(self, key, lambda: {"max_bins": self.max_bins, "cuts": [c.tolist() for c in self.cuts_]},
                        finite=lambda d: all(np.isfinite(c).all() for c in self.cuts_))

    @classmethod
    def from_dict(cls, d: dict) -> "BinMapper":
        return cls.from_cuts([np.asarray(c, dtype=np.float64) for c in d["cuts"]], int(d["max_bins"]))

    def _check_fitted(self):
        if self.cuts_ is None:
            from fedgrove.exceptions import NotFittedError

            raise NotFittedError("BinMapper is not fitted; call fit() or fit_sketches() first")


class Thresholds(list):
    """Per-feature raw thresholds (a list: ``t[f][b]`` is the threshold of "bin <= b" of feature f) with a flat
    copy, so that a layer's split thresholds are one vectorised lookup."""

    def __init__(self, per_feature):
        super().__init__(np.asarray(t, dtype=np.float64) for t in per_feature)
        self.size = np.array([len(t) for t in self], dtype=np.int64)
        self.start = np.concatenate([[0], np.cumsum(self.size)[:-1]]).astype(np.int64)
        self.flat = np.concatenate(list(self)) if len(self) else np.zeros(0)

    def at_splits(self, features, bins) -> np.ndarray:
        """A layer's split thresholds: ``t[f][b]`` for each pair with ``f >= 0``, NaN where ``f < 0`` (no split);
        IndexError for a feature or bin out of range.  One kernel: the vectorised steps (masks, a check, gathers)
        took 9 us a layer of a9a's trees."""
        features = np.asarray(features, dtype=np.int64)
        bins = np.asarray(bins, dtype=np.int64)
        out = np.empty(len(features))
        k = _thresholds_at(self.flat, self.start, self.size, features, bins, out)
        if k >= 0:
            f = int(features[k])
            if f >= len(self.size):
                raise IndexError(f"feature {f} out of range ({len(self.size)} features)")
            raise IndexError(f"bin {bins[k]} out of range for feature {f} ({self.size[f]} thresholds)")
        return out

    def lookup(self, features, bins) -> np.ndarray:
        """``t[f][b]`` for each pair; IndexError for a bin the feature does not have."""
        features = np.asarray(features, dtype=np.int64)
        bins = np.asarray(bins, dtype=np.int64)
        bad = np.nonzero((bins < 0) | (bins >= self.size[features]))[0]
        if len(bad):
            k = int(bad[0])
            raise IndexError(f"bin {bins[k]} out of range for feature {features[k]} "
                             f"({self.size[features[k]]} thresholds)")
        return self.flat[self.start[features] + bins]


@njit(cache=True, nogil=True)
def _thresholds_at(flat, start, size, features, bins, out):
    """``out[k] = flat[start[f] + b]`` for ``f = features[k] >= 0`` (NaN where < 0); returns the first ``k``
    whose feature or bin is out of range (``out`` then partly written), else -1."""
    for k in range(features.shape[0]):
        f = features[k]
        if f < 0:
            out[k] = np.nan
            continue
        if f >= size.shape[0]:
            return k
        b = bins[k]
        if b < 0 or b >= size[f]:
            return k
        out[k] = flat[start[f] + b]
    return -1


_MAP_BLOCK = 256  # rows a task of ``_map_to_bins`` codes: its values of 8 features share its L1-sized cache lines
_MAP_LANES = 8    # values of one feature searched in lock step


@njit(parallel=PRANGE_ONLY, cache=True, nogil=True)
def _map_to_bins(X, flat_cuts, cut_offsets):
    """Bin codes: per value the number of cuts below it (searchsorted, side="left"); NaN -> n_cuts + 1.

    The search is branch-free (a fixed number of halving steps with a select),
    which avoids the mispredictions of a classic binary search, and it runs
    for ``_MAP_LANES`` values of one feature in lock step: their steps do not
    depend on each other, so the processor overlaps their loads, where one
    value's steps wait each on the last (1,000,000 x 28 values: 1.08 -> 0.18 s on one thread; unsigned
    positions, which numba does not wrap around as it does negative signed indices: 0.20 -> 0.16 s).
    Rows go in blocks of ``_MAP_BLOCK``, a block's features one after another.
    A NaN compares false with every cut, so it ends at the lowest code and is
    then given its own.
    """
    n, d = X.shape
    out = np.empty((n, d), dtype=np.uint8)
    for b in prange((n + _MAP_BLOCK - 1) // _MAP_BLOCK):
        r0 = b * _MAP_BLOCK
        r1 = min(n, r0 + _MAP_BLOCK)
        # unsigned positions: numba wraps a negative signed index around (a compare and a select at every access)
        base = np.empty(_MAP_LANES, dtype=np.uint64)
        xs = np.empty(_MAP_LANES)
        for j in range(d):
            lo = np.uint64(cut_offsets[j])
            nc = np.uint64(cut_offsets[j + 1]) - lo
            if nc == U0:  # a feature without cuts: code 0, NaN its own
                for i in range(r0, r1):
                    out[i, j] = 1 if np.isnan(X[i, j]) else 0
                continue
            i = r0
            while i < r1:
                lanes = min(_MAP_LANES, r1 - i)
                for k in range(lanes):
                    xs[k] = X[i + k, j]
                    base[k] = lo
                m = nc
                while m > U1:
                    half = m >> U1
                    for k in range(lanes):
                        bk = base[k]
                        base[k] = bk + half if flat_cuts[bk + half - U1] < xs[k] else bk
                    m -= half
                for k in range(lanes):
                    x = xs[k]
                    out[i + k, j] = nc + U1 if np.isnan(x) else base[k] - lo + (U1 if flat_cuts[base[k]] < x else U0)
                i += lanes
    return out


def _as_float_matrix(X) -> np.ndarray:
    if hasattr(X, "toarray"):
        X = X.toarray()
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2:
        raise DataError(f"X must be 2-dimensional, got shape {X.shape}")
    if np.isinf(X).any():
        raise DataError("X contains infinite values; use NaN for missing values")
    return X
