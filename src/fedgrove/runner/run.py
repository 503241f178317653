"""Run the parties of a federation: one role on one Channel, whatever the transport."""

from __future__ import annotations

import json
import time
from pathlib import Path

from fedgrove.engine.model import atomic_write_text
from fedgrove.exceptions import DataError, InvalidParameterError
from fedgrove.log import logger
from fedgrove.runner.config import FederationConfig, PartySpec


def run_role(cfg: FederationConfig, spec: PartySpec, channel, he=None, resume: bool = False,
             progress=None, predict_only: bool = False) -> dict:
    """Train as ``spec`` on ``channel`` (unless ``predict_only``) and write this party's model; then, when the
    config lists test data, predict it from the model files; write this party's statistics; return them."""
    from fedgrove.runner.checkpoint import CheckpointStore
    from fedgrove.runner.roles import PREDICT, TRAIN, RoleContext

    t0 = time.perf_counter()
    out_dir = Path(cfg.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    ctx = RoleContext(cfg, spec, channel, he, resume, progress,
                      CheckpointStore(out_dir / f"{spec.name}.checkpoint.json"))
    predict = PREDICT.get((cfg.protocol, spec.role))
    if (predict_only or cfg.predict) and predict is None:  # said before training, not after it
        raise InvalidParameterError(f"the {cfg.protocol} protocol has no federated prediction: every party holds "
                                    f"the whole model; predict with `fedgrove predict` and leave test = ... out of "
                                    f"the config (or set federation.predict = false)")
    summary = {} if predict_only else TRAIN[(cfg.protocol, spec.role)](ctx)
    if predict_only or cfg.predict:
        with channel.scope(stage="predict"):
            summary.update(predict(ctx))
    stats = {"party": spec.name, "role": spec.role, "seconds": time.perf_counter() - t0,
             **channel.stats.as_dict(), **summary}
    stats_file = f"{spec.name}.predict-stats.json" if predict_only else f"{spec.name}.stats.json"
    atomic_write_text(out_dir / stats_file, json.dumps(stats, indent=2))
    logger.info("%s finished: %s", spec.name, stats)
    return stats


def simulate(cfg: FederationConfig, resume: bool = False, progress=None, predict_only: bool = False) -> dict:
    """All parties in this process, one thread each, messages through the codec."""
    from fedgrove.transport.inprocess import InProcessHub, run_parties

    hub = InProcessHub([p.name for p in cfg.parties])
    roles = {p.name: (lambda spec: (lambda ch: run_role(cfg, spec, ch, resume=resume, progress=progress,
                                                        predict_only=predict_only)))(p)
             for p in cfg.parties}
    results, _ = run_parties(hub, roles, cfg.timeout)
    return results


def run_party(cfg: FederationConfig, spec: PartySpec, resume: bool = False, progress=None,
              predict_only: bool = False) -> dict:
    """This party alone, over gRPC with mutual TLS."""
    from fedgrove.transport.grpc_backend import GrpcChannel, TLSFiles

    certs = Path(spec.certs)
    for f in ("ca.pem", f"{spec.name}.pem", f"{spec.name}.key"):
        if not (certs / f).exists():
            raise DataError(f"party {spec.name}: {certs / f} not found; create certificates with `fedgrove certs`")
    tls = TLSFiles(certs / "ca.pem", certs / f"{spec.name}.pem", certs / f"{spec.name}.key")
    channel = GrpcChannel(spec.name, spec.listen, cfg.peers, tls, timeout=cfg.timeout,
                          startup_timeout=cfg.startup_timeout)
    try:
        return run_role(cfg, spec, channel, resume=resume, progress=progress, predict_only=predict_only)
    except BaseException as exc:
        if channel.failure is None:  # the peers stop waiting and say why (not when it was a peer's failure)
            channel.notify_failure(exc)
        raise
    finally:
        channel.close()
