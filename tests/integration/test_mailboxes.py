"""Every message a protocol sends is taken: after an in-process run no mailbox is left over.

A message nobody reads keeps its queue (about 4 kB) for the rest of the process; SimFL's parties without a
similarity to reuse left their peers' cache statuses unread.
"""

import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer

from fedgrove import (FVTreeOptions, ForestParams, GBDTParams, keygen, run_federated_forest, run_fvtree,
                      run_horizontal, run_hybridtree, run_simfl, run_vertical)
from fedgrove.transport import inprocess

PROTOCOLS = ["vertical", "horizontal", "hybridtree", "forest", "simfl", "fvtree"]


@pytest.fixture
def hubs(monkeypatch):
    made = []
    init = inprocess.InProcessHub.__init__

    def recording(self, *args, **kw):
        init(self, *args, **kw)
        made.append(self)

    monkeypatch.setattr(inprocess.InProcessHub, "__init__", recording)
    return made


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_no_message_is_left_unread_after_a_run(protocol, hubs):
    X, y = load_breast_cancer(return_X_y=True)
    train, test = np.arange(400), np.arange(400, 460)
    X, Xt, y = X[train], X[test], y[train]
    params = GBDTParams(objective="binary", n_estimators=3, max_depth=3, max_bins=8, seed=0)
    he = keygen("ou", 2048, "plain")
    cols = [slice(0, 10), slice(10, 20), slice(20, 30)]
    thirds = [(X[k::3], y[k::3]) for k in range(3)]
    if protocol == "vertical":
        run_vertical([X[:, c] for c in cols], y, params, he, X_test_parts=[Xt[:, c] for c in cols])
    elif protocol == "horizontal":
        run_horizontal(thirds, params)
    elif protocol == "hybridtree":
        guests = [(X[u::3, 15:], train[u::3]) for u in range(3)]
        run_hybridtree(X[:, :15], y, guests, params, he, host_depth=2, guest_depth=1, X_test_host=Xt[:, :15],
                       test_guests=[(Xt[:, 15:], np.arange(len(test)))] * 3)
    elif protocol == "forest":
        run_federated_forest([X[:, c] for c in cols], y, ForestParams(n_estimators=3, seed=0), he=he,
                             X_test_parts=[Xt[:, c] for c in cols])
    elif protocol == "simfl":
        run_simfl(thirds, params)
    else:
        run_fvtree(thirds, params, FVTreeOptions(threshold=1.0))
    assert hubs, "the run made no in-process hub"
    for hub in hubs:
        assert hub.mailboxes.keys() == [], f"{protocol}: messages left unread"
