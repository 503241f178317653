"""Run a HybridTree federation (one host, several guests) in one process."""

from __future__ import annotations

from fedgrove.protocols.hybridtree.guest import HybridGuest
from fedgrove.protocols.hybridtree.host import HybridHost
from fedgrove.transport.inprocess import InProcessHub, run_parties


def run_hybridtree(X_host, y, guests: list[tuple], params, he, host_depth: int, guest_depth: int,
                   timeout: float = 300.0):
    """``guests`` is a list of (X_guest, ids) pairs; ids index the host's rows."""
    names = [f"guest{k}" for k in range(len(guests))]
    hub = InProcessHub(["host"] + names)
    holder = {}

    def host(ch):
        role = HybridHost(ch, X_host, y, names, params, he, host_depth, guest_depth)
        model = role.fit()
        holder["raw"] = role.raw
        return model

    roles = {"host": host}
    for name, (Xg, ids) in zip(names, guests):
        roles[name] = (lambda Xg, ids: (lambda ch: HybridGuest(ch, Xg, ids, "host", params.max_bins,
                                                               params.seed).fit()))(Xg, ids)
    results, channels = run_parties(hub, roles, timeout)
    return {"model": results["host"], "raw": holder["raw"], "guest_models": {n: results[n] for n in names},
            "stats": {n: c.stats.as_dict() for n, c in channels.items()}}
