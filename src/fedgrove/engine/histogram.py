"""Histogram kernels: build (numba and numpy reference) and subtraction.

A histogram is a float64 array ``(n_nodes, n_total_bins, n_stats)``: per node,
per flat bin (``feature_offsets[f] + code``), the sum of each per-sample
statistic.  For gradient boosting the statistics are (g, h, count); for CART
they are class weights or (w, w*y, w*y^2).  Only the listed ``features`` are
filled; the other bins are left at zero.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

_MAX_BLOCK = 32


@njit(cache=True)
def _feature_blocks(n_features, n_threads):
    """Split features into contiguous blocks: at least one per thread, at most 32 features each."""
    n_blocks = max(n_threads, (n_features + _MAX_BLOCK - 1) // _MAX_BLOCK)
    n_blocks = min(n_blocks, n_features)
    size = (n_features + n_blocks - 1) // n_blocks
    return (n_features + size - 1) // size, size


_CHUNK_ROWS = 1 << 16


@njit(cache=True, inline="always")
def _accumulate(h, codes, code_base, ordered, p0, p1, q0, q1, offsets):
    """h[offsets[q] + codes[p, q]] += ordered[p] for rows p0..p1, block columns q0..q1."""
    n_stats = ordered.shape[1]
    if n_stats == 3:
        for p in range(p0, p1):
            s0 = ordered[p, 0]
            s1 = ordered[p, 1]
            s2 = ordered[p, 2]
            for q in range(q0, q1):
                b = offsets[q] + codes[code_base + p, q]
                h[b, 0] += s0
                h[b, 1] += s1
                h[b, 2] += s2
    elif n_stats == 2:
        for p in range(p0, p1):
            s0 = ordered[p, 0]
            s1 = ordered[p, 1]
            for q in range(q0, q1):
                b = offsets[q] + codes[code_base + p, q]
                h[b, 0] += s0
                h[b, 1] += s1
    else:
        for p in range(p0, p1):
            for q in range(q0, q1):
                b = offsets[q] + codes[code_base + p, q]
                for c in range(n_stats):
                    h[b, c] += ordered[p, c]


@njit(parallel=True, cache=True, nogil=True)
def build_histograms(X_binned, sample_indices, starts, ends, stats, feature_offsets, features, out, out_rows,
                     n_threads=1):
    """Fill ``out[out_rows[j]]`` with the histogram of ``sample_indices[starts[j]:ends[j]]``.

    The samples of deep nodes are scattered over memory, and a histogram loop
    that reads them in place waits on cache misses.  So rows are processed in
    chunks: first the chunk's codes and statistics are gathered into
    contiguous buffers (independent loads, many misses in flight), then the
    histograms are accumulated from the buffers, row-wise within blocks of
    features and in parallel over blocks.  Each sample's updates within a block
    hit different features' bins, so they do not wait on each other.  One
    node over consecutive rows (the root) is read in place.
    """
    n_nodes = starts.shape[0]
    n_stats = stats.shape[1]
    n_used = features.shape[0]
    n_features = X_binned.shape[1]
    all_features = n_used == n_features
    offsets = np.empty(n_used, dtype=np.int64)
    for q in range(n_used):
        offsets[q] = feature_offsets[features[q]]
        if features[q] != q:
            all_features = False
    n_blocks, size = _feature_blocks(n_used, n_threads)
    pos = np.empty(n_nodes + 1, dtype=np.int64)
    pos[0] = 0
    for j in range(n_nodes):
        pos[j + 1] = pos[j] + (ends[j] - starts[j])
    total = pos[n_nodes]
    flat_rows = np.empty(total, dtype=np.int64)
    for j in prange(n_nodes):
        for i in range(ends[j] - starts[j]):
            flat_rows[pos[j] + i] = sample_indices[starts[j] + i]
    for blk in prange(n_blocks):
        q0 = blk * size
        q1 = min(n_used, q0 + size)
        for j in range(n_nodes):
            h = out[out_rows[j]]
            for q in range(q0, q1):
                f = features[q]
                for b in range(feature_offsets[f], feature_offsets[f + 1]):
                    for c in range(n_stats):
                        h[b, c] = 0.0
    if all_features and n_nodes == 1 and total > 0 and flat_rows[total - 1] - flat_rows[0] == total - 1:
        r0 = flat_rows[0]
        h = out[out_rows[0]]
        for blk in prange(n_blocks):
            q0 = blk * size
            q1 = min(n_used, q0 + size)
            _accumulate(h, X_binned, r0, stats[r0:r0 + total], 0, total, q0, q1, offsets)
        return
    chunk = min(_CHUNK_ROWS, max(total, 1))
    codes = np.empty((chunk, n_used), dtype=X_binned.dtype)
    ordered = np.empty((chunk, n_stats), dtype=np.float64)
    for c0 in range(0, total, chunk):
        c1 = min(total, c0 + chunk)
        for p in prange(c0, c1):
            r = flat_rows[p]
            for c in range(n_stats):
                ordered[p - c0, c] = stats[r, c]
            if all_features:
                codes[p - c0, :] = X_binned[r, :]
            else:
                for q in range(n_used):
                    codes[p - c0, q] = X_binned[r, features[q]]
        j0 = np.searchsorted(pos, c0, side="right") - 1
        for blk in prange(n_blocks):
            q0 = blk * size
            q1 = min(n_used, q0 + size)
            j = j0
            while j < n_nodes and pos[j] < c1:
                p0 = max(pos[j], c0) - c0
                p1 = min(pos[j + 1], c1) - c0
                _accumulate(out[out_rows[j]], codes, 0, ordered, p0, p1, q0, q1, offsets)
                j += 1


def build_histograms_reference(X_binned, sample_indices, starts, ends, stats, feature_offsets, features, out, out_rows,
                               n_threads=1):
    """Numpy reference of :func:`build_histograms` (same arguments, same result)."""
    for j in range(len(starts)):
        idx = sample_indices[starts[j]:ends[j]]
        for f in features:
            off, nb = feature_offsets[f], feature_offsets[f + 1] - feature_offsets[f]
            codes = X_binned[idx, f].astype(np.int64)
            for c in range(stats.shape[1]):
                out[out_rows[j], off:off + nb, c] = np.bincount(codes, weights=stats[idx, c], minlength=nb)


@njit(parallel=True, cache=True, nogil=True)
def subtract_histograms(parent, parent_rows, child, small_rows, large_rows):
    """``child[large_rows[j]] = parent[parent_rows[j]] - child[small_rows[j]]``.

    The larger sibling's histogram costs one pass over the bins instead of one
    over its samples.
    """
    n_pairs = parent_rows.shape[0]
    n_bins = parent.shape[1]
    n_stats = parent.shape[2]
    for j in prange(n_pairs):
        p = parent[parent_rows[j]]
        s = child[small_rows[j]]
        dst = child[large_rows[j]]
        for b in range(n_bins):
            for c in range(n_stats):
                dst[b, c] = p[b, c] - s[b, c]


def subtract_histograms_reference(parent, parent_rows, child, small_rows, large_rows):
    child[large_rows] = parent[parent_rows] - child[small_rows]


@njit(parallel=True, cache=True, nogil=True)
def sum_rows(stats, sample_indices):
    """Column sums of ``stats[sample_indices]`` (the statistics of a root node)."""
    n_stats = stats.shape[1]
    n = sample_indices.shape[0]
    n_chunks = max(1, min(64, n // 4096))
    partial = np.zeros((n_chunks, n_stats))
    size = (n + n_chunks - 1) // n_chunks
    for k in prange(n_chunks):
        for i in range(k * size, min(n, (k + 1) * size)):
            r = sample_indices[i]
            for c in range(n_stats):
                partial[k, c] += stats[r, c]
    out = np.zeros(n_stats)
    for k in range(n_chunks):
        for c in range(n_stats):
            out[c] += partial[k, c]
    return out
