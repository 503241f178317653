"""Messages of Federated Forest (stages in order).

Roles: a *master* (coordinator, no data), *clients* holding disjoint feature
sets of the same aligned instances, one of which (the *label holder*) holds
the labels.  A *scorer* turns label statistics into split gains: in the
default encrypted mode the label holder scores every client's features from
their encrypted histograms; in shared-label mode (the paper's trusted setting,
opt-in) every client holds the labels and scores its own features.

Setup:      client -> master  ClientHello (the holder's: the instances of positive weight, if some weigh 0)
            master -> client  ForestSetup
            encrypted: client -> holder  FeatureLayout;  holder -> client  LabelKey
            shared:    holder -> client  SharedLabels
            master -> client  Start (0, or the tree every party checkpointed)
Per tree:   master -> client  TreeStart (bootstrap weights, the client's drawn features)
            master -> scorer  ScoringPlan (which clients' features it scores, in order)
            encrypted: holder -> client  EncryptedLabelStats (in-bag instances, once per tree)
            holder -> master  RootStats
Per layer:  master -> client  LayerRequest
            encrypted: client -> holder  EncryptedHistograms (built nodes only)
            scorer -> master  FeatureGains (per node and scored feature)
  splits:   master -> scorer  SplitDecisions;   master -> other owner  SplitOwners
            scorer -> master  ChildStats;       scorer -> other owner  SplitQuery (feature, bin)
            owner -> master   SplitMasks;       master -> client  LayerPartition
            master -> client  TreeEnd
End:        master -> client  TrainingDone
Prediction: client -> master  TestHello (how many test instances, their IDs)
            one round:  master -> client  LeafSetsRequest;  client -> master  LeafSets
            classical:  master -> owner   RouteQuery;       owner -> master   RouteBits  (per tree and depth)
                        master -> client  PredictDone

Master-to-client messages travel in order on ``tree=t/ctl``; replies to the
master on ``tree=t/reply``; label holder <-> client traffic on ``tree=t/peer``.
"""

from __future__ import annotations

import numpy as np

from fedgrove.protocols.vertical.messages import (EncryptedHistograms, FeatureLayout, LayerPartition,  # noqa: F401
                                                  SplitMasks, SplitQuery, Start, TrainingDone, TreeEnd, ids_digest,
                                                  pack_mask, pack_masks, unpack_mask, unpack_masks)
from fedgrove.transport.codec import Message, array_field, register

CONTROL = "ctl"
REPLY = "reply"
PEER = "peer"
MODES = ("encrypted", "shared")


@register
class ClientHello(Message):
    """A client's shape: features, instances (and a digest of their IDs), whether it holds the labels
    and, if so, the number of classes (0 for regression), whether it weighs its rows and, when some weigh 0,
    which instances the bootstraps draw among (a packed mask of those of positive weight; empty: all)."""

    n_features: int = 0
    n_samples: int = 0
    ids_digest: bytes = b""
    has_labels: bool = False
    n_classes: int = 0
    weighted: bool = False
    drawn: bytes = b""


@register
class ForestSetup(Message):
    """The label mode, who holds the labels, the clients in feature order, and the task."""

    mode: str = "encrypted"
    label_holder: str = ""
    clients: list[str] = None
    task: str = "classification"
    criterion: str = "gini"
    n_classes: int = 0
    min_samples_leaf: float = 1.0


@register
class LabelKey(Message):
    """The label holder's public key and the fixed-point layout of the per-instance label statistics."""

    key: bytes = b""
    frac_bits: list[int] = None
    int_bits: list[int] = None
    signed: list[int] = None


@register
class SharedLabels(Message):
    """Shared-label mode only: the labels in plaintext, in instance order, and the rows' weights as the
    forest grows with them (:func:`~fedgrove.engine.forest.forest_weights`; empty: every row weighs 1)."""

    y: np.ndarray = array_field("<f8", 1)
    w: np.ndarray = array_field("<f8", 1)


@register
class TreeStart(Message):
    """Bootstrap multiplicity of every instance and the client's own features drawn for this tree."""

    tree: int = 0
    weights: np.ndarray = array_field("<u4", 1)
    features: list[int] = None


@register
class ScoringPlan(Message):
    """The features a scorer scores this tree: those of ``clients[k]`` are ``features[offsets[k]:offsets[k+1]]``
    (local indices), in this order (the order of the master's feature index)."""

    clients: list[str] = None
    offsets: np.ndarray = array_field("<i8", 1)
    features: np.ndarray = array_field("<i4", 1)


@register
class EncryptedLabelStats(Message):
    """Packed Enc(weighted label statistics) of the tree's in-bag instances, in instance order."""

    tree: int = 0
    ciphertexts: bytes = b""
    n: int = 0


@register
class RootStats(Message):
    stats: np.ndarray = array_field("<f8", 1)
    offset: float = 0.0  # regression: the constant the labels are centred by, added back to the tree's values


@register
class LayerRequest(Message):
    """The open nodes of a layer; to scorers also their statistics and which scored features each node may
    use (empty: all)."""

    layer: int = 0
    nodes: list[int] = None
    stats: np.ndarray = array_field("<f8", 2)
    allowed: np.ndarray = array_field("|b1", 2)


@register
class FeatureGains(Message):
    """Best impurity decrease of every (node, scored feature) pair (-inf: none) and where its missing values
    go; the bin stays with the scorer."""

    gains: np.ndarray = array_field("<f8", 2)
    missing_left: np.ndarray = array_field("|b1", 2)


@register
class SplitDecisions(Message):
    """The nodes split on a feature this scorer scored: position of that feature in its plan."""

    layer: int = 0
    nodes: list[int] = None
    positions: list[int] = None


@register
class SplitOwners(Message):
    """Nodes split on this client's features (encrypted mode): their bins come from the label holder."""

    layer: int = 0
    nodes: list[int] = None


@register
class ChildStats(Message):
    """Statistics of the left child of each decided split, in the order of the decisions."""

    left: np.ndarray = array_field("<f8", 2)


@register
class TestHello(Message):
    """A client's test set: its size and instance IDs (empty when its file has none), which must agree;
    the label holder sets ``wants_scores`` when it holds the test labels, to be sent the predictions."""

    n_samples: int = 0
    ids: np.ndarray = array_field("<i8", 1)
    wants_scores: bool = False


@register
class LeafSetsRequest(Message):
    """One-round prediction of test instances ``start:stop`` (of ``n_samples``) by the first ``n_trees`` trees."""

    n_samples: int = 0
    n_trees: int = 0
    start: int = 0
    stop: int = 0


@register
class LeafSets(Message):
    """One-round prediction: per tree and leaf, the test instances that can reach it on this client's partial
    tree (packed bits; both ways at splits it does not own)."""

    trees: list[int] = None
    leaves: list[int] = None
    masks: list[bytes] = None


@register
class RouteQuery(Message):
    """Classical prediction: the test instances at each listed node (packed bits over all test instances)."""

    tree: int = 0
    nodes: list[int] = None
    masks: list[bytes] = None


@register
class RouteBits(Message):
    """Go-left bits of the queried instances at each node (in instance order)."""

    masks: list[bytes] = None


@register
class PredictDone(Message):
    n_queries: int = 0


@register
class TestPredictions(Message):
    """To the label holder that asked: the forest's output on the test instances (class probabilities, or
    one column of values), for it to score against its test labels."""

    values: np.ndarray = array_field("<f8", 2)
