"""A client: its own samples and labels; sends sketches and masked vectors only."""

from __future__ import annotations

import numpy as np

from fedgrove.crypto.secagg import FixedPoint128, MaskingKeys, add128
from fedgrove.engine.binning import BinMapper, column_major
from fedgrove.engine.gbdt import (GBDTParams, RoundSampler, check_sample_weight, check_xy, checked_weights,
                                  weighted_rows)
from fedgrove.engine.losses import make_objective
from fedgrove.engine.model import GBDTModel, check_row_labels, names_of
from fedgrove.engine.params import Flag
from fedgrove.engine.splitter import GBDTScorer, HistogramSplitFinder
from fedgrove.engine.tree import PackedEnsemble, Tree
from fedgrove.exceptions import ProtocolError
from fedgrove.protocols import features_digest, peer_tree
from fedgrove.protocols.horizontal import messages as m
from fedgrove.protocols.horizontal.common import check_params, column_bins, label_stats


class HorizontalClient:
    """A client of the horizontal protocol.  ``sample_weight`` (optional, one weight per row): as the engine's,
    each row's weight scales its gradient and hessian, its share of the quantile sketch the cut points come from
    and of the base score; rows of weight 0 are left out.  The weights never leave the client, but the sums the
    aggregator learns are weighted ones."""

    def __init__(self, channel, X, y, aggregator: str, params: GBDTParams, contributions: bool = False,
                 schema=None, sample_weight=None):
        check_params(params)
        Flag().check("contributions", contributions)
        self.feature_names = names_of(X)  # a DataFrame's columns: the model keeps them, as the engine's does
        # checked equal across parties: the names in order (and, from the runner, the categories)
        self.schema = self.feature_names if schema is None else [str(n) for n in schema]
        self.ch, self.agg, self.params = channel, aggregator, params
        self.contributions = contributions  # send per-split sums after each tree (see SplitSums)
        if sample_weight is not None:
            check_row_labels({"X": X, "y": y, "sample_weight": sample_weight})
        self.X, self.y = check_xy(X, y)
        # (a regression's range is checked with the labels, in fit)
        self.weights = None if sample_weight is None else check_sample_weight(sample_weight, len(self.y))
        self.codec = FixedPoint128()

    def _send_masked(self, tag_scope: str, vector: np.ndarray) -> None:
        hi, lo = self.codec.encode(vector)
        mhi, mlo = self.keys.mask128(tag_scope, len(vector))
        hi, lo = add128(hi, lo, mhi, mlo)
        self.ch.send(self.agg, m.UP, m.MaskedVector(hi, lo))

    def fit(self, checkpoint=None, resume: bool = False) -> GBDTModel:
        """Train; with a ``checkpoint`` store, save after every round and (``resume``) continue from it."""
        ch, p = self.ch, self.params
        objective = make_objective(p.objective, p.n_classes or 1)
        y = objective.check_labels(self.y)
        X, w = self.X, None
        if self.weights is not None:  # as the engine: rows of weight 0 left out
            X, y, w = weighted_rows(X, y, checked_weights(self.weights, y, objective.name))
        self.keys = MaskingKeys(ch.party)
        ch.send(self.agg, "key", m.MaskingKey(self.keys.public_bytes()))
        relay = ch.recv(self.agg, "keys", m.MaskingKeys)
        if len(relay.names) != len(relay.keys) or len(set(relay.names)) != len(relay.names):
            raise ProtocolError(f"{ch.party}: the relayed key list names {len(relay.names)} parties "
                                f"({len(set(relay.names))} distinct) for {len(relay.keys)} keys")
        if ch.party not in relay.names or relay.keys[relay.names.index(ch.party)] != self.keys.public_bytes():
            raise ProtocolError(f"{ch.party}: the relayed key list does not hold this party's key")
        self.keys.agree(dict(zip(relay.names, relay.keys)), relay.session)
        sketches = BinMapper(p.max_bins, subsample=None).sketches(X, w)
        ch.send(self.agg, "sketch", m.Sketches(np.concatenate([s.values for s in sketches]),
                                               np.concatenate([s.weights for s in sketches]),
                                               np.array([len(s.values) for s in sketches], dtype=np.int64),
                                               features_digest(self.schema)))
        cuts = ch.recv(self.agg, "cuts", m.CutPoints)
        if len(cuts.lengths) != X.shape[1] or int(cuts.lengths.sum()) != len(cuts.cuts):
            raise ProtocolError(f"{ch.party}: cut points do not match the {X.shape[1]} features")
        bm = BinMapper.from_cuts(np.split(cuts.cuts, np.cumsum(cuts.lengths)[:-1]), cuts.max_bins)
        X_binned = bm.transform(X)
        X_columns = column_major(X_binned)
        with ch.scope(stage="labels"):
            self._send_masked("labels", label_stats(p, y, w))
        base = ch.recv(self.agg, "base", m.BaseScore).values
        if base.shape != (objective.n_outputs,) or not np.isfinite(base).all():
            raise ProtocolError(f"{ch.party}: the base score from {self.agg} is {base.tolist()[:8]}, expected "
                                f"{objective.n_outputs} finite number(s)")
        model = GBDTModel(p.objective, objective.n_classes, base, bm, p.to_dict(), self.feature_names)
        scorer = GBDTScorer(p.reg_lambda, p.gamma, p.min_child_weight, p.min_samples_leaf)
        raw = np.tile(base, (len(y), 1))
        thresholds = bm.thresholds()
        K = objective.n_outputs
        tree_id = ch.recv(self.agg, "start", m.Start).tree
        if not 0 <= tree_id <= p.n_estimators * K or tree_id % K:
            raise ProtocolError(f"{ch.party}: {self.agg} starts at tree {tree_id}, which begins none of the "
                                f"{p.n_estimators} rounds of {K} tree(s)")
        if tree_id > 0:
            from fedgrove.engine.model import model_from_dict
            from fedgrove.runner.checkpoint import CheckpointStore

            state = CheckpointStore.resume_state(checkpoint, resume, tree_id, ch.party, self.agg)
            saved = model_from_dict(state["model"], source=str(checkpoint.path))
            for t, c in list(zip(saved.trees, saved.tree_class))[:tree_id]:
                model.add_tree(t, c)
            # the trees' own routing (bin codes) replays the training scores exactly
            leaves = PackedEnsemble(model.trees).leaves_binned(X_binned, bm.missing_codes)
            raw = np.ascontiguousarray(model.raw_from_leaves(leaves).reshape(len(y), K))
        # subsample: the client draws its own rows each round from its own generator (the aggregator learns only
        # the sampled rows' sums, as it did all rows'); a resumed run draws the earlier rounds' again
        sampler = RoundSampler(p, len(y), X.shape[1], seed=[p.seed, 67, relay.names.index(ch.party)])
        for _ in range(tree_id // K):
            sampler.next()
        rows = None
        while True:
            c = tree_id % K
            if c == 0:
                g, h = objective.gradients(y, raw)
                if w is not None:
                    g, h = g * w[:, None], h * w[:, None]
                rows = sampler.next()[0]  # (its features are the aggregator's to draw)
            stats = np.column_stack([g[:, c], h[:, c]] + ([np.ones(len(y))] if scorer.hist_needs_count else []))
            finder = HistogramSplitFinder(X_binned, bm.feature_offsets, bm.missing_codes, thresholds, stats, scorer,
                                          root_samples=rows, X_columns=X_columns)
            with ch.scope(tree=tree_id):
                while True:
                    msg = ch.recv(self.agg, m.CONTROL)
                    if isinstance(msg, m.TrainingDone):
                        return model
                    if isinstance(msg, m.TreeBroadcast):
                        where = f"{ch.party}: tree {tree_id} from {self.agg}"
                        if msg.tree != tree_id or msg.output != c:
                            raise ProtocolError(f"{where}: it says tree {msg.tree!r}, output {msg.output!r} "
                                                f"(expected {tree_id}, {c})")
                        tree = self._tree(msg, where, X.shape[1])
                        if tree.n_nodes != finder.next_node_id() or finder.unknown_nodes(np.arange(tree.n_nodes)):
                            raise ProtocolError(f"{where}: its {tree.n_nodes} nodes are not the "
                                                f"{finder.next_node_id()} of the layer plans")
                        if self.contributions:
                            ch.send(self.agg, m.UP, _split_sums(tree_id, tree, finder, stats))
                        model.add_tree(tree, msg.output)
                        if rows is None:
                            leaves = np.nonzero(tree.is_leaf)[0]
                            finder.add_node_values(raw, msg.output, leaves, tree.values[leaves, 0])
                        else:  # the rows left out of the round are routed too
                            leaf = PackedEnsemble([tree]).leaves_binned(X_binned, bm.missing_codes)[:, 0]
                            raw[:, msg.output] += tree.values[leaf, 0]
                        if checkpoint is not None and msg.output == K - 1 \
                                and checkpoint.due((tree_id + 1) // K, p.n_estimators):
                            checkpoint.save({"trees_done": tree_id + 1, "model": model.to_dict()})
                        break
                    if not isinstance(msg, m.LayerPlan) or msg.tree != tree_id:
                        raise ProtocolError(f"{ch.party}: unexpected {type(msg).__name__} in tree {tree_id}")
                    self._layer(msg, finder)
            tree_id += 1

    def _layer(self, plan: m.LayerPlan, finder: HistogramSplitFinder) -> None:
        counts = []
        self._check_plan(plan, finder)
        if plan.split_nodes:
            for f in plan.features:
                if not 0 <= f < finder.n_features:
                    raise ProtocolError(f"{self.ch.party}: split on unknown feature {f}")
            mids = finder.partition(plan.split_nodes, plan.features, plan.bins, plan.missing_left)
            children = list(zip(plan.left, plan.right))
            finder.record_children(plan.split_nodes, children, mids)
            for left, right in children:
                counts += [len(finder.node_samples(left)), len(finder.node_samples(right))]
        else:
            counts = [len(finder.node_samples(0))]
        hist = np.zeros((0,))
        if plan.build:
            hist = finder.histograms_of(plan.build, plan.columns or None)
            if plan.columns:  # the tree's features alone: built and sent
                hist = hist[:, column_bins(finder.feature_offsets, plan.columns)]
        vector = np.concatenate([hist.ravel(), np.asarray(counts, dtype=np.float64)])
        self._send_masked(f"tree={plan.tree}/layer={plan.layer}", vector)

    def _check_plan(self, plan: m.LayerPlan, finder: HistogramSplitFinder) -> None:
        """The aggregator's layer plan names nodes of this tree: split nodes and the nodes whose histograms it
        asks for exist, each split has its features, bins and two new children, numbered after the known nodes."""
        where = f"{self.ch.party}: layer plan of tree {plan.tree}"
        split = list(plan.split_nodes or [])
        lists = [list(x or []) for x in (plan.features, plan.bins, plan.missing_left, plan.left, plan.right)]
        if any(len(x) != len(split) for x in lists):
            raise ProtocolError(f"{where}: {len(split)} split nodes but lists of lengths {[len(x) for x in lists]}")
        unknown = finder.unknown_nodes(split)
        if unknown or len(set(split)) != len(split):
            raise ProtocolError(f"{where}: split nodes {unknown or split} are not distinct nodes of the tree")
        children = lists[3] + lists[4]
        first = finder.next_node_id()
        if sorted(children) != list(range(first, first + len(children))):
            raise ProtocolError(f"{where}: children {children} are not the next {len(children)} node ids from "
                                f"{first}")
        bad = [b for b in finder.unknown_nodes(plan.build or []) if b not in children]
        if bad:
            raise ProtocolError(f"{where}: histograms asked for nodes {bad} the tree does not have")
        if plan.columns:
            cols = list(plan.columns)
            if cols != sorted(set(cols)) or not all(0 <= f < finder.n_features for f in cols):
                raise ProtocolError(f"{where}: its features {cols} are not distinct sorted features 0 to "
                                    f"{finder.n_features - 1}")

    @staticmethod
    def _tree(msg: m.TreeBroadcast, where: str, n_features: int) -> Tree:
        cols = {name: getattr(msg, name) for name in ("feature", "bin", "threshold", "missing_left", "left", "right",
                                                       "gain", "count", "depth")}
        return peer_tree({**cols, "owner": np.full(len(msg.feature), -1)}, msg.values, where, n_features)


def _split_sums(tree_id: int, tree: Tree, finder: HistogramSplitFinder, stats: np.ndarray) -> m.SplitSums:
    """This client's (G_left, H_left, G_right, H_right) at every internal node of ``tree`` (``stats``: its own
    per-sample (g, h[, 1]) in row order)."""
    nodes = [int(n) for n in np.nonzero(~tree.is_leaf)[0]]
    sums = np.zeros((len(nodes), 4))
    for k, nid in enumerate(nodes):
        for c, child in ((0, "left"), (2, "right")):
            rows = finder.node_samples(int(tree.nodes[child][nid]))
            sums[k, c:c + 2] = stats[rows, :2].sum(axis=0)
    return m.SplitSums(tree_id, nodes, sums)
