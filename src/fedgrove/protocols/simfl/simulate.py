"""Run a SimFL federation in one process: one thread per party, real codec."""

from __future__ import annotations

from fedgrove.engine.gbdt import GBDTParams
from fedgrove.engine.params import Flag, check_types
from fedgrove.exceptions import InvalidParameterError
from fedgrove.protocols.simfl.party import SimFLOptions, SimFLParty
from fedgrove.protocols import check_parts, party_names, with_kernel_threads
from fedgrove.runner.run import agree_resume
from fedgrove.transport.inprocess import InProcessHub, run_parties


def run_simfl(parts: list[tuple], params: GBDTParams, options: SimFLOptions | None = None,
              names: list[str] | None = None, timeout: float = 600.0, observers: dict | None = None,
              caches: dict | None = None, checkpoints: dict | None = None, resume: bool = False,
              sample_weight: list | None = None) -> dict:
    """``parts`` holds each party's (X, y) or (X, y, ids); ``sample_weight``, if given, each party's row weights
    (or None for a party whose rows weigh 1: :class:`~fedgrove.protocols.simfl.party.SimFLParty`).  ``caches``
    and ``checkpoints`` map party names to where its preprocessing is saved and to a checkpoint store
    (``resume``: continue from them, after the fewest trees every party's checkpoint holds, as ``fedgrove
    simulate`` does).  Returns each party's model (all equal),
    the similarity each computed, timings and channel statistics."""
    check_types("run_simfl", params=(params, GBDTParams), options=(options, (SimFLOptions, type(None))))
    check_parts(parts, "parts", "a tuple (X, y) or (X, y, ids)", (2, 3))
    Flag().check("resume", resume)  # a string such as "no" was taken as true
    names = party_names(names, len(parts), "party", "parts")
    if sample_weight is not None and (not isinstance(sample_weight, (list, tuple)) or len(sample_weight) != len(parts)):
        raise InvalidParameterError(f"sample_weight must be a list of one party's weights (or None) per part, "
                                    f"{len(parts)}, got {type(sample_weight).__name__}"
                                    + (f" of {len(sample_weight)}" if isinstance(sample_weight, (list, tuple)) else ""))
    hub = InProcessHub(names)
    agree = all((checkpoints or {}).get(n) is not None for n in names)  # (else the leader's store decides)
    out = {"timings": {}, "similarity": {}}

    def role(k):
        def run(ch):
            for obs in (observers or {}).get(ch.party, []):
                ch.observers.append(obs)
            X, y, *rest = parts[k]
            party = SimFLParty(ch, X, y, params, options, ids=rest[0] if rest else None,
                               cache=(caches or {}).get(ch.party),
                               sample_weight=None if sample_weight is None else sample_weight[k])
            store = (checkpoints or {}).get(ch.party)
            if resume and agree:  # a party a tree ahead of a peer that stopped steps back to where both are
                store.limit = agree_resume(store.trees_done(store.newest()), ch)
            model = party.fit(store, resume)
            out["timings"][ch.party] = party.timings
            out["similarity"][ch.party] = party.similarity
            return model
        return run

    roles = {n: role(k) for k, n in enumerate(names)}
    results, channels = run_parties(hub, with_kernel_threads(roles, params.n_threads), timeout)
    out["models"] = results
    out["model"] = results[names[0]]
    out["stats"] = {n: c.stats.as_dict() for n, c in channels.items()}
    return out
