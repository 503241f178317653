"""Run a horizontal federation (aggregator + clients) in one process."""

from __future__ import annotations

from fedgrove.engine.gbdt import GBDTParams
from fedgrove.engine.params import check_types
from fedgrove.protocols.horizontal.aggregator import HorizontalAggregator
from fedgrove.protocols.horizontal.client import HorizontalClient
from fedgrove.protocols import check_parts, with_kernel_threads
from fedgrove.transport.inprocess import InProcessHub, run_parties


def run_horizontal(client_data: list[tuple], params: GBDTParams, timeout: float = 120.0, observers=None,
                   contributions: bool = False):
    """Train with an aggregator and one client per item of ``client_data`` (each client's (X, y), or
    (X, y, sample_weight): the same features, different instances); lossless: the trees are the engine's on the
    union of the clients' rows (and weights).
    ``contributions``: each client's split Shapley value goes into the model's metadata (it reveals each
    client's gradient sums at the chosen splits to the aggregator).  Returns the aggregator's ``model``, the
    clients' ``client_models`` (equal to it) and every party's channel statistics."""
    check_types("run_horizontal", params=(params, GBDTParams))
    check_parts(client_data, "client_data", "a tuple (X, y) or (X, y, sample_weight)", sizes=(2, 3))
    names = [f"client{k}" for k in range(len(client_data))]
    hub = InProcessHub(["aggregator"] + names)

    def aggregator(ch):
        for obs in (observers or {}).get("aggregator", []):
            ch.observers.append(obs)
        return HorizontalAggregator(ch, names, params, contributions).fit()

    roles = {"aggregator": aggregator}
    for name, (X, y, *w) in zip(names, client_data):
        roles[name] = (lambda X, y, w: (lambda ch: HorizontalClient(ch, X, y, "aggregator", params, contributions,
                                                                   sample_weight=w).fit()))(X, y, w[0] if w else None)
    results, channels = run_parties(hub, with_kernel_threads(roles, params.n_threads), timeout)
    # the aggregator holds no data: its model takes the clients' feature names (checked equal at the start)
    results["aggregator"].feature_names = results[names[0]].feature_names
    return {"model": results["aggregator"], "client_models": {n: results[n] for n in names},
            "stats": {n: c.stats.as_dict() for n, c in channels.items()}}
