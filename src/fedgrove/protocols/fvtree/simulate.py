"""Run an FV-tree federation in one process: one thread per party, real codec, optional ledger files."""

from __future__ import annotations

from pathlib import Path

from fedgrove.engine.gbdt import GBDTParams
from fedgrove.engine.params import Flag, check_types
from fedgrove.ledger.store import Ledger
from fedgrove.protocols.fvtree.party import FVTreeOptions, FVTreeParty
from fedgrove.protocols import check_parts, party_names, with_kernel_threads
from fedgrove.transport.inprocess import InProcessHub, run_parties


def run_fvtree(parts: list[tuple], params: GBDTParams, options: FVTreeOptions | None = None,
               names: list[str] | None = None, ledger_dir=None, timeout: float = 600.0,
               observers: dict | None = None, tamper: dict | None = None, keys: dict | None = None,
               checkpoints: dict | None = None, resume: bool = False, progress: dict | None = None) -> dict:
    """``parts`` holds each party's (X, y).  With ``ledger_dir`` every party keeps ``<party>.ledger.sqlite`` there.
    ``tamper`` maps a party name to a function applied to its ``FVTreeParty`` before training (tests of
    dishonest parties).  ``keys``, ``checkpoints`` and ``progress`` map party names to a signing key, a
    checkpoint store and a progress callback; ``resume`` continues from the checkpoints.  Returns the models
    (every party's: equal), contributions and channel statistics."""
    check_types("run_fvtree", params=(params, GBDTParams), options=(options, (FVTreeOptions, type(None))))
    check_parts(parts, "parts", "a tuple (X, y)")
    Flag().check("resume", resume)  # a string such as "no" was taken as true
    names = party_names(names, len(parts), "party", "parts")
    hub = InProcessHub(names)
    out = {"parties": {}}

    def role(k):
        def run(ch):
            for obs in (observers or {}).get(ch.party, []):
                ch.observers.append(obs)
            ledger = Ledger(Path(ledger_dir) / f"{ch.party}.ledger.sqlite") if ledger_dir else None
            try:
                party = FVTreeParty(ch, parts[k][0], parts[k][1], params, options, ledger=ledger,
                                    key=(keys or {}).get(ch.party))
                if tamper and ch.party in tamper:
                    tamper[ch.party](party)
                model = party.fit((checkpoints or {}).get(ch.party), resume, (progress or {}).get(ch.party))
            finally:
                if ledger is not None:
                    ledger.close()
            out["parties"][ch.party] = party
            return model
        return run

    roles = {n: role(k) for k, n in enumerate(names)}
    results, channels = run_parties(hub, with_kernel_threads(roles, params.n_threads), timeout)
    out["models"] = results
    out["model"] = results[names[0]]
    out["stats"] = {n: c.stats.as_dict() for n, c in channels.items()}
    return out
