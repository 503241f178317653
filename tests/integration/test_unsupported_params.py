"""Every boosting protocol refuses, by name, the engine settings it does not implement, instead of ignoring them;
the simulations refuse malformed per-party inputs by name."""

import numpy as np
import pytest

from fedgrove.crypto.he import keygen
from fedgrove.engine.gbdt import GBDTParams
from fedgrove.exceptions import InvalidParameterError
from fedgrove.protocols.fvtree.simulate import run_fvtree
from fedgrove.protocols.horizontal.simulate import run_horizontal
from fedgrove.protocols.hybridtree.simulate import run_hybridtree
from fedgrove.protocols.simfl.simulate import run_simfl
from fedgrove.protocols.tfl import PartyView, train_tfl
from fedgrove.protocols.vertical.simulate import run_vertical

rng = np.random.default_rng(0)
X = rng.normal(size=(200, 6))
y = (X[:, 0] + X[:, 3] > 0).astype(float)
HALVES = [(X[:100], y[:100]), (X[100:], y[100:])]
PLAIN = keygen("ou", 2048, "plain")

RUNS = {
    "the vertical protocol": lambda p: run_vertical([X[:, :3], X[:, 3:]], y, p, PLAIN, timeout=30),
    "HybridTree": lambda p: run_hybridtree(X[:, :3], y, [(X[:100, 3:], np.arange(100))], p, PLAIN, 2, 1,
                                           timeout=30),
    "the horizontal protocol": lambda p: run_horizontal(HALVES, p, timeout=30),
    "SimFL": lambda p: run_simfl(HALVES, p, timeout=30),
    "FV-tree": lambda p: run_fvtree(HALVES, p),
    "TFL": lambda p: train_tfl(X, y, [PartyView(np.arange(100), np.arange(6)), PartyView(np.arange(100, 200),
                                                                                         np.arange(6))], p),
}


SETTINGS = [({"early_stopping_rounds": 3}, "early stopping is not supported"),
            ({"eval_metric": "auc"}, "eval_metric is not used")]
# subsample and colsample_bytree every boosting protocol takes (tests/integration/test_horizontal.py, test_fvtree.py,
# test_hybridtree.py, test_simfl.py, test_vertical.py); these draw the engine's features:
SAMPLE_COLUMNS = ("the vertical protocol", "the horizontal protocol", "FV-tree")


@pytest.mark.parametrize("protocol, setting, message", [(p, s, m) for p in RUNS for s, m in SETTINGS])
def test_unsupported_settings_are_refused_by_name(protocol, setting, message):
    # early stopping ran silently as plain training in every federation, and eval_metric was ignored
    with pytest.raises(InvalidParameterError, match=f"{message} by {protocol}"):
        RUNS[protocol](GBDTParams(n_estimators=2, max_depth=2, **setting))


def _forest(**kw):
    from fedgrove.engine.forest import ForestParams
    from fedgrove.protocols.forest.simulate import run_federated_forest

    return run_federated_forest([X[:, :3], X[:, 3:]], y, ForestParams(n_estimators=2, max_depth=2), **kw)


def _forest_with(params):
    from fedgrove.protocols.forest.simulate import run_federated_forest

    return run_federated_forest([X[:, :3], X[:, 3:]], y, params, mode="shared")


P = GBDTParams(n_estimators=2, max_depth=2)


@pytest.mark.parametrize("call, error, message", [
    # each of these failed inside a party's thread, as an IndexError or an unpacking error
    (lambda: run_vertical([X[:, :3], X[:, 3:]], y, P, PLAIN, X_test_parts=[X[:, :3]], timeout=30),
     InvalidParameterError, r"X_test_parts has 1 parts for 2 parties"),
    (lambda: run_vertical([X[:, :3], X[:, 3:]], y, P, PLAIN, X_test_parts=[X[:, :2], X[:, 3:]], timeout=30),
     "DataError", r"party0: test features must have the 3 columns it trained on, got shape \(200, 2\)"),
    (lambda: run_hybridtree(X[:, :3], y, [(X[:100, 3:], np.arange(100))], P, PLAIN, 2, 1, X_test_host=X[:, :3],
                            test_guests=[], timeout=30),
     InvalidParameterError, r"test_guests has 0 items for 1 parties"),
    (lambda: run_hybridtree(X[:, :3], y, [(X[:100, 3:], np.arange(100))], P, PLAIN, 2, 1,
                            test_guests=[(X[:, 3:], np.arange(200))], timeout=30),  # the guests' part was ignored
     InvalidParameterError, r"give X_test_host and test_guests together"),
    (lambda: run_hybridtree(X[:, :3], y, [X[:100, 3:]], P, PLAIN, 2, 1, timeout=30),
     InvalidParameterError, r"guests\[0\] must be a tuple \(X_guest, ids\), got ndarray"),
    (lambda: run_simfl([(X[:100],), HALVES[1]], P, timeout=30),
     InvalidParameterError, r"parts\[0\] must be a tuple \(X, y\) or \(X, y, ids\), got 1 items"),
    (lambda: run_fvtree([HALVES[0], (X[100:],)], P), InvalidParameterError, r"parts\[1\] must be a tuple \(X, y\)"),
    (lambda: run_horizontal([X, y], P, timeout=30), InvalidParameterError, r"client_data\[0\] must be a tuple"),
    (lambda: _forest(X_test_parts=[X[:, :3]], mode="shared"), InvalidParameterError,
     r"X_test_parts has 1 parts for 2 clients"),
    (lambda: _forest(), InvalidParameterError, r"mode 'encrypted' needs the label holder's key pair: he=keygen"),
    # arguments of the wrong type failed inside a party as AttributeErrors ('dict' object has no attribute ...)
    (lambda: run_simfl(HALVES, {"n_estimators": 2}), InvalidParameterError,
     r"run_simfl: params must be a GBDTParams, got dict"),
    (lambda: run_simfl(HALVES, P, {"r": 4.0}), InvalidParameterError,
     r"run_simfl: options must be a SimFLOptions or None, got dict"),
    (lambda: run_fvtree(HALVES, P, options=3), InvalidParameterError,
     r"run_fvtree: options must be a FVTreeOptions or None, got int"),
    (lambda: run_horizontal(HALVES, None), InvalidParameterError, r"run_horizontal: params must be a GBDTParams"),
    (lambda: run_vertical([X[:, :3], X[:, 3:]], y, P, None), InvalidParameterError,
     r"run_vertical: he must be a HEContext \(e\.g\. fedgrove\.keygen\('ou', 2048\)\), got NoneType"),
    (lambda: run_hybridtree(X[:, :3], y, [(X[:100, 3:], np.arange(100))], P, None, 2, 1), InvalidParameterError,
     r"run_hybridtree: he must be a HEContext"),
    (lambda: train_tfl(X, y, [PartyView(np.arange(200), np.arange(6))], None), InvalidParameterError,
     r"train_tfl: params must be a GBDTParams, got NoneType"),
    (lambda: _forest_with(P), InvalidParameterError, r"run_federated_forest: params must be a ForestParams, got "
                                                     r"GBDTParams"),
])
def test_simulations_refuse_malformed_party_inputs_by_name(call, error, message):
    from fedgrove.exceptions import DataError

    with pytest.raises(DataError if error == "DataError" else error, match=message):
        call()


@pytest.mark.parametrize("protocol", SAMPLE_COLUMNS)
def test_the_vertical_and_horizontal_protocols_and_fv_tree_sample_the_engines_columns(protocol):
    # colsample_bytree draws the engine's features each round (fedgrove.engine.gbdt.RoundSampler): the trees are
    # the engine's with the same setting, not those grown without it (tests/property/test_lossless_random_cases.py
    # checks this on many random problems)
    from fedgrove.engine.binning import BinMapper
    from fedgrove.engine.gbdt import train_gbdt

    def trees(model):
        return [(t.nodes["feature"].tolist(), t.nodes["bin"].tolist(), np.round(t.values, 9).tolist())
                for t in model.trees]

    def grown(**kw):
        params = GBDTParams(n_estimators=4, max_depth=3, max_bins=16, seed=3, **kw)
        if protocol == "FV-tree":  # every feature of the round a candidate, every upload counted: the engine's splits
            from fedgrove.protocols.fvtree.party import FVTreeOptions

            fed = run_fvtree(HALVES, params, FVTreeOptions(n_candidates=None, verify=False))["model"]
        else:
            fed = RUNS[protocol](params)["model"]
        if protocol == "the vertical protocol":  # the engine on the parties' columns side by side, their cuts
            cuts = sum([BinMapper(16, seed=3).fit(X[:, c]).cuts_ for c in (slice(0, 3), slice(3, 6))], [])
            return fed, train_gbdt(params, X, y, bin_mapper=BinMapper.from_cuts(cuts, 16))
        return fed, train_gbdt(params, X, y, bin_mapper=fed.bin_mapper)  # (the clients' rows in order)

    (sampled, engine), (full, _) = grown(colsample_bytree=0.5), grown()
    assert trees(sampled) == trees(engine)
    assert trees(sampled) != trees(full)
