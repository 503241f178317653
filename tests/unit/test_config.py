"""Federation configs: the [federation] table's keys and timeouts are checked when the file is read."""

import pytest

from fedgrove.exceptions import InvalidParameterError
from fedgrove.runner.config import load_federation

BASE = """[federation]
protocol = "vertical"
{extra}
[[party]]
name = "a"
role = "active"
data = "a.csv"
label = "y"
[[party]]
name = "b"
role = "passive"
data = "b.csv"
"""


def _peer_config(protocol):
    """BASE for a protocol whose parties are peers (role "party")."""
    return BASE.format(extra="").replace('"vertical"', f'"{protocol}"').replace('"active"', '"party"') \
        .replace('"passive"', '"party"')


def _load(tmp_path, extra):
    path = tmp_path / "federation.toml"
    path.write_text(BASE.format(extra=extra))
    return load_federation(path)


def test_a_config_is_utf_8_with_or_without_a_byte_order_mark_whatever_the_locale(tmp_path):
    # TOML is UTF-8: a file saved "UTF-8 with BOM" (Windows Notepad) was refused as "Invalid statement (at line 1,
    # column 1)", and a file was read in the locale's encoding (an ASCII locale could not read a label "Größe")
    import os
    import subprocess
    import sys

    text = BASE.format(extra="").replace('label = "y"', 'label = "Größe"')
    path = tmp_path / "federation.toml"
    path.write_bytes(b"\xef\xbb\xbf" + text.encode("utf-8"))
    assert load_federation(path).parties[0].label == "Größe"
    path.write_bytes(text.encode("utf-8"))
    env = {k: v for k, v in os.environ.items() if k not in ("LANG", "PYTHONIOENCODING")}
    env.update(LC_ALL="C", PYTHONUTF8="0", PYTHONCOERCECLOCALE="0")
    probe = ("import sys; from fedgrove.runner.config import load_federation; "
             "print(ascii(load_federation(sys.argv[1]).parties[0].label))")
    run = subprocess.run([sys.executable, "-c", probe, str(path)], capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "'Gr\\xf6\\xdfe'", run.stdout


def test_a_path_that_starts_with_a_tilde_is_in_the_users_home(tmp_path, monkeypatch):
    # as in a shell: "~/data/a.csv" was read as a folder named "~" beside the config
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    text = BASE.format(extra='[output]\ndir = "~/runs"\n')
    text = text.replace('data = "a.csv"', 'data = "~/data/a.csv"\ntest = "a-test.csv"')
    text = text.replace('data = "b.csv"', 'data = "b.csv"\ntest = "~/data/b-test.csv"\ncerts = "~/certs"')
    path = tmp_path / "federation.toml"
    path.write_text(text)
    cfg = load_federation(path)
    home = tmp_path / "home"
    assert cfg.parties[0].data == home / "data" / "a.csv" and cfg.parties[1].data == tmp_path / "b.csv"
    assert (cfg.parties[1].test, cfg.parties[1].certs, cfg.output_dir) == (home / "data" / "b-test.csv",
                                                                         home / "certs", home / "runs")


def test_timeouts_default_and_read(tmp_path):
    cfg = _load(tmp_path, "")
    assert (cfg.timeout, cfg.startup_timeout) == (60.0, 300.0)
    cfg = _load(tmp_path, "timeout = 5\nstartup_timeout = 30")
    assert (cfg.timeout, cfg.startup_timeout) == (5.0, 30.0)


def test_align_psi_is_read_for_vertical_and_refused_where_parties_hold_other_instances(tmp_path):
    assert _load(tmp_path, "").align == "exact" and _load(tmp_path, 'align = "psi"').align == "psi"
    path = tmp_path / "federation.toml"
    path.write_text(_peer_config("simfl").replace('protocol = "simfl"', 'protocol = "simfl"\nalign = "psi"'))
    with pytest.raises(InvalidParameterError, match=r'federation.align = "psi" is for the vertical, '
                                                    r'federated-forest, hybridtree protocols.*the simfl protocol '
                                                    r'does not align instances'):
        load_federation(path)


def test_the_message_limit_defaults_to_2_gb_and_is_read(tmp_path):
    assert _load(tmp_path, "").max_message_mb == 2048
    assert _load(tmp_path, "max_message_mb = 8192").max_message_mb == 8192


def test_checkpoint_every_defaults_to_every_round_is_shared_and_left_out_of_what_a_resume_must_match(tmp_path):
    from fedgrove.runner.run import run_record

    cfg = _load(tmp_path, "")
    assert cfg.checkpoint_every == 1 and cfg.shared_settings()["federation.checkpoint_every"] == 1
    every = _load(tmp_path, "checkpoint_every = 10")
    assert every.checkpoint_every == 10 and every.shared_settings()["federation.checkpoint_every"] == 10
    # every party must checkpoint at the same rounds (compared when a run starts), but a resumed run may change it
    assert run_record(cfg, cfg.parties[0]) == run_record(every, every.parties[0])


@pytest.mark.parametrize("extra, message", [
    ("checkpoint_every = 0", r"federation.checkpoint_every must be a whole number of rounds, 1 or more \(1: after "
                             r"every round\), got 0"),
    ("checkpoint_every = 2.5", "federation.checkpoint_every must be a whole number of rounds, 1 or more .*got 2.5"),
    ("checkpoint_every = true", "federation.checkpoint_every must be a whole number .*got True"),
    ('checkpoint_every = "10"', "federation.checkpoint_every must be a whole number .*got '10'"),
    ("startup_timeout = 0", "federation.startup_timeout must be a positive number of seconds, got 0"),
    ("startup_timeout = \"long\"", "federation.startup_timeout must be a positive number"),
    ("timeout = -1", "federation.timeout must be a positive number of seconds, got -1"),
    ("timout = 5", r"\[federation\]: unknown key 'timout' \(did you mean 'timeout'\?\); expected some of protocol"),
    ("timeout = true", "federation.timeout must be a positive number of seconds, got True"),
    ("max_message_mb = 0", "federation.max_message_mb must be a number of megabytes from 1 to 65536, got 0"),
    ('align = "intersect"', "federation.align must be one of 'exact', 'psi', got 'intersect'"),
    ("max_message_mb = true", "federation.max_message_mb must be a number of megabytes from 1 to 65536, got True"),
    ('max_message_mb = "2GB"', "federation.max_message_mb must be a number of megabytes"),
    ('seed = "a"', "federation.seed must be a non-negative integer, got 'a'"),   # was a ValueError
    ("seed = -1", "federation.seed must be a non-negative integer, got -1"),
    ("[output]\ndir = 3", r"\[output\] dir must be a directory name, got 3"),        # was a TypeError
    ('[output]\ndirectory = "runs"', r"\[output\]: unknown key 'directory'; expected some of dir$"),
    # a misspelt table was ignored: the run wrote to the default folder
    ('[outptu]\ndir = "runs"', r"unknown table or key \[outptu\] \(did you mean \[output\]\?\); expected some "
                              r"of \[federation\], \[params\]"),
])
def test_bad_federation_keys_are_named(tmp_path, extra, message):
    with pytest.raises(InvalidParameterError, match=message):
        _load(tmp_path, extra)


def test_he_table_is_checked(tmp_path):
    assert _load(tmp_path, "[he]\nscheme = \"paillier\"\nrows_per_ciphertext = 2").he["rows_per_ciphertext"] == 2
    with pytest.raises(InvalidParameterError, match=r"\[he\] rows_per_ciphertext must be an integer from 1 to 16, "
                                                    r"got 0"):
        _load(tmp_path, "[he]\nrows_per_ciphertext = 0")
    with pytest.raises(InvalidParameterError, match=r"\[he\]: unknown key 'keybits' \(did you mean 'key_bits'\?\)"):
        _load(tmp_path, "[he]\nkeybits = 3072")


@pytest.mark.parametrize("extra, message", [
    ('[he]\nscheme = "rsa"', r"\[he\] scheme must be one of ou, paillier, got 'rsa'"),
    ("[he]\nkey_bits = 1024", r"\[he\] key_bits must be one of 2048, 3072, got 1024"),
    ("[he]\nkey_bits = true", r"\[he\] key_bits must be one of 2048, 3072, got True"),
    ('[he]\nbackend = "gpu"', r"\[he\] backend must be 'heu', 'gmpy2', 'phe' or 'plain'"),
    ('[he]\nbackend = "gmpy2"\nscheme = "paillier"', r"\[he\] backend 'gmpy2' implements scheme 'ou' only"),
    ('[he]\nbackend = "phe"', r"\[he\] backend 'phe' implements scheme 'paillier' only, got scheme 'ou'"),
    ("[hybridtree]\nhost_depth = 0", r"\[hybridtree\] host_depth must be an integer >= 1, got 0"),
    ("[hybridtree]\nguest_depth = -1", r"\[hybridtree\] guest_depth must be an integer >= 0, got -1"),
    ("[hybridtree]\nguest_depth = true", r"\[hybridtree\] guest_depth must be an integer >= 0, got True"),
    ("[params]\nmax_dept = 3", r"\[params\]: unknown key 'max_dept' \(did you mean 'max_depth'\?\); expected "
                               r"some of objective, "
                               r"n_estimators, learning_rate, max_depth,"),
    ("[params]\nlearning_rate = \"fast\"", r"\[params\] learning_rate must be a number, got 'fast'"),
])
def test_tables_are_checked_when_the_file_is_read(tmp_path, extra, message):
    # before any key is generated or data read: the error names the table, the key and what it takes
    if extra.startswith("[hybridtree]"):  # a HybridTree federation's own table
        path = tmp_path / "federation.toml"
        path.write_text(BASE.format(extra="").replace('"vertical"', '"hybridtree"').replace('"active"', '"host"')
                        .replace('"passive"', '"guest"') + extra + "\n")
        with pytest.raises(InvalidParameterError, match=message):
            load_federation(path)
        return
    with pytest.raises(InvalidParameterError, match=message):
        _load(tmp_path, extra)


@pytest.mark.parametrize("text, message", [
    # a table written as a value raised TypeError or AttributeError ("'int' object is not iterable")
    ('params = 5\n' + BASE.format(extra=""), r"params must be a \[params\] table, got 5"),
    ('federation = "x"\n' + BASE.format(extra="").replace('[federation]\nprotocol = "vertical"\n', ""),
     r"federation must be a \[federation\] table, got 'x'"),
    ('output = ["run"]\n' + BASE.format(extra=""), r"output must be a \[output\] table"),
    ('party = [1, 2]\n[federation]\nprotocol = "vertical"\n', r"party must be \[\[party\]\] tables, one per party"),
    (BASE.format(extra="").replace('protocol = "vertical"', 'protocol = "simfl"').replace('"active"', '"party"')
     .replace('"passive"', '"party"') + '[simfl]\nschedule = {a = 1}\n', r"schedule must be one of .*got \{'a': 1\}"),
])
def test_a_table_written_as_a_value_is_refused_naming_it(tmp_path, text, message):
    path = tmp_path / "federation.toml"
    path.write_text(text)
    with pytest.raises(InvalidParameterError, match=message):
        load_federation(path)


@pytest.mark.parametrize("protocol, table, message", [
    # ignored before: a setting the user meant did not apply
    ("vertical", '[forest]\nlabel_mode = "shared"', r"\[forest\] configures the federated-forest protocol, but "
                                                    r"federation.protocol is 'vertical'"),
    ("fvtree", '[simfl]\nn_hashes = 3', r"\[simfl\] configures the simfl protocol, but federation.protocol is "
                                        r"'fvtree'"),
    ("simfl", '[he]\nkey_bits = 3072', r"\[he\] sets the homomorphic encryption of the vertical, hybridtree, "
                                       r"federated-forest protocols; the simfl protocol uses none"),
    ("federated-forest", '[he]\nrows_per_ciphertext = 3', r"\[he\] rows_per_ciphertext packs instances' gradients "
                                                         r"for the vertical and hybridtree protocols; the "
                                                         r"federated-forest protocol encrypts each instance's"),
])
def test_tables_that_do_not_apply_to_the_protocol_are_refused(tmp_path, protocol, table, message):
    path = tmp_path / "federation.toml"
    text = BASE.format(extra="") if protocol == "vertical" else _peer_config(protocol)
    path.write_text(text.replace('"vertical"', f'"{protocol}"') + table + "\n")
    with pytest.raises(InvalidParameterError, match=message):
        load_federation(path)


@pytest.mark.parametrize("protocol, table, message", [
    # unknown keys are named with the keys the table takes
    ("fvtree", "[fvtree]\nn_candidate = 3",
     r"\[fvtree\]: unknown key 'n_candidate' \(did you mean 'n_candidates'\?\); expected some of n_candidates"),
    ("fvtree", "[fvtree.dp]\nepsilon = 1.0\nclip = 2",
     r"\[fvtree.dp\]: unknown key 'clip' \(did you mean 'g_clip'\?\); expected some of epsilon"),
    ("fvtree", "[fvtree]\ndp = 3", r"\[fvtree\] dp must be a table \(\[fvtree.dp\]\), got 3"),
    # values are checked, the error naming the table
    ("fvtree", '[fvtree]\nbeta = "x"', r"^\[fvtree\] beta must be a number, got 'x'$"),          # was a ValueError
    ("fvtree", "[fvtree]\nthreshold = [1]", r"^\[fvtree\] threshold must be a number, got \[1\]$"),  # was a TypeError
    ("fvtree", '[fvtree]\nverify = "yes"', r"^\[fvtree\] verify must be true or false, got 'yes'$"),
    ("fvtree", "[fvtree]\npsd_depth = 0", r"^\[fvtree\] psd_depth must be >= 1, got 0$"),
    # 2**depth leaf counts: depth 40 ran out the clock (and the memory) in the PSD's setup
    ("fvtree", "[fvtree]\npsd_depth = 40", r"^\[fvtree\] psd_depth must be <= 16, got 40$"),
    ("fvtree", "[fvtree.dp]\nepsilon = 2.0\nseeded = 1", r"^\[fvtree.dp\] seeded must be true or false, got 1$"),
    ("fvtree", "[fvtree.dp]\nepsilon = 2.0\ntrees_per_ensemble = 0",
     r"^\[fvtree.dp\] trees_per_ensemble must be >= 1"),
    ("simfl", '[simfl]\nschedule = "rr"', r"^\[simfl\] schedule must be one of blocks, round-robin, got 'rr'$"),
    ("simfl", '[simfl]\nforce = "yes"', r"^\[simfl\] force must be true or false, got 'yes'$"),
    ("simfl", "[simfl]\nr = -1", r"^\[simfl\] LSH window r must be a positive, finite number"),
])
def test_peer_protocol_tables_are_checked_when_the_file_is_read(tmp_path, protocol, table, message):
    path = tmp_path / "federation.toml"
    path.write_text(_peer_config(protocol) + table + "\n")
    with pytest.raises(InvalidParameterError, match=message):
        load_federation(path)


def test_party_paths_must_be_strings(tmp_path):
    path = tmp_path / "federation.toml"
    path.write_text(BASE.format(extra="").replace('data = "b.csv"', "data = 7"))
    with pytest.raises(InvalidParameterError, match=r"\[\[party\]\] #1: data must be a string, got 7"):
        load_federation(path)


def test_a_misspelt_party_key_is_refused_by_name(tmp_path):
    path = tmp_path / "federation.toml"
    path.write_text(BASE.format(extra="") + 'tset = "b-test.csv"\n')  # was ignored: no prediction, no word
    with pytest.raises(InvalidParameterError, match=r"\[\[party\]\] #1: unknown key 'tset' \(did you mean 'test'\?\); "
                                                    r"expected some of "
                                                    r"name, role, data, label, test, certs, listen"):
        load_federation(path)
    path.write_text(BASE.format(extra="").replace('label = "y"', 'label = "y"\ntest = "a-test.csv"')
                    + 'test = "b-test.csv"\n')
    assert load_federation(path).parties[1].test == tmp_path / "b-test.csv"


PARTY = """[party]
name = "a"
role = "active"
data = "a.csv"
label = "y"
listen = "{listen}"
certs = "certs"

[peers]
{peers}
[federation]
protocol = "vertical"
{extra}"""


@pytest.mark.parametrize("listen, peers, extra, message", [
    # gRPC served on a port out of range, or with none, and the peers waited out their startup timeout
    ("127.0.0.1", 'b = "127.0.0.1:50051"', "",
     r"\[party\] listen = '127.0.0.1' is not an address \"host:port\" with a port from 1 to 65535"),
    ("127.0.0.1:99999", 'b = "127.0.0.1:50051"', "", r"\[party\] listen = '127.0.0.1:99999' is not an address"),
    ("127.0.0.1:50050", "b = 50051", "", r"\[peers\] b = 50051 is not an address"),
    ("127.0.0.1:50050", 'b = ":50051"', "", r"\[peers\] b = ':50051' is not an address"),
    # a traceback (ValueError: a party is not its own peer)
    ("127.0.0.1:50050", 'b = "127.0.0.1:50051"\na = "127.0.0.1:50050"', "",
     r"\[peers\] lists this party itself \(a\)"),
    ("127.0.0.1:50050", 'b = "127.0.0.1:50051"\nc = "127.0.0.1:50051"', "",
     r"\[peers\] c = '127.0.0.1:50051' is also b's address"),
    ("127.0.0.1:50050", 'b = "127.0.0.1:50050"', "", r"\[peers\] b = '127.0.0.1:50050' is also this party's listen"),
    ("127.0.0.1:50050", 'b = "127.0.0.1:50051"', '[roles]\nc = "passive"',
     r"\[roles\] names c, not listed in \[peers\]; give every other party's address in \[peers\] \(listed: b\)"),
    ("127.0.0.1:50050", 'b = "127.0.0.1:50051"', '[roles]\na = "passive"',
     r"\[roles\] gives this party \(a\) the role 'passive', \[party\] role 'active'"),
    ("127.0.0.1:50050", '"../b" = "127.0.0.1:50051"', "",
     r"\[peers\]: party names may hold ASCII letters, digits, '-', '_' and '.' \(not dots alone\), got '../b'"),
])
def test_party_addresses_and_roles_are_checked(tmp_path, listen, peers, extra, message):
    from fedgrove.runner.config import load_party

    path = tmp_path / "party.toml"
    path.write_text(PARTY.format(listen=listen, peers=peers, extra=extra))
    with pytest.raises(InvalidParameterError, match=message):
        load_party(path)
    path.write_text(PARTY.format(listen="[::1]:50050", peers='b = "127.0.0.1:50051"', extra=""))
    cfg, me = load_party(path)
    assert me.listen == "[::1]:50050" and cfg.peers == {"b": "127.0.0.1:50051"}


def test_a_party_config_given_to_simulate_and_a_federation_file_given_to_party_are_told_apart(tmp_path):
    # before, simulate read the [party] table's keys as parties ("[[party]] #0: unknown keys 'a', 'e', 'm', 'n'")
    # and party said only "missing the [party] table"
    from fedgrove.runner.config import load_party

    one = tmp_path / "party.toml"
    one.write_text(PARTY.format(listen="127.0.0.1:50050", peers='b = "127.0.0.1:50051"', extra=""))
    with pytest.raises(InvalidParameterError, match=r"is one party's config \(a \[party\] table\): run it with "
                                                    r"`fedgrove party .*party.toml`"):
        load_federation(one)
    whole = tmp_path / "federation.toml"
    whole.write_text(BASE.format(extra=""))
    with pytest.raises(InvalidParameterError, match=r"is a federation file \(\[\[party\]\] tables, one per party\): "
                                                    r"run all its parties in one process with `fedgrove simulate"):
        load_party(whole)
    whole.write_text('party = 3\n[federation]\nprotocol = "vertical"\n')
    with pytest.raises(InvalidParameterError, match="party must be \\[\\[party\\]\\] tables, one per party"):
        load_federation(whole)


def test_a_client_whose_peers_default_to_the_aggregator_is_told_to_name_their_roles(tmp_path):
    # a client's peer is the aggregator unless [roles] says otherwise: a client that lists another client too made
    # two aggregators, and the refusal did not say why
    from fedgrove.runner.config import load_party

    path = tmp_path / "party.toml"
    text = ('[party]\nname = "c0"\nrole = "client"\ndata = "c0.csv"\nlabel = "y"\nlisten = "127.0.0.1:50050"\n'
            'certs = "certs"\n[peers]\nagg = "127.0.0.1:50051"\nc1 = "127.0.0.1:50052"\n{roles}'
            '[federation]\nprotocol = "horizontal"\n')
    path.write_text(text.format(roles=""))
    with pytest.raises(InvalidParameterError, match=r"must be the aggregator; the peers \[roles\] does not name "
                                                    r"\(agg, c1\) are taken as aggregators: name the others' roles"):
        load_party(path)
    path.write_text(text.format(roles='[roles]\nc1 = "client"\n'))
    cfg, me = load_party(path)
    assert [(p.name, p.role) for p in cfg.parties] == [("c0", "client"), ("agg", "aggregator"), ("c1", "client")]


def test_two_parties_reading_one_file_are_refused(tmp_path):
    # a copied [[party]] table: party b trained on a's file, label column included as a feature, and the run
    # failed only when it predicted
    path = tmp_path / "federation.toml"
    path.write_text(BASE.format(extra="").replace('data = "b.csv"', 'data = "./a.csv"'))
    with pytest.raises(InvalidParameterError, match=r"parties a and b both read .*a.csv as their data; each party "
                                                    r"reads its own file"):
        load_federation(path)
    path.write_text(BASE.format(extra="").replace('label = "y"', 'label = "y"\ntest = "t.csv"') + 'test = "t.csv"\n')
    with pytest.raises(InvalidParameterError, match=r"parties a and b both read .*t.csv as their test"):
        load_federation(path)
    # in a horizontal protocol every party predicts the whole test set with its whole model
    path.write_text(_peer_config("simfl").replace('label = "y"', 'label = "y"\ntest = "t.csv"') + 'label = "y"\n'
                    'test = "t.csv"\n')
    assert [p.test for p in load_federation(path).parties] == [tmp_path / "t.csv"] * 2


def test_a_test_file_without_the_data_files_columns_is_refused_before_training(tmp_path):
    (tmp_path / "a.csv").write_text("_id,f1,f2,y\n0,1,2,0\n1,3,4,1\n")
    (tmp_path / "b.csv").write_text("_id,g1\n0,5\n1,6\n")
    path = tmp_path / "federation.toml"
    config = BASE.format(extra="").replace('label = "y"', 'label = "y"\ntest = "a-test.csv"') + \
        'test = "b-test.csv"\n'
    path.write_text(config)
    (tmp_path / "b-test.csv").write_text("_id,g1\n7,1\n")
    for header, message in [("_id,g1", r"lacks all 2 feature columns of its data file .*a.csv: 'f1', 'f2'; is "
                                       r"each file this party's"),
                            ("_id,f2,g1", r"lacks 1 of the 2 feature columns of its data file .*a.csv: 'f1'")]:
        (tmp_path / "a-test.csv").write_text(f"{header}\n7,1{',2' * (header.count(',') - 1)}\n")
        with pytest.raises(InvalidParameterError, match=r"party a: its test file .*a-test.csv " + message):
            load_federation(path)
    # other order, extra columns, no label: read by name when it is predicted
    (tmp_path / "a-test.csv").write_text("_id,extra,f2,f1\n7,0,1,2\n")
    assert load_federation(path).parties[0].test == tmp_path / "a-test.csv"


@pytest.mark.parametrize("name", ["../../escape", "a/b", "..", "", "a b"])
def test_a_party_name_that_is_not_a_plain_file_name_is_refused(tmp_path, name):
    # a party's name starts its files' names: "../../escape" wrote escape.model.json two folders up
    path = tmp_path / "federation.toml"
    path.write_text(BASE.format(extra="").replace('name = "b"', f'name = "{name}"'))
    with pytest.raises(InvalidParameterError, match=r"\[\[party\]\] #1: party names may hold ASCII letters, digits"):
        load_federation(path)


def _hybrid(tmp_path, extra):
    path = tmp_path / "federation.toml"
    path.write_text(BASE.format(extra="").replace('"vertical"', '"hybridtree"').replace('"active"', '"host"')
                    .replace('"passive"', '"guest"') + extra + "\n")
    return load_federation(path)


@pytest.mark.parametrize("extra, host, guest", [
    ("", 5, 2),                                                    # the paper's
    ("[params]\nmax_depth = 4", 2, 2),                             # was ignored: the trees grew 5 + 2 deep
    ("[params]\nmax_depth = 2", 1, 1),
    ("[params]\nmax_depth = 1", 1, 0),
    ("[params]\nmax_depth = 6\n[hybridtree]\nguest_depth = 1", 5, 1),
    ("[params]\nmax_depth = 6\n[hybridtree]\nhost_depth = 3", 3, 3),
    ("[params]\nmax_depth = 5\n[hybridtree]\nhost_depth = 3\nguest_depth = 2", 3, 2),
    ("[hybridtree]\nhost_depth = 3", 3, 2),
])
def test_hybridtree_depths_follow_max_depth(tmp_path, extra, host, guest):
    cfg = _hybrid(tmp_path, extra)
    assert (cfg.hybridtree["host_depth"], cfg.hybridtree["guest_depth"]) == (host, guest)
    assert cfg.make_params().max_depth == host + guest


@pytest.mark.parametrize("extra, message", [
    ("[params]\nmax_depth = 4\n[hybridtree]\nhost_depth = 5\nguest_depth = 2",
     r"\[params\] max_depth = 4 but \[hybridtree\] host_depth \+ guest_depth = 5 \+ 2 = 7: .*give max_depth = 7, "
     r"or leave max_depth out"),
    ("[params]\nmax_depth = 3\n[hybridtree]\nguest_depth = 3",
     r"\[params\] max_depth = 3 leaves no room for \[hybridtree\] guest_depth = 3"),
    ("[params]\nmax_depth = 0", r"\[params\] max_depth must be an integer >= 1, got 0"),
])
def test_hybridtree_depths_that_do_not_add_up_are_refused(tmp_path, extra, message):
    with pytest.raises(InvalidParameterError, match=message):
        _hybrid(tmp_path, extra)


def _reference_section() -> str:
    """docs/cli.md's "Configuration reference" section."""
    from pathlib import Path

    text = (Path(__file__).parents[2] / "docs" / "cli.md").read_text()
    return text.split("\n## Configuration reference\n", 1)[1].split("\n## ", 1)[0]


def _reference_tables() -> dict[str, list[str]]:
    """The reference's tables: each one's heading (`[params]`: boosting protocols -> "params: boosting") and the
    keys its rows list, in order."""
    import re

    tables = {}
    for block in _reference_section().split("\n### ")[1:]:
        heading, _, body = block.partition("\n")
        name = re.match(r"`\[*([\w.]+)\]*`", heading).group(1)
        if (qualifier := re.match(r"`[^`]*`: ([\w-]+)", heading)) is not None:
            name += f": {qualifier.group(1)}"
        tables[name] = re.findall(r"^\| `(\w+)` \|", body, re.M)
    return tables


def test_the_configuration_reference_lists_every_key_each_table_takes_and_no_other():
    from fedgrove.runner.config import TABLES, config_keys

    documented, taken = _reference_tables(), config_keys()
    assert set(documented) == set(taken)
    for table, keys in taken.items():
        assert sorted(documented[table]) == sorted(keys), table
    # every table a config takes is in it, but [peers] and [roles], which take party names
    assert {t.split(":")[0].split(".")[0] for t in taken} == set(TABLES) - {"peers", "roles"}


def test_forest_max_features_all_and_fvtree_psd_epsilon_none_are_read(tmp_path):
    # TOML has no None: "all" (as `fedgrove train --max-features all`) and "none" (as [fvtree.dp] leaf_clip)
    path = tmp_path / "federation.toml"
    path.write_text(BASE.format(extra='[params]\ntask = "classification"\nmax_features = "all"')
                    .replace('"vertical"', '"federated-forest"').replace('"active"', '"client"')
                    .replace('"passive"', '"client"') + '[[party]]\nname = "m"\nrole = "master"\n')
    cfg = load_federation(path)
    assert cfg.make_params().max_features is None
    assert cfg.shared_settings()["params.max_features"] is None
    path.write_text(_peer_config("fvtree") + '[fvtree]\npsd_epsilon = "none"\n')
    assert load_federation(path).fvtree_options().psd_epsilon is None
    path.write_text(_peer_config("fvtree") + '[fvtree]\npsd_epsilon = "some"\n')
    with pytest.raises(InvalidParameterError, match=r'\[fvtree\] psd_epsilon must be a positive number or "none" '
                                                    r"\(exact leaf counts\), got 'some'"):
        load_federation(path)
    path.write_text(_peer_config("fvtree") + '[fvtree.dp]\nepsilon = 1.0\nleaf_clip = "none"\n')
    assert load_federation(path).fvtree_options().dp.leaf_clip is None
    path.write_text(_peer_config("fvtree") + '[fvtree.dp]\nepsilon = 1.0\nleaf_clip = "None"\n')
    with pytest.raises(InvalidParameterError, match=r'\[fvtree.dp\] leaf_clip must be a positive number or "none" '
                                                    r"\(no bound\), got 'None'"):
        load_federation(path)


def test_a_misspelt_horizontal_key_is_named_with_the_one_it_takes(tmp_path):
    path = tmp_path / "federation.toml"
    horizontal = BASE.format(extra="").replace('"vertical"', '"horizontal"').replace('"active"', '"client"') \
        .replace('"passive"', '"client"').replace('data = "b.csv"', 'data = "b.csv"\nlabel = "y"') \
        + '[[party]]\nname = "agg"\nrole = "aggregator"\n'
    path.write_text(horizontal + "[horizontal]\ncontribution = true\n")
    with pytest.raises(InvalidParameterError, match=r"\[horizontal\]: unknown key 'contribution' \(did you mean "
                                                    r"'contributions'\?\)"):
        load_federation(path)
    path.write_text(horizontal + '[horizontal]\ncontributions = "yes"\n')
    with pytest.raises(InvalidParameterError, match=r"\[horizontal\] contributions must be true or false, got 'yes'"):
        load_federation(path)
    path.write_text(horizontal + "[horizontal]\ncontributions = true\n")
    assert load_federation(path).horizontal == {"contributions": True}


def _documented_defaults(heading: str) -> dict:
    """The defaults docs/cli.md's reference gives under ``### heading`` as TOML literals (a number, true or
    false, a quoted string), by key; the others ("unlimited", "from the file") are left out."""
    import re
    import tomllib

    body = _reference_section().split(f"\n### {heading}\n", 1)[1].split("\n### ", 1)[0]
    out = {}
    for key, value in re.findall(r"^\| `(\w+)` \| ([^|]*) \|", body, re.M):
        default = re.search(r"\(([^()]*)\)\s*$", value)
        try:
            out[key] = tomllib.loads(f"v = {default.group(1).replace('`', '')}")["v"]
        except (AttributeError, tomllib.TOMLDecodeError):
            pass
    return out


@pytest.mark.parametrize("heading, classes", [("`[params]`: boosting protocols", "fedgrove.engine.gbdt.GBDTParams"),
                                          ("`[params]`: federated-forest", "fedgrove.engine.forest.ForestParams"),
                                          ("`[simfl]`", "fedgrove.protocols.simfl.lsh.LSHParams "
                                                        "fedgrove.protocols.simfl.party.SimFLOptions"),
                                          ("`[fvtree]`", "fedgrove.protocols.fvtree.party.FVTreeOptions"),
                                          ("`[fvtree.dp]`", "fedgrove.protocols.fvtree.privacy.DPOptions")])
def test_the_configuration_reference_gives_the_defaults_the_code_has(heading, classes):
    import dataclasses
    import importlib

    fields = {}
    for cls in classes.split():
        module, name = cls.rsplit(".", 1)
        fields.update({f.name: f.default for f in dataclasses.fields(getattr(importlib.import_module(module), name))})
    documented = _documented_defaults(heading)
    assert len(documented) >= 3, heading  # the parsing found them
    for key, value in documented.items():
        assert fields[key] == value, (heading, key, value)


def test_the_configuration_reference_gives_the_defaults_the_loader_takes(tmp_path):
    # the tables the loader itself fills in: a config that leaves them out, read back
    path = tmp_path / "federation.toml"
    path.write_text(BASE.format(extra="").replace('protocol = "vertical"\n', ""))
    cfg = load_federation(path)
    read = {"`[federation]`": {"protocol": cfg.protocol, "seed": cfg.seed, "timeout": cfg.timeout,
                               "startup_timeout": cfg.startup_timeout, "max_message_mb": cfg.max_message_mb,
                               "align": cfg.align, "checkpoint_every": cfg.checkpoint_every},
            "`[he]`": cfg.he, "`[output]`": {"dir": cfg.output_dir.name}, "`[forest]`": cfg.forest,
            "`[horizontal]`": cfg.horizontal}
    hybrid = tmp_path / "hybrid.toml"
    hybrid.write_text(BASE.format(extra="").replace('"vertical"', '"hybridtree"').replace('"active"', '"host"')
                      .replace('"passive"', '"guest"'))
    read["`[hybridtree]`"] = load_federation(hybrid).hybridtree
    for heading, values in read.items():
        documented = _documented_defaults(heading)
        assert documented, heading
        for key, value in documented.items():
            assert values[key] == value, (heading, key, value)


@pytest.mark.parametrize("protocol,roles,holder", [
    ("vertical", ('"active"', '"passive"'), "active"),
    ("hybridtree", ('"host"', '"guest"'), "host"),
])
def test_a_label_given_to_a_party_that_holds_none_is_refused(tmp_path, protocol, roles, holder):
    # a passive party's or guest's label was ignored in training and dropped a test file's column of that name
    path = tmp_path / "federation.toml"
    text = BASE.format(extra="").replace('"vertical"', f'"{protocol}"').replace('"active"', roles[0]) \
        .replace('"passive"', roles[1])
    path.write_text(text)
    assert load_federation(path).parties[1].label is None
    path.write_text(text.replace('data = "b.csv"', 'data = "b.csv"\nlabel = "y"'))
    with pytest.raises(InvalidParameterError, match=f"party b: label = 'y', but the {protocol} protocol's "
                                                    f"{roles[1][1:-1]} holds no labels \\(its {holder} does\\)"):
        load_federation(path)
    path.write_text(BASE.format(extra="").replace('"vertical"', '"horizontal"').replace('"active"', '"client"')
                    .replace('"passive"', '"client"') + '[[party]]\nname = "agg"\nrole = "aggregator"\nlabel = "y"\n')
    with pytest.raises(InvalidParameterError, match="party agg: label = 'y', but the horizontal protocol's "
                                                    "aggregator holds no labels"):
        load_federation(path)
