"""The HybridTree host: labels, its own features and all instances.  It grows the
top ``host_depth`` layers itself, then, per guest, ``guest_depth`` layers on that
guest's features from encrypted per-layer histograms (one round per layer for
all of the guest's open nodes).  Hessian mode: leaf values come from the node
totals the host holds in plaintext."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import numpy as np
from numba import njit

from fedgrove.crypto.he import HEContext
from fedgrove.engine.binning import column_major
from fedgrove.engine.gbdt import AlignedWeights, GBDTParams, RoundSampler, check_xy, mask_for_every_node
from fedgrove.engine.grower import Layer, LayerSplits, TreeGrower
from fedgrove.engine.losses import OBJECTIVES, objective_for
from fedgrove.engine.model import TEXT_FEATURES, as_numbers, by_names, check_tree_class, names_of
from fedgrove.engine.params import Flag, Interval
from fedgrove.engine.predict import find_position, id_positions
from fedgrove.engine.splitter import GBDTScorer, HistogramSplitFinder, resolve_missing_direction
from fedgrove.engine.tree import PackedEnsemble, Tree
from fedgrove.exceptions import InvalidParameterError, ModelFormatError, ProtocolError
from fedgrove.log import logger
from fedgrove.protocols.hybridtree import messages as m
from fedgrove.protocols.hybridtree.guest import subtree_leaves
from fedgrove.runner.checkpoint import CheckpointStore
from fedgrove.crypto.packing import RowPacking
from fedgrove.protocols.vertical.active import _Remote, decode_histograms, packer_for, row_packing_for
from fedgrove.protocols import instance_ids, prediction_chunks, refuse_unsupported


@dataclass
class HybridHostModel:
    """What the host keeps: its subtrees, and per tree and guest the values of the guest's leaves."""

    objective: str
    base_score: np.ndarray
    host_trees: list[Tree] = field(default_factory=list)
    tree_class: list[int] = field(default_factory=list)
    guest_values: list[dict] = field(default_factory=list)  # per tree: {guest: {node: value}}
    # per guest, per column of its features: the summed gain of the splits the host chose there, and their
    # number (the host scores the guests' histograms, so it knows these; not the thresholds, nor the names)
    guest_gains: dict = field(default_factory=dict)  # {guest: [gain per column]}
    guest_splits: dict = field(default_factory=dict)  # {guest: [splits per column]}
    feature_names: list | None = None  # the host's own columns' names when it trained on named data
    # per tree: {guest: {node: (left, right)}}, the guests' splits the host chose (their node numbers alone: not
    # the features, nor the thresholds), by which it reads the guests' leaves as ranks below the hand-off nodes;
    # None in a model file written before 2026-12-07 (its guests answer with node numbers)
    guest_children: list | None = None

    def to_dict(self) -> dict:
        return {"format": "fedgrove-hybridtree-host", "version": 1, "objective": self.objective,
                "base_score": self.base_score.tolist(), "tree_class": self.tree_class,
                "host_trees": [t.to_dict() for t in self.host_trees],
                "guest_values": [{u: {str(k): v for k, v in vals.items()} for u, vals in per_tree.items()}
                                 for per_tree in self.guest_values],
                "guest_gains": self.guest_gains, "guest_splits": self.guest_splits,
                **({} if self.feature_names is None else {"feature_names": list(self.feature_names)}),
                **({} if self.guest_children is None else {"guest_children": [
                    {u: [[int(k), int(a), int(b)] for k, (a, b) in kids.items()] for u, kids in per_tree.items()}
                    for per_tree in self.guest_children]})}

    def leaf_orders(self) -> list:
        """Per tree and guest, the leaves below each of its hand-off nodes, left to right (:func:`subtree_leaves`
        of ``guest_children``): {guest: {node: [leaf, ...]}}; ValueError names a guest's splits that are not
        trees below their hand-off nodes.  Kept for the trees it was computed for (trees are only added)."""
        orders = self.__dict__.setdefault("_leaf_orders", [])
        for t in range(len(orders), len(self.guest_children or [])):
            per_tree = {}
            for u, kids in self.guest_children[t].items():
                try:
                    per_tree[u] = subtree_leaves(kids)
                except ValueError as exc:
                    raise ValueError(f"the splits of {u} in tree {t}: {exc}") from None
            orders.append(per_tree)
        return orders

    def add_guest_split(self, guest: str, n_features: int, feature: int, gain: float) -> None:
        gains = self.guest_gains.setdefault(guest, [0.0] * n_features)
        splits = self.guest_splits.setdefault(guest, [0] * n_features)
        gains[feature] += float(gain)
        splits[feature] += 1

    @classmethod
    def from_dict(cls, d: dict) -> "HybridHostModel":
        if d.get("format") != "fedgrove-hybridtree-host" or d.get("version") != 1:
            raise ModelFormatError("not a version-1 HybridTree host model")
        try:
            model = cls(d["objective"], np.asarray(d["base_score"], dtype=np.float64),
                        [Tree.from_dict(t) for t in d["host_trees"]], [int(c) for c in d["tree_class"]],
                        [{str(u): {int(k): float(v) for k, v in vals.items()} for u, vals in per_tree.items()}
                         for per_tree in d["guest_values"]],
                        {str(u): [float(v) for v in vals] for u, vals in d.get("guest_gains", {}).items()},
                        {str(u): [int(v) for v in vals] for u, vals in d.get("guest_splits", {}).items()},
                        None if d.get("feature_names") is None else [str(n) for n in d["feature_names"]],
                        None if d.get("guest_children") is None else
                        [{str(u): _splits_of(kids) for u, kids in per_tree.items()}
                         for per_tree in d["guest_children"]])
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ModelFormatError(f"not a HybridTree host model: {type(exc).__name__}: {exc}") from None
        if set(model.guest_gains) != set(model.guest_splits) or any(
                len(model.guest_gains[u]) != len(model.guest_splits[u]) for u in model.guest_gains):
            raise ModelFormatError("guest_gains and guest_splits do not name the same guests and columns")
        if not isinstance(model.objective, str) or model.objective not in OBJECTIVES \
                or model.base_score.ndim != 1 or not len(model.base_score):
            raise ModelFormatError(f"objective {model.objective!r} with base_score {d['base_score']!r}: expected "
                                   f"one of {', '.join(OBJECTIVES)} and a score per output")
        check_tree_class(model.tree_class, len(model.base_score))
        if foreign := [t for t, tree in enumerate(model.host_trees) if tree.foreign_splits]:
            raise ModelFormatError(f"host tree {foreign[0]} has a split without a threshold (the host grows its "
                                   f"layers alone: each of its splits has one)")
        if not np.isfinite(model.base_score).all():
            raise ModelFormatError(f"base_score {d['base_score']!r} is not finite")
        if bad := [(t, u) for t, per_tree in enumerate(model.guest_values) for u, vals in per_tree.items()
                   if not np.isfinite(list(vals.values())).all()]:
            raise ModelFormatError(f"guest leaf values of tree {bad[0][0]} from {bad[0][1]} are not all finite")
        if not len(model.host_trees) == len(model.tree_class) == len(model.guest_values):
            raise ModelFormatError(f"{len(model.host_trees)} host trees, {len(model.tree_class)} output columns "
                                   f"and {len(model.guest_values)} sets of guest leaves: one of each per tree")
        if model.guest_children is not None:
            if len(model.guest_children) != len(model.host_trees):
                raise ModelFormatError(f"{len(model.host_trees)} host trees and {len(model.guest_children)} sets of "
                                       f"guest splits: one of each per tree")
            try:
                orders = model.leaf_orders()
            except ValueError as exc:
                raise ModelFormatError(str(exc)) from None
            for t, per_tree in enumerate(model.guest_children):
                host_leaves = set(np.flatnonzero(model.host_trees[t].is_leaf).tolist())
                for u, kids in per_tree.items():
                    if below := sorted(orders[t][u].keys() - host_leaves):
                        raise ModelFormatError(f"the splits of {u} in tree {t} hang below node {below[0]}, which is "
                                               f"not a leaf of the host's tree {t}")
                    # (a value for a leaf, or for a hand-off node the guest grew nothing below; not for a split)
                    if stray := sorted(set(model.guest_values[t].get(u, {})) & set(kids)):
                        raise ModelFormatError(f"tree {t} holds a value for node {stray[0]} of {u}, which is one "
                                               f"of {u}'s splits there, not a leaf")
        return model


def _splits_of(kids: list) -> dict:
    """A guest's splits of one tree from a model file, ``[[node, left, right], ...]``, as {node: (left, right)}:
    node numbers, non-negative integers."""
    if any(len(r) != 3 for r in kids):
        raise ValueError(f"splits {next(r for r in kids if len(r) != 3)!r} are not [node, left, right]")
    flat = [v for r in kids for v in r]
    if set(map(type, flat)) - {int} or (flat and min(flat) < 0):
        bad = next(v for v in flat if type(v) is not int or v < 0)
        raise ValueError(f"node {bad!r} is not a non-negative integer")
    splits = {}
    for k, a, b in kids:
        if k in splits:
            raise ValueError(f"a node is split twice: node {k}")
        splits[k] = (a, b)
    return splits


MODES = ("hessian", "count")
#: the most (tree, guest, host node) slots of the tables by which the host reads the guests' leaf ranks
RANK_SLOTS_MAX = 1 << 22
SCALE_BITS = 53  # fractional bits of the scalar 1/(|I|+lambda) in count mode


class HybridHost:
    """``mode="hessian"`` (default): guests' leaves use the hessians, values computed by the host from the
    node totals it holds.  ``mode="count"`` (the paper's Eq. 7-8, h = 1 in the guest layers): guests compute
    Enc(leaf value) by a scalar multiplication and return per-instance encrypted predictions masked so that
    the host learns only their sum over the guests holding an instance.  The trees are ``host_depth +
    guest_depth`` deep; ``params.max_depth`` is not read.

    ``sample_weight`` (hessian mode): each instance's weight, which the host holds with the labels.  As the
    engine's, it scales the instance's gradient and hessian (the guests get them encrypted so), its share of the
    host's cut points and of the base score, so that without guest layers the model is the host's weighted
    SOLO; instances of weight 0 are left out of every tree as a row subsample leaves them out (the guests learn
    which of theirs they are).  Count mode takes none: its guests' leaf values count instances."""

    def __init__(self, channel, X, y, guests: list[str], params: GBDTParams, he: HEContext, host_depth: int,
                 guest_depth: int, ids=None, mode: str = "hessian", shared_only: bool = False,
                 rows_per_ciphertext: int | None = None, sample_weight=None):
        if mode not in MODES:
            raise InvalidParameterError(f"HybridTree mode must be one of {MODES}, got {mode!r}")
        if sample_weight is not None and mode == "count":
            raise InvalidParameterError("HybridTree's count mode takes no row weights: its guests compute their "
                                        "leaf values from instance counts, and do not hold the weights; use mode "
                                        "\"hessian\"")
        self.mode = mode
        Flag().check("shared_only", shared_only)  # a string such as "no" was taken as true
        self.shared_only = shared_only  # guests may hold instances this host lacks (several hosts)
        self._plan = None  # count mode: see _aggregation_plan
        if params.min_samples_leaf > 1 or params.min_child_weight <= 0:
            raise InvalidParameterError("HybridTree exchanges no per-bin counts: it needs min_samples_leaf=1 and "
                                        "min_child_weight > 0")
        refuse_unsupported(params, "HybridTree")
        if params.subsample < 1 and mode == "count":
            raise InvalidParameterError(f"HybridTree's count mode does not sample rows (subsample="
                                        f"{params.subsample}): its guests return an encrypted prediction for every "
                                        f"instance from the gradients they got; use subsample = 1, or mode "
                                        f"\"hessian\"")
        Interval(int, 1).check("host_depth", host_depth)  # a float failed deep inside as numpy's TypeError
        Interval(int, 0).check("guest_depth", guest_depth)
        if host_depth < 1 or guest_depth < 0:
            raise InvalidParameterError(f"host_depth must be >= 1 and guest_depth >= 0, got {host_depth}, "
                                        f"{guest_depth}")
        self.ch, self.guests, self.params, self.he = channel, list(guests), params, he
        self.feature_names = names_of(X)  # its own columns' names (a DataFrame's); test frames matched by them
        self.X, self.y = check_xy(X, y)
        self.weights = AlignedWeights(sample_weight, X, y, len(self.y))  # the label holder's, its rows in place
        self.ids = np.arange(len(self.X)) if ids is None else instance_ids(ids, len(self.X), channel.party)
        self.host_depth, self.guest_depth = host_depth, guest_depth
        self.packer = packer_for(params.objective, self.y, self.weights.weights)
        self.row_packing = self._row_packing(rows_per_ciphertext)
        self.bin_mapper = self.weights.bin_mapper(params, self.X)

    def _row_packing(self, k) -> RowPacking:
        """Instances per gradient ciphertext (hessian mode): ``k``, or by scheme as the vertical protocol's
        (:func:`default_rows_per_ciphertext`: 3 for Paillier, 1 for OU); count mode takes one."""
        packing = row_packing_for(self.he, self.packer, 1 if k is None and self.mode == "count" else k)
        if packing.rows > 1 and self.mode == "count":
            raise InvalidParameterError(f"HybridTree's count mode encrypts one instance per ciphertext (its guests "
                                        f"return a prediction per instance), got rows_per_ciphertext={k}")
        return packing

    def fit(self, checkpoint=None, resume: bool = False, progress=None) -> HybridHostModel:
        """Train; with a ``checkpoint`` store, save after every boosting round and (``resume``) continue from
        it.  ``progress(trees_done, trees_total)`` is called after every tree."""
        ch, p = self.ch, self.params
        objective = objective_for(p.objective, p.n_classes, self.y)
        y = objective.check_labels(self.y)
        n = len(y)
        self.weights.check(y, objective.name)
        row_of = {int(i): r for r, i in enumerate(self.ids)}
        remotes, guest_rows, layouts = {}, {}, {}
        self._cut = set()  # guests told to keep only the instances this host holds too
        for u in self.guests:
            layout = layouts[u] = ch.recv(u, "layout", m.GuestLayout)
            known = np.fromiter((int(i) in row_of for i in layout.ids), dtype=bool, count=len(layout.ids))
            if not known.all():
                if not self.shared_only:
                    raise ProtocolError(f"{u} holds instance {int(layout.ids[~known][0])} that the host does not "
                                        f"have; where guests also hold other hosts' instances, keep those both hold: "
                                        f"[hybridtree] shared_only = true in the config (shared_only=True in "
                                        f"Python), or [federation] align = \"psi\" in every party's config, so "
                                        f"that each guest keeps, by private set intersection, the instances the "
                                        f"host holds, and names no other")
                layout.ids = layout.ids[known]
                self._cut.add(u)
                logger.info("%s: %d of its instances are held by this host, %d ignored", u, int(known.sum()),
                            int((~known).sum()))
                if len(layout.ids) == 0:
                    raise ProtocolError(f"{u} shares no instance with the host {ch.party}")
            guest_rows[u] = np.array([row_of[int(i)] for i in layout.ids], dtype=np.int64)
            remotes[u] = _Remote(u, layout.n_value_bins, 0, 0)
        ch.broadcast("key", m.PublicKey(self.he.public_bytes(), self.packer.frac_bits, self.packer.value_bits,
                                        self.packer.count_bits, self.row_packing.rows, self.row_packing.stride_bits),
                     self.guests)
        self._send_setup(layouts)
        X_binned = self.bin_mapper.transform(self.X)
        X_columns = column_major(X_binned)
        thresholds = self.bin_mapper.thresholds()
        scorer = GBDTScorer(p.reg_lambda, p.gamma, p.min_child_weight, p.min_samples_leaf)
        K = objective.n_outputs
        base = self.weights.init_score(objective, y) if p.base_score == "auto" else np.full(K, float(p.base_score))
        raw = np.tile(base, (n, 1))
        model = HybridHostModel(p.objective, base, feature_names=self.feature_names, guest_children=[])
        state = checkpoint.load() if (checkpoint is not None and resume) else None
        if state is not None:
            try:
                model = HybridHostModel.from_dict(state["model"])
            except ModelFormatError as exc:
                raise ModelFormatError(f"checkpoint {checkpoint.path} is damaged: {exc}") from None
            raw = CheckpointStore.scores(state, (n, K))
        start = len(model.host_trees)
        ch.broadcast("start", m.Start(start if self.guest_depth > 0 else 0), self.guests)
        tree_id = start
        self.tree_seconds = []  # wall time of each tree grown here, guests' layers included
        # subsample and colsample_bytree: the host draws its rows and its own features each round as the engine
        # does on the host's table (so that without guest layers the model stays SOLO's), and each guest's
        # features from a generator of the guest's own, [seed, 67, its place]; the guests sum only those bins
        sampler = RoundSampler(p, self.weights.n_drawn(n), self.X.shape[1])  # (among the rows of positive weight)
        guest_samplers = {u: RoundSampler(replace(p, subsample=1.0), None, remotes[u].n_features,
                                          seed=[p.seed, 67, k]) for k, u in enumerate(self.guests)}
        for round_ in range(p.n_estimators):
            sample, features = sampler.next()  # (drawn for the rounds a resumed run skips too)
            guest_masks = {u: s.feature_mask(s.next()[1]) for u, s in guest_samplers.items()}
            if round_ * K < start:
                continue
            sample = self.weights.rows(sample)
            g, h = self.weights.scale(*objective.gradients(y, raw))
            in_sample = None
            if sample is not None:
                in_sample = np.zeros(n, dtype=bool)
                in_sample[sample] = True
            for c in range(K):
                t0 = time.perf_counter()
                with ch.scope(tree=tree_id):
                    stats = np.column_stack([g[:, c], h[:, c]])
                    finder = HistogramSplitFinder(
                        X_binned, self.bin_mapper.feature_offsets, self.bin_mapper.missing_codes, thresholds, stats,
                        scorer, root_samples=sample, X_columns=X_columns, features=features,
                        allowed=None if features is None else mask_for_every_node(sampler.feature_mask(features)))
                    leaf_fn = lambda s: p.learning_rate * scorer.leaf_value(s)  # noqa: E731
                    host_tree = TreeGrower(finder, self.host_depth, leaf_fn,
                                           min_samples_split=2 * p.min_samples_leaf).grow()
                    if sample is None:
                        leaf_of_row = np.empty(n, dtype=np.int64)
                        for leaf in np.nonzero(host_tree.is_leaf)[0]:
                            leaf_of_row[finder.node_samples(leaf)] = leaf
                    else:  # every instance, the round's or not
                        leaf_of_row = PackedEnsemble([host_tree]).leaves_binned(
                            X_binned, self.bin_mapper.missing_codes)[:, 0].astype(np.int64)
                    update = host_tree.values[leaf_of_row, 0].copy()
                    values, children = {}, {}
                    if self.guest_depth > 0 and self.guests:
                        values = self._guest_layers(tree_id, g[:, c], h[:, c], leaf_of_row, host_tree.n_nodes,
                                                    guest_rows, remotes, scorer, update, model, in_sample,
                                                    guest_masks, children)
                raw[:, c] += update
                self.tree_seconds.append(time.perf_counter() - t0)
                model.host_trees.append(host_tree)
                model.tree_class.append(c)
                model.guest_values.append(values)
                if model.guest_children is not None:  # (None: resumed from a checkpoint written without them)
                    model.guest_children.append(children)
                tree_id += 1
                if checkpoint is not None and c == K - 1 and checkpoint.due(tree_id // K, p.n_estimators):
                    checkpoint.save({"trees_done": tree_id, "model": model.to_dict()}, raw)
                if progress is not None:
                    progress(tree_id, p.n_estimators * K)
        guest_trees = tree_id if self.guest_depth > 0 else 0  # guests count only the trees they took part in
        with ch.scope(tree=guest_trees):
            ch.broadcast(m.CONTROL, m.TrainingDone(guest_trees), self.guests)
        self.raw = raw
        return model

    def _send_setup(self, layouts) -> None:
        p = self.params
        for u in self.guests:
            cut = u in self._cut
            kept = {"subset": cut, "kept": np.asarray(layouts[u].ids if cut else [], dtype=np.int64)}
            if self.mode == "hessian":
                self.ch.send(u, "setup", m.HybridSetup("hessian", peers=[], peer_keys=[], **kept))
                continue
            peers = [v for v in self.guests if v != u]
            shared = [np.intersect1d(layouts[u].ids, layouts[v].ids) for v in peers]
            offsets = np.concatenate([[0], np.cumsum([len(x) for x in shared])]).astype(np.int64)
            self.ch.send(u, "setup", m.HybridSetup(
                "count", p.learning_rate, p.reg_lambda, SCALE_BITS, peers, [layouts[v].mask_key for v in peers],
                np.concatenate(shared).astype(np.int64) if shared else np.zeros(0, np.int64), offsets, **kept))

    def _guest_layers(self, tree_id, g, h, leaf_of_row, first_id, guest_rows, remotes, scorer, update, model,
                      in_sample, guest_masks, children):
        """The guests' layers of one tree (``in_sample``: the round's rows, None for all; ``guest_masks``: each
        guest's sampled features, None for all); each guest's splits' children go into ``children[guest]``."""
        ch, p = self.ch, self.params
        if self.mode == "count":
            h = np.ones_like(h)  # the paper's h = 1 below the host's layers: H sums are instance counts
        state = {}
        for u in self.guests:
            rows = guest_rows[u]
            handoff = leaf_of_row[rows]
            positions = np.zeros(0, dtype=np.int64) if in_sample is None else np.nonzero(in_sample[rows])[0]
            if in_sample is not None:
                rows = rows[positions]  # the round's instances of the guest: its layers grow on them
            nodes = leaf_of_row[rows]
            data = self.he.serialize(self.he.encrypt(self.row_packing.pack(self.packer.encode(g[rows], h[rows]))))
            ch.send(u, m.CONTROL, m.NodeGradients(tree_id, handoff, data, in_sample is not None, positions))
            del data
            roots = np.unique(nodes)
            totals = {int(r): np.array([g[rows[nodes == r]].sum(), h[rows[nodes == r]].sum()]) for r in roots}
            # pairs: (parent's row in the previous layer's histograms, left child's row, right child's row)
            state[u] = {"frontier": [int(r) for r in roots], "totals": totals, "next": first_id, "pairs": [],
                        "hist": None}
        for layer in range(self.guest_depth):
            active = [u for u in self.guests if state[u]["frontier"]]
            for u in active:
                # below the first guest layer only left children are built: the right child is its parent's
                # histogram minus the left one (always left, so the request reveals nothing to the guest)
                st = state[u]
                build = [j for _, j, _ in st["pairs"]] if st["pairs"] else list(range(len(st["frontier"])))
                st["build"] = build
                mask = None if guest_masks is None else guest_masks[u]
                sampled = mask is not None and not mask.all()
                ch.send(u, m.CONTROL, m.HistogramRequest(layer, [st["frontier"][j] for j in build], sampled,
                                                         np.nonzero(mask)[0].tolist() if sampled else []))
            for u in active:
                st = state[u]
                front, build = st["frontier"], st["build"]
                totals = np.array([st["totals"][nid] for nid in front])
                reply = ch.recv(u, m.REPLY, m.EncryptedHistograms)
                hist = np.zeros((len(front), remotes[u].n_bins, 2))
                hist[build] = decode_histograms(reply, remotes[u], totals[build], self.he, self.packer,
                                                f"histograms from {u} (tree {tree_id}, layer {layer})",
                                                self.row_packing)
                for parent_row, lrow, rrow in st["pairs"]:
                    hist[rrow] = st["hist"][parent_row] - hist[lrow]
                node_stats = np.column_stack([totals, np.full(len(front), np.nan)])
                offsets = remotes[u].local_offsets.astype(np.int32)
                allowed = (np.ones((len(front), remotes[u].n_features), dtype=np.bool_) if guest_masks is None
                           else np.tile(guest_masks[u], (len(front), 1)))  # (writable, see the vertical finder)
                gain, feat, bins, ml, left = scorer.find(hist, np.arange(len(front), dtype=np.int64), node_stats,
                                                         offsets, allowed)
                splits = LayerSplits(gain, feat, bins, ml, left, np.full(len(front), np.nan),
                                     np.full(len(front), -1, dtype=np.int32))
                resolve_missing_direction(splits, Layer(np.asarray(front), node_stats, layer), hist, offsets, scorer)
                chosen = [j for j in range(len(front)) if feat[j] >= 0 and gain[j] > 0]
                lefts, rights, new_front, pairs = [], [], [], []
                for j in chosen:
                    model.add_guest_split(u, remotes[u].n_features, int(feat[j]), gain[j])
                    lid, rid = st["next"], st["next"] + 1
                    st["next"] += 2
                    children.setdefault(u, {})[int(front[j])] = (lid, rid)
                    st["totals"][lid] = left[j, :2]
                    st["totals"][rid] = totals[j] - left[j, :2]
                    lefts.append(lid)
                    rights.append(rid)
                    pairs.append((j, len(new_front), len(new_front) + 1))
                    new_front += [lid, rid]
                st["hist"], st["pairs"] = hist, pairs
                ch.send(u, m.CONTROL, m.GuestSplits(layer, [front[j] for j in chosen], [int(feat[j]) for j in chosen],
                                                    [int(bins[j]) for j in chosen],
                                                    [int(splits.missing_left[j]) for j in chosen], lefts, rights))
                st["frontier"] = new_front
        for u in self.guests:
            ch.send(u, m.CONTROL, m.TreeEnd(tree_id))
        if self.mode == "count":
            return self._count_leaves(tree_id, state, guest_rows, update)
        acc = np.zeros(len(update))
        cnt = np.zeros(len(update))
        values = {}
        for u in self.guests:
            leaves = ch.recv(u, m.REPLY, m.LeafAssignment).leaves
            rows = guest_rows[u]
            tot = state[u]["totals"]
            # with subsample, an instance at a hand-off node where none of the guest's instances was sampled
            # stays there, and keeps the host's value (no guest value there, as at prediction)
            if leaves.shape != rows.shape:
                raise ProtocolError(f"leaf assignment from {u} does not match its tree")
            known = np.isin(leaves, list(tot))
            stayed = leaves == leaf_of_row[rows] if in_sample is not None else np.zeros(len(rows), dtype=bool)
            if not np.all(known | stayed):
                raise ProtocolError(f"leaf assignment from {u} does not match its tree")
            vals = {nid: float(-p.learning_rate * t[0] / (t[1] + p.reg_lambda)) for nid, t in tot.items()}
            values[u] = {nid: vals[nid] for nid in np.unique(leaves[known]).tolist()}
            acc[rows[known]] += np.array([vals[int(x)] for x in leaves[known]])
            cnt[rows[known]] += 1
        covered = cnt > 0
        update[covered] = acc[covered] / cnt[covered]  # mean over the guests holding an instance
        return values

    def _aggregation_plan(self, guest_rows, n):
        """Count mode, fixed for the whole training: how many guests hold each instance, the instances held
        by any, and per guest which of its ciphertexts lines up with each of those instances."""
        if self._plan is None:
            holders = np.zeros(n, dtype=np.int64)
            for u in self.guests:
                holders[guest_rows[u]] += 1
            covered = np.nonzero(holders)[0]
            groups = {}
            for u in self.guests:
                pos = {int(r): k for k, r in enumerate(guest_rows[u].tolist())}
                groups[u] = [[pos[i]] if i in pos else [] for i in covered.tolist()]
            self._plan = (holders, covered, groups)
        return self._plan

    def _count_leaves(self, tree_id, state, guest_rows, update):
        """Count mode: decrypt each guest's leaf values (checked against the node totals the host holds) and
        the per-instance sums of the guests' masked encrypted predictions."""
        ch, p, he = self.ch, self.params, self.he
        scale = 2.0 ** -(self.packer.frac_bits + SCALE_BITS)
        bound = 1 << (self.packer.frac_bits + SCALE_BITS + self.packer.value_bits + 8)
        holders, covered, aligned_groups = self._aggregation_plan(guest_rows, len(update))
        values, total = {}, None
        for u in self.guests:
            msg = ch.recv(u, m.REPLY, m.EncryptedPredictions)
            what = f"encrypted predictions from {u} (tree {tree_id})"
            leaves = list(msg.leaves or [])
            tot = state[u]["totals"]
            if len(set(leaves)) != len(leaves) or any(nid not in tot for nid in leaves):
                raise ProtocolError(f"{what}: leaves {leaves[:5]} do not match its tree")
            leaf_vals = he.decrypt(he.deserialize(msg.leaf_ciphertexts)) if leaves else []
            if len(leaf_vals) != len(leaves) or any(abs(int(v)) >= bound for v in leaf_vals):
                raise ProtocolError(f"{what}: leaf values out of range; refusing them")
            values[u] = {}
            for nid, v in zip(leaves, leaf_vals):
                expect = -p.learning_rate * tot[nid][0] / (tot[nid][1] + p.reg_lambda)
                got = int(v) * scale
                if abs(got - expect) > 1e-9 * max(1.0, abs(expect)):
                    raise ProtocolError(f"{what}: leaf {nid} has value {got:.6g}, the node totals give "
                                        f"{expect:.6g}; refusing it")
                values[u][int(nid)] = got
            ct = he.deserialize(msg.ciphertexts)
            rows = guest_rows[u]
            if ct.size != len(rows):
                raise ProtocolError(f"{what}: {ct.size} ciphertexts for {len(rows)} instances")
            aligned = he.select_sums(ct, aligned_groups[u], for_key_holder=True)  # the host holds the key
            total = aligned if total is None else he.add(total, aligned)
        if total is not None and len(covered):
            sums = he.decrypt(total)
            if any(abs(int(v)) >= bound * int(holders.max()) for v in sums):
                raise ProtocolError(f"aggregated predictions of tree {tree_id} out of range; refusing them")
            update[covered] = np.array([int(v) * scale for v in sums]) / holders[covered]
        return values

    def predict_raw(self, model: HybridHostModel, X_test, test_ids=None) -> np.ndarray:
        """Two rounds for all test instances: host subtrees -> guests' layers -> mean of guest leaf values."""
        return predict_hybrid(self.ch, self.guests if self.guest_depth > 0 else [], model, X_test, test_ids)


def predict_hybrid(channel, guests: list[str], model: HybridHostModel, X_test, test_ids=None) -> np.ndarray:
    """The host's side of two-round inference from its model alone (e.g. loaded from its model file):
    route every test instance through the host subtrees, ask ``guests`` to continue, average their leaves."""
    from fedgrove.engine.tree import PackedEnsemble

    trained = sorted({u for per_tree in model.guest_values for u, values in per_tree.items() if values}
                     | {u for per_tree in model.guest_children or [] for u, kids in per_tree.items() if kids})
    if absent := [u for u in trained if u not in guests]:  # the host's value would stand in for their layers
        lacks = (f"the layers of {', '.join(absent)}, which the federation lacks (its guests: {', '.join(guests)})"
                 if guests else "guest layers, but the config asks no guest to predict ([hybridtree] guest_depth = "
                                "0, or no guest party)")
        raise InvalidParameterError(f"the host's model holds {lacks}; give the config the model was trained with")
    X_test = as_numbers(by_names(X_test, model.feature_names, "the host's test features"), "the host's test X",
                        TEXT_FEATURES)
    n = len(X_test)
    ids = np.arange(n) if test_ids is None else np.asarray(test_ids, dtype=np.int64)
    handoff = PackedEnsemble(model.host_trees).leaves(X_test).astype(np.int32)
    K = len(model.base_score)
    raw = np.tile(model.base_score, (n, 1))
    held = dict.fromkeys(guests, False)
    tables = _LeafTables(model, guests)
    # each chunk of test rows: a request of an ID and a node a tree, an answer of a leaf a tree
    for start, stop in prediction_chunks(n, 64 + 32 * handoff.shape[1]):
        rows = slice(start, stop)
        answers = {}
        if guests:
            channel.broadcast("route", m.RouteRequest(ids[rows], handoff[rows], n, start, tables.ranked), guests)
            answers = {u: channel.recv(u, "route", m.RouteAnswer).leaves for u in guests}
            for u, leaves in answers.items():
                if leaves.shape != handoff[rows].shape:
                    raise ProtocolError(f"routing answer from {u} has the wrong shape")
                if leaves.size and int(leaves.min()) < -1:  # -1: an instance the guest does not hold; else a node
                    what = "leaf rank" if tables.ranked else "node"
                    raise ProtocolError(f"routing answer from {u} names {what} {int(leaves.min())} (a {what}, or "
                                        f"-1 for an instance it does not hold)")
                if leaves.shape[1] and (leaves[:, 0] >= 0).any():  # (the shape is handoff's)
                    held[u] = True
        tables.add(raw[rows], model, handoff[rows], ids[rows], answers, K)
    for u in guests:
        if n and handoff.shape[1] and not held[u]:
            logger.warning("%s holds none of the host's %d test instances: its layers add nothing to them (if it "
                           "should hold some: were both test files' _id columns written alike, numbers or the "
                           "same text?)", u, n)
    return raw


class _LeafTables:
    """Per tree and guest, the guest's leaf values sorted by node, to look the routed leaves up: as lists
    (``per_tree``, for the numpy reference) and flat (``keys``, ``values``, ``offsets`` of tree ``t`` and guest
    ``g`` at ``t * len(guests) + g``; their positions by node, ``index`` and ``index_offsets``, where the
    guests number their nodes densely enough: :func:`~fedgrove.engine.predict.id_positions`), with the host
    trees' node values and each tree's output; where the guests answer with leaf ranks (``ranked``), the leaves
    and their values by rank (:meth:`_rank_tables`)."""

    def __init__(self, model: HybridHostModel, guests: list[str]):
        self.guests = list(guests)
        self._rank_tables(model)
        self.per_tree, keys, values = [], [], []
        for t in range(len(model.host_trees)):
            per_guest = {}
            for u in self.guests:
                table = model.guest_values[t].get(u, {})
                k = np.fromiter(table, dtype=np.int64, count=len(table))
                order = np.argsort(k)
                per_guest[u] = (k[order], np.fromiter(table.values(), dtype=np.float64, count=len(table))[order])
                keys.append(per_guest[u][0])
                values.append(per_guest[u][1])
            self.per_tree.append(per_guest)
        self.offsets = np.concatenate([[0], np.cumsum([len(k) for k in keys])]).astype(np.int64)
        self.keys = np.concatenate(keys) if keys else np.zeros(0, dtype=np.int64)
        self.values = np.concatenate(values) if values else np.zeros(0)
        self.index, self.index_offsets = id_positions(keys)
        packed = PackedEnsemble(model.host_trees)
        self.host_values = np.ascontiguousarray(packed.node_values()[:, 0]) if model.host_trees else np.zeros(0)
        self.host_offsets = packed.tree_offsets
        K = len(model.base_score)
        self.tree_class = np.asarray([model.tree_class[t] if K > 1 else 0 for t in range(len(model.host_trees))],
                                     dtype=np.int64)

    def _rank_tables(self, model: HybridHostModel) -> None:
        """Where the model holds the guests' splits (``ranked``): per tree ``t``, guest ``g`` and host node
        ``h`` at ``j = (t * len(guests) + g) * n_slots + h``, the ``rank_count[j]`` leaves the guest grew below
        ``h``, left to right, from ``rank_leaves[rank_start[j]]`` on, and their values ``rank_values`` (NaN for
        a leaf the host has no value for).  Where the guest grew nothing below ``h`` (count 0), the entry at
        ``rank_start[j]`` is ``h`` itself with the guest's value of it, or entry 0, which names no node (-1)
        and holds NaN: the guest's rank 0 there adds that value, or nothing."""
        T, G = len(model.host_trees), len(self.guests)
        self.n_slots = max([tree.n_nodes for tree in model.host_trees], default=1)
        # (past RANK_SLOTS_MAX slots, 64 MB, the guests answer with nodes: deep host trees, many trees and guests)
        self.ranked = model.guest_children is not None and T * G * self.n_slots <= RANK_SLOTS_MAX
        self.rank_start = np.zeros(T * G * self.n_slots if self.ranked else 0, dtype=np.int64)
        self.rank_count = np.zeros_like(self.rank_start)
        flat, vals, slots, starts, counts = [-1], [np.nan], [], [], []
        for t, per_tree in enumerate(model.leaf_orders() if self.ranked else []):
            host_leaves = set(np.flatnonzero(model.host_trees[t].is_leaf).tolist())
            for g, u in enumerate(self.guests):
                known = model.guest_values[t].get(u, {})
                below = per_tree.get(u, {})
                for root, leaves in below.items():
                    slots.append((t * G + g) * self.n_slots + root)
                    starts.append(len(flat))
                    counts.append(len(leaves))
                    flat += leaves
                    vals += [known.get(leaf, np.nan) for leaf in leaves]
                # the host tree's leaves (hand-off nodes) the guest grew nothing below but holds a value for
                for h in sorted((known.keys() & host_leaves) - below.keys()):
                    slots.append((t * G + g) * self.n_slots + h)
                    starts.append(len(flat))
                    counts.append(0)
                    flat.append(h)
                    vals.append(known[h])
        self.rank_start[slots], self.rank_count[slots] = starts, counts
        self.rank_leaves = np.asarray(flat, dtype=np.int64)
        self.rank_values = np.asarray(vals, dtype=np.float64)

    def add(self, raw, model: HybridHostModel, handoff, ids, answers: dict, K: int) -> None:
        """Add each tree's value to the ``raw`` scores of a chunk of test rows: the mean of the leaf values of
        the guests that routed a row on (``answers``: leaf ranks where ``ranked``, else nodes), else the host's
        hand-off node's value; by two kernels (:func:`_sum_guest_ranks` or :func:`_sum_guest_leaves` a guest at
        a time, then :func:`_add_means`; :func:`_add_chunk`, after :func:`_leaves_of_ranks_numpy` for ranks,
        is their numpy reference).  A rank past the leaves below its hand-off node, or a leaf the host has no
        value for, is refused by name, ``raw`` left as it was."""
        handoff = np.ascontiguousarray(handoff, dtype=np.int32)
        acc, cnt = np.zeros(handoff.shape), np.zeros(handoff.shape, dtype=np.int32)
        bad = np.full(3, -1, dtype=np.int64)
        G = len(self.guests)
        for g, u in enumerate(self.guests):
            if u not in answers:
                continue
            routed = np.ascontiguousarray(answers[u], dtype=np.int32)
            if self.ranked:
                _sum_guest_ranks(acc, cnt, handoff, routed, g, G, self.n_slots, self.rank_start, self.rank_count,
                                 self.rank_values, bad)
            else:
                _sum_guest_leaves(acc, cnt, handoff, routed, g, G, self.keys, self.values, self.offsets, self.index,
                                  self.index_offsets, bad)
            if bad[0] < 0:
                continue
            i, t = int(bad[0]), int(bad[1])
            if not self.ranked:
                _add_chunk(raw.copy(), model, handoff, ids, answers, self.per_tree, K)  # raises, naming the leaf
                raise ProtocolError(f"{u} routed test instance {int(ids[i])} of tree {t} to a node for which the "
                                    f"host's model has no leaf value")
            j = (t * G + g) * self.n_slots + int(handoff[i, t])
            if bad[2] == 0:
                raise ProtocolError(f"{u} routed test instance {int(ids[i])} of tree {t} to leaf {int(routed[i, t])} "
                                    f"below node {int(handoff[i, t])}, where the host's model knows "
                                    f"{max(int(self.rank_count[j]), 1)}: the host's and {u}'s model files are not "
                                    f"of one training run")
            raise ProtocolError(f"{u} routed test instance {int(ids[i])} of tree {t} to its node "
                                f"{int(self.rank_leaves[self.rank_start[j] + routed[i, t]])}, for which the host's "
                                f"model has no leaf value: the host's and {u}'s model files are not of one "
                                f"training run")
        _add_means(raw, acc, cnt, handoff, self.host_values, self.host_offsets, self.tree_class)


@njit(cache=True, nogil=True)
def _sum_guest_ranks(acc, cnt, handoff, ranks, g, n_guests, n_slots, start, count, values, bad):
    """Add to ``acc[i, t]``, and count in ``cnt[i, t]``, the value of the leaf of rank ``ranks[i, t]`` that
    guest ``g`` grew below row ``i``'s hand-off node in tree ``t`` (-1: a row it does not hold), read from
    :meth:`_LeafTables._rank_tables`' ``start``, ``count`` and ``values``; rank 0 where it grew nothing there
    adds its value of the hand-off node, or nothing (NaN).  A rank past the leaves stops the kernel with
    ``bad = (i, t, 0)``, a leaf without a value with ``bad = (i, t, 1)``."""
    for i in range(ranks.shape[0]):
        for t in range(ranks.shape[1]):
            r = ranks[i, t]
            if r < 0:
                continue
            j = (t * n_guests + g) * n_slots + handoff[i, t]
            c = count[j]
            if r >= max(c, 1):
                bad[0], bad[1], bad[2] = i, t, 0
                return
            v = values[start[j] + r]
            if np.isnan(v):
                if c == 0:
                    continue
                bad[0], bad[1], bad[2] = i, t, 1
                return
            acc[i, t] += v
            cnt[i, t] += 1


def _leaves_of_ranks_numpy(ranks, handoff, g, n_guests, n_slots, start, count, leaf_ids) -> np.ndarray:
    """Guest ``g``'s answer of leaf ranks (``ranks``; -1 kept) as its leaves' nodes: per row ``i`` and tree ``t``
    the leaf of that rank below the hand-off node ``handoff[i, t]`` (:meth:`_LeafTables._rank_tables`' ``start``,
    ``count`` and ``leaf_ids``), or that node itself for rank 0 where the guest grew nothing below it; a rank
    past the leaves raises ValueError naming it.  With :func:`_add_chunk`, the numpy reference for
    :func:`_sum_guest_ranks`."""
    ranks = np.asarray(ranks, dtype=np.int64)
    j = (np.arange(ranks.shape[1]) * n_guests + g) * n_slots + handoff.astype(np.int64)
    c = count[j]
    ok = (ranks < 0) | (ranks < c) | ((c == 0) & (ranks == 0))
    if not ok.all():
        i, t = np.argwhere(~ok)[0]
        raise ValueError(f"rank {ranks[i, t]} of row {i}, tree {t}")
    inside = (ranks >= 0) & (ranks < c)
    out = np.where(ranks < 0, ranks, handoff).astype(np.int64)
    out[inside] = leaf_ids[start[j][inside] + ranks[inside]]
    return out.astype(np.int32)


@njit(cache=True, nogil=True)
def _sum_guest_leaves(acc, cnt, handoff, leaves, g, n_guests, keys, values, offsets, index, index_offsets, bad):
    """Add to ``acc[i, t]``, and count in ``cnt[i, t]``, the value of the leaf ``leaves[i, t]`` guest ``g``
    routed row ``i`` of tree ``t`` to (-1: a row it does not hold; its hand-off node: nothing grown below it,
    skipped), found by :func:`~fedgrove.engine.predict.find_position` among the ``keys`` of ``t`` and ``g``
    (between ``offsets[t * n_guests + g]`` and the next).  A leaf that is neither known nor the hand-off node
    stops the kernel with ``bad = (i, t, g)``."""
    for i in range(leaves.shape[0]):
        for t in range(leaves.shape[1]):
            leaf = leaves[i, t]
            if leaf < 0:
                continue
            j = t * n_guests + g
            a = find_position(keys, offsets[j], offsets[j + 1], index, index_offsets, j, leaf)
            if a >= 0:
                acc[i, t] += values[a]
                cnt[i, t] += 1
            elif leaf != handoff[i, t]:
                bad[0], bad[1], bad[2] = i, t, g
                return


@njit(cache=True, nogil=True)
def _add_means(raw, acc, cnt, handoff, host_values, host_offsets, tree_class):
    """For each row ``i`` and tree ``t``: the mean ``acc[i, t] / cnt[i, t]`` of the guests' leaf values, or,
    where no guest routed the row on, the host's value of its hand-off node, added to ``raw[i, tree_class[t]]``."""
    for i in range(handoff.shape[0]):
        for t in range(handoff.shape[1]):
            c = cnt[i, t]
            raw[i, tree_class[t]] += acc[i, t] / c if c else host_values[host_offsets[t] + handoff[i, t]]


def _add_chunk(raw, model: HybridHostModel, handoff, ids, answers: dict, tables: list, K: int) -> None:
    """numpy reference for :meth:`_LeafTables.add` (``tables``: its ``per_tree``): add each tree's value to the
    ``raw`` scores of a chunk of test rows: the mean of the leaf values of the guests that routed a row on
    (``answers``), else the host's hand-off node's value."""
    n = len(raw)
    for t, tree in enumerate(model.host_trees):
        host_value = tree.values[handoff[:, t], 0]
        acc = np.zeros(n)
        cnt = np.zeros(n)
        for u, leaves in answers.items():
            keys, vals = tables[t][u]
            leaf = leaves[:, t].astype(np.int64)
            pos = np.minimum(np.searchsorted(keys, leaf), max(len(keys) - 1, 0))
            known = (leaf >= 0) & (keys[pos] == leaf) if len(keys) else np.zeros(n, dtype=bool)
            # an instance the guest holds ends at its hand-off node where the guest grew nothing under it (the
            # host's value stands); anywhere else the host must know the leaf, or the files are not of one run
            unknown = (leaf >= 0) & ~known & (leaf != handoff[:, t])
            if unknown.any():
                k = int(np.argmax(unknown))
                raise ProtocolError(f"{u} routed test instance {int(ids[k])} of tree {t} to its node "
                                    f"{int(leaf[k])}, for which the host's model has no leaf value: the host's "
                                    f"and {u}'s model files are not of one training run")
            acc[known] += vals[pos[known]]
            cnt[known] += 1
        covered = cnt > 0
        raw[:, model.tree_class[t] if K > 1 else 0] += np.where(covered, acc / np.maximum(cnt, 1), host_value)
