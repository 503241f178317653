"""The note that numba is compiling fedgrove's kernels: once, for fedgrove's functions only, and only when
numba compiles (a kernel loaded from its cache on disk says nothing)."""

import logging
import os
import stat
import subprocess
import sys
import textwrap

import numba
import pytest
from numba.core import event

from fedgrove.engine.compiling import (COMPILE_NOTE, CompileNote, cache_writable, ensure_cache_folder,
                                       private_folder)
from fedgrove.exceptions import FedgroveError


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


# --- where numba can write no cache -------------------------------------------------------------------------------

def _uncacheable():
    # a function whose source file does not exist: numba finds no folder for its cache, as for every kernel of a
    # read-only install run by a user without a writable home (numba then refused to define cached functions)
    space = {}
    exec(compile("def f(x):\n    return x\n", "/nonexistent/fedgrove_probe.py", "exec"), space)
    return space["f"]


@pytest.fixture
def numba_cache_dir(monkeypatch):
    # ensure_cache_folder sets numba's CACHE_DIR and NUMBA_CACHE_DIR: both restored after the test
    from numba.core import config

    monkeypatch.setattr(config, "CACHE_DIR", config.CACHE_DIR)
    monkeypatch.setenv("NUMBA_CACHE_DIR", config.CACHE_DIR)
    return config


def test_a_cache_folder_numba_can_write_is_left_as_it_is(numba_cache_dir, tmp_path):
    assert cache_writable()  # this file's folder (or the user's cache folder) can be written here
    before = numba_cache_dir.CACHE_DIR
    assert ensure_cache_folder(temp=str(tmp_path)) is None
    assert numba_cache_dir.CACHE_DIR == before and list(tmp_path.iterdir()) == []


def test_without_a_cache_folder_one_of_the_users_own_is_made_in_the_temporary_directory(numba_cache_dir,
                                                                                         tmp_path, caplog):
    f = _uncacheable()
    assert not cache_writable(f)
    with caplog.at_level(logging.DEBUG, logger="fedgrove"):
        folder = ensure_cache_folder(f, temp=str(tmp_path))
        again = ensure_cache_folder(f, temp=str(tmp_path))  # the next run finds it and keeps it
    assert folder == again == str(tmp_path / f"fedgrove-numba-cache-{os.getuid()}")
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    assert numba_cache_dir.CACHE_DIR == os.environ["NUMBA_CACHE_DIR"] == folder
    notes = [(r.levelno, r.getMessage()) for r in caplog.records if "cache" in r.getMessage()]
    assert [level for level, _ in notes] == [logging.INFO, logging.DEBUG], notes  # said once, where it was made
    assert f"kept in {folder} (NUMBA_CACHE_DIR chooses another folder)" in notes[0][1]


def test_a_folder_of_that_name_that_others_may_write_is_not_used(numba_cache_dir, tmp_path):
    # compiled code planted in a folder others can write would run: this run takes a fresh folder of its own
    shared = tmp_path / f"fedgrove-numba-cache-{os.getuid()}"
    shared.mkdir()
    shared.chmod(0o777)
    folder = ensure_cache_folder(_uncacheable(), temp=str(tmp_path))
    assert folder != str(shared) and os.path.dirname(folder) == str(tmp_path)
    assert os.path.basename(folder).startswith("fedgrove-numba-cache-")
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700 and not private_folder(str(shared))


def test_no_writable_temporary_directory_either_is_a_clear_error(numba_cache_dir, tmp_path):
    temp = tmp_path / "a-file"
    temp.write_text("")
    with pytest.raises(FedgroveError, match="set NUMBA_CACHE_DIR to a folder this user can write"):
        ensure_cache_folder(_uncacheable(), temp=str(temp))


def test_the_kernels_import_and_run_where_numba_finds_no_cache_folder(tmp_path):
    # a fresh process whose numba finds no cache folder for any function (of its places, only NUMBA_CACHE_DIR
    # left, and unset: as where nothing beside the sources nor in the home can be written): importing a kernel's
    # module fell over; now the cache goes to the temporary directory, the kernel runs, and a second process
    # loads what the first compiled
    script = textwrap.dedent("""
        import logging, sys
        from numba.core import caching
        impl = getattr(caching, "CacheImpl", None) or caching._CacheImpl  # the names of numba >= 0.61, 0.60
        impl._locator_classes = [getattr(caching, "UserProvidedCacheLocator", None)
                                 or caching._UserProvidedCacheLocator]
        logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
        import numpy as np
        from fedgrove.engine.histogram import grouped_sums
        print(grouped_sums(np.ones((4, 1)), np.arange(4), np.array([0, 1, 1, 1]), 2).ravel().tolist())
    """)
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    env.pop("NUMBA_CACHE_DIR", None)
    runs = [subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
            for _ in range(2)]
    folder = tmp_path / f"fedgrove-numba-cache-{os.getuid()}"
    for run in runs:
        assert run.returncode == 0, run.stderr[-2000:]
        assert run.stdout.split() == ["[1.0,", "3.0]"]
    assert f"kept in {folder}" in runs[0].stderr and COMPILE_NOTE in runs[0].stderr, runs[0].stderr[-2000:]
    assert COMPILE_NOTE not in runs[1].stderr, runs[1].stderr[-2000:]  # loaded from the folder
    assert any(folder.rglob("*.nbi"))


# --- a kernel's cache and the kernels of other files it calls ----------------------------------------------------

def test_a_kernels_cache_goes_stale_when_a_kernel_of_another_file_it_calls_changes(tmp_path):
    # numba stamps a kernel's cache with its own file alone, so a kernel calling a kernel of another file ran its
    # old code after an upgrade or an edit that changed only the other file (shown here first, with numba's own
    # locators); fedgrove's locators stamp it with that file's contents too: the new code, then the cache again
    folder = tmp_path / "probe"
    folder.mkdir()
    helper = folder / "helper.py"
    helper.write_text("from numba import njit\n\n@njit(cache=True)\ndef helper():\n    return 1\n")
    # the kernel calls the other file's kernel through one defined further down its own file
    (folder / "kernel.py").write_text("from numba import njit\nfrom helper import helper\n\n"
                                      "@njit(cache=True)\ndef kernel():\n    return later()\n\n"
                                      "@njit(cache=True)\ndef later():\n    return helper()\n")
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(folder)!r})
        from fedgrove.engine import compiling
        if sys.argv[1] == "tracked":
            compiling.TRACKED.append({str(folder)!r})
        import kernel
        print(kernel.kernel(), kernel.kernel.stats.cache_hits[()] if kernel.kernel.stats.cache_hits else 0)
    """)
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}

    def run(mode):
        out = subprocess.run([sys.executable, "-c", script, mode], capture_output=True, text=True, env=env,
                             timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        value, hits = out.stdout.split()
        return int(value), int(hits)

    assert run("untracked") == (1, 0)
    helper.write_text(helper.read_text().replace("return 1", "return 2"))
    assert run("untracked") == (1, 1)  # numba alone: the old helper, loaded from the kernel's cache
    assert run("tracked") == (2, 0)  # compiled again
    assert run("tracked") == (2, 1)  # and cached
    helper.write_text(helper.read_text().replace("return 2", "return 3"))
    assert run("tracked") == (3, 0)


def test_the_engines_kernels_that_call_other_files_kernels_are_stamped_with_those_files():
    from fedgrove.engine import compiling, histogram, predict, sparse

    assert compiling.callee_files(sparse.build_histograms_sparse.py_func) == sorted(
        os.path.abspath(m.__file__) for m in (histogram, sys.modules["fedgrove.engine._intrinsics"]))
    assert compiling.callee_files(predict.walk_down.py_func) == []
    assert compiling.callee_files(_function("fedgrove.engine.example")) == []


def test_a_callee_file_that_cannot_be_read_leaves_numbas_own_stamp():
    # (fedgrove run from a zip archive: its files are no files numba or fedgrove can read by path)
    from numba.core import caching

    from fedgrove.engine import compiling, sparse

    impl = getattr(caching, "CacheImpl", None) or caching._CacheImpl
    func = sparse.build_histograms_sparse.py_func
    for cls in impl._locator_classes:
        if getattr(cls, "_fedgrove", False) and (locator := cls.from_function(func, func.__code__.co_filename)):
            break
    assert locator is not None and len(locator._callees) == 2
    own = super(type(locator), locator).get_source_stamp()
    assert locator.get_source_stamp()[0] == own and len(locator.get_source_stamp()[1]) == 2
    locator._callees = [*locator._callees, "/nonexistent/fedgrove/engine/gone.py"]
    assert locator.get_source_stamp() == own
    assert compiling._tracked(func.__code__.co_filename) and not compiling._tracked("/elsewhere/x.py")
