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
    r = np.random.default_rng(4)
    X = r.normal(size=(300, 4))
    y = (X[:, 0] - X[:, 2] > 0).astype(int)
    for k in range(2):
        df = pd.DataFrame(X[k::2], columns=list("abcd"))
        df["label"] = y[k::2]
        (change_c1(df) if k == 1 else df).to_csv(tmp_path / f"c{k}.csv", index=False)
    return _config(tmp_path, protocol, [f'data = "c{k}.csv"\nlabel = "label"\n' for k in range(2)],
                   PROTOCOLS[protocol][2], out)


def _config(tmp_path, protocol, tables, extra, out="out"):
    """fed.toml: the protocol's lead (if it has one) and parties c0, c1, ... with the keys ``tables`` gives."""
    lead, role, _ = PROTOCOLS[protocol]
    parties = (f'[[party]]\nname = "agg"\nrole = "{lead}"\n' if lead else "") + "".join(
        f'[[party]]\nname = "c{k}"\nrole = "{role}"\n{keys}' for k, keys in enumerate(tables))
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


def _libsvm_federation(tmp_path, protocol, width=None, test=False):
    """Two parties with LIBSVM files: c0's rows reach feature 4, c1's only feature 3 (LIBSVM leaves zeros out);
    ``width``: their n_features; ``test``: each also predicts a test file whose rows end at feature 2."""
    from sklearn.datasets import dump_svmlight_file

    r = np.random.default_rng(4)
    X = r.normal(size=(400, 4))
    y = (X[:, 0] - X[:, 2] > 0).astype(int)
    dump_svmlight_file(X[:150], y[:150], str(tmp_path / "c0.svm"))
    dump_svmlight_file(np.where(np.arange(4) < 3, X[150:300], 0), y[150:300], str(tmp_path / "c1.svm"))
    dump_svmlight_file(np.where(np.arange(4) < 2, X[300:], 0), y[300:], str(tmp_path / "t.svm"))
    tables = [f'data = "c{k}.svm"\n' + (f"n_features = {width}\n" if width else "")
              + ('test = "t.svm"\n' if test else "") for k in range(2)]
    extra = PROTOCOLS[protocol][2].replace("n_hashes = 3", "n_hashes = 2")  # SimFL's L below every width here
    return _config(tmp_path, protocol, tables, extra)


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_parties_with_libsvm_files_of_other_widths_are_told_to_give_n_features(tmp_path, capsys, protocol):
    assert main(["simulate", str(_libsvm_federation(tmp_path, protocol))]) != 0
    err = " ".join(capsys.readouterr().err.split())
    assert "the parties hold different numbers of features: {'c0': 4, 'c1': 3}" in err
    assert "same n_features = ... in their [[party]] tables" in err and "Traceback" not in err
    assert main(["simulate", str(_libsvm_federation(tmp_path, protocol, width=4))]) == 0, capsys.readouterr().err


def test_libsvm_parties_read_their_files_at_n_features_and_test_files_at_the_training_width(tmp_path, capsys):
    import json

    assert main(["simulate", str(_libsvm_federation(tmp_path, "simfl", width=3))]) != 0  # c0 has a 4th feature
    err = " ".join(capsys.readouterr().err.split())  # named by its index in the file (numbered from 0)
    assert "has values in features beyond n_features = 3: f3; raise n_features" in err
    # a test file narrower than the training files (before: "X must have shape (n_samples, 4), got (100, 2)")
    assert main(["simulate", str(_libsvm_federation(tmp_path, "simfl", width=4, test=True))]) == 0, \
        capsys.readouterr().err
    assert json.loads((tmp_path / "out" / "c1.stats.json").read_text())["n_test"] == 100
    cfg = tmp_path / "fed.toml"  # without n_features, each reads the test file as wide as its own training file
    (tmp_path / "c2.svm").write_bytes((tmp_path / "c0.svm").read_bytes())
    cfg.write_text(cfg.read_text().replace('data = "c1.svm"', 'data = "c2.svm"').replace("n_features = 4\n", ""))
    assert main(["simulate", str(cfg)]) == 0, capsys.readouterr().err
    for bad, message in (("0", "n_features must be a whole number >= 1, got 0"),
                         ('"4"', "n_features must be a whole number >= 1, got '4'")):
        cfg.write_text(cfg.read_text().replace('data = "c0.svm"\n', f'data = "c0.svm"\nn_features = {bad}\n', 1))
        assert main(["simulate", str(cfg)]) != 0
        assert message in capsys.readouterr().err
        cfg.write_text(cfg.read_text().replace(f"n_features = {bad}\n", ""))


@pytest.mark.parametrize("key, why", [("n_features = 4", "as wide as their largest feature index"),
                                     ("libsvm_base = 0", "numbered by index")])
def test_libsvm_keys_are_refused_for_files_whose_columns_are_named(tmp_path, capsys, key, why):
    cfg = _federation(tmp_path, "simfl")
    cfg.write_text(cfg.read_text().replace('data = "c0.csv"\n', f'data = "c0.csv"\n{key}\n'))
    assert main(["simulate", str(cfg)]) != 0
    err = " ".join(capsys.readouterr().err.split())
    assert f"{key.split()[0]} is for LIBSVM files ({why})" in err and "data = 'c0.csv' is csv" in err


def test_over_grpc_the_parties_waiting_on_the_refusing_one_stop_at_once_with_its_reason(tmp_path):
    # the aggregator refuses the clients' features; the clients, waiting for its cut points, are told why at
    # once instead of waiting out the timeout
    import time

    from tests.integration.test_federation_processes import _start, _write_configs

    _federation(tmp_path, "horizontal", lambda df: df[["label", "b", "a", "c", "d"]])
    role = {"agg": "aggregator", "c0": "client", "c1": "client"}
    names = _write_configs(tmp_path, role, "c0", '[federation]\nprotocol = "horizontal"\ntimeout = 150\n'
                           '[params]\nn_estimators = 2\nmax_depth = 2\n')
    conf = tmp_path / "c1.toml"
    conf.write_text(conf.read_text().replace('data = "c1.csv"\n', 'data = "c1.csv"\nlabel = "label"\n'))
    t0 = time.monotonic()
    procs = {n: _start(tmp_path, n) for n in names}
    errs = {n: p.communicate(timeout=300)[1] for n, p in procs.items()}
    # within the 150 s timeout: nobody waited it out (three processes starting on a loaded 2-CPU machine took
    # 70 s, which a 30 s timeout could not tell from waiting)
    assert time.monotonic() - t0 < 150
    assert all(procs[n].returncode not in (0, None) for n in names)
    assert "feature columns differ in names or order" in errs["agg"]
    for n in ("c0", "c1"):
        assert f"{n}: stopped waiting for agg at cuts: party agg failed: the parties' feature columns" in errs[n]
        assert "Traceback" not in errs[n]


def _categorical_federation(tmp_path, protocol, colours, categorical, out):
    """Two parties (a vertical active and passive, or two horizontal peers) with a text column ``colour``
    (party k's rows draw it from ``colours[k]``) and a test file each."""
    r = np.random.default_rng(5)
    n = 200
    rows = []
    for k in range(2):
        colour = r.choice(colours[k], n)
        x = r.normal(size=n)
        rows.append(pd.DataFrame({"_id": np.arange(n) + (0 if protocol == "vertical" else k * n), "x": x,
                                  "colour": colour, "label": ((colour == "red") ^ (x > 1)).astype(int)}))
    if protocol == "vertical":  # same instances: party 0 holds x and the labels, party 1 the colour
        files = {0: rows[0][["_id", "x", "label"]], 1: rows[0][["_id", "colour"]]}
    else:
        files = {0: rows[0], 1: rows[1]}
    for k, df in files.items():
        df.iloc[:150].to_csv(tmp_path / f"p{k}.csv", index=False)
        test = df.iloc[150:].copy()
        if "colour" in test:
            test.loc[test.index[:3], "colour"] = "violet"  # not seen in training: missing
        test.to_csv(tmp_path / f"p{k}-test.csv", index=False)
    roles = ("active", "passive") if protocol == "vertical" else ("party", "party")
    parties = "".join(f'[[party]]\nname = "p{k}"\nrole = "{roles[k]}"\ndata = "p{k}.csv"\ntest = "p{k}-test.csv"\n'
                      + ('label = "label"\n' if "label" in files[k] else "")
                      + (f"categorical = {categorical}\n" if categorical and "colour" in files[k] else "")
                      for k in range(2))
    cfg = tmp_path / f"{out}.toml"
    he = '[he]\nscheme = "ou"\n' if protocol == "vertical" else ""
    cfg.write_text(f'[federation]\nprotocol = "{protocol}"\n{he}[params]\nn_estimators = 5\n'
                   f'max_depth = 3\nmax_bins = 8\n{parties}[output]\ndir = "{out}"\n')
    return cfg


@pytest.mark.parametrize("protocol", ["vertical", "simfl"])
def test_a_federation_encodes_text_columns_as_the_configs_say_and_predicts_with_the_same_codes(tmp_path, capsys,
                                                                                            protocol):
    import json

    colours = [["red", "green", "blue"]] * 2
    assert main(["simulate", str(_categorical_federation(tmp_path, protocol, colours, None, "plain"))]) != 0
    err = capsys.readouterr().err
    assert "non-numeric value" in err and 'categorical = "auto" in a federation party\'s [[party]] table' in err
    assert main(["simulate", str(_categorical_federation(tmp_path, protocol, colours, '"auto"', "auto"))]) == 0
    capsys.readouterr()
    holder = "p1" if protocol == "vertical" else "p0"
    assert json.loads((tmp_path / "auto" / f"{holder}.categories.json").read_text()) == {
        "colour": ["blue", "green", "red"]}
    stats = json.loads((tmp_path / "auto" / "p0.stats.json").read_text())
    assert stats["test_accuracy"] > 0.8  # red or not, learnt from the codes (the majority class: about 0.6)
    (tmp_path / "auto" / "p0.predictions.csv").rename(tmp_path / "first.csv")
    assert main(["simulate", str(tmp_path / "auto.toml"), "--predict"]) == 0  # from the files, same codes
    assert (tmp_path / "auto" / "p0.predictions.csv").read_bytes() == (tmp_path / "first.csv").read_bytes()
    if protocol == "vertical":  # a damaged categories file: a list was read as columns to find categories in,
        kept = (tmp_path / "auto" / f"{holder}.categories.json").read_text()  # a string as its letters
        for damaged, said in (('["colour"]', "expected each text column's categories"),
                              ('{"colour": "red"}', "must be a list of category names, got 'red'"),
                              ('{"colour": ["red", "blue", "red"]}', "name one category twice")):
            (tmp_path / "auto" / f"{holder}.categories.json").write_text(damaged)
            assert main(["simulate", str(tmp_path / "auto.toml"), "--predict"]) == 4
            assert f"{holder}.categories.json is damaged" in (err := capsys.readouterr().err) and said in err, err
        (tmp_path / "auto" / f"{holder}.categories.json").write_text(kept)
    if protocol == "simfl":  # a whole-model party's model predicts a file by itself
        code = main(["predict", str(tmp_path / "auto" / "p0.model.json"), str(tmp_path / "p0-test.csv")])
        assert code == 0 and "taken as missing: colour (3 rows)" in capsys.readouterr().err


def test_horizontal_parties_with_other_categories_are_refused_unless_the_config_lists_them(tmp_path, capsys):
    colours = [["red", "green", "blue"], ["red", "blue"]]  # p1 has no green: its codes would mean other colours
    assert main(["simulate", str(_categorical_federation(tmp_path, "simfl", colours, '"auto"', "auto"))]) != 0
    err = capsys.readouterr().err
    assert "or in a categorical column's categories," in err and "(parties that agree: p0 | p1)" in err
    # each party notes what it found, in the form its config takes: p0's line, pasted, is the fix
    assert 'party p1: categories found in' in err and 'categorical = {colour = ["blue", "red"]}' in err
    listed = err.split("party p0: categories found in")[1].split("categorical = ")[1].splitlines()[0]
    assert listed == '{colour = ["blue", "green", "red"]}'
    assert main(["simulate", str(_categorical_federation(tmp_path, "simfl", colours, listed, "listed"))]) == 0


def test_a_column_name_that_is_no_bare_toml_key_is_quoted_in_the_categories_note():
    import tomllib

    from fedgrove.runner.roles import _toml_key

    for name in ("colour", "mean radius", 'a"b', "x.y"):
        assert tomllib.loads(f"categorical = {{{_toml_key(name)} = [\"v\"]}}")["categorical"] == {name: ["v"]}


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_from_python_dataframes_give_the_model_their_names_and_are_checked_as_files_are(protocol):
    # run_* given DataFrames: the model predicts a frame by column name, like the engine's; a party whose
    # columns come in another order is refused (the names were dropped, and the columns mixed up silently)
    from fedgrove.engine.gbdt import GBDTParams
    from fedgrove.exceptions import ProtocolError
    from fedgrove.protocols.fvtree.party import FVTreeOptions
    from fedgrove.protocols.fvtree.simulate import run_fvtree
    from fedgrove.protocols.horizontal.simulate import run_horizontal
    from fedgrove.protocols.simfl.lsh import LSHParams
    from fedgrove.protocols.simfl.party import SimFLOptions
    from fedgrove.protocols.simfl.simulate import run_simfl

    r = np.random.default_rng(4)
    X = pd.DataFrame(r.normal(size=(300, 4)), columns=list("abcd"))
    y = pd.Series((X["a"] - X["c"] > 0).astype(int))
    params = GBDTParams(objective="binary", n_estimators=3, max_depth=2, max_bins=8, seed=0)
    run = {"horizontal": lambda parts: run_horizontal(parts, params, timeout=30),
           "simfl": lambda parts: run_simfl(parts, params, SimFLOptions(LSHParams(n_hashes=3)), timeout=30),
           "fvtree": lambda parts: run_fvtree(parts, params, FVTreeOptions(threshold=1.0), timeout=30)}[protocol]
    model = run([(X.iloc[k::2], y.iloc[k::2]) for k in range(2)])["model"]
    assert model.feature_names == list("abcd")
    np.testing.assert_array_equal(model.predict_raw(X[list("dcba")]), model.predict_raw(X.to_numpy()))
    with pytest.raises(ProtocolError, match="feature columns differ in names or order"):
        run([(X.iloc[0::2], y.iloc[0::2]), (X.iloc[1::2][list("badc")], y.iloc[1::2])])


@pytest.mark.parametrize("protocol", ["vertical", "hybridtree", "federated-forest"])
def test_from_python_each_partys_test_frame_is_matched_by_name(protocol):
    # every party of a vertical-style federation keeps its columns' names: test DataFrames with the columns in
    # another order predict the same, and one lacking a column is refused naming it (both were read by position)
    from sklearn.datasets import load_breast_cancer

    from fedgrove.crypto.he import keygen
    from fedgrove.engine.forest import ForestParams
    from fedgrove.engine.gbdt import GBDTParams
    from fedgrove.exceptions import DataError
    from fedgrove.protocols.forest.simulate import run_federated_forest
    from fedgrove.protocols.hybridtree.simulate import run_hybridtree
    from fedgrove.protocols.vertical.simulate import run_vertical

    X, y = load_breast_cancer(return_X_y=True, as_frame=True)
    X, y = X.iloc[:200, :12], y.iloc[:200].to_numpy().astype(float)
    he = keygen("ou")
    params = GBDTParams(objective="binary", n_estimators=2, max_depth=3, max_bins=8, seed=0)
    cols = [list(X.columns[:6]), list(X.columns[6:])]
    ids = np.arange(len(y))

    def run(order):  # order(columns) -> the test frame's columns
        if protocol == "vertical":
            return run_vertical([X[c] for c in cols], y, params, he, X_test_parts=[X[order(c)] for c in cols])["raw"]
        if protocol == "federated-forest":
            out = run_federated_forest([X[c] for c in cols], y, ForestParams(n_estimators=2, max_depth=3, seed=0),
                                       he, X_test_parts=[X[order(c)] for c in cols])
            return out["predictions"]["one-round"]
        guests = [(X.iloc[u::2][cols[1]], ids[u::2]) for u in range(2)]
        return run_hybridtree(X[cols[0]], y, guests, params, he, host_depth=2, guest_depth=1,
                              X_test_host=X[order(cols[0])], test_guests=[(X[order(cols[1])], ids)] * 2)["test_raw"]

    np.testing.assert_array_equal(run(lambda c: c[::-1]), run(lambda c: c))
    with pytest.raises(DataError, match="is not a column of .*test features: 'mean radius'"):
        run(lambda c: c[1:] if "mean radius" in c else c)


def test_libsvm_parties_must_number_features_alike_and_test_files_follow_their_training_files(tmp_path, capsys):
    # scikit-learn writes LIBSVM files numbered from 0; c1's rows never hold feature 0, so its file read as
    # numbered from 1 and its features were shifted by one against c0's, without a sign
    from sklearn.datasets import dump_svmlight_file

    r = np.random.default_rng(6)
    X = r.normal(size=(400, 4))
    y = (X[:, 1] - X[:, 2] > 0).astype(int)
    X[200:, 0] = 0
    dump_svmlight_file(X[:200], y[:200], str(tmp_path / "c0.svm"))
    dump_svmlight_file(X[200:300], y[200:300], str(tmp_path / "c1.svm"))
    dump_svmlight_file(X[300:], y[300:], str(tmp_path / "t.svm"))  # no feature 0 either
    tables = ['data = "c0.svm"\ntest = "t.svm"\n', 'data = "c1.svm"\ntest = "t.svm"\nn_features = 4\n']
    cfg = _config(tmp_path, "simfl", tables, "[simfl]\nn_hashes = 2\n")
    assert main(["simulate", str(cfg)]) != 0
    err = " ".join(capsys.readouterr().err.split())
    assert "or in their LIBSVM files' first feature index (parties that agree: c0 | c1)" in err
    assert "give its party libsvm_base = 0" in err
    cfg.write_text(cfg.read_text().replace("n_features = 4\n", "n_features = 4\nlibsvm_base = 0\n"))
    assert main(["simulate", str(cfg)]) == 0, capsys.readouterr().err
    # c0's test file, which holds no feature 0 either, is read numbered as c0's training file
    from fedgrove import load_model

    model = load_model(tmp_path / "out" / "c0.model.json")
    got = pd.read_csv(tmp_path / "out" / "c0.predictions.csv")
    np.testing.assert_array_equal(got["prediction"].to_numpy(), model.predict(X[300:]))
    for bad, message in (("2", "libsvm_base must be 0 or 1 (the index of a LIBSVM file's first feature), got 2"),
                         ("true", "libsvm_base must be 0 or 1")):
        cfg.write_text(cfg.read_text().replace("libsvm_base = 0\n", f"libsvm_base = {bad}\n"))
        assert main(["simulate", str(cfg)]) != 0
        assert message in capsys.readouterr().err
        cfg.write_text(cfg.read_text().replace(f"libsvm_base = {bad}\n", "libsvm_base = 0\n"))
