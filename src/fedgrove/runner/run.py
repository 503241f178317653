"""Run the parties of a federation: one role on one Channel, whatever the transport."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from fedgrove.data.io import load_table
from fedgrove.engine.gbdt import GBDTParams
from fedgrove.engine.model import atomic_write_text
from fedgrove.exceptions import DataError
from fedgrove.log import logger
from fedgrove.runner.config import FederationConfig, PartySpec


def _load_party_data(spec: PartySpec, with_label: bool):
    table = load_table(spec.data, label=spec.label if with_label else None)
    if with_label and table.y is None:
        raise DataError(f"party {spec.name}: {spec.data} has no label column; set label = ... in its config")
    if table.ids is not None:  # align by instance ID: every party sorts its rows the same way
        order = np.argsort(table.ids, kind="stable")
        table.X, table.ids = table.X[order], table.ids[order]
        if table.y is not None:
            table.y = table.y[order]
    return table


def run_role(cfg: FederationConfig, spec: PartySpec, channel, he=None, resume: bool = False,
             progress=None) -> dict:
    """Train as ``spec`` on ``channel``; write this party's model and statistics; return a summary."""
    from fedgrove.runner.checkpoint import CheckpointStore

    t0 = time.perf_counter()
    params = GBDTParams(**cfg.params)
    out_dir = Path(cfg.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    checkpoint = CheckpointStore(out_dir / f"{spec.name}.checkpoint.json")
    if cfg.protocol == "vertical":
        from fedgrove.protocols.vertical.active import VerticalActive
        from fedgrove.protocols.vertical.passive import VerticalPassive

        others = [p.name for p in cfg.parties if p.name != spec.name]
        if spec.role == "active":
            from fedgrove.crypto.he import keygen

            table = _load_party_data(spec, with_label=True)
            he = he or keygen(cfg.he["scheme"], cfg.he["key_bits"], cfg.he.get("backend"))
            role = VerticalActive(channel, table.X, table.y, others, params, he, ids=table.ids)
            model = role.fit(checkpoint, resume, progress)
            from fedgrove.protocols.vertical.messages import ids_digest

            model.metadata.update({"protocol": "vertical", "party": spec.name,
                                   "ids_digest": ids_digest(table.ids).hex() or None})
            if params.objective != "regression":
                model.classes = list(range(model.n_classes))
            model.save(out_dir / f"{spec.name}.model.json")
            summary = {"trees": model.n_trees}
        else:
            active = next(p.name for p in cfg.parties if p.role == "active")
            table = _load_party_data(spec, with_label=False)
            role = VerticalPassive(channel, table.X, active, params.max_bins, params.seed, ids=table.ids)
            pmodel = role.fit(checkpoint, resume)
            atomic_write_text(out_dir / f"{spec.name}.model.json", json.dumps(pmodel.to_dict()))
            summary = {"owned_splits": len(pmodel.splits)}
    elif cfg.protocol == "horizontal":
        from fedgrove.protocols.horizontal.aggregator import HorizontalAggregator
        from fedgrove.protocols.horizontal.client import HorizontalClient

        if spec.role == "aggregator":
            clients = [p.name for p in cfg.parties if p.role == "client"]
            model = HorizontalAggregator(channel, clients, params).fit(checkpoint, resume, progress)
        else:
            aggregator = next(p.name for p in cfg.parties if p.role == "aggregator")
            table = _load_party_data(spec, with_label=True)
            model = HorizontalClient(channel, table.X, table.y, aggregator, params).fit(checkpoint, resume)
        model.metadata.update({"protocol": "horizontal", "party": spec.name})
        if params.objective != "regression":
            model.classes = list(range(model.n_classes))
        model.save(out_dir / f"{spec.name}.model.json")
        summary = {"trees": model.n_trees}
    elif cfg.protocol == "hybridtree":
        from fedgrove.protocols.hybridtree.guest import HybridGuest
        from fedgrove.protocols.hybridtree.host import HybridHost

        hd, gd = cfg.hybridtree["host_depth"], cfg.hybridtree["guest_depth"]
        if spec.role == "host":
            from fedgrove.crypto.he import keygen

            table = _load_party_data(spec, with_label=True)
            guests = [p.name for p in cfg.parties if p.role == "guest"]
            he = he or keygen(cfg.he["scheme"], cfg.he["key_bits"], cfg.he.get("backend"))
            hmodel = HybridHost(channel, table.X, table.y, guests, params, he, hd, gd, ids=table.ids,
                                mode=cfg.hybridtree["mode"]).fit(
                checkpoint, resume, progress)
            atomic_write_text(out_dir / f"{spec.name}.model.json", json.dumps(hmodel.to_dict()))
            summary = {"trees": len(hmodel.host_trees)}
        else:
            host = next(p.name for p in cfg.parties if p.role == "host")
            table = _load_party_data(spec, with_label=False)
            if table.ids is None:
                raise DataError(f"party {spec.name}: a guest's file needs an _id column linking it to the host")
            role = HybridGuest(channel, table.X, table.ids, host, params.max_bins, params.seed)
            role.fit(checkpoint, resume)
            atomic_write_text(out_dir / f"{spec.name}.model.json", json.dumps(role.model_dict()))
            summary = {"owned_splits": len(role.model.splits)}
    else:  # pragma: no cover - config validation stops this
        raise DataError(f"unknown protocol {cfg.protocol}")
    stats = {"party": spec.name, "role": spec.role, "seconds": time.perf_counter() - t0,
             **channel.stats.as_dict(), **summary}
    atomic_write_text(out_dir / f"{spec.name}.stats.json", json.dumps(stats, indent=2))
    logger.info("%s finished: %s", spec.name, stats)
    return stats


def simulate(cfg: FederationConfig, resume: bool = False, progress=None) -> dict:
    """All parties in this process, one thread each, messages through the codec."""
    from fedgrove.transport.inprocess import InProcessHub, run_parties

    hub = InProcessHub([p.name for p in cfg.parties])
    roles = {p.name: (lambda spec: (lambda ch: run_role(cfg, spec, ch, resume=resume, progress=progress)))(p)
             for p in cfg.parties}
    results, _ = run_parties(hub, roles, cfg.timeout)
    return results


def run_party(cfg: FederationConfig, spec: PartySpec, resume: bool = False, progress=None) -> dict:
    """This party alone, over gRPC with mutual TLS."""
    from fedgrove.transport.grpc_backend import GrpcChannel, TLSFiles

    certs = Path(spec.certs)
    for f in ("ca.pem", f"{spec.name}.pem", f"{spec.name}.key"):
        if not (certs / f).exists():
            raise DataError(f"party {spec.name}: {certs / f} not found; create certificates with `fedgrove certs`")
    tls = TLSFiles(certs / "ca.pem", certs / f"{spec.name}.pem", certs / f"{spec.name}.key")
    channel = GrpcChannel(spec.name, spec.listen, cfg.peers, tls, timeout=cfg.timeout)
    try:
        return run_role(cfg, spec, channel, resume=resume, progress=progress)
    finally:
        channel.close()
