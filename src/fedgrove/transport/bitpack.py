"""Non-negative integers in as few bits as the largest needs: the codec's packed arrays (``FGM4``).

Value ``k`` of ``bits`` bits takes bits ``k * bits`` to ``(k + 1) * bits - 1`` of the buffer read as one
little-endian number (its lowest bit first: bit 0 of byte 0), the last byte's unused high bits zero; at most
:data:`MAX_BITS` bits a value, so that a 64-bit accumulator always holds what is pending.  numba kernels
(a HybridTree routing request of 1.5 million values of 5 and 16 bits encodes in about 3 ms and decodes in
about 2 ms on the 2-CPU development machine: docs/benchmarks.md), in :mod:`fedgrove.transport._bitpack`,
imported at the first packed array: the codec, which imports this module, does not load numba for messages
that have none.
"""

from __future__ import annotations

import numpy as np

MAX_BITS = 56  # pending bits (fewer than 8) and a value's bits fit in the kernels' 64-bit accumulator


def packed_size(n: int, bits: int) -> int:
    """Bytes of ``n`` values of ``bits`` bits each."""
    return (n * bits + 7) // 8


def pack(values: np.ndarray, offset: int, bits: int) -> bytes:
    """The distances of integer (or boolean) ``values`` from ``offset``, each below ``2 ** bits`` (``bits`` from 1
    to :data:`MAX_BITS`), packed; in unsigned 64-bit arithmetic, which gives every such distance exactly."""
    if not 1 <= bits <= MAX_BITS:
        raise ValueError(f"bits must be between 1 and {MAX_BITS}, got {bits}")
    from fedgrove.transport._bitpack import _pack

    values = np.asarray(values).reshape(-1).astype(np.uint64)  # (one kernel signature whatever the type)
    out = np.empty(packed_size(len(values), bits), dtype=np.uint8)
    _pack(values, np.uint64(offset % (1 << 64)), np.uint64(bits), out)
    return out.tobytes()


def unpack(data, n: int, offset: int, bits: int, dtype) -> np.ndarray | None:
    """``n`` values of ``dtype`` (``offset`` plus each distance of ``bits`` bits in ``data``, which must be
    exactly :func:`packed_size` bytes); None where the buffer's size is not that, or its unused last bits are
    not zero.  The caller checks that every such sum lies in ``dtype``'s range."""
    buf = np.frombuffer(data, dtype=np.uint8)
    if not 1 <= bits <= MAX_BITS or len(buf) != packed_size(n, bits):
        return None
    from fedgrove.transport._bitpack import _unpack

    buf.flags.writeable = False  # (one kernel signature, whether ``data`` was bytes or a bytearray)
    out = np.empty(n, dtype=np.uint64)
    if _unpack(buf, np.uint64(offset % (1 << 64)), np.uint64(bits), out) != 0:
        return None
    return out.astype(dtype)  # (modulo 2 ** 64, each the value itself: cut to the type, or 0 / 1 to booleans)


def warm_up() -> None:
    """Compile (or load from numba's cache) the kernels, as a party does before its first message."""
    values = np.arange(3, dtype=np.int64)
    unpack(pack(values, 0, 2), 3, 0, 2, np.int64)
