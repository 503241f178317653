"""PSD: each party's data-independent summary of its data distribution (FGBDT-Chain's preprocessing).

A PSD is a complete binary tree of depth ``depth`` whose every split picks a
random feature not used above it (the label counts as a feature) and cuts at
the midpoint of that feature's published global [min, max]; its leaves hold
the party's instance counts plus Laplace noise (budget ``epsilon``;
sensitivity 1, the leaves being disjoint).  Two choices make the counts of
different parties comparable: every party draws the *same* structure (from
the federation's seed), so a leaf is the same region of space for all and a
ratio of counts is a ratio of densities; and the root splits on the label,
whose skew between parties matters most for their gradients (a random draw
would rarely pick it among many features).  Other parties query it with their
own instances:

* refit weight of party m's instance x (for voting only):
  ``w(x) = (sum_j c_j(x) / c_m(x)) * n_m / N``;
* density ratio of sender i seen from verifier k, for k's instance x:
  ``c_i(x) / c_k(x)`` (to estimate i's histogram from k's own data);

where ``c_j(x)`` is the noisy count of the leaf of party j's PSD that x falls
in (at least 1).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedgrove.engine.binning import midpoints
from fedgrove.exceptions import InvalidParameterError, ProtocolError

MIN_COUNT = 1.0


@dataclass
class PSD:
    depth: int
    features: np.ndarray  # int (2^depth - 1,) heap order; index n_features is the label
    cuts: np.ndarray      # float, the midpoint cut of each internal node
    counts: np.ndarray    # float (2^depth,) noisy leaf counts

    @classmethod
    def build(cls, X, y, lo, hi, depth: int, epsilon: float | None, structure_rng: np.random.Generator,
              noise_rng: np.random.Generator) -> "PSD":
        """The party's PSD: the structure from ``structure_rng`` (the federation's, data-independent; the root
        on the label), leaf counts of (X, y) with Laplace noise from ``noise_rng``."""
        Z = np.column_stack([np.asarray(X, dtype=np.float64), np.asarray(y, dtype=np.float64)])
        d = Z.shape[1]
        if depth < 1:
            raise InvalidParameterError(f"PSD depth must be at least 1, got {depth}")
        depth = min(depth, d)
        n_internal = (1 << depth) - 1
        features = np.empty(n_internal, dtype=np.int32)
        used: list[set] = [set() for _ in range(n_internal)]
        for k in range(n_internal):
            choices = [f for f in range(d) if f not in used[k]]
            features[k] = d - 1 if k == 0 else int(structure_rng.choice(choices))
            for child in (2 * k + 1, 2 * k + 2):
                if child < n_internal:
                    used[child] = used[k] | {int(features[k])}
        lo, hi = np.asarray(lo, dtype=np.float64), np.asarray(hi, dtype=np.float64)
        cuts = midpoints(lo[features], hi[features])  # (lo + hi) / 2 overflowed above 9e307
        psd = cls(depth, features, cuts, np.zeros(1 << depth))
        counts = np.bincount(psd.leaves(Z), minlength=1 << depth).astype(np.float64)
        if epsilon is not None:
            counts = counts + noise_rng.laplace(0.0, 1.0 / epsilon, size=counts.shape)
        psd.counts = counts
        return psd

    def leaves(self, Z: np.ndarray) -> np.ndarray:
        """Leaf (0 .. 2^depth - 1) of each row of ``Z`` (features then label); NaN goes left."""
        Z = np.asarray(Z, dtype=np.float64)
        node = np.zeros(len(Z), dtype=np.int64)
        for _ in range(self.depth):
            v = Z[np.arange(len(Z)), self.features[node]]
            right = v > self.cuts[node]
            node = 2 * node + 1 + right
        return node - ((1 << self.depth) - 1)

    def count_of(self, Z: np.ndarray) -> np.ndarray:
        """The noisy count of each row's leaf, at least :data:`MIN_COUNT`."""
        return np.maximum(self.counts[self.leaves(Z)], MIN_COUNT)

    def check(self, n_columns: int) -> None:
        """Refuse a PSD from another party that does not describe a tree over ``n_columns`` columns."""
        n_internal = (1 << self.depth) - 1
        if not (1 <= self.depth <= 20) or self.features.shape != (n_internal,) or self.cuts.shape != (n_internal,) \
                or self.counts.shape != (1 << self.depth,) or np.any(self.features < 0) \
                or np.any(self.features >= n_columns) or not np.all(np.isfinite(self.counts)):
            raise ProtocolError("a PSD does not describe a tree over the task's features")


def refit_weights(own: PSD, others: list[PSD], Z: np.ndarray, n_own: int, n_total: int) -> np.ndarray:
    """``w(x) = (sum over parties of c_j(x)) / c_own(x) * n_own / N`` for the rows of ``Z`` (this party's)."""
    c_own = own.count_of(Z)
    total = c_own + sum(p.count_of(Z) for p in others)
    return total / c_own * (n_own / float(n_total))


def density_ratio(sender: PSD, verifier: PSD, Z: np.ndarray) -> np.ndarray:
    """``c_sender(x) / c_verifier(x)`` for the verifier's rows ``Z``."""
    return sender.count_of(Z) / verifier.count_of(Z)
