"""Kernels on one thread where several would sleep between launches: the same models, only the thread count
differs, and only for work below :data:`~fedgrove.engine.threads.SERIAL_WORK`."""

import numba
import numpy as np
import pytest

from fedgrove.engine import threads
from fedgrove.engine._intrinsics import PRANGE_ONLY
from fedgrove.engine.binning import BinMapper
from fedgrove.engine.forest import ForestParams, train_forest
from fedgrove.engine.gbdt import GBDTParams, train_gbdt
from fedgrove.engine.grower import TreeGrower
from fedgrove.engine.partition import partition_nodes
from fedgrove.engine.sparse import codes_per_row
from fedgrove.engine.splitter import GBDTScorer, HistogramSplitFinder
from tests.conftest import make_classification

several = pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="needs two numba threads")


@pytest.fixture
def sleepy(monkeypatch):
    """Threads measured as sleeping between launches."""
    monkeypatch.setattr(threads, "_sleep", True)


@pytest.fixture
def search_threads(monkeypatch):
    """The thread counts the split finder's searches ran with, one a layer."""
    seen = []
    find = HistogramSplitFinder.find_splits

    def spy(self, layer):
        seen.append(numba.get_num_threads())
        return find(self, layer)

    monkeypatch.setattr(HistogramSplitFinder, "find_splits", spy)
    return seen


def test_launch_cost_is_measured_once_per_thread_count(monkeypatch):
    monkeypatch.setattr(threads, "_launch_cost", {})
    monkeypatch.setattr(threads, "_sleep", None)
    assert threads.launch_cost(1) == 0.0
    if numba.config.NUMBA_NUM_THREADS < 2:
        return
    cost = threads.launch_cost(2)
    assert 0.0 <= cost < 1.0 and threads._launch_cost == {2: cost}
    threads._launch_cost[2] = 5.0  # a second call takes the stored value
    assert threads.launch_cost(2) == 5.0
    threads._launch_cost[numba.config.NUMBA_NUM_THREADS] = 5.0  # (as a sleeping team's)
    assert threads.threads_sleep() and threads._sleep is True


@several
def test_one_thread_only_for_little_work_and_sleeping_threads(sleepy, monkeypatch):
    with threads.thread_limit(2):
        assert threads.sleepy_threads()
        assert threads.one_thread_for(threads.row_work(1000, 10))
        assert not threads.one_thread_for(threads.row_work(threads.SERIAL_WORK, 10))
        with threads.thread_limit(1):  # one thread already: nothing to decide
            assert not threads.sleepy_threads() and not threads.one_thread_for(threads.row_work(1000, 10))
    monkeypatch.setattr(threads, "_sleep", False)
    with threads.thread_limit(2):
        assert not threads.sleepy_threads() and not threads.one_thread_for(threads.row_work(1000, 10))


# launch costs beyond one thread, spinning and sleeping threads (us): a 16-core machine (OpenMP unset and
# OMP_WAIT_POLICY=PASSIVE, 2026-11-29), and the 2-CPU one (unset idle; PASSIVE while a test run kept the other core
# busy, the least measured there)
LAUNCH_COSTS = {"16 cores": {2: (3.3, 11.0), 4: (4.4, 14.6), 8: (5.1, 19.4), 16: (7.6, 41.7)},
                "2 CPUs": {2: (2.4, 8.0)}}


@pytest.mark.parametrize("machine", sorted(LAUNCH_COSTS))
def test_the_line_between_spinning_and_sleeping_threads_grows_with_the_thread_count(machine):
    for n, (spinning, sleeping) in LAUNCH_COSTS[machine].items():
        assert spinning * 1e-6 < threads.sleepy_launch(n) < sleeping * 1e-6, (machine, n)


def test_the_threads_are_judged_against_the_line_for_all_of_them(monkeypatch):
    every = numba.config.NUMBA_NUM_THREADS
    for cost, sleep in ((0.9, False), (1.1, True)):
        monkeypatch.setattr(threads, "_launch_cost", {every: cost * threads.sleepy_launch(every)})
        monkeypatch.setattr(threads, "_sleep", None)
        assert threads.threads_sleep() is sleep


def test_the_one_thread_line_falls_with_the_thread_count():
    assert threads.serial_work(1) == threads.serial_work(2) == threads.SERIAL_WORK
    lines = [threads.serial_work(n) for n in (2, 3, 4, 8, 16, 64)]
    assert lines == sorted(lines, reverse=True) and lines[-1] > threads.SERIAL_WORK / 2
    assert threads.serial_work(16) == pytest.approx(threads.SERIAL_WORK * 8 / 15)
    # cod-rna's fit (59,535 rows of 8 codes) ran faster on 16 sleeping threads than on one (0.36 against 0.41 s
    # on a 16-core machine); a9a's (32,561 rows of 9.9 listed codes) no slower on one
    assert threads.row_work(59535, 8) > threads.serial_work(16) > threads.row_work(32561, 9.9)


@several
def test_one_thread_is_chosen_against_the_line_of_this_threads_count(sleepy, monkeypatch):
    monkeypatch.setattr(threads, "serial_work", lambda n: {2: 5000.0}.get(n, 0.0))
    with threads.thread_limit(2):
        assert threads.one_thread_for(4999) and not threads.one_thread_for(5000)


def test_codes_per_row_counts_a_sparse_tables_listed_codes():
    rng = np.random.default_rng(0)
    X = np.zeros((2000, 40))
    X[rng.random(X.shape) < 0.05] = 1.0  # 2 codes a row listed on average
    bm = BinMapper().fit(X)
    Xb = bm.transform(X)
    listed = (Xb != 0).sum() / len(Xb)  # 0 is every column's most frequent code here
    assert codes_per_row(Xb, bm.feature_offsets) == pytest.approx(listed)
    assert codes_per_row(Xb, bm.feature_offsets, 4) == 4.0  # (too dense a listing for 4 features)
    D = rng.normal(size=(500, 6))
    bmd = BinMapper().fit(D)
    assert codes_per_row(bmd.transform(D), bmd.feature_offsets) == 6.0


def _finder(X, y):
    bm = BinMapper().fit(X)
    stats = np.column_stack([0.5 - y, np.full(len(y), 0.25), np.ones(len(y))])
    return HistogramSplitFinder(bm.transform(X), bm.feature_offsets, bm.missing_codes, bm.thresholds(), stats,
                                GBDTScorer(min_samples_leaf=5))


@several
def test_a_layer_of_little_work_runs_on_one_thread_where_threads_sleep(sleepy, search_threads, monkeypatch):
    X, y = make_classification(3000, missing=0.05)
    seen = search_threads
    scorer = GBDTScorer(min_samples_leaf=5)
    with threads.thread_limit(2):
        tree = TreeGrower(_finder(X, y), 5, scorer.leaf_value).grow()
        assert seen and set(seen) == {1} and numba.get_num_threads() == 2
        seen.clear()
        monkeypatch.setattr(threads, "SERIAL_WORK", 10)  # every layer is more work than that now
        again = TreeGrower(_finder(X, y), 5, scorer.leaf_value).grow()
        assert set(seen) == {2}
    for name in tree.nodes.dtype.names:  # (field by field: NaN thresholds of leaves equal)
        np.testing.assert_array_equal(tree.nodes[name], again.nodes[name])
    np.testing.assert_array_equal(tree.values, again.values)


def _fits(monkeypatch, n_threads):
    """The kernels' thread counts seen by a GBDT fit's rounds and layers, and the model."""
    import fedgrove.engine.gbdt as gbdt

    seen = []
    grow = TreeGrower.grow_layer

    def spy(self):
        seen.append(numba.get_num_threads())
        return grow(self)

    monkeypatch.setattr(gbdt.TreeGrower, "grow_layer", spy)
    X, y = make_classification(2000, missing=0.05)
    model = train_gbdt(GBDTParams(n_estimators=3, max_depth=4, n_threads=n_threads), X, y)
    return seen, model.predict_raw(X)


@several
def test_a_fit_of_little_work_runs_on_one_thread_where_threads_sleep_and_grows_the_same_model(monkeypatch):
    monkeypatch.setattr(threads, "_sleep", False)
    seen, spun = _fits(monkeypatch, 2)
    assert set(seen) == {2}
    monkeypatch.setattr(threads, "_sleep", True)
    seen, slept = _fits(monkeypatch, 2)
    assert set(seen) == {1}
    np.testing.assert_array_equal(spun, slept)


@several
def test_a_forest_of_little_work_runs_on_one_thread_where_threads_sleep(sleepy, search_threads, monkeypatch):
    seen = search_threads
    X, y = make_classification(1000)
    slept = train_forest(ForestParams(n_estimators=3, max_depth=4, n_threads=2, seed=1), X, y).predict_proba(X)
    assert set(seen) == {1}
    monkeypatch.setattr(threads, "_sleep", False)
    seen.clear()
    spun = train_forest(ForestParams(n_estimators=3, max_depth=4, n_threads=2, seed=1), X, y).predict_proba(X)
    assert set(seen) == {2}
    np.testing.assert_array_equal(spun, slept)


@several
@pytest.mark.parametrize("sleep", [True, False])
def test_a_layers_split_search_and_histograms_each_take_one_thread_for_little_work(sleep, monkeypatch):
    """Within a layer run on several threads (a layer of many rows), the split search over few nodes' bins and the
    histograms of few rows still take one thread where the threads sleep."""
    monkeypatch.setattr(threads, "_sleep", sleep)
    monkeypatch.setattr(HistogramSplitFinder, "serial_layer", lambda self, layer: False)
    seen = {"find": set(), "build": set()}
    build = HistogramSplitFinder._build

    def spy_build(self, *args):
        seen["build"].add(numba.get_num_threads())
        return build(self, *args)

    monkeypatch.setattr(HistogramSplitFinder, "_build", spy_build)
    X, y = make_classification(3000, missing=0.05)
    finder = _finder(X, y)
    find = finder.scorer.find

    def spy_find(*args):
        seen["find"].add(numba.get_num_threads())
        return find(*args)

    finder.scorer.find = spy_find
    with threads.thread_limit(2):
        TreeGrower(finder, 5, GBDTScorer(min_samples_leaf=5).leaf_value).grow()
    assert seen == {"find": {1 if sleep else 2}, "build": {1 if sleep else 2}}


def _kernels():
    """Every numba kernel defined at the top level of fedgrove's modules."""
    import importlib
    import pkgutil

    import fedgrove
    from numba.core.registry import CPUDispatcher

    for info in pkgutil.walk_packages(fedgrove.__path__, "fedgrove."):
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if isinstance(obj, CPUDispatcher) and obj.__module__ == info.name:
                yield f"{info.name}.{name}", obj


def test_every_parallel_kernel_runs_only_its_prange_loops_in_parallel():
    parallel = {name: k.targetoptions["parallel"] for name, k in _kernels() if k.targetoptions.get("parallel")}
    assert "fedgrove.engine.partition.partition_nodes" in parallel and len(parallel) >= 15
    assert {name for name, opt in parallel.items() if opt is not PRANGE_ONLY} == set()


def test_a_kernels_zeros_and_min_outside_its_prange_loops_launch_no_threads():
    # compiled afresh (a cached kernel keeps no diagnostics): partition_nodes has two prange loops, and with
    # numba's full conversions four more loops (two np.zeros, an array min and max), each a launch of the threads
    from numba import njit

    options = dict(partition_nodes.targetoptions, cache=False)
    del options["nopython"]
    kernel = njit(**options)(partition_nodes.py_func)
    X = np.asfortranarray(np.arange(40, dtype=np.uint8).reshape(10, 4))
    idx, stats = np.arange(10), np.ones((10, 2))
    kernel(X, idx, stats, np.empty_like(idx), np.empty_like(stats), np.array([0]), np.array([10]), np.array([1]),
           np.array([20]), np.array([False]), np.full(4, 255))
    loops = kernel.get_metadata(kernel.signatures[0])["parfor_diagnostics"].initial_parfors
    source = partition_nodes.py_func.__code__.co_filename
    lines = open(source).read().splitlines()
    assert len(loops) == 2
    assert all("prange(" in lines[next(iter(p.loop_body.values())).loc.line - 1] for p in loops)


@several
@pytest.mark.parametrize("kind", ["gbdt", "forest"])
def test_prediction_runs_on_the_threads_the_model_was_trained_with(kind, monkeypatch, tmp_path):
    from fedgrove.engine.model import load_model
    from fedgrove.engine.tree import PackedEnsemble

    seen = []
    for method in ("leaves", "raw_sum", "mean_values"):
        original = getattr(PackedEnsemble, method)

        def spy(self, *args, _original=original):
            seen.append(numba.get_num_threads())
            return _original(self, *args)

        monkeypatch.setattr(PackedEnsemble, method, spy)
    X, y = make_classification(300, 5, seed=0)
    every = numba.config.NUMBA_NUM_THREADS
    for n_threads, expected in ((1, 1), (None, every), (2, 2)):
        if kind == "gbdt":
            model = train_gbdt(GBDTParams(objective="binary", n_estimators=2, max_depth=2, n_threads=n_threads), X, y)
        else:
            model = train_forest(ForestParams(n_estimators=2, max_depth=2, n_threads=n_threads), X, y)
        model.save(tmp_path / "m.json")
        for m in (model, load_model(tmp_path / "m.json")):
            seen.clear()
            m.predict(X)
            m.predict_proba(X)
            m.predict_leaf(X)
            assert seen == [expected] * 3, (n_threads, seen)
            assert numba.get_num_threads() == every  # as it was after each call
    model.params["n_threads"] = "two"  # (a hand-edited file) every core
    seen.clear()
    model.predict(X)
    assert seen == [every]


@several
@pytest.mark.parametrize("kind", ["gbdt", "forest"])
def test_a_fit_bins_its_table_on_the_threads_it_is_given(kind, monkeypatch):
    # n_threads held for the trees alone: the binning's kernels ran on every core even for n_threads=1
    seen = []
    for method in ("sketches", "transform"):
        original = getattr(BinMapper, method)

        def spy(self, *args, _original=original, _method=method):
            seen.append((_method, numba.get_num_threads()))
            return _original(self, *args)

        monkeypatch.setattr(BinMapper, method, spy)
    X, y = make_classification(300, 5, seed=0)
    every = numba.config.NUMBA_NUM_THREADS
    for n_threads, expected in ((1, 1), (2, 2), (None, every)):
        seen.clear()
        if kind == "gbdt":
            train_gbdt(GBDTParams(objective="binary", n_estimators=2, max_depth=2, n_threads=n_threads), X, y)
        else:
            train_forest(ForestParams(n_estimators=2, max_depth=2, n_threads=n_threads), X, y)
        assert seen == [("sketches", expected), ("transform", expected)], (n_threads, seen)
        assert numba.get_num_threads() == every
