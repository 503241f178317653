"""Shared fixtures.  Real datasets come from the data directory (../shared/data
in this workplace, or FEDGROVE_DATA_DIR); tests that need one skip with the
reason when it is absent."""

from __future__ import annotations

import numpy as np
import pytest

from fedgrove.data.datasets import dataset_files, load_dataset
from fedgrove.exceptions import DataError


def _dataset_or_skip(name):
    try:
        dataset_files(name)
    except DataError as exc:
        pytest.skip(f"dataset {name} not available: {exc}")
    return load_dataset(name)


@pytest.fixture(scope="session")
def a9a():
    return _dataset_or_skip("a9a")


@pytest.fixture(scope="session")
def cod_rna():
    return _dataset_or_skip("cod-rna")


@pytest.fixture(scope="session")
def spambase():
    return _dataset_or_skip("spambase")


@pytest.fixture(scope="session")
def waveform():
    return _dataset_or_skip("waveform")


@pytest.fixture
def rng():
    return np.random.default_rng(12345)


@pytest.fixture
def shifted_orders(monkeypatch) -> list:
    """A list that gets, for every ``HEContext.compressed_sums`` call from here on, whether it took the shifted
    order (the gradient ciphertexts multiplied into place, copies kept on them) rather than Horner's rule."""
    from fedgrove.crypto.he import HEContext

    taken = []
    compressed_sums = HEContext.compressed_sums

    def recording(self, ct, groups, slot_bits, n_slots):
        out = compressed_sums(self, ct, groups, slot_bits, n_slots)
        taken.append(bool(ct.shifted.get(slot_bits)))
        return out

    monkeypatch.setattr(HEContext, "compressed_sums", recording)
    return taken


def make_classification(n=2000, d=6, seed=0, missing=0.0):
    r = np.random.default_rng(seed)
    X = r.normal(size=(n, d))
    y = (X[:, 0] + 0.7 * X[:, 1] * X[:, 2] + 0.3 * r.normal(size=n) > 0).astype(float)
    if missing:
        X[r.random(X.shape) < missing] = np.nan
    return X, y


def replaying_own_rows(sizes):
    """An engine ``RoundSampler`` that replays the rows the parties of a horizontal federation draw for
    themselves each round (``subsample``: party ``i`` of ``sizes[i]`` rows, its generator seeded
    ``[seed, 67, i]``), as rows of their union in party order, and draws the features as the federation does
    (the engine's without row sampling).  Patch it in as ``fedgrove.engine.gbdt.RoundSampler``."""
    from dataclasses import replace

    from fedgrove.engine.gbdt import RoundSampler

    offsets = np.cumsum([0, *sizes[:-1]])

    class OwnRows(RoundSampler):
        def __init__(self, p, n_rows, n_features, seed=None):
            super().__init__(replace(p, subsample=1.0), None, n_features)
            self.parties = [RoundSampler(p, k, n_features, seed=[p.seed, 67, i]) for i, k in enumerate(sizes)]

        def next(self):
            rows = np.concatenate([s.next()[0] + o for s, o in zip(self.parties, offsets)])
            return rows, super().next()[1]

    return OwnRows


def gradient_arrays_left_alive(monkeypatch, sizes) -> list:
    """Watch the unencrypted test backend's gradient arrays: those ``encrypt`` makes (the key holder's) and those
    ``deserialize`` reads (the feature holders'), of a length in ``sizes``.  Returns a list that gets, each time a
    party makes or reads such an array, a line for every earlier one of that party still alive: a party that
    let go of a tree's gradients before the next tree's leaves it empty (each array is most of a party's memory
    at scale: HEU holds a 2048-bit OU ciphertext in about 850 bytes)."""
    import threading
    import weakref

    from fedgrove.crypto.he import PlainContext

    alive, made = [], {}
    encrypt, deserialize = PlainContext.encrypt, PlainContext.deserialize

    def watch(how, ct):
        if ct.size in sizes:
            mine = made.setdefault((how, threading.get_ident()), [])
            alive.extend(f"{how} #{k} of thread {threading.get_ident()} still alive at #{len(mine)}"
                         for k, ref in enumerate(mine) if ref() is not None)
            mine.append(weakref.ref(ct))
        return ct

    monkeypatch.setattr(PlainContext, "encrypt", lambda self, values: watch("encrypt", encrypt(self, values)))
    monkeypatch.setattr(PlainContext, "deserialize", lambda self, data: watch("deserialize", deserialize(self, data)))
    return alive


def altering_received(monkeypatch, party: str, kind: type, change) -> list:
    """Every ``kind`` message ``party`` receives goes through ``change(message) -> message`` first (a peer that
    sends what it should not); returns the list of messages changed, for the test to check it was used."""
    from fedgrove.transport.channel import Channel

    recv, changed = Channel.recv, []

    def altered(self, peer, tag, expect=None):
        msg = recv(self, peer, tag, expect)
        if self.party == party and isinstance(msg, kind):
            msg = change(msg)
            changed.append(msg)
        return msg

    monkeypatch.setattr(Channel, "recv", altered)
    return changed
