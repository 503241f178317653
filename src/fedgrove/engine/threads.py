"""Thread count control for the numba kernels."""

from __future__ import annotations

import contextlib

import numba


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
