"""The passive party: features only.  It sees encrypted gradients, the instance
sets of tree nodes and the splits chosen on its own features; it keeps its cut
points and the thresholds of its splits to itself."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fedgrove.crypto.he import IndexGroups, public_context
from fedgrove.crypto.packing import MASK_BITS, MAX_ROWS, MAX_VALUE_BITS, GHPacker, RowPacking
from fedgrove.engine.binning import BinMapper
from fedgrove.engine.model import TEXT_FEATURES, as_numbers, by_names, names_of
from fedgrove.engine.predict import id_positions, pack_go_left
from fedgrove.exceptions import DataError, ModelFormatError, ProtocolError
from fedgrove.protocols import MAX_PREDICT_BYTES, check_ids_everywhere, check_split_lists, instance_ids
from fedgrove.protocols.vertical import messages as m


def _whole(v) -> int:
    """A model file's node, tree, feature or bin number: an integer (``int()`` would cut 0.5 to 0)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != int(v):
        raise ValueError(f"{v!r} is not a whole number")
    return int(v)


def _plain(entries, width: int) -> bool:
    """Whether ``entries`` is a list of lists of ``width`` items whose first four are ints (not bools): a model
    file's splits or children as fedgrove writes them, which :meth:`PassiveModel.from_dict` takes at once
    (a guest's 1,761 splits and their children 7.6 -> 1.8 ms); anything else entry by entry, naming what is wrong."""
    return isinstance(entries, list) and all(
        type(e) is list and len(e) == width and type(e[0]) is int and type(e[1]) is int and type(e[2]) is int
        and type(e[3]) is int for e in entries)


@dataclass
class PassiveModel:
    """What a feature-holding party keeps: its cut points, its own splits and, where the protocol tells it the
    tree structure (HybridTree guests, Federated Forest clients), the children of every split node."""

    party: str
    bin_mapper: BinMapper
    splits: dict = field(default_factory=dict)  # (tree, node) -> (local feature, bin, missing_left, threshold)
    children: dict = field(default_factory=dict)  # (tree, node) -> (left, right)
    feature_names: list | None = None  # its columns' names when it trained on named data

    def rows(self, X) -> np.ndarray:
        """``X`` as float64, refused unless it has the columns this party trained on (a DataFrame's matched
        by name when the model has names)."""
        X = as_numbers(by_names(X, self.feature_names, f"{self.party}'s test features"), f"{self.party}'s test X",
                       TEXT_FEATURES)
        n_features = self.bin_mapper.n_features
        if X.ndim != 2 or X.shape[1] != n_features:
            raise DataError(f"{self.party}: test features must have the {n_features} columns it trained on, got "
                            f"shape {X.shape}")
        return X

    def packed_go_left(self, X: np.ndarray, keys: list) -> tuple[list[bytes], list[int]]:
        """Which of the rows ``X`` (checked by :meth:`rows`) go left at each split of ``keys``, packed as
        :func:`~fedgrove.protocols.vertical.messages.pack_mask` packs a mask: the distinct masks and, per key,
        which of them is its own (:func:`~fedgrove.protocols.vertical.messages.distinct_masks`).  Each distinct
        condition (feature, threshold, missing direction) is found once, all of them in one kernel (a9a's
        test rows repeated to 50,000, 921 splits of 43 conditions, by hand: 0.029 -> 0.002 s)."""
        conditions: dict = {}
        for k in keys:
            f, _b, ml, thr = self.splits[k]
            conditions.setdefault((f, bool(ml), thr), len(conditions))
        out = np.zeros((len(conditions), (len(X) + 7) // 8), dtype=np.uint8)
        if len(conditions) and len(X):
            f, ml, thr = zip(*conditions)
            pack_go_left(np.asfortranarray(X, dtype=np.float64), np.asarray(f, dtype=np.int64),
                         np.asarray(thr, dtype=np.float64), np.asarray(ml, dtype=np.uint8), out)
        masks, which = m.distinct_masks(out)
        return masks, [which[conditions[(f, bool(ml), thr)]] for f, _b, ml, thr in (self.splits[k] for k in keys)]

    def to_dict(self) -> dict:
        d = {"party": self.party, "bin_mapper": self.bin_mapper.to_dict(),
             "splits": [[t, n, f, b, int(ml), float(thr)] for (t, n), (f, b, ml, thr) in self.splits.items()]}
        if self.children:
            d["children"] = [[t, n, left, right] for (t, n), (left, right) in self.children.items()]
        if self.feature_names is not None:
            d["feature_names"] = list(self.feature_names)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "PassiveModel":
        where = "its party, bin_mapper or feature_names"
        try:
            names = d.get("feature_names")
            model = cls(d["party"], BinMapper.from_dict(d["bin_mapper"]),
                        feature_names=None if names is None else [str(n) for n in names])
            if names is not None and not (isinstance(names, list) and all(isinstance(v, str) for v in names)):
                raise TypeError(f"feature_names must be a list of names, got {str(names)[:60]}")
            if names is not None and len(names) != model.bin_mapper.n_features:
                raise ValueError(f"{len(names)} feature names for {model.bin_mapper.n_features} features")
            where = "its splits"
            splits, children = d["splits"], d.get("children", [])
            if _plain(splits, 6) and all(ml in (0, 1) and type(thr) in (int, float) for *_, ml, thr in splits):
                # (as a model file has them: whole numbers as ints; else, below, entry by entry)
                model.splits = {(t, n): (f, b, bool(ml), float(thr)) for t, n, f, b, ml, thr in splits}
            else:
                for k, entry in enumerate(splits):
                    where = f"split {k} ({str(entry)[:60]})"
                    t, n, f, b, ml, thr = entry
                    if ml not in (0, 1) or isinstance(thr, (bool, str)):
                        raise ValueError("missing_left must be 0 or 1 and the threshold a number")
                    model.splits[(_whole(t), _whole(n))] = (_whole(f), _whole(b), bool(ml), float(thr))
            where = "its children"
            if _plain(children, 4):
                model.children = {(t, n): (left, right) for t, n, left, right in children}
            else:
                for k, entry in enumerate(children):
                    where = f"children entry {k} ({str(entry)[:60]})"
                    t, n, left, right = entry
                    model.children[(_whole(t), _whole(n))] = (_whole(left), _whole(right))
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelFormatError(f"not a party model file: {type(exc).__name__} in {where}: {exc}") from None
        model._check()
        return model

    def _check(self) -> None:
        """Refuse splits that name no column of this party or have no threshold, children that are not two
        later nodes, and (where the model keeps children) splits without them: prediction would index outside
        the rows or walk a broken tree."""
        n_features = self.bin_mapper.n_features
        for (t, n), (f, _b, _ml, thr) in self.splits.items():
            if t < 0 or n < 0 or not 0 <= f < n_features or thr != thr:  # (NaN)
                raise ModelFormatError(f"split ({t}, {n}, feature {f}, threshold {thr}) of a party with "
                                       f"{n_features} features is invalid")
        for (t, n), (left, right) in self.children.items():
            if not (n < left and n < right and left != right):
                raise ModelFormatError(f"children {left}, {right} of node {n} of tree {t} are not two later nodes")
        if self.children and (missing := [k for k in self.splits if k not in self.children]):
            raise ModelFormatError(f"{len(missing)} splits have no children, the first node {missing[0][1]} of "
                                   f"tree {missing[0][0]}")

    def walk_layout(self, trees, binned: bool = False) -> tuple:
        """This party's splits of ``trees`` (tree numbers, one layout each) as the flat arrays
        :func:`~fedgrove.engine.predict.walk_down` walks: per tree its split nodes and their children in id
        order (``node_ids``, ``offsets``), each split's feature, threshold (its bin where ``binned``), missing
        direction and children's positions; -1 as the feature of a node that is not a split; and the positions
        by node id (``index``, ``index_offsets``: :func:`~fedgrove.engine.predict.id_positions`)."""
        want = {int(t): c for c, t in enumerate(trees)}
        known = [set() for _ in want]
        for (t, node), kids in self.children.items():
            if t in want:
                known[want[t]].update((node, *kids))
        for t, node in self.splits:
            if t in want:
                known[want[t]].add(node)
        ids = [np.array(sorted(nodes), dtype=np.int64) for nodes in known]
        offsets = np.concatenate([[0], np.cumsum([len(a) for a in ids])]).astype(np.int64)
        node_ids = np.concatenate(ids) if ids else np.zeros(0, dtype=np.int64)
        total = len(node_ids)
        feature, left, right = (np.full(total, -1, dtype=np.int64) for _ in range(3))
        threshold, missing_left = np.zeros(total), np.zeros(total, dtype=np.uint8)
        for t, c in want.items():
            at = {int(node): offsets[c] + k for k, node in enumerate(ids[c])}
            for node, k in at.items():
                if (split := self.splits.get((t, node))) is not None and (t, node) in self.children:
                    f, b, ml, thr = split
                    kids = self.children[(t, node)]
                    feature[k], threshold[k], missing_left[k] = f, (b if binned else thr), ml
                    left[k], right[k] = at[kids[0]], at[kids[1]]
        return node_ids, offsets, feature, threshold, missing_left, left, right, *id_positions(ids)

    def before(self, n_trees: int) -> "PassiveModel":
        """The part of this model that belongs to the first ``n_trees`` trees (resuming from a checkpoint)."""
        return PassiveModel(self.party, self.bin_mapper, {k: v for k, v in self.splits.items() if k[0] < n_trees},
                            {k: v for k, v in self.children.items() if k[0] < n_trees}, self.feature_names)


class VerticalPassive:
    """Run the passive side of training and prediction on a Channel."""

    def __init__(self, channel, X: np.ndarray, active: str, max_bins: int = 255, seed: int = 0,
                 bin_mapper: BinMapper | None = None, ids=None):
        self.ch = channel
        self.active = active
        names = names_of(X)
        self.X = as_numbers(X, f"{channel.party}'s X", TEXT_FEATURES)
        self.bin_mapper = bin_mapper or BinMapper(max_bins, seed=seed).fit(self.X)
        self.X_binned = self.bin_mapper.transform(self.X)
        self.n_value_bins = self.bin_mapper.n_value_bins
        self.model = PassiveModel(channel.party, self.bin_mapper, feature_names=names)
        self.ids = instance_ids(ids, len(self.X), channel.party)

    def fit(self, checkpoint=None, resume: bool = False) -> PassiveModel:
        """Train; with a ``checkpoint`` store, save after every tree and (``resume``) continue from it."""
        ch = self.ch
        ch.send(self.active, "layout", m.FeatureLayout(self.n_value_bins.astype(np.int32), len(self.X),
                                                       m.ids_digest(self.ids)))
        key = ch.recv(self.active, "key", m.PublicKey)
        he = public_context(key.key)
        packer = packer_from_key(key, ch.party, self.active)
        self.row_packing = row_packing_from_key(key, packer, he, ch.party, self.active)
        for tree, first in follow_trees(self, self.active, m.EncryptedGradients, "the encrypted gradients",
                                        checkpoint, resume):
            ct = he.deserialize(first.ciphertexts)
            sample = None
            if first.sampled:  # subsample: the tree grows on these instances, whose gradients alone came
                sample = first.rows
                if sample.ndim != 1 or len(sample) == 0 or sample[0] < 0 or sample[-1] >= len(self.X) \
                        or np.any(np.diff(sample) <= 0):
                    raise ProtocolError(f"{ch.party}: the instances sampled for tree {tree} are not sorted "
                                        f"positions among its {len(self.X)}")
            n = len(self.X) if sample is None else len(sample)
            if ct.size != self.row_packing.n_ciphertexts(n):
                raise ProtocolError(f"{ch.party}: got {ct.size} ciphertexts of gradients for {n} "
                                    f"instances, {self.row_packing.rows} a ciphertext")
            self._grow(tree, ct, he, packer, sample)
            del ct, first  # (before the next tree's arrive: a tree's ciphertexts and their bytes held once)
        return self.model

    def _grow(self, tree, ct, he, packer, sample=None) -> None:
        """One tree on every instance, or on ``sample`` (their positions; ciphertext ``i`` is ``sample[i]``'s),
        after which the active party is sent the go-left bits of every instance at this party's splits, to
        update every instance's score."""
        ch = self.ch
        X_binned = self.X_binned if sample is None else self.X_binned[sample]
        rows = {0: np.arange(len(X_binned))}
        while True:
            msg = ch.recv(self.active, m.CONTROL)
            if isinstance(msg, m.TreeEnd):
                if sample is not None:
                    ch.send(self.active, m.REPLY, self._bits_of_tree(tree))
                return
            if isinstance(msg, m.HistogramRequest):
                ch.send(self.active, m.REPLY, self._histograms(msg.nodes, rows, ct, he, packer,
                                                                  msg.features if msg.sampled else None, X_binned))
            elif isinstance(msg, m.SplitQuery):
                check_split_lists(f"{ch.party}: split query of tree {tree}", rows, nodes=msg.nodes,
                                  features=msg.features, bins=msg.bins, missing_left=msg.missing_left)
                masks = []
                for node, f, b, ml in zip(msg.nodes, msg.features, msg.bins, msg.missing_left):
                    if not 0 <= f < self.X.shape[1] or not 0 <= b < self.n_value_bins[f]:
                        raise ProtocolError(f"{ch.party}: split query for node {node}, feature {f}, bin {b} "
                                            f"is out of range")
                    mask = self._go_left(X_binned[rows[node], f], f, b, bool(ml))
                    self.model.splits[(tree, node)] = (f, b, bool(ml), self.bin_mapper.threshold(f, b))
                    masks.append(m.pack_mask(mask))
                ch.send(self.active, m.REPLY, m.SplitMasks(masks))
            elif isinstance(msg, m.LayerPartition):
                check_split_lists(f"{ch.party}: partition of tree {tree}", rows, nodes=msg.nodes, left=msg.left,
                                  right=msg.right, masks=msg.masks)
                for node, left, right, bits in zip(msg.nodes, msg.left, msg.right, msg.masks):
                    r = rows.pop(node)  # (an open node: check_split_lists)
                    mask = m.unpack_mask(bits, len(r))
                    rows[left], rows[right] = r[mask], r[~mask]
            else:
                raise ProtocolError(f"{ch.party}: unexpected {type(msg).__name__} during tree {tree}")

    def _histograms(self, nodes, rows, ct, he, packer, features=None, X_binned=None) -> m.EncryptedHistograms:
        return encrypted_histograms(self.ch.party, nodes, rows, self.X_binned if X_binned is None else X_binned,
                                    self.bin_mapper.feature_offsets, ct, he, packer, self.row_packing,
                                    features=features)

    def _bits_of_tree(self, tree: int) -> m.PredictBits:
        """Go-left bits of every training instance at each of this party's splits of ``tree``."""
        keys = sorted(k for k in self.model.splits if k[0] == tree)
        packed = np.zeros((len(keys), (len(self.X_binned) + 7) // 8), dtype=np.uint8)
        for j, key in enumerate(keys):
            f, b, ml, _ = self.model.splits[key]
            packed[j] = np.packbits(self._go_left(self.X_binned[:, f], f, b, ml))
        bits, which = m.distinct_masks(packed)
        return m.PredictBits([k[0] for k in keys], [k[1] for k in keys], bits, which)

    def _go_left(self, codes: np.ndarray, f: int, b: int, missing_left: bool) -> np.ndarray:
        """Which of feature ``f``'s bin ``codes`` go left at a split on bin ``b``."""
        return np.where(codes == self.bin_mapper.missing_codes[f], missing_left, codes <= b)

    def predict(self, X: np.ndarray) -> None:
        """Answer one prediction request: go-left bits of every test instance at each owned split."""
        answer_predict(self.ch, self.active, self.model, X)


def follow_trees(party, leader: str, expected: type, what: str, checkpoint=None, resume: bool = False):
    """A feature holder's side of training, tree by tree: yields ``(tree, first)`` for each tree the
    ``leader`` opens with an ``expected`` message (``what`` names it in the error for anything else), inside
    the channel's scope of that tree, until the leader says training is done.  ``party`` is the protocol's
    party object: its ``ch`` and ``model`` (a :class:`PassiveModel`); a resumed run restores the model from
    the checkpoint at the tree the leader resumes at, and the model is saved there after every tree that
    :meth:`~fedgrove.runner.checkpoint.CheckpointStore.due` names (in trees: a feature holder does not know
    the rounds) and at the end."""
    from fedgrove.runner.checkpoint import CheckpointStore

    ch = party.ch
    tree = ch.recv(leader, "start", m.Start).tree
    if tree > 0:
        state = CheckpointStore.resume_state(checkpoint, resume, tree, ch.party, leader)
        try:
            party.model = PassiveModel.from_dict(state["model"]).before(tree)
        except ModelFormatError as exc:
            raise ModelFormatError(f"checkpoint {checkpoint.path} is damaged: {exc}") from None
    saved = tree
    while True:
        with ch.scope(tree=tree):
            first = ch.recv(leader, m.CONTROL)
            if isinstance(first, m.TrainingDone):
                if checkpoint is not None and saved != tree:  # (checkpoints between: the last trees)
                    checkpoint.save({"trees_done": tree, "model": party.model.to_dict()})
                return
            if not isinstance(first, expected) or first.tree != tree:
                raise ProtocolError(f"{ch.party}: expected {what} of tree {tree} from {leader}, got "
                                    f"{type(first).__name__}")
            yield tree, first
            del first  # (the consumer has let go of it: the next tree's message is not waited for beside it)
        tree += 1
        if checkpoint is not None and checkpoint.due(tree):
            checkpoint.save({"trees_done": tree, "model": party.model.to_dict()})
            saved = tree


def answer_predict(channel, active: str, model: PassiveModel, X: np.ndarray, ids=None) -> None:
    """A passive party's side of prediction from its model alone (e.g. loaded from its model file); with the
    test instances' ``ids``, refused unless the active party's are the same (rows are matched by sorted ID)."""
    X = model.rows(X)
    mine = m.ids_digest(ids) if ids is not None else b""
    keys = sorted(model.splits)
    done = 0  # the rows answered for: the active party asks about consecutive chunks, the last ending at n
    while True:
        req = channel.recv(active, "predict", m.PredictRequest)
        if req.n_samples != len(X):
            raise ProtocolError(f"{channel.party}: {active} asked to predict {req.n_samples} test instances, "
                                f"{channel.party}'s test data holds {len(X)}; every party's test file must hold "
                                f"the same instances (by _id)")
        check_ids_everywhere({channel.party: bool(mine), active: bool(req.ids_digest)}, "test file")
        if mine and req.ids_digest and mine != req.ids_digest:  # the same count of other instances: rows mismatched
            raise ProtocolError(f"{channel.party}: its test instances are not {active}'s (their _id values differ); "
                                f"every party's test file must hold the same instances")
        if req.start != done or not req.start <= req.stop <= len(X) or (req.stop == req.start and len(X)):
            raise ProtocolError(f"{channel.party}: {active} asked about test instances {req.start}:{req.stop} of "
                                f"{len(X)}; expected the next rows from {done} on")
        size = len(keys) * ((req.stop - req.start + 7) // 8)
        if size > max(MAX_PREDICT_BYTES, len(keys)):
            raise ProtocolError(f"{channel.party}: {active} asked about test instances {req.start}:{req.stop}, "
                                f"{size} bytes of go-left bits, more than one answer may hold ({MAX_PREDICT_BYTES})")
        channel.send(active, "predict", m.PredictBits([t for t, _ in keys], [n for _, n in keys],
                                                      *model.packed_go_left(X[req.start:req.stop], keys)))
        done = req.stop
        if done == len(X):
            return


def packer_from_key(key: m.PublicKey, party: str, sender: str) -> GHPacker:
    """The (g, h) packing layout the key holder announced, refused by name when out of range."""
    if not (1 <= key.frac_bits <= 64 and 1 <= key.value_bits <= MAX_VALUE_BITS and 1 <= key.count_bits <= 40):
        raise ProtocolError(f"{party}: packing layout {key.frac_bits}/{key.value_bits}/{key.count_bits} "
                            f"(fractional/value/count bits) from {sender} is out of range "
                            f"(1-64/1-{MAX_VALUE_BITS}/1-40)")
    return GHPacker(key.frac_bits, key.value_bits, key.count_bits)


def row_packing_from_key(key: m.PublicKey, packer: GHPacker, he, party: str, sender: str) -> RowPacking:
    """How many instances share a gradient ciphertext, as the key holder announced; refused by name unless
    1-16 with the stride :class:`RowPacking` needs and at least one whole bin per plaintext."""
    k = key.rows_per_ciphertext
    if not 1 <= k <= MAX_ROWS:
        raise ProtocolError(f"{party}: {k} instances per ciphertext from {sender} is out of range (1-{MAX_ROWS})")
    rows = RowPacking.for_packer(packer, k)
    if key.stride_bits != rows.stride_bits and k > 1:
        raise ProtocolError(f"{party}: stride of {key.stride_bits} bits from {sender}; {k} instances per "
                            f"ciphertext of {packer.slot_bits}-bit pairs need {rows.stride_bits} "
                            f"({MASK_BITS} bits of noise)")
    if not rows.fits(he.plaintext_bits):
        raise ProtocolError(f"{party}: {k} instances per ciphertext from {sender} do not fit the key's "
                            f"{he.plaintext_bits}-bit plaintexts")
    return rows


# below this many ciphertext additions for a node (every listed row straight into its bins) the search for a
# cheaper plan costs more than it can save: timed by hand on a9a's guest columns, 2026-11-25, the search took
# 0.13 ms and saved 49 of 343 additions (0.05 ms at 1.1 us each) on a node of 200 rows, and took 0.32 ms and
# saved 530 of 1,681 (0.58 ms) on one of 1,000
PLAN_MIN_ADDITIONS = 1024


def encrypted_histograms(party, nodes, rows, X_binned, offsets, ct, he, packer,
                         row_packing: RowPacking | None = None,
                         plan_min_additions: int = PLAN_MIN_ADDITIONS, features=None) -> m.EncryptedHistograms:
    """Encrypted per-bin (G, H) sums of the nodes' instances (``rows[node]``: instance ``i`` is ``ct[i]``, or
    position ``i mod K`` of ``ct[i // K]`` with ``row_packing`` of ``K`` rows).

    For every (node, feature) the node's most frequent bin is left out (the key
    holder recovers it from the node total); the sums are compressed before
    they are sent.  Shared by the vertical passive party, HybridTree guests and
    Federated Forest clients.

    Rows that share their bins are added once: each node's sums are formed by
    the cheapest of three plans (:func:`_node_plan`, counted exactly before any
    ciphertext is touched) — every listed row straight into its bins; one sum
    per distinct row pattern first; or pattern sums, then sums per distinct
    pattern of each half of the features (with ciphertexts only: for the plain
    test backend the search costs more than it saves).  The sums are the same
    integers whichever plan runs; on one-hot data (a9a, depth 6) they take
    about half the ciphertext additions of the straight plan.  A node whose
    straight plan adds fewer than ``plan_min_additions`` ciphertexts is summed
    straight, without the search.

    With ``K`` instances per ciphertext every bin gets ``K`` sums, one per
    position (the bin's code becomes ``bin * K + K - 1 - position``, so the
    plans above run unchanged); they are compressed whole bins to a
    plaintext and masked as :class:`RowPacking` describes.

    ``features`` (None: all): the only features whose bins are summed (the round's sample); the others list no
    bin, and their sums are left to the key holder's node totals, which it does not use.
    """
    n_features = X_binned.shape[1]
    width = int(np.max(np.diff(offsets))) if n_features else 1
    k = 1 if row_packing is None else row_packing.rows
    unused = None
    if features is not None:
        features = np.asarray(features, dtype=np.int64)
        if features.ndim != 1 or np.any(features < 0) or np.any(features >= n_features):
            raise ProtocolError(f"{party}: histogram request for features {features.tolist()} outside its "
                                f"{n_features}")
        unused = np.ones(n_features, dtype=bool)
        unused[features] = False
    plans, skipped, n_bins, bins = [], [], [], []
    for node in nodes:
        if node not in rows:
            raise ProtocolError(f"{party}: histogram request for unknown node {node}")
        r = np.asarray(rows[node], dtype=np.int64)
        B = X_binned[r]
        keys = _keys(B, width)
        counts = np.bincount(keys, minlength=n_features * width).reshape(n_features, width)
        skip = counts.argmax(axis=1)  # the most frequent bin (ties: the lowest)
        present = counts > 0
        present[np.arange(n_features), skip] = False
        listed = B != skip
        if unused is not None:
            present[unused] = False
            listed[:, unused] = False
        ids = r
        if k > 1:  # a bin's sums per position: codes bin * k + (k - 1 - position), items are ciphertexts
            code = np.uint16 if width * k <= np.iinfo(np.uint16).max else np.int64
            ids, B = r // k, B.astype(code) * code(k) + (k - 1 - r % k).astype(code)[:, None]
            keys = _keys(B, width * k)
        search = he.costly_additions and int(listed.sum()) >= plan_min_additions
        plans.append(_node_plan(ids, B, listed, width * k, keys, k) if search
                     else [_bin_groups(B, listed, ids, width * k, keys, k)])
        skipped.extend(skip.tolist())
        n_bins.extend(present.sum(axis=1).tolist())
        bins.extend(np.nonzero(present)[1].tolist())
    n_sums = sum(len(plan[-1][1]) for plan in plans) // k
    data = b""
    slots = packer.slots_per_plaintext(he.plaintext_bits) if k == 1 else row_packing.bins_per_plaintext(
        he.plaintext_bits)
    if n_sums:
        sums, stages = ct, _batched_stages(plans)
        for groups in stages[:-1]:
            sums = he.select_sums(sums, groups, for_key_holder=True)
        if k == 1:
            sums = he.compressed_sums(sums, stages[-1], packer.slot_bits, slots)
        else:
            sums = he.compressed_sums(sums, stages[-1], row_packing.stride_bits, slots * k)
            sums = he.add_plain(sums, row_packing.masks(n_sums, slots, packer.slot_bits))
        data = he.serialize(sums)
    return m.EncryptedHistograms(data, n_sums, slots, np.asarray(skipped, dtype=np.int32),
                                 np.asarray(n_bins, dtype=np.int32), np.asarray(bins, dtype=np.int32))


def _node_plan(r, B, listed, width, keys, group=1):
    """The cheapest way to form one node's bin sums: a list of stages ``(ids, sizes)``, groups of consecutive
    ``ids`` that are summed.  The first stage's ids are rows (``r``), a later stage's are positions in the
    node's output of the stage before; the last stage gives the listed (feature, bin) sums in order.  Plans are
    compared by the ciphertexts all their stages add up, counted before any group is built.  ``keys`` are
    B's (feature, bin) keys (:func:`_keys`); ``group``: see :func:`_bin_groups`."""
    keep = listed.any(axis=1)
    ids, sizes, first = _pattern_groups(B[keep], r[keep])
    best = int(listed.sum())  # straight: every listed row into its bins
    if len(sizes) == len(ids):  # no two rows share a pattern: nothing to gain
        return [_bin_groups(B, listed, r, width, keys, group)]
    U, listed_u = B[keep][first], listed[keep][first]
    choice = None
    if len(ids) + int(listed_u.sum()) < best:
        best, choice = len(ids) + int(listed_u.sum()), "patterns"
    halves = []
    if B.shape[1] > 1:
        terms = len(ids)
        for half in np.array_split(np.arange(B.shape[1]), 2):
            in_half = np.nonzero(listed_u[:, half].any(axis=1))[0]
            sub = _pattern_groups(U[in_half][:, half], in_half)
            halves.append((half, in_half, sub))
            terms += len(in_half) + int(listed_u[in_half[sub[2]]][:, half].sum())
        if terms < best:
            choice = "halves"
    if choice is None:
        return [_bin_groups(B, listed, r, width, keys, group)]
    if choice == "patterns":
        return [(ids, sizes), _bin_groups(U, listed_u, np.arange(len(U)), width, group=group)]
    middle, finals, base = [], [], 0
    for half, in_half, (sub_ids, sub_sizes, sub_first) in halves:
        middle.append((sub_ids, sub_sizes))
        rep = in_half[sub_first]  # each half-pattern's first pattern
        finals.append(_bin_groups(U[rep][:, half], listed_u[rep][:, half], base + np.arange(len(rep)), width,
                                  group=group))
        base += len(rep)
    return [(ids, sizes), _concat(middle), _concat(finals)]


def _keys(C, width):
    """Key ``f * width + b`` of each code of ``C`` (items x features), feature-major: feature 0's items, then 1's."""
    return (C.astype(np.int64) + np.arange(C.shape[1], dtype=np.int64) * width).T.ravel()


def _bin_groups(C, listed, ids, width, keys=None, group=1):
    """``(ids, sizes)`` of the items (rows of codes ``C``, one id each) in each listed (feature, bin) of C's
    columns, in (feature, bin) order (``keys``: C's keys when already computed).  With ``group > 1`` codes come
    in runs of ``group`` (a bin's sums per ciphertext position): a run with any item is kept whole, empty
    groups included."""
    n_items, n_cols = C.shape
    keys = _keys(C, width) if keys is None else keys
    kept = np.nonzero(listed.T.ravel())[0]
    keys = keys[kept]
    order = np.argsort(keys, kind="stable")
    sizes = np.bincount(keys, minlength=n_cols * width) if n_items else np.zeros(0, dtype=np.int64)
    if group > 1:
        runs = sizes.reshape(-1, group)
        sizes = runs[runs.sum(axis=1) > 0].ravel()
    else:
        sizes = sizes[sizes > 0]
    return np.asarray(ids, dtype=np.int64)[kept % max(n_items, 1)][order], sizes


def _pattern_groups(C, ids):
    """``(ids, sizes)`` of the items grouped by identical rows of ``C``, and each group's first item."""
    if len(C) == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    as_bytes = np.ascontiguousarray(C).view(np.dtype((np.void, C.dtype.itemsize * C.shape[1]))).ravel()
    _, first, inverse, sizes = np.unique(as_bytes, return_index=True, return_inverse=True, return_counts=True)
    return np.asarray(ids, dtype=np.int64)[np.argsort(inverse.ravel(), kind="stable")], sizes, first


def _concat(stages):
    return np.concatenate([s[0] for s in stages]), np.concatenate([s[1] for s in stages])


def _batched_stages(plans):
    """The nodes' plans as one IndexGroups per stage for the whole request: positions made global, and
    nodes with fewer stages carrying their finished sums forward (one copy each) so that the last stage
    lists every node's sums in request order."""
    depth = max(len(plan) for plan in plans)
    plans = [plan + [(np.arange(len(plan[-1][1])), np.ones(len(plan[-1][1]), dtype=np.int64))] * (depth - len(plan))
             for plan in plans]
    out, before = [], None
    for s in range(depth):
        ids, sizes = [], []
        for k, plan in enumerate(plans):
            stage_ids, stage_sizes = plan[s]
            ids.append(stage_ids if s == 0 else stage_ids + before[k])
            sizes.append(stage_sizes)
        counts = [len(z) for z in sizes]
        before = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        out.append(IndexGroups(np.concatenate(ids), np.concatenate(sizes)))
    return out
