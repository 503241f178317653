"""Per-party checkpoints: after each completed tree a party writes its state atomically.

Restarting every party with ``--resume`` continues from the last tree all of
them completed and gives exactly the model of an uninterrupted run (the
protocols are deterministic given the seed; encryption randomness never
reaches the model).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from pathlib import Path

import numpy as np

from fedgrove import jsontext
from fedgrove.engine.model import atomic_write_text
from fedgrove.exceptions import DataError


class CheckpointStore:
    """A JSON state file, plus an optional array (e.g. raw scores) in a side ``.npy`` file."""

    def __init__(self, path):
        self.path = Path(path)
        self.array_path = self.path.with_suffix(".npy")

    def save(self, state: dict, array: np.ndarray | None = None) -> None:
        state = dict(state)
        if array is not None:
            buf = io.BytesIO()
            np.save(buf, np.ascontiguousarray(array), allow_pickle=False)
            data = buf.getvalue()
            tmp = self.array_path.with_name(self.array_path.name + ".tmp")
            tmp.write_bytes(data)
            os.replace(tmp, self.array_path)
            state["array_sha256"] = hashlib.sha256(data).hexdigest()
        atomic_write_text(self.path, jsontext.dumps(state))  # written last: it vouches for the array

    @staticmethod
    def resume_state(checkpoint, resume: bool, tree: int, party: str, leader: str) -> dict:
        """The state to resume from at ``tree`` (announced by ``leader``), or a clear error when there is none."""
        from fedgrove.exceptions import ProtocolError

        state = checkpoint.load() if (checkpoint is not None and resume) else None
        if state is None or state["trees_done"] < tree:
            raise ProtocolError(f"{party}: {leader} resumes at tree {tree} but this party has no checkpoint that far "
                                f"(run it with --resume and its checkpoint)")
        return state

    @staticmethod
    def scores(state: dict, shape: tuple) -> np.ndarray:
        """The training scores saved with a checkpoint, checked against the shape this party expects."""
        from fedgrove.exceptions import ProtocolError

        raw = np.ascontiguousarray(state["array"], dtype=np.float64)
        if raw.shape != tuple(shape):
            raise ProtocolError(f"checkpoint scores have shape {raw.shape}, expected {tuple(shape)}")
        return raw

    def load(self) -> dict | None:
        if not self.path.exists():
            return None
        try:
            state = json.loads(self.path.read_text())
        except json.JSONDecodeError as exc:
            raise DataError(f"checkpoint {self.path} is corrupt: {exc}") from None
        if "array_sha256" in state:
            data = self.array_path.read_bytes() if self.array_path.exists() else b""
            if hashlib.sha256(data).hexdigest() != state["array_sha256"]:
                raise DataError(f"checkpoint array {self.array_path} is missing or does not match {self.path}")
            state["array"] = np.load(io.BytesIO(data), allow_pickle=False)
        return state
