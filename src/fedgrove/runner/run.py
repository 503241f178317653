"""Run the parties of a federation: one role on one Channel, whatever the transport."""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from pathlib import Path

from fedgrove.engine.model import atomic_write_text
from fedgrove.exceptions import DataError, InvalidParameterError, ProtocolError
from fedgrove.log import logger
from fedgrove.runner.config import USES_HE, FederationConfig, PartySpec, canonical, shown_setting
from fedgrove.transport.addresses import address_host, is_loopback
from fedgrove._cores import available_cores


def run_role(cfg: FederationConfig, spec: PartySpec, channel, he=None, resume: bool = False,
             progress=None, predict_only: bool = False) -> dict:
    """Train as ``spec`` on ``channel`` (unless ``predict_only``) and write this party's model; then, when the
    config lists test data, predict it from the model files; write this party's statistics; return them."""
    from fedgrove.engine.threads import thread_limit

    with thread_limit(kernel_threads(cfg, spec)):  # numba's setting is per thread: this party's alone
        return _run_role(cfg, spec, channel, he, resume, progress, predict_only)


def kernel_threads(cfg: FederationConfig, spec: PartySpec) -> int:
    """The threads of this party's numba kernels: ``[params] n_threads`` when its config gives it, else this
    machine's cores shared by the parties that run on it: every party of a federation simulated in one
    process, or (``fedgrove party``) this party and its peers at loopback addresses or at the host it listens
    on.  Each party's kernels
    asking for every core meant OpenMP teams of several parties spinning for the same cores
    (``bench/runner.py`` times both)."""
    n = cfg.make_params().n_threads
    if n is not None:
        return int(n)
    cores = available_cores()  # a container's CPU limit counts
    if cfg.peers:  # one party of a federation, over gRPC
        own = address_host(spec.listen or "")
        sharing = 1 + sum(is_loopback(addr) or (own not in _ANY_HOST and address_host(addr) == own)
                          for addr in cfg.peers.values())
    else:
        sharing = len(cfg.parties)
    threads = max(1, cores // max(1, sharing))
    logger.debug("%s: %d kernel thread(s): %d cores shared by %d parties on this machine ([params] n_threads "
                 "sets it)", spec.name, threads, cores, sharing)
    return threads


def _limit_he_threads(cfg: FederationConfig, who: str) -> None:
    """HEU's thread pool (and gmpy2's OU decryption) of ``[params] n_threads`` threads when the config gives it,
    as the kernels (HEU's default, every core, otherwise: a protocol's parties mostly encrypt and sum in turn,
    not at once)."""
    n = cfg.make_params().n_threads
    if n is not None and cfg.he.get("backend") in (None, "heu", "gmpy2") and cfg.protocol in USES_HE:
        from fedgrove.crypto.he import limit_heu_threads

        size = limit_heu_threads(int(n))
        logger.debug("%s: homomorphic encryption on %s", who, f"{size} thread(s)" if size else "every core")


_ANY_HOST = ("", "0.0.0.0", "::", "*")  # listen addresses that name no one host
# seconds a party whose TLS handshake with a peer failed keeps its port open before it exits: a peer that comes
# up meanwhile meets the failed handshake and says why, instead of waiting out its startup timeout (300 s) for
# a party that was gone, then saying that nothing answered
HANDSHAKE_LINGER = 10.0


def _run_role(cfg, spec, channel, he, resume, progress, predict_only) -> dict:
    from fedgrove.runner.checkpoint import CheckpointStore
    from fedgrove.runner.roles import PREDICT, TRAIN, RoleContext, grows_no_trees

    t0 = time.perf_counter()
    out_dir = Path(cfg.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    ctx = RoleContext(cfg, spec, channel, he, resume, progress,
                      CheckpointStore(out_dir / f"{spec.name}.checkpoint.json"))
    ctx.checkpoint.every = cfg.checkpoint_every
    if not predict_only:  # every checkpoint names the run that wrote it, so that --resume can tell another's
        ctx.checkpoint.run = run_record(cfg, spec)
    predict = PREDICT[(cfg.protocol, spec.role)]
    if ctx.holds_key and not predict_only:  # before the first message: the peers' timeout is not running yet
        ctx.key_pair()
    check_same_settings(cfg, spec, channel, "predict" if predict_only else "train")
    if resume and not predict_only:
        newest = ctx.checkpoint.newest()
        if cfg.protocol != "fvtree":  # (FV-tree agrees on its own, stepping its ledger back too)
            mine = None if grows_no_trees(cfg, spec.role) else ctx.checkpoint.trees_done(newest)
            ctx.checkpoint.limit = agree_resume(mine, channel)
        _check_checkpoint_fits(cfg, ctx, newest)
    summary = {} if predict_only else TRAIN[(cfg.protocol, spec.role)](ctx)
    if not predict_only:  # the earlier model's predictions would sit beside the new model as if they were its
        stale = [out_dir / f"{spec.name}.predict-stats.json"] + ([] if cfg.predict else
                                                                 [out_dir / f"{spec.name}.predictions.csv"])
        for f in stale:
            if f.exists():
                f.unlink()
                logger.info("%s: removed %s, which an earlier model wrote", spec.name, f)
        ledger = out_dir / f"{spec.name}.ledger.sqlite"
        if cfg.protocol != "fvtree" and ledger.exists():  # kept (append-only, an audit record), but not this run's
            logger.info("%s: %s is an earlier FV-tree run's ledger, not this %s run's (which keeps none); the "
                        "model files here are now this run's", spec.name, ledger, cfg.protocol)
    if predict_only or cfg.predict:
        with channel.scope(stage="predict"):
            summary.update(predict(ctx))
    stats = {"party": spec.name, "role": spec.role, "federation": [p.name for p in cfg.parties],
             "seconds": time.perf_counter() - t0, **channel.stats.as_dict(), **summary}
    stats_file = f"{spec.name}.predict-stats.json" if predict_only else f"{spec.name}.stats.json"
    atomic_write_text(out_dir / stats_file, json.dumps(stats, indent=2))
    logger.debug("%s finished: %s", spec.name, stats)
    return stats


#: settings a resumed run may change: more trees, whether test data is predicted, and how often to checkpoint
RESUMABLE = ("params.n_estimators", "federation.predict", "federation.checkpoint_every")


#: a party's own settings that decide what it reads from its data file (the label, the row weights, the features)
READS = ("label", "weight", "categorical", "n_features", "libsvm_base")


def run_record(cfg: FederationConfig, spec: PartySpec) -> dict:
    """What a checkpoint must have been written under to be resumed: the party, its role, the federation's
    shared settings (but :data:`RESUMABLE`), how the party reads its data file (:data:`READS`) and the file's
    SHA-256."""
    settings = {k: v for k, v in canonical(cfg.shared_settings()).items() if k not in RESUMABLE}
    record = {"party": spec.name, "role": spec.role,
              "settings": json.loads(json.dumps(settings, sort_keys=True, default=str)),
              "reads": json.loads(json.dumps({k: getattr(spec, k) for k in READS}, sort_keys=True, default=str))}
    data = Path(str(spec.data)) if spec.data is not None else None
    if data is not None and data.is_file():
        with open(data, "rb") as fh:
            record["data_sha256"] = hashlib.file_digest(fh, "sha256").hexdigest()
    return record


def _differences(before: dict, now: dict, data) -> list[str]:
    """How the run that wrote a checkpoint (``before``) differs from this one, in words."""
    out = [f"{k} {before.get(k)!r} there, {now.get(k)!r} here" for k in ("party", "role")
           if before.get(k) != now.get(k)]
    a, b = before.get("settings") or {}, now["settings"]
    keys = sorted(a.keys() | b.keys())
    if a.get("federation.protocol") != b.get("federation.protocol"):  # the rest follows from it
        keys = ["federation.protocol"]
    out += [f"{k}: {shown_setting(a.get(k))!r} there, {shown_setting(b.get(k))!r} here" for k in keys
            if json.dumps(a.get(k), sort_keys=True) != json.dumps(b.get(k), sort_keys=True)]
    if "reads" in before:  # (checkpoints before 2026-11-28 name none)
        a, b = before["reads"] or {}, now["reads"]
        out += [f"the party's {k} {a.get(k)!r} there, {b.get(k)!r} here" for k in READS
                if json.dumps(a.get(k), sort_keys=True) != json.dumps(b.get(k), sort_keys=True)]
    if before.get("data_sha256") != now.get("data_sha256"):
        out.append(f"the data file {data} has changed since")
    return out


def _check_checkpoint_fits(cfg: FederationConfig, ctx, state: dict | None) -> None:
    """Refuse to resume from a checkpoint that another run wrote (another protocol, role, settings or data), or
    that holds more rounds than the config asks for: the model would keep them all while its parameters said
    fewer (a run is extended by raising n_estimators, not shortened).  ``state``: the newest checkpoint."""
    before = None if state is None else state.get("run")
    if isinstance(before, dict) and ctx.checkpoint.run is not None:  # (checkpoints before 2026-11-24 name none)
        diffs = _differences(before, ctx.checkpoint.run, ctx.spec.data)
        if diffs:
            shown = "; ".join(diffs[:6]) + ("; ..." if len(diffs) > 6 else "")
            raise InvalidParameterError(f"--resume: {ctx.checkpoint.path} was written by another run ({shown}); "
                                        f"resume with the settings and data it was trained on, or train anew "
                                        f"(without --resume, or into another output directory)")
    rounds = None if state is None else ctx.checkpoint.rounds(state)
    wanted = cfg.make_params().n_estimators
    if rounds is not None and rounds > wanted:
        raise InvalidParameterError(f"{ctx.spec.name}'s checkpoint holds {rounds} rounds, more than n_estimators = "
                                    f"{wanted}: resume with n_estimators >= {rounds}, or train anew (without "
                                    f"--resume, or into another output directory)")
    if rounds is not None and rounds == wanted:  # (the model and predictions are written again from it)
        logger.info("%s: its checkpoint already holds the %d rounds n_estimators asks for; raise n_estimators to "
                    "grow the model further", ctx.spec.name, wanted)


def agree_resume(mine: int | None, channel) -> int:
    """The trees every party's checkpoint holds: each tells every peer how many its newest holds (``mine``; None
    for a party that takes part in no tree, a HybridTree guest of no layers, which never checkpoints), and the
    run resumes from the fewest.  A party may have stopped after its peers checkpointed a tree and before it did:
    a leading party a tree ahead steps back to its previous state, and the others load the state of the tree it
    names (:meth:`~fedgrove.runner.checkpoint.CheckpointStore.load`)."""
    from fedgrove.runner.messages import Checkpointed

    peers = sorted(channel.peers)
    with channel.scope(stage="resume"):
        channel.broadcast("checkpointed", Checkpointed(-1 if mine is None else mine), peers)
        theirs = channel.gather("checkpointed", Checkpointed, peers)
    bad = [f"{p} ({theirs[p].trees})" for p in peers if theirs[p].trees < -1]
    if bad:
        raise ProtocolError(f"{channel.party}: {', '.join(bad)} said its checkpoint holds a negative number of "
                            f"trees")
    counts = [n for n in [mine] + [theirs[p].trees for p in peers] if n is not None and n >= 0]
    fewest = min(counts, default=0)
    if mine is not None and fewest < mine:
        low = [p for p in peers if theirs[p].trees == fewest]
        logger.info("%s: its checkpoint holds %d trees, %s's %d: the federation resumes after %d", channel.party,
                    mine, ", ".join(low), fewest, fewest)
    return fewest


def check_same_settings(cfg: FederationConfig, spec: PartySpec, channel, task: str,
                        version: str | None = None) -> None:
    """Every party sends every other its :meth:`FederationConfig.shared_settings` (and whether it trains or only
    predicts, and its fedgrove ``version``) and refuses to start, naming the settings, when a peer's differ:
    parties given other numbers of trees or other schedules would otherwise wait on each other until a timeout
    blamed a peer for stalling, and parties of other versions may not read each other's messages."""
    from fedgrove import __version__
    from fedgrove.runner.messages import Settings

    mine = {**cfg.shared_settings(), "task": task, "fedgrove": version or __version__}
    if task == "predict":  # --predict predicts whatever the configs say
        mine["federation.predict"] = True
    text = json.dumps(mine, sort_keys=True, default=str)
    peers = sorted(channel.peers)
    with channel.scope(stage="settings"):
        channel.broadcast("settings", Settings(text), peers)
        theirs = channel.gather("settings", Settings, peers)
    for peer in peers:
        if theirs[peer].text == text:
            continue
        try:
            other = json.loads(theirs[peer].text)
        except json.JSONDecodeError:
            other = {}
        if not isinstance(other, dict):
            other = {}
        # a party need not know every other (a peer's peers may differ): roles are compared where both know them
        known = other.get("roles") if isinstance(other.get("roles"), dict) else {}
        both = mine["roles"].keys() & known.keys()
        mine_cmp = {**mine, "roles": {n: mine["roles"][n] for n in both}}
        other_cmp = {**other, "roles": {n: known[n] for n in both}}
        a, b = canonical(mine_cmp), canonical(other_cmp)
        keys = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
        if not keys:
            continue
        if "fedgrove" in keys:  # what the settings are does not matter before the versions agree
            raise InvalidParameterError(f"{spec.name} runs fedgrove {mine['fedgrove']} and {peer} runs "
                                        f"{other_cmp.get('fedgrove') or 'an older version'}: their messages may "
                                        f"differ; install the same fedgrove version at every party")
        shown = "; ".join(f"{k}: {mine_cmp.get(k)!r} here, {other_cmp.get(k)!r} at {peer}" for k in keys[:6])
        # prediction is on where a party lists test data: a party without data must be told
        hint = (" (a party without data, such as a master or an aggregator, predicts with the others when its "
                "config says predict = true under [federation])" if "federation.predict" in keys else "")
        raise InvalidParameterError(f"{spec.name} and {peer} were not given the same federation settings "
                                    f"({shown}{'; ...' if len(keys) > 6 else ''}); give every party the same "
                                    f"[federation], [params] and protocol tables{hint}, and start all of them to "
                                    f"train or all with --predict")


@contextlib.contextmanager
def _no_empty_output_left(out_dir):
    """On failure, remove the output directory (and the parents) that this run created, where nothing was
    written into them: a simulated run that stops at a bad data file leaves no empty ``runs/...`` behind.  A
    directory that holds anything (a checkpoint to resume from) is kept.  Only once every party of the run
    has ended (:func:`simulate`)."""
    created, d = [], Path(out_dir)
    while not d.exists() and d != d.parent:
        created.append(d)
        d = d.parent
    try:
        yield
    except BaseException:
        for d in created:  # deepest first
            try:
                d.rmdir()
            except OSError:  # not empty, or gone: keep the rest
                break
        raise


def simulate(cfg: FederationConfig, resume: bool = False, progress=None, predict_only: bool = False) -> dict:
    """All parties in this process, one thread each, messages through the codec."""
    with _no_empty_output_left(cfg.output_dir):
        return _simulate(cfg, resume, progress, predict_only)


def _simulate(cfg: FederationConfig, resume: bool, progress, predict_only: bool) -> dict:
    from fedgrove.runner.warmup import warm_up
    from fedgrove.transport.inprocess import InProcessHub, run_parties

    warm_up(cfg)  # kernels compiled before the parties start their clocks
    _limit_he_threads(cfg, "the parties")  # one pool, on which their HE operations take turns
    hub = InProcessHub([p.name for p in cfg.parties])
    roles = {p.name: (lambda spec: (lambda ch: run_role(cfg, spec, ch, resume=resume, progress=progress,
                                                        predict_only=predict_only)))(p)
             for p in cfg.parties}
    results, _ = run_parties(hub, roles, cfg.timeout, max_bytes=cfg.max_message_bytes)
    return results


def run_party(cfg: FederationConfig, spec: PartySpec, resume: bool = False, progress=None,
              predict_only: bool = False) -> dict:
    """This party alone, over gRPC with mutual TLS.  (An output directory it created is kept when it fails,
    empty or not: other parties' processes on this machine may share it, and would find it gone.)"""
    from fedgrove.crypto.certs import check_party_certs
    from fedgrove.runner.warmup import warm_up
    from fedgrove.transport.grpc_backend import GrpcChannel, TLSFiles

    certs = Path(spec.certs)
    paths = (certs / "ca.pem", certs / f"{spec.name}.pem", certs / f"{spec.name}.key")
    for path in paths:
        if not path.exists():
            raise DataError(f"party {spec.name}: {path} not found; create certificates with `fedgrove certs`")
    check_party_certs(*paths, spec.name)
    tls = TLSFiles(*paths)
    channel = GrpcChannel(spec.name, spec.listen, cfg.peers, tls, timeout=cfg.timeout,
                          startup_timeout=cfg.startup_timeout, max_bytes=cfg.max_message_bytes,
                          linger=HANDSHAKE_LINGER)
    logger.info("%s (%s) listening on %s; peers: %s", spec.name, spec.role, spec.listen, ", ".join(cfg.peers))
    _limit_he_threads(cfg, spec.name)
    try:
        # compiled before the first message, while the peers wait under startup_timeout: compiling mid-protocol
        # (tens of seconds on an empty cache) counted against their timeout
        warm_up(cfg, spec.name)
        return run_role(cfg, spec, channel, resume=resume, progress=progress, predict_only=predict_only)
    except BaseException as exc:
        if channel.failure is None:  # the peers stop waiting and say why (not when it was a peer's failure)
            channel.notify_failure(exc)
        raise
    finally:
        channel.close()
