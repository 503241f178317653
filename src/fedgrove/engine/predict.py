"""Prediction kernels: route samples to leaves (numba and numpy reference).

Trees of an ensemble are concatenated into flat node arrays; ``tree_offsets``
gives where each tree's nodes start.  ``left``/``right`` are indices local to
the tree; ``feature == -1`` marks a leaf.  The raw kernel tests
``x <= threshold`` (NaN follows ``missing_left``); the binned kernel tests
``code <= bin`` (the missing code follows ``missing_left``).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange


@njit(parallel=True, cache=True, nogil=True)
def predict_leaves(X, feature, threshold, missing_left, left, right, tree_offsets):
    n_samples = X.shape[0]
    n_trees = tree_offsets.shape[0] - 1
    out = np.empty((n_samples, n_trees), dtype=np.int32)
    for i in prange(n_samples):
        for t in range(n_trees):
            base = tree_offsets[t]
            node = 0
            while feature[base + node] >= 0:
                k = base + node
                x = X[i, feature[k]]
                if np.isnan(x):
                    go_left = missing_left[k]
                else:
                    go_left = x <= threshold[k]
                node = left[k] if go_left else right[k]
            out[i, t] = node
    return out


@njit(parallel=True, cache=True, nogil=True)
def predict_leaves_binned(X_binned, feature, bins, missing_left, left, right, missing_codes, tree_offsets):
    n_samples = X_binned.shape[0]
    n_trees = tree_offsets.shape[0] - 1
    out = np.empty((n_samples, n_trees), dtype=np.int32)
    for i in prange(n_samples):
        for t in range(n_trees):
            base = tree_offsets[t]
            node = 0
            while feature[base + node] >= 0:
                k = base + node
                f = feature[k]
                b = X_binned[i, f]
                if b == missing_codes[f]:
                    go_left = missing_left[k]
                else:
                    go_left = b <= bins[k]
                node = left[k] if go_left else right[k]
            out[i, t] = node
    return out


def predict_leaves_reference(X, feature, threshold, missing_left, left, right, tree_offsets):
    n_trees = len(tree_offsets) - 1
    out = np.empty((X.shape[0], n_trees), dtype=np.int32)
    rows = np.arange(X.shape[0])
    for t in range(n_trees):
        base = tree_offsets[t]
        node = np.zeros(X.shape[0], dtype=np.int64)
        while True:
            f = feature[base + node]
            active = f >= 0
            if not active.any():
                break
            k = base + node[active]
            x = X[rows[active], f[active]]
            go_left = np.where(np.isnan(x), missing_left[k].astype(bool), x <= threshold[k])
            node[active] = np.where(go_left, left[k], right[k])
        out[:, t] = node
    return out
