"""Real processes on 127.0.0.1: `fedgrove party` over gRPC with mutual TLS against `fedgrove simulate`."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import pandas as pd

from fedgrove.crypto.certs import create_federation_certs
from tests.integration.test_grpc import _port

PARAMS = """
[federation]
protocol = "vertical"
seed = 3
timeout = {timeout}

[he]
scheme = "ou"
key_bits = 2048

[params]
objective = "binary"
n_estimators = {trees}
max_depth = 3
max_bins = 16
"""


def _write_configs(tmp_path: Path, role: dict, labelled: str, common: str) -> list[str]:
    """Certificates, a federation config (output ``sim``) and one party config per party (output ``grpc``)."""
    names = list(role)
    lines = {n: ("" if role[n] in ("master", "aggregator") else f'data = "{n}.csv"\n')
             + ('label = "label"\n' if n == labelled else "") for n in names}
    _federation_configs(tmp_path, role, lines, common)
    return names


def _federation_configs(tmp_path: Path, role: dict, lines: dict, common: str) -> None:
    """Certificates for the parties of ``role`` ({name: role}), a federation config (output ``sim``) and one party
    config per party on a free local port (output ``grpc``): ``common`` their shared tables, ``lines`` the lines of
    each party's table past its name and role."""
    names = list(role)
    create_federation_certs(tmp_path / "certs", names)
    ports = {n: _port() for n in names}
    fed = common + "".join(f'\n[[party]]\nname = "{n}"\nrole = "{role[n]}"\n' + lines[n]
                           for n in names) + '\n[output]\ndir = "sim"\n'
    (tmp_path / "federation.toml").write_text(fed)
    for n in names:
        peers = "".join(f'{m} = "127.0.0.1:{ports[m]}"\n' for m in names if m != n)
        roles = "".join(f'{m} = "{role[m]}"\n' for m in names if m != n)
        (tmp_path / f"{n}.toml").write_text(
            f'[party]\nname = "{n}"\nrole = "{role[n]}"\n' + lines[n]
            + f'listen = "127.0.0.1:{ports[n]}"\ncerts = "certs"\n\n[peers]\n{peers}\n[roles]\n{roles}'
            + common + '\n[output]\ndir = "grpc"\n')


def _setup(tmp_path: Path, trees=2, timeout=30, rows=400):
    r = np.random.default_rng(0)
    X = r.normal(size=(rows, 9))
    y = (X[:, 0] + X[:, 5] - X[:, 7] > 0).astype(int)
    names = ["party0", "party1", "party2"]
    cols = [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    ids = r.permutation(rows)  # each party's file lists the instances in its own order
    for k, (name, c) in enumerate(zip(names, cols)):
        df = pd.DataFrame(X[:, c], columns=[f"x{j}" for j in c])
        df.insert(0, "_id", np.arange(rows))
        if k == 0:
            df["label"] = y
        df.iloc[np.roll(ids, k * 7)].to_csv(tmp_path / f"{name}.csv", index=False)
    role = {n: "active" if k == 0 else "passive" for k, n in enumerate(names)}
    return _write_configs(tmp_path, role, "party0", PARAMS.format(trees=trees, timeout=timeout))


def _start(tmp_path, name):
    return subprocess.Popen([sys.executable, "-m", "fedgrove.cli.main", "party", str(tmp_path / f"{name}.toml")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


def test_same_seed_same_model_in_process_and_over_grpc(tmp_path):
    names = _setup(tmp_path)
    from fedgrove.cli.main import main

    assert main(["simulate", str(tmp_path / "federation.toml")]) == 0
    procs = [_start(tmp_path, n) for n in reversed(names)]
    outs = [p.communicate(timeout=180) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [o[1][-2000:] for o in outs]
    for n in names:
        sim, grpc_run = tmp_path / "sim" / f"{n}.model.json", tmp_path / "grpc" / f"{n}.model.json"
        assert sim.read_bytes() == grpc_run.read_bytes()


def _parties_over_grpc_in_threads(tmp_path, names, predict_only: bool = False, resume: bool = False) -> None:
    """Each party's config run by run_party in a thread of this process (so that a test can patch the
    transport), over gRPC with mutual TLS (``predict_only``: as `fedgrove party --predict`, from the model
    files; ``resume``: as `fedgrove party --resume`); fails with the parties' errors."""
    import threading

    from fedgrove.runner.config import load_party
    from fedgrove.runner.run import run_party

    errors = {}

    def party(name):
        try:
            run_party(*load_party(tmp_path / f"{name}.toml"), predict_only=predict_only, resume=resume)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors[name] = exc

    threads = [threading.Thread(target=party, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert not errors, errors


def test_messages_over_grpc_in_pieces_give_the_simulated_model(tmp_path, monkeypatch):
    # the encrypted gradients (400 rows, about 100 kB) and the encrypted histograms travel in pieces of 4 kB,
    # several in flight at once and put together by the receiver: the same model files as in one process
    from fedgrove.transport import grpc_backend
    from fedgrove.cli.main import main

    names = _setup(tmp_path)
    assert main(["simulate", str(tmp_path / "federation.toml")]) == 0
    monkeypatch.setattr(grpc_backend, "CHUNK_BYTES", 4096)
    pieces = []
    add_piece = grpc_backend.GrpcChannel._add_piece
    monkeypatch.setattr(grpc_backend.GrpcChannel, "_add_piece",
                        lambda self, env: pieces.append(env.size) or add_piece(self, env))
    _parties_over_grpc_in_threads(tmp_path, names)
    assert len(pieces) > 100 and max(pieces) > 90_000
    for n in names:
        sim, grpc_run = tmp_path / "sim" / f"{n}.model.json", tmp_path / "grpc" / f"{n}.model.json"
        assert sim.read_bytes() == grpc_run.read_bytes()


def _simulated_and_over_grpc_alike(tmp_path, names) -> None:
    """``fedgrove simulate`` of the federation config, then its parties over gRPC: every party's model file the
    same, byte for byte."""
    from fedgrove.cli.main import main

    assert main(["simulate", str(tmp_path / "federation.toml")]) == 0
    _parties_over_grpc_in_threads(tmp_path, names)
    for n in names:
        sim, grpc_run = tmp_path / "sim" / f"{n}.model.json", tmp_path / "grpc" / f"{n}.model.json"
        assert sim.read_bytes() == grpc_run.read_bytes()


def test_align_psi_over_grpc_gives_the_simulated_model(tmp_path):
    # parties holding overlapping instances, each dropping rows of its own: the private set intersection runs
    # the same messages over gRPC as in one process, and the models are the same

    names = _setup(tmp_path)
    for k, n in enumerate(names):
        df = pd.read_csv(tmp_path / f"{n}.csv")
        df[df["_id"] % 7 != k].to_csv(tmp_path / f"{n}.csv", index=False)
    for f in [tmp_path / "federation.toml", *(tmp_path / f"{n}.toml" for n in names)]:
        f.write_text(f.read_text().replace('protocol = "vertical"', 'protocol = "vertical"\nalign = "psi"'))
    _simulated_and_over_grpc_alike(tmp_path, names)
    stats = json.loads((tmp_path / "grpc" / "party1.stats.json").read_text())
    assert stats["total_sent"] > 32 * 2 * 300  # its blinded IDs, and the active party's blinded again


def test_row_weights_over_grpc_give_the_simulated_model(tmp_path):
    # the active party's weight column (some weights 0: those instances are left out of every tree, as a
    # subsample leaves instances out), with its rows in its own order: the same model over gRPC as in one process
    from fedgrove.cli.main import main

    names = _setup(tmp_path)
    assert main(["simulate", str(tmp_path / "federation.toml")]) == 0
    unweighted = (tmp_path / "sim" / "party0.model.json").read_bytes()
    df = pd.read_csv(tmp_path / "party0.csv")
    df["w"] = np.random.default_rng(1).integers(0, 4, len(df)) * 0.75
    df.to_csv(tmp_path / "party0.csv", index=False)
    for f in (tmp_path / "federation.toml", tmp_path / "party0.toml"):
        f.write_text(f.read_text().replace('label = "label"\n', 'label = "label"\nweight = "w"\n'))
    _simulated_and_over_grpc_alike(tmp_path, names)
    model = json.loads((tmp_path / "sim" / "party0.model.json").read_text())
    assert model["metadata"]["weight"] == "w" and (tmp_path / "sim" / "party0.model.json").read_bytes() != unweighted


def test_a_message_over_the_configured_limit_stops_the_run_naming_the_setting(tmp_path, capsys):
    from fedgrove.cli.main import main

    _setup(tmp_path, trees=1, rows=5000)  # the encrypted gradients: about 1.3 MB
    cfg = tmp_path / "federation.toml"
    cfg.write_text(cfg.read_text().replace("timeout = 30", "timeout = 30\nmax_message_mb = 1"))
    assert main(["simulate", str(cfg)]) == 5
    err = " ".join(capsys.readouterr().err.split())
    assert "party0: refusing to send" in err and "over the limit of 1048576 bytes (1 MB); raise [federation] " \
                                                 "max_message_mb in every party's config" in err, err
    cfg.write_text(cfg.read_text().replace("max_message_mb = 1", "max_message_mb = 2"))
    assert main(["simulate", str(cfg)]) == 0


def _start_resume(tmp_path, name):
    return subprocess.Popen([sys.executable, "-m", "fedgrove.cli.main", "party", str(tmp_path / f"{name}.toml"),
                             "--resume"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _kill_once_checkpointed(procs: dict, victim: str, ckpt: Path, trees: int = 3, signum=signal.SIGKILL) -> None:
    """SIGKILL (or ``signum``) ``victim`` mid-training: once its checkpoint holds ``trees`` trees, while it still
    runs."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if ckpt.exists() and json.loads(ckpt.read_text())["trees_done"] >= trees:
            break
        time.sleep(0.1)
    if procs[victim].poll() is not None:  # it ended before it could be killed: say why
        errors = {n: p.communicate(timeout=60)[1][-1500:] for n, p in procs.items()}
        raise AssertionError(f"{victim} ended (exit {procs[victim].returncode}) before its checkpoint held "
                             f"{trees} trees: {errors}")
    procs[victim].send_signal(signum)


def _resume_all(tmp_path, names: list[str]) -> None:
    """Restart every party with --resume (a longer timeout, as a loaded machine may need: the timeout does not
    change the model); all succeed."""
    for n in names:
        cfg = tmp_path / f"{n}.toml"
        cfg.write_text(cfg.read_text().replace("timeout = 6\n", "timeout = 60\n"))
    procs = [_start_resume(tmp_path, n) for n in reversed(names)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0] * len(names), [o[1][-2000:] for o in outs]


def test_a_killed_party_stops_the_others_and_resume_gives_the_uninterrupted_model(tmp_path):
    names = _setup(tmp_path, trees=30, timeout=6, rows=3000)
    procs = {n: _start(tmp_path, n) for n in names}
    ckpt = tmp_path / "grpc" / "party1.checkpoint.json"
    _kill_once_checkpointed(procs, "party1", ckpt)  # mid-training
    t0 = time.monotonic()
    results = {n: procs[n].communicate(timeout=60) for n in ("party0", "party2")}
    elapsed = time.monotonic() - t0
    assert procs["party0"].returncode not in (0, None) and procs["party2"].returncode not in (0, None)
    assert "party1" in results["party0"][1]            # the active names the missing party
    assert "Traceback" not in results["party0"][1] + results["party2"][1]
    assert elapsed < 6 * 3 + 10
    # restart everyone with --resume: the result equals an uninterrupted (simulated) run
    done_before = json.loads((tmp_path / "grpc" / "party0.checkpoint.json").read_text())["trees_done"]
    assert 0 < done_before < 30
    _resume_all(tmp_path, names)
    from fedgrove.cli.main import main

    assert main(["simulate", str(tmp_path / "federation.toml")]) == 0
    for n in names:
        sim, grpc_run = tmp_path / "sim" / f"{n}.model.json", tmp_path / "grpc" / f"{n}.model.json"
        assert sim.read_bytes() == grpc_run.read_bytes()


def test_a_party_stopped_by_sigterm_exits_143_and_the_others_stop_at_once_saying_to_resume(tmp_path):
    # `kill` or `docker stop` sends SIGTERM, which ended the process on the spot: its peers waited out their
    # timeout (60 s here) to blame it.  It now ends as Ctrl-C does: the peers are told at once, and --resume
    # continues to the uninterrupted model
    names = _setup(tmp_path, trees=30, timeout=60, rows=3000)
    procs = {n: _start(tmp_path, n) for n in names}
    _kill_once_checkpointed(procs, "party1", tmp_path / "grpc" / "party1.checkpoint.json", signum=signal.SIGTERM)
    t0 = time.monotonic()
    results = {n: procs[n].communicate(timeout=120) for n in names}
    elapsed = time.monotonic() - t0
    assert procs["party1"].returncode == 143 and "stopped (SIGTERM)" in results["party1"][1], results["party1"][1]
    for n in ("party0", "party2"):
        err = " ".join(results[n][1].split())
        assert procs[n].returncode == 5, err[-2000:]
        assert "party party1 failed: it was stopped (SIGTERM); restart every party with --resume" in err, err
    assert "Traceback" not in "".join(r[1] for r in results.values())
    assert elapsed < 30  # told, not timed out
    _resume_all(tmp_path, names)
    from fedgrove.cli.main import main

    assert main(["simulate", str(tmp_path / "federation.toml")]) == 0
    for n in names:
        sim, grpc_run = tmp_path / "sim" / f"{n}.model.json", tmp_path / "grpc" / f"{n}.model.json"
        assert sim.read_bytes() == grpc_run.read_bytes()


def test_horizontal_federation_runs_from_a_config(tmp_path):
    r = np.random.default_rng(1)
    X = r.normal(size=(600, 4))
    y = (X[:, 0] > 0).astype(int)
    for k in range(2):
        df = pd.DataFrame(X[k::2], columns=list("abcd"))
        df["label"] = y[k::2]
        df.to_csv(tmp_path / f"c{k}.csv", index=False)
    (tmp_path / "fed.toml").write_text(
        '[federation]\nprotocol = "horizontal"\n[params]\nn_estimators = 3\nmax_depth = 3\n'
        '[[party]]\nname = "agg"\nrole = "aggregator"\n'
        '[[party]]\nname = "c0"\nrole = "client"\ndata = "c0.csv"\nlabel = "label"\n'
        '[[party]]\nname = "c1"\nrole = "client"\ndata = "c1.csv"\nlabel = "label"\n[output]\ndir = "out"\n')
    from fedgrove.cli.main import main
    from fedgrove.engine.model import load_model

    assert main(["simulate", str(tmp_path / "fed.toml")]) == 0
    models = [load_model(tmp_path / "out" / f"{n}.model.json") for n in ("agg", "c0", "c1")]
    assert all(np.array_equal(mm.predict(X), models[0].predict(X)) for mm in models)
    assert np.mean(models[0].predict(X) == y) > 0.9


def test_row_and_column_sampling_resume_to_the_uninterrupted_model_vertical_and_horizontal(tmp_path):
    # colsample_bytree (and the vertical protocol's subsample): the leader draws the engine's features (and rows)
    # each round; with the horizontal protocol's subsample every client draws its own rows; a resumed run draws
    # those of the rounds it skips again, so its later rounds sample what the uninterrupted run's did

    names = _setup(tmp_path, trees=2)  # vertical: an active and two passive parties
    vertical = (tmp_path / "federation.toml").read_text().replace(
        "max_bins = 16\n", "max_bins = 16\ncolsample_bytree = 0.4\nsubsample = 0.7\n")  # (its rows too)
    whole = pd.read_csv(tmp_path / "party0.csv").drop(columns="_id")
    for k in range(3):  # horizontal: three clients with the active party's features and labels, a third each
        whole.iloc[k::3].to_csv(tmp_path / f"client{k}.csv", index=False)
    horizontal = ('[federation]\nprotocol = "horizontal"\nseed = 3\n[params]\nn_estimators = 2\nmax_depth = 3\n'
                  'max_bins = 16\ncolsample_bytree = 0.4\nsubsample = 0.7\n'
                  '[[party]]\nname = "agg"\nrole = "aggregator"\n'
                  + "".join(f'[[party]]\nname = "client{k}"\nrole = "client"\ndata = "client{k}.csv"\n'
                            f'label = "label"\n' for k in range(3)) + '[output]\ndir = "sim"\n')
    _resumed_as_uninterrupted(tmp_path, {"vertical": (vertical, names[0]), "horizontal": (horizontal, "agg")})


def test_weighted_runs_with_row_sampling_resume_to_the_uninterrupted_model(tmp_path):
    # row weights (some 0) with subsample: the vertical active party and each horizontal client draw among their
    # rows of positive weight; a resumed run draws the skipped rounds' rows again among the same rows
    names = _setup(tmp_path, trees=2)
    active = pd.read_csv(tmp_path / "party0.csv")
    active["w"] = np.random.default_rng(2).integers(0, 3, len(active)) * 1.5
    active.to_csv(tmp_path / "party0.csv", index=False)
    vertical = (tmp_path / "federation.toml").read_text() \
        .replace("max_bins = 16\n", "max_bins = 16\nsubsample = 0.7\n") \
        .replace('label = "label"\n', 'label = "label"\nweight = "w"\n')
    whole = active.drop(columns="_id")
    for k in range(2):
        whole.iloc[k::2].to_csv(tmp_path / f"client{k}.csv", index=False)
    horizontal = ('[federation]\nprotocol = "horizontal"\nseed = 3\n[params]\nn_estimators = 2\nmax_depth = 3\n'
                  'max_bins = 16\nsubsample = 0.7\n[[party]]\nname = "agg"\nrole = "aggregator"\n'
                  + "".join(f'[[party]]\nname = "client{k}"\nrole = "client"\ndata = "client{k}.csv"\n'
                            f'label = "label"\nweight = "w"\n' for k in range(2)) + '[output]\ndir = "sim"\n')
    models = _resumed_as_uninterrupted(tmp_path, {"vertical": (vertical, names[0]),
                                                  "horizontal": (horizontal, "agg")})
    # every tree grown on 70% of the rows of positive weight (the clients': of each client's)
    kept = [int((whole["w"].iloc[k::2] > 0).sum()) for k in range(2)]
    for protocol, grown_on in (("vertical", round(0.7 * sum(kept))), ("horizontal", sum(round(0.7 * n) for n in kept))):
        assert {t["nodes"]["count"][0] for t in models[protocol]["trees"]} == {grown_on}, protocol


def _resumed_as_uninterrupted(tmp_path, configs: dict) -> dict:
    """For each ``{protocol: (config text, party)}``: the party's model after 5 trees, uninterrupted and resumed
    after 2 (:func:`_uninterrupted_and_resumed`), asserted the same; returns each uninterrupted model's JSON."""
    models = {}
    for protocol, (text, holder) in configs.items():
        runs = {out: json.loads((d / f"{holder}.model.json").read_text())
                for out, d in zip(("full", "res"), _uninterrupted_and_resumed(tmp_path, text, protocol))}
        assert runs["res"]["trees"] == runs["full"]["trees"] and len(runs["full"]["trees"]) == 5, protocol
        models[protocol] = runs["full"]
    return models


def _uninterrupted_and_resumed(tmp_path, text: str, name: str) -> tuple[Path, Path]:
    """``fedgrove simulate`` of the federation config ``text`` (``n_estimators = 2``, output ``sim``) for 5 trees,
    and for 2 then resumed to 5; returns the two runs' output directories."""
    from fedgrove.cli.main import main

    for out, steps in (("full", [(5, False)]), ("res", [(2, False), (5, True)])):
        for trees, resume in steps:
            cfg = tmp_path / f"{name}-{out}.toml"
            cfg.write_text(text.replace("n_estimators = 2", f"n_estimators = {trees}")
                           .replace('dir = "sim"', f'dir = "{name}-{out}"'))
            assert main(["simulate", str(cfg), *(["--resume"] if resume else [])]) == 0
    return tmp_path / f"{name}-full", tmp_path / f"{name}-res"


def test_horizontal_resume_continues_to_the_uninterrupted_model(tmp_path, capsys):
    r = np.random.default_rng(2)
    X = r.normal(size=(900, 4))
    y = np.digitize(X[:, 0] + X[:, 1], [-0.5, 0.5])
    for k in range(3):
        df = pd.DataFrame(X[k::3], columns=list("abcd"))
        df["label"] = y[k::3]
        df.to_csv(tmp_path / f"c{k}.csv", index=False)

    def config(trees, out):
        return ('[federation]\nprotocol = "horizontal"\n[horizontal]\ncontributions = true\n'
                '[params]\nobjective = "multiclass"\nn_classes = 3\n'
                f'n_estimators = {trees}\nmax_depth = 3\n[[party]]\nname = "agg"\nrole = "aggregator"\n'
                + "".join(f'[[party]]\nname = "c{k}"\nrole = "client"\ndata = "c{k}.csv"\nlabel = "label"\n'
                          for k in range(3)) + f'[output]\ndir = "{out}"\n')

    from fedgrove.cli.main import main

    (tmp_path / "full.toml").write_text(config(6, "full"))
    (tmp_path / "part.toml").write_text(config(2, "res"))
    (tmp_path / "rest.toml").write_text(config(6, "res"))
    assert main(["simulate", str(tmp_path / "full.toml")]) == 0
    assert main(["simulate", str(tmp_path / "part.toml")]) == 0       # stops after 2 rounds (6 trees)
    assert main(["simulate", str(tmp_path / "rest.toml"), "--resume"]) == 0
    for n in ("agg", "c0", "c1", "c2"):
        full = json.loads((tmp_path / "full" / f"{n}.model.json").read_text())
        res = json.loads((tmp_path / "res" / f"{n}.model.json").read_text())
        assert full["trees"] == res["trees"] and len(full["trees"]) == 18
    # the contributions too: the resumed run lost those of the trees before its checkpoint
    full, res = (json.loads((tmp_path / d / "agg.model.json").read_text())["metadata"]["contributions"]
                 for d in ("full", "res"))
    assert full == res and all(c["shapley"] > 0 for c in full.values())
    (tmp_path / "fresh.toml").write_text(config(2, "fresh"))  # nothing to resume from: said, then trained
    capsys.readouterr()
    assert main(["simulate", str(tmp_path / "fresh.toml"), "--resume"]) == 0
    assert "no checkpoint of agg, c0, c1, c2 in" in capsys.readouterr().err


@contextmanager
def _changed(path: Path, rewrite):
    """``path`` rewritten by ``rewrite(path)`` for the block, then restored byte for byte."""
    kept = path.read_bytes()
    rewrite(path)
    try:
        yield
    finally:
        path.write_bytes(kept)


def _json(change):
    """A rewrite for :func:`_changed`: the JSON file's content given to ``change`` to edit in place."""
    def rewrite(path: Path) -> None:
        d = json.loads(path.read_text())
        change(d)
        path.write_text(json.dumps(d))
    return rewrite


def _text(old: str, new: str):
    """A rewrite for :func:`_changed`: ``old`` replaced by ``new`` in the file's text."""
    return lambda path: path.write_text(path.read_text().replace(old, new))


def _frame(change):
    """A rewrite for :func:`_changed`: the CSV file as a DataFrame, replaced by what ``change`` returns."""
    return lambda path: change(pd.read_csv(path)).to_csv(path, index=False)


def _example(tmp_path, name: str, scheme: str, trees: int) -> Path:
    """The example federation ``examples/<name>`` on the breast-cancer table, fewer trees; returns its config."""
    from sklearn.datasets import load_breast_cancer

    from fedgrove.cli.main import main

    load_breast_cancer(as_frame=True).frame.to_csv(tmp_path / "cancer.csv", index=False)
    assert main(["partition", str(tmp_path / "cancer.csv"), "-l", "target", "--scheme", scheme, "-p", "3",
                 "--test-fraction", "0.2", "-o", str(tmp_path / "parts")]) == 0
    toml = (Path(__file__).parents[2] / "examples" / name / "federation.toml").read_text()
    assert "n_estimators = " in toml
    import re

    (tmp_path / "federation.toml").write_text(re.sub(r"n_estimators = \d+", f"n_estimators = {trees}", toml))
    return tmp_path / "federation.toml"


def test_hybridtree_example_trains_and_predicts_from_its_files(tmp_path, capsys):
    # the example config trains, predicts its test files, and --predict redoes the prediction from the model
    # files alone with the same result
    from fedgrove.cli.main import main

    cfg = _example(tmp_path, "hybridtree", "hybrid", 3)
    assert main(["simulate", str(cfg)]) == 0
    out = tmp_path / "runs" / "simulated"
    host = json.loads((out / "host.model.json").read_text())
    assert len(host["host_trees"]) == 3 and any(host["guest_values"][0].values())
    guest = json.loads((out / "guest0.model.json").read_text())
    assert guest["splits"] and guest["children"]
    first = (out / "host.predictions.csv").read_bytes()
    stats = json.loads((out / "host.stats.json").read_text())
    assert stats["n_test"] == 114 and stats["test_accuracy"] > 0.85
    (out / "host.predictions.csv").unlink()
    assert main(["simulate", str(cfg), "--predict"]) == 0
    assert (out / "host.predictions.csv").read_bytes() == first
    for test_file in (tmp_path / "parts").glob("*-test.csv"):  # columns in another order: matched by name
        df = pd.read_csv(test_file)
        df[list(df.columns[::-1])].to_csv(test_file, index=False)
    assert main(["simulate", str(cfg), "--predict"]) == 0
    assert (out / "host.predictions.csv").read_bytes() == first
    _predicts_alike_after_its_training_files_change(cfg, out / "host.predictions.csv")
    # test files whose IDs do not link: a host file without _id (its rows were taken as IDs 0..n-1, matched to
    # the guests' IDs) is refused; a guest whose IDs are written otherwise (text) is warned about, as is the host.
    # A guest may hold none of the test instances: its test file of column names alone was refused (no data rows)
    parts = tmp_path / "parts"
    for name, change, code, said in (
            ("host", lambda df: df.drop(columns="_id"), 3, "the host's test file needs an _id column"),
            ("guest0", lambda df: df.iloc[:0], 0, "guest0 holds none of the host's 114 test instances"),
            ("guest0", lambda df: df.assign(_id="r" + df["_id"].astype(str)), 0,
             "guest0 holds none of the host's 114 test instances")):
        with _changed(parts / f"{name}-test.csv", _frame(change)):
            capsys.readouterr()
            assert main(["simulate", str(cfg), "--predict"]) == code
            err = capsys.readouterr().err
            assert said in err, err
    assert "none of the host's 114 test instances is among the" in err  # the guest's own warning
    _a_party_left_out_is_refused(cfg, capsys, "guest2", "the host's model holds the layers of guest2, which the "
                                 "federation lacks (its guests: guest0, guest1)")
    # a damaged checkpoint is named as such on --resume (the error named no file: "not a party model file: ...");
    # one whose state no longer matches its digest too (a guest leaf value changed in the host's resumed without a
    # word); states written before the digest carry none and are checked as they load.  (Each with no whole state
    # before it, which would take its place: see below)
    def changed_value(d):
        values = d["model"]["guest_values"][0]["guest0"]
        values[next(iter(values))] += 0.125

    def undigested(change):
        return lambda d: (change(d), d.pop("state_sha256"))

    with _changed(cfg, _text("n_estimators = 3", "n_estimators = 4")):
        for name, change, code, said in (
                ("host", changed_value, 3, "its state does not match the SHA-256 its run wrote with it"),
                ("host", undigested(lambda d: d["model"]["guest_gains"]["guest0"].__setitem__(0, None)),
                 4, "not a HybridTree host model"),
                ("guest0", undigested(lambda d: d["model"]["splits"].__setitem__(0, 0.5)),
                 4, "not a party model file: TypeError in split 0")):
            path = out / f"{name}.checkpoint.json"
            with _changed(path, _json(change)), _changed(path.with_suffix(".prev.json"), _text("{", "[")):
                capsys.readouterr()
                assert main(["simulate", str(cfg), "--resume"]) == code
                err = capsys.readouterr().err
                assert f"checkpoint {path} is damaged: {said}" in err, err
    # a config whose guests take no part any more: the host alone predicted from its own layers, without a word
    with _changed(cfg, _text("guest_depth = 2", "guest_depth = 0")):
        assert main(["simulate", str(cfg), "--predict"]) == 2
        assert "holds guest layers, but the config asks no guest to predict" in capsys.readouterr().err
    with _changed(parts / "host.csv", _frame(lambda df: df.drop(columns="_id"))):
        assert main(["simulate", str(cfg)]) == 3
        assert "the host's file needs an _id column" in capsys.readouterr().err
    # a party's model file is described by info, and fedgrove predict says how such a model predicts
    capsys.readouterr()
    for name, shown in (("guest0", "guest0"), ("host", "HybridTree host")):
        assert main(["info", str(out / f"{name}.model.json")]) == 0
        text = capsys.readouterr().out
        assert "a party's part of a federated model" in text and shown in text
        if name == "host":  # (the guests' splits it keeps, node numbers only, by which it reads leaf ranks)
            kept = sum(len(k) for per_tree in json.loads((out / "host.model.json").read_text())["guest_children"]
                       for k in per_tree.values())
            assert kept > 0 and re.search(rf"guests' splits it keeps\W+{kept} \(node numbers", text), text
        assert main(["predict", str(out / f"{name}.model.json"), str(tmp_path / "parts" / "host-test.csv")]) == 4
        assert "predicts through its federation" in capsys.readouterr().err
    # the host's file ranks the host's own features (by name) over its layers with the guests' columns (by
    # guest and position) over theirs, and gives each party's share of the gain; a guest's holds no gains
    host_columns = set(pd.read_csv(tmp_path / "parts" / "host.csv", nrows=0).columns) - {"_id", "target"}
    assert main(["info", str(out / "host.model.json"), "--importance", "split"]) == 0
    text = capsys.readouterr().out
    table = text[text.index("the host's and guests' features"):]
    rows = [line.split("│")[1].strip() for line in table.splitlines() if line.startswith("│")]
    guest_rows = {r for r in rows if r.split(":")[0] in ("guest0", "guest1", "guest2")}
    assert guest_rows and set(rows) - guest_rows and set(rows) - guest_rows <= host_columns
    assert "top features by gain" in text and "host" in " ".join(text.split()).split("gain by party │")[1]
    assert main(["info", str(out / "guest0.model.json"), "--importance", "gain"]) == 2
    # a guest's file counts the splits on each of its own columns, by name
    guest_columns = set(pd.read_csv(tmp_path / "parts" / "guest0.csv", nrows=0).columns) - {"_id"}
    capsys.readouterr()
    assert main(["info", str(out / "guest0.model.json")]) == 0
    used = " ".join(capsys.readouterr().out.split()).split("its most used features │")[1].split("│")[0]
    assert {u.rsplit(" (", 1)[0] for u in used.strip().split(", ")} <= guest_columns and "splits)" in used
    _corrupt_parts_are_refused(cfg, out, "guest0", "host", capsys)
    # a newest state that a crash cut short (written in place) gives way to the whole one before it: the host
    # resumes from 2 trees, the guests step back to it, and the run goes on to 4
    host_state = out / "host.checkpoint.json"
    host_state.write_text(host_state.read_text()[:100])
    with _changed(cfg, _text("n_estimators = 3", "n_estimators = 4")):
        capsys.readouterr()
        assert main(["simulate", str(cfg), "--resume"]) == 0
        err = " ".join(capsys.readouterr().err.split())
    assert f"checkpoint {host_state} does not hold together" in err and "(2 trees), is whole" in err, err
    assert "resumes after 2" in err, err
    assert len(json.loads((out / "host.model.json").read_text())["host_trees"]) == 4


def _predicts_alike_after_its_training_files_change(cfg: Path, predictions: Path) -> None:
    """--predict from the model files gives the same ``predictions`` after every party's training file is
    rewritten with its columns in another order: a test file's columns are matched to the model's features (they
    were matched to the training file's, and a model predicted from shuffled columns without a word)."""
    from fedgrove.cli.main import main

    first = predictions.read_bytes()
    kept = {}
    for train_file in (cfg.parent / "parts").glob("*.csv"):
        if not train_file.name.endswith("-test.csv"):
            kept[train_file] = train_file.read_bytes()
            df = pd.read_csv(train_file)
            df[[df.columns[0], *df.columns[1:][::-1]]].to_csv(train_file, index=False)
    try:
        predictions.unlink()
        assert main(["simulate", str(cfg), "--predict"]) == 0
        assert predictions.read_bytes() == first
    finally:
        for train_file, data in kept.items():
            train_file.write_bytes(data)


def _corrupt_parts_are_refused(cfg, out: Path, part: str, whole: str, capsys):
    """Damaged party files end --predict with the file's name and what is wrong, no traceback and no
    predictions: a split feature outside the party's columns (numpy would index from the end, or raise), one
    split without children, and (``whole``: the file that routes first) a missing field."""
    from fedgrove.cli.main import main

    def damaged(name, change, expected):
        path = out / f"{name}.model.json"
        (out / f"{whole}.predictions.csv").unlink(missing_ok=True)
        capsys.readouterr()
        with _changed(path, _json(change)):
            assert main(["simulate", str(cfg), "--predict"]) == 4
            err = capsys.readouterr().err
            assert f"{path} is corrupt" in err and expected in err and "Traceback" not in err, err
            assert not (out / f"{whole}.predictions.csv").exists()

    for f in (-3, 99):
        damaged(part, lambda d, f=f: d["splits"][0].__setitem__(2, f), f"feature {f}")
    damaged(part, lambda d: d.__setitem__("children", [c for c in d["children"] if c[:2] != d["splits"][0][:2]]),
            "have no children")
    if whole == "host":
        damaged(whole, lambda d: d.pop("host_trees"), "host_trees")
        # a host split without its threshold is damage (a vertical model's are another party's)
        damaged(whole, lambda d: d["host_trees"][0]["nodes"]["threshold"].__setitem__(0, float("nan")),
                "host tree 0 has a split without a threshold")
        damaged(whole, lambda d: d["guest_values"][0][part].__setitem__("1", float("nan")), "not all finite")
        # a guest's split left out: its instances' walk stops short of the leaves the host has values for
        damaged(part, lambda d: d["splits"].pop(0), "has children but no split")
        # the host without the values of a guest's leaves: the files are not of one run (the host's own value
        # stood in for the guest's, silently)
        with _changed(out / f"{whole}.model.json", _json(lambda d: d["guest_values"][0].__setitem__(part, {}))):
            capsys.readouterr()
            assert main(["simulate", str(cfg), "--predict"]) == 5
            err = capsys.readouterr().err
            assert f"{part} routed test instance" in err and "are not of one training run" in err, err



def test_multihost_hybridtree_example_each_host_with_its_guests_then_bagged(tmp_path, capsys):
    # two hosts, four guests holding instances of both: each host's federation keeps the instances it shares
    # with each guest; fedgrove bag votes over the two hosts' predictions of the common test set
    import re

    from sklearn.datasets import load_breast_cancer

    from fedgrove.cli.main import main

    load_breast_cancer(as_frame=True).frame.to_csv(tmp_path / "cancer.csv", index=False)
    assert main(["partition", str(tmp_path / "cancer.csv"), "-l", "target", "--scheme", "hybrid", "-p", "4",
                 "--hosts", "2", "--test-fraction", "0.2", "-o", str(tmp_path / "parts")]) == 0
    src = Path(__file__).parents[2] / "examples" / "hybridtree" / "multihost"
    preds = []
    for h in ("host0", "host1"):
        toml = re.sub(r"n_estimators = \d+", "n_estimators = 3", (src / f"{h}.toml").read_text())
        (tmp_path / f"{h}.toml").write_text(toml)
        assert main(["simulate", str(tmp_path / f"{h}.toml")]) == 0
        preds.append(tmp_path / "runs" / h / f"{h}.predictions.csv")
    # without shared_only a host refuses guests holding instances it lacks
    (tmp_path / "strict.toml").write_text((tmp_path / "host0.toml").read_text().replace(
        "shared_only = true", "shared_only = false").replace('"runs/host0"', '"runs/strict"'))
    assert main(["simulate", str(tmp_path / "strict.toml")]) != 0
    assert "shared_only" in capsys.readouterr().err
    capsys.readouterr()
    assert main(["bag", *map(str, preds), "--truth", str(tmp_path / "parts" / "host0-test.csv"), "-l", "target",
                 "-o", str(tmp_path / "bagged.csv")]) == 0
    assert "bagged accuracy" in capsys.readouterr().err  # the console writes to stderr
    # --label defaults to the last column, as its help says (it was taken as "no label" and refused); a file
    # whose last column is a feature is refused, not scored against that feature
    assert main(["bag", *map(str, preds), "--truth", str(tmp_path / "parts" / "host0-test.csv")]) == 0
    assert "bagged accuracy" in capsys.readouterr().err
    pd.read_csv(tmp_path / "parts" / "host0-test.csv").drop(columns="target").to_csv(tmp_path / "nolabel.csv",
                                                                                      index=False)
    assert main(["bag", *map(str, preds), "--truth", str(tmp_path / "nolabel.csv")]) != 0
    err = " ".join(capsys.readouterr().err.split())
    assert "holds values that are not classes of the predictions (0, 1)" in err and "name the label column" in err
    a, b = (pd.read_csv(p) for p in preds)
    bagged = pd.read_csv(tmp_path / "bagged.csv")
    assert (bagged["_id"] == a["_id"]).all() and len(bagged) == 114
    # majority of two: both agree, or the tie goes to the class of the higher mean probability
    agree = a["prediction"] == b["prediction"]
    assert (~agree).any()
    assert (bagged["prediction"][agree] == a["prediction"][agree]).all()
    higher = np.where(a["p_1"] + b["p_1"] > a["p_0"] + b["p_0"], 1, 0)
    assert (bagged["prediction"][~agree] == higher[~agree]).all()
    assert (bagged["votes"] == np.where(agree, 2, 1)).all()
    np.testing.assert_allclose(bagged["p_1"], (a["p_1"] + b["p_1"]) / 2)
    truth = pd.read_csv(tmp_path / "parts" / "host0-test.csv").set_index("_id")["target"]
    assert (bagged["prediction"].to_numpy() == truth.loc[bagged["_id"]].to_numpy()).mean() > 0.85
    # soft vote; files that do not cover the same test instances are refused with the missing ID named
    assert main(["bag", *map(str, preds), "--vote", "soft", "-o", str(tmp_path / "soft.csv")]) == 0
    soft = pd.read_csv(tmp_path / "soft.csv")
    assert (soft["prediction"] == (soft["p_1"] > soft["p_0"]).astype(int)).all()
    a.iloc[:-1].to_csv(tmp_path / "short.csv", index=False)
    capsys.readouterr()
    assert main(["bag", str(tmp_path / "short.csv"), str(preds[1]), "-o", str(tmp_path / "x.csv")]) != 0
    assert "rows" in capsys.readouterr().err and not (tmp_path / "x.csv").exists()
    assert main(["bag", str(preds[0]), str(preds[1]), "--vote", "loud"]) != 0
    # one host's file twice would be counted once (it used to be, without a word)
    again = Path(str(preds[0]).replace(str(tmp_path), str(tmp_path / "parts" / "..")))
    capsys.readouterr()
    assert main(["bag", str(preds[0]), str(preds[1]), str(again)]) == 2
    assert "is given twice" in capsys.readouterr().err
    # one file: passed through, saying so
    assert main(["bag", str(preds[0]), "-o", str(tmp_path / "one.csv")]) == 0
    assert "one prediction file: its predictions are passed through unchanged" in capsys.readouterr().err
    one = pd.read_csv(tmp_path / "one.csv")
    assert (one["prediction"].to_numpy() == a.set_index("_id").loc[one["_id"], "prediction"].to_numpy()).all()


def test_vertical_example_predicts_from_its_files_matching_test_columns_to_the_models_features(tmp_path, capsys):
    from fedgrove.cli.main import main

    cfg = _example(tmp_path, "vertical", "vertical", 2)
    assert main(["simulate", str(cfg)]) == 0
    out = tmp_path / "runs" / "simulated"
    _predicts_alike_after_its_training_files_change(cfg, out / "party0.predictions.csv")
    # damaged files that predicted without a word: an own split's threshold gone (x <= NaN sent every instance
    # right), a tree number 0.5 read as 0, cut points that are not numbers
    own = json.loads((out / "party0.model.json").read_text())["trees"][0]["nodes"]
    mine = next(k for k, (f, o) in enumerate(zip(own["feature"], own["owner"])) if f >= 0 and o == 0)
    for name, change, expected, code in (
            ("party0", lambda d: d["trees"][0]["nodes"]["threshold"].__setitem__(mine, None), "without a threshold", 4),
            ("party1", lambda d: d["splits"][0].__setitem__(0, 0.5), "0.5 is not a whole number", 4),
            ("party1", lambda d: d["bin_mapper"]["cuts"][0].__setitem__(0, None), "a list of finite numbers", 4),
            ("party1", lambda d: d["bin_mapper"]["cuts"].__setitem__(1, -1), "a list of finite numbers", 4),
            # a split moved to a node it is not at: the active party names whose bits are missing
            ("party1", lambda d: d["splits"][0].__setitem__(1, 10_000), "party1 sent no go-left bits for tree", 5)):
        with _changed(out / f"{name}.model.json", _json(change)):
            capsys.readouterr()
            assert main(["simulate", str(cfg), "--predict"]) == code
            assert expected in capsys.readouterr().err
    _mixed_ids_are_refused(cfg, capsys, "party0")
    _a_party_left_out_is_refused(cfg, capsys, "party2", "trained with the features of party2, which the federation")


def _a_party_left_out_is_refused(cfg: Path, capsys, party: str, said: str) -> None:
    """--predict with a config that has lost a party the model was trained with is refused, saying so (the
    vertical active party found 'no prediction bits ... from its owner'; the forest's master blamed Proposition 1;
    the HybridTree host let its own value stand in for the guest's layers)."""
    from fedgrove.cli.main import main

    toml = cfg.read_text()
    start = toml.index(f'[[party]]\nname = "{party}"')
    end = toml.find("[[party]]", start + 1)
    end = toml.index("[output]") if end < 0 else end
    cut = cfg.with_name("without.toml")
    cut.write_text(toml[:start] + toml[end:])
    capsys.readouterr()
    assert main(["simulate", str(cut), "--predict"]) == 2
    err = capsys.readouterr().err
    assert said in err and "give the config the model was trained with" in err, err


def _mixed_ids_are_refused(cfg: Path, capsys, bare: str) -> None:
    """A party's test (and training) file without the _id column the others' have is refused: its rows, in file
    order, were matched to the others' sorted by ID, without a word."""
    from fedgrove.cli.main import main

    for suffix, args in (("-test", ["--predict"]), ("", [])):
        with _changed(cfg.parent / "parts" / f"{bare}{suffix}.csv", _frame(lambda df: df.drop(columns="_id"))):
            capsys.readouterr()
            assert main(["simulate", str(cfg), *args]) == 5
            err = capsys.readouterr().err
            what = "test file" if suffix else "file"
            assert f"instance IDs (an _id column) and {bare}'s {what} has none" in err, err


def test_federated_forest_example_predicts_as_its_training_run(tmp_path, capsys):
    from fedgrove.cli.main import main
    from fedgrove.engine.model import load_model

    cfg = _example(tmp_path, "forest", "vertical", 3)
    assert main(["simulate", str(cfg)]) == 0
    out = tmp_path / "runs" / "simulated"
    model = load_model(out / "master.model.json")
    assert model.n_trees == 3 and model.metadata["label_mode"] == "encrypted"
    assert np.isnan(model.trees[0].nodes["threshold"]).all()  # the master keeps no threshold
    pred = pd.read_csv(out / "master.predictions.csv")
    truth = pd.read_csv(tmp_path / "parts" / "party0-test.csv").set_index("_id")["target"]
    assert (pred["prediction"].to_numpy() == truth.loc[pred["_id"]].to_numpy()).mean() > 0.85
    (tmp_path / "federation.toml").write_text(cfg.read_text().replace('"one-round"', '"classical"'))
    first = (out / "master.predictions.csv").read_bytes()
    assert main(["simulate", str(cfg), "--predict"]) == 0  # classical prediction: the same predictions
    assert (out / "master.predictions.csv").read_bytes() == first
    _predicts_alike_after_its_training_files_change(cfg, out / "master.predictions.csv")
    _mixed_ids_are_refused(cfg, capsys, "party2")
    _a_party_left_out_is_refused(cfg, capsys, "party1", "trained with the clients party0, party1, party2, the "
                                 "federation has party0, party2")
    _corrupt_parts_are_refused(cfg, out, "party1", "master", capsys)


HYBRID = """
[federation]
protocol = "hybridtree"
seed = 5
timeout = {timeout}

[hybridtree]
host_depth = 3
guest_depth = 2

[he]
scheme = "ou"
key_bits = 2048

[params]
objective = "binary"
n_estimators = {trees}
learning_rate = 0.3
max_bins = 16
"""


def _setup_hybrid(tmp_path: Path, trees, timeout, rows):
    """A host (label, 3 features, every instance) and three guests (4 other features, disjoint instances)."""
    r = np.random.default_rng(1)
    X = r.normal(size=(rows, 7))
    y = (X[:, 0] + X[:, 4] - X[:, 6] > 0).astype(int)
    names = ["host", "guest0", "guest1", "guest2"]
    owner = r.integers(0, 3, rows)
    host = pd.DataFrame(X[:, :3], columns=["a0", "a1", "a2"])
    host.insert(0, "_id", np.arange(rows))
    host["label"] = y
    host.iloc[r.permutation(rows)].to_csv(tmp_path / "host.csv", index=False)
    for k in range(3):
        g = pd.DataFrame(X[owner == k][:, 3:], columns=["b0", "b1", "b2", "b3"])
        g.insert(0, "_id", np.nonzero(owner == k)[0])
        g.to_csv(tmp_path / f"guest{k}.csv", index=False)
    role = {n: "host" if n == "host" else "guest" for n in names}
    return _write_configs(tmp_path, role, "host", HYBRID.format(trees=trees, timeout=timeout))


def test_hybridtree_guest_killed_host_exits_and_resume_over_grpc_equals_the_simulated_model(tmp_path):
    from fedgrove.cli.main import main

    names = _setup_hybrid(tmp_path, trees=25, timeout=6, rows=2400)
    procs = {n: _start(tmp_path, n) for n in names}
    ckpt = tmp_path / "grpc" / "guest1.checkpoint.json"
    _kill_once_checkpointed(procs, "guest1", ckpt)  # mid-training
    t0 = time.monotonic()
    results = {n: procs[n].communicate(timeout=60) for n in ("host", "guest0", "guest2")}
    assert time.monotonic() - t0 < 6 * 3 + 10
    assert procs["host"].returncode not in (0, None) and "guest1" in results["host"][1]
    assert "Traceback" not in "".join(err for _, err in results.values())
    done = json.loads((tmp_path / "grpc" / "host.checkpoint.json").read_text())["trees_done"]
    assert 0 < done < 25
    procs = [_start_resume(tmp_path, n) for n in reversed(names)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], [o[1][-2000:] for o in outs]
    assert main(["simulate", str(tmp_path / "federation.toml")]) == 0  # uninterrupted, in one process
    for n in names:
        sim, grpc_run = tmp_path / "sim" / f"{n}.model.json", tmp_path / "grpc" / f"{n}.model.json"
        assert sim.read_bytes() == grpc_run.read_bytes(), n


def test_hybridtree_with_row_and_column_sampling_resumes_to_the_uninterrupted_model(tmp_path):
    # the host draws its rows and features each round, and each guest's features; a resumed run draws those of
    # the rounds it skips again; the guests' model files (their splits) come out the same too
    names = _setup_hybrid(tmp_path, trees=2, timeout=30, rows=600)
    text = (tmp_path / "federation.toml").read_text().replace(
        "max_bins = 16\n", "max_bins = 16\nsubsample = 0.6\ncolsample_bytree = 0.6\n")
    dirs = _uninterrupted_and_resumed(tmp_path, text, "hybrid")
    for n in names:
        full, res = ((d / f"{n}.model.json").read_text() for d in dirs)
        assert full == res, n
    assert len(json.loads(full)["splits"]) > 0


FOREST = """
[federation]
protocol = "federated-forest"
seed = 4
timeout = 60

[forest]
label_mode = "encrypted"

[he]
scheme = "ou"
key_bits = 2048

[params]
n_estimators = 3
max_depth = 4
max_bins = 16
feature_sampling = "tree"
"""


def test_federated_forest_in_process_and_over_grpc_give_the_same_files(tmp_path):
    # a master and three clients as four processes with mutual TLS: byte-identical model files to the one-process
    # run of the same config
    r = np.random.default_rng(2)
    X = r.normal(size=(300, 9))
    y = (X[:, 1] - X[:, 4] + X[:, 8] > 0).astype(int)
    clients = ["c0", "c1", "c2"]
    for k, name in enumerate(clients):
        df = pd.DataFrame(X[:, 3 * k:3 * k + 3], columns=[f"x{3 * k + j}" for j in range(3)])
        df.insert(0, "_id", np.arange(300))
        if k == 1:
            df["label"] = y
        df.sample(frac=1.0, random_state=k).to_csv(tmp_path / f"{name}.csv", index=False)  # own row order
    role = {"master": "master", **{c: "client" for c in clients}}
    names = _write_configs(tmp_path, role, "c1", FOREST)
    from fedgrove.cli.main import main

    assert main(["simulate", str(tmp_path / "federation.toml")]) == 0
    procs = [_start(tmp_path, n) for n in reversed(names)]
    outs = [p.communicate(timeout=180) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, [o[1][-2000:] for o in outs]
    for n in names:
        sim, grpc_run = tmp_path / "sim" / f"{n}.model.json", tmp_path / "grpc" / f"{n}.model.json"
        assert sim.read_bytes() == grpc_run.read_bytes()


def test_a_weighted_federated_forest_over_grpc_gives_the_simulated_files(tmp_path):
    # the label holder's weight column (a quarter of the weights 0: those instances are never drawn), its rows in
    # its own order: every party's file the same over gRPC as in one process, and the weights changed the forest
    from fedgrove.cli.main import main

    r = np.random.default_rng(5)
    X = r.normal(size=(300, 6))
    y = (X[:, 1] - X[:, 4] + 0.5 * r.normal(size=300) > 0).astype(int)
    role = {"master": "master", "c0": "client", "c1": "client"}
    for k, name in enumerate(["c0", "c1"]):
        df = pd.DataFrame(X[:, 3 * k:3 * k + 3], columns=[f"x{3 * k + j}" for j in range(3)])
        df.insert(0, "_id", np.arange(300))
        if k == 1:
            df["label"] = y
            df["w"] = np.where(r.random(300) < 0.25, 0.0, r.exponential(size=300))
        df.sample(frac=1.0, random_state=k).to_csv(tmp_path / f"{name}.csv", index=False)
    lines = {"master": "", "c0": 'data = "c0.csv"\n', "c1": 'data = "c1.csv"\nlabel = "label"\n'}
    _federation_configs(tmp_path, role, lines, FOREST)
    assert main(["simulate", str(tmp_path / "federation.toml")]) == 0
    unweighted = (tmp_path / "sim" / "master.model.json").read_bytes()
    lines["c1"] += 'weight = "w"\n'
    _federation_configs(tmp_path, role, lines, FOREST)
    _simulated_and_over_grpc_alike(tmp_path, list(role))
    model = json.loads((tmp_path / "sim" / "master.model.json").read_text())
    assert model["metadata"]["weighted_by"] == "c1" and (tmp_path / "sim" / "master.model.json").read_bytes() \
        != unweighted
    # resumed after 2 trees, the master draws the later trees' bootstraps among the same instances
    text = (tmp_path / "federation.toml").read_text().replace("n_estimators = 3", "n_estimators = 2")
    _resumed_as_uninterrupted(tmp_path, {"forest": (text, "master")})


def test_weighted_simfl_parties_over_grpc_give_the_simulated_files_and_resume_to_them(tmp_path):
    # each party's weight column (some weights 0: those rows are left out of the similarity search too), with
    # row sampling: the same files over gRPC as in one process, and a run resumed after 2 trees draws the
    # later trees' rows among the same rows (trees in turn: in blocks, a resume to more trees than the first
    # run's follows the new total's blocks from there, which an uninterrupted run of that total does not)
    r = np.random.default_rng(4)
    X = r.normal(size=(400, 5))
    y = (X[:, 0] - X[:, 3] + 0.5 * r.normal(size=400) > 0).astype(int)
    role = {"p0": "party", "p1": "party"}
    for k, name in enumerate(role):
        df = pd.DataFrame(X[k::2], columns=[f"x{j}" for j in range(5)])
        df["label"] = y[k::2]
        df["w"] = r.integers(0, 4, len(df)) * 0.5
        df.to_csv(tmp_path / f"{name}.csv", index=False)
    common = ('[federation]\nprotocol = "simfl"\nseed = 3\ntimeout = 60\n\n[params]\nobjective = "binary"\n'
              'n_estimators = 2\nmax_depth = 3\nmax_bins = 16\nsubsample = 0.7\n\n[simfl]\nschedule = "round-robin"\n')
    lines = {n: f'data = "{n}.csv"\nlabel = "label"\nweight = "w"\n' for n in role}
    _federation_configs(tmp_path, role, lines, common)
    _simulated_and_over_grpc_alike(tmp_path, list(role))
    model = json.loads((tmp_path / "sim" / "p0.model.json").read_text())
    assert model["metadata"]["weight"] == "w"
    _resumed_as_uninterrupted(tmp_path, {"simfl": ((tmp_path / "federation.toml").read_text(), "p0")})


def test_simfl_example_over_grpc_gives_the_simulated_files(tmp_path):
    # three peers as three processes with mutual TLS: the same model files as the one-process run, and every
    # party holds the same model
    from fedgrove.cli.main import main

    cfg = _example(tmp_path, "simfl", "horizontal", 4)
    ports = {n: _port() for n in ("party0", "party1", "party2")}
    create_federation_certs(tmp_path / "certs", list(ports))
    for n in ports:
        party = (Path(__file__).parents[2] / "examples" / "simfl" / f"{n}.toml").read_text()
        for m_, port in ports.items():
            party = party.replace(f"127.0.0.1:{50080 + int(m_[-1])}", f"127.0.0.1:{port}")
        (tmp_path / f"{n}.toml").write_text(party.replace("n_estimators = 50", "n_estimators = 4"))
    assert main(["simulate", str(cfg)]) == 0
    procs = [_start(tmp_path, n) for n in reversed(list(ports))]
    outs = [p.communicate(timeout=180) for p in procs]
    assert [p.returncode for p in procs] == [0] * 3, [o[1][-2000:] for o in outs]
    models = []
    for n in ports:
        sim = tmp_path / "runs" / "simulated" / f"{n}.model.json"
        grpc_run = tmp_path / "runs" / "grpc" / f"{n}.model.json"
        assert sim.read_bytes() == grpc_run.read_bytes()
        d = json.loads(grpc_run.read_text())
        d["metadata"].pop("party")
        models.append(d)
    assert models[0] == models[1] == models[2]
    stats = json.loads((tmp_path / "runs" / "grpc" / "party1.stats.json").read_text())
    assert stats["n_test"] == 114 and stats["test_accuracy"] > 0.85 and stats["preprocess_bytes_sent"] > 0
    _predicts_alike_after_its_training_files_change(cfg, tmp_path / "runs" / "simulated" / "party1.predictions.csv")


def test_fvtree_party_killed_others_exit_and_resume_over_grpc_equals_the_simulated_run(tmp_path):
    # four FV-tree peers as processes (the example's configs, fewer seconds to wait): one is killed mid-training,
    # the others stop naming it; all four restarted with --resume end with the model files of an uninterrupted
    # one-process run and ledgers as long as its ledgers, which verify
    import re

    from sklearn.datasets import load_breast_cancer

    from fedgrove.cli.main import main
    from fedgrove.ledger.store import open_records

    load_breast_cancer(as_frame=True).frame.to_csv(tmp_path / "cancer.csv", index=False)
    assert main(["partition", str(tmp_path / "cancer.csv"), "-l", "target", "--scheme", "horizontal", "--mode",
                 "unbalanced", "-p", "4", "--test-fraction", "0.2", "-o", str(tmp_path / "parts")]) == 0
    names = [f"party{k}" for k in range(4)]
    ports = {n: _port() for n in names}
    create_federation_certs(tmp_path / "certs", names)
    example = Path(__file__).parents[2] / "examples" / "fvtree"

    def adapt(text: str, timeout: int) -> str:
        for n, port in ports.items():
            text = text.replace(f"127.0.0.1:{50090 + int(n[-1])}", f"127.0.0.1:{port}")
        text = re.sub(r"n_estimators = \d+", "n_estimators = 40", text)
        text = text.replace("[fvtree]\n", '[fvtree]\nnoise = "public"\n')  # PSD noise from the seed: runs compare
        return re.sub(r"timeout = \d+", f"timeout = {timeout}", text)

    (tmp_path / "federation.toml").write_text(adapt((example / "federation.toml").read_text(), 120))
    for n in names:
        (tmp_path / f"{n}.toml").write_text(adapt((example / f"{n}.toml").read_text(), 6))
    procs = {n: _start(tmp_path, n) for n in names}
    ckpt = tmp_path / "runs" / "grpc" / "party1.checkpoint.json"
    _kill_once_checkpointed(procs, "party1", ckpt)  # mid-training
    results = {n: procs[n].communicate(timeout=60) for n in ("party0", "party2", "party3")}
    for n, (_, err) in results.items():
        assert procs[n].returncode not in (0, None) and "party1" in err, err[-2000:]
        assert "Traceback" not in err
    done = json.loads(ckpt.read_text())["trees_done"]
    assert 0 < done < 40
    _resume_all(tmp_path, names)
    assert main(["simulate", str(tmp_path / "federation.toml")]) == 0  # uninterrupted, in one process
    for n in names:
        sim, grpc_run = tmp_path / "runs" / "simulated" / n, tmp_path / "runs" / "grpc" / n
        assert Path(f"{sim}.model.json").read_bytes() == Path(f"{grpc_run}.model.json").read_bytes(), n
        assert len(open_records(f"{grpc_run}.ledger.sqlite")) == len(open_records(f"{sim}.ledger.sqlite"))
        assert main(["ledger", "verify", f"{grpc_run}.ledger.sqlite"]) == 0


SIMFL_PAIR = """
[federation]
protocol = "simfl"
seed = 0
timeout = 20
[simfl]
schedule = "{schedule}"
[params]
n_estimators = {trees}
max_depth = 3
n_threads = {threads}
{extra}
[[party]]
name = "p0"
role = "party"
data = "p0.csv"
label = "y"
[[party]]
name = "p1"
role = "party"
data = "p1.csv"
label = "y"
[output]
dir = "runs"
"""


def test_parties_given_different_settings_refuse_to_start_and_say_which(tmp_path):
    # p1 was given other trees and another schedule: before, the two schedules made each wait for the other
    # until a timeout blamed a peer for stalling; each thread count is the party's own
    from fedgrove.exceptions import InvalidParameterError
    from fedgrove.runner.config import load_federation
    from fedgrove.runner.run import run_role
    from fedgrove.transport.inprocess import InProcessHub, run_parties

    r = np.random.default_rng(0)
    for k in range(2):
        pd.DataFrame({"a": r.normal(size=60), "b": r.normal(size=60), "y": r.integers(0, 2, 60)}) \
            .to_csv(tmp_path / f"p{k}.csv", index=False)
    cfgs = []
    for k, (trees, schedule) in enumerate([(4, "blocks"), (5, "round-robin")]):
        path = tmp_path / f"f{k}.toml"
        path.write_text(SIMFL_PAIR.format(trees=trees, schedule=schedule, threads=k + 1, extra=""))
        cfgs.append(load_federation(path))

    def run(cfg_of):
        hub = InProcessHub(["p0", "p1"])
        return run_parties(hub, {n: (lambda n: lambda ch: run_role(cfg_of[n], cfg_of[n].party(n), ch))(n)
                                 for n in ("p0", "p1")}, timeout=20)

    with pytest.raises(InvalidParameterError) as err:
        run({"p0": cfgs[0], "p1": cfgs[1]})
    text = str(err.value)
    assert "not given the same federation settings" in text and "n_threads" not in text
    assert "params.n_estimators: 4 here, 5 at" in text or "params.n_estimators: 5 here, 4 at" in text
    assert "simfl.schedule" in text
    # resolved settings are compared: a default written out, 1 for 1.0, and each party's threads agree
    (tmp_path / "f0.toml").write_text(SIMFL_PAIR.format(trees=4, schedule="blocks", threads=1,
                                                        extra="learning_rate = 1"))
    (tmp_path / "f1.toml").write_text(SIMFL_PAIR.format(trees=4, schedule="blocks", threads=2,
                                                        extra="learning_rate = 1.0\nmax_bins = 255"))
    results, _ = run({"p0": load_federation(tmp_path / "f0.toml"), "p1": load_federation(tmp_path / "f1.toml")})
    assert set(results) == {"p0", "p1"}


def test_parties_of_other_fedgrove_versions_refuse_to_start_naming_both(tmp_path):
    # a party upgraded alone: its messages may differ from its peers', which then failed mid-training on a
    # message they could not read
    from fedgrove import __version__
    from fedgrove.exceptions import InvalidParameterError
    from fedgrove.runner.config import load_federation
    from fedgrove.runner.run import check_same_settings
    from fedgrove.transport.inprocess import InProcessHub, run_parties

    (tmp_path / "f.toml").write_text(SIMFL_PAIR.format(trees=4, schedule="blocks", threads=1, extra=""))
    cfg = load_federation(tmp_path / "f.toml")

    def run(versions):
        return run_parties(InProcessHub(["p0", "p1"]), {
            n: (lambda n: lambda ch: check_same_settings(cfg, cfg.party(n), ch, "train", versions[n]))(n)
            for n in ("p0", "p1")}, timeout=20)

    with pytest.raises(InvalidParameterError, match=r"(p0 runs fedgrove 9\.9\.9 and p1 runs {0}|p1 runs fedgrove "
                                                    r"{0} and p0 runs 9\.9\.9): their messages may differ; "
                                                    r"install the same fedgrove version at every party"
                       .format(__version__.replace(".", r"\."))):
        run({"p0": "9.9.9", "p1": None})
    run({"p0": None, "p1": None})  # the same version (this one) starts


def _simfl_pair_data(tmp_path) -> None:
    """p0.csv and p1.csv for SIMFL_PAIR: 80 rows each, two features, random labels (the same every call)."""
    r = np.random.default_rng(1)
    for k in range(2):
        pd.DataFrame({"a": r.normal(size=80), "b": r.normal(size=80), "y": r.integers(0, 2, 80)}) \
            .to_csv(tmp_path / f"p{k}.csv", index=False)


def test_resume_with_fewer_trees_than_the_checkpoint_holds_is_refused_and_more_extends_it(tmp_path, caplog):
    # before, the resumed model kept every checkpointed tree while its parameters said fewer; a resume with as
    # many is noted as having nothing left to grow
    from fedgrove.exceptions import InvalidParameterError
    from fedgrove.engine.model import load_model
    from fedgrove.runner.config import load_federation
    from fedgrove.runner.run import simulate

    _simfl_pair_data(tmp_path)
    path = tmp_path / "f.toml"

    def run(trees, resume):
        path.write_text(SIMFL_PAIR.format(trees=trees, schedule="round-robin", threads=1, extra=""))
        simulate(load_federation(path), resume=resume)
        return load_model(tmp_path / "runs" / "p0.model.json")

    assert run(4, False).n_trees == 4
    with caplog.at_level("INFO", logger="fedgrove"):
        assert run(4, True).n_trees == 4
    assert "p0: its checkpoint already holds the 4 rounds n_estimators asks for" in caplog.text
    with pytest.raises(InvalidParameterError, match="checkpoint holds 4 rounds, more than n_estimators = 3"):
        run(3, True)
    longer = run(6, True)
    assert longer.n_trees == 6 and longer.params["n_estimators"] == 6


def test_checkpoints_every_few_rounds_come_at_those_rounds_and_the_last_and_every_party_must_give_the_same(
        tmp_path):
    # [federation] checkpoint_every: a SimFL tree costs a few ms here and its checkpoint about as much; the model
    # is the same, a resume may change the setting, and parties given different ones refuse to start (each would
    # step back only one of its own checkpoints)
    from fedgrove.exceptions import InvalidParameterError
    from fedgrove.runner.config import load_federation
    from fedgrove.runner.run import run_role, simulate
    from fedgrove.transport.inprocess import InProcessHub, run_parties

    _simfl_pair_data(tmp_path)
    runs = tmp_path / "runs"

    def config(trees, every, name="f.toml"):
        path = tmp_path / name
        path.write_text(SIMFL_PAIR.format(trees=trees, schedule="round-robin", threads=1, extra="")
                        .replace("timeout = 20\n", f"timeout = 20\ncheckpoint_every = {every}\n"))
        return load_federation(path)

    def run(trees, every, resume=False):
        simulate(config(trees, every), resume=resume)
        states = {n: [json.loads((runs / f"{n}.checkpoint{s}.json").read_text())["trees_done"]
                      for s in ("", ".prev")] for n in ("p0", "p1")}
        return states, (runs / "p0.model.json").read_bytes()

    every_round = {t: run(t, 1)[1] for t in (8, 11)}
    states, model = run(8, 3)
    assert states == {"p0": [8, 6], "p1": [8, 6]} and model == every_round[8]
    states, model = run(11, 2, resume=True)  # grown on from round 8, now checkpointing every 2 rounds
    assert states == {"p0": [11, 10], "p1": [11, 10]} and model == every_round[11]
    hub = InProcessHub(["p0", "p1"])
    cfgs = {"p0": config(4, 2, "a.toml"), "p1": config(4, 3, "b.toml")}
    with pytest.raises(InvalidParameterError, match=r"federation.checkpoint_every: [23] here, [23] at"):
        run_parties(hub, {n: (lambda n: lambda ch: run_role(cfgs[n], cfgs[n].party(n), ch))(n) for n in cfgs},
                    timeout=20)


def test_feature_holders_checkpointing_every_few_trees_checkpoint_at_the_end_too(tmp_path):
    # a forest's clients follow the master's trees and do not know how many there will be: with a checkpoint
    # every 3 of 5 trees they checkpointed only after tree 3, and a resume with more trees stepped the master
    # back two trees; now they checkpoint when training ends, and the resume grows the uninterrupted forest
    from fedgrove.runner.config import load_federation
    from fedgrove.runner.run import simulate

    r = np.random.default_rng(5)
    X = r.normal(size=(120, 4))
    y = (X[:, 0] + X[:, 3] > 0).astype(int)
    for k in range(2):
        df = pd.DataFrame(X[:, 2 * k:2 * k + 2], columns=[f"x{2 * k + j}" for j in range(2)])
        df.insert(0, "_id", np.arange(120))
        if k == 0:
            df["label"] = y
        df.to_csv(tmp_path / f"c{k}.csv", index=False)
    text = ('[federation]\nprotocol = "federated-forest"\nseed = 1\ntimeout = 60\ncheckpoint_every = 3\n'
            '[forest]\nlabel_mode = "shared"\n[params]\nn_estimators = {trees}\nmax_depth = 3\n'
            '[[party]]\nname = "m"\nrole = "master"\n'
            '[[party]]\nname = "c0"\nrole = "client"\ndata = "c0.csv"\nlabel = "label"\n'
            '[[party]]\nname = "c1"\nrole = "client"\ndata = "c1.csv"\n[output]\ndir = "{out}"\n')

    def run(trees, out, resume=False):
        path = tmp_path / f"{out}.toml"
        path.write_text(text.format(trees=trees, out=out))
        simulate(load_federation(path), resume=resume)
        return {n: [json.loads((tmp_path / out / f"{n}.checkpoint{s}.json").read_text())["trees_done"]
                    for s in ("", ".prev")] for n in ("m", "c0", "c1")}

    assert run(5, "res") == {n: [5, 3] for n in ("m", "c0", "c1")}
    assert run(7, "res", resume=True) == {n: [7, 6] for n in ("m", "c0", "c1")}
    run(7, "whole")
    for n in ("m", "c0", "c1"):
        assert (tmp_path / "res" / f"{n}.model.json").read_bytes() == \
            (tmp_path / "whole" / f"{n}.model.json").read_bytes(), n


def test_resume_from_a_checkpoint_another_run_wrote_is_refused_naming_the_difference(tmp_path):
    # a federation of other settings, data or protocol in the same output folder: --resume went on from its
    # checkpoints (a model of mixed trees) or failed on what it found in them with a message about something else
    from fedgrove.exceptions import InvalidParameterError
    from fedgrove.engine.model import load_model
    from fedgrove.runner.config import load_federation
    from fedgrove.runner.run import simulate

    _simfl_pair_data(tmp_path)
    path = tmp_path / "f.toml"

    def run(resume, trees=3, extra="", text=None):
        path.write_text(text or SIMFL_PAIR.format(trees=trees, schedule="round-robin", threads=1, extra=extra))
        simulate(load_federation(path), resume=resume)

    run(False)
    with pytest.raises(InvalidParameterError, match=r"p[01].checkpoint.json was written by another run "
                                                    r"\(params.learning_rate: 0.1 there, 0.5 here\)"):
        run(True, extra="learning_rate = 0.5")
    horizontal = ('[federation]\nprotocol = "horizontal"\nseed = 0\ntimeout = 20\n[params]\nn_estimators = 3\n'
                  '[[party]]\nname = "agg"\nrole = "aggregator"\n'
                  '[[party]]\nname = "p0"\nrole = "client"\ndata = "p0.csv"\nlabel = "y"\n'
                  '[[party]]\nname = "p1"\nrole = "client"\ndata = "p1.csv"\nlabel = "y"\n[output]\ndir = "runs"\n')
    with pytest.raises(InvalidParameterError, match="role 'party' there, 'client' here; federation.protocol: "
                                                    "'simfl' there, 'horizontal' here"):
        run(True, text=horizontal)
    pd.read_csv(tmp_path / "p1.csv").iloc[::-1].to_csv(tmp_path / "p1.csv", index=False)  # the same rows, reordered
    with pytest.raises(InvalidParameterError, match="p1.checkpoint.json was written by another run \\(the data "
                                                    "file .*p1.csv has changed since\\)"):
        run(True)
    _simfl_pair_data(tmp_path)  # the data back as it was: more trees resume
    run(True, trees=5, extra="")
    assert load_model(tmp_path / "runs" / "p0.model.json").n_trees == 5
    # the same file read otherwise: a column taken as the rows' weights (a feature before) went on silently
    frame = pd.read_csv(tmp_path / "p1.csv")
    frame.assign(b=frame["b"].abs()).to_csv(tmp_path / "p1.csv", index=False)
    run(False, trees=2)
    weighted = SIMFL_PAIR.format(trees=4, schedule="round-robin", threads=1, extra="") \
        .replace('data = "p1.csv"\nlabel = "y"\n', 'data = "p1.csv"\nlabel = "y"\nweight = "b"\n')
    with pytest.raises(InvalidParameterError, match="p1.checkpoint.json was written by another run \\(the party's "
                                                    "weight None there, 'b' here\\)"):
        run(True, text=weighted)


def test_horizontal_contributions_are_printed_and_shown_by_info(tmp_path, capsys, monkeypatch):
    # [horizontal] contributions = true: the aggregator's split Shapley values were only in its JSON files
    r = np.random.default_rng(1)
    X = r.normal(size=(600, 4))
    y = (X[:, 0] > 0).astype(int)
    noisy = r.integers(0, 2, 300)  # c1's labels carry no signal: it contributes less
    for k, labels in ((0, y[0::2]), (1, noisy)):
        df = pd.DataFrame(X[k::2], columns=list("abcd"))
        df["label"] = labels
        df.to_csv(tmp_path / f"c{k}.csv", index=False)
    (tmp_path / "fed.toml").write_text(
        '[federation]\nprotocol = "horizontal"\n[horizontal]\ncontributions = true\n'
        '[params]\nn_estimators = 3\nmax_depth = 3\n'
        '[[party]]\nname = "agg"\nrole = "aggregator"\n'
        '[[party]]\nname = "c0"\nrole = "client"\ndata = "c0.csv"\nlabel = "label"\n'
        '[[party]]\nname = "c1"\nrole = "client"\ndata = "c1.csv"\nlabel = "label"\n[output]\ndir = "out"\n')
    from fedgrove.cli.main import main
    from fedgrove.engine.model import load_model

    assert main(["simulate", str(tmp_path / "fed.toml")]) == 0
    shapley = load_model(tmp_path / "out" / "agg.model.json").metadata["contributions"]
    assert shapley["c0"]["shapley"] > 0 > shapley["c1"]["shapley"]  # noise hurts the splits it is in
    printed = capsys.readouterr().out
    line = next(x for x in printed.splitlines() if x.startswith("agg: contributions (split Shapley): "))
    assert line.index("c0 ") < line.index("c1 ") and "%)" in line  # largest first, with shares
    assert main(["info", str(tmp_path / "out" / "agg.model.json")]) == 0
    assert "contributions" in capsys.readouterr().out
    # with more clients than are valued exactly (here: made one), the sampled totals come with their standard
    # errors, which were dropped, and cover the exact values
    from fedgrove.ledger import contributions

    monkeypatch.setattr(contributions, "EXACT_MAX", 1)
    assert main(["simulate", str(tmp_path / "fed.toml")]) == 0
    sampled = load_model(tmp_path / "out" / "agg.model.json").metadata["contributions"]
    for c in ("c0", "c1"):
        assert 0 < sampled[c]["shapley_se"] and "shapley_se" not in shapley[c]
        assert abs(sampled[c]["shapley"] - shapley[c]["shapley"]) < 4 * sampled[c]["shapley_se"] + 1e-6
    assert f"c0 {sampled['c0']['shapley']:.4g} ± " in capsys.readouterr().out


def test_a_party_whose_port_is_taken_says_so_in_one_line(tmp_path, monkeypatch):
    # gRPC's C core printed its own "E1124 ... add_port.cc:83] Failed to add port ..." above fedgrove's message
    import re
    import socket

    _setup(tmp_path)
    monkeypatch.delenv("GRPC_VERBOSITY", raising=False)  # as a user's shell has it (this process's gRPC set it)
    port = int(re.search(r'listen = "127.0.0.1:(\d+)"', (tmp_path / "party1.toml").read_text()).group(1))
    with socket.socket() as held:
        held.bind(("127.0.0.1", port))
        held.listen()
        proc = _start(tmp_path, "party1")
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 5
    assert f"cannot listen on 127.0.0.1:{port}: another process holds the port" in err
    assert "add_port" not in err and err.strip().count("\n") == 0, err
