"""Checkpoints: finished trees go to an append-only log once; the state file refers to them."""

import json

import numpy as np
import pytest

from fedgrove.engine.gbdt import GBDTParams, train_gbdt
from fedgrove.exceptions import DataError
from fedgrove.runner.checkpoint import CheckpointStore
from tests.conftest import make_classification


@pytest.fixture(scope="module")
def trees():
    X, y = make_classification(800)
    return train_gbdt(GBDTParams(n_estimators=12, max_depth=4), X, y).trees


def _state(trees, k):
    return {"trees_done": k, "model": {"kind": "test", "trees": [t.to_dict() for t in trees[:k]]}}


def _saved(trees, tmp_path, n: int, scores: bool = True):
    """A store that has saved states of 1..n trees (each with scores of its tree count); returns its path."""
    path = tmp_path / "p.checkpoint.json"
    store = CheckpointStore(path)
    for k in range(1, n + 1):
        store.save(_state(trees, k), np.full((2, 1), float(k)) if scores else None)
    return path


def _logs(tmp_path):
    return sorted(tmp_path.glob("p.checkpoint.*.trees"))


def test_each_tree_is_written_once_and_reads_back_exactly(trees, tmp_path):
    store = CheckpointStore(tmp_path / "p.checkpoint.json")
    for k in range(1, 9):
        store.save(_state(trees, k), np.full((3, 1), float(k)))
    (log,) = _logs(tmp_path)
    texts = [t.to_dict().text().encode() for t in trees[:8]]
    assert log.read_bytes() == b"".join(texts)  # every tree once, in order
    assert (tmp_path / "p.checkpoint.json").stat().st_size < len(texts[0])  # references, not trees
    back = CheckpointStore(tmp_path / "p.checkpoint.json").load()
    assert json.dumps(back["model"]) == json.dumps(_state(trees, 8)["model"])
    assert back["trees_done"] == 8 and back["array"][0, 0] == 8.0


def test_resume_appends_to_the_log_and_drops_a_tail_no_state_vouches_for(trees, tmp_path):
    path = tmp_path / "p.checkpoint.json"
    first = CheckpointStore(path)
    for k in range(1, 5):
        first.save(_state(trees, k))
    (log,) = _logs(tmp_path)
    head = log.read_bytes()
    with open(log, "ab") as fh:  # a crash after appending tree 5, before the state named it
        fh.write(b'{"half a tree')
    resumed = CheckpointStore(path)
    state = resumed.load()
    assert state["trees_done"] == 4
    for k in range(5, 8):
        resumed.save(_state(trees, k))
    assert _logs(tmp_path) == [log] and log.read_bytes().startswith(head)
    assert log.stat().st_size == sum(len(t.to_dict().text().encode()) for t in trees[:7])
    assert json.dumps(CheckpointStore(path).load()["model"]) == json.dumps(_state(trees, 7)["model"])


def test_a_fresh_run_starts_a_new_log_and_removes_the_old_one_after_its_first_state(trees, tmp_path):
    path = tmp_path / "p.checkpoint.json"
    old = CheckpointStore(path)
    old.save(_state(trees, 3))
    (old_log,) = _logs(tmp_path)
    new = CheckpointStore(path)
    new.save(_state(trees[6:], 1))
    (new_log,) = _logs(tmp_path)
    assert new_log != old_log and not old_log.exists()
    assert json.dumps(CheckpointStore(path).load()["model"]) == json.dumps(_state(trees[6:], 1)["model"])


@pytest.mark.parametrize("damage", ["flip", "truncate", "missing"])
def test_a_damaged_tree_log_is_refused_by_name(trees, tmp_path, damage):
    path = tmp_path / "p.checkpoint.json"
    store = CheckpointStore(path)
    for k in range(1, 4):
        store.save(_state(trees, k))
    (log,) = _logs(tmp_path)
    data = bytearray(log.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0x01
        log.write_bytes(bytes(data))
    elif damage == "truncate":
        log.write_bytes(bytes(data[:-10]))
    else:
        log.unlink()
    with pytest.raises(DataError, match="tree log"):
        CheckpointStore(path).load()


def test_a_state_without_trees_round_trips(tmp_path):
    path = tmp_path / "p.checkpoint.json"
    CheckpointStore(path).save({"trees_done": 2, "model": {"splits": [[1, 2]]}})
    assert CheckpointStore(path).load() == {"trees_done": 2, "model": {"splits": [[1, 2]]}}


def test_the_state_names_each_tree_in_a_few_bytes(trees, tmp_path):
    # every save rewrites the state with a reference per tree so far: the log's bytes are vouched for by one
    # SHA-256, carried along as the log grows, not one per tree (which made the state 100 bytes a tree)
    path = tmp_path / "p.checkpoint.json"
    store = CheckpointStore(path)
    store.save(_state(trees, 1))
    one = path.stat().st_size
    store.save(_state(trees, 12))
    assert (path.stat().st_size - one) / 11 < 40  # the earlier layout: ~95
    state = json.loads(path.read_text())
    (log,) = _logs(tmp_path)
    import hashlib

    assert state["tree_log"]["sha256"] == hashlib.sha256(log.read_bytes()).hexdigest()


def test_a_state_of_the_earlier_layout_loads_and_resumes(trees, tmp_path):
    # states written before 2026-11-25 named each tree by [offset, length, sha256] and the log by its length
    import hashlib

    path = tmp_path / "p.checkpoint.json"
    texts = [json.dumps(t.to_dict()).encode() for t in trees[:3]]
    (tmp_path / "p.checkpoint.old.trees").write_bytes(b"".join(texts))
    refs, at = [], 0
    for text in texts:
        refs.append({"$chunk": [at, len(text), hashlib.sha256(text).hexdigest()]})
        at += len(text)
    import io

    buf = io.BytesIO()
    np.save(buf, np.full((2, 1), 3.0))  # and the scores in p.checkpoint.npy, which the state did not name
    (tmp_path / "p.checkpoint.npy").write_bytes(buf.getvalue())
    path.write_text(json.dumps({"trees_done": 3, "model": {"kind": "test", "trees": refs},
                                "tree_log": {"file": "p.checkpoint.old.trees", "bytes": at},
                                "array_sha256": hashlib.sha256(buf.getvalue()).hexdigest()}))
    store = CheckpointStore(path)
    back = store.load()
    assert json.dumps(back["model"]) == json.dumps(_state(trees, 3)["model"]) and back["array"][0, 0] == 3.0
    for k in range(4, 7):
        store.save(_state(trees, k))
    assert json.dumps(CheckpointStore(path).load()["model"]) == json.dumps(_state(trees, 6)["model"])
    bad = json.loads(path.read_text())
    del bad["tree_log"]["sha256"], bad["state_sha256"]  # a short reference is only as good as the log's digest
    path.write_text(json.dumps(bad))
    with pytest.raises(DataError, match="tree log"):
        CheckpointStore(path).load()


def test_scores_go_to_the_file_the_state_does_not_name_so_a_crash_while_writing_them_loses_nothing(trees, tmp_path):
    # each save writes the array in place into the other of two files, then the state naming it: a half-written
    # array file (a crash before the state) is the one the standing state does not name
    path = tmp_path / "p.checkpoint.json"
    store = CheckpointStore(path)
    named = []
    for k in range(1, 5):
        store.save(_state(trees, k), np.full((4, 2), float(k)))
        named.append(json.loads(path.read_text())["array_file"])
    assert named == ["p.checkpoint.npy", "p.checkpoint.alt.npy"] * 2
    (tmp_path / "p.checkpoint.npy").write_bytes(b"\x93NUMPY half")  # the next save's array, cut short
    back = CheckpointStore(path).load()
    assert back["trees_done"] == 4 and (back["array"] == 4.0).all()
    (tmp_path / "p.checkpoint.alt.npy").write_bytes(b"\x93NUMPY half")  # the file the state names: refused
    with pytest.raises(DataError, match="p.checkpoint.alt.npy"):
        CheckpointStore(path).load()


def test_a_resumed_store_writes_its_scores_beside_the_file_its_state_names(trees, tmp_path):
    path = _saved(trees, tmp_path, 3)
    resumed = CheckpointStore(path)
    assert resumed.load()["array"][0, 0] == 3.0  # named by the state: p.checkpoint.npy
    resumed.save(_state(trees, 4), np.full((2, 1), 4.0))
    assert json.loads(path.read_text())["array_file"] == "p.checkpoint.alt.npy"
    assert CheckpointStore(path).load()["array"][0, 0] == 4.0
    bad = json.loads(path.read_text())
    bad["array_file"] = "../elsewhere.npy"
    del bad["state_sha256"]  # (as a state written before 2026-11-26, which carried no digest of itself)
    path.write_text(json.dumps(bad))
    with pytest.raises(DataError, match="names the array file"):
        CheckpointStore(path).load()


@pytest.mark.parametrize("edit", ["value", "field", "digest", "list"])
def test_a_state_changed_after_its_run_wrote_it_is_never_resumed_from(trees, tmp_path, edit, caplog):
    # the state's own JSON was not vouched for: a leaf value or setting changed by hand, or by a disk, resumed
    # without a word (found by mutating a HybridTree host's checkpoint under --resume: 6 of 16 runs went on).
    # The state before it, where whole, takes its place (what a save cut short leaves); else it is refused by name
    path = tmp_path / "p.checkpoint.json"
    prev = tmp_path / "p.checkpoint.prev.json"
    store = CheckpointStore(path)
    for k in range(1, 3):
        store.save({**_state(trees, k), "leaves": [0.25, -0.5]}, np.full((2, 1), float(k)))
    text = path.read_text()
    assert json.loads(text)["leaves"] == [0.25, -0.5] and CheckpointStore(path).load()["leaves"] == [0.25, -0.5]
    changed = {"value": text.replace("0.25", "0.3"), "field": text.replace('"trees_done": 2', '"trees_done": 3'),
               "digest": text[:-66] + "0" * 64 + '"}', "list": json.dumps([1, 2])}[edit]
    assert changed != text
    path.write_text(changed)
    before = prev.read_text()
    with caplog.at_level("WARNING", logger="fedgrove"):
        back = CheckpointStore(path).load()
    assert back["trees_done"] == 1 and back["array"][0, 0] == 1.0 and back["leaves"] == [0.25, -0.5]
    assert json.dumps(back["model"]) == json.dumps(_state(trees, 1)["model"])
    assert f"checkpoint {path} does not hold together" in caplog.text and f"{prev} (1 trees), is whole" in caplog.text
    assert path.read_text() == before  # (it took the newest's place)
    path.write_text(changed)
    for damage in ("missing", "damaged"):  # and no state before it that holds together: refused by name
        if damage == "missing":
            prev.unlink()
        else:
            prev.write_text(before[:-3] + ('1' if before[-3] == '0' else '0') + '"}')  # (another digest)
        damaged = "it holds a JSON list, not a state" if edit == "list" else "its state does not match the SHA-256"
        with pytest.raises(DataError, match=f"checkpoint {path} is damaged: {damaged}"):
            CheckpointStore(path).load()
        assert path.read_text() == changed


def test_a_newest_state_a_crash_cut_short_gives_way_to_the_one_before_it(trees, tmp_path, monkeypatch, caplog):
    # after a run's first state the newest is written in place (a new file and a rename cost 10 times as much),
    # after the state before it: a crash while writing it leaves a text that fails to parse or its digest
    import fedgrove.runner.checkpoint as checkpoint

    path = _saved(trees, tmp_path, 4)
    store = CheckpointStore(path)
    store.load()
    real = checkpoint._write_in_place

    def torn(at):
        def write(p, text):
            if p != path:
                return real(p, text)
            with open(p, "r+") as fh:  # (the rest of the longer text before it stays, as a crash leaves it)
                fh.write(text[:at])
            raise KeyboardInterrupt
        return write

    longer = {**_state(trees, 5), "pad": "x" * 4000}  # longer than state 4: the old tail stays behind it
    for at in (0, 1, 20, 200, -3):  # (-3: all but its last three characters)
        whole = path.read_text()
        monkeypatch.setattr(checkpoint, "_write_in_place", torn(at))
        with pytest.raises(KeyboardInterrupt):
            store.save(longer, np.full((2, 1), 5.0))
        monkeypatch.undo()
        cut = path.read_text() != whole
        assert cut == (at >= 20 or at < 0)  # ('{' is where it was; '{"trees_done": 5' differs)
        caplog.clear()
        with caplog.at_level("WARNING", logger="fedgrove"):
            store = CheckpointStore(path)
            back = store.load()
        assert back["trees_done"] == 4 and back["array"][0, 0] == 4.0, at
        assert json.dumps(back["model"]) == json.dumps(_state(trees, 4)["model"])
        if not cut:  # (nothing of it written that differs: state 4 is whole where it was)
            assert caplog.text == ""
        else:
            assert f"checkpoint {path} does not hold together" in caplog.text and "(4 trees), is whole" in caplog.text
    store.save(_state(trees, 5), np.full((2, 1), 5.0))  # and the run goes on from there
    back = CheckpointStore(path).load()
    assert back["trees_done"] == 5 and back["array"][0, 0] == 5.0
    assert json.dumps(back["model"]) == json.dumps(_state(trees, 5)["model"])


def test_a_party_a_tree_ahead_steps_back_to_its_previous_state(trees, tmp_path):
    # a party may stop after its peers checkpointed a tree and before it did: the federation resumes from the
    # fewest trees every party holds, and one a tree ahead had only its newest state (no way back but to start
    # afresh: "has no checkpoint that far" or "its checkpoint holds 3 trees, party0 resumes at 2")
    path = _saved(trees, tmp_path, 4)
    store = CheckpointStore(path)
    assert store.trees_done(store.newest()) == 4
    # (None: start afresh; a limit of 3 steps back to the previous state, which is then the newest)
    for limit, expected in ((None, 4), (5, 4), (4, 4), (2, None), (0, None), (3, 3), (4, 3)):
        back = CheckpointStore(path)
        back.limit = limit
        state = back.load()
        if expected is None:
            assert state is None
            continue
        assert state["trees_done"] == expected and state["array"][0, 0] == expected, limit
        assert json.dumps(state["model"]) == json.dumps(_state(trees, expected)["model"])
    resumed = CheckpointStore(path)  # resumed from tree 3: its next states follow on from there
    resumed.limit = 3
    resumed.load()
    assert CheckpointStore(path).newest()["trees_done"] == 3  # the state stepped back to is the newest now
    resumed.save(_state(trees[6:], 4), np.full((2, 1), 40.0))
    newest = CheckpointStore(path).load()
    assert newest["array"][0, 0] == 40.0
    assert json.dumps(newest["model"]) == json.dumps(_state(trees[6:], 4)["model"])
    again = CheckpointStore(path)
    again.limit = 3
    assert again.load()["array"][0, 0] == 3.0  # the previous state, its scores intact (and the newest again)
    CheckpointStore(path).save(_state(trees, 1))  # a fresh run: no earlier run's state to step back to
    assert not (tmp_path / "p.checkpoint.prev.json").exists()


def test_a_checkpoint_is_due_after_every_nth_round_and_after_the_last(tmp_path):
    store = CheckpointStore(tmp_path / "p.checkpoint.json")
    assert [k for k in range(12) if store.due(k, 11)] == list(range(12))  # (every = 1: the default)
    store.every = 4
    assert [k for k in range(12) if store.due(k, 11)] == [0, 4, 8, 11]
    assert [k for k in range(12) if store.due(k)] == [0, 4, 8]  # (a feature holder: the total unknown)
    assert [k for k in range(9) if store.due(k, 8)] == [0, 4, 8]


def test_a_party_a_checkpoint_ahead_steps_back_to_its_previous_one_rounds_apart(trees, tmp_path):
    # checkpoints every 3 rounds of 7: rounds 3, 6 and 7 (the last); a peer that stopped before checkpointing
    # round 6 holds round 3, and the party that checkpointed 6 steps back to its state before it; a follower
    # told to resume at a round takes the state of fewer rounds that holds it
    path = tmp_path / "p.checkpoint.json"

    def saved(rounds):
        store = CheckpointStore(path)
        store.every = 3
        written = [k for k in range(1, rounds + 1) if store.due(k, rounds)]
        for k in written:
            store.save(_state(trees, k), np.full((2, 1), float(k)))
        return written

    assert saved(7) == [3, 6, 7]
    for limit, expected in ((8, 7), (7, 7), (6, 6), (5, None), (3, None)):
        saved(7)
        back = CheckpointStore(path)
        back.limit = limit
        state = back.load()
        assert (state if state is None else (state["trees_done"], state["array"][0, 0])) == \
            (expected if expected is None else (expected, expected)), limit
    for at_least, expected in ((3, 6), (6, 6), (7, 7), (8, None)):
        assert saved(6) == [3, 6] and saved(7) == [3, 6, 7]
        state = CheckpointStore(path).load(at_least=at_least)
        assert (state if state is None else state["trees_done"]) == expected, at_least


def test_a_previous_state_cut_short_by_a_crash_is_refused_by_name(trees, tmp_path):
    # the previous state is written in place: a crash while writing it leaves a state its digest refuses
    path = _saved(trees, tmp_path, 3, scores=False)
    prev = tmp_path / "p.checkpoint.prev.json"
    prev.write_text(prev.read_text()[:-30] + '"}')
    back = CheckpointStore(path)
    back.limit = 2
    with pytest.raises(DataError, match="p.checkpoint.prev.json is (corrupt|damaged)"):
        back.load()
    assert CheckpointStore(path).load()["trees_done"] == 3  # the newest state is as it was


def test_a_crash_in_the_first_save_after_a_step_back_leaves_the_state_stepped_back_to(trees, tmp_path, monkeypatch):
    # the first save after a step back cuts the tree log back and overwrites the array file the newest state named:
    # had that state stayed the newest, a crash before the new one was written left none that held together
    import fedgrove.runner.checkpoint as checkpoint

    path = _saved(trees, tmp_path, 4)
    resumed = CheckpointStore(path)
    resumed.limit = 3
    resumed.load()

    def crash(*args, **kwargs):
        raise OSError("no space left on device")

    real = checkpoint._write_in_place
    monkeypatch.setattr(checkpoint, "_write_in_place",  # the new state is never written (the one before it is)
                        lambda p, text: crash() if p == path else real(p, text))
    with pytest.raises(OSError):
        resumed.save(_state(trees[6:], 4), np.full((2, 1), 40.0))
    monkeypatch.undo()
    back = CheckpointStore(path).load()
    assert back["trees_done"] == 3 and back["array"][0, 0] == 3.0
    assert json.dumps(back["model"]) == json.dumps(_state(trees, 3)["model"])


def test_lists_of_trees_carried_from_save_to_save_read_back_as_saved(trees, tmp_path):
    # a save reuses the references' text of the last save's list that starts with the same trees: lists that
    # grow, are cut short, change a tree, appear twice, or hold other things too must all read back as saved,
    # with the digest that json.dumps of the read state gives (load checks it)
    dicts = [t.to_dict() for t in trees]
    other = dict(dicts[3])  # (an equal dict, not the same object: its text is the log's already)
    states = [{"trees_done": k, "model": {"trees": dicts[:k]}} for k in (1, 2, 5, 3, 6)]
    states += [{"trees_done": 6, "model": {"trees": dicts[:6]}, "again": dicts[:6], "short": dicts[:2]},
               {"trees_done": 6, "model": {"trees": dicts[:3] + [trees[9].to_dict()] + dicts[4:6]}},
               {"trees_done": 6, "model": {"trees": dicts[:2] + [other, 7, None, [1.5]]}},
               {"trees_done": 7, "model": {"trees": list(reversed(dicts[:7]))}, "pair": (dicts[0], dicts[1])}]
    store = CheckpointStore(tmp_path / "p.checkpoint.json")
    for state in states:
        store.save(state)
        back = CheckpointStore(tmp_path / "p.checkpoint.json").load()
        assert json.dumps(back) == json.dumps(state)


def test_the_parties_resume_after_the_fewest_trees_a_party_that_grows_none_follows_and_a_negative_count_is_refused():
    from fedgrove.exceptions import ProtocolError
    from fedgrove.runner.messages import Checkpointed
    from fedgrove.runner.run import agree_resume
    from fedgrove.transport.inprocess import InProcessHub, run_parties

    def agreed(counts):
        roles = {p: (lambda n: lambda ch: agree_resume(n, ch))(n) for p, n in counts.items()}
        return run_parties(InProcessHub(list(counts)), roles, timeout=10)[0]

    assert agreed({"host": 3, "guest0": 2, "guest1": 3}) == {"host": 2, "guest0": 2, "guest1": 2}
    # a HybridTree guest of no layers never checkpoints: the others resume where they are
    assert agreed({"host": 3, "guest0": None, "guest1": None}) == {"host": 3, "guest0": 3, "guest1": 3}
    assert agreed({"host": 0, "guest0": None}) == {"host": 0, "guest0": 0}

    def liar(ch):
        with ch.scope(stage="resume"):
            ch.broadcast("checkpointed", Checkpointed(-5), ["host"])
            return ch.gather("checkpointed", Checkpointed, ["host"])

    with pytest.raises(ProtocolError, match=r"liar \(-5\) said its checkpoint holds a negative number"):
        run_parties(InProcessHub(["host", "liar"]), {"host": lambda ch: agree_resume(2, ch), "liar": liar}, timeout=10)


def test_every_checkpoint_file_is_readable_by_its_owner_only_as_the_model_files_are(trees, tmp_path):
    # the trees log, the scores and the previous state hold what the party learnt, as the state and model do
    path = tmp_path / "p.checkpoint.json"
    store = CheckpointStore(path)
    store.save(_state(trees, 1), np.full((2, 1), 1.0))
    (tmp_path / "p.checkpoint.alt.npy").touch(mode=0o644)  # left readable by others (an earlier version, a umask)
    (tmp_path / "p.checkpoint.alt.npy").chmod(0o644)
    for k in range(2, 4):
        store.save(_state(trees, k), np.full((2, 1), float(k)))
    files = {p.name for p in tmp_path.iterdir()}
    assert files == {"p.checkpoint.alt.npy", "p.checkpoint.json", "p.checkpoint.npy", "p.checkpoint.prev.json",
                     _logs(tmp_path)[0].name}
    modes = {p.name: p.stat().st_mode & 0o777 for p in tmp_path.iterdir()}
    assert modes == dict.fromkeys(files, 0o600)
    assert CheckpointStore(path).load()["trees_done"] == 3
