"""An FV-tree party (FGBDT-Chain): its own instances, labels and a replica of the ledger.

Every party grows the same trees: per layer, for all open nodes at once,

1. each party finds its best feature per node on its *refitted* histograms
   (gradients weighted by the PSD density of the federation; PV-tree: on its
   original ones) and votes for it (the exponential mechanism under DP);
2. the ``n_candidates`` features with most votes (ties: lower index) are the
   node's candidates; each party uploads its *original* (g, h, count)
   histograms of them (noised under DP);
3. every other party estimates the sender's histogram from its own data
   weighted by the PSD density ratio and signs (Ed25519) when the overlap
   distance D is below the threshold; a histogram needs signatures from two
   thirds of the parties (its sender's included) to count;
4. the accepted histograms are summed and the engine's split search picks the
   split among the candidates; each party partitions its own instances.

The split Shapley value of every party and the voting contributions are
computed for every split (:mod:`fedgrove.ledger.contributions`).  Every vote,
upload, endorsement, split and contribution is a signed record on each
party's ledger replica; replicas are compared at the end.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import math
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from fedgrove.crypto.signing import SigningKey, public_key, verify
from fedgrove.engine.binning import BinMapper, column_major
from fedgrove.engine.gbdt import GBDTParams, RoundSampler, check_xy
from fedgrove.engine.grower import Layer, LayerSplits, SplitFinder, TreeGrower
from fedgrove.engine.losses import make_objective
from fedgrove.engine.model import GBDTModel, names_of
from fedgrove.engine.params import Flag, Interval, validate
from fedgrove.engine.split import gbdt_pair_splits
from fedgrove.engine.splitter import GBDTScorer, HistogramSplitFinder, resolve_missing_direction
from fedgrove.engine.tree import PackedEnsemble
from fedgrove.exceptions import InvalidParameterError, ProtocolError
from fedgrove.ledger import records as rec
from fedgrove.ledger.contributions import shapley_values, split_sums, vote_contributions
from fedgrove.ledger.store import sign_record, signed_bytes
from fedgrove.log import logger
from fedgrove.protocols.fvtree import messages as m
from fedgrove.protocols.fvtree.privacy import DifferentialPrivacy, DPOptions, NoPrivacy
from fedgrove.protocols.fvtree.psd import PSD, density_ratio, refit_weights
from fedgrove.protocols.horizontal.common import base_score, label_stats
from fedgrove.transport.codec import decode, encode
from fedgrove.protocols import (NEEDS_N_CLASSES, check_same_features, check_same_width,
                                 features_digest, peer_sketches, refuse_unsupported)


MAX_PSD_DEPTH = 16


@dataclass
class FVTreeOptions:
    """FV-tree's settings beyond the GBDT parameters.

    n_candidates : features that get histograms per node (top by votes); None: every feature (no voting
        approximation: the splits equal the centralised engine's)
    refit : vote on PSD-refitted gradients (FV-tree) or on the original ones (PV-tree)
    use_psd : build and share PSDs (needed by refit and verification)
    psd_depth, psd_epsilon : the PSD's depth (at most 16: 2**depth noisy leaf counts go to every party; depth 20
        took 134 s and 5.4 GB for four parties of 100 rows, depth 40 did not finish) and the Laplace budget of
        its leaf counts (None: exact counts)
    verify : endorse histograms by overlap distance (needs the PSD); off: every histogram is accepted
    threshold : D below which a party signs another's upload.  Measured with four parties, theta 0.8: honest
        uploads reach D 0.2 on a9a and up to 0.68 on cod-rna (the gradient term grows with the trees and the
        depth), a histogram scaled by 2 stays at 0.86 or more on cod-rna and ~1 on a9a
        (bench/fvtree_endorsement.py)
    endorse_fraction : signatures (the sender's included) a histogram needs, as a fraction of the parties
    beta : weight of the voting contribution in a party's total
    n_permutations : Shapley permutations above 12 parties
    dp : DPOptions, or None
    noise : where the party's PSD noise and seeded DP noise come from: "secret" (default), a seed derived
        from its own signing key, which no other party can compute (a resumed run draws the same noise);
        "public": from the federation's seed and the party's index, so every party that knows the config
        can recompute (and remove) every other party's noise: reproducible research runs only
    """

    n_candidates: int | None = 2
    refit: bool = True
    use_psd: bool = True
    psd_depth: int = 8
    psd_epsilon: float | None = 1.0
    verify: bool = True
    threshold: float = 0.75
    endorse_fraction: float = 2.0 / 3.0
    beta: float = 1.0
    n_permutations: int = 2000
    dp: DPOptions | None = None
    noise: str = "secret"

    CONSTRAINTS = {
        "n_candidates": Interval(int, 1, allow_none=True),
        "refit": Flag(),
        "use_psd": Flag(),
        "psd_depth": Interval(int, 1, MAX_PSD_DEPTH),
        "psd_epsilon": Interval(float, 0, low_open=True, allow_none=True),
        "verify": Flag(),
        "threshold": Interval(float, 0, low_open=True),
        "endorse_fraction": Interval(float, 0, 1, low_open=True),
        "beta": Interval(float, 0),
        "n_permutations": Interval(int, 1),
    }

    def __post_init__(self):
        validate(self, self.CONSTRAINTS)
        if (self.refit or self.verify) and not self.use_psd:
            raise InvalidParameterError("refit and verification need the PSD (use_psd = true)")
        if isinstance(self.dp, dict):
            self.dp = DPOptions(**self.dp)
        if self.dp is not None and not isinstance(self.dp, DPOptions):
            raise InvalidParameterError(f"dp must be DPOptions or None, got {self.dp!r}")
        if self.noise not in ("secret", "public"):
            raise InvalidParameterError(f"noise must be 'secret' or 'public', got {self.noise!r}")

    def to_dict(self) -> dict:
        return asdict(self)


# the records the setup writes (a record's kind is its body's message type)
_SETUP_KINDS = tuple(c.__name__ for c in (rec.ModelRequest, rec.Membership, rec.Binning, rec.PSDUpload))


@dataclass
class _Peer:
    name: str
    key: bytes
    n_samples: int
    psd: PSD | None = None

    @functools.cached_property
    def public(self):
        """The key loaded once for the signature checks (Ed25519PublicKey)."""
        return public_key(self.key)


@dataclass
class _LayerState:
    """What a layer leaves for its splits and records."""

    layer: Layer
    candidates: np.ndarray          # (n_nodes, k) feature or -1
    votes: np.ndarray               # (M, n_nodes) voted feature per party
    uploads: dict                   # party -> HistogramUpload
    accepted: np.ndarray            # (M, n_nodes) bool
    refusals: list                  # per node: text
    totals: np.ndarray              # (n_nodes, 3) global (g, h, count)
    split_rows: list = field(default_factory=list)


class FVTreeParty:
    """One party of FV-tree on a Channel (peers: every other party).

    Parameters
    ----------
    channel : this party's Channel
    X, y : its instances and labels (the same features as every other party)
    params : GBDTParams (binary, multiclass with n_classes, or regression)
    options : FVTreeOptions
    ledger : this party's :class:`~fedgrove.ledger.store.Ledger` replica, or None (records are still signed
        and checked, not stored)
    key : its Ed25519 :class:`~fedgrove.crypto.signing.SigningKey` (default: a new one)
    """

    def __init__(self, channel, X, y, params: GBDTParams, options: FVTreeOptions | None = None, ledger=None,
                 key: SigningKey | None = None, schema=None):
        self.ch, self.params = channel, params
        self.feature_names = names_of(X)  # a DataFrame's columns: the model keeps them, as the engine's does
        # checked equal across parties: the names in order (and, from the runner, the categories)
        self.schema = self.feature_names if schema is None else [str(n) for n in schema]
        self.o = options or FVTreeOptions()
        self.X, self.y = check_xy(X, y)
        refuse_unsupported(params, "FV-tree")
        if params.objective == "multiclass" and params.n_classes is None:
            raise InvalidParameterError(f"FV-tree multiclass needs {NEEDS_N_CLASSES}")
        self.parties = sorted([channel.party] + list(channel.peers))
        self.index = self.parties.index(channel.party)
        self.others = [p for p in self.parties if p != channel.party]
        self.requester = self.parties[0]
        if ledger is not None and len(self.parties) > rec.MAX_PARTIES:
            raise InvalidParameterError(f"FV-tree keeps a ledger of at most {rec.MAX_PARTIES} parties (its split "
                                        f"records hold sets of parties as 64-bit masks); this federation has "
                                        f"{len(self.parties)}")
        self.key = key or SigningKey()
        self.ledger = ledger
        self.privacy = (DifferentialPrivacy(self.o.dp, params.n_estimators, params.max_depth,
                                            self._noise_seed(b"dp", [params.seed, 41, self.index]),
                                            trees_per_round=params.n_classes if params.objective == "multiclass"
                                            else 1)
                        if self.o.dp is not None else NoPrivacy())
        self.contributions = np.zeros((len(self.parties), 2))  # per party: split Shapley, vote (sums)
        self.rejected = 0                                   # uploads refused (all parties')
        self.refused = np.zeros(len(self.parties), dtype=np.int64)  # per party: its uploads refused
        self.uploads = 0                                    # uploads per party so far (one per layer)
        self._replay, self._replay_pos = None, 0  # a resumed run's setup records, checked instead of appended
        self._history: dict = {}                  # checkpointed light state per number of rounds done
        self._saved_at: int | None = None         # the rounds of this run's last checkpoint
        self._fp: str | None = None               # this party's fingerprint (data, settings, key)

    def _noise_seed(self, purpose: bytes, public: list) -> list:
        """Seed of this party's noise for ``purpose``: secret (from its signing key) or, with
        ``noise = "public"``, the given public seed."""
        if self.o.noise == "public":
            return public
        return list(self.key.derive(b"fvtree-noise|" + purpose))

    # -- signed records ----------------------------------------------------------------------
    def _sign(self, message) -> m.SignedRecord:
        kind, body, sig = sign_record(self.key, self.ch.party, message)
        return m.SignedRecord(kind, body, sig)

    def _open(self, author: str, signed: m.SignedRecord, expect: type):
        """Check a record's author signature and decode its body as ``expect``."""
        if not verify(self.peers[author].public, signed.signature, signed_bytes(signed.kind, author, signed.body)):
            raise ProtocolError(f"{signed.kind} from {author}: the signature does not verify")
        return decode(signed.body, expect, context=f"{signed.kind} from {author}")

    def _append(self, author: str, signed: m.SignedRecord) -> None:
        if self.ledger is None:
            return
        if self._replay is not None and self._replay_pos < len(self._replay):  # a resumed run's setup
            r = self._replay[self._replay_pos]
            self._replay_pos += 1
            if (r.kind, r.author, r.body, r.signature) != (signed.kind, author, signed.body, signed.signature):
                raise ProtocolError(f"{self.ch.party}: ledger record {r.seq} ({r.kind} by {r.author}) differs from "
                                    f"the {signed.kind} by {author} this resumed run computes: the data, settings "
                                    f"or signing keys changed since the checkpoint")
            return
        self.ledger.append(signed.kind, author, signed.body, signed.signature)

    def _all_gather(self, tag: str, mine: m.SignedRecord, expect: type) -> dict:
        """Broadcast this party's signed record, receive everyone's; returns party -> (signed, decoded)."""
        self.ch.broadcast(tag, mine, self.others)
        got = {self.ch.party: (mine, decode(mine.body, expect))}
        for p, msg in self.ch.gather(tag, m.SignedRecord, self.others).items():
            got[p] = (msg, self._open(p, msg, expect))
        return got

    # -- setup ---------------------------------------------------------------------------------
    def _setup(self) -> None:
        ch, o = self.ch, self.o
        n, d = self.X.shape
        lo = np.append(_nanmin(self.X), np.min(self.y))
        hi = np.append(_nanmax(self.X), np.max(self.y))
        mine = m.Hello(n, d, self.key.public_bytes(), lo, hi, features_digest(self.schema))
        ch.broadcast("hello", mine, self.others)
        hello = {ch.party: mine, **ch.gather("hello", m.Hello, self.others)}
        check_same_width({p: h.n_features for p, h in hello.items()})
        check_same_features({p: h.features_digest for p, h in hello.items()})
        for p, h in hello.items():
            if h.lo.shape != (d + 1,) or h.hi.shape != (d + 1,) or h.n_samples < 0 or len(h.key) != 32:
                raise ProtocolError(f"the hello from {p} does not hold a range per feature and the label ({d + 1} "
                                    f"each; it has {h.lo.size} and {h.hi.size}), a number of samples and a 32-byte "
                                    f"key")
        self.peers = {p: _Peer(p, h.key, h.n_samples) for p, h in hello.items()}
        self.n_total = sum(h.n_samples for h in hello.values())
        self.lo = _nanmin(np.vstack([h.lo for h in hello.values()]))
        self.hi = _nanmax(np.vstack([h.hi for h in hello.values()]))
        # the model request and memberships: the first records of every replica
        if ch.party == self.requester:
            request = self._sign(rec.ModelRequest("fvtree", json.dumps(self.params.to_dict(), sort_keys=True),
                                                  json.dumps(o.to_dict(), sort_keys=True, default=str),
                                                  self.parties, self.key.public_bytes(), self.lo, self.hi))
            ch.broadcast("request", request, self.others)
        else:
            request = ch.recv(self.requester, "request", m.SignedRecord)
            body = self._open(self.requester, request, rec.ModelRequest)
            if list(body.parties) != self.parties or body.requester_key != self.peers[self.requester].key:
                raise ProtocolError(f"the model request from {self.requester} names other parties or another key")
        members = self._all_gather("member", self._sign(rec.Membership(ch.party, self.key.public_bytes(), n)),
                                   rec.Membership)
        self._append(self.requester, request)
        for p in self.parties:
            signed, body = members[p]
            if body.party != p or body.key != self.peers[p].key:
                raise ProtocolError(f"membership record of {p} does not match its hello")
            self._append(p, signed)
        self._common_bins()
        if o.use_psd:
            self._psd()
        stats = label_stats(self.params, make_objective(self.params.objective, self.params.n_classes or 1)
                            .check_labels(self.y, warn=False))  # fit warns, once
        ch.broadcast("labels", m.LabelStats(stats), self.others)
        theirs = ch.gather("labels", m.LabelStats, self.others)
        for p, got in theirs.items():  # a shorter vector broadcast into the sums (a wrong base score, silently)
            if got.stats.shape != stats.shape or not np.all(np.isfinite(got.stats)):
                raise ProtocolError(f"the label statistics from {p} are not {stats.size} finite numbers: "
                                    f"{got.stats.tolist()[:8]}")
        total = stats + sum(s.stats for s in theirs.values())
        self.base = base_score(self.params, total)

    def _common_bins(self) -> None:
        """Cut points from every party's quantile sketches, merged in party order (so identical everywhere)."""
        ch = self.ch
        sketches = BinMapper(self.params.max_bins, subsample=None).sketches(self.X)
        mine = m.Sketches(np.concatenate([s.values for s in sketches]), np.concatenate([s.weights for s in sketches]),
                          np.array([len(s.values) for s in sketches], dtype=np.int64))
        ch.broadcast("sketch", mine, self.others)
        got = {ch.party: mine, **ch.gather("sketch", m.Sketches, self.others)}
        merged = None
        for p in self.parties:
            msg = got[p]
            part = peer_sketches(msg.values, msg.weights, msg.lengths, f"{ch.party}: from {p}", self.X.shape[1])
            merged = part if merged is None else [x.merge(y_) for x, y_ in zip(merged, part)]
        self.bin_mapper = BinMapper(self.params.max_bins).fit_sketches(merged)
        self.X_binned = self.bin_mapper.transform(self.X)
        self.X_columns = column_major(self.X_binned)  # partitions read one feature's codes
        cuts = [self.bin_mapper.bin_upper_bounds(f)[:-1] for f in range(self.X.shape[1])]
        binning = rec.Binning(np.concatenate(cuts) if cuts else np.zeros(0),
                              np.array([len(c) for c in cuts], dtype=np.int64),
                              np.diff(self.bin_mapper.feature_offsets).astype(np.int32))
        if ch.party == self.requester:
            signed = self._sign(binning)
            ch.broadcast("binning", signed, self.others)
        else:
            signed = ch.recv(self.requester, "binning", m.SignedRecord)
            if signed.body != encode(binning):
                raise ProtocolError(f"the cut points {self.requester} recorded differ from {ch.party}'s own merge")
            self._open(self.requester, signed, rec.Binning)
        self._append(self.requester, signed)

    def _psd(self) -> None:
        o = self.o
        psd = PSD.build(self.X, self.y, self.lo, self.hi, o.psd_depth, o.psd_epsilon,
                        np.random.default_rng([self.params.seed, 53]),  # the structure: the same for everyone
                        np.random.default_rng(self._noise_seed(b"psd", [self.params.seed, 54, self.index])))
        got = self._all_gather("psd", self._sign(rec.PSDUpload(self.ch.party, psd.depth, psd.features, psd.cuts,
                                                               psd.counts)), rec.PSDUpload)
        for p in self.parties:
            signed, body = got[p]
            other = PSD(body.depth, body.features, body.cuts, body.counts)
            other.check(self.X.shape[1] + 1)
            if not (np.array_equal(other.features, psd.features) and np.array_equal(other.cuts, psd.cuts)):
                raise ProtocolError(f"the PSD of {p} does not have the federation's structure")
            self.peers[p].psd = other
            self._append(p, signed)
        Z = np.column_stack([self.X, self.y])
        mine = self.peers[self.ch.party].psd
        self.weights = refit_weights(mine, [self.peers[p].psd for p in self.others], Z, len(self.X), self.n_total)
        self.ratios = {p: density_ratio(self.peers[p].psd, mine, Z) for p in self.others}

    # -- training --------------------------------------------------------------------------------
    def fit(self, checkpoint=None, resume: bool = False, progress=None) -> GBDTModel:
        """Train; returns the model every party holds.  With a ``checkpoint`` store (a
        :class:`~fedgrove.runner.checkpoint.CheckpointStore`) the party saves its state after the setup and
        after every boosting round; ``resume`` continues from it: the setup runs again and must reproduce the
        ledger's first records, the federation resumes from the fewest rounds any party checkpointed (a party
        one round ahead steps back), and the ledger loses the records of the round that was being grown, so
        an interrupted and resumed run ends with the model and the ledger of an uninterrupted one (the same
        signing keys, see :meth:`SigningKey.save`).  ``progress(trees_done, trees_total)`` after every round."""
        ch, p, o = self.ch, self.params, self.o
        saved = self._saved_state(checkpoint, resume)
        self._setup()
        if self._replay is not None and self._replay_pos != len(self._replay):
            raise ProtocolError(f"{ch.party}: its ledger holds {len(self._replay)} setup records, this run wrote "
                                f"{self._replay_pos}: the data or settings changed since the checkpoint")
        self._replay = None
        objective = make_objective(p.objective, p.n_classes or 1)
        y = objective.check_labels(self.y)
        K = objective.n_outputs
        model = GBDTModel(p.objective, objective.n_classes, self.base, self.bin_mapper, p.to_dict(),
                          self.feature_names)
        model.metadata.update({"protocol": "fvtree", "parties": self.parties, "options": o.to_dict()})
        raw = np.tile(self.base, (len(y), 1))
        self.scorer = GBDTScorer(p.reg_lambda, p.gamma, p.min_child_weight, p.min_samples_leaf)
        self.thresholds = self.bin_mapper.thresholds()
        start = self._agree_start(saved, resume)
        privacy = None
        if saved is not None:
            privacy = self._roll_back(saved, start, model, raw)
        self._history = dict(saved["history"]) if saved is not None else {}
        self._saved_at = None
        self._save(checkpoint, start, model, force=True)  # (a party that stepped back: its ledger was cut)
        tpe = getattr(self.privacy, "tpe", p.n_estimators)
        # the engine's features each round (colsample_bytree); this party's own rows each round (subsample), from
        # its own generator (the engine's would need the union's row order)
        sampler = RoundSampler(replace(p, subsample=1.0), None, self.X.shape[1])
        own = RoundSampler(p, len(y), self.X.shape[1], seed=[p.seed, 67, self.index])
        for _ in range(start):  # (the rounds before a resume point drew theirs)
            sampler.next()
            own.next()
        if privacy is not None and start % tpe == 0:  # between ensembles: no composition block open
            self.privacy.restore(privacy)
        ensemble = None
        try:
            for t in range(start, p.n_estimators):
                if ensemble is None:
                    ensemble = contextlib.ExitStack()
                    ensemble.enter_context(self.privacy.ensemble(t // tpe))
                    if privacy is not None and t == start and start % tpe:  # inside the ensemble's block
                        self.privacy.restore(privacy)
                g, h = objective.gradients(y, raw)
                mask = sampler.feature_mask(sampler.next()[1])
                sample = own.next()[0]
                for c in range(K):  # (a multiclass round: one tree per class, all on the round's rows under DP)
                    with ch.scope(tree=t * K + c), self.privacy.tree(t):
                        tree = self._grow(t * K + c, t, g[:, c], h[:, c], mask, sample)
                    model.add_tree(tree, c)
                    leaf = PackedEnsemble([tree]).leaves_binned(self.X_binned, self.bin_mapper.missing_codes)
                    raw[:, c] += tree.values[leaf[:, 0], 0]
                if (t + 1) % tpe == 0 or t + 1 == p.n_estimators:
                    ensemble.close()
                    ensemble = None
                self._save(checkpoint, t + 1, model)
                if progress is not None:
                    progress(t + 1, p.n_estimators)
        finally:
            if ensemble is not None:
                ensemble.close()
        if self.ledger is not None:  # replicas must agree
            mine = m.LedgerHead(self.ledger.count, self.ledger.head)
            ch.broadcast("head", mine, self.others)
            for q, head in ch.gather("head", m.LedgerHead, self.others).items():
                if (head.count, head.head) != (mine.count, mine.head):
                    raise ProtocolError(f"the ledger replica of {q} ({head.count} records) differs from "
                                        f"{ch.party}'s ({mine.count} records)")
        model.metadata["contributions"] = {q: {"shapley": float(s), "vote": float(v),
                                               "total": float(s + o.beta * v)}
                                           for q, (s, v) in zip(self.parties, self.contributions)}
        model.metadata["rejected_histograms"] = self.rejected
        model.metadata["refused_uploads"] = {q: int(n) for q, n in zip(self.parties, self.refused)}
        model.metadata["uploads_per_party"] = self.uploads
        if self.privacy.report():
            model.metadata["privacy"] = self.privacy.report()
        if model.trees and not any(t.n_nodes > 1 for t in model.trees):
            self._say_why_no_tree_split(len(self.X))
        self.model = model
        return model

    def _say_why_no_tree_split(self, n_rows: int) -> None:
        """A model without a single split predicts one value: say so, and why, rather than leave the parties to
        find out from its predictions."""
        o, tpe = self.o, getattr(self.privacy, "tpe", 1)
        rows = f"{n_rows} rows" if tpe == 1 else f"{n_rows} rows, 1/{tpe} of them to a tree under differential privacy,"
        if self.rejected:
            logger.warning(
                "%s: no tree has a split: the parties' endorsements refused %d of %d histogram uploads (overlap "
                "distance above the threshold %g: %s here are too few to a bin for the other parties' estimates "
                "of a histogram): the model predicts one value; fewer bins (max_bins), a higher threshold%s or no "
                "verification help", self.ch.party, self.rejected, self.uploads * len(self.parties), o.threshold,
                rows, ", fewer trees per ensemble" if tpe > 1 else "")
        elif o.dp is not None:
            logger.warning("%s: with differential privacy no tree has a split (the noise on %s left no split with a "
                           "positive gain): the model predicts one value; a larger epsilon, fewer trees per ensemble "
                           "or more rows per party help", self.ch.party, rows)

    # -- checkpoints -------------------------------------------------------------------------------
    def _fingerprint(self) -> str:
        """This party's data, settings and signing key, as a checkpoint records them."""
        if self._fp is not None:
            return self._fp
        h = hashlib.sha256()
        for a in (self.X, np.asarray(self.y, dtype=np.float64)):
            h.update(str(a.shape).encode())
            h.update(np.ascontiguousarray(a).tobytes())
        h.update(json.dumps([self.params.to_dict(), self.o.to_dict(), self.parties], sort_keys=True,
                            default=str).encode())
        h.update(self.key.public_bytes())
        self._fp = h.hexdigest()
        return self._fp

    def _saved_state(self, checkpoint, resume: bool):
        """The checkpointed state to resume from (None: none, start afresh); checks it fits this party."""
        self._replay, self._replay_pos = None, 0
        if not resume:
            return None
        refusal = self.privacy.resume_refusal()
        if refusal:
            raise InvalidParameterError(refusal)
        state = checkpoint.load() if checkpoint is not None else None
        if state is None:  # stopped before its setup was checkpointed: nothing on its ledger is vouched for
            if self.ledger is not None:
                trained = [r.seq for r in self.ledger.records() if r.kind not in _SETUP_KINDS]
                if trained:
                    raise InvalidParameterError(f"{self.ch.party}: no checkpoint to resume from, but its ledger "
                                                f"holds training records (record {trained[0]} on): restore the "
                                                f"checkpoint files, or start afresh in a new output directory")
                self.ledger.truncate(0)
            return None
        if state.get("protocol") != "fvtree" or state.get("fingerprint") != self._fingerprint():
            raise InvalidParameterError(f"{self.ch.party}: checkpoint {checkpoint.path} was written by another "
                                        f"run (other data, settings, parties or signing key); start afresh in a "
                                        f"new output directory or restore that run's files")
        setup = state["history"]["0"]["ledger_count"]
        if self.ledger is not None:
            if self.ledger.count < max(h["ledger_count"] for h in state["history"].values()):
                raise ProtocolError(f"{self.ch.party}: its ledger holds {self.ledger.count} records, fewer than "
                                    f"its checkpoint vouches for")
            self._replay = [r for r in self.ledger.records() if r.seq <= setup]
        return state

    def _agree_start(self, saved, resume: bool) -> int:
        """Every party says whether it resumes and how many rounds it checkpointed; the federation resumes
        from the fewest."""
        ch = self.ch
        mine = m.ResumePoint(bool(resume), int(saved["trees_done"]) if saved is not None else 0)
        ch.broadcast("resume", mine, self.others)
        points = {ch.party: mine, **ch.gather("resume", m.ResumePoint, self.others)}
        modes = {q: pt.resume for q, pt in points.items()}
        if len(set(modes.values())) > 1:
            raise ProtocolError(f"some parties resume and some start afresh ({modes}): restart every party with "
                                f"--resume, or none")
        start = min(pt.trees_done for pt in points.values())
        if saved is not None and str(start) not in saved["history"]:
            raise ProtocolError(f"{ch.party}: the federation resumes after {start} rounds; this party's checkpoint "
                                f"holds {saved['trees_done']} and can step back to the checkpoint before it (or "
                                f"to the start) only")
        return start

    def _roll_back(self, saved, start: int, model: GBDTModel, raw: np.ndarray):
        """Model, training scores, ledger and contributions as after ``start`` rounds; returns the privacy
        state to restore."""
        from fedgrove.engine.model import model_from_dict

        at = saved["history"][str(start)]
        old = model_from_dict(saved["model"], source="FV-tree checkpoint")
        old.truncate(start)
        for tree, c in zip(old.trees, old.tree_class):
            model.add_tree(tree, int(c))
            leaf = PackedEnsemble([tree]).leaves_binned(self.X_binned, self.bin_mapper.missing_codes)
            raw[:, c] += tree.values[leaf[:, 0], 0]
        if self.ledger is not None:
            self.ledger.truncate(at["ledger_count"], bytes.fromhex(at["ledger_head"]))
        self.contributions = np.array(at["contributions"], dtype=np.float64).reshape(len(self.parties), 2)
        self.rejected = int(at["rejected"])
        self.refused = np.array(at["refused"], dtype=np.int64)
        self.uploads = int(at["uploads"])
        return at["privacy"]

    def _save(self, checkpoint, trees_done: int, model: GBDTModel, force: bool = False) -> None:
        """After the setup or a resume (``force``) and every round the checkpoint is due: the model and, for
        the setup, this round and the last one checkpointed before it (a party may have to step back to it), the
        ledger's length and head, contributions, rejections and the privacy state (recorded every round)."""
        if checkpoint is None:
            return
        self._history[str(trees_done)] = {
            "ledger_count": self.ledger.count if self.ledger is not None else 0,
            "ledger_head": self.ledger.head.hex() if self.ledger is not None else "",
            "contributions": self.contributions.ravel().tolist(), "rejected": self.rejected,
            "refused": self.refused.tolist(), "uploads": self.uploads,
            "privacy": self.privacy.state()}
        if not force and not checkpoint.due(trees_done, self.params.n_estimators):
            return
        # the setup's entry stays (a resumed run's setup must reproduce its records), with the rounds of this
        # checkpoint and the one before it
        keep = (0, trees_done - 1 if self._saved_at is None else self._saved_at, trees_done)
        self._history = {k: v for k, v in self._history.items() if int(k) in keep}
        checkpoint.save({"protocol": "fvtree", "fingerprint": self._fingerprint(), "trees_done": trees_done,
                         "model": model.to_dict(), "history": self._history})
        self._saved_at = trees_done

    def _grow(self, tree_id: int, round_: int, g: np.ndarray, h: np.ndarray, feature_mask: np.ndarray,
              sample: np.ndarray | None = None):
        """One tree on the round's rows: ``sample`` (subsample; None: all), and under differential privacy the
        round's part of them."""
        o, p = self.o, self.params
        g, h = self.privacy.clip(g, h)
        rows = self.privacy.rows_of_tree(round_, len(g), [p.seed, 59, self.index])
        if sample is not None:
            rows = sample if rows is None else np.intersect1d(rows, sample)
        cols = [g, h, np.ones_like(g)]
        if o.refit:
            wg, wh = self.privacy.clip(self.weights * g, self.weights * h)
            cols += [wg, wh, self.weights]
        if o.verify:
            for q in self.others:
                cols += [self.ratios[q] * g, self.ratios[q]]
        local = HistogramSplitFinder(self.X_binned, self.bin_mapper.feature_offsets, self.bin_mapper.missing_codes,
                                     self.thresholds, np.column_stack(cols), self.scorer, root_samples=rows,
                                     X_columns=self.X_columns)
        finder = _FVFinder(self, local, tree_id, feature_mask)
        tree = TreeGrower(finder, p.max_depth, lambda s: p.learning_rate * self.privacy.leaf(self.scorer.leaf_value(s)),
                          min_samples_split=2 * p.min_samples_leaf).grow()
        finder.publish_records()
        return tree


class _FVFinder(SplitFinder):
    """The split finder every party runs: local votes and histograms, the federation's sums and choice."""

    n_stats = 3

    def __init__(self, party: FVTreeParty, local: HistogramSplitFinder, tree_id: int, feature_mask: np.ndarray):
        self.p, self.local, self.tree = party, local, tree_id
        self.offsets = party.bin_mapper.feature_offsets.astype(np.int32)
        self.n_features = len(self.offsets) - 1
        self.feature_mask = feature_mask  # the round's features (colsample_bytree): votes and candidates among them
        self.k = party.o.n_candidates or self.n_features
        self.k = min(self.k, int(feature_mask.sum()))
        self.layers: list[_LayerState] = []

    def root_stats(self):
        p = self.p
        mine = p.privacy.totals(self.local.root_stats()[:3], self.k)
        p.ch.broadcast("root", m.RootTotals(mine), p.others)
        got = {p.ch.party: mine, **{q: r.totals for q, r in p.ch.gather("root", m.RootTotals, p.others).items()}}
        total = np.zeros(3)
        for q in p.parties:
            if got[q].shape != (3,) or not np.all(np.isfinite(got[q])):
                raise ProtocolError(f"root totals from {q} are malformed")
            total = total + got[q]
        total[1:] = np.maximum(total[1:], 0.0)  # noisy hessian and count sums stay non-negative
        return total

    def sample_weight(self, stats):
        return np.atleast_2d(stats)[:, 2]

    # -- one layer ------------------------------------------------------------------------------
    def find_splits(self, layer: Layer) -> LayerSplits:
        p, o = self.p, self.p.o
        n_nodes, M = len(layer), len(p.parties)
        nodes = [int(i) for i in layer.node_ids]
        local = self.local.layer_histograms(layer, np.arange(self.n_features))
        orig = local[..., :3]
        vote_hist = local[..., 3:6] if o.refit else orig
        first = slice(int(self.offsets[0]), int(self.offsets[1]))
        with p.ch.scope(layer=layer.depth), p.privacy.depth(layer.depth):
            # 1. votes
            totals = np.ascontiguousarray(vote_hist[:, first, :].sum(axis=1))
            allowed = np.tile(self.feature_mask, (n_nodes, 1))  # (writable: numba compiles read-only arrays apart)
            pg = gbdt_pair_splits(np.ascontiguousarray(vote_hist), np.arange(n_nodes, dtype=np.int64), totals,
                                  self.offsets, allowed, float(p.scorer.reg_lambda), float(p.scorer.gamma),
                                  float(p.scorer.min_child_weight),
                                  float(p.scorer.min_samples_leaf))[0].reshape(n_nodes, -1)
            mine = np.full(n_nodes, -1, dtype=np.int32)
            for j in range(n_nodes):
                with p.privacy.node(nodes[j]):
                    mine[j] = p.privacy.vote(pg[j], layer.depth, self.k)
            got = p._all_gather(m.VOTES, p._sign(rec.VoteRecord(self.tree, layer.depth, nodes, mine)),
                                rec.VoteRecord)
            votes = np.empty((M, n_nodes), dtype=np.int32)
            for i, q in enumerate(p.parties):
                body = got[q][1]
                if list(body.nodes) != nodes or body.features.shape != (n_nodes,) \
                        or np.any(body.features < -1) or np.any(body.features >= self.n_features):
                    raise ProtocolError(f"votes from {q} do not match layer {layer.depth}")
                votes[i] = body.features
                p._append(q, got[q][0])
            candidates = self._candidates(votes)
            # 2. histograms of the candidates
            rows, offs = [], [0]
            for j in range(n_nodes):
                chosen = candidates[j][candidates[j] >= 0]
                with p.privacy.node(nodes[j]):
                    for f in chosen:
                        rows.append(p.privacy.histogram(orig[j, self.offsets[f]:self.offsets[f + 1]], layer.depth,
                                                        self.k, len(chosen)))
                offs.append(offs[-1] + sum(int(self.offsets[f + 1] - self.offsets[f])
                                           for f in candidates[j][candidates[j] >= 0]))
            upload = rec.HistogramUpload(self.tree, layer.depth, nodes, candidates, np.asarray(offs, dtype=np.int64),
                                         np.vstack(rows) if rows else np.zeros((0, 3)))
            got = p._all_gather(m.UPLOADS, p._sign(upload), rec.HistogramUpload)
            uploads = {}
            for q in p.parties:
                body = got[q][1]
                if list(body.nodes) != nodes or not np.array_equal(body.candidates, candidates) \
                        or not np.array_equal(body.offsets, upload.offsets) or body.hist.shape != upload.hist.shape \
                        or not np.all(np.isfinite(body.hist)):
                    raise ProtocolError(f"histograms from {q} do not match layer {layer.depth}'s candidates")
                uploads[q] = body
                p._append(q, got[q][0])
            # 3. endorsements
            accepted, refusals = self._endorse(layer, got, uploads, candidates, local)
            p.uploads += 1
        # 4. the federation's histograms and split
        hist = np.zeros((n_nodes, int(self.offsets[-1]), 3))
        node_totals = np.zeros((n_nodes, 3))
        for i, q in enumerate(p.parties):
            up = uploads[q]
            for j in range(n_nodes):
                if not accepted[i, j]:
                    continue
                pos = int(up.offsets[j])
                for f in candidates[j][candidates[j] >= 0]:
                    nb = int(self.offsets[f + 1] - self.offsets[f])
                    part = up.hist[pos:pos + nb]
                    hist[j, self.offsets[f]:self.offsets[f + 1]] += part
                    pos += nb
                first_f = candidates[j][0]
                if first_f >= 0:
                    nb = int(self.offsets[first_f + 1] - self.offsets[first_f])
                    node_totals[j] += up.hist[int(up.offsets[j]):int(up.offsets[j]) + nb].sum(axis=0)
        node_totals[:, 1:] = np.maximum(node_totals[:, 1:], 0.0)
        allowed = np.zeros((n_nodes, self.n_features), dtype=np.bool_)
        for j in range(n_nodes):
            allowed[j, candidates[j][candidates[j] >= 0]] = accepted[:, j].any()
        gain, feature, bins, ml, left = p.scorer.find(hist, np.arange(n_nodes, dtype=np.int64), node_totals,
                                                      self.offsets, allowed)
        thr = np.full(n_nodes, np.nan)
        ok = feature >= 0
        thr[ok] = [p.thresholds[f][b] for f, b in zip(feature[ok], bins[ok])]
        splits = LayerSplits(gain, feature, bins, ml, left, thr, np.full(n_nodes, -1, dtype=np.int32))
        resolve_missing_direction(splits, Layer(layer.node_ids, node_totals, layer.depth), hist, self.offsets,
                                  p.scorer)
        self.layers.append(_LayerState(layer, candidates, votes, uploads, accepted, refusals, node_totals))
        return splits

    def _candidates(self, votes: np.ndarray) -> np.ndarray:
        """Per node the ``k`` features with most votes (ties: the lower feature), -1 padded; every feature of the
        round when ``n_candidates`` is None."""
        n_nodes = votes.shape[1]
        out = np.full((n_nodes, self.k), -1, dtype=np.int32)
        for j in range(n_nodes):
            if self.p.o.n_candidates is None:
                out[j] = np.nonzero(self.feature_mask)[0]
                continue
            counts = np.bincount(votes[:, j][votes[:, j] >= 0], minlength=self.n_features)
            voted = np.nonzero(counts)[0]
            order = voted[np.lexsort((voted, -counts[voted]))][: self.k]
            out[j, :len(order)] = order
        return out

    def _endorse(self, layer, got, uploads, candidates, local):
        """Check every other party's upload against this party's estimate of it; sign when close enough.
        Returns which uploads count (accepted[party, node]: a whole upload counts or not) and why any does not."""
        p, o = self.p, self.p.o
        M, n_nodes = len(p.parties), len(layer)
        need = math.ceil(o.endorse_fraction * M - 1e-9)
        accepted = np.ones((M, n_nodes), dtype=bool)
        refusals = [""] * n_nodes
        if not o.verify:
            return accepted, refusals
        signed = {}
        for q in p.others:
            col = (6 if o.refit else 3) + 2 * p.others.index(q)
            dist = self._distance(uploads[q], candidates, local[..., col], local[..., col + 1])
            body = rec.Endorsement(self.tree, layer.depth, q, hashlib.sha256(got[q][0].body).digest(), dist,
                                   bool(dist < o.threshold))
            signed[q] = p._sign(body)
        p.ch.broadcast(m.ENDORSE, m.SignedRecords([s.kind for s in signed.values()], [s.body for s in signed.values()],
                                                  [s.signature for s in signed.values()]), p.others)
        received = {p.ch.party: signed, **{q: self._read_endorsements(q, msg, got)
                                           for q, msg in p.ch.gather(m.ENDORSE, m.SignedRecords, p.others).items()}}
        signatures = np.ones(M, dtype=np.int64)  # the sender's own signature on its upload
        for e in p.parties:
            for q in p.parties:
                if q == e:
                    continue
                s = received[e][q]
                signatures[p.parties.index(q)] += int(decode(s.body, rec.Endorsement).endorsed)
                p._append(e, s)
        ok = signatures >= need
        accepted[:] = ok[:, None]
        bad = [f"{q}: {int(signatures[i])} of {M} signatures, needs {need}" for i, q in enumerate(p.parties)
               if not ok[i]]
        refusals = ["; ".join(bad)] * n_nodes
        p.rejected += int((~ok).sum())
        p.refused += ~ok
        return accepted, refusals

    def _read_endorsements(self, endorser: str, msg: m.SignedRecords, got) -> dict:
        p = self.p
        out = {}
        for kind, body, sig in zip(msg.kinds or [], msg.bodies or [], msg.signatures or []):
            signed = m.SignedRecord(kind, body, sig)
            e = p._open(endorser, signed, rec.Endorsement)
            if e.sender not in p.parties or e.sender == endorser or e.sender in out \
                    or e.digest != hashlib.sha256(got[e.sender][0].body).digest():
                raise ProtocolError(f"endorsement from {endorser} does not refer to an upload of this layer")
            out[e.sender] = signed
        if sorted(out) != sorted(q for q in p.parties if q != endorser):
            raise ProtocolError(f"{endorser} did not endorse or refuse every other party's upload")
        return out

    def _distance(self, upload, candidates, est_g: np.ndarray, est_n: np.ndarray) -> float:
        """Overlap distance between a sender's upload and this party's estimate of it (``est_g``, ``est_n``:
        per node and bin, this party's gradients and counts weighted by the PSD density ratio), over every
        node's candidate bins: ``D = ½(sum|G - Ĝ| / sum|Ĝ| + sum|N - N̂| / sum N̂)``."""
        return overlap_distance(upload, candidates, self.offsets, est_g, est_n)

    # -- splits ----------------------------------------------------------------------------------
    def apply_splits(self, layer, split_rows, splits, child_ids):
        self.local.apply_splits(layer, split_rows, splits, child_ids)
        st = self.layers[-1]
        st.split_rows = [int(r) for r in split_rows]
        st.splits = splits
        child = np.empty((2 * len(split_rows), 3))
        child[0::2] = splits.left_stats[split_rows]
        child[1::2] = st.totals[split_rows] - splits.left_stats[split_rows]
        child[:, 1:] = np.maximum(child[:, 1:], 0.0)
        self._contributions(st)
        return child

    def _contributions(self, st: _LayerState) -> None:
        """Split Shapley values and voting contributions of the layer's splits."""
        p = self.p
        M = len(p.parties)
        n = len(st.split_rows)
        st.shapley, st.vote_c, st.stderr = np.zeros((n, M)), np.zeros((n, M)), np.zeros((n, M))
        st.method = "exact"
        for k, j in enumerate(st.split_rows):
            f, b, ml = int(st.splits.feature[j]), int(st.splits.bin[j]), bool(st.splits.missing_left[j])
            acc = np.nonzero(st.accepted[:, j])[0]
            sums = []
            for i in acc:
                up = st.uploads[p.parties[i]]
                pos = int(up.offsets[j])
                for c in st.candidates[j][st.candidates[j] >= 0]:
                    nb = int(self.offsets[c + 1] - self.offsets[c])
                    if c == f:
                        sums.append(split_sums(up.hist[pos:pos + nb], b, ml))
                        break
                    pos += nb
            phi, se, method = shapley_values(np.array(sums), p.scorer.reg_lambda, p.scorer.gamma,
                                             p.o.n_permutations, seed=p.params.seed + self.tree)
            st.shapley[k, acc], st.stderr[k, acc] = phi, se
            st.method = method
            st.vote_c[k] = vote_contributions(float(st.splits.gain[j]), st.votes[:, j] == f)
        p.contributions[:, 0] += st.shapley.sum(axis=0)
        p.contributions[:, 1] += st.vote_c.sum(axis=0)

    def publish_records(self) -> None:
        """The requester's SplitRecord and ContributionRecord of every layer with splits: signed by it, checked
        against this party's own computation, appended to every replica."""
        p = self.p
        if p.ledger is None:
            return
        bodies = []
        for st in self.layers:
            if not st.split_rows:
                continue
            rows = st.split_rows
            mask = lambda a: np.array([int(sum(1 << i for i in range(len(p.parties)) if a[i, j]))  # noqa: E731
                                       for j in rows], dtype=np.int64)
            f = st.splits.feature[rows]
            bodies.append(rec.SplitRecord(self.tree, st.layer.depth, [int(st.layer.node_ids[j]) for j in rows],
                                          f.astype(np.int32), st.splits.bin[rows].astype(np.int32),
                                          st.splits.missing_left[rows].astype(np.uint8),
                                          st.splits.gain[rows].astype(np.float64),
                                          mask(st.votes == st.splits.feature[None, :]), mask(st.accepted),
                                          [st.refusals[j] for j in rows]))
            bodies.append(rec.ContributionRecord(self.tree, st.layer.depth, [int(st.layer.node_ids[j]) for j in rows],
                                                 st.shapley, st.vote_c, st.stderr, float(p.o.beta), st.method))
        if p.ch.party == p.requester:
            signed = [p._sign(b) for b in bodies]
            p.ch.broadcast("records", m.SignedRecords([s.kind for s in signed], [s.body for s in signed],
                                                      [s.signature for s in signed]), p.others)
        else:
            msg = p.ch.recv(p.requester, "records", m.SignedRecords)
            signed = [m.SignedRecord(k, b, s) for k, b, s in zip(msg.kinds or [], msg.bodies or [],
                                                                 msg.signatures or [])]
            if [s.body for s in signed] != [encode(b) for b in bodies]:
                raise ProtocolError(f"the splits or contributions {p.requester} recorded for tree {self.tree} differ "
                                    f"from {p.ch.party}'s own computation")
            for s, b in zip(signed, bodies):
                p._open(p.requester, s, type(b))
        with (p.ledger.batch()):
            for s in signed:
                p._append(p.requester, s)


def _nanmin(A):
    A = np.atleast_2d(A)
    present = ~np.isnan(A)
    return np.where(present.any(axis=0), np.where(present, A, np.inf).min(axis=0), 0.0)


def _nanmax(A):
    A = np.atleast_2d(A)
    present = ~np.isnan(A)
    return np.where(present.any(axis=0), np.where(present, A, -np.inf).max(axis=0), 0.0)


def overlap_distance(upload, candidates, offsets, est_g: np.ndarray, est_n: np.ndarray) -> float:
    """``D = ½(sum|G - Ĝ| / sum|Ĝ| + sum|N - N̂| / sum N̂)`` over every node's candidate bins of an upload."""
    G, N, Gh, Nh = [], [], [], []
    for j in range(len(candidates)):
        pos = int(upload.offsets[j])
        for f in candidates[j][candidates[j] >= 0]:
            a, b = int(offsets[f]), int(offsets[f + 1])
            part = upload.hist[pos:pos + b - a]
            G.append(part[:, 0])
            N.append(part[:, 2])
            Gh.append(est_g[j, a:b])
            Nh.append(est_n[j, a:b])
            pos += b - a
    if not G:
        return 0.0
    G, N, Gh, Nh = (np.concatenate(v) for v in (G, N, Gh, Nh))

    def term(x, est):
        denom = np.abs(est).sum()
        return np.abs(x - est).sum() / denom if denom > 0 else (0.0 if np.abs(x).sum() == 0 else 1.0)

    return float(0.5 * (term(G, Gh) + term(N, Nh)))
