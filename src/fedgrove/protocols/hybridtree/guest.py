"""A HybridTree guest: features for a subset of the host's instances, no labels."""

from __future__ import annotations

import numpy as np
from numba import njit

from fedgrove.crypto.he import public_context
from fedgrove.engine.binning import BinMapper
from fedgrove.engine.model import TEXT_FEATURES, as_numbers, names_of
from fedgrove.engine.predict import find_position, walk_down
from fedgrove.exceptions import ModelFormatError, ProtocolError
from fedgrove.log import logger
from fedgrove.protocols import MAX_PREDICT_BYTES, check_split_lists, instance_ids
from fedgrove.protocols.hybridtree import messages as m
from fedgrove.protocols.vertical.passive import (PassiveModel, encrypted_histograms, follow_trees, packer_from_key,
                                                row_packing_from_key)


class HybridGuest:
    def __init__(self, channel, X, ids, host: str, max_bins: int = 255, seed: int = 0):
        self.ch, self.host = channel, host
        names = names_of(X)
        self.X = as_numbers(X, f"{channel.party}'s X", TEXT_FEATURES)
        self.ids = instance_ids(ids, len(self.X), channel.party)
        self.bin_mapper = BinMapper(max_bins, seed=seed).fit(self.X)
        self.X_binned = self.bin_mapper.transform(self.X)
        # splits and their children (for routing)
        self.model = PassiveModel(channel.party, self.bin_mapper, feature_names=names)

    def fit(self, checkpoint=None, resume: bool = False) -> PassiveModel:
        """Train; with a ``checkpoint`` store, save after every tree and (``resume``) continue from it."""
        ch = self.ch
        from fedgrove.crypto.secagg import MaskingKeys

        masking = MaskingKeys(ch.party)
        ch.send(self.host, "layout", m.GuestLayout(self.bin_mapper.n_value_bins.astype(np.int32), self.ids,
                                                   masking.public_bytes()))
        key = ch.recv(self.host, "key", m.PublicKey)
        he = public_context(key.key)
        packer = packer_from_key(key, ch.party, self.host)
        row_packing = row_packing_from_key(key, packer, he, ch.party, self.host)
        self.setup = ch.recv(self.host, "setup", m.HybridSetup)
        self._check_setup(masking)
        self.row_packing = row_packing
        if row_packing.rows > 1 and self.setup.mode == "count":
            raise ProtocolError(f"{ch.party}: {row_packing.rows} instances per ciphertext from {self.host} in count "
                                f"mode, which needs one (a prediction per instance)")
        if self.setup.subset:
            self._keep(self.setup.kept)
        for tree, first in follow_trees(self, self.host, m.NodeGradients, "the gradients", checkpoint, resume):
            if len(first.nodes) != len(self.X):
                raise ProtocolError(f"{ch.party}: the gradients of tree {tree} from {self.host} are for "
                                    f"{len(first.nodes)} instances, {ch.party} holds {len(self.X)}")
            sample = self._sample(tree, first)
            X_binned = self.X_binned if sample is None else self.X_binned[sample]
            nodes = first.nodes if sample is None else first.nodes[sample]
            ct = he.deserialize(first.ciphertexts)
            if ct.size != row_packing.n_ciphertexts(len(X_binned)):
                raise ProtocolError(f"{ch.party}: {ct.size} ciphertexts for {len(X_binned)} instances at "
                                    f"{row_packing.rows} a ciphertext")
            rows = {int(n): np.nonzero(nodes == n)[0] for n in np.unique(nodes)}
            self._grow(tree, rows, ct, he, packer, X_binned, None if sample is None else first.nodes)
            del ct, first  # (before the next tree's arrive: a tree's ciphertexts and their bytes held once)
        return self.model

    def _sample(self, tree: int, first: m.NodeGradients) -> np.ndarray | None:
        """The round's rows (``subsample``) the gradients are for: None for all."""
        if not first.sampled:
            return None
        rows = first.rows
        if self.setup.mode == "count":
            raise ProtocolError(f"{self.ch.party}: sampled gradients of tree {tree} from {self.host} in count "
                                f"mode, which predicts every instance from its own gradients")
        if rows.ndim != 1 or (len(rows) and (rows[0] < 0 or rows[-1] >= len(self.X)
                                             or np.any(np.diff(rows) <= 0))):
            raise ProtocolError(f"{self.ch.party}: the sampled rows of tree {tree} from {self.host} are not "
                                f"increasing positions among its {len(self.X)} instances")
        return rows

    def _go_left(self, codes: np.ndarray, f: int, b: int, missing_left: bool) -> np.ndarray:
        return np.where(codes == self.bin_mapper.missing_codes[f], bool(missing_left), codes <= b)

    def _route(self, tree: int, handoff: np.ndarray) -> np.ndarray:
        """The leaf of this guest's layers of ``tree`` that each instance reaches from its hand-off node."""
        return _walked(self.model.walk_layout([tree], binned=True), self.X_binned, np.arange(len(self.X_binned)),
                       np.asarray(handoff)[:, None], self.bin_mapper.missing_codes)[:, 0]

    def _check_setup(self, masking) -> None:
        st = self.setup
        if st.mode not in ("hessian", "count"):
            raise ProtocolError(f"{self.ch.party}: unknown leaf mode {st.mode!r} from {self.host}")
        self.shared = {}
        if st.mode == "count":
            peers, keys, off = list(st.peers or []), list(st.peer_keys or []), st.shared_offsets
            if (len(keys) != len(peers) or len(off) != len(peers) + 1 or not 1 <= st.scale_bits <= 64
                    or not st.learning_rate > 0 or not np.isfinite(st.learning_rate * 2.0 ** st.scale_bits)
                    or not 0 <= st.reg_lambda < np.inf):
                raise ProtocolError(f"{self.ch.party}: count-mode setup from {self.host} is malformed")
            masking.agree(dict(zip(peers, keys)))
            self.shared = {v: st.shared_ids[off[k]:off[k + 1]] for k, v in enumerate(peers) if off[k + 1] > off[k]}
        self.masking = masking

    def _keep(self, kept) -> None:
        """Train on the instances the host holds too (its ``kept`` list, in this guest's own row order)."""
        keep = np.isin(self.ids, kept)
        if len(kept) == 0 or int(keep.sum()) != len(kept) or len(np.unique(kept)) != len(kept):
            raise ProtocolError(f"{self.ch.party}: {self.host} asked to keep {len(kept)} instances, "
                                f"{int(keep.sum())} of which this guest holds (expected a non-empty subset of its "
                                f"IDs without repeats)")
        self.X, self.X_binned, self.ids = self.X[keep], self.X_binned[keep], self.ids[keep]

    def _count_predictions(self, tree, rows, ct, he, packer) -> m.EncryptedPredictions:
        """Enc(leaf value) per leaf by scalar multiplication with -lr/(|I|+lambda), and per instance its leaf's
        value plus a mask that cancels over the guests holding the instance."""
        st = self.setup
        nodes = sorted(rows)
        counts = [len(rows[nd]) for nd in nodes]
        packed = he.select_sums(ct, [rows[nd].tolist() for nd in nodes])
        shift = packer.frac_bits + packer.shift  # the count part of a packed (G, count) sum
        g_only = he.add(packed, he.encrypt([-(c << shift) for c in counts]))
        factors = [int(round(-st.learning_rate * 2.0 ** st.scale_bits / (c + st.reg_lambda))) for c in counts]
        leaf_ct = he.mul_scalar(g_only, factors)
        index = np.empty(len(self.X), dtype=np.int64)
        for k, nd in enumerate(nodes):
            index[rows[nd]] = k
        per_instance = he.select_sums(leaf_ct, [[int(k)] for k in index])
        masks = self.masking.mask_shared(f"hybridtree|tree{tree}", self.ids, self.shared)
        per_instance = he.add(per_instance, he.encrypt(masks))
        return m.EncryptedPredictions(he.serialize(per_instance), nodes, he.serialize(leaf_ct))

    def _grow(self, tree, rows, ct, he, packer, X_binned, handoff=None) -> None:
        """Grow this guest's layers of ``tree`` on ``X_binned`` (the round's rows: ``rows[node]`` index it and
        ``ct``); with ``handoff`` (row subsampling: every instance's hand-off node) route all instances at the
        end."""
        ch = self.ch
        while True:
            msg = ch.recv(self.host, m.CONTROL)
            if isinstance(msg, m.HistogramRequest):  # (with colsample_bytree: only the sampled features' bins)
                ch.send(self.host, m.REPLY, encrypted_histograms(ch.party, msg.nodes, rows, X_binned,
                                                                 self.bin_mapper.feature_offsets, ct, he, packer,
                                                                 self.row_packing,
                                                                 features=msg.features if msg.sampled else None))
            elif isinstance(msg, m.GuestSplits):
                check_split_lists(f"{ch.party}: the splits of tree {tree}", rows, nodes=msg.nodes,
                                  features=msg.features, bins=msg.bins, missing_left=msg.missing_left,
                                  left=msg.left, right=msg.right)
                for node, f, b, ml, left, right in zip(msg.nodes, msg.features, msg.bins, msg.missing_left, msg.left,
                                                       msg.right):
                    if not 0 <= f < self.X.shape[1] or not 0 <= b < self.bin_mapper.n_value_bins[f]:
                        raise ProtocolError(f"{ch.party}: split of node {node} on feature {f}, bin {b} is invalid")
                    r = rows.pop(node)
                    go = self._go_left(X_binned[r, f], f, b, ml)
                    rows[left], rows[right] = r[go], r[~go]
                    self.model.splits[(tree, node)] = (f, b, bool(ml), self.bin_mapper.threshold(f, b))
                    self.model.children[(tree, node)] = (left, right)
            elif isinstance(msg, m.TreeEnd) and self.setup.mode == "count":
                ch.send(self.host, m.REPLY, self._count_predictions(tree, rows, ct, he, packer))
                return
            elif isinstance(msg, m.TreeEnd):
                if handoff is not None:  # every instance, the round's or not
                    leaves = self._route(tree, handoff)
                else:
                    leaves = np.full(len(self.X), -1, dtype=np.int32)
                    for node, r in rows.items():
                        leaves[r] = node
                ch.send(self.host, m.REPLY, m.LeafAssignment(leaves))
                return
            else:
                raise ProtocolError(f"{ch.party}: unexpected {type(msg).__name__} in tree {tree}")

    @classmethod
    def from_model(cls, channel, model: dict, host: str) -> "HybridGuest":
        """A guest ready to answer routing requests from its own model file (``model_dict()`` output)."""
        guest = cls.__new__(cls)
        guest.ch, guest.host = channel, host
        guest.model = PassiveModel.from_dict(model)
        if guest.model.splits and not guest.model.children:
            raise ModelFormatError("not a HybridTree guest model: its splits' children are missing")
        # a guest grows its layers alone: every node with children is one of its splits (a split left out would
        # end its instances' walk there, short of the leaves the host holds values for)
        if orphans := [k for k in guest.model.children if k not in guest.model.splits]:
            raise ModelFormatError(f"node {orphans[0][1]} of tree {orphans[0][0]} has children but no split")
        for t, kids in _children_by_tree(guest.model).items():
            try:
                subtree_leaves(kids)
            except ValueError as exc:
                raise ModelFormatError(f"the splits of tree {t}: {exc}") from None
        return guest

    def model_dict(self) -> dict:
        """This guest's part of the model: its cut points, its splits (with thresholds) and their children."""
        return self.model.to_dict()

    def predict(self, X_test, test_ids) -> None:
        """Answer the host's routing request: walk this guest's splits from each given hand-off node."""
        X_test = self.model.rows(X_test)
        test_ids = np.asarray(test_ids, dtype=np.int64)
        order = np.argsort(test_ids, kind="stable")
        sorted_ids = test_ids[order]
        done, total, any_held = 0, None, False  # the host asks about consecutive chunks, the last ending at total
        layout = ranks = None  # this guest's splits of the trees asked about, laid out once; its leaves' ranks
        while total is None or done < total:
            req = self.ch.recv(self.host, "route", m.RouteRequest)
            n, n_trees = req.nodes.shape
            if len(req.ids) != n:
                raise ProtocolError(f"{self.ch.party}: routing request with {len(req.ids)} IDs for {n} rows")
            total = req.n_samples if total is None else total
            if req.n_samples != total or req.start != done or done + n > total or (n == 0 and total):
                raise ProtocolError(f"{self.ch.party}: routing request for test instances {req.start}:"
                                    f"{req.start + n} of {req.n_samples}; expected the next rows from {done} on "
                                    f"of {total}")
            if n * (8 + 4 * n_trees) > max(MAX_PREDICT_BYTES, 8 * (8 + 4 * n_trees)):  # (the host's chunks)
                raise ProtocolError(f"{self.ch.party}: routing request for {n} test instances of {n_trees} trees, "
                                    f"more than one message may hold ({MAX_PREDICT_BYTES} bytes)")
            pos = np.searchsorted(sorted_ids, req.ids)
            found = pos < len(sorted_ids)
            found[found] = sorted_ids[pos[found]] == req.ids[found]
            held = np.nonzero(found)[0]  # the requested instances this guest holds
            any_held = any_held or len(held) > 0
            leaves = np.full((n, n_trees), -1, dtype=np.int32)
            if layout is None or layout[1].shape[0] != n_trees + 1:  # (raw values against the thresholds)
                layout, ranks = self.model.walk_layout(range(n_trees)), None
            leaves[held] = _walked(layout, X_test, order[pos[held]], req.nodes[held])
            if req.ranks:  # (each leaf as its rank below the hand-off node: the host knows the order)
                if ranks is None:
                    ranks = layout_leaf_ranks(layout)
                leaves = ranks_of_leaves(leaves, layout, ranks)
            self.ch.send(self.host, "route", m.RouteAnswer(leaves))
            done += n
        if total and len(test_ids) and not any_held:
            logger.warning("%s: none of the host's %d test instances is among the %d of its test file: were both "
                           "files' _id columns written alike (numbers, or the same text)?", self.ch.party, total,
                           len(test_ids))


def _children_by_tree(model: PassiveModel) -> dict:
    """The model's splits' children by tree: {tree: {node: (left, right)}}."""
    per_tree = {}
    for (t, node), kids in model.children.items():
        per_tree.setdefault(t, {})[node] = kids
    return per_tree


def layout_leaf_ranks(layout: tuple) -> np.ndarray:
    """Per node of ``layout`` (:meth:`~fedgrove.protocols.vertical.passive.PassiveModel.walk_layout`), a leaf's
    rank among the leaves below its hand-off node, left to right; 0 for the splits: by
    :func:`_layout_leaf_ranks` (:func:`_leaf_ranks` its reference, by :func:`subtree_leaves`)."""
    feature = layout[2]
    rank = np.zeros(len(feature), dtype=np.int32)
    _layout_leaf_ranks(layout[1], feature, layout[5], layout[6], rank, np.empty(len(feature) + 1, dtype=np.int64))
    return rank


@njit(cache=True, nogil=True)
def _layout_leaf_ranks(offsets, feature, left, right, rank, stack):
    """``rank[k]``: leaf ``k``'s place among the leaves below the split that is no split's child above it (its
    hand-off node), left to right, walking the layout's splits (``feature[k] >= 0``: children at positions
    ``left[k]``, ``right[k]``) depth first with ``stack`` (one more entry than nodes)."""
    n = feature.shape[0]
    child = np.zeros(n, dtype=np.bool_)
    for k in range(n):
        if feature[k] >= 0:
            child[left[k]] = True
            child[right[k]] = True
    for c in range(offsets.shape[0] - 1):
        for k in range(offsets[c], offsets[c + 1]):
            if feature[k] < 0 or child[k]:
                continue
            r, top = 0, 1
            stack[0] = k
            while top > 0:
                top -= 1
                v = stack[top]
                if feature[v] >= 0:
                    stack[top] = right[v]
                    stack[top + 1] = left[v]
                    top += 2
                else:
                    rank[v] = r
                    r += 1


def _leaf_ranks(model: PassiveModel, trees, layout: tuple) -> np.ndarray:
    """Reference for :func:`layout_leaf_ranks` from the model's children (:func:`subtree_leaves`): per node of
    ``layout`` (of ``trees``) a leaf's rank below its hand-off node, 0 for the splits."""
    node_ids, offsets = layout[0], layout[1]
    rank = np.zeros(len(node_ids), dtype=np.int32)
    per_tree = _children_by_tree(model)
    for c, t in enumerate(trees):
        known = node_ids[offsets[c]:offsets[c + 1]]
        for leaves in subtree_leaves(per_tree.get(t, {})).values():
            rank[offsets[c] + np.searchsorted(known, leaves)] = np.arange(len(leaves))
    return rank


def ranks_of_leaves(leaves: np.ndarray, layout: tuple, rank: np.ndarray) -> np.ndarray:
    """The walked ``leaves`` (nodes; -1 kept) as their ``rank`` (:func:`layout_leaf_ranks`), 0 for a
    node the layout lacks (a hand-off node with nothing grown below it), by :func:`_ranks_of_leaves`."""
    out = np.empty(leaves.shape, dtype=np.int32)
    _ranks_of_leaves(np.ascontiguousarray(leaves, dtype=np.int32), layout[0], layout[1], layout[-2], layout[-1],
                     rank, out)
    return out


@njit(cache=True, nogil=True)
def _ranks_of_leaves(leaves, node_ids, offsets, index, index_offsets, rank, out):
    """``out[i, c]``: the rank of node ``leaves[i, c]`` of layout ``c`` (found by
    :func:`~fedgrove.engine.predict.find_position`), 0 for a node the layout lacks, -1 kept."""
    for i in range(leaves.shape[0]):
        for c in range(leaves.shape[1]):
            v = leaves[i, c]
            if v < 0:
                out[i, c] = -1
                continue
            k = find_position(node_ids, offsets[c], offsets[c + 1], index, index_offsets, c, v)
            out[i, c] = rank[k] if k >= 0 else 0


def _ranks_of_leaves_numpy(leaves, layout: tuple, rank: np.ndarray) -> np.ndarray:
    """numpy reference for :func:`_ranks_of_leaves`."""
    node_ids, offsets = layout[0], layout[1]
    out = np.zeros(leaves.shape, dtype=np.int32)
    for c in range(leaves.shape[1]):
        known = node_ids[offsets[c]:offsets[c + 1]]
        col = leaves[:, c].astype(np.int64)
        pos = np.minimum(np.searchsorted(known, col), max(len(known) - 1, 0))
        hit = (col >= 0) & (known[pos] == col) if len(known) else np.zeros(len(col), dtype=bool)
        out[hit, c] = rank[offsets[c] + pos[hit]]
        out[col < 0, c] = -1
    return out


def _walked(layout: tuple, X: np.ndarray, rows: np.ndarray, start: np.ndarray, missing_codes=None) -> np.ndarray:
    """Rows ``rows`` of ``X`` moved from their ``start`` nodes (a column per layout of
    :meth:`~fedgrove.protocols.vertical.passive.PassiveModel.walk_layout`) down a guest's splits to the nodes
    they reach, an int32 array of ``start``'s shape: raw values, or bin codes with each feature's
    ``missing_codes``; in one kernel (:func:`~fedgrove.engine.predict.walk_down`)."""
    out = np.empty(np.shape(start), dtype=np.int64)
    walk_down(np.ascontiguousarray(X), np.asarray(rows, dtype=np.int64), np.ascontiguousarray(start, dtype=np.int64),
              *layout, np.zeros(0, dtype=np.int64) if missing_codes is None
              else np.asarray(missing_codes, dtype=np.int64), out)
    if out.size and int(out.min()) == -2:  # (children that are later nodes, as a model file's are checked to be)
        raise ProtocolError("a guest's splits lead from a node back to an earlier one (a cycle)")
    return out.astype(np.int32)


def subtree_leaves(children: dict) -> dict:
    """For a party's splits of one tree (``children``: {node: (left, right)}), the leaves below each node that
    is no split's child (a HybridTree hand-off node), left to right: {root: [leaf, ...]}.  A node that is two
    splits' child, a split's child that is itself, or a cycle raises ValueError."""
    parent = {}
    for node, (a, b) in children.items():
        if a == b or a == node or b == node or a in parent or b in parent:
            k = a if a == node or a in parent else b
            raise ValueError(f"node {node}'s children {a}, {b} are not two distinct nodes" if a == b else
                             f"node {k} is the child of {'itself' if k == node else 'two splits'}")
        parent[a] = parent[b] = node
    out, seen = {}, 0
    for root in sorted(children.keys() - parent.keys()):
        leaves, stack = [], [root]
        while stack:
            node = stack.pop()
            kids = children.get(node)
            if kids is None:
                leaves.append(node)
            else:
                stack += (kids[1], kids[0])  # the left one first
        out[root] = leaves
        seen += 2 * len(leaves) - 1  # (a binary tree's nodes)
    if seen != len(children.keys() | parent.keys()):
        raise ValueError("its splits' children lead back to an earlier node (a cycle)")
    return out
