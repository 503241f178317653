"""Run a HybridTree federation (one host, several guests) in one process."""

from __future__ import annotations

from fedgrove.crypto.he import HEContext
from fedgrove.engine.gbdt import GBDTParams
from fedgrove.engine.params import check_types
from fedgrove.exceptions import InvalidParameterError
from fedgrove.protocols import check_parts, with_kernel_threads
from fedgrove.protocols.hybridtree.guest import HybridGuest
from fedgrove.protocols.hybridtree.host import HybridHost
from fedgrove.transport.inprocess import InProcessHub, run_parties


def run_hybridtree(X_host, y, guests: list[tuple], params, he, host_depth: int, guest_depth: int,
                   timeout: float = 300.0, X_test_host=None, test_guests: list[tuple] | None = None,
                   mode: str = "hessian", host_ids=None, shared_only: bool = False,
                   rows_per_ciphertext: int | None = None, sample_weight=None):
    """``guests`` is a list of (X_guest, ids) pairs; ids index the host's rows (or are ``host_ids``, the IDs
    of the host's rows; with ``shared_only`` guests may hold IDs the host lacks: one host of several).  With
    ``X_test_host`` and ``test_guests`` (the guests' test rows and their test IDs) the host also predicts the
    test set.  Returns the host's model, its training scores ``raw`` and test scores ``test_raw`` (arrays of
    rows x outputs: one column for binary and regression), the guests' models and channel statistics.  The
    trees are ``host_depth + guest_depth`` deep; ``params.max_depth`` is not read (a federation config's
    ``max_depth`` sets the two: :func:`fedgrove.runner.config.hybrid_depths`).  ``rows_per_ciphertext``:
    instances per gradient ciphertext in hessian mode (default by scheme: 3 for Paillier, 1 for OU).
    ``sample_weight``: the host's rows' weights (hessian mode; see :class:`HybridHost`)."""
    check_types("run_hybridtree", params=(params, GBDTParams), he=(he, HEContext))
    check_parts(guests, "guests", "a tuple (X_guest, ids)")
    if (X_test_host is None) != (test_guests is None):
        raise InvalidParameterError("give X_test_host and test_guests together: the host and the guests each hold "
                                    "their part of the test instances")
    if test_guests is not None:
        check_parts(test_guests, "test_guests", "a tuple (X_guest_test, test_ids)", n=len(guests))
    names = [f"guest{k}" for k in range(len(guests))]
    hub = InProcessHub(["host"] + names)
    holder = {"fit_stats": {}}

    def host(ch):
        role = HybridHost(ch, X_host, y, names, params, he, host_depth, guest_depth, mode=mode, ids=host_ids,
                          shared_only=shared_only, rows_per_ciphertext=rows_per_ciphertext,
                          sample_weight=sample_weight)
        model = role.fit()
        holder["fit_stats"]["host"] = ch.stats.as_dict()
        holder["raw"], holder["tree_seconds"] = role.raw, role.tree_seconds
        if X_test_host is not None:
            holder["test_raw"] = role.predict_raw(model, X_test_host)
        return model

    roles = {"host": host}
    def guest(k, Xg, ids):
        def run(ch):
            role = HybridGuest(ch, Xg, ids, "host", params.max_bins, params.seed)
            model = role.fit()
            holder["fit_stats"][ch.party] = ch.stats.as_dict()
            if X_test_host is not None and guest_depth > 0:
                role.predict(*test_guests[k])
            return model
        return run

    for k, (name, (Xg, ids)) in enumerate(zip(names, guests)):
        roles[name] = guest(k, Xg, ids)
    results, channels = run_parties(hub, with_kernel_threads(roles, params.n_threads), timeout)
    return {"model": results["host"], "raw": holder["raw"], "test_raw": holder.get("test_raw"),
            "guest_models": {n: results[n] for n in names},
            "stats": {n: c.stats.as_dict() for n, c in channels.items()},
            "fit_stats": holder["fit_stats"], "tree_seconds": holder["tree_seconds"]}


def predict_hybridtree(host_model: dict, guest_models: dict, X_test_host, test_guests: dict,
                       timeout: float = 300.0):
    """Two-round inference in one process from per-party model files (their dicts): the host uses only its
    file, each guest only its own.  ``test_guests[name]`` is that guest's (X_test, test IDs)."""
    from fedgrove.protocols.hybridtree.host import HybridHostModel, predict_hybrid

    names = sorted(guest_models)
    hub = InProcessHub(["host"] + names)
    model = HybridHostModel.from_dict(host_model)
    roles = {"host": lambda ch: predict_hybrid(ch, names, model, X_test_host)}
    for name in names:
        def guest(ch, name=name):
            X, ids = test_guests[name]
            HybridGuest.from_model(ch, guest_models[name], "host").predict(X, ids)
        roles[name] = guest
    results, _ = run_parties(hub, roles, timeout)
    return results["host"]
