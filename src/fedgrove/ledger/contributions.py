"""Who contributed what to a split: the split Shapley value and the voting contribution (FGBDT-Chain).

For the split chosen at a node (feature, bin, missing direction) each party's
histogram gives four numbers: the g and h sums of the instances that go left
and right.  A coalition's utility is the split's gain computed from the sums
of its members' numbers, floored at 0 (the empty coalition has none):
``v(B) = max(0, ½[G_L²/(H_L+λ) + G_R²/(H_R+λ) − G²/(H+λ)] − γ)``.
A party's split Shapley value is its average marginal utility over all orders
of the parties: exact (all coalitions, vectorised over bit masks) up to
:data:`EXACT_MAX` parties, else estimated from random permutations, with the
standard error of the estimate.  The values add up to ``v(all)``, the split's
gain (efficiency); identical histograms get equal values (symmetry); a party
whose sums are all zero gets zero (null player).

The voting contribution of a split: its gain divided among the parties that
voted for the chosen feature.  A party's total over a model is
``sum over splits (beta * vote + shapley)``.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import njit

import fedgrove.engine.compiling  # noqa: F401  (numba's cache folder, and a note while it compiles)

EXACT_MAX = 12


def split_sums(hist_rows: np.ndarray, bin_: int, missing_left: bool) -> np.ndarray:
    """(G_L, H_L, G_R, H_R) of one party's histogram of the chosen feature: ``hist_rows`` (value bins, then the
    missing bin; columns g, h[, count]); "bin <= bin_" goes left, the missing bin as ``missing_left``."""
    hist_rows = np.asarray(hist_rows, dtype=np.float64)
    left = hist_rows[: bin_ + 1, :2].sum(axis=0)
    miss = hist_rows[-1, :2]
    if missing_left:
        left = left + miss
    total = hist_rows[:, :2].sum(axis=0)
    return np.array([left[0], left[1], total[0] - left[0], total[1] - left[1]])


def _score(g: np.ndarray, h: np.ndarray, reg_lambda: float) -> np.ndarray:
    """G^2 / (H + lambda), 0 where H + lambda is 0: a side no instance of the coalition reaches (with lambda 0
    it was 0/0, and every party's value NaN)."""
    den = h + reg_lambda
    return np.divide(g * g, den, out=np.zeros(np.broadcast(g, den).shape), where=den > 0)


def utility(sums: np.ndarray, reg_lambda: float, gamma: float) -> np.ndarray:
    """v for each row of ``sums`` (coalitions x 4): the split's gain floored at 0."""
    gl, hl, gr, hr = sums[..., 0], sums[..., 1], sums[..., 2], sums[..., 3]
    gain = 0.5 * (_score(gl, hl, reg_lambda) + _score(gr, hr, reg_lambda) - _score(gl + gr, hl + hr, reg_lambda)) \
        - gamma
    return np.maximum(gain, 0.0)


@functools.lru_cache(maxsize=EXACT_MAX + 1)
def _weights(m: int) -> np.ndarray:
    """Shapley weight of a coalition of each size s without the party: s! (m - s - 1)! / m!."""
    weight = np.array([math.factorial(s) * math.factorial(m - s - 1) for s in range(m)], dtype=np.float64)
    return weight / math.factorial(m)


@njit(cache=True)
def _exact(party_sums, reg_lambda, gamma, weight):
    n, m = party_sums.shape[0], party_sums.shape[1]
    n_masks = 1 << m
    phi = np.zeros((n, m))
    v = np.empty(n_masks)
    size = np.zeros(n_masks, dtype=np.int64)
    for b in range(n_masks):
        for i in range(m):
            size[b] += (b >> i) & 1
    for k in range(n):
        for b in range(n_masks):
            gl = hl = gr = hr = 0.0
            for i in range(m):  # the coalition's sums, party by party
                if (b >> i) & 1:
                    gl += party_sums[k, i, 0]
                    hl += party_sums[k, i, 1]
                    gr += party_sums[k, i, 2]
                    hr += party_sums[k, i, 3]
            gain = 0.5 * (_score1(gl, hl, reg_lambda) + _score1(gr, hr, reg_lambda)
                          - _score1(gl + gr, hl + hr, reg_lambda)) - gamma
            v[b] = 0.0 if gain < 0.0 else gain
        for i in range(m):
            acc = 0.0
            for b in range(n_masks):  # the coalitions without party i, in order
                if not (b >> i) & 1:
                    acc += weight[size[b]] * (v[b | (1 << i)] - v[b])
            phi[k, i] = acc
    return phi


@njit(cache=True, inline="always")
def _score1(g, h, reg_lambda):
    den = h + reg_lambda
    return g * g / den if den > 0 else 0.0


def exact_shapley_values(party_sums: np.ndarray, reg_lambda: float, gamma: float = 0.0) -> np.ndarray:
    """Exact split Shapley values of many splits at once: ``party_sums`` (splits, parties, 4) -> (splits,
    parties).  Each split is computed on its own, in one fixed order, so its values are the same bit for bit
    whether computed alone (:func:`shapley_values`, a ledger check) or with others (the horizontal aggregator's
    tree at once)."""
    party_sums = np.ascontiguousarray(party_sums, dtype=np.float64)
    if party_sums.ndim != 3 or party_sums.shape[2] != 4:
        raise ValueError(f"party sums are (splits, parties, 4), got shape {party_sums.shape}")
    m = party_sums.shape[1]
    if m > EXACT_MAX:
        raise ValueError(f"exact Shapley values are computed for at most {EXACT_MAX} parties, got {m}")
    if m == 0:
        return np.zeros((party_sums.shape[0], 0))
    return _exact(party_sums, float(reg_lambda), float(gamma), _weights(m))


def shapley_values(party_sums: np.ndarray, reg_lambda: float, gamma: float = 0.0, n_permutations: int = 2000,
                   seed: int = 0) -> tuple[np.ndarray, np.ndarray, str]:
    """Split Shapley value of each party from its (G_L, H_L, G_R, H_R): (values, standard errors, method)."""
    party_sums = np.asarray(party_sums, dtype=np.float64).reshape(-1, 4)
    m = len(party_sums)
    if m <= EXACT_MAX:
        return exact_shapley_values(party_sums[None], reg_lambda, gamma)[0], np.zeros(m), "exact"
    rng = np.random.default_rng(seed)
    marg = np.empty((n_permutations, m))
    for p in range(n_permutations):
        order = rng.permutation(m)
        cum = np.cumsum(party_sums[order], axis=0)
        vals = utility(cum, reg_lambda, gamma)
        marg[p, order] = np.diff(np.concatenate([[0.0], vals]))
    return marg.mean(axis=0), marg.std(axis=0, ddof=1) / math.sqrt(n_permutations), "sampled"


def vote_contributions(gain: float, voters: np.ndarray) -> np.ndarray:
    """The split's gain shared equally by the parties that voted for the chosen feature (boolean per party)."""
    voters = np.asarray(voters, dtype=bool)
    out = np.zeros(len(voters))
    if voters.any() and gain > 0:
        out[voters] = gain / voters.sum()
    return out
