"""Messages of SimFL (stages in order).  Every party talks to every other; there is no coordinator.

Setup:          Hello (instances, features, ID digest) to every party; CacheStatus (a saved preprocessing that
                matches everyone's Hello can be reused)
Preprocessing:  FeatureRange (per-feature minimum and maximum) to every party;
                HashTable (instance IDs and their L hash values) to every party  -- an all-gather
Base score:     MaskingKey to every party; MaskedStats (label statistics under pairwise masks) to every party
Resume:         Start (the first tree to grow) from the first party, when resuming from checkpoints
Per tree:       AggregatedGradients (per instance of the trainer: the sums of g and h of this party's instances
                similar to it) to the trainer; TreeMessage (the trainer's tree) to every party

Every party holds the whole model at the end.  Messages of tree ``t`` travel
on ``tree=t/...`` tags.
"""

from __future__ import annotations

import numpy as np

from fedgrove.engine.tree import Tree
from fedgrove.protocols import peer_tree
from fedgrove.transport.codec import Message, array_field, register

GRADIENTS = "grad"
TREE = "tree"


@register
class Hello(Message):
    n_samples: int = 0
    n_features: int = 0
    ids_digest: bytes = b""
    features_digest: bytes = b""  # a hash of the feature names in order (empty: no names)


@register
class CacheStatus(Message):
    """Whether this party holds a saved preprocessing result for exactly this federation and its data."""

    ok: bool = False


@register
class FeatureRange(Message):
    """Per-feature minimum and maximum of the party's data (NaN where a feature has no value)."""

    lo: np.ndarray = array_field("<f8", 1)
    hi: np.ndarray = array_field("<f8", 1)


@register
class HashTable(Message):
    """The party's instance IDs and their hash values under each of the L shared LSH functions."""

    ids: np.ndarray = array_field("<i8", 1)
    hashes: np.ndarray = array_field("<i8", 2)


@register
class MaskingKey(Message):
    key: bytes = b""


@register
class MaskedStats(Message):
    """Label statistics (sum of y or class counts, and n) in 128-bit fixed point under pairwise masks."""

    hi: np.ndarray = array_field("<u8", 1)
    lo: np.ndarray = array_field("<u8", 1)


@register
class AggregatedGradients(Message):
    """For each instance of the trainer (its order), per output: the sums of g and of h over this party's
    instances whose similar instance in the trainer's data it is."""

    tree: int = 0
    g: np.ndarray = array_field("<f8", 2)
    h: np.ndarray = array_field("<f8", 2)


@register
class TreeMessage(Message):
    """A finished tree (raw thresholds; the trainer's bins are not shared) and the output it belongs to."""

    tree: int = 0
    output: int = 0
    feature: np.ndarray = array_field("<i4", 1)
    threshold: np.ndarray = array_field("<f8", 1)
    missing_left: np.ndarray = array_field("|u1", 1)
    left: np.ndarray = array_field("<i4", 1)
    right: np.ndarray = array_field("<i4", 1)
    gain: np.ndarray = array_field("<f8", 1)
    count: np.ndarray = array_field("<f8", 1)
    depth: np.ndarray = array_field("<i4", 1)
    owner: np.ndarray = array_field("<i4", 1)
    values: np.ndarray = array_field("<f8", 2)


def shared_tree(tree: Tree, owner: int) -> Tree:
    """The tree as every party keeps it: raw thresholds, owner = the trainer, no bin (the trainer's own)."""
    nodes = tree.nodes.copy()
    internal = nodes["feature"] >= 0
    nodes["bin"] = -1
    nodes["owner"] = np.where(internal, owner, -1)
    return Tree(nodes, tree.values.copy())


def tree_message(t: int, output: int, tree: Tree) -> TreeMessage:
    n = tree.nodes
    return TreeMessage(t, output, n["feature"], n["threshold"], n["missing_left"], n["left"], n["right"], n["gain"],
                       n["count"], n["depth"], n["owner"], tree.values)


def tree_from_message(msg: TreeMessage, n_features: int, where: str) -> Tree:
    """Rebuild a tree, refusing one that does not describe a valid tree over ``n_features`` features (raw
    thresholds: no bins)."""
    cols = {name: getattr(msg, name) for name in ("feature", "threshold", "missing_left", "left", "right", "gain",
                                                   "count", "depth", "owner")}
    return peer_tree({**cols, "bin": np.full(len(msg.feature), -1)}, msg.values, where, n_features)
