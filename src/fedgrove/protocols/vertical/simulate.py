"""Run a whole vertical federation in one process (threads, real codec)."""

from __future__ import annotations

import numpy as np

from fedgrove.crypto.he import HEContext
from fedgrove.engine.gbdt import GBDTParams
from fedgrove.engine.params import check_types
from fedgrove.exceptions import InvalidParameterError
from fedgrove.protocols.vertical.active import VerticalActive
from fedgrove.protocols.vertical.passive import VerticalPassive
from fedgrove.protocols import check_vertical_rows, party_names, with_kernel_threads
from fedgrove.transport.inprocess import InProcessHub, run_parties


def run_vertical(X_parts: list[np.ndarray], y: np.ndarray, params: GBDTParams, he: HEContext,
                 X_test_parts: list[np.ndarray] | None = None, names: list[str] | None = None,
                 timeout: float = 120.0, observers: dict | None = None, rows_per_ciphertext: int | None = None,
                 sample_weight=None):
    """Train (and optionally predict) with party 0 active and the others passive (``rows_per_ciphertext``:
    instances per gradient ciphertext, default by scheme: :func:`default_rows_per_ciphertext`;
    ``sample_weight``: each instance's weight, which the active party holds with the labels).

    Returns a dict with the active model, the passive models, the test raw
    scores (if ``X_test_parts``) and each party's channel statistics.
    """
    check_types("run_vertical", params=(params, GBDTParams), he=(he, HEContext))
    names = party_names(names, len(X_parts), "party", "X_parts")
    check_vertical_rows(y, X_parts, X_test_parts)
    if X_test_parts is not None and len(X_test_parts) != len(X_parts):
        raise InvalidParameterError(f"X_test_parts has {len(X_test_parts)} parts for {len(X_parts)} parties: give "
                                    f"every party its test features, in the order of X_parts")
    active_name, passive_names = names[0], names[1:]
    hub = InProcessHub(names)
    fit_stats = {}  # each party's traffic up to the end of its training (prediction excluded)

    def active(ch):
        for obs in (observers or {}).get(active_name, []):
            ch.observers.append(obs)
        role = VerticalActive(ch, X_parts[0], y, passive_names, params, he, rows_per_ciphertext=rows_per_ciphertext,
                              sample_weight=sample_weight)
        model = role.fit()
        fit_stats[ch.party] = ch.stats.as_dict()
        raw = role.predict_raw(X_test_parts[0]) if X_test_parts is not None else None
        return model, raw, role.tree_seconds

    def passive(k):
        def run(ch):
            for obs in (observers or {}).get(names[k], []):
                ch.observers.append(obs)
            role = VerticalPassive(ch, X_parts[k], active_name, params.max_bins, params.seed)
            model = role.fit()
            fit_stats[ch.party] = ch.stats.as_dict()
            if X_test_parts is not None:
                role.predict(X_test_parts[k])
            return model
        return run

    roles = {active_name: active, **{names[k]: passive(k) for k in range(1, len(names))}}
    results, channels = run_parties(hub, with_kernel_threads(roles, params.n_threads), timeout)
    model, raw, tree_seconds = results[active_name]
    return {"model": model, "passive_models": {n: results[n] for n in passive_names}, "raw": raw,
            "stats": {n: c.stats.as_dict() for n, c in channels.items()}, "fit_stats": fit_stats,
            "tree_seconds": tree_seconds}
