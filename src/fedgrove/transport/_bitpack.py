"""The kernels of :mod:`fedgrove.transport.bitpack` (which says how values are laid out)."""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def _pack(values, offset, bits, out):
    """Each of ``values`` less ``offset`` (unsigned 64-bit, a signed value's two's complement, so that the
    difference is the distance) in ``bits`` bits into ``out``."""
    acc = np.uint64(0)  # pending bits, lowest first: fewer than 8 before a value is added
    have = np.uint64(0)
    eight = np.uint64(8)
    low = np.uint64(255)
    at = 0
    for k in range(values.shape[0]):
        acc |= (values[k] - offset) << have
        have += bits
        while have >= eight:
            out[at] = acc & low
            at += 1
            acc >>= eight
            have -= eight
    if have > 0:
        out[at] = acc


@njit(cache=True, nogil=True)
def _unpack(buf, offset, bits, out):
    """Fill ``out``; returns the bits left over after the last value (zero in a well-formed buffer)."""
    mask = (np.uint64(1) << bits) - np.uint64(1)
    eight = np.uint64(8)
    acc = np.uint64(0)
    have = np.uint64(0)
    at = 0
    for k in range(out.shape[0]):
        while have < bits:
            acc |= np.uint64(buf[at]) << have
            at += 1
            have += eight
        out[k] = (acc & mask) + offset  # (modulo 2 ** 64)
        acc >>= bits
        have -= bits
    return acc
