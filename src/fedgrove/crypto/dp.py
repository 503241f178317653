"""Differential-privacy primitives: Laplace and exponential mechanisms, and an accountant.

By default the mechanisms are OpenDP's (``make_laplace``, ``make_noisy_max``),
which sample noise exactly and are safe against floating-point attacks; their
randomness comes from the operating system and cannot be seeded.  Passing a
``seed`` switches to a numpy sampler so experiments are reproducible: that path
is **not** safe against floating-point attacks and is meant for research runs
only (the function says so in a warning once per process).

The :class:`PrivacyAccountant` adds up what is spent under sequential
composition, takes the maximum within a :meth:`PrivacyAccountant.parallel`
block (disjoint data), and refuses with :class:`~fedgrove.exceptions.PrivacyBudgetError`
any spend that would exceed the configured epsilon.
"""

from __future__ import annotations

import contextlib
import math
import warnings

import numpy as np

from fedgrove.exceptions import InvalidParameterError, PrivacyBudgetError

_SLACK = 1e-9


class PrivacyAccountant:
    def __init__(self, epsilon: float):
        if not (isinstance(epsilon, (int, float)) and epsilon > 0 and math.isfinite(epsilon)):
            raise InvalidParameterError(f"privacy budget epsilon must be a positive finite number, got {epsilon!r}")
        self.budget = float(epsilon)
        self.spent = 0.0
        self.log: list[tuple[str, float]] = []
        self._parallel: list[float] | None = None

    @property
    def remaining(self) -> float:
        return self.budget - self.spent

    def spend(self, epsilon: float, what: str = "") -> None:
        if not epsilon > 0:
            raise InvalidParameterError(f"epsilon to spend must be positive, got {epsilon!r}")
        if self._parallel is not None:  # parallel composition: the block costs its maximum
            self._parallel.append(epsilon)
            projected = self.spent + max(self._parallel)
        else:
            projected = self.spent + epsilon
        if projected > self.budget * (1 + _SLACK):
            if self._parallel is not None:
                self._parallel.pop()
            raise PrivacyBudgetError(f"spending epsilon {epsilon:g} on {what or 'a query'} would bring the total to "
                                     f"{projected:g}, over the budget of {self.budget:g}; stopping")
        if self._parallel is None:
            self.spent = projected
        self.log.append((what, epsilon))

    @contextlib.contextmanager
    def parallel(self):
        """Queries on disjoint data inside this block cost their maximum, not their sum."""
        if self._parallel is not None:
            raise InvalidParameterError("parallel blocks do not nest")
        self._parallel = []
        try:
            yield self
        finally:
            block, self._parallel = self._parallel, None
            if block:
                self.spent += max(block)

    def report(self) -> str:
        return f"epsilon spent {self.spent:.6g} of {self.budget:.6g} ({len(self.log)} mechanism calls)"


_warned = False


def _seeded_warning():
    global _warned
    if not _warned:
        warnings.warn("seeded DP noise is for reproducible experiments only: it is not safe against "
                      "floating-point attacks; omit the seed for OpenDP's exact sampler", RuntimeWarning,
                      stacklevel=3)
        _warned = True


def laplace(values, sensitivity: float, epsilon: float, accountant: PrivacyAccountant | None = None,
            what: str = "", rng: np.random.Generator | None = None) -> np.ndarray:
    """``values`` plus Laplace noise of scale sensitivity/epsilon (L1 sensitivity of the whole vector)."""
    if not (sensitivity > 0 and epsilon > 0):
        raise InvalidParameterError("sensitivity and epsilon must be positive")
    if accountant is not None:
        accountant.spend(epsilon, what or "laplace")
    x = np.atleast_1d(np.asarray(values, dtype=np.float64))
    scale = sensitivity / epsilon
    if rng is not None:
        _seeded_warning()
        return x + rng.laplace(0.0, scale, size=x.shape)
    import opendp.prelude as dp

    dp.enable_features("contrib")
    meas = dp.m.make_laplace(dp.vector_domain(dp.atom_domain(T=float, nan=False)), dp.l1_distance(T=float),
                             scale=scale)
    return np.asarray(meas(x.ravel().tolist()), dtype=np.float64).reshape(x.shape)


def exponential(scores, sensitivity: float, epsilon: float, accountant: PrivacyAccountant | None = None,
                what: str = "", rng: np.random.Generator | None = None) -> int:
    """Index chosen by the exponential mechanism (report-noisy-max with Gumbel noise) on ``scores``."""
    if not (sensitivity > 0 and epsilon > 0):
        raise InvalidParameterError("sensitivity and epsilon must be positive")
    scores = np.asarray(scores, dtype=np.float64)
    if accountant is not None:
        accountant.spend(epsilon, what or "exponential")
    scale = 2.0 * sensitivity / epsilon
    if rng is not None:
        _seeded_warning()
        return int(np.argmax(scores + rng.gumbel(0.0, scale, size=scores.shape)))
    import opendp.prelude as dp

    dp.enable_features("contrib")
    meas = dp.m.make_noisy_max(dp.vector_domain(dp.atom_domain(T=float, nan=False)),
                               dp.linf_distance(T=float, monotonic=False), dp.max_divergence(), scale=scale)
    if meas.map(sensitivity) > epsilon * (1 + _SLACK):
        raise PrivacyBudgetError("OpenDP's privacy map exceeds the requested epsilon")  # pragma: no cover
    return int(meas(scores.tolist()))
