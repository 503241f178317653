"""The engine grows the same model on any number of threads: every tree field and every prediction equal, bit
for bit, from one thread up to every thread numba was started with (``NUMBA_NUM_THREADS``; on a machine of
many cores, or with that variable set above the core count, this checks more counts than CI's two)."""

from __future__ import annotations

import numba
import numpy as np
import pytest

from fedgrove.engine import splitter, threads
from fedgrove.engine.forest import ForestParams, train_forest
from fedgrove.engine.gbdt import GBDTParams, train_gbdt
from fedgrove.engine.grower import TreeGrower
from tests.conftest import make_classification


def thread_counts() -> list[int]:
    top = numba.config.NUMBA_NUM_THREADS
    return sorted({n for n in (1, 2, 3, top // 2, top) if 1 <= n <= top})


def _assert_same_model(a, b, label):
    assert len(a.trees) == len(b.trees), label
    for t, (ta, tb) in enumerate(zip(a.trees, b.trees)):
        for name in ta.nodes.dtype.names:  # field by field: leaves' NaN thresholds compare equal
            np.testing.assert_array_equal(ta.nodes[name], tb.nodes[name], err_msg=f"{label}: tree {t} {name}")
        np.testing.assert_array_equal(ta.values, tb.values, err_msg=f"{label}: tree {t} values")


#: where the threads count as sleeping, the one-thread line is lowered to this (codes) so that these small fits
#: stay on their threads while their small layers, histogram builds and split searches go to one: a fit's
#: kernels then run on both counts (at the default line these whole fits would run on one thread)
MIXED_LINE = 100_000


def _fits(train, X, y, sleeping):
    """The models and predictions of one fit per thread count; the threads counted as sleeping between launches
    or not.  Where they do not sleep, every layer is checked to have run on the count asked for; where they do,
    each fit on several threads is checked to have sent some of its kernels to one thread and kept others on all."""
    saved = threads._sleep, threads.SERIAL_WORK, TreeGrower.grow_layer, splitter.one_thread_for
    seen, decided = [], []

    def counting(self):
        seen.append(numba.get_num_threads())
        return saved[2](self)

    def deciding(work):
        decided.append(saved[3](work))
        return decided[-1]

    threads._sleep = sleeping
    if sleeping:
        threads.SERIAL_WORK = MIXED_LINE
    TreeGrower.grow_layer, splitter.one_thread_for = counting, deciding
    try:
        fits = []
        for n in thread_counts():
            seen.clear()
            decided.clear()
            fits.append((n, *train(n, X, y)))
            assert seen and (sleeping or set(seen) == {n}), (n, sorted(set(seen)))
            if sleeping and n > 1:
                assert set(decided) == {True, False}, (n, sorted(set(decided)))
        return fits
    finally:
        threads._sleep, threads.SERIAL_WORK, TreeGrower.grow_layer, splitter.one_thread_for = saved


def _check(fits, label):
    n0, model0, pred0 = fits[0]
    for n, model, pred in fits[1:]:
        _assert_same_model(model0, model, f"{label}: {n0} against {n} threads")
        np.testing.assert_array_equal(pred0, pred, err_msg=f"{label}: predictions, {n0} against {n} threads")


def _gbdt(**kw):
    def train(n, X, y):
        model = train_gbdt(GBDTParams(n_threads=n, **kw), X, y)
        return model, model.predict_raw(X)

    return train


def _forest(**kw):
    def train(n, X, y):
        model = train_forest(ForestParams(n_threads=n, **kw), X, y)
        return model, model.predict_proba(X)

    return train


@pytest.mark.parametrize("sleeping", [False, True])
def test_gbdt_on_a_sparse_one_hot_table_is_the_same_on_every_thread_count(a9a, sleeping):
    X, y = a9a.train.X[:12000], a9a.train.y[:12000]
    _check(_fits(_gbdt(n_estimators=6, max_depth=6), X, y, sleeping), "a9a")


@pytest.mark.parametrize("sleeping", [False, True])
def test_gbdt_on_continuous_columns_with_missing_values_and_sampling_is_the_same_on_every_thread_count(sleeping):
    X, y = make_classification(30000, d=12, seed=3, missing=0.05)
    train = _gbdt(n_estimators=5, max_depth=7, subsample=0.8, colsample_bytree=0.7, seed=5)
    _check(_fits(train, X, y, sleeping), "continuous, missing values, subsampled")


def test_multiclass_and_regression_are_the_same_on_every_thread_count(waveform):
    X, y = waveform.train.X, waveform.train.y
    _check(_fits(_gbdt(objective="multiclass", n_estimators=3, max_depth=5), X, y, False), "waveform")
    r = np.random.default_rng(7)
    Xr = r.normal(size=(20000, 8))
    yr = Xr[:, 0] * 3 + np.sin(Xr[:, 1]) + 0.1 * r.normal(size=len(Xr))
    _check(_fits(_gbdt(objective="regression", n_estimators=4, max_depth=6), Xr, yr, False), "regression")


def test_a_random_forest_is_the_same_on_every_thread_count(spambase):
    X, y = spambase.train.X, spambase.train.y
    _check(_fits(_forest(n_estimators=4, max_depth=8, seed=2), X, y, False), "spambase forest")
