"""Low-level helpers for numba kernels: software prefetch, and unsigned index constants.

Deep tree nodes own sorted but sparse rows; reading them one after the other
stalls on a cache miss per row.  Asking for the row a few iterations ahead
(``llvm.prefetch``) lets the misses overlap: on the benchmark machine, a
gather of sparse rows went from about 40 to about 11 ns per row.

The kernels' hot loops index with unsigned integers: numba wraps a negative
signed index around (a compare and a select at every access), which LLVM
drops only where it can prove the index non-negative, and it cannot for loops
whose bounds are read from arrays (a9a's 32,561 codes read in a loop: 31 us
with signed bounds, 12 us unsigned; by hand).  Their constants are the uint64
``U0``..``U3`` below: numba types uint64 +- int64 as float64.

The parallel kernels take :data:`PRANGE_ONLY` as numba's ``parallel`` option:
only their ``prange`` loops run on several threads.
"""

from __future__ import annotations

import numpy as np
from llvmlite import binding as llvm_binding
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.cpu import ParallelOptions
from numba.extending import intrinsic

import fedgrove.engine.compiling  # noqa: F401  (numba's cache folder, and a note while it compiles)

U0, U1, U2, U3 = np.uint64(0), np.uint64(1), np.uint64(2), np.uint64(3)

#: numba's ``parallel`` option for fedgrove's kernels: their ``prange`` loops run on all threads, and nothing else.
#: With ``parallel=True`` numba also turns each ``np.zeros`` and array ``min``/``max`` outside the loops into a
#: parallel loop of its own, and each such loop is one more launch of the threads: where the threads sleep between
#: launches (``OMP_WAIT_POLICY=PASSIVE``) a partition of 1,000 rows cost 350 us on two threads against 7 us on one
#: (seven launches); a sparse histogram build launched them up to nine times.  An instance, not a dict: numba pops
#: a dict's keys as it reads them, so a second compilation of the same kernel would find it empty and take every
#: conversion.
PRANGE_ONLY = ParallelOptions(dict(comprehension=False, reduction=False, inplace_binop=False, setitem=False,
                                   numpy=False, stencil=False, fusion=True, prange=True))

# LLVM >= 17 has opaque pointers and names the overload "p0"; older ones "p0i8"
_PREFETCH = "llvm.prefetch.p0" if llvm_binding.llvm_version_info[0] >= 17 else "llvm.prefetch.p0i8"


def _prefetch_codegen(n_indices):
    def codegen(context, builder, signature, args):
        aryty = signature.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        ptr = cgutils.get_item_pointer2(context, builder, ary.data, cgutils.unpack_tuple(builder, ary.shape),
                                        cgutils.unpack_tuple(builder, ary.strides), aryty.layout,
                                        list(args[1:1 + n_indices]), wraparound=False)
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, _PREFETCH)
        # read access, high temporal locality, data cache
        builder.call(fn, [builder.bitcast(ptr, i8p), ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()
    return codegen


@intrinsic
def prefetch(typingctx, arr, i, j):
    """Hint the CPU to load ``arr[i, j]`` (a 2-D array) into cache; no effect on results."""
    sig = types.void(arr, i, j)
    return sig, _prefetch_codegen(2)


@intrinsic
def prefetch1(typingctx, arr, i):
    """Hint the CPU to load ``arr[i]`` (a 1-D array) into cache; no effect on results."""
    return types.void(arr, i), _prefetch_codegen(1)
