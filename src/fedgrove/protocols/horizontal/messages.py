"""Messages of the horizontal protocol (stages in order).

Setup:     client -> aggregator  MaskingKey;   aggregator -> clients  MaskingKeys (relayed)
           client -> aggregator  Sketches;     aggregator -> clients  CutPoints
           client -> aggregator  MaskedVector (label statistics for the base score)
Per layer: aggregator -> clients LayerPlan (last layer's splits + nodes to build)
           client -> aggregator  MaskedVector (histograms of those nodes, and their sizes)
Per tree:  aggregator -> clients TreeBroadcast
           client -> aggregator  SplitSums (only with contributions on: per split, the client's own sums)
End:       aggregator -> clients TrainingDone
"""

from __future__ import annotations

import numpy as np

from fedgrove.transport.codec import Message, array_field, register

CONTROL = "ctl"
UP = "up"


@register
class MaskingKey(Message):
    key: bytes = b""


@register
class MaskingKeys(Message):
    names: list[str] = None
    keys: list[bytes] = None
    session: bytes = b""


@register
class Sketches(Message):
    """Per-feature quantile sketches: values and weights concatenated, with per-feature lengths."""

    values: np.ndarray = array_field("<f8", 1)
    weights: np.ndarray = array_field("<f8", 1)
    lengths: np.ndarray = array_field("<i8", 1)
    features_digest: bytes = b""  # a hash of the feature names in order (empty: no names)


@register
class CutPoints(Message):
    cuts: np.ndarray = array_field("<f8", 1)
    lengths: np.ndarray = array_field("<i8", 1)
    max_bins: int = 255


@register
class MaskedVector(Message):
    """A client's vector plus its pairwise masks, as 128-bit words; alone it looks random."""

    hi: np.ndarray = array_field("<u8", 1)
    lo: np.ndarray = array_field("<u8", 1)


@register
class LayerPlan(Message):
    tree: int = 0
    layer: int = 0
    split_nodes: list[int] = None
    features: list[int] = None
    bins: list[int] = None
    missing_left: list[int] = None
    left: list[int] = None
    right: list[int] = None
    build: list[int] = None
    done: bool = False
    columns: list[int] = None  # the tree's features (colsample_bytree), whose bins alone the histograms hold; []: all


@register
class TreeBroadcast(Message):
    """The finished tree (structured node array as raw fields) and its output column."""

    tree: int = 0
    output: int = 0
    feature: np.ndarray = array_field("<i4", 1)
    bin: np.ndarray = array_field("<i4", 1)
    threshold: np.ndarray = array_field("<f8", 1)
    missing_left: np.ndarray = array_field("|u1", 1)
    left: np.ndarray = array_field("<i4", 1)
    right: np.ndarray = array_field("<i4", 1)
    gain: np.ndarray = array_field("<f8", 1)
    count: np.ndarray = array_field("<f8", 1)
    depth: np.ndarray = array_field("<i4", 1)
    values: np.ndarray = array_field("<f8", 2)


@register
class TrainingDone(Message):
    n_trees: int = 0


@register
class BaseScore(Message):
    values: np.ndarray = array_field("<f8", 1)


@register
class Start(Message):
    """The first tree to grow: 0, or the number of trees every party has checkpointed (resume)."""

    tree: int = 0


@register
class SplitSums(Message):
    """Contribution accounting (opt-in): per internal node of the tree just broadcast, this client's
    (G_left, H_left, G_right, H_right), in the clear, for the split Shapley values."""

    tree: int = 0
    nodes: list[int] = None
    sums: np.ndarray = array_field("<f8", 2)
