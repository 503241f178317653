"""Run a Federated Forest (a master and several clients) in one process: threads, real codec."""

from __future__ import annotations

import time

import numpy as np

from fedgrove.engine.forest import ForestParams
from fedgrove.engine.params import Interval, check_types
from fedgrove.exceptions import InvalidParameterError
from fedgrove.protocols.forest.client import ForestClient, answer_predictions
from fedgrove.protocols.forest.master import ForestMaster, check_method
from fedgrove.protocols import check_vertical_rows, party_names, with_kernel_threads
from fedgrove.transport.inprocess import InProcessHub, run_parties


def run_federated_forest(X_parts: list[np.ndarray], y: np.ndarray, params: ForestParams, he=None,
                         mode: str = "encrypted", label_holder: int = 0, X_test_parts: list | None = None,
                         methods: tuple = ("one-round",), names: list[str] | None = None, timeout: float = 300.0,
                         observers: dict | None = None, sample_weight=None) -> dict:
    """Train with client ``label_holder`` holding ``y`` (and, in encrypted mode, the key pair ``he``; and the
    rows' weights ``sample_weight``, if given: :class:`~fedgrove.protocols.forest.client.ForestClient`); with
    ``X_test_parts`` predict the test set by each method in ``methods``.

    Returns the master's model, the clients' partial models, per method the test predictions (probabilities or
    values), the leaves and the master's traffic during that prediction, the training seconds and every
    party's channel statistics (``fit_stats``: up to the end of training).
    """
    check_types("run_federated_forest", params=(params, ForestParams))
    if X_test_parts is not None and len(X_test_parts) != len(X_parts):
        raise InvalidParameterError(f"X_test_parts has {len(X_test_parts)} parts for {len(X_parts)} clients: give "
                                    f"every client its test features, in the order of X_parts")
    if mode == "encrypted" and he is None:
        raise InvalidParameterError("mode 'encrypted' needs the label holder's key pair: he=keygen('ou', 2048) (or "
                                    "'paillier'); or mode='shared' to give every client the labels")
    names = party_names(names, len(X_parts), "client", "X_parts")
    check_vertical_rows(y, X_parts, X_test_parts)
    # a holder outside the clients failed as "exactly one client must hold the labels, found none"
    Interval(int, 0, len(X_parts) - 1).check("label_holder", label_holder)
    methods = (methods,) if isinstance(methods, str) else tuple(methods)  # "one-round" was read letter by letter
    for method in methods:  # before training, not after it
        check_method(method)
    hub = InProcessHub(["master"] + names)
    out: dict = {"fit_stats": {}, "predictions": {}, "leaves": {}, "predict_stats": {}}

    def watch(ch):
        for obs in (observers or {}).get(ch.party, []):
            ch.observers.append(obs)

    def master(ch):
        watch(ch)
        role = ForestMaster(ch, names, params, mode)
        t0 = time.perf_counter()
        model = role.fit()
        out["fit_seconds"] = time.perf_counter() - t0
        out["fit_stats"]["master"] = ch.stats.as_dict()
        if X_test_parts is not None:
            for method in methods:
                before = ch.stats.as_dict()
                t0 = time.perf_counter()
                leaves = role.predict_leaves(method)
                after = ch.stats.as_dict()
                out["leaves"][method] = leaves
                values = model._mean_values(leaves)
                out["predictions"][method] = values if model.task == "classification" else values[:, 0]
                out["predict_stats"][method] = {
                    "seconds": time.perf_counter() - t0,
                    "messages": after["messages_sent"] + after["messages_received"]
                    - before["messages_sent"] - before["messages_received"],
                    "bytes": after["total_sent"] + after["total_received"] - before["total_sent"]
                    - before["total_received"]}
        return model

    def client(k):
        def run(ch):
            watch(ch)
            holder = k == label_holder
            role = ForestClient(ch, X_parts[k], "master", y=y if holder else None, he=he if holder else None,
                                max_bins=params.max_bins, seed=params.seed,
                                sample_weight=sample_weight if holder else None)
            model = role.fit()
            out["fit_stats"][ch.party] = ch.stats.as_dict()
            if X_test_parts is not None:
                for _ in methods:
                    answer_predictions(ch, "master", model, X_test_parts[k])
            return model
        return run

    roles = {"master": master, **{names[k]: client(k) for k in range(len(names))}}
    results, channels = run_parties(hub, with_kernel_threads(roles, params.n_threads), timeout)
    out["model"] = results["master"]
    out["client_models"] = {n: results[n] for n in names}
    out["stats"] = {n: c.stats.as_dict() for n, c in channels.items()}
    return out
