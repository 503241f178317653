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
    check_types("run_horizontal", params=(params, GBDTParams))
    check_parts(client_data, "client_data", "a tuple (X, y)")
    names = [f"client{k}" for k in range(len(client_data))]
    hub = InProcessHub(["aggregator"] + names)

    def aggregator(ch):
        for obs in (observers or {}).get("aggregator", []):
            ch.observers.append(obs)
        return HorizontalAggregator(ch, names, params, contributions).fit()

    roles = {"aggregator": aggregator}
    for name, (X, y) in zip(names, client_data):
        roles[name] = (lambda X, y: (lambda ch: HorizontalClient(ch, X, y, "aggregator", params,
                                                                contributions).fit()))(X, y)
    results, channels = run_parties(hub, with_kernel_threads(roles, params.n_threads), timeout)
    # the aggregator holds no data: its model takes the clients' feature names (checked equal at the start)
    results["aggregator"].feature_names = results[names[0]].feature_names
    return {"model": results["aggregator"], "client_models": {n: results[n] for n in names},
            "stats": {n: c.stats.as_dict() for n, c in channels.items()}}
