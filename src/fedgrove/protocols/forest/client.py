"""A Federated Forest client: some features of every instance, and perhaps the labels.

Every client tracks the instances of every node (the master relays each
split's partition), builds histograms of its drawn features and, for the
splits chosen on its features, computes the partition and keeps the threshold
to itself.  A *scorer* turns histograms into per-feature gains: in encrypted
mode the label holder scores every client's features (its own from plaintext
histograms, the others' from encrypted ones it decrypts), in shared-label
mode each client scores its own.
"""

from __future__ import annotations

import numpy as np

from fedgrove.crypto.he import HEContext, public_context
from fedgrove.crypto.packing import VectorPacker
from fedgrove.engine.binning import BinMapper
from fedgrove.engine.model import TEXT_FEATURES, as_numbers, check_row_labels, names_of
from fedgrove.engine.forest import forest_stats, forest_weights, label_offset, regression_grid, weight_fraction_bits
from fedgrove.engine.gbdt import check_sample_weight
from fedgrove.engine.losses import classes_from_labels
from fedgrove.engine.grower import Layer, LayerSplits
from fedgrove.engine.split import CRITERIA, cart_pair_splits
from fedgrove.engine.splitter import CARTScorer, HistogramSplitFinder, absent_missing_left
from fedgrove.exceptions import DataError, InvalidParameterError, ProtocolError
from fedgrove.protocols import MAX_PREDICT_BYTES, check_split_lists, instance_ids
from fedgrove.protocols.forest import messages as m
from fedgrove.protocols.vertical.active import _Remote, decode_histograms
from fedgrove.protocols.vertical.passive import PassiveModel, encrypted_histograms, follow_trees


def label_packer(task: str, y: np.ndarray, n_classes: int, weights: np.ndarray | None = None) -> VectorPacker:
    """Layout of the per-instance label statistics the label holder encrypts.

    Classification: one weight per class (the bootstrap count, times the row's
    weight when ``weights``, from :func:`~fedgrove.engine.forest.forest_weights`,
    are given); regression: (w, w*y, w*y^2) on the engine's fixed-point grid
    (:func:`~fedgrove.engine.forest.regression_grid`), so decrypted sums equal
    the engine's float sums exactly.  No sum exceeds a bootstrap's total weight:
    the number of instances drawn among, times the heaviest weight.
    """
    if weights is None:
        count_bits, frac = max(1, int(len(y)).bit_length()), 0
    else:  # the weights' own fixed point: whole weights (all 1, say) pack as counts do
        top = float(np.count_nonzero(weights)) * float(weights.max())
        count_bits, frac = max(1, int(np.floor(top)).bit_length()), weight_fraction_bits(weights)
    if task == "classification":
        return VectorPacker((frac,) * n_classes, (count_bits,) * n_classes, (False,) * n_classes)
    q1, q2 = regression_grid(y, weights)
    return VectorPacker((frac, q1, q2), (count_bits, 53 - q1, 53 - q2), (False, True, False))


class ForestClient:
    """Run one client of Federated Forest on a Channel.

    Parameters
    ----------
    channel : this client's Channel
    X : the client's features, rows aligned with every other client's
    master : name of the master
    y : the labels (label holder only)
    he : the label holder's key pair (encrypted mode, label holder only)
    ids : instance IDs (checked against the other clients' by digest)
    sample_weight : the label holder's row weights (finite, non-negative): as the engine's forest weighs them
        (:func:`~fedgrove.engine.forest.train_forest`), in the label statistics and the holder's own cut points;
        the bootstraps draw among the instances of positive weight, which the master and every client learn
    """

    def __init__(self, channel, X, master: str, y=None, he: HEContext | None = None, max_bins: int = 255,
                 seed: int = 0, bin_mapper: BinMapper | None = None, ids=None, n_classes: int | None = None,
                 sample_weight=None):
        self.ch, self.master = channel, master
        self.n_classes = n_classes  # the label holder's class count when known (named classes); else from y
        names = names_of(X)
        if sample_weight is not None:
            if y is None:
                raise InvalidParameterError(f"{channel.party}: row weights belong with the labels, and this client "
                                            f"holds none: give them to the label holder")
            check_row_labels({"X": X, "y": y, "sample_weight": sample_weight})
        self.X = as_numbers(X, f"{channel.party}'s X", TEXT_FEATURES)
        self.y = None if y is None else as_numbers(y, "y", "class codes 0..K-1, or a regression target")
        if self.y is not None and len(self.y) != len(self.X):
            raise DataError(f"{channel.party}: {len(self.y)} labels for {len(self.X)} rows")
        # the rows' weights as the forest grows with them (0: left out of every bootstrap); None: 1 each
        self.row_weights = None if sample_weight is None else forest_weights(
            check_sample_weight(sample_weight, len(self.X), of=f"{channel.party}'s X"))
        self.he = he
        self.ids = instance_ids(ids, len(self.X), channel.party)
        if bin_mapper is None:  # the holder's own cut points, as the engine's: its rows of positive weight, weighted
            rows = self._weighed()
            bin_mapper = BinMapper(max_bins, seed=seed).fit(
                self.X[rows], None if self.row_weights is None else self.row_weights[rows])
        self.bin_mapper = bin_mapper
        self.X_binned = self.bin_mapper.transform(self.X)
        self.model = PassiveModel(channel.party, self.bin_mapper, feature_names=names)

    # -- setup ---------------------------------------------------------------------------
    def _setup(self) -> None:
        ch = self.ch
        n_classes = 0
        if self.y is not None:
            # (the master decides the task: the warning of labels that look like a quantity waits for it)
            n_classes = classes_from_labels(self.y, warn=False) if np.all(self.y == np.round(self.y)) else 0
            if self.n_classes is not None and n_classes:  # a class the holder's rows lack still has its output
                n_classes = max(n_classes, self.n_classes)
        w = self.row_weights
        drawn = b"" if w is None or np.all(w > 0) else m.pack_mask(w > 0)
        ch.send(self.master, "hello", m.ClientHello(self.X.shape[1], len(self.X), m.ids_digest(self.ids),
                                                    self.y is not None, n_classes, w is not None, drawn))
        setup = ch.recv(self.master, "setup", m.ForestSetup)
        if setup.mode not in m.MODES or setup.task not in ("classification", "regression") \
                or setup.criterion not in CRITERIA or ch.party not in (setup.clients or []):
            raise ProtocolError(f"{ch.party}: malformed setup from {self.master}")
        self.setup = setup
        self.holder = setup.label_holder
        self.is_holder = ch.party == self.holder
        others = [c for c in setup.clients if c != ch.party]
        if self.is_holder and self.y is None:
            raise ProtocolError(f"{ch.party}: named label holder but holds no labels")
        if setup.task == "classification" and self.y is not None and \
                (np.any(self.y != np.round(self.y)) or np.any(self.y < 0) or np.any(self.y >= setup.n_classes)):
            raise DataError(f"{ch.party}: classification labels must be integers 0..{setup.n_classes - 1}")
        if setup.task == "classification" and self.y is not None:
            classes_from_labels(self.y)  # warns of labels that look like a quantity
        self.n_stats = setup.n_classes if setup.task == "classification" else 3
        self.offset = 0.0
        if setup.task == "regression" and self.is_holder:  # centred as the engine centres them (label_offset)
            self.offset = label_offset(self.y[self._weighed()])
            self.y = self.y - self.offset
        self.remotes: dict[str, np.ndarray] = {}  # encrypted mode, label holder: n_value_bins per client
        if setup.mode == "shared":
            if self.is_holder:
                w = np.zeros(0) if self.row_weights is None else self.row_weights
                ch.broadcast("labels", m.SharedLabels(self.y, w), others)
            else:
                shared = ch.recv(self.holder, "labels", m.SharedLabels)
                self.y = shared.y
                if self.y.shape != (len(self.X),):
                    raise ProtocolError(f"{ch.party}: {len(self.y)} shared labels for {len(self.X)} rows")
                if shared.w.size:
                    w = shared.w
                    if w.shape != (len(self.X),) or not np.all(np.isfinite(w)) or np.any(w < 0) or not w.any():
                        raise ProtocolError(f"{ch.party}: the row weights shared by {self.holder} are malformed")
                    self.row_weights = w
            self.scorer = True
        elif self.is_holder:
            if self.he is None or not self.he.has_secret:
                raise ProtocolError(f"{ch.party}: the label holder needs its key pair in encrypted mode")
            for c in others:
                layout = ch.recv(c, "layout", m.FeatureLayout)
                if layout.n_value_bins.ndim != 1 or np.any(layout.n_value_bins < 1) \
                        or np.any(layout.n_value_bins > 255):
                    raise ProtocolError(f"feature layout from {c} is invalid")
                self.remotes[c] = layout.n_value_bins.astype(np.int64)
            self.packer = label_packer(setup.task, self.y, setup.n_classes, self.row_weights)
            if self.packer.slot_bits > self.he.plaintext_bits - 1:  # the key cannot carry one instance's statistics
                scheme, room = self.he.scheme.upper(), self.he.plaintext_bits - 1
                raise InvalidParameterError(
                    f"{ch.party}: {setup.n_classes} classes need {self.packer.slot_bits}-bit plaintexts to encrypt "
                    + ("each instance's class counts" if self.row_weights is None else
                       f"each instance's weighted class counts ({self.packer.frac_bits[0]} bits below the binary "
                       f"point each, for the row weights)") + f"; the {scheme} key gives {room}: "
                    + ("if the label is a quantity, set [params] task = \"regression\"; else " if setup.n_classes > 2
                       else "") + "use Paillier ([he] scheme = \"paillier\") or [forest] label_mode = \"shared\"")
            key = m.LabelKey(self.he.public_bytes(), list(self.packer.frac_bits), list(self.packer.int_bits),
                             [int(s) for s in self.packer.signed])
            ch.broadcast("key", key, others)
            self.scorer = True
        else:
            ch.send(self.holder, "layout", m.FeatureLayout(self.bin_mapper.n_value_bins.astype(np.int32),
                                                           len(self.X), m.ids_digest(self.ids)))
            key = ch.recv(self.holder, "key", m.LabelKey)
            # a field holds frac + int (+ sign) bits: at most 256, and a scale 2^frac that is a float (labels spread
            # over little have more fractional bits than the field's width, and negative integer bits; spread over
            # much, negative fractional bits)
            if not (len(key.frac_bits) == len(key.int_bits) == len(key.signed) == self.n_stats) \
                    or not all(-1000 <= f <= 1000 and 0 < f + b <= 256
                               for f, b in zip(key.frac_bits, key.int_bits)):
                raise ProtocolError(f"{ch.party}: label statistics layout from {self.holder} is malformed")
            self.he = public_context(key.key)
            self.packer = VectorPacker(tuple(key.frac_bits), tuple(key.int_bits), tuple(bool(s) for s in key.signed))
            self.scorer = False
        # regression statistics lie on the engine's grid, computed from the labels (and weights) as the engine does
        self.grid = None
        if self.y is not None and setup.task == "regression":
            self.grid = regression_grid(self.y, self.row_weights)

    def _weighed(self):
        """The rows the bootstraps draw among: those of positive weight."""
        return slice(None) if self.row_weights is None else self.row_weights > 0

    # -- training --------------------------------------------------------------------------
    def fit(self, checkpoint=None, resume: bool = False) -> PassiveModel:
        """Train; with a ``checkpoint`` store, save after every tree and (``resume``) continue from it."""
        self._setup()
        for _, first in follow_trees(self, self.master, m.TreeStart, "the start", checkpoint, resume):
            _TreeState(self, first).run()
        return self.model

    # -- prediction ------------------------------------------------------------------------
    def predict(self, X_test, test_ids=None) -> None:
        """Answer the master's prediction requests until it is done (one-round and classical alike)."""
        answer_predictions(self.ch, self.master, self.model, X_test, test_ids)


def answer_predictions(ch, master: str, model: PassiveModel, X_test, test_ids=None,
                       wants_scores: bool = False) -> np.ndarray | None:
    """A client's side of prediction, from its partial trees alone (e.g. loaded from its model file).  The
    label holder holding the test labels sets ``wants_scores`` and gets the forest's output on its test rows
    (class probabilities, or one column of values) to score them; otherwise returns None."""
    X_test = model.rows(X_test)
    n = len(X_test)
    ids = np.zeros(0, dtype=np.int64) if test_ids is None else np.asarray(test_ids, dtype=np.int64)
    ch.send(master, "predict", m.TestHello(n, ids, bool(wants_scores)))
    while True:
        msg = ch.recv(master, "predict")
        if isinstance(msg, m.PredictDone):
            if not wants_scores:
                return None
            out = ch.recv(master, "predict", m.TestPredictions).values
            if out.shape[0] != n or out.shape[1] < 1 or not np.all(np.isfinite(out)):
                raise ProtocolError(f"{ch.party}: test predictions from {master} have shape {out.shape} for {n} "
                                    f"test rows")
            return out
        if isinstance(msg, m.LeafSetsRequest):
            if msg.n_samples != n or not 0 <= msg.start <= msg.stop <= n or msg.n_trees < 0:
                raise ProtocolError(f"{ch.party}: asked about test instances {msg.start}:{msg.stop} of "
                                    f"{msg.n_samples}, holds {n}")
            size = leaf_sets_bytes(model, msg.n_trees, msg.stop - msg.start)
            if size > max(MAX_PREDICT_BYTES, msg.n_trees + len(model.children)):
                raise ProtocolError(f"{ch.party}: asked for the leaf sets of {msg.n_trees} trees over test "
                                    f"instances {msg.start}:{msg.stop}, {size} bytes, more than one answer may "
                                    f"hold ({MAX_PREDICT_BYTES})")
            trees, leaves, masks = leaf_sets(model, X_test[msg.start:msg.stop], msg.n_trees)
            ch.send(master, "predict", m.LeafSets(trees, leaves, m.pack_masks(masks)))
        elif isinstance(msg, m.RouteQuery):
            out = []
            for node, bits in zip(msg.nodes, msg.masks):
                split = model.splits.get((msg.tree, node))
                if split is None:
                    raise ProtocolError(f"{ch.party}: route query for node {node} of tree {msg.tree}, which this "
                                        f"client did not split")
                f, _b, ml, thr = split
                x = X_test[m.unpack_mask(bits, n), f]
                out.append(m.pack_mask(np.where(np.isnan(x), bool(ml), x <= thr)))
            ch.send(master, "predict", m.RouteBits(out))
        else:
            raise ProtocolError(f"{ch.party}: unexpected {type(msg).__name__} during prediction")


def leaf_sets_bytes(model: PassiveModel, n_trees: int, width: int) -> int:
    """The bytes of the packed masks that :func:`leaf_sets` returns for the first ``n_trees`` trees over
    ``width`` test instances: a client knows every tree's structure, so a tree has one leaf more than its
    split nodes (a tree it knows no split of, one leaf)."""
    n_splits = sum(1 for t, _node in model.children if t < n_trees)
    return (n_trees + n_splits) * ((width + 7) // 8)


def leaf_sets(model: PassiveModel, X_test: np.ndarray, n_trees: int):
    """Per tree and leaf of the partial trees, which test instances can reach the leaf (Algorithm 3 of the
    paper): at a split this client owns an instance follows its threshold, at any other split it goes both
    ways.  Returns (tree ids, leaf ids, boolean masks) with leaves in increasing id order per tree."""
    n = len(X_test)
    trees, leaves, masks = [], [], []
    by_tree: dict[int, dict] = {}
    for (t, node), kids in model.children.items():
        by_tree.setdefault(t, {})[node] = kids
    for t in range(n_trees):
        kids = by_tree.get(t, {})
        # the directions of this client's splits of the tree, all at once: (splits, instances)
        own = [(node, *model.splits[(t, node)]) for node in kids if (t, node) in model.splits]
        if own:
            col = np.asarray([f for _, f, _, _, _ in own], dtype=np.int64)
            thr = np.asarray([x for _, _, _, _, x in own], dtype=np.float64)
            ml = np.asarray([bool(x) for _, _, _, x, _ in own])
            x = X_test[:, col].T
            go = np.where(np.isnan(x), ml[:, None], x <= thr[:, None])
        row_of = {node: r for r, (node, *_) in enumerate(own)}
        reach = {0: np.ones(n, dtype=bool)}
        found = {}
        stack = [0]
        while stack:
            node = stack.pop()
            here = reach.pop(node)
            if node not in kids:
                found[node] = here
                continue
            left, right = kids[node]
            r = row_of.get(node)
            if r is None:
                reach[left], reach[right] = here, here
            else:
                reach[left], reach[right] = here & go[r], here & ~go[r]
            stack += [right, left]
        for node in sorted(found):
            trees.append(t)
            leaves.append(node)
            masks.append(found[node])
    return trees, leaves, masks


class _TreeState:
    """One client's work on one tree: node membership of the in-bag instances, histograms, pending splits."""

    def __init__(self, client: ForestClient, start: m.TreeStart):
        self.c = client
        ch = client.ch
        n, n_features = client.X_binned.shape
        weights = start.weights.astype(np.float64)
        feats = list(start.features or [])
        if weights.shape != (n,) or any(not 0 <= f < n_features for f in feats) or len(set(feats)) != len(feats):
            raise ProtocolError(f"{ch.party}: tree start from {client.master} does not fit this client's data")
        if client.row_weights is not None:  # the draws times the rows' weights, as the engine's
            if np.any(weights[client.row_weights == 0] > 0):
                raise ProtocolError(f"{ch.party}: tree start from {client.master} draws instances of weight 0")
            weights = weights * client.row_weights
        self.tree = start.tree
        self.inbag = np.nonzero(weights > 0)[0]
        self.weights = weights[self.inbag]
        self.features = np.asarray(sorted(feats), dtype=np.int64)
        X_in = np.ascontiguousarray(client.X_binned[self.inbag])
        setup = client.setup
        self.cart = CARTScorer(setup.criterion, float(weights.sum()), setup.min_samples_leaf)
        stats = (forest_stats(setup.task, client.y[self.inbag], self.weights, setup.n_classes, client.grid)
                 if client.y is not None else np.zeros((len(self.inbag), 1)))
        bm = client.bin_mapper
        thresholds = bm.thresholds()
        self.local = HistogramSplitFinder(X_in, bm.feature_offsets, bm.missing_codes, thresholds, stats, self.cart,
                                          features=self.features, sparse=False)  # X_in: this tree's rows only
        self.X_in = X_in
        self.plan = None
        if client.scorer:
            plan = ch.recv(client.master, m.CONTROL, m.ScoringPlan)
            self._read_plan(plan)
        if setup.mode == "encrypted":
            if client.is_holder:
                packed = client.packer.encode(stats)
                ct = client.he.encrypt(packed)
                msg = m.EncryptedLabelStats(self.tree, client.he.serialize(ct), len(self.inbag))
                client.ch.broadcast(m.PEER, msg, [c for c in setup.clients if c != ch.party])
            else:
                msg = ch.recv(client.holder, m.PEER, m.EncryptedLabelStats)
                self.ct = client.he.deserialize(msg.ciphertexts) if msg.n else None
                if msg.tree != self.tree or msg.n != len(self.inbag) or (msg.n and self.ct.size != msg.n):
                    raise ProtocolError(f"{ch.party}: label statistics from {client.holder} do not match tree "
                                        f"{self.tree}'s {len(self.inbag)} in-bag instances")
        if client.is_holder:
            ch.send(client.master, m.REPLY, m.RootStats(self.local.root_stats(), client.offset))
        self.prev_hist = None
        self.pending = None

    def _read_plan(self, plan: m.ScoringPlan) -> None:
        """Where each scored feature's bins lie in the combined histogram, and who owns it."""
        c = self.c
        clients = list(plan.clients or [])
        off = plan.offsets
        if len(off) != len(clients) + 1 or off[0] != 0 or off[-1] != len(plan.features) or np.any(np.diff(off) < 0):
            raise ProtocolError(f"{c.ch.party}: malformed scoring plan from {c.master}")
        self.scored = []  # per scored client: (name, local features, _Remote over those features or None)
        owner, local_f, n_bins = [], [], []
        for k, name in enumerate(clients):
            feats = plan.features[off[k]:off[k + 1]].astype(np.int64)
            if name == c.ch.party:
                nvb = c.bin_mapper.n_value_bins
                if not np.array_equal(feats, self.features):
                    raise ProtocolError(f"{c.ch.party}: the scoring plan lists other features than this tree's draw")
                remote = None
            elif name in c.remotes:
                nvb = c.remotes[name]
                remote = None
            else:
                raise ProtocolError(f"{c.ch.party}: asked to score features of {name!r}, which it cannot")
            if np.any(feats < 0) or np.any(feats >= len(nvb)):
                raise ProtocolError(f"{c.ch.party}: scoring plan names features {name} does not have")
            if name != c.ch.party:
                remote = _Remote(name, nvb[feats], 0, 0)
            self.scored.append((name, feats, remote))
            owner += [name] * len(feats)
            local_f += feats.tolist()
            n_bins += (nvb[feats] + 1).tolist()
        self.owner = owner
        self.local_feature = local_f
        self.offsets = np.concatenate([[0], np.cumsum(n_bins)]).astype(np.int32)

    # -- the layer loop --------------------------------------------------------------------
    def run(self) -> None:
        ch, master = self.c.ch, self.c.master
        while True:
            msg = ch.recv(master, m.CONTROL)
            if isinstance(msg, m.TreeEnd):
                return
            if isinstance(msg, m.LayerRequest):
                self._layer(msg)
            elif isinstance(msg, m.SplitDecisions):
                self._decide(msg)
            elif isinstance(msg, m.SplitOwners):
                orders = ch.recv(self.c.holder, m.PEER, m.SplitQuery)
                if list(orders.nodes or []) != list(msg.nodes or []):
                    raise ProtocolError(f"{ch.party}: split orders from {self.c.holder} do not match the "
                                        f"master's list of nodes")
                masks = self._split_own(orders.nodes, orders.features, orders.bins, orders.missing_left)
                ch.send(master, m.REPLY, m.SplitMasks(masks))
            elif isinstance(msg, m.LayerPartition):
                self._partition(msg)
            else:
                raise ProtocolError(f"{ch.party}: unexpected {type(msg).__name__} during tree {self.tree}")

    def _layer_of(self, msg) -> Layer:
        nodes = np.asarray(msg.nodes or [], dtype=np.int64)
        for nd in nodes.tolist():
            if nd not in self.local.segments:
                raise ProtocolError(f"{self.c.ch.party}: layer request for unknown node {nd}")
        return Layer(nodes, np.zeros((len(nodes), 1)), msg.layer)

    def _layer(self, msg: m.LayerRequest) -> None:
        c = self.c
        layer = self._layer_of(msg)
        if not c.scorer:  # encrypted mode: build the label holder's histograms of the nodes it will not subtract
            build, _, _, _ = self.local.plan_layer(layer, have_parents=True)
            nodes = [int(layer.node_ids[r]) for r in sorted(build)]
            rows = {nd: np.asarray(self.local.node_samples(nd)) for nd in nodes}
            offsets = c.bin_mapper.feature_offsets
            sel_offsets = np.concatenate([[0], np.cumsum(offsets[self.features + 1] - offsets[self.features])])
            X_sel = self.X_in[:, self.features] if len(self.features) else np.zeros((len(self.X_in), 0), np.uint8)
            if self.ct is None:
                raise ProtocolError(f"{c.ch.party}: histogram request for a tree without in-bag instances")
            reply = encrypted_histograms(c.ch.party, nodes, rows, X_sel, sel_offsets, self.ct, c.he, c.packer)
            c.ch.send(c.holder, m.PEER, reply)
            return
        n_nodes = len(layer)
        if msg.stats.shape != (n_nodes, self.c.n_stats):
            raise ProtocolError(f"{c.ch.party}: layer request carries statistics of shape {msg.stats.shape}")
        layer.stats = np.ascontiguousarray(msg.stats)
        n_scored = len(self.owner)
        allowed = msg.allowed if msg.allowed.size else np.ones((n_nodes, n_scored), dtype=bool)
        if allowed.shape != (n_nodes, n_scored):
            raise ProtocolError(f"{c.ch.party}: layer request's feature mask has shape {allowed.shape}")
        hist = self._combined_histograms(layer)
        pg, pb, pm, pl = cart_pair_splits(hist, np.arange(n_nodes, dtype=np.int64), layer.stats, self.offsets,
                                          np.ascontiguousarray(allowed), CRITERIA[self.cart.criterion],
                                          self.cart.root_weight, self.cart.min_samples_leaf)
        ok = np.nonzero(pg > -np.inf)[0]
        if len(ok):  # where a node had no missing values of a feature, they go to the larger child
            j, f = ok // n_scored, ok % n_scored
            miss = hist[j, self.offsets[f + 1] - 1, :]
            no_missing, left = absent_missing_left(miss, pl[ok], layer.stats[j], self.cart)
            pm[ok[no_missing]] = left[no_missing]
        self.pending = (layer, pb.reshape(n_nodes, n_scored), pm.reshape(n_nodes, n_scored),
                        pl.reshape(n_nodes, n_scored, self.c.n_stats))
        c.ch.send(c.master, m.REPLY, m.FeatureGains(pg.reshape(n_nodes, n_scored), pm.reshape(n_nodes, n_scored)))

    def _combined_histograms(self, layer: Layer) -> np.ndarray:
        """Histograms of every scored feature for the layer's nodes: own features from plaintext, other
        clients' from their encrypted replies (the larger sibling by subtraction from the parent)."""
        c = self.c
        n_nodes = len(layer)
        hist = np.zeros((n_nodes, int(self.offsets[-1]), self.c.n_stats))
        own = self.local.layer_histograms(layer, self.features)
        build, pairs = self.local.last_build_rows, self.local.last_pairs
        col = 0
        bm_off = c.bin_mapper.feature_offsets
        remote_cols = np.zeros(int(self.offsets[-1]), dtype=bool)
        for name, feats, remote in self.scored:
            if remote is None:
                for f in feats.tolist():
                    nb = int(bm_off[f + 1] - bm_off[f])
                    hist[:, col:col + nb] = own[:, bm_off[f]:bm_off[f + 1]]
                    col += nb
                continue
            reply = c.ch.recv(name, m.PEER, m.EncryptedHistograms)
            part = decode_histograms(reply, remote, layer.stats[build], c.he, c.packer,
                                     f"histograms from {name} (tree {self.tree}, layer {layer.depth})")
            hist[build, col:col + remote.n_bins] = part
            remote_cols[col:col + remote.n_bins] = True
            col += remote.n_bins
        if pairs and remote_cols.any():
            for parent_row, small, large in pairs:
                hist[large, remote_cols] = self.prev_hist[parent_row, remote_cols] - hist[small, remote_cols]
        self.prev_hist = hist
        return hist

    def _decide(self, msg: m.SplitDecisions) -> None:
        """The master chose features this client scored: report the children's statistics, order the owners
        to split (their own splits at once), then send the partitions of its own."""
        c = self.c
        if self.pending is None:
            raise ProtocolError(f"{c.ch.party}: split decisions without a scored layer")
        layer, pb, pm, pl = self.pending
        row_of = {int(nd): r for r, nd in enumerate(layer.node_ids)}
        nodes, positions = list(msg.nodes or []), list(msg.positions or [])
        if len(nodes) != len(positions) or any(nd not in row_of for nd in nodes) \
                or any(not 0 <= p < len(self.owner) for p in positions):
            raise ProtocolError(f"{c.ch.party}: split decisions from {c.master} do not match the scored layer")
        left = np.array([pl[row_of[nd], p] for nd, p in zip(nodes, positions)]).reshape(len(nodes), c.n_stats)
        c.ch.send(c.master, m.REPLY, m.ChildStats(left))
        orders: dict[str, list] = {}
        for nd, p in zip(nodes, positions):
            r = row_of[nd]
            orders.setdefault(self.owner[p], []).append((nd, self.local_feature[p], int(pb[r, p]), int(pm[r, p])))
        mine = orders.pop(c.ch.party, [])
        for owner, items in orders.items():
            c.ch.send(owner, m.PEER, m.SplitQuery(layer.depth, *[list(v) for v in zip(*items)]))
        if mine:
            masks = self._split_own(*[list(v) for v in zip(*mine)])
            c.ch.send(c.master, m.REPLY, m.SplitMasks(masks))

    def _split_own(self, nodes, features, bins, missing_left) -> list[bytes]:
        """Partition nodes split on this client's features; keep the thresholds (only here)."""
        c = self.c
        bm = c.bin_mapper
        masks = []
        for nd, f, b, ml in zip(nodes, features, bins, missing_left):
            if nd not in self.local.segments or not 0 <= f < self.X_in.shape[1] or not 0 <= b < bm.n_value_bins[f]:
                raise ProtocolError(f"{c.ch.party}: split of node {nd} on feature {f}, bin {b} is invalid")
            mask = self.local.left_mask(nd, f, b, bool(ml))
            c.model.splits[(self.tree, int(nd))] = (int(f), int(b), bool(ml), bm.threshold(f, b))
            masks.append(m.pack_mask(mask))
        return masks

    def _partition(self, msg: m.LayerPartition) -> None:
        nodes = list(msg.nodes or [])
        where = f"{self.c.ch.party}: partition of tree {self.tree} from {self.c.master}"
        # children that were nodes already (a split's child naming its grandparent) made the tree a cycle, which
        # prediction's walk down it followed without end, its memory growing until the machine had none
        check_split_lists(where, self.local.segments, nodes=nodes, left=msg.left, right=msg.right, masks=msg.masks)
        done = [nd for nd in nodes if (self.tree, int(nd)) in self.c.model.children]
        if done:
            raise ProtocolError(f"{where}: nodes {done} are split already")
        masks = []
        for nd, bits in zip(nodes, msg.masks):
            if nd not in self.local.segments:
                raise ProtocolError(f"{self.c.ch.party}: partition of unknown node {nd}")
            masks.append(m.unpack_mask(bits, len(self.local.node_samples(nd))))
        ids = np.asarray(nodes, dtype=np.int64)
        child_ids = np.column_stack([np.asarray(msg.left, dtype=np.int64), np.asarray(msg.right, dtype=np.int64)])
        layer = Layer(ids, np.zeros((len(ids), 1)), msg.layer)
        self.local.apply_splits(layer, np.arange(len(ids)), LayerSplits.empty(len(ids), 1), child_ids, masks=masks)
        for nd, (lc, rc) in zip(nodes, child_ids.tolist()):
            self.c.model.children[(self.tree, int(nd))] = (int(lc), int(rc))
