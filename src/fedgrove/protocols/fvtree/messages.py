"""Messages of FV-tree / FGBDT-Chain (stages in order).  Parties are peers; the first by name is the requester.

Setup:     Hello to every party (sizes, features, Ed25519 key, per-feature and label ranges);
           the requester's ModelRequest and every party's Membership as SignedRecord, to every party;
           Sketches (quantile sketches, for common cut points) to every party;
           PSDUpload as SignedRecord (when the PSD is used); LabelStats (for the base score);
           ResumePoint to every party (the federation resumes from the fewest checkpointed trees)
Per tree:  RootTotals (the party's g, h and count sums) to every party
Per layer: VoteRecord, HistogramUpload, then Endorsement of every other party's upload, each a SignedRecord
           broadcast to every party (a layer takes three rounds)
Tree end:  the requester's SplitRecord and ContributionRecord of every layer (SignedRecords)
End:       LedgerHead to every party (replicas compared)

Ledger record bodies are the messages of :mod:`fedgrove.ledger.records`.
"""

from __future__ import annotations

import numpy as np

from fedgrove.protocols.horizontal.messages import Sketches  # noqa: F401 - reused: common cut points
from fedgrove.transport.codec import Message, array_field, register

LAYER = "layer"
VOTES, UPLOADS, ENDORSE = "votes", "hists", "endorse"


@register
class Hello(Message):
    n_samples: int = 0
    n_features: int = 0
    key: bytes = b""
    lo: np.ndarray = array_field("<f8", 1)   # per feature, then the label
    hi: np.ndarray = array_field("<f8", 1)
    features_digest: bytes = b""  # a hash of the feature names in order (empty: no names)


@register
class SignedRecord(Message):
    """A ledger record its sender wrote: kind, codec body, Ed25519 signature."""

    kind: str = ""
    body: bytes = b""
    signature: bytes = b""


@register
class SignedRecords(Message):
    kinds: list[str] = None
    bodies: list[bytes] = None
    signatures: list[bytes] = None


@register
class ResumePoint(Message):
    """Whether the party resumes, and how many trees (boosting rounds) its checkpoint holds."""

    resume: bool = False
    trees_done: int = 0


@register
class LabelStats(Message):
    stats: np.ndarray = array_field("<f8", 1)


@register
class RootTotals(Message):
    """The party's (g, h, count) sums over the instances of the tree being grown."""

    totals: np.ndarray = array_field("<f8", 1)


@register
class LedgerHead(Message):
    count: int = 0
    head: bytes = b""
