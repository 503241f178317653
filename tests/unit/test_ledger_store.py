"""The ledger file's truncation (a resumed FV-tree run) and the signing key file it needs."""

import os
import stat

import pytest

from fedgrove.crypto.signing import SigningKey, verify
from fedgrove.exceptions import DataError, LedgerError
from fedgrove.ledger.store import Ledger, open_records


def _ledger(path, n):
    led = Ledger(path)
    for k in range(n):
        led.append("Note", f"p{k % 2}", f"body {k}".encode(), bytes(64))
    return led


@pytest.mark.parametrize("in_file", [True, False])
def test_truncate_keeps_the_first_records_and_their_chain(tmp_path, in_file):
    led = _ledger(tmp_path / "l.sqlite" if in_file else None, 6)
    heads = [r.hash for r in led.records()]
    led.truncate(4, heads[3])
    assert (led.count, led.head) == (4, heads[3])
    rec = led.append("Note", "p0", b"after", bytes(64))  # the chain goes on from record 4
    assert rec.seq == 5 and rec.prev_hash == heads[3]
    if in_file:
        led.close()
        assert [r.seq for r in open_records(tmp_path / "l.sqlite")] == [1, 2, 3, 4, 5]
        led = Ledger(tmp_path / "l.sqlite")
        assert (led.count, led.head) == (5, rec.hash)
        with pytest.raises(Exception, match="append-only"):  # the rewritten file still refuses edits
            led._db.execute("DELETE FROM records WHERE seq = 5")
        assert not list(tmp_path.glob(".*tmp"))


def test_truncate_refuses_a_chain_end_or_length_it_does_not_have(tmp_path):
    led = _ledger(tmp_path / "l.sqlite", 5)
    with pytest.raises(LedgerError, match="record 3 ends the chain with"):
        led.truncate(3, bytes(32))
    with pytest.raises(LedgerError, match="cannot keep 7 records, it holds 5"):
        led.truncate(7)
    assert led.count == 5 and len(list(led.records())) == 5  # nothing changed
    led.truncate(0)
    assert led.count == 0 and led.head == bytes(32)


def test_signing_key_file_is_private_and_signs_as_the_key(tmp_path):
    key = SigningKey()
    key.save(tmp_path / "k.key")
    assert stat.S_IMODE(os.stat(tmp_path / "k.key").st_mode) == 0o600
    again = SigningKey.load(tmp_path / "k.key")
    assert again.public_bytes() == key.public_bytes()
    assert verify(key.public_bytes(), again.sign(b"x"), b"x")
    (tmp_path / "bad.key").write_text("not a key")
    with pytest.raises(DataError, match="bad.key.*not an unencrypted PEM private key"):
        SigningKey.load(tmp_path / "bad.key")
    with pytest.raises(DataError, match="does not exist"):
        SigningKey.load(tmp_path / "missing.key")


@pytest.mark.parametrize("name", ["l#1.sqlite", "l?1.sqlite", "l%201.sqlite", "l 1.sqlite"])
def test_a_ledger_is_read_back_whatever_characters_its_path_holds(tmp_path, name):
    # the read-only URI took the path as written: '#' and '?' cut it short ("no such table: records") and '%20'
    # was read as a space ("unable to open database file")
    _ledger(tmp_path / name, 3).close()
    assert [r.body for r in open_records(tmp_path / name)] == [b"body 0", b"body 1", b"body 2"]
    with pytest.raises(DataError, match="is a directory"):
        open_records(tmp_path)
