"""Compile fedgrove's numba kernels before a party's first message.

numba compiles a kernel the first time it is called and caches the result on
disk (``__pycache__`` beside the sources).  With an empty cache (the first
run after an install or an upgrade) compiling the kernels a protocol uses
takes tens of seconds, longer on a loaded machine.  Left to happen mid-protocol,
that pause counts against the peers' ``timeout``: a peer waiting for the
first encrypted gradients gives up on a party that is compiling, not stalled.

:func:`warm_up` runs the engine on a few dozen generated rows, with the
federation's objective and parameters, and the codec's bit packing, before
the party sends anything: the pause then falls under ``startup_timeout``,
which covers peers starting.  With a filled cache it takes a fraction of a
second.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from fedgrove.engine.histogram import gather_rows, grouped_sums
from fedgrove.engine.partition import partition_by_flags
from fedgrove.engine.predict import leaves_with_peer_bits, pack_go_left, predict_leaves_ranked, walk_down
from fedgrove.engine.tree import PackedEnsemble, RankedRows
from fedgrove.log import logger
from fedgrove.transport import bitpack

_NOTE_AFTER = 3.0  # seconds: a warm-up taking longer has compiled kernels: the note gives the time


def warm_up(cfg, who: str = "fedgrove") -> float:
    """Call the kernels that ``cfg``'s protocol uses, on generated data, so that they are compiled (or loaded
    from numba's cache) now; returns the seconds it took, which a note gives when they were long."""
    t0 = time.perf_counter()
    rng = np.random.default_rng(0)
    dense = rng.normal(size=(96, 4))
    dense[::9, 1] = np.nan  # the missing-value paths too
    sparse = np.where(rng.random((96, 24)) < 0.05, rng.normal(size=(96, 24)), 0.0)  # sparse histograms
    sparse[:, :4] = dense
    for X in (dense, sparse):  # a kernel compiled here, not loaded from the cache, is noted (engine.compiling)
        _warm_engine(cfg, X, rng)
    bitpack.warm_up()  # the codec's packed arrays
    seconds = time.perf_counter() - t0
    if seconds > _NOTE_AFTER:
        logger.info("%s: kernels ready after %.0f s", who, seconds)
    return seconds


def _warm_engine(cfg, X, rng) -> None:
    params = cfg.make_params()
    if cfg.protocol == "federated-forest":
        from fedgrove.engine.forest import train_forest

        y = _labels(rng, X, "multiclass" if params.task == "classification" else "regression")
        model = train_forest(dataclasses.replace(params, n_estimators=2, max_depth=3), X, y)
    else:
        from fedgrove.engine.gbdt import train_gbdt

        y = _labels(rng, X, params.objective)
        model = train_gbdt(dataclasses.replace(params, n_estimators=2, max_depth=3, early_stopping_rounds=None,
                                               eval_metric=None, n_classes=None), X, y)
    model.predict(X)
    # a finder without the engine's reused buffers copies its rows' statistics (the engine writes a tree's on
    # every row straight into its buffers, so its warm-up above need not call this)
    gather_rows(np.zeros((4, 2)), np.arange(4, dtype=np.int64), np.empty((4, 2)))
    # a vertical label holder and a Federated Forest client split nodes by a peer's masks
    idx, two = np.arange(4, dtype=np.int64), np.array([0, 2], dtype=np.int64)
    partition_by_flags(idx, np.zeros((4, 2)), np.empty(4, dtype=np.int64), np.empty((4, 2)), two, two + 2,
                       np.array([True, False, False, True]))
    packed = PackedEnsemble(model.trees)
    leaves = packed.leaves(X)  # vertical and HybridTree prediction: leaves, then their values
    if cfg.protocol != "federated-forest":
        model.raw_from_leaves(leaves)
        codes = model.bin_mapper.transform(X)
        packed.leaves_binned(codes, model.bin_mapper.missing_codes)
        # a vertical label holder routes by its own columns and the passive parties' bits: test values, and
        # the training instances' codes when rows are sampled
        peers, bits = np.full(len(packed.feature), -1), np.zeros((0, (len(X) + 7) // 8), dtype=np.uint8)
        bits.setflags(write=False)  # (as the masks come: read from the bytes received)
        for cols, cuts, missing in ((np.ascontiguousarray(X), packed.threshold, None),
                                    (codes, packed.bin, model.bin_mapper.missing_codes)):
            leaves_with_peer_bits(cols, packed.feature, cuts, packed.missing_left, packed.left, packed.right, peers,
                                  packed.tree_offsets, len(model.trees), bits, missing)
        # a HybridTree guest walks its layers from the host's hand-off nodes: test values, and the training
        # instances' codes when rows are sampled (no split: the kernel is what is compiled)
        none = np.zeros(0, dtype=np.int64)
        for cols, missing in ((np.ascontiguousarray(X), none),
                              (codes, np.asarray(model.bin_mapper.missing_codes, dtype=np.int64))):
            start = np.zeros((len(X), 1), dtype=np.int64)
            walk_down(cols, np.arange(len(X)), start, none, np.zeros(2, dtype=np.int64), none, np.zeros(0),
                      np.zeros(0, dtype=np.uint8), none, none, none, none, missing, np.empty_like(start))
        # and a vertical passive party answers with its splits' go-left bits
        split = packed.feature >= 0
        pack_go_left(np.asfortranarray(X), packed.feature[split].astype(np.int64), packed.threshold[split],
                     packed.missing_left[split].astype(np.uint8),
                     np.zeros((int(split.sum()), (len(X) + 7) // 8), dtype=np.uint8))
        if params.objective == "multiclass":  # the protocols keep scores sample-major, the engine class-major
            from fedgrove.engine.histogram import add_to_segments
            from fedgrove.engine.losses import make_objective

            raw = np.zeros((len(X), 3))
            make_objective("multiclass", 3).gradients(y, raw)
            none = np.zeros(0, dtype=np.int64)
            add_to_segments(raw, 0, none, none, none, none, none, np.zeros(0))
    if cfg.protocol in ("fvtree", "horizontal"):
        # FV-tree's vote pick; split Shapley values (FV-tree, and horizontal runs with contributions on)
        from fedgrove.engine.split import best_index
        from fedgrove.ledger.contributions import exact_shapley_values

        best_index(rng.normal(size=4))
        exact_shapley_values(np.abs(rng.normal(size=(2, 1, 4))), 1.0, 0.0)  # one party: any EXACT_MAX allows it
    if cfg.protocol == "hybridtree":  # the host's sum of the guests' leaf values in prediction
        from fedgrove.protocols.hybridtree.host import _add_means, _sum_guest_leaves

        none, one = np.zeros(0, dtype=np.int64), np.zeros((2, 1), dtype=np.int32)
        acc, cnt = np.zeros((2, 1)), np.zeros((2, 1), dtype=np.int32)
        _sum_guest_leaves(acc, cnt, one, np.full((2, 1), -1, dtype=np.int32), 0, 1, none, np.zeros(0),
                          np.zeros(2, dtype=np.int64), none, none, np.full(3, -1, dtype=np.int64))
        _add_means(np.zeros((2, 1)), acc, cnt, one, np.zeros(1), np.zeros(2, dtype=np.int64),
                   np.zeros(1, dtype=np.int64))
        # and the leaves as ranks below their hand-off nodes: the guest's ranks, the host's values of them
        from fedgrove.protocols.hybridtree.guest import _layout_leaf_ranks, _ranks_of_leaves
        from fedgrove.protocols.hybridtree.host import _sum_guest_ranks

        _layout_leaf_ranks(np.zeros(2, dtype=np.int64), none, none, none, np.zeros(0, dtype=np.int32),
                           np.empty(1, dtype=np.int64))
        unheld = np.full((2, 1), -1, dtype=np.int32)
        _ranks_of_leaves(unheld, none, np.zeros(2, dtype=np.int64), none, none, np.zeros(0, dtype=np.int32),
                         np.empty_like(unheld))
        _sum_guest_ranks(acc, cnt, one, unheld, 0, 1, 1, np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int64),
                         np.full(1, np.nan), np.full(3, -1, dtype=np.int64))
    if cfg.protocol == "simfl":
        _warm_lsh(X)
        # routing the others' trees through a party's rows: ranks of the smallest type that holds them
        # (in one block of rows, and in several when the party has several threads)
        for n_distinct in (96, 300, 70_000):
            rows = np.resize(X, (n_distinct, X.shape[1]))
            rows[:, 0] = np.arange(n_distinct)
            ranked = RankedRows(rows)
            for n_blocks in (1, 2):
                predict_leaves_ranked(ranked.ranks, *ranked.layout(model.trees[0]), n_blocks=n_blocks)
        # the others' gradients summed per similar instance of the trainer (a column per class)
        K = 3 if params.objective == "multiclass" else 1
        grouped_sums(np.zeros((2, K)), np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int64), 1)


def _labels(rng, X, objective: str) -> np.ndarray:
    score = np.nan_to_num(X[:, 0]) + 0.3 * rng.normal(size=len(X))
    if objective == "binary":
        return (score > 0).astype(float)
    if objective == "multiclass":
        return np.digitize(score, [-0.5, 0.5]).astype(float)
    return score


def _warm_lsh(X) -> None:
    from fedgrove.protocols.simfl.lsh import hash_values, similar_instances

    rng = np.random.default_rng(1)
    H = hash_values(np.ascontiguousarray(np.nan_to_num(X)), rng.normal(size=(2, X.shape[1])), rng.uniform(size=2),
                    1.0)
    half = len(X) // 2
    similar_instances(H[:half], H[half:], np.arange(half, len(X), dtype=np.int64))
