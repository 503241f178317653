"""The note that numba is compiling fedgrove's kernels: once, for fedgrove's functions only, and only when
numba compiles (a kernel loaded from its cache on disk says nothing)."""

import numba
from numba.core import event

from fedgrove.engine.compiling import COMPILE_NOTE, CompileNote


def _function(module: str):
    def f(x):
        return x + 1
    f.__module__ = module
    return f


def test_the_note_comes_once_at_the_first_compilation_of_a_fedgrove_function():
    # three compilations of fedgrove functions (two signatures of one, and another) and one of another package's:
    # one note, said when the first of fedgrove's started
    said = []
    with event.install_listener("numba:compile", CompileNote(said.append)):
        numba.njit(_function("somebody.else"))(1)
        assert said == []
        ours = numba.njit(_function("fedgrove.engine.example"))
        ours(1)
        assert said == [COMPILE_NOTE]
        ours(1.5)
        numba.njit(_function("fedgrove.protocols.example"))(2)
    assert said == [COMPILE_NOTE]


def test_a_function_already_compiled_says_nothing():
    # a dispatcher that holds the signature already does not compile again: no event, no note
    ours = numba.njit(_function("fedgrove.engine.example"))
    ours(1)
    said = []
    with event.install_listener("numba:compile", CompileNote(said.append)):
        ours(2)
    assert said == []
