"""Objectives: gradients, hessians, initial scores and output transforms.

Raw scores have shape ``(n_samples, n_outputs)``: 1 column for ``binary`` and
``regression``, ``n_classes`` for ``multiclass`` (one tree per class per round).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from fedgrove.engine._intrinsics import PRANGE_ONLY, U1
from fedgrove.exceptions import DataError, InvalidParameterError
from fedgrove.log import logger


def _gradient_arrays(shape) -> tuple[np.ndarray, np.ndarray]:
    """Empty gradient and hessian arrays for a kernel to fill.  numpy's allocator, unlike one inside a numba
    kernel, asks the system for huge pages for large arrays, so filling them takes fewer page faults: kddcup99's
    395,216 x 23 class-major gradients 60 -> 43 ms on 2 threads (by hand)."""
    return np.empty(shape), np.empty(shape)


@njit(parallel=PRANGE_ONLY, cache=True, nogil=True)
def _logistic_gradients(y, raw, g, h):
    n = y.shape[0]
    for i in prange(n):
        r = raw[i, 0]
        # numerically stable sigmoid: 1/(1+exp(-r)) for r >= 0, exp(r)/(1+exp(r)) below, the same numbers as two
        # branches give but with one exponential and a select (a branch on the score's sign mispredicts often)
        e = math.exp(-abs(r))
        p = (1.0 if r >= 0.0 else e) / (1.0 + e)
        g[i, 0] = p - y[i]
        h[i, 0] = p * (1.0 - p)


@njit(parallel=PRANGE_ONLY, cache=True, nogil=True)
def _softmax_gradients(y, raw, factor, g, h):
    n, k = raw.shape
    for i in prange(n):
        m = raw[i, 0]
        for c in range(1, k):
            m = max(m, raw[i, c])
        total = 0.0
        for c in range(k):
            e = math.exp(raw[i, c] - m)
            g[i, c] = e
            total += e
        label = int(y[i])
        for c in range(k):
            p = g[i, c] / total
            g[i, c] = p - (1.0 if c == label else 0.0)
            h[i, c] = factor * p * (1.0 - p)


@njit(cache=True, nogil=True)
def _softmax_block(y, raw_by_class, factor, g, h, lo, hi):
    """``_softmax_gradients_by_class`` for the rows ``lo:hi``, with unsigned indices (see ``_intrinsics``)."""
    k = np.uint64(raw_by_class.shape[0])
    ulo, uhi = np.uint64(lo), np.uint64(hi)
    m = raw_by_class[0, lo:hi].copy()
    total = np.zeros(hi - lo)
    for c in range(U1, k):
        for i in range(ulo, uhi):
            m[i - ulo] = max(m[i - ulo], raw_by_class[c, i])
    for c in range(k):
        for i in range(ulo, uhi):
            e = math.exp(raw_by_class[c, i] - m[i - ulo])
            g[c, i] = e
            total[i - ulo] += e
    for c in range(k):
        for i in range(ulo, uhi):
            p = g[c, i] / total[i - ulo]
            g[c, i] = p - (1.0 if np.uint64(y[i]) == c else 0.0)
            h[c, i] = factor * p * (1.0 - p)


@njit(parallel=PRANGE_ONLY, cache=True, nogil=True)
def _softmax_gradients_by_class(y, raw_by_class, factor, g, h):
    """``_softmax_gradients`` on class-major scores ``(k, n)``, filling class-major ``(k, n)`` arrays with the
    same values bit for bit (each row's max and sum are taken over the classes in the same order).  Rows are
    taken in blocks so every pass reads and writes contiguous memory."""
    n = raw_by_class.shape[1]
    block = 512
    for b in prange((n + block - 1) // block):
        lo = b * block
        _softmax_block(y, raw_by_class, factor, g, h, lo, min(n, lo + block))


def _check_out(out, shape) -> tuple[np.ndarray, np.ndarray]:
    """``out`` (gradient and hessian arrays to fill), refused unless both are C-contiguous float64 of ``shape``."""
    for a in out:
        if not (isinstance(a, np.ndarray) and a.dtype == np.float64 and a.shape == tuple(shape)
                and a.flags.c_contiguous and a.flags.writeable):
            raise ValueError(f"out must be two writable C-contiguous float64 arrays of shape {tuple(shape)}; got "
                             f"{getattr(a, 'dtype', type(a).__name__)} {getattr(a, 'shape', '')}")
    return out[0], out[1]


class Objective:
    name: str
    default_metric: str

    def __init__(self, n_classes: int = 1):
        self.n_classes = n_classes

    @property
    def n_outputs(self) -> int:
        return 1

    def check_labels(self, y: np.ndarray, warn: bool = True) -> np.ndarray:
        """The labels as float64, refused when they do not suit the objective; ``warn``: also of labels that
        suit it poorly (regression: :func:`warn_if_labels_close`), for the labels trained on."""
        y = np.asarray(y, dtype=np.float64).reshape(-1)
        if not np.all(np.isfinite(y)):
            raise DataError("labels contain NaN or infinite values")
        return y

    def init_score(self, y: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
        """The constant scores that minimise the loss over ``y`` (each row weighted by ``weights``, if given)."""
        raise NotImplementedError

    def gradients(self, y: np.ndarray, raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def gradients_by_class(self, y: np.ndarray, raw_by_class: np.ndarray,
                           out: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``gradients`` for class-major scores ``(n_outputs, n)``, as class-major ``(n_outputs, n)`` arrays (the
        same values): the engine keeps multiclass scores this way so each class's column is contiguous.
        ``out``: two C-contiguous float64 ``(n_outputs, n)`` arrays to write them into and return (the engine
        reuses them round after round)."""
        g, h = self.gradients(y, np.asarray(raw_by_class).T)
        if out is None:
            return g.T, h.T
        _check_out(out, raw_by_class.shape)
        np.copyto(out[0], g.T)
        np.copyto(out[1], h.T)
        return out

    def transform(self, raw: np.ndarray) -> np.ndarray:
        raise NotImplementedError


#: regression labels spread over less than this are warned of: see :func:`warn_if_labels_close`
CLOSE_LABELS = 1e-2


def warn_if_labels_close(y: np.ndarray) -> None:
    """Warn of regression labels spread over less than ``CLOSE_LABELS``: a GBDT's split search counts gains within
    about 1e-10 of each other as ties (so that a federation's sums, taken in another order, choose the same
    split; :mod:`fedgrove.engine.split`), and such labels give gains that small: ``bench/label_scale.py``
    measures the fits it costs (README, the engine)."""
    spread = float(np.max(y) - np.min(y)) if len(y) else 0.0
    if 0 < spread < CLOSE_LABELS:
        k = math.ceil(-math.log10(spread))
        logger.warning("regression labels spread over only %.3g: the split search takes gains closer than about "
                       "1e-10 as ties, and labels this close together give gains that small, so it chooses splits "
                       "less well; multiply the label by 1e%d and divide the predictions by it", spread, k)


def check_gradient_range(y: np.ndarray, total_weight: float, what: str = "rows") -> None:
    """Refuse regression labels whose gradient sums could overflow: a split's gain squares the sum of its rows'
    gradients (at most the rows' total weight x the labels' spread); beyond float64's range every gain was NaN
    and no tree split, without an error."""
    spread = float(np.max(y) - np.min(y)) if len(y) else 0.0
    if spread * max(total_weight, 1) > 1e153:
        raise DataError(f"regression labels spread over {spread:.3g}, which over {total_weight:.10g} {what} would "
                        f"overflow the squared gradient sums ({what} x spread must stay below 1e153): divide the "
                        f"label by a power of ten, and the predictions scale back by it")


class SquaredError(Objective):
    name = "regression"
    default_metric = "rmse"

    def check_labels(self, y, warn: bool = True):
        y = super().check_labels(y)
        if warn:
            warn_if_labels_close(y)
        check_gradient_range(y, len(y))
        return y

    def init_score(self, y, weights=None):
        return np.array([np.average(y, weights=weights)])

    def gradients(self, y, raw):
        return (raw[:, 0] - y)[:, None], np.ones((len(y), 1))

    def transform(self, raw):
        return raw[:, 0]


class Logistic(Objective):
    name = "binary"
    default_metric = "logloss"

    def __init__(self, n_classes: int = 2):
        super().__init__(2)

    def check_labels(self, y, warn: bool = True):
        y = super().check_labels(y)
        values = np.unique(y)
        if not np.all(np.isin(values, [0.0, 1.0])):
            raise DataError(f"binary objective needs labels 0/1, got values {values[:10].tolist()}"
                            + (" ..." if values.size > 10 else ""))
        return y

    def init_score(self, y, weights=None):
        p = np.clip(np.average(y, weights=weights), 1e-15, 1 - 1e-15)
        return np.array([np.log(p / (1 - p))])

    def gradients(self, y, raw):
        g, h = _gradient_arrays((len(y), 1))
        _logistic_gradients(y, np.ascontiguousarray(raw), g, h)
        return g, h

    def gradients_by_class(self, y, raw_by_class, out=None):
        if out is None:
            return super().gradients_by_class(y, raw_by_class)
        g, h = _check_out(out, raw_by_class.shape)
        # a (1, n) array is an (n, 1) one in memory: the kernel fills them in place
        _logistic_gradients(y, np.ascontiguousarray(raw_by_class).reshape(-1, 1), g.reshape(-1, 1),
                            h.reshape(-1, 1))
        return g, h

    def transform(self, raw):
        from scipy.special import expit  # (imported when first used: scipy.special took 85 ms of every start)

        p = expit(raw[:, 0])
        return np.column_stack([1.0 - p, p])


class Softmax(Objective):
    name = "multiclass"
    default_metric = "mlogloss"

    def __init__(self, n_classes: int):
        if n_classes < 2:
            raise InvalidParameterError(f"multiclass needs at least 2 classes, got {n_classes}")
        super().__init__(n_classes)

    @property
    def n_outputs(self):
        return self.n_classes

    def check_labels(self, y, warn: bool = True):
        y = super().check_labels(y)
        if np.any(y != np.round(y)) or y.min() < 0 or y.max() >= self.n_classes:
            raise DataError(f"multiclass labels must be integers in [0, {self.n_classes - 1}]")
        return y

    def init_score(self, y, weights=None):
        counts = np.bincount(y.astype(np.int64), weights=weights, minlength=self.n_classes)
        prior = counts / counts.sum()
        return np.log(np.clip(prior, 1e-15, None))

    def gradients(self, y, raw):
        # hessian K/(K-1) p(1-p): Friedman's diagonal bound, as LightGBM uses
        g, h = _gradient_arrays(raw.shape)
        _softmax_gradients(y, np.ascontiguousarray(raw), self.n_classes / (self.n_classes - 1.0), g, h)
        return g, h

    def gradients_by_class(self, y, raw_by_class, out=None):
        if out is None:
            g, h = _gradient_arrays(raw_by_class.shape)
        else:
            g, h = _check_out(out, raw_by_class.shape)
        _softmax_gradients_by_class(y, np.ascontiguousarray(raw_by_class), self.n_classes / (self.n_classes - 1.0),
                                    g, h)
        return g, h

    def transform(self, raw):
        from scipy.special import softmax

        return softmax(raw, axis=1)


OBJECTIVES = {"binary": Logistic, "multiclass": Softmax, "regression": SquaredError}


def make_objective(name: str, n_classes: int = 1) -> Objective:
    if name not in OBJECTIVES:
        raise InvalidParameterError(f"objective must be one of {sorted(OBJECTIVES)}, got {name!r}")
    return OBJECTIVES[name](n_classes)


def classes_from_labels(y: np.ndarray, warn: bool = True) -> int:
    """The class count K of labels 0..K-1 that name no count: the largest label plus one.

    Warns (``warn``) when that looks like a quantity rather than classes (more
    than 100 classes, or most codes below the largest label unused), since each
    class costs a tree per boosting round or a statistic per forest node.
    """
    y = np.asarray(y, dtype=np.float64).reshape(-1)
    if not len(y) or not np.all(np.isfinite(y)):
        return 0
    k = int(y.max()) + 1
    distinct = len(np.unique(y))
    if warn and (k > 100 or (k > 2 and 2 * distinct < k)):
        logger.warning("%d classes, from the largest label %d (%d distinct values in %d rows): each class costs a "
                       "tree per boosting round or a statistic per forest node; if the label is a quantity, train "
                       "for regression (objective or task)", k, k - 1, distinct, len(y))
    return k


def objective_for(name: str, n_classes: int | None, y: np.ndarray) -> Objective:
    """The objective ``name``; multiclass takes ``n_classes``, or when None the labels' class count."""
    return make_objective(name, n_classes or (classes_from_labels(y) if name == "multiclass" else 1))
