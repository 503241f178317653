"""fedgrove: federated tree learning.

Gradient-boosted trees and random forests trained by several organisations
whose data cannot leave their premises, split by samples (horizontal), by
features (vertical) or both (hybrid).

The centralised engine (:mod:`fedgrove.engine`) is at once the ALL-IN / SOLO
baseline and the oracle that lossless federated protocols reproduce exactly.

The names most programs need are importable from here (``from fedgrove import
GBDTParams, train_gbdt, run_vertical``); each is loaded on first use, so
``import fedgrove`` stays quick (the command line imports it on every start).
"""

from fedgrove._cores import fit_numba_to_cpu_quota
from fedgrove._version import __version__
from fedgrove.exceptions import FedgroveError

fit_numba_to_cpu_quota()  # numba's threads no more than a container's CPU limit (before numba is imported)

#: name -> the module that defines it, imported when the name is first asked for
_LAZY = {
    # the engine
    "GBDTParams": "fedgrove.engine.gbdt", "train_gbdt": "fedgrove.engine.gbdt",
    "ForestParams": "fedgrove.engine.forest", "train_forest": "fedgrove.engine.forest",
    "GBDTModel": "fedgrove.engine.model", "ForestModel": "fedgrove.engine.model",
    "load_model": "fedgrove.engine.model",
    # the engine as scikit-learn estimators
    "GBDTClassifier": "fedgrove.sklearn", "GBDTRegressor": "fedgrove.sklearn",
    "RandomForestClassifier": "fedgrove.sklearn", "RandomForestRegressor": "fedgrove.sklearn",
    # data
    "load_table": "fedgrove.data.io", "load_dataset": "fedgrove.data.datasets",
    # encryption
    "keygen": "fedgrove.crypto.he",
    # federations in one process (the same protocol code as `fedgrove party`)
    "run_vertical": "fedgrove.protocols.vertical.simulate",
    "run_horizontal": "fedgrove.protocols.horizontal.simulate",
    "run_hybridtree": "fedgrove.protocols.hybridtree.simulate",
    "run_federated_forest": "fedgrove.protocols.forest.simulate",
    "run_simfl": "fedgrove.protocols.simfl.simulate", "SimFLOptions": "fedgrove.protocols.simfl.party",
    "LSHParams": "fedgrove.protocols.simfl.lsh",
    "run_fvtree": "fedgrove.protocols.fvtree.simulate", "FVTreeOptions": "fedgrove.protocols.fvtree.party",
    "DPOptions": "fedgrove.protocols.fvtree.privacy",
}

__all__ = ["__version__", "FedgroveError", *_LAZY]


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'fedgrove' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value  # asked once
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
