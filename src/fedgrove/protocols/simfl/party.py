"""A SimFL party: its own instances (same features as the others) and their labels.

Preprocessing (once, saved and reused): the parties agree on per-feature
minima and maxima, hash their binned rows with the shared LSH functions and
all-gather (ID, hash values); each party then finds, for each of its
instances and each other party, that party's most similar instance
(:mod:`fedgrove.protocols.simfl.lsh`).

Training (the paper's Algorithm 2): the trees are grown in a schedule (blocks
proportional to the parties' data shares, as the authors' code does, or in
turn).  For a tree of party m every other party sends, per instance of m, the
sums of g and h of its own instances whose similar instance is that one; m
grows the tree on its own data with the weighted gradients and sends it to
everyone.  Every party ends with the whole model.
"""

from __future__ import annotations

import hashlib
import io
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fedgrove.crypto.secagg import FixedPoint128, MaskingKeys, add128
from fedgrove.engine.binning import BinMapper
from fedgrove.engine.gbdt import GBDTParams, LocalGrower, RoundSampler, check_xy, checked_weights
from fedgrove.engine.histogram import grouped_sums
from fedgrove.engine.losses import make_objective
from fedgrove.engine.model import GBDTModel, atomic_write_bytes, atomic_write_text, check_row_labels, names_of
from fedgrove.engine.threads import thread_limit
from fedgrove.engine.tree import RankedRows
from fedgrove.exceptions import InvalidParameterError, ProtocolError
from fedgrove.log import NoteTimer, logger
from fedgrove.protocols.horizontal.common import base_score, label_stats
from fedgrove.protocols.simfl import messages as m
from fedgrove.protocols.simfl.lsh import LSHFamily, LSHParams, quantize, similar_instances
from fedgrove.protocols.tfl import tree_schedule
from fedgrove.protocols.vertical.messages import Start, ids_digest
from fedgrove.protocols import (NEEDS_N_CLASSES, check_same_features, check_same_width,
                                 features_digest, instance_ids, refuse_unsupported)

SCHEDULES = {"blocks": "blocks", "round-robin": "round_robin"}


@dataclass
class SimFLOptions:
    """SimFL's settings beyond the GBDT parameters: ``lsh`` (:class:`~fedgrove.protocols.simfl.lsh.LSHParams`,
    also ``fedgrove.LSHParams``: hash functions, window r, distribution, bins, seed) and ``schedule``, the order
    of the trees: "blocks" proportional to the parties' data shares (the authors' code) or "round-robin"."""

    lsh: LSHParams = field(default_factory=LSHParams)
    schedule: str = "blocks"   # blocks proportional to data shares (the authors' code) or "round-robin"

    def __post_init__(self):
        if not isinstance(self.schedule, str) or self.schedule not in SCHEDULES:
            raise InvalidParameterError(f"schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}")


@dataclass
class Similarity:
    """One party's preprocessing result: for each other party, per own instance, the position of its similar
    instance in that party's rows (-1: none), with what identifies the federation it was computed for."""

    parties: list[str]
    sizes: list[int]
    similar: dict[str, np.ndarray]
    key: str            # federation and LSH parameters
    data_digest: str    # this party's rows
    seconds: float = 0.0
    bytes_sent: int = 0
    bytes_received: int = 0

    def save(self, path) -> None:
        path = Path(path)
        buf = io.BytesIO()
        np.savez(buf, **{f"similar_{k}": v for k, v in self.similar.items()})
        atomic_write_bytes(path, buf.getvalue())
        meta = {"parties": self.parties, "sizes": self.sizes, "key": self.key, "data_digest": self.data_digest,
                "seconds": self.seconds, "bytes_sent": self.bytes_sent, "bytes_received": self.bytes_received,
                "arrays_sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
        atomic_write_text(path.with_suffix(".json"), json.dumps(meta, indent=1))

    @classmethod
    def load(cls, path) -> "Similarity | None":
        """The saved result, or None when it is missing, incomplete or corrupt (it is then recomputed)."""
        path = Path(path)
        meta_path = path.with_suffix(".json")
        if not (path.exists() and meta_path.exists()):
            return None
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
            if hashlib.sha256(path.read_bytes()).hexdigest() != meta["arrays_sha256"]:
                return None
            with np.load(path, allow_pickle=False) as z:
                similar = {k.removeprefix("similar_"): z[k].astype(np.int64) for k in z.files}
            return cls(meta["parties"], meta["sizes"], similar, meta["key"], meta["data_digest"], meta["seconds"],
                       meta["bytes_sent"], meta["bytes_received"])
        except (OSError, ValueError, KeyError, json.JSONDecodeError):
            return None


class SimFLParty:
    """One party of SimFL on a Channel (its peers are all the other parties).

    Parameters
    ----------
    channel : this party's Channel
    X, y : the party's instances and labels (same features as every other party)
    params : GBDTParams; multiclass needs ``n_classes`` (a party may miss some classes)
    options : SimFLOptions (LSH parameters and tree schedule)
    ids : global instance IDs (unique across parties); default: this party's index and row number
    cache : where the preprocessing result is saved and, if it matches, reused
    sample_weight : the party's row weights (finite, non-negative), as the engine's: a row's weight scales its
        gradient and hessian (in its own trees and in the sums it sends for its similar instances), its share of
        the party's cut points and of the base score; rows of weight 0 are left out before anything, the
        similarity search included.  No weight leaves the party
    """

    def __init__(self, channel, X, y, params: GBDTParams, options: SimFLOptions | None = None, ids=None,
                 cache=None, schema=None, sample_weight=None):
        self.ch, self.params = channel, params
        self.feature_names = names_of(X)  # a DataFrame's columns: the model keeps them, as the engine's does
        # checked equal across parties: the names in order (and, from the runner, the categories)
        self.schema = self.feature_names if schema is None else [str(n) for n in schema]
        self.options = options or SimFLOptions()
        if sample_weight is not None:
            check_row_labels({"X": X, "y": y, "sample_weight": sample_weight})
        self.X, self.y = check_xy(X, y)
        if params.objective == "multiclass" and params.n_classes is None:
            raise InvalidParameterError(f"SimFL multiclass needs {NEEDS_N_CLASSES}")
        refuse_unsupported(params, "SimFL")
        self.options.lsh.resolve(self.X.shape[1])  # refuse L >= d before anything is sent
        self.parties = sorted([channel.party] + list(channel.peers))
        self.index = self.parties.index(channel.party)
        self.others = [p for p in self.parties if p != channel.party]
        n = len(self.X)
        self.ids = (np.arange(n, dtype=np.int64) + (self.index << 32)) if ids is None else \
            instance_ids(ids, n, channel.party)
        self.weights = None
        if sample_weight is not None:  # as the engine: the rows of weight 0 left out (their labels checked too)
            objective = make_objective(params.objective, params.n_classes or 1)
            w = checked_weights(sample_weight, objective.check_labels(self.y), objective.name)
            keep = w > 0
            self.X, self.y, self.ids, self.weights = self.X[keep], self.y[keep], self.ids[keep], w[keep]
        self.cache = Path(cache) if cache else None
        self.similarity: Similarity | None = None
        self.timings: dict = {}

    # -- setup and preprocessing ---------------------------------------------------------------
    def _hello(self) -> str:
        ch = self.ch
        mine = m.Hello(len(self.X), self.X.shape[1], ids_digest(self.ids), features_digest(self.schema))
        ch.broadcast("hello", mine, self.others)
        hello = {ch.party: mine, **ch.gather("hello", m.Hello, self.others)}
        check_same_width({p: h.n_features for p, h in hello.items()})
        check_same_features({p: h.features_digest for p, h in hello.items()})
        self.sizes = [hello[p].n_samples for p in self.parties]
        fed = {"lsh": self.options.lsh.to_dict(),
               "parties": [[p, hello[p].n_samples, hello[p].n_features, hello[p].ids_digest.hex()]
                           for p in self.parties]}
        return hashlib.sha256(json.dumps(fed, sort_keys=True).encode()).hexdigest()

    def _data_digest(self) -> str:
        h = hashlib.sha256(np.ascontiguousarray(self.X).tobytes())
        h.update(self.ids.tobytes())
        return h.hexdigest()

    def preprocess(self) -> Similarity:
        """Agree on feature ranges, all-gather hash values, find the similar instances; save the result.

        Reuses a saved result when every party has one for exactly this federation (same parties, sizes, IDs
        and LSH parameters) and its own data is unchanged."""
        ch = self.ch
        key = self._hello()
        cached = Similarity.load(self.cache) if self.cache else None
        ok = cached is not None and cached.key == key and cached.data_digest == self._data_digest()
        ch.broadcast("cache", m.CacheStatus(ok), self.others)
        theirs = ch.gather("cache", m.CacheStatus, self.others)  # taken even when this party has none to reuse
        if ok and all(s.ok for s in theirs.values()):
            self.similarity = cached
            self.timings["preprocess_reused"] = True
            return cached
        before = ch.stats.as_dict()
        t0 = time.perf_counter()
        with ch.scope(stage="prep"):
            lo, hi = self._feature_ranges()
            bins = quantize(self.X, lo, hi, self.options.lsh.n_bins)
            H = LSHFamily.draw(self.options.lsh, self.X.shape[1]).hash(bins)
            ch.broadcast("hashes", m.HashTable(self.ids, H), self.others)
            tables = ch.gather("hashes", m.HashTable, self.others)
        seen = set(self.ids.tolist())
        similar = {}
        for p, t in tables.items():
            if t.hashes.shape != (self.sizes[self.parties.index(p)], H.shape[1]) or len(t.ids) != len(t.hashes):
                raise ProtocolError(f"hash table from {p} does not match its announced size")
            if seen.intersection(t.ids.tolist()):
                raise ProtocolError(f"{p} uses instance IDs that another party uses too: IDs must be global")
            seen.update(t.ids.tolist())
            similar[p] = similar_instances(H, t.hashes, t.ids, progress=self._similarity_note(p, len(t.ids)))
        after = ch.stats.as_dict()
        self.similarity = Similarity(self.parties, self.sizes, similar, key, self._data_digest(),
                                     time.perf_counter() - t0, after["total_sent"] - before["total_sent"],
                                     after["total_received"] - before["total_received"])
        if self.cache:
            self.similarity.save(self.cache)
        self.timings["preprocess_reused"] = False
        return self.similarity

    def _similarity_note(self, peer: str, n_peer: int):
        """A progress callback that notes, after 15 s and then every 30 s, how far the search for this party's
        instances' similar ones among ``peer``'s has come (quadratic in the rows: minutes on millions)."""
        timer = NoteTimer(15.0, 30.0)

        def note(done: int, total: int) -> None:
            if done < total and (elapsed := timer.due()) is not None:
                logger.info("%s: similar instances among %s's %d: %d of %d rows done (%.0f s so far)",
                            self.ch.party, peer, n_peer, done, total, elapsed)
        return note

    def _feature_ranges(self):
        """The federation's per-feature minimum and maximum, from each party's own (NaN: no value)."""
        ch = self.ch
        lo, hi = _nan_range(self.X)
        ch.broadcast("range", m.FeatureRange(lo, hi), self.others)
        ranges = ch.gather("range", m.FeatureRange, self.others)
        for peer, r in ranges.items():
            if len(r.lo) != self.X.shape[1] or len(r.hi) != self.X.shape[1]:
                raise ProtocolError(f"{ch.party}: {peer}'s feature ranges give {len(r.lo)} minima and {len(r.hi)} "
                                    f"maxima for {self.X.shape[1]} features")
            with np.errstate(invalid="ignore"):
                if np.isinf(r.lo).any() or np.isinf(r.hi).any() or (r.lo > r.hi).any() \
                        or (np.isnan(r.lo) != np.isnan(r.hi)).any():
                    raise ProtocolError(f"{ch.party}: {peer}'s feature ranges are not finite minima at most their "
                                        f"maxima (NaN in both for a feature without values)")
        los = np.vstack([lo] + [r.lo for r in ranges.values()])
        his = np.vstack([hi] + [r.hi for r in ranges.values()])
        glo, _ = _nan_range(los)
        _, ghi = _nan_range(his)
        return np.nan_to_num(glo, nan=0.0), np.nan_to_num(ghi, nan=0.0)

    # -- training --------------------------------------------------------------------------------
    def _base_score(self, objective, y) -> np.ndarray:
        """The engine's initial score from the federation's label statistics, summed under pairwise masks so
        that no party's own statistics are seen."""
        p, ch = self.params, self.ch
        if p.base_score != "auto":
            return base_score(p, np.zeros(1))
        keys = MaskingKeys(ch.party)
        with ch.scope(stage="base"):
            ch.broadcast("key", m.MaskingKey(keys.public_bytes()), self.others)
            peers = {q: msg.key for q, msg in ch.gather("key", m.MaskingKey, self.others).items()}
            keys.agree(peers, session=self.similarity.key.encode())
            codec = FixedPoint128()
            stats = label_stats(p, y, self.weights)
            hi, lo = codec.encode(stats)
            mhi, mlo = keys.mask128("base", len(stats))
            mine = m.MaskedStats(*add128(hi, lo, mhi, mlo))
            ch.broadcast("stats", mine, self.others)
            total_hi, total_lo = mine.hi, mine.lo
            for q, msg in ch.gather("stats", m.MaskedStats, self.others).items():
                if msg.hi.shape != stats.shape or msg.lo.shape != stats.shape:
                    raise ProtocolError(f"label statistics from {q} have the wrong length")
                total_hi, total_lo = add128(total_hi, total_lo, msg.hi, msg.lo)
        return base_score(p, codec.decode(total_hi, total_lo))

    def fit(self, checkpoint=None, resume: bool = False, progress=None) -> GBDTModel:
        """Preprocess (or reuse), then train; with a ``checkpoint`` store, save after every round and
        (``resume``) continue from it.  ``progress(trees_done, trees_total)`` after every round.  Kernels use
        ``params.n_threads`` threads (per party: several parties in one process share the cores)."""
        with thread_limit(self.params.n_threads):
            return self._fit(checkpoint, resume, progress)

    def _fit(self, checkpoint, resume, progress) -> GBDTModel:
        ch, p = self.ch, self.params
        sim = self.similarity or self.preprocess()
        # per other party: this party's rows that have a similar instance there, and that instance's position
        matched = {}
        for q in self.others:
            rows = np.nonzero(sim.similar[q] >= 0)[0]
            matched[q] = (rows, sim.similar[q][rows], sim.sizes[self.parties.index(q)])
        objective = make_objective(p.objective, p.n_classes or 1)
        y = objective.check_labels(self.y)
        K = objective.n_outputs
        base = self._base_score(objective, y)
        model = GBDTModel(p.objective, objective.n_classes, base, None, p.to_dict(), self.feature_names)
        model.n_features = self.X.shape[1]
        model.metadata.update({"protocol": "simfl", "parties": self.parties, "schedule": self.options.schedule,
                               "lsh": self.options.lsh.to_dict()})
        raw = np.tile(base, (len(y), 1))
        start = self._start(checkpoint, resume)
        if start:
            from fedgrove.engine.model import model_from_dict
            from fedgrove.runner.checkpoint import CheckpointStore

            state = checkpoint.load()
            model = model_from_dict(state["model"], source=str(checkpoint.path))
            model.params = p.to_dict()  # this run's (n_estimators may have been raised to train on)
            raw = CheckpointStore.scores(state, (len(y), K))
        # the party's cut points: the engine's on its rows (weighted)
        grower = LocalGrower(self.X, p, BinMapper(p.max_bins, seed=p.seed).fit(self.X, self.weights))
        ranked = RankedRows(self.X)  # routes the other parties' trees (raw thresholds) through this party's rows
        order = tree_schedule(p.n_estimators, self.sizes, SCHEDULES[self.options.schedule])
        # subsample / colsample_bytree: the trainer draws its own rows and the features for each of its rounds,
        # from its own generator (the rounds it trained before a resume point drew theirs)
        sampler = RoundSampler(p, len(y), self.X.shape[1], seed=[p.seed, 67, self.index])
        for t in range(start):
            if order[t] == self.index:
                sampler.next()
        before, t0 = ch.stats.as_dict(), time.perf_counter()
        self.tree_seconds = []
        for t in range(start, p.n_estimators):
            t1 = time.perf_counter()
            trainer = self.parties[order[t]]
            g, h = objective.gradients(y, raw)
            if self.weights is not None:
                g, h = g * self.weights[:, None], h * self.weights[:, None]
            with ch.scope(tree=t):
                if trainer != ch.party:
                    ch.send(trainer, m.GRADIENTS, self._aggregate(t, matched[trainer], g, h))
                    trees = []
                    for c in range(K):
                        msg, where = ch.recv(trainer, m.TREE, m.TreeMessage), f"{ch.party}: tree {t} from {trainer}"
                        if msg.tree != t or msg.output != c:
                            raise ProtocolError(f"{where}: it says tree {msg.tree}, output {msg.output} (expected "
                                                f"{t}, {c})")
                        trees.append(m.tree_from_message(msg, self.X.shape[1], where))
                        raw[:, c] += trees[-1].values[ranked.leaves(trees[-1]), 0]
                else:
                    gw, hw = self._weighted(t, g, h)
                    rows, features = sampler.next()
                    trees = []
                    for c in range(K):
                        tree, finder = grower.grow(gw[:, c], hw[:, c], rows, features)
                        trees.append(m.shared_tree(tree, order[t]))
                        ch.broadcast(m.TREE, m.tree_message(t, c, trees[-1]), self.others)
                        if rows is None:  # the trainer knows its own instances' leaves: no routing (the same
                            done = np.nonzero(tree.is_leaf)[0]  # leaves as by threshold)
                            finder.add_node_values(raw, c, done, tree.values[done, 0])
                        else:  # (only its sampled rows')
                            raw[:, c] += trees[-1].values[ranked.leaves(trees[-1]), 0]
            for c, tree in enumerate(trees):
                model.add_tree(tree, c)
            self.tree_seconds.append(time.perf_counter() - t1)
            if checkpoint is not None and checkpoint.due(t + 1, p.n_estimators):
                checkpoint.save({"trees_done": t + 1, "model": model.to_dict()}, raw)
            if progress is not None:
                progress(t + 1, p.n_estimators)
        after = ch.stats.as_dict()
        n_run = max(1, p.n_estimators - start)
        self.timings.update({"train_seconds": time.perf_counter() - t0,
                             "train_bytes_sent_per_tree": (after["total_sent"] - before["total_sent"]) / n_run,
                             "train_bytes_received_per_tree":
                                 (after["total_received"] - before["total_received"]) / n_run,
                             "preprocess_seconds": sim.seconds, "preprocess_bytes_sent": sim.bytes_sent,
                             "preprocess_bytes_received": sim.bytes_received})
        self.model = model
        return model

    def _start(self, checkpoint, resume: bool) -> int:
        """The first party decides where training starts (0, or its checkpoint); the others check theirs."""
        ch = self.ch
        if not resume:
            return 0
        if self.index == 0:
            state = checkpoint.load() if checkpoint is not None else None
            start = state["trees_done"] if state else 0
            ch.broadcast("start", Start(start), self.others)
            return start
        start = ch.recv(self.parties[0], "start", Start).tree
        if start:
            from fedgrove.runner.checkpoint import CheckpointStore

            state = CheckpointStore.resume_state(checkpoint, resume, start, ch.party, self.parties[0])
            if state["trees_done"] != start:
                raise ProtocolError(f"{ch.party}: its checkpoint holds {state['trees_done']} trees, "
                                    f"{self.parties[0]} resumes at {start}; restart all parties from the same point")
        return start

    @staticmethod
    def _aggregate(t: int, matched: tuple, g, h) -> m.AggregatedGradients:
        """Per instance of the trainer, the sums of this party's g and h over the instances similar to it
        (``matched``: the rows with a similar instance there, its positions, the trainer's size)."""
        rows, idx, n_trainer = matched
        return m.AggregatedGradients(t, grouped_sums(g, rows, idx, n_trainer), grouped_sums(h, rows, idx, n_trainer))

    def _weighted(self, t: int, g, h):
        """The trainer's weighted gradients: its own plus every other party's aggregated ones."""
        gw, hw = g.copy(), h.copy()
        for q in self.others:
            msg = self.ch.recv(q, m.GRADIENTS, m.AggregatedGradients)
            if msg.tree != t or msg.g.shape != g.shape or msg.h.shape != h.shape \
                    or not (np.all(np.isfinite(msg.g)) and np.all(np.isfinite(msg.h))) or np.any(msg.h < 0):
                raise ProtocolError(f"aggregated gradients from {q} for tree {t} do not fit this party's "
                                    f"{len(g)} instances")
            gw += msg.g
            hw += msg.h
        return gw, hw


def _nan_range(A: np.ndarray):
    """Column minimum and maximum ignoring NaN; NaN for a column without values."""
    present = ~np.isnan(A)
    lo = np.where(present, A, np.inf).min(axis=0)
    hi = np.where(present, A, -np.inf).max(axis=0)
    empty = ~present.any(axis=0)
    return np.where(empty, np.nan, lo), np.where(empty, np.nan, hi)
