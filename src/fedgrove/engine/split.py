"""Split search kernels (numba and numpy reference).

Two scorers share one layout: :func:`find_splits_gbdt` (second-order gain of
XGBoost / LightGBM) and :func:`find_splits_cart` (impurity decrease of CART).
For each node the best (feature, bin, missing direction) is returned; the
candidate "bin <= t" sends value bins ``0..t`` left and the missing bin left or
right.  Ties are broken towards the lowest feature, then the lowest bin, then
"missing right": a candidate replaces the best only when its gain exceeds it
by more than ``TIE_TOL`` relative to ``max(|best|, TIE_FLOOR)``.  That keeps the
choice identical when the same histograms are summed in a different order
(federated protocols).  The rounding to absorb is larger than machine epsilon:
a deep node's histogram comes from a chain of subtractions starting at root
sums over all samples, so its gains carry absolute errors of the order of
``n * eps * root_sum`` (about 1e-10 relative was seen for a 15-sample node of
a 6,000-sample a9a subset, where two features split off the same sample).
A forest's statistics are on fixed-point grids (:func:`fedgrove.engine.forest.mse_grid`, the weights'
grid), so its sums, and gains, are the same bits in any order; under ``mse``, whose gains are in the
labels' units squared, its ties have no floor (:func:`cart_tie_floor`): ``TIE_FLOOR`` would count every
gain of labels spread over less than about 0.01 a tie (``bench/label_scale.py``: R^2 0.90 for labels
spread over 7.6e-5, 0.98 without the floor).  A GBDT's floor stays: its gradient sums do differ with the
order, by an absolute amount.

A split is worth making only when its gain exceeds ``TIE_TOL`` times the scale
of the scores it is the difference of (GBDT: half the sum of the children's and
the parent's scores; CART: the node's weighted impurity): a split that changes
nothing, such as one of a node whose instances all have the same gradients
under lambda = 0, or one that leaves a node's class shares as they were, has a
mathematical gain of 0 that rounding makes +-1e-15, which one summation order
would take and another not.  The bar is relative, so it holds at any label
scale; a GBDT's also has a floor of ``GAIN_FLOOR`` times the node's hessian sum,
for nodes where every gradient sum is itself rounding (a multiclass root whose
children keep the class shares exactly: gains of 1e-31 that either order may
make positive), far below any gain that moves a prediction.

A child's hessian sum is compared with ``min_child_weight`` less a relative
``WEIGHT_TOL``: the sums land exactly on it in ordinary cases (three instances
of hessian 1/3 against 1.0, in a multiclass model's first round), where
rounding made one summation order's 1.0 a 0.9999999999999998.

When a node has no missing values the missing direction does not change the
gain; missing values are then sent to the child with more samples.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from fedgrove.engine._intrinsics import PRANGE_ONLY

TIE_TOL = 1e-7
TIE_FLOOR = 1e-3
WEIGHT_TOL = 1e-9
GAIN_FLOOR = 1e-13
NO_FEATURE = -1
CRITERIA = {"gini": 0, "entropy": 1, "mse": 2}


@njit(cache=True, inline="always")
def _better(gain, best):
    return _better_above(gain, best, TIE_FLOOR)


@njit(cache=True, inline="always")
def _better_above(gain, best, floor):
    """The tie rule with ``floor`` in place of ``TIE_FLOOR``."""
    if best == -np.inf:
        return gain > best
    return gain > best + TIE_TOL * max(floor, abs(best))


@njit(cache=True, inline="always")
def cart_tie_floor(criterion):
    """The tie rule's floor for a forest's ``criterion`` (a code of ``CRITERIA``): 0 for ``mse``, whose gains are
    in the labels' units squared, ``TIE_FLOOR`` for the class criteria, whose gains are fractions (see the
    module's docstring)."""
    return 0.0 if criterion == 2 else TIE_FLOOR


def best_index(gains) -> int:
    """Index of the best of ``gains`` under the split search's tie rule (scanning in order, a gain replaces
    the best only when it exceeds it by more than the tolerance, so near-equal gains go to the lowest
    index whatever order their sums were taken in); -1 when every gain is -inf."""
    return int(_best_index(np.ascontiguousarray(gains, dtype=np.float64).reshape(-1)))


@njit(cache=True)
def _best_index(gains):
    best, at = -np.inf, -1
    for i in range(gains.shape[0]):
        if _better(gains[i], best):
            best, at = gains[i], i
    return at


@njit(cache=True, inline="always")
def _gbdt_score(g, h, reg_lambda):
    return g * g / (h + reg_lambda)


@njit(cache=True, inline="always")
def _worth(gain, scale):
    """Whether a split's gain is more than rounding of the scores (of magnitude ``scale``) it comes from."""
    return gain > TIE_TOL * scale


def find_splits_gbdt(hist, rows, node_stats, feature_offsets, allowed, reg_lambda, gamma,
                     min_child_weight, min_samples_leaf):
    """Best split per node from (g, h, count) histograms.

    Parameters
    ----------
    hist : float64 (n_rows, n_total_bins, 3 or 2)   (g, h, count) sums, or (g, h) when
        no rule needs counts (``min_samples_leaf <= 1``, ``min_child_weight > 0``):
        then count checks are skipped and the returned left count is NaN (the
        partition supplies it); a missing bin counts as empty when its g and h
        sums are both zero.
    rows : int64 (n_nodes,)      row of each node in ``hist``
    node_stats : float64 (n_nodes, 3)   (G, H, count) of each node
    feature_offsets : int32 (n_features + 1,)
    allowed : bool (n_nodes, n_features)   features each node may split on

    Returns
    -------
    gain, feature, bin, missing_left, left_stats : per node; ``feature == -1``
    where no valid split exists.  ``gain`` already has ``gamma`` subtracted.
    The per-(node, feature) bests come from :func:`gbdt_pair_splits`, the choice
    among features from :func:`reduce_pairs`.
    """
    pg, pb, pm, pl = gbdt_pair_splits(hist, rows, node_stats, feature_offsets, allowed, reg_lambda, gamma,
                                      min_child_weight, min_samples_leaf)
    return reduce_pairs(pg, pb, pm, pl, rows.shape[0], feature_offsets.shape[0] - 1)


WIDE_BINS = 16
"""A feature with this many value bins or more is scanned in passes (see :func:`gbdt_pair_splits`)."""
WIDE_CHUNK = 32
"""Pairs a thread takes at a time where some are scanned in passes (each such run allocates its scratch)."""


@njit(parallel=PRANGE_ONLY, cache=True, nogil=True)
def gbdt_pair_splits(hist, rows, node_stats, feature_offsets, allowed, reg_lambda, gamma, min_child_weight,
                     min_samples_leaf, wide_bins=WIDE_BINS):
    """The best second-order split of every (node, feature) pair: flat arrays indexed ``node * n_features +
    feature`` (gain, bin, missing_left, left_stats), as :func:`cart_pair_splits`.

    A feature of fewer than ``wide_bins`` value bins (:data:`WIDE_BINS`; the tests also take 1 and more than
    any feature has) is scanned bin by bin (:func:`_scan_pair`), a wider one in passes
    (:func:`_scan_wide_pair`): its prefix sums, then every candidate's gain in a loop without branches, which
    the compiler vectorises (the two divisions a candidate are most of the cost), then the best in the scan's
    order.  Both evaluate each candidate with the same operations in the same order and choose in the same
    order, so they give the same bits.  Measured on the split searches of real fits (2026-11-29, one thread):
    the passes took a fifth to two fifths less time on tables of 200-255 bins a feature (cod-rna, kddcup99,
    the 1M set) and more on a9a's two-bin features, which is why a table without a wide feature keeps the
    bin-by-bin loop alone.
    """
    n_nodes = rows.shape[0]
    n_features = feature_offsets.shape[0] - 1
    n_pairs = n_nodes * n_features
    pg = np.full(n_pairs, -np.inf)
    pb = np.zeros(n_pairs, dtype=np.int32)
    pm = np.zeros(n_pairs, dtype=np.bool_)
    pl = np.zeros((n_pairs, 3))
    has_count = hist.shape[2] >= 3
    min_weight = min_child_weight * (1.0 - WEIGHT_TOL)
    widest = 0
    for f in range(n_features):
        widest = max(widest, feature_offsets[f + 1] - feature_offsets[f] - 1)
    if widest < wide_bins:
        for q in prange(n_pairs):
            _scan_pair(q, hist, rows, node_stats, feature_offsets, allowed, reg_lambda, gamma, min_weight,
                       min_samples_leaf, has_count, pg, pb, pm, pl)
        return pg, pb, pm, pl
    for c in prange((n_pairs + WIDE_CHUNK - 1) // WIDE_CHUNK):
        scratch = np.empty((5, widest))  # left g, h, count sums; gains with missing right, left
        kept = np.empty(widest, dtype=np.int64)  # the bins whose candidates are scored
        for q in range(c * WIDE_CHUNK, min(n_pairs, (c + 1) * WIDE_CHUNK)):
            nvb = feature_offsets[q % n_features + 1] - feature_offsets[q % n_features] - 1
            if nvb < wide_bins:
                _scan_pair(q, hist, rows, node_stats, feature_offsets, allowed, reg_lambda, gamma, min_weight,
                           min_samples_leaf, has_count, pg, pb, pm, pl)
            else:
                _scan_wide_pair(q, hist, rows, node_stats, feature_offsets, allowed, reg_lambda, gamma,
                                min_weight, min_samples_leaf, has_count, pg, pb, pm, pl, scratch, kept)
    return pg, pb, pm, pl


@njit(cache=True, inline="always")
def _pair_setup(q, hist, rows, node_stats, feature_offsets, reg_lambda, has_count):
    """A (node, feature) pair's histogram, first bin, value bins, node sums, missing bin's sums, parent score."""
    n_features = feature_offsets.shape[0] - 1
    j = q // n_features
    f = q % n_features
    h = hist[rows[j]]
    off = feature_offsets[f]
    nvb = feature_offsets[f + 1] - off - 1  # value bins; the missing bin follows
    G = node_stats[j, 0]
    H = node_stats[j, 1]
    C = node_stats[j, 2] if has_count else np.inf
    mg = h[off + nvb, 0]
    mh = h[off + nvb, 1]
    if has_count:
        mc = h[off + nvb, 2]
    else:
        mc = 1.0 if (mg != 0.0 or mh != 0.0) else 0.0
    return h, off, nvb, G, H, C, mg, mh, mc, _gbdt_score(G, H, reg_lambda)


@njit(cache=True, inline="always")
def _scan_pair(q, hist, rows, node_stats, feature_offsets, allowed, reg_lambda, gamma, min_weight,
               min_samples_leaf, has_count, pg, pb, pm, pl):
    """Pair ``q``'s best split, bin by bin, into ``pg[q], pb[q], pm[q], pl[q]``."""
    n_features = feature_offsets.shape[0] - 1
    if not allowed[q // n_features, q % n_features]:
        return
    h, off, nvb, G, H, C, mg, mh, mc, parent = _pair_setup(q, hist, rows, node_stats, feature_offsets,
                                                           reg_lambda, has_count)
    best = -np.inf
    gl = 0.0
    hl = 0.0
    cl = 0.0
    for t in range(nvb):
        gl += h[off + t, 0]
        hl += h[off + t, 1]
        if has_count:
            cl += h[off + t, 2]
        else:
            cl = np.inf
        for d in range(2):  # 0: missing right, 1: missing left
            if d == 1 and mc <= 0.0:
                break
            lg = gl + mg * d
            lh = hl + mh * d
            lc = cl + mc * d
            rg = G - lg
            rh = H - lh
            rc = C - lc
            if lc < min_samples_leaf or rc < min_samples_leaf:
                continue
            if lh < min_weight or rh < min_weight:
                continue
            if lc <= 0.0 or rc <= 0.0:
                continue
            sl = _gbdt_score(lg, lh, reg_lambda)
            sr = _gbdt_score(rg, rh, reg_lambda)
            gain = 0.5 * (sl + sr - parent) - gamma
            if not _worth(gain, max(0.5 * (sl + sr + parent), GAIN_FLOOR * H)):
                continue
            if _better(gain, best):
                best = gain
                pb[q] = t
                pm[q] = d == 1
                pl[q, 0] = lg
                pl[q, 1] = lh
                pl[q, 2] = lc if has_count else np.nan
    pg[q] = best


@njit(cache=True, inline="always")
def _scan_wide_pair(q, hist, rows, node_stats, feature_offsets, allowed, reg_lambda, gamma, min_weight,
                    min_samples_leaf, has_count, pg, pb, pm, pl, scratch, kept):
    """:func:`_scan_pair` in passes over ``scratch`` (5 x at least the pair's value bins): the same candidates,
    each with the same operations, and the same choice among them."""
    n_features = feature_offsets.shape[0] - 1
    if not allowed[q // n_features, q % n_features]:
        return
    h, off, nvb, G, H, C, mg, mh, mc, parent = _pair_setup(q, hist, rows, node_stats, feature_offsets,
                                                           reg_lambda, has_count)
    left_g = scratch[0]
    left_h = scratch[1]
    left_c = scratch[2]
    # an empty bin's candidate is the one before it again, which the tie rule never prefers: only the first bin
    # and the bins holding something are kept (their positions in ``kept``), the others written over
    n = 0
    gl = 0.0
    hl = 0.0
    cl = 0.0
    for t in range(nvb):
        a = h[off + t, 0]
        b = h[off + t, 1]
        gl += a
        hl += b
        left_g[n] = gl
        left_h[n] = hl
        some = (a != 0.0) | (b != 0.0)
        if has_count:
            c = h[off + t, 2]
            cl += c
            left_c[n] = cl
            some = some | (c != 0.0)
        kept[n] = t
        n += some | (t == 0)
    floor = GAIN_FLOOR * H
    both = mc > 0.0  # otherwise missing left is no candidate
    for d in range(2 if both else 1):  # 0: missing right, 1: missing left
        gains = scratch[3 + d]
        for k in range(n):
            lg = left_g[k] + mg * d
            lh = left_h[k] + mh * d
            lc = (left_c[k] + mc * d) if has_count else np.inf
            rg = G - lg
            rh = H - lh
            rc = C - lc
            sl = _gbdt_score(lg, lh, reg_lambda)
            sr = _gbdt_score(rg, rh, reg_lambda)
            gain = 0.5 * (sl + sr - parent) - gamma
            bad = ((lc < min_samples_leaf) | (rc < min_samples_leaf) | (lh < min_weight) | (rh < min_weight)
                   | (lc <= 0.0) | (rc <= 0.0))
            worth = gain > TIE_TOL * max(0.5 * (sl + sr + parent), floor)
            gains[k] = gain if worth & (not bad) else -np.inf
    best = -np.inf
    at = -1
    for k in range(n):  # the scan's order: bin by bin, missing right before missing left
        if _better(scratch[3, k], best):
            best = scratch[3, k]
            at = 2 * k
        if both and _better(scratch[4, k], best):
            best = scratch[4, k]
            at = 2 * k + 1
    if at >= 0:
        k = at // 2
        d = at % 2
        pb[q] = kept[k]
        pm[q] = d == 1
        pl[q, 0] = left_g[k] + mg * d
        pl[q, 1] = left_h[k] + mh * d
        pl[q, 2] = (left_c[k] + mc * d) if has_count else np.nan
    pg[q] = best


@njit(cache=True)
def reduce_pairs(pg, pb, pm, pl, n_nodes, n_features, floor=TIE_FLOOR):
    """Per node, the best of its (node, feature) pairs, scanning features in order (see the module's tie rule;
    ``floor``: a forest's is :func:`cart_tie_floor`)."""
    n_stats = pl.shape[1]
    gain = np.full(n_nodes, -np.inf)
    feature = np.full(n_nodes, NO_FEATURE, dtype=np.int32)
    bins = np.zeros(n_nodes, dtype=np.int32)
    missing_left = np.zeros(n_nodes, dtype=np.bool_)
    left = np.zeros((n_nodes, n_stats))
    for j in range(n_nodes):
        best = -np.inf
        for f in range(n_features):
            q = j * n_features + f
            if pg[q] == -np.inf:
                continue
            if _better_above(pg[q], best, floor):
                best = pg[q]
                feature[j] = f
                bins[j] = pb[q]
                missing_left[j] = pm[q]
                for c in range(n_stats):
                    left[j, c] = pl[q, c]
        gain[j] = best
    return gain, feature, bins, missing_left, left


@njit(cache=True, inline="always")
def _impurity(stats, criterion):
    """Impurity of a node from its statistics (class weights, or w, wy, wy2)."""
    if criterion == 2:
        w = stats[0]
        if w <= 0.0:
            return 0.0
        mean = stats[1] / w
        return max(stats[2] / w - mean * mean, 0.0)
    total = 0.0
    for c in range(stats.shape[0]):
        total += stats[c]
    if total <= 0.0:
        return 0.0
    acc = 0.0
    if criterion == 0:
        for c in range(stats.shape[0]):
            p = stats[c] / total
            acc += p * p
        return 1.0 - acc
    for c in range(stats.shape[0]):
        if stats[c] > 0.0:
            p = stats[c] / total
            acc -= p * math.log2(p)
    return acc


@njit(cache=True, inline="always")
def _weight(stats, criterion):
    if criterion == 2:
        return stats[0]
    total = 0.0
    for c in range(stats.shape[0]):
        total += stats[c]
    return total


def find_splits_cart(hist, rows, node_stats, feature_offsets, allowed, criterion, root_weight,
                     min_samples_leaf):
    """Best split per node by weighted impurity decrease (scikit-learn's definition).

    ``gain = N_t / N * (imp - N_L / N_t * imp_L - N_R / N_t * imp_R)`` with N the
    root's (bootstrap-weighted) sample count.  Statistics are class weights for
    ``gini``/``entropy`` and (w, w*y, w*y^2) for ``mse``.  The best split of
    every (node, feature) pair comes from :func:`cart_pair_splits`; the choice
    among features from :func:`reduce_pairs`, so a federation whose parties
    score their own features and send per-feature gains chooses exactly as this
    function does.
    """
    pg, pb, pm, pl = cart_pair_splits(hist, rows, node_stats, feature_offsets, allowed, criterion, root_weight,
                                      min_samples_leaf)
    return reduce_pairs(pg, pb, pm, pl, rows.shape[0], feature_offsets.shape[0] - 1, cart_tie_floor(criterion))


@njit(parallel=PRANGE_ONLY, cache=True, nogil=True)
def cart_pair_splits(hist, rows, node_stats, feature_offsets, allowed, criterion, root_weight,
                     min_samples_leaf, wide_bins=WIDE_BINS):
    """The best CART split of every (node, feature) pair: flat arrays indexed ``node * n_features + feature``.

    Returns (gain, bin, missing_left, left_stats); gain is ``-inf`` for
    features not allowed at the node and for pairs without a valid split.
    Under ``gini`` and ``mse``, features of ``wide_bins`` value bins or more are
    scanned in passes, as in :func:`gbdt_pair_splits` (:func:`_scan_wide_cart_pair`),
    to the same bits.  Measured on the split searches of real forests (2026-11-29,
    one thread): gini a fifth less time on cod-rna and 30% less on waveform,
    mse 16% less on spambase; ``entropy``, whose logarithms the scan takes only
    for the candidates that pass the size checks, took half as long again in
    passes, so it keeps the bin-by-bin scan.
    """
    n_nodes = rows.shape[0]
    n_features = feature_offsets.shape[0] - 1
    n_stats = node_stats.shape[1]
    n_pairs = n_nodes * n_features
    pg = np.full(n_pairs, -np.inf)
    pb = np.zeros(n_pairs, dtype=np.int32)
    pm = np.zeros(n_pairs, dtype=np.bool_)
    pl = np.zeros((n_pairs, n_stats))
    widest = 0
    for f in range(n_features):
        widest = max(widest, feature_offsets[f + 1] - feature_offsets[f] - 1)
    if widest < wide_bins or criterion == 1:
        for q in prange(n_pairs):
            _scan_cart_pair(q, hist, rows, node_stats, feature_offsets, allowed, criterion, root_weight,
                            min_samples_leaf, pg, pb, pm, pl)
        return pg, pb, pm, pl
    for c in prange((n_pairs + WIDE_CHUNK - 1) // WIDE_CHUNK):
        scratch = np.empty((n_stats + 6, widest))  # left sums a class; left, right weights; impurities; gains
        for q in range(c * WIDE_CHUNK, min(n_pairs, (c + 1) * WIDE_CHUNK)):
            nvb = feature_offsets[q % n_features + 1] - feature_offsets[q % n_features] - 1
            if nvb < wide_bins:
                _scan_cart_pair(q, hist, rows, node_stats, feature_offsets, allowed, criterion, root_weight,
                                min_samples_leaf, pg, pb, pm, pl)
            else:
                _scan_wide_cart_pair(q, hist, rows, node_stats, feature_offsets, allowed, criterion, root_weight,
                                     min_samples_leaf, pg, pb, pm, pl, scratch)
    return pg, pb, pm, pl


@njit(cache=True, inline="always")
def _scan_cart_pair(q, hist, rows, node_stats, feature_offsets, allowed, criterion, root_weight, min_samples_leaf,
                    pg, pb, pm, pl):
    """Pair ``q``'s best CART split, bin by bin, into ``pg[q], pb[q], pm[q], pl[q]``."""
    n_features = feature_offsets.shape[0] - 1
    n_stats = node_stats.shape[1]
    j = q // n_features
    f = q % n_features
    if not allowed[j, f]:
        return
    h = hist[rows[j]]
    off = feature_offsets[f]
    nvb = feature_offsets[f + 1] - off - 1
    tot = node_stats[j]
    wt = _weight(tot, criterion)
    imp = _impurity(tot, criterion)
    miss = h[off + nvb]
    mw = _weight(miss, criterion)
    acc = np.zeros(n_stats)
    lft = np.empty(n_stats)
    rgt = np.empty(n_stats)
    best = -np.inf
    floor = cart_tie_floor(criterion)
    for t in range(nvb):
        for c in range(n_stats):
            acc[c] += h[off + t, c]
        for d in range(2):
            if d == 1 and mw <= 0.0:
                break
            for c in range(n_stats):
                lft[c] = acc[c] + miss[c] * d
                rgt[c] = tot[c] - lft[c]
            wl = _weight(lft, criterion)
            wr = wt - wl
            if wl < min_samples_leaf or wr < min_samples_leaf or wl <= 0.0 or wr <= 0.0:
                continue
            gain = wt / root_weight * (imp - wl / wt * _impurity(lft, criterion)
                                       - wr / wt * _impurity(rgt, criterion))
            if not _worth(gain, wt / root_weight * imp):
                continue
            if _better_above(gain, best, floor):
                best = gain
                pb[q] = t
                pm[q] = d == 1
                for c in range(n_stats):
                    pl[q, c] = lft[c]
    pg[q] = best


@njit(cache=True, inline="always")
def _scan_wide_cart_pair(q, hist, rows, node_stats, feature_offsets, allowed, criterion, root_weight,
                         min_samples_leaf, pg, pb, pm, pl, scratch):
    """:func:`_scan_cart_pair` under ``gini`` or ``mse``, in passes over ``scratch`` (``n_stats + 6`` x at
    least the pair's value bins), each pass over the bins for one class at a time: every impurity is
    :func:`_impurity`'s operations in its order, so the gains, and the choice, are the same bits.

    Its first lines repeat :func:`_scan_cart_pair`'s on purpose: as one inline function returning the pair's
    arrays and sums they made the bin-by-bin scan a quarter slower (a9a's forest searches 26 -> 32 ms, three
    alternating runs, 2026-11-29), where the GBDT scans' shared ``_pair_setup`` cost nothing."""
    n_features = feature_offsets.shape[0] - 1
    n_stats = node_stats.shape[1]
    j = q // n_features
    f = q % n_features
    if not allowed[j, f]:
        return
    h = hist[rows[j]]
    off = feature_offsets[f]
    nvb = feature_offsets[f + 1] - off - 1
    tot = node_stats[j]
    wt = _weight(tot, criterion)
    imp = _impurity(tot, criterion)
    miss = h[off + nvb]
    mw = _weight(miss, criterion)
    for c in range(n_stats):  # the left child's sums with missing right, class by class
        acc = 0.0
        cum = scratch[c]
        for t in range(nvb):
            acc += h[off + t, c]
            cum[t] = acc
    wl = scratch[n_stats]
    tr = scratch[n_stats + 1]  # the right child's weight as _impurity sums it
    il = scratch[n_stats + 2]
    ir = scratch[n_stats + 3]
    scale = wt / root_weight * imp
    both = mw > 0.0
    for d in range(2 if both else 1):  # 0: missing right, 1: missing left
        md = np.float64(d)
        if criterion == 2:
            for t in range(nvb):
                wl[t] = scratch[0, t] + miss[0] * md
                tr[t] = tot[0] - wl[t]
            for t in range(nvb):
                il[t] = _mse_impurity(wl[t], scratch[1, t] + miss[1] * md, scratch[2, t] + miss[2] * md)
                ir[t] = _mse_impurity(tr[t], tot[1] - (scratch[1, t] + miss[1] * md),
                                      tot[2] - (scratch[2, t] + miss[2] * md))
        else:
            for t in range(nvb):
                wl[t] = 0.0
                tr[t] = 0.0
                il[t] = 0.0
                ir[t] = 0.0
            for c in range(n_stats):
                for t in range(nvb):
                    left = scratch[c, t] + miss[c] * md
                    wl[t] += left
                    tr[t] += tot[c] - left
            for c in range(n_stats):  # gini: 1 - the sum of the squared class shares
                for t in range(nvb):
                    left = scratch[c, t] + miss[c] * md
                    share_l = left / wl[t]
                    share_r = (tot[c] - left) / tr[t]
                    il[t] += share_l * share_l
                    ir[t] += share_r * share_r
            for t in range(nvb):  # _impurity: 0 where the weight is not positive
                il[t] = 0.0 if wl[t] <= 0.0 else 1.0 - il[t]
                ir[t] = 0.0 if tr[t] <= 0.0 else 1.0 - ir[t]
        gains = scratch[n_stats + 4 + d]
        for t in range(nvb):
            w_l = wl[t]
            w_r = wt - w_l
            gain = wt / root_weight * (imp - w_l / wt * il[t] - w_r / wt * ir[t])
            bad = (w_l < min_samples_leaf) | (w_r < min_samples_leaf) | (w_l <= 0.0) | (w_r <= 0.0)
            gains[t] = gain if (gain > TIE_TOL * scale) & (not bad) else -np.inf
    best = -np.inf
    at = -1
    floor = cart_tie_floor(criterion)
    for t in range(nvb):  # the scan's order: bin by bin, missing right before missing left
        if _better_above(scratch[n_stats + 4, t], best, floor):
            best = scratch[n_stats + 4, t]
            at = 2 * t
        if both and _better_above(scratch[n_stats + 5, t], best, floor):
            best = scratch[n_stats + 5, t]
            at = 2 * t + 1
    if at >= 0:
        t = at // 2
        d = at % 2
        pb[q] = t
        pm[q] = d == 1
        for c in range(n_stats):
            pl[q, c] = scratch[c, t] + miss[c] * d
    pg[q] = best


@njit(cache=True, inline="always")
def _mse_impurity(w, wy, wy2):
    """:func:`_impurity`'s ``mse`` of the statistics (w, wy, wy2)."""
    if w <= 0.0:
        return 0.0
    mean = wy / w
    return max(wy2 / w - mean * mean, 0.0)


# --------------------------------------------------------------------------- references
def _reference_scan(hist, rows, node_stats, feature_offsets, allowed, score_fn, valid_fn, floor=TIE_FLOOR):
    n_nodes = len(rows)
    n_features = len(feature_offsets) - 1
    n_stats = node_stats.shape[1]
    gain = np.full(n_nodes, -np.inf)
    feature = np.full(n_nodes, NO_FEATURE, dtype=np.int32)
    bins = np.zeros(n_nodes, dtype=np.int32)
    missing_left = np.zeros(n_nodes, dtype=bool)
    left = np.zeros((n_nodes, n_stats))

    def better(g, b):
        return g > b if b == -np.inf else g > b + TIE_TOL * max(floor, abs(b))

    for j in range(n_nodes):
        best = -np.inf
        for f in range(n_features):
            if not allowed[j, f]:
                continue
            off, end = feature_offsets[f], feature_offsets[f + 1]
            values = hist[rows[j], off:end - 1]
            miss = hist[rows[j], end - 1]
            cum = np.cumsum(values, axis=0)
            fbest, fcand = -np.inf, None
            for t in range(len(values)):
                for d in (0, 1):
                    if d == 1 and not score_fn.missing_weight(miss) > 0:
                        break
                    lft = cum[t] + miss * d
                    rgt = node_stats[j] - lft
                    if not valid_fn(lft, rgt):
                        continue
                    g = score_fn(node_stats[j], lft, rgt)
                    if better(g, fbest):
                        fbest, fcand = g, (t, d == 1, lft.copy())
            if fcand is not None and better(fbest, best):
                best = fbest
                feature[j], bins[j], missing_left[j], left[j] = f, fcand[0], fcand[1], fcand[2]
        gain[j] = best
    return gain, feature, bins, missing_left, left


def find_splits_gbdt_reference(hist, rows, node_stats, feature_offsets, allowed, reg_lambda, gamma,
                               min_child_weight, min_samples_leaf):
    """Numpy reference of :func:`find_splits_gbdt`."""

    def score(tot, lft, rgt):
        s = lambda v: v[0] ** 2 / (v[1] + reg_lambda)  # noqa: E731
        gain = 0.5 * (s(lft) + s(rgt) - s(tot)) - gamma
        scale = max(0.5 * (s(lft) + s(rgt) + s(tot)), GAIN_FLOOR * tot[1])
        return gain if _worth.py_func(gain, scale) else -np.inf

    score.missing_weight = lambda m: m[2]

    min_weight = min_child_weight * (1.0 - WEIGHT_TOL)

    def valid(lft, rgt):
        return (min(lft[2], rgt[2]) >= min_samples_leaf and min(lft[1], rgt[1]) >= min_weight
                and lft[2] > 0 and rgt[2] > 0)

    if hist.shape[2] == 2:  # counts unknown: presence flags stand in, count checks are skipped
        present = ((hist[..., 0] != 0) | (hist[..., 1] != 0)).astype(float)
        hist = np.concatenate([hist, present[..., None]], axis=2)
        out = _reference_scan(hist, rows, node_stats, feature_offsets, allowed, score,
                              lambda lft, rgt: min(lft[1], rgt[1]) >= min_weight)
        out[4][:, 2] = np.nan
        return out
    return _reference_scan(hist, rows, node_stats, feature_offsets, allowed, score, valid)


def _impurity_reference(v, criterion):
    if criterion == 2:
        return 0.0 if v[0] <= 0 else max(v[2] / v[0] - (v[1] / v[0]) ** 2, 0.0)
    tot = v.sum()
    if tot <= 0:
        return 0.0
    p = v / tot
    if criterion == 0:
        return 1.0 - float(np.sum(p * p))
    p = p[p > 0]
    return float(-np.sum(p * np.log2(p)))


def find_splits_cart_reference(hist, rows, node_stats, feature_offsets, allowed, criterion, root_weight,
                               min_samples_leaf):
    """Numpy reference of :func:`find_splits_cart`."""
    weight = (lambda v: v[0]) if criterion == 2 else (lambda v: v.sum())  # noqa: E731

    def score(tot, lft, rgt):
        wt, wl = weight(tot), weight(lft)
        wr = wt - wl
        imp = _impurity_reference(tot, criterion)
        gain = wt / root_weight * (imp - wl / wt * _impurity_reference(lft, criterion)
                                   - wr / wt * _impurity_reference(rgt, criterion))
        return gain if _worth.py_func(gain, wt / root_weight * imp) else -np.inf

    score.missing_weight = weight

    def valid(lft, rgt):
        wl, wr = weight(lft), weight(rgt)
        return wl >= min_samples_leaf and wr >= min_samples_leaf and wl > 0 and wr > 0

    return _reference_scan(hist, rows, node_stats, feature_offsets, allowed, score, valid,
                           cart_tie_floor.py_func(criterion))


@njit(cache=True, nogil=True)
def resolve_missing_by_hessian(hist, feature_offsets, feature, left_stats, node_stats, missing_left):
    """:func:`~fedgrove.engine.splitter.resolve_missing_direction` for a GBDT whose histograms hold (g, h) and no
    counts, in place, row by row as its numpy steps do it: where node ``i``'s split feature has a missing bin whose
    hessian sum is within ``WEIGHT_TOL`` of none (relative to the node's), missing values go to the child with the
    larger hessian sum (ties left), and that bin's sums move with them when the scan had put them on the other
    side."""
    k = min(hist.shape[2], left_stats.shape[1])
    for i in range(len(feature)):
        f = feature[i]
        if f < 0:
            continue
        b = feature_offsets[f + 1] - 1
        tw = node_stats[i, 1]
        if not abs(hist[i, b, 1]) <= WEIGHT_TOL * abs(tw):
            continue
        lw = left_stats[i, 1]
        left = lw >= (tw - lw) - WEIGHT_TOL * abs(tw)
        if left != missing_left[i]:
            sign = 1.0 if left else -1.0
            for c in range(k):
                left_stats[i, c] += sign * hist[i, b, c]
        missing_left[i] = left
