"""The Federated Forest master: draws each tree's bootstrap and features, picks every split from the scorers'
per-feature gains, relays partitions, and keeps the whole structure and the leaf values (no thresholds).

The master runs the engine's own :class:`~fedgrove.engine.grower.TreeGrower`
with the draws of :func:`~fedgrove.engine.forest.draw_tree`; its split finder
gathers the impurity decrease of every (node, feature) pair, computed by the
scorers with the engine's pair kernel, and chooses with the engine's
reduction (:func:`~fedgrove.engine.split.reduce_pairs`), features in the
order of the clients.  So the forest equals the engine's centralised forest
on the clients' columns side by side, tree for tree.
"""

from __future__ import annotations

import numpy as np

from fedgrove.engine.forest import ForestParams, draw_tree, node_feature_sampler
from fedgrove.engine.grower import Layer, LayerSplits, SplitFinder, TreeGrower
from fedgrove.engine.model import ForestModel
from fedgrove.engine.split import CRITERIA, cart_tie_floor, reduce_pairs
from fedgrove.engine.splitter import CARTScorer
from fedgrove.engine.tree import LEAF
from fedgrove.exceptions import InvalidParameterError, ProtocolError
from fedgrove.protocols import check_ids_everywhere, prediction_chunks
from fedgrove.protocols.forest import messages as m
from fedgrove.protocols.psi import ALIGN_HINT

PREDICTION_METHODS = ("one-round", "classical")


def check_method(method) -> None:
    if method not in PREDICTION_METHODS:
        raise InvalidParameterError(f"prediction method must be 'one-round' or 'classical', got {method!r}")


class ForestMaster:
    """The master's side of training and prediction.

    Parameters
    ----------
    channel : the master's Channel
    clients : client names, in the order their features are numbered
    params : ForestParams (``feature_sampling="tree"`` is the paper's per-tree draw)
    mode : ``"encrypted"`` (default: the label holder scores every client's features from encrypted
        histograms) or ``"shared"`` (the paper's trusted setting: labels are shared with every client)
    """

    def __init__(self, channel, clients: list[str], params: ForestParams, mode: str = "encrypted"):
        if mode not in m.MODES:
            raise InvalidParameterError(f"label mode must be one of {m.MODES}, got {mode!r}")
        if not clients:
            raise InvalidParameterError("Federated Forest needs at least one client")
        self.ch, self.clients, self.params, self.mode = channel, list(clients), params, mode

    # -- setup -------------------------------------------------------------------------------
    def _setup(self) -> None:
        ch, p = self.ch, self.params
        hello = {c: ch.recv(c, "hello", m.ClientHello) for c in self.clients}
        for c, h in hello.items():
            if h.n_features < 0 or h.n_samples < 0:
                raise ProtocolError(f"{c} says it holds {h.n_features} features of {h.n_samples} instances")
        holders = [c for c in self.clients if hello[c].has_labels]
        if len(holders) != 1:
            raise ProtocolError(f"exactly one client must hold the labels, found {holders or 'none'}")
        self.holder = holders[0]
        n = {hello[c].n_samples for c in self.clients}
        check_ids_everywhere({c: bool(hello[c].ids_digest) for c in self.clients})
        digests = {hello[c].ids_digest for c in self.clients if hello[c].ids_digest}
        if len(n) != 1 or len(digests) > 1:
            raise ProtocolError(f"the clients hold different sets of instances ({_sizes(hello)}): align them by ID "
                                f"first, {ALIGN_HINT}")
        self.n_samples = n.pop()
        # the instances every bootstrap draws among: the label holder's of positive weight (None: all)
        weighing = [c for c in self.clients if c != self.holder and (hello[c].weighted or hello[c].drawn)]
        if weighing:
            raise ProtocolError(f"{', '.join(weighing)} weigh{'s' if len(weighing) == 1 else ''} the instances, "
                                f"which only the label holder ({self.holder}) does")
        self.weighted = hello[self.holder].weighted
        self.drawn = None
        if hello[self.holder].drawn:
            self.drawn = np.nonzero(m.unpack_mask(hello[self.holder].drawn, self.n_samples))[0]
            if not len(self.drawn):
                raise ProtocolError(f"{self.holder} gives every instance weight 0")
        self.n_features = [hello[c].n_features for c in self.clients]
        self.first = np.concatenate([[0], np.cumsum(self.n_features)]).astype(np.int64)
        self.n_total = int(self.first[-1])
        self.owner_of = np.repeat(np.arange(len(self.clients)), self.n_features)
        if p.task == "classification":
            self.n_classes = hello[self.holder].n_classes
            if self.n_classes < 1:
                raise ProtocolError(f"{self.holder}'s labels are not class indices 0..K-1")
        else:
            self.n_classes = 1
        self.n_stats = self.n_classes if p.task == "classification" else 3
        setup = m.ForestSetup(self.mode, self.holder, self.clients, p.task, p.criterion,
                              self.n_classes if p.task == "classification" else 0, float(p.min_samples_leaf))
        ch.broadcast("setup", setup, self.clients)
        # who scores which features: the label holder all of them (encrypted), or each client its own
        self.scorers = [self.holder] if self.mode == "encrypted" else list(self.clients)

    def _draw(self, t: int):
        """Tree ``t``'s bootstrap (as the engine draws it among the instances of positive weight, the others 0)
        and drawn features."""
        if self.drawn is None:
            draw = draw_tree(self.params, t, self.n_samples, self.n_total)
        else:
            draw = draw_tree(self.params, t, len(self.drawn), self.n_total)
            weights = np.zeros(self.n_samples)
            weights[self.drawn] = draw.weights
            draw.weights = weights
        feats = np.arange(self.n_total) if draw.features is None else draw.features
        return draw, feats

    # -- training ----------------------------------------------------------------------------
    def fit(self, checkpoint=None, resume: bool = False, progress=None) -> ForestModel:
        """Train; with a ``checkpoint`` store, save after every tree and (``resume``) continue from it.
        ``progress(trees_done, trees_total)`` is called after every tree."""
        ch, p = self.ch, self.params
        self._setup()
        model = self._empty_model()
        state = checkpoint.load() if (checkpoint is not None and resume) else None
        if state is not None:
            from fedgrove.engine.model import model_from_dict

            model = model_from_dict(state["model"], source=str(checkpoint.path))
            model.params = self.params.to_dict()  # this run's (n_estimators may have been raised to grow on)
        start = model.n_trees
        ch.broadcast("start", m.Start(start), self.clients)
        for t in range(start, p.n_estimators):
            with ch.scope(tree=t):
                model.add_tree(self._grow(t))
                ch.broadcast(m.CONTROL, m.TreeEnd(t), self.clients)
            if checkpoint is not None and checkpoint.due(t + 1, p.n_estimators):
                checkpoint.save({"trees_done": t + 1, "model": model.to_dict()})
            if progress is not None:
                progress(t + 1, p.n_estimators)
        with ch.scope(tree=p.n_estimators):
            ch.broadcast(m.CONTROL, m.TrainingDone(p.n_estimators), self.clients)
        self.model = model
        return model

    def _empty_model(self) -> ForestModel:
        model = ForestModel(self.params.task, self.n_classes, None, self.params.to_dict())
        model.metadata.update({"protocol": "federated-forest", "label_mode": self.mode, "label_holder": self.holder,
                               "clients": self.clients,
                               "feature_owners": [[c, j] for c, k in zip(self.clients, self.n_features)
                                                  for j in range(k)]})
        if self.weighted:  # (the master never sees the weights; the holder's bootstrap statistics carry them)
            model.metadata["weighted_by"] = self.holder
        if self.params.task == "classification":
            model.classes = list(range(self.n_classes))
        return model

    def _grow(self, t: int):
        ch, p = self.ch, self.params
        draw, feats = self._draw(t)
        weights = draw.weights.astype(np.uint32)
        drawn = [feats[(feats >= self.first[k]) & (feats < self.first[k + 1])] - self.first[k]
                 for k in range(len(self.clients))]
        for k, c in enumerate(self.clients):
            ch.send(c, m.CONTROL, m.TreeStart(t, weights, drawn[k].astype(int).tolist()))
            if c in self.scorers:
                scored = self.clients if self.mode == "encrypted" else [c]
                idx = [self.clients.index(s) for s in scored]
                offsets = np.concatenate([[0], np.cumsum([len(drawn[i]) for i in idx])]).astype(np.int64)
                plan_feats = np.concatenate([drawn[i] for i in idx]).astype(np.int32)
                ch.send(c, m.CONTROL, m.ScoringPlan(scored, offsets, plan_feats))
        # the global feature index of each scorer's scored features, in its plan's order
        scored_global = {s: (feats if self.mode == "encrypted" else
                             feats[self.owner_of[feats] == self.clients.index(s)]).astype(np.int64)
                         for s in self.scorers}
        reply = ch.recv(self.holder, m.REPLY, m.RootStats)
        root = reply.stats
        if root.shape != (self.n_stats,) or not np.isfinite(root).all() or not np.isfinite(reply.offset):
            raise ProtocolError(f"root statistics from {self.holder} are not {self.n_stats} finite numbers: "
                                f"{root.tolist()[:8]} (offset {reply.offset})")
        cart = CARTScorer(p.criterion, 0.0, p.min_samples_leaf)
        # the root's weight: the bootstrap counts' sum, or with row weights their weighted sum (the holder's stats)
        cart.root_weight = float(cart.sample_weight(root))
        finder = _MasterFinder(self, cart, root, scored_global, node_feature_sampler(p, draw, self.n_total),
                               per_node=draw.features is None)
        grower = TreeGrower(finder, p.max_depth, cart.leaf_value, min_samples_split=p.min_samples_split,
                            min_split_gain=p.min_impurity_decrease, gain_inclusive=True)
        tree = grower.grow()
        if reply.offset:  # regression labels centred by the holder, as the engine does
            tree.values += reply.offset
        return tree

    # -- prediction --------------------------------------------------------------------------
    def predict_leaves(self, method: str = "one-round", model: ForestModel | None = None) -> np.ndarray:
        """Leaf of every test instance in every tree, with the clients' help (each holds its features of the
        same test instances); ends the prediction session.  The test instances' IDs (if the clients' files
        have them) are left in ``self.test_ids`` and the forest's output in ``self.test_output``, which the label
        holder is sent when it asked (it holds the test labels and scores them)."""
        model = model or self.model
        check_method(method)
        trained = model.metadata.get("clients")
        if trained and set(trained) != set(self.clients):
            raise InvalidParameterError(f"{self.ch.party}: the forest was trained with the clients "
                                        f"{', '.join(trained)}, the federation has {', '.join(self.clients)}; give "
                                        f"the config the model was trained with")
        hello = {c: self.ch.recv(c, "predict", m.TestHello) for c in self.clients}
        sizes = {h.n_samples for h in hello.values()}
        check_ids_everywhere({c: bool(len(h.ids)) for c, h in hello.items()}, "test file")
        ids = [h.ids for h in hello.values() if len(h.ids)]
        if len(sizes) != 1 or any(not np.array_equal(ids[0], x) for x in ids[1:]):
            raise ProtocolError(f"the clients' test sets differ ({_sizes(hello)}): every client's test file must "
                                f"hold the same instances (by _id)")
        n = sizes.pop()
        self.test_ids = ids[0] if ids else None
        scorers = [c for c, h in hello.items() if h.wants_scores]
        holder = model.metadata.get("label_holder")
        if any(c != holder for c in scorers):
            raise ProtocolError(f"{', '.join(c for c in scorers if c != holder)} asked for the test predictions, "
                                f"which only the label holder ({holder}) is sent")
        if method == "one-round":
            leaves = self._one_round(model, n)
        else:
            leaves = self._classical(model, n)
        self.ch.broadcast("predict", m.PredictDone(), self.clients)
        out = model._mean_values(leaves)
        self.test_output = out if model.task == "classification" else out[:, 0]
        for c in scorers:
            self.ch.send(c, "predict", m.TestPredictions(np.asarray(out, dtype=np.float64)))
        return leaves

    def predict(self, method: str = "one-round", model: ForestModel | None = None) -> np.ndarray:
        """Class probabilities (classification) or values (regression) of the clients' test instances."""
        self.predict_leaves(method, model)
        return self.test_output

    def _one_round(self, model: ForestModel, n: int) -> np.ndarray:
        """Each client sends, per leaf, the test instances that can reach it on its partial tree; an instance's
        leaf is the one every client's set contains (the paper's Proposition 1).  One round per chunk of test
        instances (chunks keep a message under :data:`~fedgrove.protocols.MAX_PREDICT_BYTES`; one chunk unless
        the test set and the forest are large)."""
        trees = model.trees
        leaf_ids = [np.nonzero(tree.is_leaf)[0] for tree in trees]
        out = np.full((n, len(trees)), -1, dtype=np.int32)
        for start, stop in prediction_chunks(n, sum(len(x) for x in leaf_ids)):
            req = m.LeafSetsRequest(n, len(trees), start, stop)
            self.ch.broadcast("predict", req, self.clients)
            sets = {c: self.ch.recv(c, "predict", m.LeafSets) for c in self.clients}
            width = stop - start
            for c, msg in sets.items():
                expect_t = [t for t, ids in enumerate(leaf_ids) for _ in ids]
                expect_l = [int(x) for ids in leaf_ids for x in ids]
                if list(msg.trees or []) != expect_t or list(msg.leaves or []) != expect_l \
                        or len(msg.masks or []) != len(expect_l):
                    raise ProtocolError(f"leaf sets from {c} do not match the forest's leaves")
            pos = 0
            for t, ids in enumerate(leaf_ids):  # a tree's leaves at once: (leaves, width) masks
                both = np.ones((len(ids), width), dtype=bool)
                for c in self.clients:
                    both &= m.unpack_masks(sets[c].masks[pos:pos + len(ids)], width)
                pos += len(ids)
                hits = both.sum(axis=0)
                if np.any(hits != 1):
                    raise ProtocolError(f"tree {t}: the clients' leaf sets put {int(np.sum(hits != 1))} test "
                                        f"instances in no leaf or several (Proposition 1 does not hold)")
                out[start:stop, t] = ids[both.argmax(axis=0)]
        return out

    def _classical(self, model: ForestModel, n: int) -> np.ndarray:
        """Node by node: per tree and depth, the owner of each split node tells which instances go left."""
        out = np.zeros((n, len(model.trees)), dtype=np.int32)
        for t, tree in enumerate(model.trees):
            node = np.zeros(n, dtype=np.int64)
            while True:
                internal = tree.nodes["feature"][node] != LEAF
                if not internal.any():
                    break
                queries: dict[int, list] = {}
                for nid in np.unique(node[internal]).tolist():
                    queries.setdefault(int(tree.nodes["owner"][nid]), []).append(nid)
                for k, nids in queries.items():
                    masks = [m.pack_mask(node == nid) for nid in nids]
                    self.ch.send(self.clients[k], "predict", m.RouteQuery(t, nids, masks))
                for k, nids in queries.items():
                    reply = self.ch.recv(self.clients[k], "predict", m.RouteBits)
                    if len(reply.masks or []) != len(nids):
                        raise ProtocolError(f"{self.clients[k]} answered {len(reply.masks or [])} of {len(nids)} "
                                            f"route queries")
                    for nid, bits in zip(nids, reply.masks):
                        sel = np.nonzero(node == nid)[0]
                        go = m.unpack_mask(bits, len(sel))
                        node[sel] = np.where(go, tree.nodes["left"][nid], tree.nodes["right"][nid])
            out[:, t] = node
        return out


class _MasterFinder(SplitFinder):
    """The master's split finder: per-feature gains from the scorers, the engine's choice among them."""

    def __init__(self, master: ForestMaster, cart: CARTScorer, root: np.ndarray, scored_global: dict,
                 allowed_fn, per_node: bool):
        self.mst, self.cart, self.root = master, cart, root
        self.scored = scored_global
        self.allowed_fn = allowed_fn
        self.per_node = per_node
        self.n_stats = len(root)
        # position of each global feature in its scorer's plan
        self.position = {}
        for s, g in scored_global.items():
            for pos, f in enumerate(g.tolist()):
                self.position[f] = (s, pos)

    def root_stats(self):
        return self.root

    def sample_weight(self, stats):
        return self.cart.sample_weight(np.atleast_2d(stats))

    def splittable(self, stats):
        return self.cart.splittable(stats)

    def find_splits(self, layer: Layer) -> LayerSplits:
        mst = self.mst
        ch = mst.ch
        n_nodes = len(layer)
        allowed = np.ascontiguousarray(self.allowed_fn(layer), dtype=bool)
        nodes = [int(i) for i in layer.node_ids]
        empty = np.zeros((0, 0))
        for c in mst.clients:
            if c in self.scored:
                mask = allowed[:, self.scored[c]] if self.per_node else np.zeros((0, 0), dtype=bool)
                ch.send(c, m.CONTROL, m.LayerRequest(layer.depth, nodes, layer.stats, mask))
            else:
                ch.send(c, m.CONTROL, m.LayerRequest(layer.depth, nodes, empty, np.zeros((0, 0), dtype=bool)))
        pg = np.full((n_nodes, mst.n_total), -np.inf)
        pm = np.zeros((n_nodes, mst.n_total), dtype=bool)
        for s, g in self.scored.items():
            reply = ch.recv(s, m.REPLY, m.FeatureGains)
            if reply.gains.shape != (n_nodes, len(g)) or reply.missing_left.shape != reply.gains.shape \
                    or np.any(np.isnan(reply.gains)) or np.any(reply.gains == np.inf):
                raise ProtocolError(f"feature gains from {s} do not match layer {layer.depth}")
            pg[:, g] = np.where(allowed[:, g], reply.gains, -np.inf)
            pm[:, g] = reply.missing_left
        n_pairs = n_nodes * mst.n_total
        gain, feature, _, missing_left, _ = reduce_pairs(
            pg.ravel(), np.zeros(n_pairs, dtype=np.int32), pm.ravel(), np.zeros((n_pairs, 1)), n_nodes, mst.n_total,
            cart_tie_floor(CRITERIA[self.cart.criterion]))
        owner = np.where(feature >= 0, mst.owner_of[np.maximum(feature, 0)], -1).astype(np.int32)
        return LayerSplits(gain, feature, np.full(n_nodes, -1, dtype=np.int32), missing_left,
                           np.zeros((n_nodes, self.n_stats)), np.full(n_nodes, np.nan), owner)

    def apply_splits(self, layer, split_rows, splits, child_ids):
        mst = self.mst
        ch = mst.ch
        ids = [int(i) for i in layer.node_ids[split_rows]]
        by_scorer: dict[str, list] = {}
        by_owner: dict[int, list] = {}
        for k, row in enumerate(split_rows):
            f = int(splits.feature[row])
            s, pos = self.position[f]
            by_scorer.setdefault(s, []).append((k, pos))
            by_owner.setdefault(int(mst.owner_of[f]), []).append(k)
        for s, items in by_scorer.items():
            ch.send(s, m.CONTROL, m.SplitDecisions(layer.depth, [ids[k] for k, _ in items], [p for _, p in items]))
        for o, ks in by_owner.items():
            if mst.clients[o] not in by_scorer:  # encrypted mode: the label holder sends the owner its bins
                ch.send(mst.clients[o], m.CONTROL, m.SplitOwners(layer.depth, [ids[k] for k in ks]))
        left = np.zeros((len(ids), self.n_stats))
        for s, items in by_scorer.items():
            reply = ch.recv(s, m.REPLY, m.ChildStats).left
            if reply.shape != (len(items), self.n_stats) or not np.all(np.isfinite(reply)):
                raise ProtocolError(f"child statistics from {s} do not match its {len(items)} decisions")
            left[[k for k, _ in items]] = reply
        masks: list = [None] * len(ids)
        for o in sorted(by_owner):
            reply = ch.recv(mst.clients[o], m.REPLY, m.SplitMasks)
            if len(reply.masks or []) != len(by_owner[o]):
                raise ProtocolError(f"{mst.clients[o]} sent {len(reply.masks or [])} partitions for "
                                    f"{len(by_owner[o])} splits")
            for k, bits in zip(by_owner[o], reply.masks):
                masks[k] = bits
        ch.broadcast(m.CONTROL, m.LayerPartition(layer.depth, ids, [int(c) for c in child_ids[:, 0]],
                                                 [int(c) for c in child_ids[:, 1]], masks), mst.clients)
        child = np.empty((2 * len(ids), self.n_stats))
        child[0::2] = left
        child[1::2] = layer.stats[split_rows] - left
        return child


def _sizes(hello: dict) -> str:
    """The clients' row counts, from their hellos, and whether only their instance IDs differ."""
    sizes = {c: h.n_samples for c, h in hello.items()}
    return f"{sizes} rows" + (" each, but other instance IDs" if len(set(sizes.values())) == 1 else "")
