"""The aggregator: sees only masked vectors and their sums (aggregated histograms),
chooses every split, and broadcasts the trees."""

from __future__ import annotations

import os
from dataclasses import replace

import numpy as np

from fedgrove.crypto.secagg import FixedPoint128, add128, check_public_key
from fedgrove.engine.binning import BinMapper
from fedgrove.engine.gbdt import GBDTParams, RoundSampler
from fedgrove.engine.grower import Layer, LayerSplits, SplitFinder, TreeGrower
from fedgrove.engine.losses import make_objective
from fedgrove.engine.model import GBDTModel
from fedgrove.engine.params import Flag
from fedgrove.engine.splitter import GBDTScorer, resolve_missing_direction
from fedgrove.exceptions import InvalidParameterError, ProtocolError
from fedgrove.protocols import check_same_features, check_same_width, peer_sketches
from fedgrove.protocols.horizontal import messages as m
from fedgrove.protocols.horizontal.common import base_score, check_params, column_bins, label_stats_length


class _Aggregation:
    """Sum the clients' masked vectors of one stage; the masks cancel."""

    def __init__(self, channel, clients, codec: FixedPoint128):
        self.ch, self.clients, self.codec = channel, clients, codec

    def collect(self, length: int) -> np.ndarray:
        hi = np.zeros(length, dtype=np.uint64)
        lo = np.zeros(length, dtype=np.uint64)
        for c in self.clients:
            v = self.ch.recv(c, m.UP, m.MaskedVector)
            if v.hi.shape != (length,) or v.lo.shape != (length,):
                raise ProtocolError(f"masked vector from {c} has {v.hi.shape[0]} entries, expected {length}")
            hi, lo = add128(hi, lo, v.hi, v.lo)
        return self.codec.decode(hi, lo)


class AggregatedSplitFinder(SplitFinder):
    def __init__(self, agg: _Aggregation, clients, bin_mapper: BinMapper, scorer: GBDTScorer, hist_stats: int,
                 tree: int, max_depth: int, feature_mask: np.ndarray | None = None):
        self.agg, self.clients = agg, clients
        self.bm = bin_mapper
        self.offsets = bin_mapper.feature_offsets
        self.total_bins = int(self.offsets[-1])
        self.scorer = scorer
        self.k = hist_stats
        self.n_stats = 3
        self.tree = tree
        self.max_depth = max_depth
        self.layer_no = 0
        self.hist: dict[int, np.ndarray] = {}   # node -> histogram (bins, k)
        self.thresholds = bin_mapper.thresholds()
        # the round's features (colsample_bytree): the clients send their bins alone
        self.feature_mask = np.ones(bin_mapper.n_features, dtype=np.bool_) if feature_mask is None else feature_mask
        self.columns = None if self.feature_mask.all() else np.nonzero(self.feature_mask)[0]
        self.bins = np.arange(self.total_bins) if self.columns is None else column_bins(self.offsets, self.columns)

    def _plan(self, **kw):
        plan = m.LayerPlan(tree=self.tree, layer=self.layer_no,
                           columns=[] if self.columns is None else self.columns.tolist(), **kw)
        for c in self.clients:
            self.agg.ch.send(c, m.CONTROL, plan)

    def _histograms(self, vec: np.ndarray, n_nodes: int) -> np.ndarray:
        """(n_nodes, total_bins, k) from the aggregated bins of the tree's features (the others' stay 0)."""
        hist = np.zeros((n_nodes, self.total_bins, self.k))
        hist[:, self.bins] = vec.reshape(n_nodes, len(self.bins), self.k)
        return hist

    def root_stats(self):
        self._plan(split_nodes=[], features=[], bins=[], missing_left=[], left=[], right=[], build=[0])
        vec = self.agg.collect(len(self.bins) * self.k + 1)
        self.hist[0] = self._histograms(vec[:-1], 1)[0]
        f = 0 if self.columns is None else int(self.columns[0])  # any feature's bins sum to the node's total
        f0 = slice(int(self.offsets[f]), int(self.offsets[f + 1]))
        g, h = self.hist[0][f0, 0].sum(), self.hist[0][f0, 1].sum()
        return np.array([g, h, vec[-1]])

    def sample_weight(self, stats):
        return np.atleast_2d(stats)[:, 2]

    def find_splits(self, layer: Layer) -> LayerSplits:
        hist = np.stack([self.hist[int(n)] for n in layer.node_ids])
        allowed = np.tile(self.feature_mask, (len(layer), 1))  # (writable: numba compiles read-only arrays apart)
        rows = np.arange(len(layer), dtype=np.int64)
        gain, feature, bins, ml, left = self.scorer.find(hist, rows, layer.stats, self.offsets, allowed)
        splits = LayerSplits(gain, feature, bins, ml, left, np.full(len(layer), np.nan),
                             np.full(len(layer), -1, dtype=np.int32))
        ok = feature >= 0
        splits.threshold[ok] = [self.thresholds[f][b] for f, b in zip(feature[ok], bins[ok])]
        resolve_missing_direction(splits, layer, hist, self.offsets, self.scorer)
        return splits

    def apply_splits(self, layer, split_rows, splits, child_ids):
        ids = [int(i) for i in layer.node_ids[split_rows]]
        left_stats = splits.left_stats[split_rows]
        right_stats = layer.stats[split_rows] - left_stats
        last = layer.depth + 1 >= self.max_depth
        # build the child with the smaller hessian sum, subtract for its sibling
        build, pairs = [], []
        for k, nid in enumerate(ids):
            small_left = left_stats[k, 1] <= right_stats[k, 1]
            small, large = (child_ids[k, 0], child_ids[k, 1]) if small_left else (child_ids[k, 1], child_ids[k, 0])
            if not last:
                build.append(int(small))
                pairs.append((nid, int(small), int(large)))
        self.layer_no += 1
        self._plan(split_nodes=ids, features=[int(f) for f in splits.feature[split_rows]],
                   bins=[int(b) for b in splits.bin[split_rows]],
                   missing_left=[int(x) for x in splits.missing_left[split_rows]],
                   left=[int(c) for c in child_ids[:, 0]], right=[int(c) for c in child_ids[:, 1]], build=build)
        n_hist = len(build) * len(self.bins) * self.k
        vec = self.agg.collect(n_hist + 2 * len(ids))
        built = self._histograms(vec[:n_hist], len(build))
        counts = vec[n_hist:]
        for j, (parent, small, large) in enumerate(pairs):
            self.hist[small] = built[j]
            self.hist[large] = self.hist[parent] - built[j]
        for nid in ids:
            self.hist.pop(nid, None)
        child = np.empty((2 * len(ids), 3))
        child[0::2, :2] = left_stats[:, :2]
        child[1::2, :2] = right_stats[:, :2]
        child[:, 2] = np.rint(counts)
        return child


class HorizontalAggregator:
    """``contributions=True`` (with the clients' ``contributions`` on too): after every tree each client sends,
    in the clear, its (G_left, H_left, G_right, H_right) at every split, and the aggregator computes every
    client's split Shapley value (:mod:`fedgrove.ledger.contributions`); totals go into the model's metadata.
    That reveals each client's gradient sums at the chosen splits (off by default)."""

    def __init__(self, channel, clients: list[str], params: GBDTParams, contributions: bool = False):
        check_params(params)
        Flag().check("contributions", contributions)  # a string such as "no" was taken as true
        self.ch, self.clients, self.params = channel, list(clients), params
        self.codec = FixedPoint128()
        self.contributions = contributions
        self.shapley = np.zeros(len(self.clients))
        self.shapley_var = np.zeros(len(self.clients))  # summed squared standard errors of sampled estimates

    def fit(self, checkpoint=None, resume: bool = False, progress=None) -> GBDTModel:
        """Train; with a ``checkpoint`` store, save after every round and (``resume``) continue from it.
        ``progress(trees_done, trees_total)`` is called after every tree."""
        ch, p = self.ch, self.params
        keys = {c: ch.recv(c, "key", m.MaskingKey).key for c in self.clients}
        for c, key in keys.items():  # before relaying: the clients would each find it, in no set order
            try:
                check_public_key(c, key)
            except ProtocolError as exc:
                raise ProtocolError(f"{ch.party}: {exc}") from None
        session = os.urandom(16)
        ch.broadcast("keys", m.MaskingKeys(list(keys), list(keys.values()), session), self.clients)
        sketches = [ch.recv(c, "sketch", m.Sketches) for c in self.clients]
        check_same_width({c: len(s.lengths) for c, s in zip(self.clients, sketches)})
        check_same_features({c: s.features_digest for c, s in zip(self.clients, sketches)})
        merged = None
        for c, s in zip(self.clients, sketches):
            sk = peer_sketches(s.values, s.weights, s.lengths, f"{ch.party}: from {c}")
            merged = sk if merged is None else [a.merge(b) for a, b in zip(merged, sk)]
        bm = BinMapper(p.max_bins).fit_sketches(merged)
        ch.broadcast("cuts", m.CutPoints(np.concatenate(bm.cuts_ + [np.empty(0)]),
                                         np.array([len(c) for c in bm.cuts_], dtype=np.int64), p.max_bins),
                     self.clients)
        agg = _Aggregation(ch, self.clients, self.codec)
        with ch.scope(stage="labels"):
            stats = agg.collect(label_stats_length(p))
        base = base_score(p, stats)
        ch.broadcast("base", m.BaseScore(base), self.clients)
        objective = make_objective(p.objective, p.n_classes or 1)
        model = GBDTModel(p.objective, objective.n_classes, base, bm, p.to_dict())
        state = checkpoint.load() if (checkpoint is not None and resume) else None
        if state is not None:
            from fedgrove.engine.model import model_from_dict

            saved = model_from_dict(state["model"], source=str(checkpoint.path))
            for t, c in zip(saved.trees, saved.tree_class):
                model.add_tree(t, c)
            if self.contributions:  # the earlier trees' contributions, which the model file gets at the end
                if "shapley" not in state:
                    raise InvalidParameterError(f"--resume: {checkpoint.path} holds no contributions (it was "
                                                f"written without [horizontal] contributions, or before they were "
                                                f"checkpointed): train anew")
                self.shapley = np.array(state["shapley"], dtype=np.float64)
                self.shapley_var = np.array(state["shapley_var"], dtype=np.float64)
        ch.broadcast("start", m.Start(model.n_trees), self.clients)
        scorer = GBDTScorer(p.reg_lambda, p.gamma, p.min_child_weight, p.min_samples_leaf)
        k = 3 if scorer.hist_needs_count else 2
        start = tree_id = model.n_trees
        # the engine's features (its rows are the clients' to draw, each its own: with subsample < 1 the features
        # are those the engine draws without row sampling)
        sampler = RoundSampler(replace(p, subsample=1.0), None, bm.n_features)
        for round_ in range(p.n_estimators):
            mask = sampler.feature_mask(sampler.next()[1])  # (drawn for the rounds a resumed run skips too)
            if (round_ + 1) * objective.n_outputs <= start:  # done before the checkpoint
                continue
            for c in range(objective.n_outputs):
                with ch.scope(tree=tree_id):
                    finder = AggregatedSplitFinder(agg, self.clients, bm, scorer, k, tree_id, p.max_depth, mask)
                    tree = TreeGrower(finder, p.max_depth, lambda s: p.learning_rate * scorer.leaf_value(s),
                                      min_samples_split=2 * p.min_samples_leaf).grow()
                    nodes = tree.nodes
                    ch.broadcast(m.CONTROL, m.TreeBroadcast(
                        tree_id, c, nodes["feature"], nodes["bin"], nodes["threshold"], nodes["missing_left"],
                        nodes["left"], nodes["right"], nodes["gain"], nodes["count"], nodes["depth"], tree.values),
                        self.clients)
                    if self.contributions:
                        self._contributions(tree_id, tree)
                model.add_tree(tree, c)
                tree_id += 1
                if checkpoint is not None and c == objective.n_outputs - 1 \
                        and checkpoint.due(tree_id // objective.n_outputs, p.n_estimators):
                    checkpoint.save({"trees_done": tree_id, "model": model.to_dict(),
                                     **({"shapley": self.shapley.tolist(), "shapley_var": self.shapley_var.tolist()}
                                        if self.contributions else {})})
                if progress is not None:
                    progress(tree_id, p.n_estimators * objective.n_outputs)
        with ch.scope(tree=tree_id):
            ch.broadcast(m.CONTROL, m.TrainingDone(tree_id), self.clients)
        if self.contributions:  # with more clients than are valued exactly, each total with its standard error
            from fedgrove.ledger import contributions

            sampled = len(self.clients) > contributions.EXACT_MAX
            se = np.sqrt(self.shapley_var)
            model.metadata["contributions"] = {c: {"shapley": float(v), **({"shapley_se": float(e)} if sampled
                                                                              else {})}
                                               for c, v, e in zip(self.clients, self.shapley, se)}
        return model

    def _contributions(self, tree_id: int, tree) -> None:
        from fedgrove.ledger import contributions

        p = self.params
        nodes = [int(n) for n in np.nonzero(~tree.is_leaf)[0]]
        per_client = []
        for c in self.clients:
            msg = self.ch.recv(c, m.UP, m.SplitSums)
            if msg.tree != tree_id or list(msg.nodes or []) != nodes or msg.sums.shape != (len(nodes), 4) \
                    or not np.all(np.isfinite(msg.sums)):
                raise ProtocolError(f"split sums from {c} do not match tree {tree_id}")
            per_client.append(msg.sums)
        sums = np.stack(per_client, axis=1)  # (nodes, clients, 4)
        if len(self.clients) <= contributions.EXACT_MAX:  # exact: every split at once
            for phi in contributions.exact_shapley_values(sums, p.reg_lambda, p.gamma):
                self.shapley += phi
            return
        for k in range(len(nodes)):  # each split its own permutations, so that the errors of the sum add up
            phi, se, _ = contributions.shapley_values(sums[k], p.reg_lambda, p.gamma,
                                                      seed=[int(p.seed), tree_id, k])
            self.shapley += phi
            self.shapley_var += se ** 2
