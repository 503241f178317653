"""The instances every party holds, found by private set intersection (:mod:`fedgrove.crypto.psi`).

Messages, all under ``stage=psi``: every other party sends the lead ``a``
(its blinded IDs); the lead sends every other party ``b`` (its own blinded
IDs), then ``ab`` (that party's, blinded again); the other party sends back
``ba`` (the lead's, blinded again); the lead sends ``keep`` (which of that
party's rows, in the order of its ``a``, every party holds).
"""

from __future__ import annotations

import numpy as np

from fedgrove.crypto.psi import Blinder, hash_ids, matches, pack, shuffled, unpack
from fedgrove.exceptions import DataError, ProtocolError
from fedgrove.log import NoteTimer, logger
from fedgrove.transport.codec import Message, array_field, register


ALIGN_HINT = ("or set [federation] align = \"psi\" in every party's config to train on the instances all of "
              "them hold (private set intersection)")


#: blinding runs in blocks of this many IDs, noting its progress after NOTE_FIRST s, then every NOTE_EVERY s
#: (about 25,000 IDs a second on one core here: a pass over a million IDs takes some 40 s, two passes per party)
BLOCK = 50_000
NOTE_FIRST = 15.0
NOTE_EVERY = 30.0


def _blind(channel, blinder: Blinder, points: list, what: str) -> list:
    """``blinder.blind(points)`` in blocks, noting the progress of a long run."""
    timer = NoteTimer(NOTE_FIRST, NOTE_EVERY)
    out = []
    for k in range(0, len(points), BLOCK):
        out += blinder.blind(points[k:k + BLOCK])
        if len(out) < len(points) and (elapsed := timer.due()) is not None:
            logger.info("%s: private set intersection: blinding %s, %d of %d done (%.0f s so far)", channel.party,
                        what, len(out), len(points), elapsed)
    return out


@register
class BlindedIDs(Message):
    points: bytes = b""  # 32 bytes each


@register
class Kept(Message):
    keep: np.ndarray = array_field("|b1", 1)


def common_rows(channel, ids: np.ndarray, lead: str, others: list[str], everyone: bool = True) -> np.ndarray:
    """Positions (ascending) of this party's rows whose ID every party holds: ``lead`` intersects with each
    of ``others`` (the other parties with data; for them, ``others`` is not used).  With ``everyone`` false,
    pairs only: each other party keeps its rows the lead holds, and the lead keeps all of its own (HybridTree's
    guests).  Refuses an empty intersection, naming the parties."""
    ids = np.asarray(ids, dtype=np.int64)
    blinder = Blinder()
    with channel.scope(stage="psi"):
        if channel.party == lead:
            rows = _lead(channel, blinder, ids, others, everyone)
        else:
            rows = _other(channel, blinder, ids, lead)
    if len(rows) == 0 and everyone:
        raise DataError(f"{channel.party}: no instance ID is held by every party ({', '.join([lead, *others])} "
                        f"for the lead); check that the parties' _id columns number the same instances")
    if len(rows) == 0:
        raise DataError(f"{channel.party}: none of its instance IDs is held by {lead}; check that the parties' _id "
                        f"columns number the same instances")
    return rows


def _lead(channel, blinder: Blinder, ids: np.ndarray, others: list[str], everyone: bool) -> np.ndarray:
    mine, order = shuffled(_blind(channel, blinder, hash_ids(ids), "its IDs"))  # mine[k] is row order[k]'s
    channel.broadcast("b", BlindedIDs(pack(mine)), others)
    again = {}
    for p in others:
        theirs = unpack(channel.recv(p, "a", BlindedIDs).points, what=f"blinded IDs from {p}")
        again[p] = _blind(channel, blinder, theirs, f"{p}'s IDs")
        channel.send(p, "ab", BlindedIDs(pack(again[p])))
    held = np.ones(len(ids), dtype=bool)
    back = {}
    for p in others:
        back[p] = unpack(channel.recv(p, "ba", BlindedIDs).points, len(mine), what=f"blinded IDs from {p}")
        theirs_held = np.zeros(len(ids), dtype=bool)
        theirs_held[order[matches(back[p], again[p])]] = True
        logger.info("%s: %d of its %d instances are held by %s (%d rows)", channel.party,
                    int(theirs_held.sum()), len(ids), p, len(again[p]))
        held &= theirs_held
    if not everyone:  # each other party keeps its rows this one holds; this one keeps all of its own
        for p in others:
            channel.send(p, "keep", Kept(matches(again[p], back[p])))
        return np.arange(len(ids))
    kept_at = held[order]  # in the shuffled order of ``mine``, hence of every ``back[p]``
    for p in others:
        common = {v for v, k in zip(back[p], kept_at) if k}
        channel.send(p, "keep", Kept(np.fromiter((v in common for v in again[p]), dtype=bool,
                                                 count=len(again[p]))))
    logger.info("%s: %d instances are held by every party", channel.party, int(held.sum()))
    return np.nonzero(held)[0]


def _other(channel, blinder: Blinder, ids: np.ndarray, lead: str) -> np.ndarray:
    mine, order = shuffled(_blind(channel, blinder, hash_ids(ids), "its IDs"))
    channel.send(lead, "a", BlindedIDs(pack(mine)))
    theirs = unpack(channel.recv(lead, "b", BlindedIDs).points, what=f"blinded IDs from {lead}")
    again = unpack(channel.recv(lead, "ab", BlindedIDs).points, len(mine), what=f"blinded IDs from {lead}")
    back = _blind(channel, blinder, theirs, f"{lead}'s IDs")
    channel.send(lead, "ba", BlindedIDs(pack(back)))
    at_lead = matches(again, back)
    keep = channel.recv(lead, "keep", Kept).keep
    if keep.shape != (len(mine),) or np.any(keep & ~at_lead):
        raise ProtocolError(f"{channel.party}: {lead} named rows to keep that it does not hold")
    return np.sort(order[keep])
