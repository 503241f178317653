"""Horizontal protocols (parties with the same features): a party whose columns are in another order, or named
otherwise, is refused by name before training; without the check its columns were mixed up silently."""

import numpy as np
import pandas as pd
import pytest

from fedgrove.cli.main import main

PROTOCOLS = {
    "horizontal": ("aggregator", "client", ""),
    "simfl": (None, "party", "[simfl]\nn_hashes = 3\n"),
    "fvtree": (None, "party", "[fvtree]\nthreshold = 1.0\n"),
}


def _federation(tmp_path, protocol, change_c1=lambda df: df, out="out"):
    lead, role, extra = PROTOCOLS[protocol]
    r = np.random.default_rng(4)
    X = r.normal(size=(300, 4))
    y = (X[:, 0] - X[:, 2] > 0).astype(int)
    for k in range(2):
        df = pd.DataFrame(X[k::2], columns=list("abcd"))
        df["label"] = y[k::2]
        (change_c1(df) if k == 1 else df).to_csv(tmp_path / f"c{k}.csv", index=False)
    parties = (f'[[party]]\nname = "agg"\nrole = "{lead}"\n' if lead else "") + "".join(
        f'[[party]]\nname = "c{k}"\nrole = "{role}"\ndata = "c{k}.csv"\nlabel = "label"\n' for k in range(2))
    cfg = tmp_path / "fed.toml"
    cfg.write_text(f'[federation]\nprotocol = "{protocol}"\n[params]\nn_estimators = 2\nmax_depth = 2\n'
                   f'max_bins = 8\n{extra}{parties}[output]\ndir = "{out}"\n')
    return cfg


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_parties_whose_columns_differ_in_order_or_name_are_refused(tmp_path, capsys, protocol):
    assert main(["simulate", str(_federation(tmp_path, protocol))]) == 0
    capsys.readouterr()
    for k, change in enumerate((lambda df: df[["label", "b", "a", "c", "d"]],
                                lambda df: df.rename(columns={"d": "e"}))):
        assert main(["simulate", str(_federation(tmp_path, protocol, change, f"bad{k}"))]) != 0
        err = capsys.readouterr().err
        assert "feature columns differ in names or order" in err and "c0 | c1" in err and "Traceback" not in err


def test_over_grpc_the_parties_waiting_on_the_refusing_one_stop_at_once_with_its_reason(tmp_path):
    # the aggregator refuses the clients' features; the clients, waiting for its cut points, are told why at
    # once instead of waiting out the timeout
    import time

    from tests.integration.test_federation_processes import _start, _write_configs

    _federation(tmp_path, "horizontal", lambda df: df[["label", "b", "a", "c", "d"]])
    role = {"agg": "aggregator", "c0": "client", "c1": "client"}
    names = _write_configs(tmp_path, role, "c0", '[federation]\nprotocol = "horizontal"\ntimeout = 30\n'
                           '[params]\nn_estimators = 2\nmax_depth = 2\n')
    conf = tmp_path / "c1.toml"
    conf.write_text(conf.read_text().replace('data = "c1.csv"\n', 'data = "c1.csv"\nlabel = "label"\n'))
    t0 = time.monotonic()
    procs = {n: _start(tmp_path, n) for n in names}
    errs = {n: p.communicate(timeout=120)[1] for n, p in procs.items()}
    assert time.monotonic() - t0 < 30  # within the 30 s timeout: nobody waited it out
    assert all(procs[n].returncode not in (0, None) for n in names)
    assert "feature columns differ in names or order" in errs["agg"]
    for n in ("c0", "c1"):
        assert f"{n}: stopped waiting for agg at cuts: party agg failed: the parties' feature columns" in errs[n]
        assert "Traceback" not in errs[n]
