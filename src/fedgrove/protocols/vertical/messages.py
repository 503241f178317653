"""Messages of the vertical protocol (stages in order).

Setup:      passive -> active  FeatureLayout;   active -> passive  PublicKey, Start
Per tree:   active -> passive  EncryptedGradients (once)
Per layer:  active -> passive  HistogramRequest;  passive -> active  EncryptedHistograms
            active -> owner    SplitQuery;        owner -> active    SplitMasks
            active -> passive  LayerPartition
            active -> passive  TreeEnd
            (subsample: passive -> active  PredictBits of its splits over every instance)
End:        active -> passive  TrainingDone
Prediction: active -> passive  PredictRequest;    passive -> active  PredictBits
            (a chunk of test rows each, as many as MAX_PREDICT_BYTES of bits allow)

Active-to-passive control messages travel in order on one tag per tree
(``tree=t/ctl``); replies on ``tree=t/reply``.
"""

from __future__ import annotations

import numpy as np

from fedgrove.transport.codec import Message, array_field, register

CONTROL = "ctl"
REPLY = "reply"


@register
class FeatureLayout(Message):
    """How many value bins each of the passive party's features has (not its cut points), how many
    instances it holds and a SHA-256 of their sorted IDs (empty when it has no ID column)."""

    n_value_bins: np.ndarray = array_field("<i4", 1)
    n_samples: int = 0
    ids_digest: bytes = b""


@register
class PublicKey(Message):
    """The key holder's public key and the packing layout both sides use; ``rows_per_ciphertext`` instances
    share a ciphertext at a stride of ``stride_bits`` (:class:`~fedgrove.crypto.packing.RowPacking`)."""

    key: bytes = b""
    frac_bits: int = 53
    value_bits: int = 16
    count_bits: int = 30
    rows_per_ciphertext: int = 1
    stride_bits: int = 0


@register
class Start(Message):
    """The first tree to grow: 0, or the number of trees every party has checkpointed (resume)."""

    tree: int = 0


@register
class EncryptedGradients(Message):
    """Packed Enc(g, h) of every instance, in instance order (``rows_per_ciphertext`` instances a
    ciphertext); sent once per tree.  With ``sampled`` (``subsample``) only of the instances ``rows`` (sorted
    positions in the aligned order), which the tree grows on."""

    tree: int = 0
    ciphertexts: bytes = b""
    n: int = 0
    sampled: bool = False
    rows: np.ndarray = array_field("<i8", 1)


@register
class HistogramRequest(Message):
    """The nodes whose histograms the layer needs; with ``sampled`` (``colsample_bytree``), ``features`` are the
    receiver's own features the round samples, the only ones whose bins it sums (possibly none)."""

    layer: int = 0
    nodes: list[int] = None
    sampled: bool = False
    features: list[int] = None

    def __post_init__(self):
        if self.features is None:
            self.features = []


@register
class EncryptedHistograms(Message):
    """Encrypted (G, H) sums of the requested nodes' non-default bins, compressed.

    For each (node, feature) in order: ``skipped[k]`` is the bin left out (the
    node's most frequent one; the key holder gets it by subtraction from the
    node total) and ``n_bins[k]`` the number of sums that follow, whose bin
    indices are the next entries of ``bins``.  ``n_slots`` sums share a
    ciphertext (with several instances per gradient ciphertext: whole bins per
    ciphertext, :class:`~fedgrove.crypto.packing.RowPacking`).
    """

    ciphertexts: bytes = b""
    n_sums: int = 0
    n_slots: int = 1
    skipped: np.ndarray = array_field("<i4", 1)
    n_bins: np.ndarray = array_field("<i4", 1)
    bins: np.ndarray = array_field("<i4", 1)


@register
class SplitQuery(Message):
    """Splits chosen on the owner's features: local feature index and bin per node."""

    layer: int = 0
    nodes: list[int] = None
    features: list[int] = None
    bins: list[int] = None
    missing_left: list[int] = None


@register
class SplitMasks(Message):
    """Per queried node: packed bits, 1 = goes left, over the node's instances in ID order."""

    masks: list[bytes] = None


@register
class LayerPartition(Message):
    """How every split node of a layer divided its instances (bits as in SplitMasks)."""

    layer: int = 0
    nodes: list[int] = None
    left: list[int] = None
    right: list[int] = None
    masks: list[bytes] = None


@register
class TreeEnd(Message):
    tree: int = 0


@register
class TrainingDone(Message):
    n_trees: int = 0


@register
class PredictRequest(Message):
    """How many test instances to predict, a SHA-256 of their sorted IDs (empty without IDs), and the rows
    ``start:stop`` this request asks about: a large test set is asked about in consecutive chunks
    (:data:`~fedgrove.protocols.MAX_PREDICT_BYTES` of bits a chunk), the last ending at ``n_samples``."""

    n_samples: int = 0
    ids_digest: bytes = b""
    start: int = 0
    stop: int = 0


@register
class PredictBits(Message):
    """For each split the passive party owns (tree, node), packed go-left bits of the test instances asked
    about (in training: of every training instance): mask ``masks[j]`` of ``bits`` for split ``j``, each
    distinct mask sent once (:func:`distinct_masks`)."""

    trees: list[int] = None
    nodes: list[int] = None
    bits: list[bytes] = None
    masks: list[int] = None


def ids_digest(ids) -> bytes:
    """SHA-256 of the sorted instance IDs (b"" when there are none): parties check they hold the same set."""
    if ids is None:
        return b""
    import hashlib

    return hashlib.sha256(np.ascontiguousarray(np.sort(np.asarray(ids)), dtype="<i8").tobytes()).digest()


def pack_mask(mask: np.ndarray) -> bytes:
    return np.packbits(np.asarray(mask, dtype=bool)).tobytes()


def pack_masks(masks: list) -> list[bytes]:
    """:func:`pack_mask` of several masks of one length at once."""
    if not len(masks):
        return []
    packed = np.packbits(np.asarray(masks, dtype=bool).reshape(len(masks), -1), axis=1)
    return [row.tobytes() for row in packed]


def distinct_masks(packed: np.ndarray) -> tuple[list[bytes], list[int]]:
    """Packed masks, one a row of ``packed``, as the distinct ones (in the order they first come) and, per row,
    which of them it is: equal masks are sent once.  The receiver learns no more than the masks themselves
    show (which of them are equal)."""
    first: dict = {}
    which = [first.setdefault(row.tobytes(), len(first)) for row in packed]
    return list(first), which


def unpack_mask(data: bytes, n: int) -> np.ndarray:
    bits = np.unpackbits(np.frombuffer(data, dtype=np.uint8))
    if len(bits) < n or len(bits) >= n + 8 or bits[n:].any():
        from fedgrove.exceptions import ProtocolError

        raise ProtocolError(f"a mask of {len(data)} bytes does not describe {n} instances")
    return bits[:n].astype(bool)


def packed_masks(parts: list, n: int) -> np.ndarray:
    """Several packed masks of ``n`` instances each (as :func:`pack_mask` packs them) as the rows of one
    ``(len(parts), (n + 7) // 8)`` uint8 array, still packed; a part of the wrong length, or with bits set
    beyond the ``n`` instances, is refused as :func:`unpack_mask` refuses it."""
    width = (n + 7) // 8
    bad = next((len(p) for p in parts if len(p) != width), None)
    packed = np.frombuffer(b"".join(parts), dtype=np.uint8).reshape(len(parts), width) if bad is None else None
    if bad is None and n % 8 and len(parts) and (packed[:, -1] & ((1 << (8 - n % 8)) - 1)).any():
        bad = width
    if bad is not None:
        from fedgrove.exceptions import ProtocolError

        raise ProtocolError(f"a mask of {bad} bytes does not describe {n} instances")
    return packed


def unpack_masks(parts: list, n: int) -> np.ndarray:
    """:func:`unpack_mask` of several masks of ``n`` instances at once: a (len(parts), n) boolean array."""
    width = (n + 7) // 8
    if any(len(p) != width for p in parts):
        from fedgrove.exceptions import ProtocolError

        bad = next(len(p) for p in parts if len(p) != width)
        raise ProtocolError(f"a mask of {bad} bytes does not describe {n} instances")
    bits = np.unpackbits(np.frombuffer(b"".join(parts), dtype=np.uint8).reshape(len(parts), width), axis=1)
    if bits[:, n:].any():
        from fedgrove.exceptions import ProtocolError

        raise ProtocolError(f"a mask of {width} bytes does not describe {n} instances")
    return bits[:, :n].astype(bool)
