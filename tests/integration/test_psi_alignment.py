"""[federation] align = "psi": parties whose files hold overlapping sets of instances train and predict on those
every party holds, found by private set intersection, exactly as on files holding only those."""

import numpy as np
import pandas as pd
import pytest

from fedgrove.cli.main import main

HEAD = {"vertical": """[federation]
protocol = "vertical"
{align}
[he]
scheme = "ou"
[params]
objective = "binary"
n_estimators = 3
max_depth = 3
""", "federated-forest": """[federation]
protocol = "federated-forest"
{align}
[he]
scheme = "ou"
[params]
n_estimators = 4
max_depth = 4
max_bins = 16
[[party]]
name = "master"
role = "master"
"""}
ROLES = {"vertical": ("active", "passive"), "federated-forest": ("client", "client")}


@pytest.mark.parametrize("protocol", ["vertical", "federated-forest"])
def test_align_psi_trains_on_the_instances_every_party_holds_as_if_given_only_those(tmp_path, capsys, protocol):
    # parties whose files hold overlapping sets of instances were refused ("align the parties' data by ID
    # first", which meant showing each other the IDs); with align = "psi" the federation keeps the rows all
    # hold, found without an ID in the clear, and trains and predicts as on files holding only those
    rng = np.random.default_rng(4)
    n = 400
    X = rng.normal(size=(n, 4))
    y = (X[:, 0] - X[:, 2] > 0).astype(int)
    frames = {"a": pd.DataFrame({"_id": np.arange(n) * 7, "x0": X[:, 0], "x1": X[:, 1], "label": y}),
              "b": pd.DataFrame({"_id": np.arange(n) * 7, "x2": X[:, 2], "x3": X[:, 3]})}
    held = {"a": rng.random(n) < 0.9, "b": rng.random(n) < 0.8}
    train = np.arange(n) < 300
    both = held["a"] & held["b"]
    config = HEAD[protocol] + "".join(
        f'[[party]]\nname = "{name}"\nrole = "{role}"\ndata = "{{d}}/{name}.csv"\ntest = "{{d}}/{name}-test.csv"\n'
        + ('label = "label"\n' if name == "a" else "") for name, role in zip("ab", ROLES[protocol])) \
        + '[output]\ndir = "{d}/out"\n'
    for d, rows, align in (("psi", held, 'align = "psi"'), ("exact", {"a": both, "b": both}, "")):
        (tmp_path / d).mkdir()
        for name, df in frames.items():
            df[train & rows[name]].sample(frac=1, random_state=2).to_csv(tmp_path / d / f"{name}.csv", index=False)
            df[~train & rows[name]].to_csv(tmp_path / d / f"{name}-test.csv", index=False)
        (tmp_path / d / "fed.toml").write_text(config.format(align=align, d=tmp_path / d))
    assert main(["simulate", str(tmp_path / "exact" / "fed.toml")]) == 0
    cfg = tmp_path / "psi" / "fed.toml"
    cfg.write_text(cfg.read_text().replace('align = "psi"', ""))
    assert main(["simulate", str(cfg)]) == 5  # without it the parties must hold the same instances
    assert 'by ID first, or set [federation] align = "psi" in every party\'s config' in \
        " ".join(capsys.readouterr().err.split())
    cfg.write_text(cfg.read_text().replace(f'protocol = "{protocol}"', f'protocol = "{protocol}"\nalign = "psi"'))
    assert main(["simulate", str(cfg)]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert f"a: {int((train & both).sum())} instances are held by every party" in err
    lead = "a" if protocol == "vertical" else "master"
    for name in ("a", "b", lead):
        psi_run, exact_run = (tmp_path / d / "out" / f"{name}.model.json" for d in ("psi", "exact"))
        assert psi_run.read_bytes() == exact_run.read_bytes()
    preds = [pd.read_csv(tmp_path / d / "out" / f"{lead}.predictions.csv") for d in ("psi", "exact")]
    pd.testing.assert_frame_equal(preds[0], preds[1])
    assert sorted(preds[0]["_id"]) == sorted(frames["a"]["_id"][~train & both])
    # a party without IDs cannot take part, and is told so
    pd.read_csv(tmp_path / "psi" / "b.csv").drop(columns="_id").to_csv(tmp_path / "psi" / "b.csv", index=False)
    capsys.readouterr()
    assert main(["simulate", str(cfg)]) == 3
    assert 'federation.align = "psi" intersects the parties\' instance IDs' in capsys.readouterr().err


def test_hybridtree_guests_keep_the_instances_the_host_holds_without_naming_the_others(tmp_path, monkeypatch):
    # guests holding instances of other hosts too told this host their IDs (GuestLayout) and the host kept those
    # it holds (shared_only); with align = "psi" each guest keeps the rows the host holds, found by PSI, and
    # names only those: the same model files as guests given only those rows
    from fedgrove.protocols.hybridtree import messages as hm
    from fedgrove.transport.inprocess import InProcessHub

    rng = np.random.default_rng(5)
    n = 500
    X = rng.normal(size=(n, 6))
    y = (X[:, 0] + X[:, 3] - X[:, 5] > 0).astype(int)
    ids = np.arange(n) * 3 + 1
    mine = rng.random(n) < 0.7  # the host's instances; the guests also hold others (another host's)
    config = """[federation]
protocol = "hybridtree"
{align}
[hybridtree]
host_depth = 2
guest_depth = 1
[he]
scheme = "ou"
[params]
objective = "binary"
n_estimators = 3
max_bins = 16
[[party]]
name = "host"
role = "host"
data = "{d}/host.csv"
label = "label"
""" + "".join(f'[[party]]\nname = "guest{u}"\nrole = "guest"\ndata = "{{d}}/guest{u}.csv"\n' for u in range(2)) \
        + '[output]\ndir = "{d}/out"\n'
    host = pd.DataFrame({"_id": ids, "h0": X[:, 0], "h1": X[:, 1], "h2": X[:, 2], "label": y})[mine]
    guests = [pd.DataFrame({"_id": ids, "g3": X[:, 3], "g4": X[:, 4], "g5": X[:, 5]})[np.arange(n) % 2 == u]
              for u in range(2)]
    for d, align in (("psi", 'align = "psi"'), ("exact", "")):
        (tmp_path / d).mkdir()
        host.to_csv(tmp_path / d / "host.csv", index=False)
        for u, g in enumerate(guests):
            (g if d == "psi" else g[g["_id"].isin(host["_id"])]).to_csv(tmp_path / d / f"guest{u}.csv", index=False)
        (tmp_path / d / "fed.toml").write_text(config.format(align=align, d=tmp_path / d))
    named = []
    channel = InProcessHub.channel

    def watched(hub, party, *a, **kw):
        ch = channel(hub, party, *a, **kw)
        ch.observers.append(lambda d, peer, tag, msg: d == "send" and isinstance(msg, hm.GuestLayout)
                            and named.extend(msg.ids.tolist()))
        return ch
    monkeypatch.setattr(InProcessHub, "channel", watched)
    assert main(["simulate", str(tmp_path / "psi" / "fed.toml")]) == 0
    assert sorted(named) == sorted(host["_id"]) and len(named) < sum(len(g) for g in guests)
    assert main(["simulate", str(tmp_path / "exact" / "fed.toml")]) == 0
    for name in ("host", "guest0", "guest1"):
        psi_run, exact_run = (tmp_path / d / "out" / f"{name}.model.json" for d in ("psi", "exact"))
        assert psi_run.read_bytes() == exact_run.read_bytes()


def test_text_instance_ids_train_and_predict_like_numbers(tmp_path):
    # an _id column of text (cust-17) stopped the federation with "invalid literal for int()"; now every party
    # codes it alike, intersects by it, and the predictions name the instances by their text
    rng = np.random.default_rng(6)
    n = 300
    X = rng.normal(size=(n, 4))
    y = (X[:, 0] - X[:, 2] > 0).astype(int)
    held = {"a": rng.random(n) < 0.9, "b": rng.random(n) < 0.85}
    train = np.arange(n) < 220
    preds = {}
    for kind, ids in (("numbers", np.arange(n) * 7), ("text", np.array([f"cust-{7 * k}" for k in range(n)]))):
        d = tmp_path / kind
        d.mkdir()
        frames = {"a": pd.DataFrame({"_id": ids, "x0": X[:, 0], "x1": X[:, 1], "label": y}),
                  "b": pd.DataFrame({"_id": ids, "x2": X[:, 2], "x3": X[:, 3]})}
        for name, df in frames.items():
            df[train & held[name]].to_csv(d / f"{name}.csv", index=False)
            df[~train & held[name]].to_csv(d / f"{name}-test.csv", index=False)
        (d / "fed.toml").write_text(HEAD["vertical"].format(align='align = "psi"') + "".join(
            f'[[party]]\nname = "{name}"\nrole = "{role}"\ndata = "{d}/{name}.csv"\ntest = "{d}/{name}-test.csv"\n'
            + ('label = "label"\n' if name == "a" else "") for name, role in zip("ab", ROLES["vertical"]))
            + f'[output]\ndir = "{d}/out"\n')
        assert main(["simulate", str(d / "fed.toml")]) == 0
        preds[kind] = pd.read_csv(d / "out" / "a.predictions.csv")
    both = ~train & held["a"] & held["b"]
    assert sorted(preds["text"]["_id"]) == sorted(f"cust-{7 * k}" for k in np.nonzero(both)[0])
    by_number = preds["numbers"].set_index("_id")
    again = preds["text"].assign(_id=[int(v.removeprefix("cust-")) for v in preds["text"]["_id"]]).set_index("_id")
    np.testing.assert_allclose(again.loc[by_number.index, "p_1"], by_number["p_1"], rtol=0, atol=1e-9)
