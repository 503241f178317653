"""An append-only, hash-chained log of signed records in a SQLite file.

Each record has a kind (its body's message type), an author, a body (the
codec's bytes of a :mod:`fedgrove.ledger.records` message), the author's
Ed25519 signature over the kind, author and body digest, and a chain hash:
``hash = SHA-256(prev_hash, kind, author, body, signature)`` with an all-zero
hash before the first record.  Editing, deleting, inserting or reordering a
record breaks the chain from there on; a record whose signature does not
verify under its author's key is refused by :func:`fedgrove.ledger.verify`.
The table refuses UPDATE and DELETE (triggers), which only stops accidents:
the chain and the signatures are what detect tampering.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from fedgrove.exceptions import LedgerError
from fedgrove.transport.codec import Message, decode, encode, wire_name

GENESIS = bytes(32)
_SCHEMA = """
CREATE TABLE IF NOT EXISTS records (
    seq INTEGER PRIMARY KEY,
    kind TEXT NOT NULL,
    author TEXT NOT NULL,
    body BLOB NOT NULL,
    signature BLOB NOT NULL,
    prev_hash BLOB NOT NULL,
    hash BLOB NOT NULL
);
CREATE TRIGGER IF NOT EXISTS records_no_update BEFORE UPDATE ON records
    BEGIN SELECT RAISE(ABORT, 'the ledger is append-only'); END;
CREATE TRIGGER IF NOT EXISTS records_no_delete BEFORE DELETE ON records
    BEGIN SELECT RAISE(ABORT, 'the ledger is append-only'); END;
"""


@dataclass
class Record:
    seq: int
    kind: str
    author: str
    body: bytes
    signature: bytes
    prev_hash: bytes
    hash: bytes

    def message(self) -> Message:
        return decode(self.body, context=f"ledger record {self.seq}")


def signed_bytes(kind: str, author: str, body: bytes) -> bytes:
    """What an author signs for a record."""
    return b"fedgrove-ledger|" + kind.encode() + b"|" + author.encode() + b"|" + hashlib.sha256(body).digest()


def chain_hash(prev_hash: bytes, kind: str, author: str, body: bytes, signature: bytes) -> bytes:
    h = hashlib.sha256(prev_hash)
    for part in (kind.encode(), author.encode(), body, signature):
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    return h.digest()


def sign_record(key, author: str, message: Message) -> tuple[str, bytes, bytes]:
    """(kind, body, signature) of a record ``author`` writes with its :class:`~fedgrove.crypto.signing.SigningKey`."""
    kind = wire_name(type(message)).rsplit(".", 1)[-1]
    body = encode(message)
    return kind, body, key.sign(signed_bytes(kind, author, body))


class Ledger:
    """One party's replica; ``path=None`` keeps it in memory."""

    def __init__(self, path=None):
        self.path = Path(path) if path is not None else None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(self.path) if self.path is not None else ":memory:")
        self._db.executescript(_SCHEMA)
        row = self._db.execute("SELECT seq, hash FROM records ORDER BY seq DESC LIMIT 1").fetchone()
        self.count, self.head = (row[0], row[1]) if row else (0, GENESIS)
        self._batch = 0

    def append(self, kind: str, author: str, body: bytes, signature: bytes) -> Record:
        h = chain_hash(self.head, kind, author, body, signature)
        rec = Record(self.count + 1, kind, author, body, signature, self.head, h)
        self._db.execute("INSERT INTO records VALUES (?, ?, ?, ?, ?, ?, ?)",
                         (rec.seq, kind, author, body, signature, rec.prev_hash, h))
        if not self._batch:
            self._db.commit()
        self.count, self.head = rec.seq, h
        return rec

    @contextlib.contextmanager
    def batch(self):
        """Append several records in one transaction (one commit)."""
        self._batch += 1
        try:
            yield self
        finally:
            self._batch -= 1
            if not self._batch:
                self._db.commit()

    def truncate(self, count: int, head: bytes | None = None) -> None:
        """Keep the first ``count`` records (a resumed run drops those of the tree it was growing when it
        stopped, which no replica comparison vouched for); ``head``: the hash the kept chain must end with.
        The file is rewritten and replaced atomically: the table itself refuses DELETE."""
        if not 0 <= count <= self.count:
            raise LedgerError(f"{self._where()}: cannot keep {count} records, it holds {self.count}")
        kept = self._db.execute("SELECT seq, kind, author, body, signature, prev_hash, hash FROM records "
                                "WHERE seq <= ? ORDER BY seq", (count,)).fetchall()
        end = kept[-1][6] if kept else GENESIS
        if len(kept) != count or [r[0] for r in kept] != list(range(1, count + 1)):
            raise LedgerError(f"{self._where()}: records 1-{count} are not all there")
        if head is not None and bytes(end) != bytes(head):
            raise LedgerError(f"{self._where()}: record {count} ends the chain with {bytes(end).hex()[:16]}..., "
                              f"the checkpoint expects {bytes(head).hex()[:16]}...")
        if count == self.count:
            return
        self._db.commit()
        self._db.close()
        if self.path is None:
            self._db = sqlite3.connect(":memory:")
        else:
            tmp = self.path.with_name(f".{self.path.name}.truncate.tmp")
            tmp.unlink(missing_ok=True)
            self._db = sqlite3.connect(str(tmp))
        self._db.executescript(_SCHEMA)
        self._db.executemany("INSERT INTO records VALUES (?, ?, ?, ?, ?, ?, ?)", kept)
        self._db.commit()
        if self.path is not None:
            self._db.close()
            os.replace(tmp, self.path)
            self._db = sqlite3.connect(str(self.path))
        self.count, self.head = count, bytes(end)

    def _where(self) -> str:
        return f"ledger {self.path}" if self.path is not None else "the ledger"

    def records(self):
        for row in self._db.execute("SELECT seq, kind, author, body, signature, prev_hash, hash FROM records "
                                    "ORDER BY seq"):
            yield Record(*row)

    def close(self) -> None:
        self._db.commit()
        self._db.close()


def open_records(path) -> list[Record]:
    """Every record of a ledger file as stored (for verification: nothing is recomputed here)."""
    path = Path(path)
    if not path.exists() or path.is_dir():
        from fedgrove.exceptions import DataError

        raise DataError(f"ledger file {str(path)!r} " + ("is a directory" if path.is_dir() else "does not exist"))
    try:
        # read-only, by a URI: a '#', '?' or '%' in the path is percent-encoded (as written, it cut the path short)
        db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        db.text_factory = bytes  # whatever was written into a column is read back as it is
        try:
            rows = db.execute("SELECT seq, kind, author, body, signature, prev_hash, hash FROM records "
                              "ORDER BY rowid").fetchall()
        finally:
            db.close()
    except sqlite3.DatabaseError as exc:
        raise LedgerError(f"{path} is not a fedgrove ledger: {exc}") from None

    def text(v) -> str:
        return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)

    def raw(v) -> bytes:
        return v if isinstance(v, bytes) else str(v).encode()

    return [Record(int(r[0]), text(r[1]), text(r[2]), raw(r[3]), raw(r[4]), raw(r[5]), raw(r[6])) for r in rows]
