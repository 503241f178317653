"""The active party: labels and features.  It holds the secret key, decrypts
per-bin sums of the passive parties' features, chooses every split and stores
the trees; it never sees passive features, cut points or thresholds."""

from __future__ import annotations

import time

import numpy as np

from fedgrove.crypto.he import HEContext
from fedgrove.crypto.packing import MAX_ROWS, MAX_VALUE_BITS, GHPacker, RowPacking
from fedgrove.engine.binning import BinMapper, column_major
from fedgrove.engine.gbdt import AlignedWeights, GBDTParams, RoundSampler, check_xy
from fedgrove.engine.grower import Layer, LayerSplits, SplitFinder, TreeGrower
from fedgrove.engine.losses import objective_for
from fedgrove.engine.model import TEXT_FEATURES, GBDTModel, as_numbers, by_names, names_of
from fedgrove.engine.predict import leaves_with_peer_bits
from fedgrove.engine.tree import PackedEnsemble
from fedgrove.engine.splitter import GBDTScorer, HistogramSplitFinder, resolve_missing_direction
from fedgrove.exceptions import DataError, InvalidParameterError, ModelFormatError, ProtocolError
from fedgrove.protocols.vertical import messages as m
from fedgrove.protocols import check_ids_everywhere, instance_ids, prediction_chunks, refuse_unsupported
from fedgrove.protocols.psi import ALIGN_HINT


class _Remote:
    """One passive party as the active party sees it: bin layout and histograms per layer."""

    def __init__(self, name: str, n_value_bins: np.ndarray, offset_features: int, offset_bins: int):
        if n_value_bins.ndim != 1 or np.any(n_value_bins < 1) or np.any(n_value_bins > 255):
            raise ProtocolError(f"feature layout from {name} is invalid: bins per feature must be 1 to 255")
        self.name = name
        self.n_value_bins = n_value_bins.astype(np.int64)
        self.n_features = len(n_value_bins)
        self.first_feature = offset_features
        self.local_offsets = np.concatenate([[0], np.cumsum(self.n_value_bins + 1)]).astype(np.int64)
        self.first_bin = offset_bins
        self.n_bins = int(self.local_offsets[-1])


def decode_histograms(reply: m.EncryptedHistograms, r: _Remote, totals: np.ndarray, he: HEContext,
                      packer: GHPacker, what: str, row_packing: RowPacking | None = None) -> np.ndarray:
    """Decrypt an :class:`EncryptedHistograms` reply into (n_nodes, r.n_bins, n_stats) histograms.

    ``totals`` (n_nodes, n_stats) holds each node's sums, (G, H) for boosting;
    the bin the sender left out is the total minus the others.  Anything
    inconsistent with the request is refused.
    """
    n_build = len(totals)
    if reply.skipped.shape != (n_build * r.n_features,) or reply.n_bins.shape != reply.skipped.shape \
            or int(reply.n_bins.sum()) != reply.n_sums or reply.bins.shape != (reply.n_sums,):
        raise ProtocolError(f"{what} do not match the request")
    packed_rows = row_packing is not None and row_packing.rows > 1
    expected_slots = row_packing.bins_per_plaintext(he.plaintext_bits) if packed_rows else \
        packer.slots_per_plaintext(he.plaintext_bits)
    if reply.n_slots != expected_slots:
        raise ProtocolError(f"{what} use {reply.n_slots} slots, expected {expected_slots}")
    sums = np.zeros((0, totals.shape[1]))
    if reply.n_sums:
        ct = he.deserialize(reply.ciphertexts)
        if ct.size != -(-reply.n_sums // reply.n_slots):
            raise ProtocolError(f"{what}: {ct.size} ciphertexts for {reply.n_sums} sums")
        if packed_rows:
            sums = row_packing.decode(packer, he.decrypt(ct), reply.n_slots, reply.n_sums)
        else:
            sums = packer.decode(he.decrypt(ct), n_slots=reply.n_slots, n_sums=reply.n_sums)
    n_feat = r.n_features
    k_node = np.repeat(np.arange(n_build), n_feat)               # per (node, feature) k = j * n_feat + f
    k_feat = np.tile(np.arange(n_feat), n_build)
    width = (np.asarray(r.n_value_bins, dtype=np.int64) + 1)[k_feat]
    base = np.asarray(r.local_offsets, dtype=np.int64)[k_feat]
    skip = reply.skipped.astype(np.int64)
    count = reply.n_bins.astype(np.int64)
    if np.any(count < 0):
        raise ProtocolError(f"{what}: a negative number of bins")
    k_sum = np.repeat(np.arange(n_build * n_feat), count)        # which (node, feature) each sum belongs to
    b_idx = reply.bins.astype(np.int64)
    first = np.zeros(len(b_idx), dtype=bool)
    first[np.concatenate([[0], np.cumsum(count)[:-1]])[count > 0]] = True
    ascending = first | (np.diff(b_idx, prepend=-1) > 0)
    if np.any(skip < 0) or np.any(skip >= width) or np.any(b_idx < 0) \
            or np.any(b_idx >= width[k_sum]) or np.any(b_idx == skip[k_sum]) or not ascending.all():
        raise ProtocolError(f"{what}: bin index out of range")
    out = np.zeros((n_build, r.n_bins, totals.shape[1]))
    out[k_node[k_sum], base[k_sum] + b_idx] = sums
    listed = np.zeros((n_build * n_feat, totals.shape[1]))
    np.add.at(listed, k_sum, sums)
    out[k_node, base + skip] = totals[k_node] - listed  # the bin the sender left out
    return out


class VerticalSplitFinder(SplitFinder):
    """The active party's split finder: local histograms plus decrypted remote ones."""

    def __init__(self, local: HistogramSplitFinder, channel, remotes: list[_Remote], he: HEContext,
                 packer: GHPacker, scorer: GBDTScorer, layer_counter: list,
                 row_packing: RowPacking | None = None, feature_mask: np.ndarray | None = None):
        self.local = local
        self.row_packing = row_packing
        self.ch = channel
        self.remotes = remotes
        self.he = he
        self.packer = packer
        self.scorer = scorer
        self.n_stats = local.n_stats
        self.local_bins = int(local.feature_offsets[-1])
        self.n_local = local.n_features
        remote_offsets = [r.local_offsets[1:] + r.first_bin for r in remotes]
        self.offsets = np.concatenate([local.feature_offsets] + remote_offsets).astype(np.int32)
        self.n_features = len(self.offsets) - 1
        self._remote_hist = None
        self._layer = layer_counter
        # the round's features (colsample_bytree), over the active party's then each passive party's, in order
        self.feature_mask = np.ones(self.n_features, dtype=np.bool_) if feature_mask is None else feature_mask

    def root_stats(self):
        return self.local.root_stats()

    def sample_weight(self, stats):
        return self.local.sample_weight(stats)

    def owner_of(self, feature: int) -> tuple[int, int]:
        """(party index: 0 = active, k = k-th passive, local feature index) of a combined feature index."""
        if feature < self.n_local:
            return 0, feature
        for k, r in enumerate(self.remotes, start=1):
            if feature < r.first_feature + r.n_features:
                return k, feature - r.first_feature
        raise ProtocolError(f"feature index {feature} out of range")

    def find_splits(self, layer: Layer) -> LayerSplits:
        local_hist = self.local.layer_histograms(layer, self.local.features)
        build = self.local.last_build_rows
        pairs = self.local.last_pairs
        nodes = [int(layer.node_ids[r]) for r in build]
        for r in self.remotes:  # (with colsample_bytree, each passive party sums only its sampled features' bins)
            own = self.feature_mask[r.first_feature:r.first_feature + r.n_features]
            self.ch.send(r.name, m.CONTROL, m.HistogramRequest(self._layer[0], nodes, not own.all(),
                                                               np.nonzero(own)[0].tolist() if not own.all() else []))
        total_bins = int(self.offsets[-1])
        hist = np.zeros((len(layer), total_bins, 2))
        hist[:, :self.local_bins] = local_hist
        for r in self.remotes:
            reply = self.ch.recv(r.name, m.REPLY, m.EncryptedHistograms)
            part = self._decode_remote(r, reply, layer, build)
            hist[build, r.first_bin:r.first_bin + r.n_bins] = part
        if pairs:
            prev = self._remote_hist
            for parent_row, small, large in pairs:
                hist[large, self.local_bins:] = prev[parent_row, self.local_bins:] - hist[small, self.local_bins:]
        self._remote_hist = hist
        allowed = np.tile(self.feature_mask, (len(layer), 1))  # (writable: numba compiles read-only arrays apart)
        rows = np.arange(len(layer), dtype=np.int64)
        gain, feature, bins, missing_left, left = self.scorer.find(hist, rows, layer.stats, self.offsets, allowed)
        splits = LayerSplits(gain, feature, bins, missing_left, left, np.full(len(layer), np.nan),
                             np.full(len(layer), -1, dtype=np.int32))
        for j in np.nonzero(feature >= 0)[0]:
            party, f = self.owner_of(int(feature[j]))
            splits.owner[j] = party
            if party == 0:
                splits.threshold[j] = self.local.thresholds[f][bins[j]]
        resolve_missing_direction(splits, layer, hist, self.offsets, self.scorer)
        return splits

    def _decode_remote(self, r: _Remote, reply: m.EncryptedHistograms, layer: Layer, build) -> np.ndarray:
        return decode_histograms(reply, r, layer.stats[build, :2], self.he, self.packer,
                                 f"histograms from {r.name} (layer {self._layer[0]})", self.row_packing)

    def apply_splits(self, layer, split_rows, splits, child_ids):
        ids = [int(i) for i in layer.node_ids[split_rows]]
        masks: list = [None] * len(ids)
        queries: dict[int, list] = {}
        for k, row in enumerate(split_rows):
            party, f = self.owner_of(int(splits.feature[row]))
            if party == 0:
                masks[k] = self.local.left_mask(ids[k], f, int(splits.bin[row]), bool(splits.missing_left[row]))
            else:
                queries.setdefault(party, []).append((k, f, row))
        for party, items in queries.items():
            r = self.remotes[party - 1]
            self.ch.send(r.name, m.CONTROL, m.SplitQuery(self._layer[0], [ids[k] for k, _, _ in items],
                                                         [f for _, f, _ in items],
                                                         [int(splits.bin[row]) for _, _, row in items],
                                                         [int(splits.missing_left[row]) for _, _, row in items]))
        for party, items in queries.items():
            r = self.remotes[party - 1]
            reply = self.ch.recv(r.name, m.REPLY, m.SplitMasks)
            if len(reply.masks) != len(items):
                raise ProtocolError(f"{r.name} answered {len(reply.masks)} masks for {len(items)} splits")
            for (k, _, _), bits in zip(items, reply.masks):
                masks[k] = m.unpack_mask(bits, len(self.local.node_samples(ids[k])))
        partition = m.LayerPartition(self._layer[0], ids, [int(c) for c in child_ids[:, 0]],
                                     [int(c) for c in child_ids[:, 1]], [m.pack_mask(x) for x in masks])
        for r in self.remotes:
            self.ch.send(r.name, m.CONTROL, partition)
        self._layer[0] += 1
        return self.local.apply_splits(layer, split_rows, splits, child_ids, masks=masks)


def packer_for(objective: str, y: np.ndarray, sample_weight: np.ndarray | None = None) -> GHPacker:
    """The tightest packing layout for this task: fewer plaintext bits, more sums per ciphertext.

    Logistic and softmax gradients lie in [-1, 1] and hessians in [0, 1]; squared
    error's gradient is bounded by the label range (raw scores stay inside it
    for shrunken trees), with a safety factor of 4.  Rows' weights (``sample_weight``)
    multiply the bound by the largest.  Sums cover at most ``n`` instances.
    """
    count_bits = max(1, int(len(y)).bit_length())
    scale = 1.0 if sample_weight is None or not len(y) else max(1.0, float(np.max(sample_weight)))
    if objective == "regression":
        span = float(np.max(np.abs(y - np.mean(y)))) if len(y) else 1.0
        value_bits = max(1, int(np.ceil(np.log2((4 * span + 2) * scale))))
    else:  # |g| <= w and h <= w: below 2 ** value_bits
        value_bits = max(1, int(np.floor(np.log2(scale))) + 1)
    if value_bits > MAX_VALUE_BITS:  # (a passive party refuses the layout, and the run stopped at its end)
        causes = ([("labels", f"regression labels up to {span:.3g} from their mean")] if objective == "regression"
                  else []) + ([("weights", f"weights up to {scale:.3g}")] if scale > 1 else [])
        raise DataError(f"{' and '.join(c for _, c in causes).capitalize()} give gradients up to 2^{value_bits}, "
                        f"beyond the 2^{MAX_VALUE_BITS} the encrypted gradients hold: divide the "
                        f"{' or the '.join(what for what, _ in causes)} by a power of ten")
    return GHPacker(53, value_bits, count_bits)


def default_rows_per_ciphertext(he: HEContext, packer: GHPacker) -> int:
    """Instances per gradient ciphertext: 3 for Paillier (its 2046-bit plaintexts hold several pairs and its
    encryption dominates a tree: a third of the encryptions for more, longer bin sums to compress and
    decrypt), 1 for Okamoto-Uchiyama (cheap encryption, short plaintexts) and unencrypted runs."""
    if he.scheme != "paillier" or not he.costly_additions:
        return 1
    return 3 if RowPacking.for_packer(packer, 3).fits(he.plaintext_bits) else 1


def row_packing_for(he: HEContext, packer: GHPacker, k: int | None) -> RowPacking:
    """``k`` instances per gradient ciphertext (None: :func:`default_rows_per_ciphertext`), refused by name unless
    an integer whose packed pairs fit the key's plaintexts."""
    k = default_rows_per_ciphertext(he, packer) if k is None else k
    if isinstance(k, bool) or not isinstance(k, int) or not RowPacking.for_packer(packer, k).fits(he.plaintext_bits):
        most = max(r for r in range(1, MAX_ROWS + 1) if RowPacking.for_packer(packer, r).fits(he.plaintext_bits))
        raise InvalidParameterError(f"rows_per_ciphertext must be an integer from 1 to {MAX_ROWS} whose packed "
                                    f"pairs fit the key's {he.plaintext_bits}-bit plaintexts (at most {most} with "
                                    f"this key and these gradients), got {k!r}")
    return RowPacking.for_packer(packer, k)


def _leaves(trees: list, X: np.ndarray, bits: np.ndarray, row_of, missing_codes=None) -> np.ndarray:
    """Each row of ``X`` (this party's columns, row-major: float64 raw values, or uint8 bin codes with each
    feature's ``missing_codes``)'s leaf in each of ``trees``, an ``(n, len(trees))`` int32 array; at a peer's
    split ``node`` of tree ``t`` the rows go left where mask ``row_of(t, node)`` of ``bits`` (the masks, packed:
    :func:`~fedgrove.protocols.vertical.messages.packed_masks`) says so."""
    packed = PackedEnsemble(trees)
    slot = np.full(len(packed.feature), -1, dtype=np.int64)
    for t, tree in enumerate(trees):
        nodes = tree.nodes
        for node in np.flatnonzero((nodes["feature"] >= 0) & (nodes["owner"] > 0)).tolist():
            slot[packed.tree_offsets[t] + node] = row_of(t, node)
    binned = missing_codes is not None
    return leaves_with_peer_bits(X, packed.feature, packed.bin if binned else packed.threshold, packed.missing_left,
                                 packed.left, packed.right, slot, packed.tree_offsets, len(trees), bits, missing_codes)


def _peer_bits(replies, n: int) -> tuple[np.ndarray, dict]:
    """The passive parties' go-left bits of ``n`` instances at their splits, from their replies: the masks
    packed, one a row (:func:`~fedgrove.protocols.vertical.messages.packed_masks`), and each (tree, node)'s row."""
    row_of, parts = {}, []
    for reply in replies:
        if not len(reply.trees) == len(reply.nodes) == len(reply.masks) or len(reply.bits) > len(reply.trees) \
                or any(not 0 <= j < len(reply.bits) for j in reply.masks):
            raise ProtocolError(f"a reply of go-left bits lists {len(reply.trees)} trees, {len(reply.nodes)} nodes "
                                f"and {len(reply.masks)} mask numbers for {len(reply.bits)} masks: expected a tree, "
                                f"a node and a mask number below {len(reply.bits)} for each split, and no more "
                                f"masks than splits")
        for t, node, j in zip(reply.trees, reply.nodes, reply.masks):
            row_of[(t, node)] = len(parts) + j
        parts.extend(reply.bits)
    return m.packed_masks(parts, n), row_of


def _route(tree, tree_id: int, X_binned: np.ndarray, missing_codes, bits: np.ndarray, row_of: dict) -> np.ndarray:
    """Each training instance's leaf in ``tree``: the active party's splits by its binned columns, the passive
    parties' by their go-left ``bits`` (row ``row_of[(tree, node)]`` for a passive party's split ``node``)."""

    def row(_t, node):
        if (tree_id, node) not in row_of:
            raise ProtocolError(f"no go-left bits came for tree {tree_id} node {node}, a passive party's split")
        return row_of[(tree_id, node)]

    return _leaves([tree], X_binned, bits, row, missing_codes)[:, 0]


class VerticalActive:
    """The active side of training and prediction.

    Parameters
    ----------
    channel : Channel of the active party
    X, y : the active party's features and labels
    passives : names of the passive parties, in the order their features follow the active's
    params : GBDTParams (``min_samples_leaf`` must be 1: per-bin counts are not exchanged)
    he : the key holder's HEContext (secret key)
    sample_weight : each instance's weight, or None.  As the engine's, a weight scales the instance's gradient and
        hessian (encrypted so), its share of the active party's own cut points and of the base score; the
        passive parties' cut points are unweighted (they do not know the weights).  Instances of weight 0 are
        left out of every tree as a row subsample leaves rows out: the passive parties learn which they are.
    """

    def __init__(self, channel, X, y, passives: list[str], params: GBDTParams, he: HEContext,
                 bin_mapper: BinMapper | None = None, packer: GHPacker | None = None, ids=None,
                 rows_per_ciphertext: int | None = None, sample_weight=None):
        if params.min_samples_leaf > 1 or params.min_child_weight <= 0:
            raise InvalidParameterError("the vertical protocol exchanges no per-bin counts: it needs "
                                        "min_samples_leaf=1 and min_child_weight > 0")
        refuse_unsupported(params, "the vertical protocol")
        if not he.has_secret:
            raise InvalidParameterError("the active party must hold the secret key")
        self.ch = channel
        self.feature_names = names_of(X)  # its own columns' names (a DataFrame's); test frames matched by them
        self.X, self.y = check_xy(X, y)
        self.weights = AlignedWeights(sample_weight, X, y, len(self.y))  # the label holder's, its rows in place
        self.passives = list(passives)
        self.params = params
        self.he = he
        self.packer = packer or packer_for(params.objective, self.y, self.weights.weights)
        self.row_packing = row_packing_for(he, self.packer, rows_per_ciphertext)
        self.bin_mapper = bin_mapper or self.weights.bin_mapper(params, self.X)
        self.remotes: list[_Remote] = []
        self.ids = instance_ids(ids, len(self.X), channel.party)

    def fit(self, checkpoint=None, resume: bool = False, progress=None) -> GBDTModel:
        """Train; with a ``checkpoint`` store, save after every tree and (``resume``) continue from it.
        ``progress(trees_done, trees_total)`` is called after every tree."""
        ch, p = self.ch, self.params
        objective = objective_for(p.objective, p.n_classes, self.y)
        y = objective.check_labels(self.y)
        self.weights.check(y, objective.name)
        X_binned = self.bin_mapper.transform(self.X)
        X_columns = column_major(X_binned)
        n, n_local = X_binned.shape
        feat, bins = n_local, int(self.bin_mapper.feature_offsets[-1])
        for name in self.passives:
            layout = ch.recv(name, "layout", m.FeatureLayout)
            mine = m.ids_digest(self.ids)
            check_ids_everywhere({ch.party: bool(mine), name: bool(layout.ids_digest)})
            if layout.n_samples != n or (mine and layout.ids_digest and layout.ids_digest != mine):
                raise ProtocolError(f"{name} holds a different set of instances ({layout.n_samples} rows) than "
                                    f"{ch.party} ({n} rows): align the parties' data by ID first, {ALIGN_HINT}")
            self.remotes.append(_Remote(name, layout.n_value_bins, feat, bins))
            feat += len(layout.n_value_bins)
            bins += self.remotes[-1].n_bins
        ch.broadcast("key", m.PublicKey(self.he.public_bytes(), self.packer.frac_bits, self.packer.value_bits,
                                        self.packer.count_bits, self.row_packing.rows,
                                        self.row_packing.stride_bits), self.passives)

        K = objective.n_outputs
        base = self.weights.init_score(objective, y) if p.base_score == "auto" else np.full(K, float(p.base_score))
        model = GBDTModel(p.objective, objective.n_classes, base, None, p.to_dict())
        if self.feature_names is not None:
            model.metadata["own_feature_names"] = self.feature_names
        model.metadata["feature_owners"] = ([[ch.party, j] for j in range(n_local)]
                                            + [[r.name, j] for r in self.remotes for j in range(r.n_features)])
        state = checkpoint.load() if (checkpoint is not None and resume) else None
        if state is not None:
            from fedgrove.engine.model import model_from_dict

            model = model_from_dict(state["model"], source=str(checkpoint.path))
            model.params = p.to_dict()
        start = model.n_trees
        ch.broadcast("start", m.Start(start), self.passives)
        raw = np.tile(model.base_score, (n, 1))
        if start:  # training scores need the passive parties' splits: they are checkpointed with the trees
            from fedgrove.runner.checkpoint import CheckpointStore

            raw = CheckpointStore.scores(state, (n, K))
        scorer = GBDTScorer(p.reg_lambda, p.gamma, p.min_child_weight, p.min_samples_leaf)
        thresholds = self.bin_mapper.thresholds()
        tree_id = start
        self.tree_seconds = []  # wall time of each tree, the passive parties' work included
        # the engine's rows (of the instances of positive weight) and features (over the joined columns)
        sampler = RoundSampler(p, self.weights.n_drawn(n), feat)
        for round_ in range(p.n_estimators):
            sample, features = sampler.next()  # (drawn for the rounds a resumed run skips too)
            mask = sampler.feature_mask(features)
            if round_ * K < start:
                continue
            sample = self.weights.rows(sample)
            g, h = self.weights.scale(*objective.gradients(y, raw))
            rows = slice(None) if sample is None else sample
            for c in range(K):
                t0 = time.perf_counter()
                with ch.scope(tree=tree_id):
                    # (the ciphertexts, about 850 bytes each in HEU's arrays, kept no longer than their bytes)
                    data = self.he.serialize(self.he.encrypt(self.row_packing.pack(
                        self.packer.encode(g[rows, c], h[rows, c]))))
                    ch.broadcast(m.CONTROL, m.EncryptedGradients(
                        tree_id, data, n if sample is None else len(sample), sample is not None,
                        np.zeros(0, dtype=np.int64) if sample is None else sample.astype(np.int64)), self.passives)
                    del data
                    stats = np.column_stack([g[:, c], h[:, c]])
                    local = HistogramSplitFinder(X_binned, self.bin_mapper.feature_offsets,
                                                 self.bin_mapper.missing_codes, thresholds, stats, scorer,
                                                 root_samples=sample, X_columns=X_columns)
                    finder = VerticalSplitFinder(local, ch, self.remotes, self.he, self.packer, scorer, [0],
                                                 self.row_packing, mask)
                    tree = TreeGrower(finder, p.max_depth, lambda s: p.learning_rate * scorer.leaf_value(s),
                                      min_samples_split=2 * p.min_samples_leaf).grow()
                    ch.broadcast(m.CONTROL, m.TreeEnd(tree_id), self.passives)
                    if sample is not None:  # every instance's leaf: the passive parties' go-left bits at their splits
                        bits, row_of = _peer_bits([ch.recv(r.name, m.REPLY, m.PredictBits) for r in self.remotes], n)
                model.add_tree(tree, c)
                if sample is None:
                    leaves = np.nonzero(tree.is_leaf)[0]
                    local.add_node_values(raw, c, leaves, tree.values[leaves, 0])
                else:
                    raw[:, c] += tree.values[_route(tree, tree_id, X_binned, self.bin_mapper.missing_codes, bits,
                                                   row_of), 0]
                self.tree_seconds.append(time.perf_counter() - t0)
                tree_id += 1
                if checkpoint is not None and c == K - 1 and checkpoint.due(tree_id // K, p.n_estimators):
                    checkpoint.save({"trees_done": tree_id, "model": model.to_dict()}, raw)
                if progress is not None:
                    progress(tree_id, p.n_estimators * K)
        with ch.scope(tree=tree_id):
            ch.broadcast(m.CONTROL, m.TrainingDone(tree_id), self.passives)
        self.model = model
        return model

    def predict_raw(self, X_local: np.ndarray, model: GBDTModel | None = None) -> np.ndarray:
        """One round: passives send go-left bits of their splits; the active routes every instance."""
        return predict_active(self.ch, self.passives, model or self.model, X_local)


def predict_active(channel, passives: list[str], model: GBDTModel, X_local: np.ndarray, ids=None) -> np.ndarray:
    """The active party's side of prediction from its model alone (e.g. loaded from its model file): the
    passive parties send the go-left bits of their splits for every test instance; the active routes.  A
    DataFrame's columns are matched by name to the active party's own (``metadata["own_feature_names"]``).
    With the test instances' ``ids`` the passives check that they hold the same instances."""
    X_local = as_numbers(by_names(X_local, model.metadata.get("own_feature_names"), "the active party's test "
                                  "features"), f"{channel.party}'s test X", TEXT_FEATURES)
    owners = model.metadata.get("feature_owners")
    n_own = (sum(1 for o in owners if o[0] == channel.party) if owners else 0) or None  # None: not known
    if X_local.ndim != 2 or (n_own is not None and X_local.shape[1] != n_own):
        raise DataError(f"{channel.party}: test features must have the {n_own} columns it trained on, got shape "
                        f"{X_local.shape}")
    for t, tree in enumerate(model.trees):  # a damaged model file read outside the rows (an IndexError)
        own = tree.nodes[(tree.nodes["feature"] >= 0) & (tree.nodes["owner"] <= 0)]
        if len(own) and own["feature"].max() >= X_local.shape[1]:
            raise ModelFormatError(f"{channel.party}: its model's tree {t} splits on its own column "
                                   f"{int(own['feature'].max())}, but it holds {X_local.shape[1]}: is the model "
                                   f"file this party's, and undamaged?")
        if np.isnan(own["threshold"]).any():  # x <= NaN would send every instance right
            raise ModelFormatError(f"{channel.party}: its model's tree {t} has a split on its own column "
                                   f"{int(own['feature'][np.isnan(own['threshold'])][0])} without a threshold: is "
                                   f"the model file undamaged?")
    if owners and (absent := sorted({o[0] for o in owners} - {channel.party} - set(passives))):
        raise InvalidParameterError(f"{channel.party}: its model was trained with the features of "
                                    f"{', '.join(absent)}, which the federation lacks (its passive parties: "
                                    f"{', '.join(passives) or 'none'}); give the config the model was trained with")
    n = len(X_local)
    digest = m.ids_digest(ids) if ids is not None else b""
    # the most splits one passive party answers for sets the chunks of test rows (one unless the set is large)
    owned = [tree.nodes["owner"][(tree.nodes["feature"] >= 0) & (tree.nodes["owner"] > 0)] for tree in model.trees]
    owned = np.concatenate(owned) if owned else np.zeros(0, dtype=np.int64)
    most = int(np.unique(owned, return_counts=True)[1].max()) if len(owned) else 0
    leaves = np.zeros((n, len(model.trees)), dtype=np.int32)
    for start, stop in prediction_chunks(n, most):
        channel.broadcast("predict", m.PredictRequest(n, digest, start, stop), passives)
        bits, row_of = _peer_bits([channel.recv(name, "predict", m.PredictBits) for name in passives], stop - start)

        def row(t, nid):
            if (t, nid) not in row_of:
                f = int(model.trees[t].nodes[nid]["feature"])
                who = owners[f] if owners and f < len(owners) else ("its owner", f)
                raise ProtocolError(f"{who[0]} sent no go-left bits for tree {t} node {nid}, its split on its "
                                    f"column {who[1]}: are the parties' model files of one training run, and "
                                    f"undamaged?")
            return row_of[(t, nid)]

        leaves[start:stop] = _leaves(model.trees, np.ascontiguousarray(X_local[start:stop], dtype=np.float64),
                                     bits, row)
    return model.raw_from_leaves(leaves)
