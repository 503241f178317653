"""Partition kernel: split each node's segment of ``sample_indices``.

Each node owns a contiguous segment ``sample_indices[start:end]`` (and the
matching rows of ``ordered_stats``).  Applying a split writes the same segment
of a second buffer as [left samples, right samples], each in their original
(ascending) order, and returns where the right part starts.  Layers alternate
between the two buffers, so nothing is copied back.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from fedgrove.engine._intrinsics import prefetch


_TASK_ROWS = 1 << 15


@njit(cache=True, inline="always")
def _goes_left(code, mcode, t, ml):
    return ml if code == mcode else code <= t


@njit(parallel=True, cache=True, nogil=True)
def partition_nodes(X_binned, sample_indices, ordered_stats, out_indices, out_stats, starts, ends, features, bins,
                    missing_left, missing_codes):
    """Stable partition of each segment into ``out_indices``/``out_stats``; returns the split positions.

    ``X_binned`` is best column-major (one feature's codes contiguous).  Work is
    cut into tasks of at most 32k rows so a large node (the root) is
    partitioned by all threads: decide and count the left rows per task, turn
    the counts into write offsets, scatter.
    """
    n = starts.shape[0]
    n_tasks_of = np.empty(n, dtype=np.int64)
    for j in range(n):
        n_tasks_of[j] = max(1, (ends[j] - starts[j] + _TASK_ROWS - 1) // _TASK_ROWS)
    first_task = np.zeros(n + 1, dtype=np.int64)
    for j in range(n):
        first_task[j + 1] = first_task[j] + n_tasks_of[j]
    n_tasks = first_task[n]
    task_node = np.empty(n_tasks, dtype=np.int64)
    task_lo = np.empty(n_tasks, dtype=np.int64)
    task_hi = np.empty(n_tasks, dtype=np.int64)
    for j in range(n):
        for k in range(n_tasks_of[j]):
            q = first_task[j] + k
            task_node[q] = j
            task_lo[q] = starts[j] + k * _TASK_ROWS
            task_hi[q] = min(ends[j], starts[j] + (k + 1) * _TASK_ROWS)
    base = starts.min() if n > 0 else 0
    span = ends.max() - base if n > 0 else 0
    flags = np.empty(span, dtype=np.bool_)
    n_left = np.zeros(n_tasks, dtype=np.int64)
    for q in prange(n_tasks):
        j = task_node[q]
        f = features[j]
        cnt = 0
        hi = task_hi[q]
        for i in range(task_lo[q], hi):
            if i + 8 < hi:
                prefetch(X_binned, sample_indices[i + 8], f)
            go = _goes_left(X_binned[sample_indices[i], f], missing_codes[f], bins[j], missing_left[j])
            flags[i - base] = go
            cnt += go
        n_left[q] = cnt
    left_at = np.empty(n_tasks, dtype=np.int64)
    right_at = np.empty(n_tasks, dtype=np.int64)
    mids = np.empty(n, dtype=np.int64)
    for j in range(n):
        total_left = 0
        for q in range(first_task[j], first_task[j + 1]):
            total_left += n_left[q]
        mids[j] = starts[j] + total_left
        lp = starts[j]
        rp = mids[j]
        for q in range(first_task[j], first_task[j + 1]):
            left_at[q] = lp
            right_at[q] = rp
            lp += n_left[q]
            rp += (task_hi[q] - task_lo[q]) - n_left[q]
    n_stats = ordered_stats.shape[1]
    for q in prange(n_tasks):
        lp = left_at[q]
        rp = right_at[q]
        for i in range(task_lo[q], task_hi[q]):
            if flags[i - base]:
                w = lp
                lp += 1
            else:
                w = rp
                rp += 1
            out_indices[w] = sample_indices[i]
            for c in range(n_stats):
                out_stats[w, c] = ordered_stats[i, c]
    return mids


def partition_nodes_reference(X_binned, sample_indices, ordered_stats, out_indices, out_stats, starts, ends, features,
                              bins, missing_left, missing_codes):
    mids = np.empty(len(starts), dtype=np.int64)
    for j in range(len(starts)):
        seg = sample_indices[starts[j]:ends[j]]
        block = ordered_stats[starts[j]:ends[j]]
        codes = X_binned[seg, features[j]]
        go_left = np.where(codes == missing_codes[features[j]], bool(missing_left[j]), codes <= bins[j])
        out_indices[starts[j]:ends[j]] = np.concatenate([seg[go_left], seg[~go_left]])
        out_stats[starts[j]:ends[j]] = np.concatenate([block[go_left], block[~go_left]])
        mids[j] = starts[j] + go_left.sum()
    return mids
