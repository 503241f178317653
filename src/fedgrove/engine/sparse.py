"""Histograms of sparse binned data: only the codes that differ from each feature's most frequent one.

On one-hot or otherwise sparse tables (a9a: 14 of 123 features non-zero per
row) most of a dense histogram pass adds statistics into each feature's most
frequent bin.  :class:`SparseCodes` lists, per row, the flat bins of the codes
that are *not* their feature's most frequent ("default") code;
:func:`build_histograms_sparse` accumulates only those and gives each default
bin the node's total minus the feature's other bins (LightGBM's
most-frequent-bin trick).

Every non-default bin is summed over the node's rows in the same order as the
dense kernel, so it is bit for bit the dense result; a default bin differs from
the dense sum only by rounding, and is exactly zero when no row of the node has
the default code.  Entries are grouped by blocks of features, each summed by
one thread in row order, so the result does not depend on the thread count.
"""

from __future__ import annotations

import weakref

import numba
import numpy as np
from numba import njit, prange

from fedgrove.engine._intrinsics import PRANGE_ONLY, U0, U1, U2, prefetch, prefetch1
from fedgrove.engine.histogram import add_row_range
from fedgrove.engine.threads import row_work

# above this share of listed codes the dense kernel is used: on the benchmark machine the two broke even near
# 0.4 (random codes, 60 features, one thread), a9a's share is 0.08
DENSITY_LIMIT = 0.25
_TOTAL_ROWS = 4096  # rows a thread sums at a time for a node's totals
_AHEAD_POINTER = 16  # a node's rows ahead whose row pointers are prefetched
_AHEAD_ENTRIES = 8  # ... and whose entries


@njit(cache=True, nogil=True)
def _default_codes(X_binned, feature_offsets):
    """Per feature, its most frequent code (ties: the lowest) and how many codes differ from it."""
    n, d = X_binned.shape
    default = np.empty(d, dtype=np.int64)
    listed = np.empty(d, dtype=np.int64)
    block = 64  # features counted together: their counters stay in cache (one table for all 20,000 features of
    # a wide table was 40 MB, and counting took twice as long); a code's counters side by side: with a
    # feature's 256 counters side by side instead, a row's 64 counters lay 2 kB apart, in the same few sets of
    # the L1 cache, which then missed at every count: a9a's 32,561 x 123 codes 25 -> 1.5 ms, kddcup99's 31 -> 6 ms)
    counts = np.zeros((256, block), dtype=np.int64)
    for f0 in range(0, d, block):
        f1 = min(d, f0 + block)
        counts[:] = 0
        for r in range(n):
            for f in range(f0, f1):
                counts[X_binned[r, f], f - f0] += 1
        for f in range(f0, f1):
            best = 0
            for c in range(1, feature_offsets[f + 1] - feature_offsets[f]):
                if counts[c, f - f0] > counts[best, f - f0]:
                    best = c
            default[f] = best
            listed[f] = n - counts[best, f - f0]
    return default, listed


@njit(cache=True, nogil=True)
def _layout(X_binned, feature_offsets, default, block_lo, block_hi):
    """Row pointers (n_blocks, n + 1) and flat bins of the non-default codes, block by block, rows in order."""
    n, d = X_binned.shape
    n_blocks = block_lo.shape[0]
    indptr = np.empty((n_blocks, n + 1), dtype=np.int64)
    total = 0
    for b in range(n_blocks):
        for r in range(n):
            indptr[b, r] = total
            for f in range(block_lo[b], block_hi[b]):
                if X_binned[r, f] != default[f]:
                    total += 1
        indptr[b, n] = total
    entries = np.empty(total, dtype=np.int32)
    k = 0
    for b in range(n_blocks):
        for r in range(n):
            for f in range(block_lo[b], block_hi[b]):
                code = X_binned[r, f]
                if code != default[f]:
                    entries[k] = feature_offsets[f] + code
                    k += 1
    return indptr, entries


class SparseCodes:
    """The non-default codes of a binned table, in ``n_blocks`` blocks of features (one thread each)."""

    def __init__(self, X_binned: np.ndarray, feature_offsets: np.ndarray, default: np.ndarray,
                 listed: np.ndarray, n_blocks: int):
        offsets = np.ascontiguousarray(feature_offsets, dtype=np.int64)
        n, d = X_binned.shape
        self.default_flat = offsets[:-1] + default
        # blocks of about equal numbers of entries
        cum = np.concatenate([[0], np.cumsum(listed)])
        n_blocks = max(1, min(d, n_blocks))
        cuts = np.searchsorted(cum, np.linspace(0, cum[-1], n_blocks + 1)[1:-1], side="left")
        bounds = np.unique(np.concatenate([[0], np.clip(cuts, 1, max(d - 1, 1)), [d]]))
        self.block_lo = bounds[:-1].astype(np.int64)
        self.block_hi = bounds[1:].astype(np.int64)
        self.indptr, self.entries = _layout(X_binned, offsets, default, self.block_lo, self.block_hi)
        # each entry's row: a node of every row in order (a tree's root) is summed entry by entry, without a
        # loop per row whose varying length the processor mispredicts
        self.row_of = np.empty(len(self.entries), dtype=np.int32)
        rows = np.arange(n, dtype=np.int32)
        for b in range(len(self.block_lo)):
            lo, hi = self.indptr[b, 0], self.indptr[b, n]
            self.row_of[lo:hi] = np.repeat(rows, np.diff(self.indptr[b]))
        self.density = len(self.entries) / max(1, n * d)
        self.entries_per_row = len(self.entries) / max(1, n)

    def worth_it(self, n_used: int) -> bool:
        """Whether listing every row's entries costs less than reading ``n_used`` codes per row."""
        return _worth_listing(self.entries_per_row, n_used)

    def build(self, sample_indices, starts, ends, ordered_stats, feature_offsets, used, out, out_rows) -> None:
        build_histograms_sparse(self.indptr, self.entries, self.row_of, self.default_flat, self.block_lo,
                                self.block_hi, sample_indices, starts, ends, ordered_stats, feature_offsets, used,
                                out, out_rows)


# per binned table (by id, dropped when the array is freed): its default codes (None when too dense for the
# sparse kernel) and its layouts by block count.  The table must not be modified in place afterwards.
_CACHE: dict[int, dict] = {}


def _table_entry(X_binned: np.ndarray, feature_offsets) -> dict | None:
    """The cache entry of ``X_binned`` (its default codes and listed codes per feature), made on first use; None
    for a table the sparse kernel never takes (empty, or not uint8 codes)."""
    n, d = X_binned.shape
    if n == 0 or d == 0 or X_binned.dtype != np.uint8:
        return None
    entry = _CACHE.get(id(X_binned))
    if entry is None:
        offsets = np.ascontiguousarray(feature_offsets, dtype=np.int64)
        default, listed = _default_codes(X_binned, offsets)
        entry = {"default": default if listed.sum() <= DENSITY_LIMIT * n * d else None, "listed": listed}
        _CACHE[id(X_binned)] = entry
        weakref.finalize(X_binned, _CACHE.pop, id(X_binned), None)
    return entry


def codes_per_row(X_binned: np.ndarray, feature_offsets, n_used: int | None = None) -> float:
    """How many codes a histogram over ``n_used`` features (default: all) reads a row of ``X_binned``: the
    row's listed codes on average where the sparse kernel takes the table (as :meth:`SparseCodes.worth_it`
    decides), else ``n_used``."""
    n_used = X_binned.shape[1] if n_used is None else int(n_used)
    entry = _table_entry(X_binned, feature_offsets)
    if entry is None or entry["default"] is None:
        return float(n_used)
    per_row = float(entry["listed"].sum()) / X_binned.shape[0]
    return per_row if _worth_listing(per_row, n_used) else float(n_used)


def table_work(X_binned: np.ndarray, feature_offsets) -> float:
    """The histogram work of all of ``X_binned``'s rows (:func:`~fedgrove.engine.threads.row_work` of its
    :func:`codes_per_row`): what a fit's thread count is chosen by."""
    return row_work(len(X_binned), codes_per_row(X_binned, feature_offsets))


def _worth_listing(entries_per_row: float, n_used: int) -> bool:
    return entries_per_row <= DENSITY_LIMIT * n_used


def sparse_codes_for(X_binned: np.ndarray, feature_offsets, n_blocks: int | None = None) -> SparseCodes | None:
    """The :class:`SparseCodes` of ``X_binned`` when at most :data:`DENSITY_LIMIT` of its codes differ from
    their feature's most frequent one, else None; remembered for as long as the array lives."""
    entry = _table_entry(X_binned, feature_offsets)
    if entry is None or entry["default"] is None:
        return None
    n_blocks = max(1, min(X_binned.shape[1], n_blocks or numba.get_num_threads()))
    if n_blocks not in entry:
        entry[n_blocks] = SparseCodes(X_binned, feature_offsets, entry["default"], entry["listed"], n_blocks)
    return entry[n_blocks]


# unsigned indices in the entry and row loops (see _intrinsics)
_U_AHEAD_POINTER = np.uint64(_AHEAD_POINTER)
_U_AHEAD_ENTRIES = np.uint64(_AHEAD_ENTRIES)


@njit(cache=True, nogil=True)
def _add_in_order(entries, row_of, k0, k1, s, ordered_stats, hf, used_bin, all_used):
    """A node of every row of the table in order: ``hf[n_stats * fb + c] += ordered_stats[s + row_of[k], c]`` for
    the entries ``k0:k1`` (of used bins), entry by entry (rows in order)."""
    us = np.uint64(s)
    n_stats = np.uint64(ordered_stats.shape[1])
    if n_stats == U2 and all_used:
        for k in range(np.uint64(k0), np.uint64(k1)):
            fb = U2 * np.uint64(entries[k])
            r = us + np.uint64(row_of[k])
            hf[fb] += ordered_stats[r, U0]
            hf[fb + U1] += ordered_stats[r, U1]
    else:
        for k in range(np.uint64(k0), np.uint64(k1)):
            fb = np.uint64(entries[k])
            if all_used or used_bin[fb]:
                r = us + np.uint64(row_of[k])
                for c in range(n_stats):
                    hf[n_stats * fb + c] += ordered_stats[r, c]


@njit(cache=True, nogil=True)
def _add_rows(indptr, blk, entries, sample_indices, lo, hi, ordered_stats, hf, listed, b0, used_bin, all_used):
    """A node's rows ``sample_indices[lo:hi]``, row by row: their entries in block ``blk`` (of used bins) add the
    row's statistics to their bins of ``hf`` and count it in ``listed[fb - b0]``.  The rows are spread over the
    table: their row pointers are asked for 16 rows ahead and their entries 8 ahead (by then the pointer is in
    cache), so the misses overlap (kddcup99's nodes of one histogram 36 -> 20 ns a row in a fit, 2 threads)."""
    ublk, ub0, uhi = np.uint64(blk), np.uint64(b0), np.uint64(hi)
    n_stats = np.uint64(ordered_stats.shape[1])
    for i in range(np.uint64(lo), uhi):
        if i + _U_AHEAD_POINTER < uhi:
            prefetch(indptr, blk, sample_indices[i + _U_AHEAD_POINTER])
        if i + _U_AHEAD_ENTRIES < uhi:
            prefetch1(entries, indptr[ublk, np.uint64(sample_indices[i + _U_AHEAD_ENTRIES])])
        r = np.uint64(sample_indices[i])
        k0, k1 = np.uint64(indptr[ublk, r]), np.uint64(indptr[ublk, r + U1])
        if n_stats == U2:
            a0 = ordered_stats[i, U0]
            a1 = ordered_stats[i, U1]
            for k in range(k0, k1):
                fb = np.uint64(entries[k])
                if all_used or used_bin[fb]:
                    listed[fb - ub0] += 1
                    hf[U2 * fb] += a0
                    hf[U2 * fb + U1] += a1
        else:
            for k in range(k0, k1):
                fb = np.uint64(entries[k])
                if all_used or used_bin[fb]:
                    listed[fb - ub0] += 1
                    for c in range(n_stats):
                        hf[n_stats * fb + c] += ordered_stats[i, c]


@njit(parallel=PRANGE_ONLY, cache=True, nogil=True)
def build_histograms_sparse(indptr, entries, row_of, default_flat, block_lo, block_hi, sample_indices, starts,
                            ends, ordered_stats, feature_offsets, used, out, out_rows):
    """Fill ``out[out_rows[j]]`` for the features with ``used[f]`` as the dense ``build_histograms`` does, from
    the listed non-default codes; each default bin is the node's total minus its feature's other bins.

    A node of all the table's rows in order (a tree's root without subsampling) is summed entry by entry,
    ``row_of`` giving each entry's row, in the same order as row by row: kddcup99's 395,216 rows, 6.2 entries
    each, 7.7 -> 3.6 ms on one thread, 5.9 -> 1.9 ms on two (the loop over a row's entries, 0 to 41 long,
    ends where the processor does not expect it; by hand)."""
    n_nodes = starts.shape[0]
    n_table = indptr.shape[1] - 1
    n_stats = ordered_stats.shape[1]
    n_blocks = block_lo.shape[0]
    n_bins = out.shape[1]
    all_used = True
    for f in range(used.shape[0]):
        if not used[f]:
            all_used = False
    used_bin = np.zeros(n_bins, dtype=np.bool_)
    for f in range(used.shape[0]):
        if used[f]:
            for b in range(feature_offsets[f], feature_offsets[f + 1]):
                used_bin[b] = True
    # each node's totals: chunks of _TOTAL_ROWS rows summed in parallel, then the chunks' sums in order (the
    # same sums whatever the number of threads; one sum row by row took kddcup99's root 1.4 ms of 4.7)
    first_chunk = np.zeros(n_nodes + 1, dtype=np.int64)
    for j in range(n_nodes):
        first_chunk[j + 1] = first_chunk[j] + (ends[j] - starts[j] + _TOTAL_ROWS - 1) // _TOTAL_ROWS
    n_chunks = first_chunk[n_nodes]
    chunk_lo = np.empty(n_chunks, dtype=np.int64)
    chunk_hi = np.empty(n_chunks, dtype=np.int64)
    for j in range(n_nodes):
        for q in range(first_chunk[j], first_chunk[j + 1]):
            chunk_lo[q] = starts[j] + (q - first_chunk[j]) * _TOTAL_ROWS
            chunk_hi[q] = min(ends[j], chunk_lo[q] + _TOTAL_ROWS)
    chunk_sums = np.zeros((n_chunks, n_stats))
    for q in prange(n_chunks):
        add_row_range(ordered_stats, chunk_lo[q], chunk_hi[q], chunk_sums, q)
    totals = np.zeros((n_nodes, n_stats))
    for j in range(n_nodes):
        for q in range(first_chunk[j], first_chunk[j + 1]):
            for c in range(n_stats):
                totals[j, c] += chunk_sums[q, c]
    in_order = np.zeros(n_nodes, dtype=np.bool_)  # the node is every row of the table, in order
    for j in range(n_nodes):
        if ends[j] - starts[j] == n_table:
            s = starts[j]
            out_of_place = 0
            for i in prange(n_table):
                out_of_place += sample_indices[s + i] != i
            in_order[j] = out_of_place == 0
    for blk in prange(n_blocks):
        f0 = block_lo[blk]
        f1 = block_hi[blk]
        b0 = feature_offsets[f0]
        b1 = feature_offsets[f1]
        listed = np.zeros(b1 - b0, dtype=np.int64)  # rows of the node per non-default bin
        for j in range(n_nodes):
            h = out[out_rows[j]]
            hf = h.reshape(-1)
            for b in range(b0, b1):
                listed[b - b0] = 0
                if used_bin[b]:
                    for c in range(n_stats):
                        h[b, c] = 0.0
            if in_order[j]:  # ordered_stats[starts[j] + r] is row r's
                _add_in_order(entries, row_of, indptr[blk, 0], indptr[blk, n_table], starts[j], ordered_stats,
                              hf, used_bin, all_used)
            else:
                _add_rows(indptr, blk, entries, sample_indices, starts[j], ends[j], ordered_stats, hf, listed, b0,
                          used_bin, all_used)
            n_rows = ends[j] - starts[j]
            for f in range(f0, f1):
                if not used[f]:
                    continue
                db = default_flat[f]
                n_listed = 0
                for b in range(feature_offsets[f], feature_offsets[f + 1]):
                    n_listed += listed[b - b0]
                if n_listed == n_rows:
                    # no row of the node has the default code: its bin stays exactly zero (a node summed entry
                    # by entry counts no rows, and has some: the default is its rows' most frequent code)
                    continue
                for c in range(n_stats):
                    rest = 0.0
                    for b in range(feature_offsets[f], feature_offsets[f + 1]):
                        if b != db:
                            rest += h[b, c]
                    h[db, c] = totals[j, c] - rest


_ROOT_ROWS = 64  # rows whose statistics of every class the batched root kernel copies side by side at a time


@njit(cache=True, nogil=True)
def _side_by_side(g, h, r0, r1, side):
    """``side[r - r0] = (g[0, r], h[0, r], g[1, r], h[1, r], ...)`` for the rows ``r0:r1``."""
    ur0 = np.uint64(r0)
    for c in range(np.uint64(g.shape[0])):
        for r in range(ur0, np.uint64(r1)):
            side[r - ur0, U2 * c] = g[c, r]
            side[r - ur0, U2 * c + U1] = h[c, r]


@njit(cache=True, nogil=True)
def _add_entries_side_by_side(entries, row_of, k0, k1, b0, r0, side, acc):
    """``acc[entries[e] - b0] += side[row_of[e] - r0]`` (rows of every class's statistics side by side) for the
    entries ``k0:k1``, in order."""
    ub0, ur0 = np.uint64(b0), np.uint64(r0)
    width = np.uint64(acc.shape[1])
    for e in range(np.uint64(k0), np.uint64(k1)):
        fb = np.uint64(entries[e]) - ub0
        r = np.uint64(row_of[e]) - ur0
        for q in range(width):
            acc[fb, q] += side[r, q]


@njit(parallel=PRANGE_ONLY, cache=True, nogil=True)
def build_root_histograms_by_class(indptr, entries, row_of, default_flat, block_lo, block_hi, g, h,
                                   feature_offsets, used, out):
    """``out[c]``: the histogram of a root of every row in order whose statistics are ``(g[c], h[c])``, for
    every class ``c`` of class-major ``g`` and ``h`` ``(k, n)``, bit for bit what :func:`build_histograms_sparse`
    gives for each class alone (the same sums in the same order).  The entries are read once for all classes:
    each adds its row's (g, h) of every class, copied side by side ``_ROOT_ROWS`` rows at a time, to its bin's
    (g, h) of every class.  kddcup99's 23 roots a round: 54 -> 22 ms against the single-class kernel given each
    class's statistics in turn (2 threads, by hand); 16 ms of the 22 copy the statistics side by side, which
    each thread does for every row.  Bins of features not ``used`` are left as they are."""
    k, n = g.shape
    n_blocks = block_lo.shape[0]
    n_chunks = (n + _TOTAL_ROWS - 1) // _TOTAL_ROWS
    # each class's totals as the single-class kernel takes them: chunks of rows, then the chunks in order
    chunk_sums = np.zeros((k * n_chunks, 2))
    for q in prange(k * n_chunks):
        c = q // n_chunks
        lo = (q % n_chunks) * _TOTAL_ROWS
        hi = min(n, lo + _TOTAL_ROWS)
        a0 = 0.0
        a1 = 0.0
        for i in range(lo, hi):
            a0 += g[c, i]
            a1 += h[c, i]
        chunk_sums[q, 0] += a0
        chunk_sums[q, 1] += a1
    totals = np.zeros((k, 2))
    for c in range(k):
        for q in range(c * n_chunks, (c + 1) * n_chunks):
            totals[c, 0] += chunk_sums[q, 0]
            totals[c, 1] += chunk_sums[q, 1]
    for blk in prange(n_blocks):
        f0 = block_lo[blk]
        f1 = block_hi[blk]
        b0 = feature_offsets[f0]
        b1 = feature_offsets[f1]
        acc = np.zeros((b1 - b0, 2 * k))  # a bin's (g, h) of every class side by side
        side = np.empty((_ROOT_ROWS, 2 * k))  # a row's (g, h) of every class side by side
        for r0 in range(0, n, _ROOT_ROWS):
            r1 = min(n, r0 + _ROOT_ROWS)
            _side_by_side(g, h, r0, r1, side)
            _add_entries_side_by_side(entries, row_of, indptr[blk, r0], indptr[blk, r1], b0, r0, side, acc)
        for f in range(f0, f1):
            if not used[f]:
                continue
            db = default_flat[f]
            for c in range(k):
                for b in range(feature_offsets[f], feature_offsets[f + 1]):
                    out[c, b, 0] = acc[b - b0, 2 * c]
                    out[c, b, 1] = acc[b - b0, 2 * c + 1]
                for q in range(2):
                    rest = 0.0
                    for b in range(feature_offsets[f], feature_offsets[f + 1]):
                        if b != db:
                            rest += out[c, b, q]
                    out[c, db, q] = totals[c, q] - rest


def root_histograms_by_class(X_binned: np.ndarray, feature_offsets, g: np.ndarray, h: np.ndarray,
                             features) -> np.ndarray | None:
    """The root histograms ``(k, n_bins, 2)`` of one round's ``k`` trees on every row of ``X_binned`` in order,
    their statistics ``(g[c], h[c])`` (class-major ``(k, n)``), for ``features``, in one pass over the sparse
    codes; None when the finder would use the dense kernel for the table (it then builds each root itself)."""
    codes = sparse_codes_for(X_binned, feature_offsets)
    if codes is None or not codes.worth_it(len(features)):
        return None
    used = np.zeros(X_binned.shape[1], dtype=np.bool_)
    used[features] = True
    offsets = np.ascontiguousarray(feature_offsets, dtype=np.int64)
    out = np.empty((g.shape[0], int(offsets[-1]), 2))
    build_root_histograms_by_class(codes.indptr, codes.entries, codes.row_of, codes.default_flat, codes.block_lo,
                                   codes.block_hi, np.ascontiguousarray(g), np.ascontiguousarray(h), offsets,
                                   used, out)
    return out
