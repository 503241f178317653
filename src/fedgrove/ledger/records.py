"""What the FGBDT-Chain ledger records: one message type per record kind (codec-encoded bodies).

In order of appearance: the model request (by the requester), one membership
per party (self-signed: name and Ed25519 key), the common cut points (by the
requester), one PSD upload per party; then
per tree and layer every party's votes, every party's histogram upload (the
original histograms of the candidate features of every open node), every
party's endorsement of every other party's upload (per node: the overlap
distance and whether it signs); at the end of each tree the requester's
chosen splits and contribution allocations per layer.  Each record is signed
by its author; the chain links every record to the one before.
"""

from __future__ import annotations

import numpy as np

from fedgrove.transport.codec import Message, array_field, register

#: the most parties a ledger can name: split records hold sets of parties as bit masks in one signed 64-bit word
MAX_PARTIES = 63


@register
class ModelRequest(Message):
    """The task: parameters, the parties, the published feature (and label) ranges, the requester's key."""

    task: str = "fvtree"
    params_json: str = "{}"
    options_json: str = "{}"
    parties: list[str] = None
    requester_key: bytes = b""
    lo: np.ndarray = array_field("<f8", 1)   # per feature, then the label
    hi: np.ndarray = array_field("<f8", 1)


@register
class Membership(Message):
    party: str = ""
    key: bytes = b""
    n_samples: int = 0


@register
class Binning(Message):
    """The federation's common cut points (merged quantile sketches), by the requester: ``n_bins[f]`` rows per
    feature in every histogram (value bins, then the missing bin)."""

    cuts: np.ndarray = array_field("<f8", 1)
    lengths: np.ndarray = array_field("<i8", 1)
    n_bins: np.ndarray = array_field("<i4", 1)


@register
class PSDUpload(Message):
    """A party's PSD: the feature of every internal node (heap order; ``n_features`` is the label), its cut
    points, and the Laplace-noised count of every leaf."""

    party: str = ""
    depth: int = 0
    features: np.ndarray = array_field("<i4", 1)
    cuts: np.ndarray = array_field("<f8", 1)
    counts: np.ndarray = array_field("<f8", 1)


@register
class VoteRecord(Message):
    """Per open node of a layer, the feature this party votes for (-1: none)."""

    tree: int = 0
    layer: int = 0
    nodes: list[int] = None
    features: np.ndarray = array_field("<i4", 1)


@register
class HistogramUpload(Message):
    """Per open node, (g, h, count) per bin of each candidate feature: rows ``offsets[j]:offsets[j+1]`` are node
    ``j``'s, the candidate features' bins one after another."""

    tree: int = 0
    layer: int = 0
    nodes: list[int] = None
    candidates: np.ndarray = array_field("<i4", 2)   # (n_nodes, k), -1 where a node has fewer candidates
    offsets: np.ndarray = array_field("<i8", 1)
    hist: np.ndarray = array_field("<f8", 2)


@register
class Endorsement(Message):
    """One party's check of another's upload: the overlap distance D between the upload (every node's
    candidate histograms) and this party's estimate of it, and whether it signs (D below the threshold).
    ``digest`` is the SHA-256 of the upload's body."""

    tree: int = 0
    layer: int = 0
    sender: str = ""
    digest: bytes = b""
    distance: float = 0.0
    endorsed: bool = False


@register
class SplitRecord(Message):
    """The splits chosen in a layer: per split node the feature, bin, missing direction and gain, which
    parties voted for that feature and whose histograms were accepted (bit masks over the parties), and why
    any was refused."""

    tree: int = 0
    layer: int = 0
    nodes: list[int] = None
    features: np.ndarray = array_field("<i4", 1)
    bins: np.ndarray = array_field("<i4", 1)
    missing_left: np.ndarray = array_field("|u1", 1)
    gains: np.ndarray = array_field("<f8", 1)
    voters: np.ndarray = array_field("<i8", 1)
    accepted: np.ndarray = array_field("<i8", 1)
    refusals: list[str] = None


@register
class ContributionRecord(Message):
    """Per split node of a layer and per party: the split Shapley value, the voting contribution and the
    standard error of the Shapley estimate (0 when exact)."""

    tree: int = 0
    layer: int = 0
    nodes: list[int] = None
    shapley: np.ndarray = array_field("<f8", 2)
    vote: np.ndarray = array_field("<f8", 2)
    stderr: np.ndarray = array_field("<f8", 2)
    beta: float = 1.0
    method: str = "exact"


KINDS = (ModelRequest, Membership, Binning, PSDUpload, VoteRecord, HistogramUpload, Endorsement, SplitRecord,
         ContributionRecord)
