"""Messages of HybridTree (stages in order; the vertical protocol's PublicKey,
HistogramRequest, EncryptedHistograms, TreeEnd and TrainingDone are reused).

Setup:     guest -> host  GuestLayout;         host -> guest  PublicKey, HybridSetup, Start (0 or resumed)
Per tree:  host -> guest  NodeGradients (one message: hand-off node and Enc(g, h) of the guest's instances;
                          with subsample, Enc(g, h) of the round's instances only)
Per layer: host -> guest  HistogramRequest (with colsample_bytree: the guest's drawn features, the only ones
                          whose bins it sums);    guest -> host  EncryptedHistograms
           host -> guest  GuestSplits
End tree:  host -> guest  TreeEnd;             guest -> host  LeafAssignment (hessian mode)
                                               guest -> host  EncryptedPredictions (count mode)
Inference: host -> guest  RouteRequest;        guest -> host  RouteAnswer     (two rounds for all trees; the
                                               leaves as ranks below their hand-off nodes)
"""

from __future__ import annotations

import numpy as np

from fedgrove.protocols.vertical.messages import (CONTROL, REPLY, EncryptedHistograms, HistogramRequest,  # noqa: F401
                                                  PublicKey, Start, TrainingDone, TreeEnd)
from fedgrove.transport.codec import Message, array_field, register


@register
class GuestLayout(Message):
    """Bins per guest feature, and the IDs of the host's instances this guest holds (linked IDs)."""

    n_value_bins: np.ndarray = array_field("<i4", 1)
    ids: np.ndarray = array_field("<i8", 1)
    mask_key: bytes = b""  # X25519 public key for secure aggregation among guests (count mode)


@register
class HybridSetup(Message):
    """The leaf mode, and in count mode what guests need to compute encrypted leaf values and mask them:
    the other guests' masking keys and, per other guest, the instance IDs both hold.  With ``subset`` (a host
    that trains with guests holding instances it lacks, as with several hosts), ``kept`` lists the guest's
    instance IDs that take part: those the host holds too."""

    mode: str = "hessian"
    learning_rate: float = 0.0
    reg_lambda: float = 0.0
    scale_bits: int = 0
    peers: list[str] = None
    peer_keys: list[bytes] = None
    shared_ids: np.ndarray = array_field("<i8", 1)
    shared_offsets: np.ndarray = array_field("<i8", 1)  # peer k's IDs: shared_ids[off[k]:off[k + 1]]
    subset: bool = False
    kept: np.ndarray = array_field("<i8", 1)


@register
class NodeGradients(Message):
    """For each of the guest's instances (in its ID order): its hand-off node and packed Enc(g, h); with
    ``sampled`` (``subsample``) Enc(g, h) of only the round's ``rows`` (positions in that order, increasing),
    on which the guest grows its layers; it then routes all its instances."""

    tree: int = 0
    nodes: np.ndarray = array_field("<i4", 1)
    ciphertexts: bytes = b""
    sampled: bool = False
    rows: np.ndarray = array_field("<i8", 1)


@register
class GuestSplits(Message):
    """The host's decisions for the guest's open nodes of one layer."""

    layer: int = 0
    nodes: list[int] = None
    features: list[int] = None
    bins: list[int] = None
    missing_left: list[int] = None
    left: list[int] = None
    right: list[int] = None


@register
class LeafAssignment(Message):
    """The guest-tree leaf each of the guest's instances reached (in its ID order)."""

    leaves: np.ndarray = array_field("<i4", 1)


@register
class EncryptedPredictions(Message):
    """Count mode: Enc(leaf value + mask) per instance (in the guest's ID order), and Enc(leaf value) per leaf.

    Values are fixed point with ``frac_bits + scale_bits`` fractional bits;
    the masks cancel in the sum over the guests holding an instance.
    """

    ciphertexts: bytes = b""
    leaves: list[int] = None
    leaf_ciphertexts: bytes = b""


@register
class RouteRequest(Message):
    """Test instances (IDs) and, per tree, the hand-off node the host's subtree sent each one to: rows
    ``start`` to ``start + len(ids)`` of the host's ``n_samples`` (a large test set goes in consecutive
    chunks of :data:`~fedgrove.protocols.MAX_PREDICT_BYTES` a message, the last ending at ``n_samples``)."""

    ids: np.ndarray = array_field("<i8", 1)
    nodes: np.ndarray = array_field("<i4", 2)
    n_samples: int = 0
    start: int = 0
    ranks: bool = False  # answer each leaf's rank below its hand-off node, not its node (the host knows the order)


@register
class RouteAnswer(Message):
    """Per instance and tree, the guest leaf reached (-1: the guest does not hold the instance): its node, or
    with the request's ``ranks`` its rank among the leaves below the instance's hand-off node, left to right (0
    where the guest grew nothing below it): a few bits each where a node takes eight or more."""

    leaves: np.ndarray = array_field("<i4", 2)
