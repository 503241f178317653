"""Thread count control for the numba kernels."""

from __future__ import annotations

import contextlib
import statistics
import time

import numba
import numpy as np
from numba import njit, prange

from fedgrove.engine._intrinsics import PRANGE_ONLY
from fedgrove.log import logger

#: a launch of the parallel kernels on ``n`` threads that costs more than
#: ``SLEEPY_LAUNCH + n * SLEEPY_LAUNCH_PER_THREAD`` beyond one on one thread (seconds) means the threads sleep
#: between kernels and each launch wakes them (OpenMP with ``OMP_WAIT_POLICY=PASSIVE``: 34-58 us more on 2 threads
#: of a 2-CPU machine when idle, about 8 us while other work kept its other core busy; on a 16-core machine 11, 15,
#: 19 and 42 us on 2, 4, 8 and 16 threads); where they spin, as they do by default, it costs 1-2 us more on the
#: 2-CPU machine, idle or busy, and 3.3, 4.4, 5.1 and 7.6 us on the 16-core one: more with each thread, so the line
#: between the two grows with the thread count
SLEEPY_LAUNCH = 4e-6
SLEEPY_LAUNCH_PER_THREAD = 1e-6
#: with sleeping threads on two threads, kernels over fewer than this many codes (rows x (codes read a row +
#: ROW_OVERHEAD); about a nanosecond each on one thread, a9a's histograms of scattered rows) run on one thread: each
#: parallel loop then wakes the threads and waits for them, which on a 2-CPU machine cost more than a second thread
#: saved up to about a million codes (a9a's fit, 32,561 rows of 9.9 listed codes, 0.93 -> 0.30 s; the layers of
#: 100,000 dense rows of 28 features are faster on two).  On ``n`` threads the line is this times
#: ``(1/2) / (1 - 1/n)`` (:func:`serial_work`): more threads save more of the work a launch wakes them for (on a
#: 16-core machine, sleeping threads, 16 threads: cod-rna's fit, 59,535 rows of 8 codes, 0.41 s with the fit on
#: one thread against 0.36 s on all)
SERIAL_WORK = 1_000_000
ROW_OVERHEAD = 4
#: the work of scanning one bin of one node's histogram for its best split, in codes (about 10 ns a bin on one
#: thread here: 64 nodes of 7,196 bins in 4.4 ms)
BIN_SCAN = 10

_launch_cost: dict[int, float] = {}


@contextlib.contextmanager
def thread_limit(n_threads: int | None):
    """Run the body with at most ``n_threads`` numba threads (``None``: all)."""
    if n_threads is None:
        yield
        return
    previous = numba.get_num_threads()
    numba.set_num_threads(min(int(n_threads), numba.config.NUMBA_NUM_THREADS))
    try:
        yield
    finally:
        numba.set_num_threads(previous)


@njit(parallel=PRANGE_ONLY, cache=True, nogil=True)
def _touch(out):
    for i in prange(out.shape[0]):
        out[i] += 1.0


def launch_cost(n_threads: int) -> float:
    """Seconds a launch of a parallel kernel on ``n_threads`` threads costs beyond one on one thread: the median
    over 21 alternating pairs of launches of a kernel with next to no work, measured once per thread count in a
    process (0.2 ms where the threads spin, about 2 ms where they sleep)."""
    n = int(n_threads)
    if n <= 1:
        return 0.0
    cost = _launch_cost.get(n)
    if cost is None:
        out = np.zeros(4 * n)
        extra = []
        with thread_limit(n):
            _touch(out)  # (loads the kernel)
            for _ in range(21):
                numba.set_num_threads(1)
                t0 = time.perf_counter()
                _touch(out)
                t1 = time.perf_counter()
                numba.set_num_threads(n)
                _touch(out)
                extra.append(time.perf_counter() - t1 - (t1 - t0))
        cost = _launch_cost[n] = max(0.0, statistics.median(extra))
    return cost


def sleepy_launch(n_threads: int) -> float:
    """The launch cost on ``n_threads`` threads (:func:`launch_cost`) above which the threads are taken to sleep
    between launches (:data:`SLEEPY_LAUNCH`)."""
    return SLEEPY_LAUNCH + n_threads * SLEEPY_LAUNCH_PER_THREAD


def threads_sleep() -> bool:
    """Whether numba's threads sleep between launches (:func:`sleepy_launch`): a property of its threading layer
    and its settings, measured once in a process with all its threads."""
    global _sleep
    if _sleep is None:
        n = numba.config.NUMBA_NUM_THREADS
        cost = launch_cost(n)
        _sleep = cost > sleepy_launch(n)
        if _sleep:
            logger.debug("numba's %d kernel threads sleep between launches (a launch costs %.0f us more than on one "
                         "thread; OMP_WAIT_POLICY=PASSIVE?): fits, layers, histograms and split searches of little "
                         "work run on one thread", n, cost * 1e6)
    return _sleep


_sleep: bool | None = None


def sleepy_threads() -> bool:
    """Whether this thread's kernels run on several threads that sleep between launches (answered in 0.15 us where
    they do not)."""
    return threads_sleep() and numba.get_num_threads() > 1


def row_work(rows: int, codes_per_row: float) -> float:
    """The work of kernels over ``rows`` rows reading ``codes_per_row`` codes each, in codes (a row's own costs
    counted as :data:`ROW_OVERHEAD` codes)."""
    return rows * (codes_per_row + ROW_OVERHEAD)


def one_thread_for(work) -> bool:
    """Whether kernels doing ``work`` (codes read, as :func:`row_work` counts them, or bins scanned times
    :data:`BIN_SCAN`; a number, or a function giving it, called only where the threads sleep) are better run on one
    thread: the threads sleep between launches and the work is under :func:`serial_work` for this thread's count.
    The kernels give the same results on any number of threads; only the time differs."""
    return sleepy_threads() and (work() if callable(work) else work) < serial_work(numba.get_num_threads())


def serial_work(n_threads: int) -> float:
    """The work (in codes) under which kernels on ``n_threads`` sleeping threads run better on one:
    :data:`SERIAL_WORK` on two threads, less on more (a launch wakes them for the ``1 - 1/n`` of the work they
    save)."""
    return SERIAL_WORK * 0.5 / (1.0 - 1.0 / max(2, n_threads))


def serial_if(one: bool):
    """A context: one thread when ``one``, else as it was."""
    return thread_limit(1) if one else _AS_IT_WAS


_AS_IT_WAS = contextlib.nullcontext()


@contextlib.contextmanager
def fit_threads(n_threads: int | None, work):
    """:func:`thread_limit` for a fit whose table is ``work`` (:func:`row_work`; as :func:`one_thread_for` takes
    it): ``n_threads`` threads, or one where one does better for the whole table (then for each layer too)."""
    with thread_limit(n_threads):
        with serial_if(one_thread_for(work)):
            yield
