"""Per-party checkpoints: after each completed round (or every ``[federation] checkpoint_every`` rounds, and the
last: :meth:`CheckpointStore.due`) a party writes its state.

Restarting every party with ``--resume`` continues from the last tree all of
them completed and gives exactly the model of an uninterrupted run (the
protocols are deterministic given the seed; encryption randomness never
reaches the model).

Files, next to ``<party>.checkpoint.json`` (the state, rewritten after every
tree and written last, so it vouches for the others; in place, after the
state before it went to ``.prev.json``: a new file and a rename cost 150-300
us a save on this project's machine against 25 us, and a newest state that a
crash cut short fails its digest, so that loading falls back to the one
before it; a run's first state replaces the file whole):

* ``<party>.checkpoint.<token>.trees``: an append-only log holding the JSON
  text of every finished tree (every :class:`~fedgrove.jsontext.FrozenJSON`
  in the state) once; the state refers to each by offset, length and
  SHA-256 of the log's bytes up to its end.  A checkpoint after tree T
  therefore writes one tree, not T (the whole-state rewrite made a 500-tree
  run write ~250 times its model), and a reference of a few bytes per tree
  (the SHA-256 is carried along as the log grows).  States written before
  2026-11-25 give each text's own SHA-256 instead; they load as before.
  A fresh run starts a new log (the old checkpoint stays readable until the
  new state replaces it); a resumed run appends to the log its state names.
* The state carries the SHA-256 of its own text (``state_sha256``, the last
  field: of the state as written without it), so that a state cut short,
  edited or damaged after its run wrote it is never resumed from (a changed
  leaf value would otherwise go into the model without a word): the state
  before it takes its place where that one is whole, else it is refused by
  name.  States written before 2026-11-26 carry none; they load as before.
* ``<party>.checkpoint.prev.json``: the state before the newest, written
  (in place) just before it, so that a newest state cut short by a crash
  gives way to it (with a warning), and so that a party one tree ahead of a
  peer that stopped can step back to where every party is: a party may stop
  after its peers checkpointed a tree and before it did, and ``--resume`` then
  resumes from the fewest trees every party holds (``limit``, which
  :func:`fedgrove.runner.run` agrees on among the parties).  The tree log
  and the array file the previous state names are kept for it (a fresh run
  removes it).
* ``<party>.checkpoint.npy`` and ``<party>.checkpoint.alt.npy``: an optional
  array (training scores), written in turn to the file the state does not
  name (the state names the one it vouches for, with its SHA-256), in place:
  replacing a file by a new one cost 40 times as much on this project's
  machine (an ext4 volume that discards freed blocks), and a party writes
  its scores after every tree.
"""

from __future__ import annotations

import hashlib
import io
import json
import operator
import uuid
from pathlib import Path

import numpy as np

from fedgrove import jsontext
from fedgrove.engine.model import atomic_write_text, open_owner_only
from fedgrove.exceptions import DataError
from fedgrove.log import logger

_SCALARS = (int, float, str, bool, type(None))
CHUNK = "$chunk"  # {"$chunk": [offset, length]}: a value stored in the tree log (earlier: [offset, length, sha256])
DIGEST = "state_sha256"  # the state file's last field: the SHA-256 of the state's JSON text without it


def check_state_digest(state: dict, path: Path) -> dict:
    """``state`` (as read from ``path``) without its digest, which must match the rest; states written before
    2026-11-26 carry none."""
    if DIGEST not in state:
        return state
    digest = state.pop(DIGEST)
    if hashlib.sha256(json.dumps(state).encode()).hexdigest() != digest:
        raise DataError(f"checkpoint {path} is damaged: its state does not match the SHA-256 its run wrote with it "
                        f"(edited or corrupted since); train anew (without --resume, or into another output "
                        f"directory), or restore the file")
    return state


def whole_previous_state(path) -> tuple[Path, int] | None:
    """The state before the newest beside the checkpoint ``path`` (its file and trees) where it holds together,
    which --resume takes where the newest does not; None where it is missing or does not."""
    store = CheckpointStore(path)
    prev = store._whole_previous()
    return None if prev is None else (store.prev_path, prev[1])


class CheckpointStore:
    """A JSON state file, an append-only log of finished trees' text, and an optional array (``.npy``)."""

    def __init__(self, path):
        self.path = Path(path)
        self.array_path = self.path.with_suffix(".npy")  # and _alt_array_path beside it: see save
        self._array_named: Path | None = None  # the array file the last state written or loaded names
        self._log: Path | None = None     # the log this run appends to (None until the first save or load)
        self._log_end = 0                 # its bytes that the state file vouches for
        self._log_size = 0                # its bytes on disk (more after a crash while appending)
        self._chunks: dict[str, list] = {}          # sha256 of a text -> its reference [offset, length]
        self._seen: dict[int, tuple] = {}           # id(FrozenJSON) -> (the object, its reference)
        # id(first item) -> (the items, their references' JSON texts) of each list of FrozenJSON the last save
        # held (a model's trees): the next save's list that starts with the same items reuses their texts
        self._lists: dict[int, tuple[list, list]] = {}
        self._last_lists: dict[int, tuple[list, list]] = {}
        self._spliced: dict[str, str] = {}         # a save's placeholders -> the JSON text of the list each stands for
        self._token = uuid.uuid4().hex
        self._log_hash = hashlib.sha256()           # of the log's first _log_end bytes
        self.run: dict | None = None  # the run that saves (party, role, settings, data digest), kept in each state
        self.prev_path = self.path.with_suffix(".prev.json")
        self._text: str | None = None  # the newest state's text, written or loaded (the next save's previous one)
        #: a leading party's resume point: load the newest state of at most this many trees (see load)
        self.limit: int | None = None
        #: checkpoint after every this many rounds, and after the last (see due); [federation] checkpoint_every
        self.every = 1

    def due(self, done: int, total: int | None = None) -> bool:
        """Whether a party that has finished ``done`` rounds (trees of a forest) of ``total`` (None: unknown)
        checkpoints now: after every :attr:`every`-th and after the last.  Every party of a federation
        checkpoints at the same rounds, so that one that stops leaves its peers at most one checkpoint ahead,
        which the state before their newest bridges on --resume; a resume redoes at most ``every`` finished rounds.
        A party that counts single trees where its leader counts rounds (a feature holder following a
        multiclass model) checkpoints more often, which keeps that so."""
        return self.every <= 1 or done % self.every == 0 or (total is not None and done >= total)

    @property
    def _alt_array_path(self) -> Path:
        return self.path.with_suffix(".alt.npy")

    def save(self, state: dict, array: np.ndarray | None = None) -> None:
        fresh = self._log is None
        if fresh:  # a fresh run (a resumed one has loaded its state): a new log, and no earlier run's state
            self.prev_path.unlink(missing_ok=True)
            self._log = self.path.with_name(f"{self.path.stem}.{uuid.uuid4().hex[:12]}.trees")
            self._log_end, self._chunks, self._seen, self._log_hash = 0, {}, {}, hashlib.sha256()
            self._log_size = 0
        pending: list[bytes] = []
        self._spliced, self._last_lists, self._lists = {}, self._lists, {}  # (this state's lists, from the last's)
        skeleton = self._externalise(state, pending)
        if pending or not self._log.exists():  # (a state without trees still names its empty log)
            with open_owner_only(self._log, binary=True) as fh:
                start = self._log_end - sum(len(b) for b in pending)
                if self._log_size != start:  # drop a tail no state vouches for (a crash's, before a resume)
                    fh.truncate(start)
                fh.seek(start)
                for data in pending:
                    fh.write(data)
            self._log_size = self._log_end
            for data in pending:
                self._log_hash.update(data)
        skeleton["tree_log"] = {"file": self._log.name, "bytes": self._log_end, "sha256": self._log_hash.hexdigest()}
        if self.run is not None:
            skeleton["run"] = self.run
        target = None
        if array is not None:
            buf = io.BytesIO()
            np.save(buf, np.ascontiguousarray(array), allow_pickle=False)
            data = buf.getvalue()
            # the file the current state does not name, overwritten in place: a crash while writing it leaves
            # the state and the file it names as they were
            target = self._alt_array_path if self._array_named == self.array_path else self.array_path
            with open_owner_only(target, binary=True) as fh:
                fh.write(data)
                fh.truncate()
            skeleton["array_file"] = target.name
            skeleton["array_sha256"] = hashlib.sha256(data).hexdigest()
        text = json.dumps(skeleton)  # (never empty: it names its tree log)
        for placeholder, part in self._spliced.items():  # the lists of references, as json.dumps writes them
            text = text.replace(json.dumps(placeholder), part, 1)
        digest = hashlib.sha256(text.encode()).hexdigest()
        text = f'{text[:-1]}, "{DIGEST}": "{digest}"}}'  # its digest is its last field, as json.dumps writes it
        # written last, as it vouches for the log and array
        if self._text is None:  # a run's first state replaces whatever the file held, whole
            atomic_write_text(self.path, text)
        else:  # in place (6-12 times cheaper here than a new file and a rename), after the state before it: a
            # newest state that a crash cut short fails its digest, and load falls back to that one
            _write_in_place(self.prev_path, self._text)
            _write_in_place(self.path, text)
        self._text = text
        self._array_named = target
        if fresh:
            for old in self.path.parent.glob(f"{self.path.stem}.*.trees"):  # an earlier run's log
                if old.name != self._log.name:
                    old.unlink(missing_ok=True)

    def _externalise(self, obj, pending: list):
        """``obj`` with every FrozenJSON replaced by a reference into the log (appending texts not yet there);
        a list of FrozenJSON by a placeholder for the JSON text of its references (see :meth:`_frozen_list`)."""
        if isinstance(obj, jsontext.FrozenJSON):
            hit = self._seen.get(id(obj))
            if hit is not None and hit[0] is obj:
                return {CHUNK: hit[1]}
            data = obj.text().encode()
            sha = hashlib.sha256(data).hexdigest()
            ref = self._chunks.get(sha)
            if ref is None:
                ref = self._chunks[sha] = [self._log_end, len(data)]
                self._log_end += len(data)
                pending.append(data)
            self._seen[id(obj)] = (obj, ref)
            return {CHUNK: ref}
        if isinstance(obj, dict):
            return {k: self._externalise(v, pending) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            if obj and type(obj[0]) is jsontext.FrozenJSON:
                placeholder = self._frozen_list(obj, pending)
                if placeholder is not None:
                    return placeholder
            # per-tree lists of numbers, without a call each
            seen, out = self._seen, []
            for v in obj:
                if type(v) in _SCALARS:
                    out.append(v)
                    continue
                hit = seen.get(id(v)) if type(v) is jsontext.FrozenJSON else None
                out.append({CHUNK: hit[1]} if hit is not None and hit[0] is v else self._externalise(v, pending))
            return out
        return obj

    def _frozen_list(self, items, pending: list) -> str | None:
        """A placeholder for the JSON text of the references of ``items``, a list of FrozenJSON (a model's
        trees; None where it holds anything else), which :meth:`save` puts in for it.  The last save's list
        that starts with the same objects (one identity test each, in C) lends its texts, so that a save
        after tree T encodes one reference, not T (every save used to walk and encode the whole model)."""
        first = items[0]
        objs, parts = self._lists.get(id(first)) or self._last_lists.get(id(first)) or ([], [])
        n = len(objs)
        if not objs or objs[0] is not first or n > len(items) or not all(map(operator.is_, objs, items[:n])):
            objs, parts, n = [], [], 0
        tail = items[n:]
        if any(type(v) is not jsontext.FrozenJSON for v in tail):
            return None
        for v in tail:
            parts.append(json.dumps(self._externalise(v, pending)))
            objs.append(v)
        self._lists[id(first)] = (objs, parts)
        placeholder = f"\0{self._token}:{len(self._spliced)}\0"
        self._spliced[placeholder] = "[" + ", ".join(parts) + "]"
        return placeholder

    @staticmethod
    def resume_state(checkpoint, resume: bool, tree: int, party: str, leader: str) -> dict:
        """The state to resume from at ``tree`` (announced by ``leader``), or a clear error when there is none."""
        from fedgrove.exceptions import ProtocolError

        state = checkpoint.load(at_least=tree) if (checkpoint is not None and resume) else None
        if state is None:
            raise ProtocolError(f"{party}: {leader} resumes at tree {tree} but this party has no checkpoint that far "
                                f"(run it with --resume and its checkpoint)")
        return state

    @staticmethod
    def rounds(state: dict) -> int | None:
        """Boosting rounds (forest: trees) of the whole model a checkpoint holds; None for a party's part."""
        d = state.get("model")
        if not isinstance(d, dict):
            return None
        if d.get("kind") == "gbdt" and isinstance(d.get("trees"), list):
            per_round = int(d.get("n_classes") or 1) if d.get("objective") == "multiclass" else 1
            return len(d["trees"]) // max(per_round, 1)
        if d.get("kind") == "forest" and isinstance(d.get("trees"), list):
            return len(d["trees"])
        if d.get("format") == "fedgrove-hybridtree-host" and isinstance(d.get("tree_class"), list):
            return len(d["tree_class"]) // (max(d["tree_class"], default=0) + 1)
        return None

    @staticmethod
    def scores(state: dict, shape: tuple) -> np.ndarray:
        """The training scores saved with a checkpoint, checked against the shape this party expects."""
        from fedgrove.exceptions import ProtocolError

        raw = np.ascontiguousarray(state["array"], dtype=np.float64)
        if raw.shape != tuple(shape):
            raise ProtocolError(f"checkpoint scores have shape {raw.shape}, expected {tuple(shape)}")
        return raw

    def newest(self) -> dict | None:
        """The newest state as written (its trees as references into the log, its array by name), its digest
        checked; None: no checkpoint."""
        found = self._read_newest()
        return None if found is None else found[0]

    def trees_done(self, state: dict | None) -> int:
        """How many trees ``state`` (one of this store's, as :meth:`newest` reads it) holds; 0 for none."""
        return 0 if state is None else _trees_done(state, self.path)

    def _read_newest(self) -> tuple[dict, str] | None:
        """The newest state's content and text.  One that does not hold together (a crash cut its in-place write
        short, or it was edited since) gives way to the state before it, where that one does: with a warning,
        that state takes its place at once, as a save that never began would have left it."""
        try:
            return self._read(self.path)
        except DataError as exc:
            prev = self._whole_previous()
            if prev is None:
                raise exc from None
            logger.warning("checkpoint %s does not hold together (a crash cut its writing short, or it was changed "
                           "since); the state before it, %s (%d trees), is whole and takes its place", self.path,
                           self.prev_path, prev[1])
            atomic_write_text(self.path, prev[0][1])
            return prev[0]

    def _whole_previous(self) -> tuple[tuple[dict, str], int] | None:
        """The state before the newest (its content and text) and its trees, where it holds together; else None."""
        try:
            found = self._read(self.prev_path)
            return None if found is None else (found, _trees_done(found[0], self.prev_path))
        except DataError:
            return None

    def _read(self, path: Path) -> tuple[dict, str] | None:
        """A state file's content and text, its digest checked (None: no file)."""
        if not path.exists():
            return None
        text = path.read_text(encoding="utf-8")
        try:
            state = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DataError(f"checkpoint {path} is corrupt: {exc}") from None
        if not isinstance(state, dict):
            raise DataError(f"checkpoint {path} is damaged: it holds a JSON {type(state).__name__}, not a state")
        return check_state_digest(state, path), text

    def load(self, at_least: int | None = None) -> dict | None:
        """The saved state with its trees and array restored; later saves append to the same tree log.

        Of the newest state and the one before it: with ``at_least`` (a follower told where its leader resumes),
        the one of fewer trees that holds at least that many (None where neither does); else with a ``limit`` (a
        party that leads the resume), the one of more trees that holds at most the limit (None, to start
        afresh, where neither does); else the newest.  A previous state chosen becomes the newest at once: the
        next save cuts the tree log back and writes the array file the newest names, so a crash during it would
        leave no newest state that held together."""
        found = self._read_newest()
        if found is None:
            return None
        newest = _trees_done(found[0], self.path)
        if at_least is not None and newest < at_least:
            return None
        limit = at_least if at_least is not None else self.limit
        if limit is not None and newest > limit:  # the previous state, where it fits
            prev = self._read(self.prev_path)
            k = None if prev is None else _trees_done(prev[0], self.prev_path)
            if k is not None and (k >= at_least if at_least is not None else k <= limit):
                atomic_write_text(self.path, prev[1])
                found = prev
            elif at_least is None:
                return None
        state, self._text = found
        path = self.path
        log = state.pop("tree_log", None)
        if log is not None:
            name, end, digest = log.get("file"), log.get("bytes"), log.get("sha256")
            log_path = self.path.with_name(str(name))
            if not isinstance(name, str) or Path(name).name != name or not isinstance(end, int) \
                    or not log_path.exists() or log_path.stat().st_size < end:
                raise DataError(f"checkpoint tree log {log_path} is missing or shorter than {path} says")
            with open(log_path, "rb") as fh:
                data = fh.read(end)
            log_hash = hashlib.sha256(data)
            if digest is not None and log_hash.hexdigest() != digest:
                raise DataError(f"checkpoint tree log {log_path} does not match its state {path}")
            chunks: dict[str, list] = {}
            state = _internalise(state, data, chunks, log_path, digest is not None)
            self._log, self._log_end, self._chunks, self._seen, self._lists = log_path, end, chunks, {}, {}
            self._log_hash, self._log_size = log_hash, log_path.stat().st_size
        self._array_named = None
        if "array_sha256" in state:
            name = state.pop("array_file", self.array_path.name)  # (states before 2026-11-25 name none)
            if name not in (self.array_path.name, self._alt_array_path.name):
                raise DataError(f"checkpoint {path} names the array file {name!r}, expected "
                                f"{self.array_path.name!r} or {self._alt_array_path.name!r}")
            array_path = self.path.with_name(name)
            data = array_path.read_bytes() if array_path.exists() else b""
            if hashlib.sha256(data).hexdigest() != state["array_sha256"]:
                raise DataError(f"checkpoint array {array_path} is missing or does not match {path}")
            state["array"] = np.load(io.BytesIO(data), allow_pickle=False)
            self._array_named = array_path
        return state


def _write_in_place(path: Path, text: str) -> None:
    with open_owner_only(path) as fh:
        fh.write(text)
        fh.truncate()


def _trees_done(state: dict, path: Path) -> int:
    n = state.get("trees_done")
    if type(n) is not int or n < 0:
        raise DataError(f"checkpoint {path} is damaged: trees_done is {n!r}, expected a count of trees")
    return n


def _internalise(obj, data: bytes, chunks: dict, where: Path, log_verified: bool):
    """Resolve the log references in a loaded state: [offset, length] into a log whose bytes the state's digest
    vouched for (``log_verified``), or [offset, length, sha256] of the text (states before 2026-11-25)."""
    if isinstance(obj, dict):
        if len(obj) == 1 and CHUNK in obj:
            ref = obj[CHUNK]
            ok = isinstance(ref, list) and len(ref) in (2, 3) and all(type(x) is int for x in ref[:2]) \
                and 0 <= ref[0] and 0 <= ref[1] and ref[0] + ref[1] <= len(data)
            text = data[ref[0]:ref[0] + ref[1]] if ok else b""
            sha = hashlib.sha256(text).hexdigest()
            if not ok or (sha != ref[2] if len(ref) == 3 else not log_verified):
                raise DataError(f"checkpoint tree log {where} does not match its state (reference {ref!r})")
            chunks[sha] = ref
            return json.loads(text)
        return {k: _internalise(v, data, chunks, where, log_verified) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_internalise(v, data, chunks, where, log_verified) for v in obj]
    return obj
