"""The lossless protocols against the engine on many small random problems: the node-level vertical protocol
(HE backend "plain": the protocol's messages and fixed-point encoding without the cost of encryption),
horizontal histogram aggregation and FV-tree with every feature a candidate (no voting approximation, no
DP) must grow the engine's trees, node for node; HybridTree without guest layers must be SOLO, and with
several instances to a ciphertext the model of one; Federated Forest, weighted or not, the engine's forest.

Random tables (20-300 rows, 2-6 columns of mixed scales, missing values, few-valued and constant columns),
binary / multiclass / regression labels and random parameters (lambda 0 included, as LightGBM's default; the
vertical, horizontal and FV-tree protocols with column subsampling too, drawing the engine's features, and with
row subsampling: the vertical protocol draws the engine's rows, the horizontal one's and FV-tree's parties their
own, which the engine then replays).  Each
seed's cases are drawn in one stream, so a failure names its seed and case.

Before 2026-11-26 about one case in ten differed: a split of a node whose gradients were all equal (lambda 0)
had a mathematical gain of 0 that rounding made +-1e-15, grown by one summation order and not by another; and
a missing bin emptied by histogram subtraction held 4e-16 in one order, so a node without missing values sent
them by gain instead of to its larger child; FV-tree judged that larger child by count where the engine, whose
histograms then hold no counts, judges it by hessian; and a child's hessian sum of exactly min_child_weight
(three of 1/3 against 1.0) was 0.9999999999999998 in one order; and where every gradient sum of a node was
itself rounding (a multiclass root whose children keep the class shares exactly), gains of 1e-31 were compared
(seed 3, case 68).
"""

from __future__ import annotations


import numpy as np
import pytest

from fedgrove import (FVTreeOptions, GBDTParams, keygen, run_fvtree, run_horizontal, run_hybridtree, run_vertical,
                      train_gbdt)
from fedgrove.engine.binning import BinMapper
from tests.conftest import replaying_own_rows
from tests.integration.test_federated_weights import _forest_oracle, _vertical_oracle
from tests.property import random_features


def _case(rs):
    """One random problem: (X, y, params, how to split it: ('vertical', column groups) or ('horizontal',
    row groups))."""
    n, d = int(rs.integers(20, 300)), int(rs.integers(2, 7))
    X = random_features(rs, n, d, missing=0.4)
    objective = str(rs.choice(["binary", "multiclass", "regression"]))
    extra = {}
    if objective == "binary":
        y = (np.nan_to_num(X[:, 0]) + rs.normal(size=n) * np.nanstd(X[:, 0]) > 0).astype(float)
        if y.min() == y.max():
            y[0] = 1 - y[0]
    elif objective == "multiclass":
        y = rs.integers(0, 3, n).astype(float)
        y[:3] = [0, 1, 2]
        extra = {"n_classes": 3}
    else:
        y = np.nan_to_num(X[:, 0]) / (np.nanstd(X[:, 0]) + 1e-12) * 2 + rs.normal(size=n)
    vertical = rs.random() < 0.5
    params = GBDTParams(
        objective=objective, n_estimators=int(rs.integers(1, 6)), max_depth=int(rs.integers(1, 6)),
        learning_rate=float(rs.choice([0.1, 0.3, 1.0])), max_bins=int(rs.choice([2, 4, 16, 255])),
        reg_lambda=float(rs.choice([0.0, 1.0, 5.0])), gamma=float(rs.choice([0.0, 0.1])),
        # the vertical protocol exchanges no counts: min_samples_leaf 1 and min_child_weight > 0
        min_child_weight=float(rs.choice([1e-3, 1.0] if vertical else [0.0, 1e-3, 1.0])),
        min_samples_leaf=1 if vertical else int(rs.choice([1, 5])), seed=int(rs.integers(0, 100)),
        colsample_bytree=float(rs.choice([1.0, 1.0, 0.5])),  # (the engine's features each round)
        subsample=float(rs.choice([1.0, 1.0, 0.6])), **extra)
    if vertical:
        k = int(rs.integers(2, min(d, 3) + 1))
        return X, y, params, ("vertical", [np.sort(c) for c in np.array_split(rs.permutation(d), k)])
    return X, y, params, ("horizontal", np.array_split(rs.permutation(n), int(rs.integers(2, 4))))


def _engine_on_the_parties_rows(params, X, y, groups, bin_mapper, weights=None):
    """The engine on the horizontal parties' rows in party order, with their cut points (and ``weights``, one
    per row of X); with ``subsample`` on the rows each party drew for itself each round."""
    import fedgrove.engine.gbdt as gbdt

    union = np.concatenate(groups)
    sampler = gbdt.RoundSampler
    try:
        if params.subsample < 1:
            gbdt.RoundSampler = replaying_own_rows([len(g) for g in groups])
        return train_gbdt(params, X[union], y[union], bin_mapper=bin_mapper,
                          sample_weight=None if weights is None else weights[union])
    finally:
        gbdt.RoundSampler = sampler


def _difference(fed, eng) -> str | None:
    if len(fed.trees) != len(eng.trees):
        return f"{len(fed.trees)} trees against {len(eng.trees)}"
    for t, (a, b) in enumerate(zip(fed.trees, eng.trees)):
        for name in ("feature", "bin", "missing_left", "left", "right"):
            if not np.array_equal(a.nodes[name], b.nodes[name]):
                return f"tree {t}: {name} differs"
        # to 1e-9, relative for values beyond 1: the protocols' sums are fixed point with 53 fractional bits
        # (about 1e-13 off the engine's floats), which lambda 0 with near-zero hessians turns into leaf values in
        # the thousands; and a hessian sum H is held to about 1e-16 absolute, so a leaf value v = -G/H (lambda 0,
        # min_child_weight 0) is held to about 1e-16 |v| relative where |G| is near 1 (a tiny H comes with
        # |g| near 1 in binary and multiclass): seed 16, case 31 grew a one-instance leaf of 1.2e9, 3e-8 off
        # A leaf value beyond 1e12 has a hessian sum within a few thousand rounding steps of the sums it was
        # subtracted from (under lambda 0: instances whose probabilities are below about 1e-12): the value is set
        # by rounding (seed 109's FV-tree case 34, a one-instance leaf with G = -1: 1.2e15 in the engine, whose H,
        # 8.3e-16, is a difference of larger sums, and 1.1e21 in the protocol, whose H is the instance's 9.2e-22),
        # and so are the scores of every later tree; the comparison ends with that tree.
        undetermined = np.abs(b.values) > 1e12
        if a.values.shape != b.values.shape or np.any(~undetermined & (
                np.abs(a.values - b.values) > 1e-9 * np.maximum(1.0, np.abs(b.values)) + 1e-15 * b.values ** 2)):
            return f"tree {t}: leaf values differ"
        if undetermined.any():
            return None
    return None


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_lossless_protocols_grow_the_engines_trees_on_random_small_problems(seed):
    plain = keygen("ou", 2048, "plain")
    rs = np.random.default_rng(seed)
    failures = []
    for case in range(80):
        X, y, params, (scheme, groups) = _case(rs)
        if scheme == "vertical":
            joined = np.concatenate([X[:, g] for g in groups], axis=1)  # the parties' columns side by side
            cuts = sum([BinMapper(params.max_bins, seed=params.seed).fit(X[:, g]).cuts_ for g in groups], [])
            eng = train_gbdt(params, joined, y, bin_mapper=BinMapper.from_cuts(cuts, params.max_bins))
            fed = run_vertical([X[:, g] for g in groups], y, params, plain)["model"]
        else:
            fed = run_horizontal([(X[r], y[r]) for r in groups], params)["model"]
            eng = _engine_on_the_parties_rows(params, X, y, groups, fed.bin_mapper)
        why = _difference(fed, eng)
        if why:
            failures.append(f"case {case} ({scheme}, {params.objective}, lambda {params.reg_lambda}): {why}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("seed", [0, 1])
def test_fv_tree_with_every_feature_a_candidate_grows_the_engines_trees_on_random_small_problems(seed):
    rs = np.random.default_rng(100 + seed)
    failures = []
    for case in range(40):
        X, y, params, (scheme, groups) = _case(rs)
        if scheme == "vertical":  # FV-tree is horizontal: split those tables' rows in two
            groups = np.array_split(rs.permutation(len(y)), 2)
        parts = [(X[r], y[r]) for r in groups]
        fed = run_fvtree(parts, params, FVTreeOptions(n_candidates=None, verify=False))["model"]
        why = _difference(fed, _engine_on_the_parties_rows(params, X, y, groups, fed.bin_mapper))
        if why:
            failures.append(f"case {case} ({params.objective}, lambda {params.reg_lambda}): {why}")
    assert not failures, "\n".join(failures)


def _host_and_guest_columns(X, params):
    """A HybridTree split of ``X``'s columns, (host's, guests'), the host's the first half; (None, None) where the
    case cannot run: no column left for the guests, or settings that need counts, which HybridTree, like the
    vertical protocol, does not exchange."""
    d = X.shape[1]
    host, guest = np.arange(max(1, d // 2)), np.arange(max(1, d // 2), d)
    if params.min_samples_leaf > 1 or params.min_child_weight <= 0 or not len(guest):
        return None, None
    return host, guest


def _guest_parts(rs, X, guest) -> list[tuple]:
    """Two guests holding the ``guest`` columns of a random half of the instances each, with their IDs."""
    return [(X[np.sort(r)][:, guest], np.sort(r)) for r in np.array_split(rs.permutation(len(X)), 2)]


def _hybridtree_cases(rs, n_cases: int):
    """The random problems among ``n_cases`` that HybridTree can run (:func:`_host_and_guest_columns`), as (case,
    X, y, params, host columns, guest columns); fails, once they are all drawn, where fewer than 20 ran."""
    ran = 0
    for case in range(n_cases):
        X, y, params, _ = _case(rs)
        host, guest = _host_and_guest_columns(X, params)
        if host is None:
            continue
        yield case, X, y, params, host, guest
        ran += 1
    assert ran >= 20, f"only {ran} cases ran"


def _solo_without_guest_layers(X, y, host, guests, params, he, weights=None) -> bool:
    """Whether HybridTree with ``guest_depth = 0`` scores the training rows as the engine on the host's columns
    (with the host's ``weights``) does: SOLO."""
    n = len(y)
    solo = run_hybridtree(X[:, host], y, guests, params, he, host_depth=params.max_depth, guest_depth=0,
                          sample_weight=weights)
    expect = train_gbdt(params, X[:, host], y, sample_weight=weights).predict_raw(X[:, host]).reshape(n, -1)
    return np.array_equal(np.asarray(solo["raw"]).reshape(n, -1), expect)


def test_hybridtree_equals_solo_without_guest_layers_and_packing_changes_nothing_on_random_small_problems():
    # HybridTree's lossless claims on the same random problems: with guest_depth 0 the host's model is SOLO's
    # (the engine on its own features, row and column sampling included: the host draws the engine's),
    # encrypting 2 or 3 instances to a ciphertext grows the model grown with one, to the bit, and two-round
    # inference of the training rows gives their training scores (instances a guest's draw left out included)
    plain = keygen("ou", 2048, "plain")
    rs = np.random.default_rng(200)
    failures = []
    for case, X, y, params, host, guest in _hybridtree_cases(rs, 60):
        guests = _guest_parts(rs, X, guest)
        if not _solo_without_guest_layers(X, y, host, guests, params, plain):
            failures.append(f"case {case} ({params.objective}): guest depth 0 is not SOLO")
        one = run_hybridtree(X[:, host], y, guests, params, plain, 2, 2, rows_per_ciphertext=1,
                             X_test_host=X[:, host], test_guests=guests)
        if not np.allclose(one["test_raw"], one["raw"], rtol=1e-12, atol=1e-12):
            failures.append(f"case {case} ({params.objective}): two-round inference of the training rows is not "
                            f"their training scores")
        packed = run_hybridtree(X[:, host], y, guests, params, plain, 2, 2, rows_per_ciphertext=int(rs.integers(2, 4)))
        if not np.array_equal(one["raw"], packed["raw"]) or one["model"].guest_values != packed["model"].guest_values:
            failures.append(f"case {case} ({params.objective}): packed ciphertexts grow another model")
    assert not failures, "\n".join(failures)


def _random_weights(rs, n: int, groups) -> np.ndarray:
    """Row weights: a quarter 0, the others whole numbers or spread over two orders of magnitude; every group
    (a horizontal client's rows) keeps a row of positive weight."""
    w = np.where(rs.random(n) < 0.25, 0.0, rs.choice([1.0, 2.0, 3.0], n) * (rs.uniform(0.1, 10, n)
                                                                          if rs.random() < 0.5 else 1.0))
    for g in groups:
        w[g[0]] = max(w[g[0]], 1.0)
    return w


@pytest.mark.parametrize("seed", [0, 1])
def test_with_row_weights_the_lossless_protocols_grow_the_engines_weighted_trees_on_random_small_problems(seed):
    # the vertical active party's weights (the passive parties' cut points unweighted, theirs) and each horizontal
    # client's (its rows of weight 0 left out, as the engine leaves them out, before its own row draws)
    plain = keygen("ou", 2048, "plain")
    rs = np.random.default_rng(300 + seed)
    failures = []
    for case in range(60):
        X, y, params, (scheme, groups) = _case(rs)
        if scheme == "vertical":
            w = _random_weights(rs, len(y), [np.arange(len(y))])
            eng = _vertical_oracle(X, y, w, groups, params)
            fed = run_vertical([X[:, g] for g in groups], y, params, plain, sample_weight=w)["model"]
        else:
            w = _random_weights(rs, len(y), groups)
            fed = run_horizontal([(X[r], y[r], w[r]) for r in groups], params)["model"]
            kept = [r[w[r] > 0] for r in groups]
            eng = _engine_on_the_parties_rows(params, X, y, kept, fed.bin_mapper, w)
        why = _difference(fed, eng)
        if why:
            failures.append(f"case {case} ({scheme}, {params.objective}, lambda {params.reg_lambda}): {why}")
    assert not failures, "\n".join(failures)


def test_with_host_weights_hybridtree_without_guest_layers_is_the_weighted_solo_on_random_small_problems():
    # the host's weights (hessian mode), row and column sampling among its rows of positive weight included
    plain = keygen("ou", 2048, "plain")
    rs = np.random.default_rng(400)
    failures = []
    for case, X, y, params, host, guest in _hybridtree_cases(rs, 40):
        w = _random_weights(rs, len(y), [np.arange(len(y))])
        guests = _guest_parts(rs, X, guest)
        if not _solo_without_guest_layers(X, y, host, guests, params, plain, w):
            failures.append(f"case {case} ({params.objective}): guest depth 0 is not the weighted SOLO")
    assert not failures, "\n".join(failures)


def _forest_case(rs):
    """A random Federated Forest problem: (X, y, ForestParams, the clients' column groups, the label holder, label
    mode) from :func:`_case`'s tables and labels, with random forest settings."""
    from fedgrove.engine.forest import ForestParams

    X, y, gbdt, (scheme, groups) = _case(rs)
    if scheme != "vertical":
        k = int(rs.integers(1, min(X.shape[1], 3) + 1))
        groups = [np.sort(c) for c in np.array_split(rs.permutation(X.shape[1]), k)]
    regression = gbdt.objective == "regression"
    params = ForestParams(
        task="regression" if regression else "classification",
        criterion="mse" if regression else str(rs.choice(["gini", "entropy"])),
        n_estimators=int(rs.integers(1, 5)), max_depth=[None, 1, 3, 6][int(rs.integers(0, 4))],
        max_bins=int(rs.choice([2, 4, 16, 255])), bootstrap=bool(rs.random() < 0.7),
        feature_sampling=str(rs.choice(["tree", "node"])), max_features=[None, "sqrt", 0.5][int(rs.integers(0, 3))],
        min_samples_leaf=int(rs.choice([1, 3])), min_samples_split=int(rs.choice([2, 6])),
        min_impurity_decrease=float(rs.choice([0.0, 0.0, 1e-3])), seed=int(rs.integers(0, 100)))
    return X, y, params, groups, int(rs.integers(0, len(groups))), str(rs.choice(["encrypted", "shared"]))


def test_federated_forest_weighted_or_not_grows_the_engines_forest_on_random_small_problems():
    # the label holder's weights (in most cases; a quarter 0, never drawn) or none, either label mode: the
    # engine's forest on the clients' columns side by side with their cut points (the holder's weighted), node for
    # node, its leaf values exactly
    from fedgrove.protocols.forest.simulate import run_federated_forest

    plain = keygen("ou", 2048, "plain")
    rs = np.random.default_rng(500)
    failures = []
    for case in range(50):
        X, y, params, groups, holder, mode = _forest_case(rs)
        w = _random_weights(rs, len(y), [np.arange(len(y))]) if rs.random() < 0.7 else None
        eng = _forest_oracle([X[:, g] for g in groups], y, w, holder, params)
        fed = run_federated_forest([X[:, g] for g in groups], y, params, plain, mode=mode, label_holder=holder,
                                   sample_weight=w)["model"]
        if fed.n_trees != eng.n_trees:
            failures.append(f"case {case}: {fed.n_trees} trees against {eng.n_trees}")
        for t, (a, b) in enumerate(zip(fed.trees, eng.trees)):
            if any(not np.array_equal(a.nodes[c], b.nodes[c]) for c in ("feature", "left", "right", "missing_left",
                                                                         "count")) \
                    or not np.array_equal(a.values, b.values):
                failures.append(f"case {case} ({params.task}, {mode}, {'weighted' if w is not None else 'unweighted'}"
                                f"): tree {t} differs")
                break
    assert not failures, "\n".join(failures)
