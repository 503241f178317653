"""Private set intersection of instance IDs (DH-PSI over X25519): the right rows, and no ID in the clear."""

import numpy as np
import pytest

from fedgrove.crypto.psi import Blinder, hash_ids
from fedgrove.exceptions import DataError, ProtocolError
from fedgrove.protocols import psi
from fedgrove.transport.inprocess import InProcessHub, run_parties


def _run(ids: dict, lead="L", roles=None):
    others = [n for n in ids if n != lead]
    hub = InProcessHub(list(ids))
    sent = []
    roles = roles or {}

    def role(n):
        def run(ch):
            ch.observers.append(lambda d, peer, tag, msg: d == "send" and sent.append(msg))
            return roles.get(n, psi.common_rows)(ch, ids[n], lead, others)
        return run
    results, _ = run_parties(hub, {n: role(n) for n in ids}, timeout=30)
    return results, sent


def test_every_party_keeps_the_rows_whose_id_every_party_holds_and_no_id_crosses_in_the_clear(rng):
    ids = {"L": rng.permutation(3000)[:1800], "P1": rng.permutation(3000)[:2000], "P2": rng.permutation(3000)[:2500]}
    rows, sent = _run(ids)
    common = set(ids["L"].tolist()) & set(ids["P1"].tolist()) & set(ids["P2"].tolist())
    assert 300 < len(common) < 1800
    for n, r in rows.items():
        assert (np.diff(r) > 0).all() and set(ids[n][r].tolist()) == common
    # what crossed: 32-byte blinded points and keep flags; neither an ID's 8 bytes nor its hash is among them
    blobs = b"".join(m.points for m in sent if isinstance(m, psi.BlindedIDs))
    assert len(blobs) == 32 * (2 * 2000 + 2 * 2500 + 2 * 1800 + 2 * 1800)  # a, ab; b to both, ba from both
    points = {blobs[i:i + 32] for i in range(0, len(blobs), 32)}
    every = np.concatenate(list(ids.values()))
    assert not points & set(hash_ids(every))
    assert not any(np.int64(i).tobytes() in blobs for i in every[:200])


def test_blinding_commutes_and_a_low_order_point_is_refused():
    a, b = Blinder(), Blinder()
    h = hash_ids(np.arange(50))
    assert b.blind(a.blind(h)) == a.blind(b.blind(h)) and a.blind(h) != h
    with pytest.raises(ProtocolError, match="low order"):
        a.blind([bytes(32)])


def test_no_common_instance_is_refused_naming_the_parties():
    with pytest.raises(DataError, match="no instance ID is held by every party"):
        _run({"L": np.arange(10), "P1": np.arange(10, 20)})


def test_a_lead_that_names_rows_the_other_does_not_hold_is_refused():
    def lying_lead(ch, ids, lead, others):  # follows the protocol, then says to keep every row
        blinder = Blinder()
        with ch.scope(stage="psi"):
            ch.broadcast("b", psi.BlindedIDs(b"".join(blinder.blind(hash_ids(ids)))), others)
            theirs = ch.recv("P1", "a", psi.BlindedIDs).points
            ch.send("P1", "ab", psi.BlindedIDs(b"".join(blinder.blind([theirs[i:i + 32]
                                                                        for i in range(0, len(theirs), 32)]))))
            ch.recv("P1", "ba", psi.BlindedIDs)
            ch.send("P1", "keep", psi.Kept(np.ones(len(theirs) // 32, dtype=bool)))
        return None

    with pytest.raises(ProtocolError, match="P1: L named rows to keep that it does not hold"):
        _run({"L": np.arange(0, 10), "P1": np.arange(5, 15)}, roles={"L": lying_lead})


def test_long_blinding_notes_its_progress_and_gives_the_same_rows(rng, monkeypatch, caplog):
    import logging

    ids = {"L": rng.permutation(300)[:200], "P1": rng.permutation(300)[:250]}
    with caplog.at_level(logging.INFO, logger="fedgrove"):
        quiet, _ = _run(ids)
    assert "held by every party" in caplog.text and "blinding" not in caplog.text  # a short run: no note
    caplog.clear()
    # every block counts as late: each party notes its blinding block by block
    monkeypatch.setattr(psi, "BLOCK", 64)
    monkeypatch.setattr(psi, "NOTE_FIRST", 0.0)
    monkeypatch.setattr(psi, "NOTE_EVERY", 0.0)
    with caplog.at_level(logging.INFO, logger="fedgrove"):
        noted, _ = _run(ids)
    assert "L: private set intersection: blinding its IDs, 64 of 200 done" in caplog.text
    assert "L: private set intersection: blinding P1's IDs, 192 of 250 done" in caplog.text
    assert "P1: private set intersection: blinding L's IDs, 128 of 200 done" in caplog.text
    assert "of 250 done" in caplog.text and "250 of 250" not in caplog.text  # none once done
    for n in ids:
        np.testing.assert_array_equal(noted[n], quiet[n])
