"""Every boosting protocol refuses, by name, the engine settings it does not implement, instead of ignoring them."""

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


@pytest.mark.parametrize("protocol", list(RUNS))
@pytest.mark.parametrize("setting, message", [({"subsample": 0.5}, "subsampling is not supported"),
                                              ({"colsample_bytree": 0.5}, "subsampling is not supported"),
                                              ({"early_stopping_rounds": 3}, "early stopping is not supported")])
def test_unsupported_settings_are_refused_by_name(protocol, setting, message):
    # early stopping ran silently as plain training in every federation; HybridTree ignored subsampling too
    with pytest.raises(InvalidParameterError, match=f"{message} by {protocol}"):
        RUNS[protocol](GBDTParams(n_estimators=2, max_depth=2, **setting))
