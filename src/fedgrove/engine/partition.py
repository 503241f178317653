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

from fedgrove.engine._intrinsics import PRANGE_ONLY, U0, U1, prefetch


# rows a task decides and scatters: a9a's 32,561-row root was one task (one thread) at 1 << 15; at 1 << 13 it is
# four, 99 -> 54 us on 2 threads (by hand)
_TASK_ROWS = 1 << 13
_PREFETCH_ROWS = 1 << 17  # tables with more rows than this have a column (uint8) larger than an L2 cache


@njit(cache=True, inline="always")
def _goes_left(code, mcode, t, ml):
    return ml if code == mcode else code <= t


# unsigned indices (see _intrinsics): a9a's 32,561-row root decided 31 -> 12 us and scattered 51 -> 25 us on
# one thread (by hand)
_U8 = np.uint64(8)


@njit(cache=True, nogil=True)
def _decide(X_binned, sample_indices, flags, lo, hi, base, f, mcode, t, ml, far):
    """``flags[i - base]``: whether row ``sample_indices[i]`` goes left, for ``i`` in ``lo:hi``; returns how many
    do.  A column larger than the L2 cache (``far``) is read with the rows 8 ahead prefetched; a smaller one is
    not (the prefetch then only costs)."""
    u_hi, u_base, uf = np.uint64(hi), np.uint64(base), np.uint64(f)
    cnt = 0
    if far:
        for i in range(np.uint64(lo), u_hi):
            if i + _U8 < u_hi:
                prefetch(X_binned, sample_indices[i + _U8], f)
            go = _goes_left(X_binned[np.uint64(sample_indices[i]), uf], mcode, t, ml)
            flags[i - u_base] = go
            cnt += go
    else:
        for i in range(np.uint64(lo), u_hi):
            go = _goes_left(X_binned[np.uint64(sample_indices[i]), uf], mcode, t, ml)
            flags[i - u_base] = go
            cnt += go
    return cnt


@njit(cache=True, nogil=True)
def _scatter(sample_indices, ordered_stats, flags, out_indices, out_stats, lo, hi, base, left_at, right_at):
    """Rows ``lo:hi`` to ``left_at`` on (those flagged) and ``right_at`` on (the others), in order; without a
    branch (a split's left and right rows alternate unpredictably)."""
    lp, rp, u_base = np.uint64(left_at), np.uint64(right_at), np.uint64(base)
    n_stats = ordered_stats.shape[1]
    for i in range(np.uint64(lo), np.uint64(hi)):
        go = np.uint64(flags[i - u_base])
        w = rp + (lp - rp) * go
        lp += go
        rp += U1 - go
        out_indices[w] = sample_indices[i]
        if n_stats == 2:  # (g, h), the common case: copied without an inner loop
            out_stats[w, U0] = ordered_stats[i, U0]
            out_stats[w, U1] = ordered_stats[i, U1]
        else:
            for c in range(np.uint64(n_stats)):
                out_stats[w, c] = ordered_stats[i, c]


@njit(parallel=PRANGE_ONLY, cache=True, nogil=True)
def partition_nodes(X_binned, sample_indices, ordered_stats, out_indices, out_stats, starts, ends, features, bins,
                    missing_left, missing_codes):
    """Stable partition of each segment into ``out_indices``/``out_stats``; returns the split positions.

    ``X_binned`` is best column-major (one feature's codes contiguous).  Work is
    cut into tasks of at most 8k rows so a large node (the root) is
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
    far = X_binned.shape[0] > _PREFETCH_ROWS
    for q in prange(n_tasks):
        j = task_node[q]
        f = features[j]
        cnt = _decide(X_binned, sample_indices, flags, task_lo[q], task_hi[q], base, f, missing_codes[f], bins[j],
                      missing_left[j], far)
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
    for q in prange(n_tasks):
        _scatter(sample_indices, ordered_stats, flags, out_indices, out_stats, task_lo[q], task_hi[q], base,
                 left_at[q], right_at[q])
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


@njit(cache=True, nogil=True)
def partition_by_flags(sample_indices, ordered_stats, out_indices, out_stats, starts, ends, flags):
    """:func:`partition_nodes` by given decisions: ``flags`` holds, node after node, whether each of the segment's
    rows goes left (a peer's masks, concatenated).  Returns the split positions."""
    n = starts.shape[0]
    n_stats = ordered_stats.shape[1]
    mids = np.empty(n, dtype=np.int64)
    off = 0
    for j in range(n):
        s, e = starts[j], ends[j]
        n_left = 0
        for i in range(e - s):
            n_left += flags[off + i]
        lp, rp = s, s + n_left
        for i in range(s, e):
            if flags[off + i - s]:
                w = lp
                lp += 1
            else:
                w = rp
                rp += 1
            out_indices[w] = sample_indices[i]
            for c in range(n_stats):
                out_stats[w, c] = ordered_stats[i, c]
        mids[j] = s + n_left
        off += e - s
    return mids


@njit(cache=True, nogil=True)
def record_segments(seg, node_ids, child_ids, mids, counts):
    """Children's segments of split nodes: ``seg`` rows (start, end, buffer) by node id; node ``node_ids[k]``'s
    left child ``child_ids[k, 0]`` gets ``[start, mids[k])`` and its right child ``[mids[k], end)``, both in the
    other buffer.  ``counts[2k]``, ``counts[2k + 1]``: the children's sizes."""
    for k in range(node_ids.shape[0]):
        p = node_ids[k]
        s, e, other = seg[p, 0], seg[p, 1], 1 - seg[p, 2]
        left, right = child_ids[k, 0], child_ids[k, 1]
        seg[left, 0], seg[left, 1], seg[left, 2] = s, mids[k], other
        seg[right, 0], seg[right, 1], seg[right, 2] = mids[k], e, other
        counts[2 * k] = mids[k] - s
        counts[2 * k + 1] = e - mids[k]


@njit(cache=True, nogil=True)
def shared_buffer(seg, node_ids):
    """The buffer (``seg[:, 2]``) holding every node of ``node_ids`` (at least one), or -1 when they are in both."""
    b = seg[node_ids[0], 2]
    for k in range(1, node_ids.shape[0]):
        if seg[node_ids[k], 2] != b:
            return -1
    return b


@njit(cache=True, nogil=True)
def plan_siblings(pending, seg, node_ids):
    """Which nodes of a layer get histograms built and which by subtraction from their parent.

    ``pending``: rows (parent, left, right) of the last partition; ``seg``: segments by node id; ``node_ids``:
    the layer.  Returns (row of each node id in the layer, -1 if absent; rows to build; parent ids, smaller and
    larger child rows of the subtracted pairs).  Per pending parent, in order: the smaller child (ties: left)
    when both children are in the layer, else those that are; then any node of the layer that is no pending
    node's child."""
    n = node_ids.shape[0]
    row_of = np.full(seg.shape[0], -1, dtype=np.int64)
    for r in range(n):
        row_of[node_ids[r]] = r
    m = pending.shape[0]
    build = np.empty(n, dtype=np.int64)
    parents = np.empty(m, dtype=np.int64)
    small = np.empty(m, dtype=np.int64)
    large = np.empty(m, dtype=np.int64)
    is_child = np.zeros(n, dtype=np.bool_)
    nb = 0
    npairs = 0
    for k in range(m):
        left, right = pending[k, 1], pending[k, 2]
        lr, rr = row_of[left], row_of[right]
        if lr >= 0:
            is_child[lr] = True
        if rr >= 0:
            is_child[rr] = True
        if lr >= 0 and rr >= 0:
            if seg[left, 1] - seg[left, 0] <= seg[right, 1] - seg[right, 0]:
                s, g = lr, rr
            else:
                s, g = rr, lr
            build[nb] = s
            nb += 1
            parents[npairs] = pending[k, 0]
            small[npairs] = s
            large[npairs] = g
            npairs += 1
        else:
            if lr >= 0:
                build[nb] = lr
                nb += 1
            if rr >= 0:
                build[nb] = rr
                nb += 1
    for r in range(n):
        if not is_child[r]:
            build[nb] = r
            nb += 1
    return row_of, build[:nb], parents[:npairs], small[:npairs], large[:npairs]
