"""Kernel threads per party: the cores of a machine are shared by the parties that run on it, unless a party's
config says ``[params] n_threads``."""

import os

import numba
import pytest

from fedgrove.runner.config import load_federation, load_party
from fedgrove.runner.run import kernel_threads

FEDERATION = """[federation]
protocol = "simfl"
[params]
n_estimators = 2
{extra}
[[party]]
name = "a"
role = "party"
data = "a.csv"
label = "y"
[[party]]
name = "b"
role = "party"
data = "b.csv"
label = "y"
[[party]]
name = "c"
role = "party"
data = "c.csv"
label = "y"
"""

PARTY = """[party]
name = "a"
role = "party"
data = "a.csv"
label = "y"
listen = "127.0.0.1:50001"
certs = "certs"
[peers]
b = "{b}"
c = "{c}"
[federation]
protocol = "simfl"
[params]
n_estimators = 2
{extra}
"""


@pytest.fixture
def eight_cores(monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(8)), raising=False)
    monkeypatch.setattr("os.cpu_count", lambda: 8)


def _federation(tmp_path, extra=""):
    path = tmp_path / "federation.toml"
    path.write_text(FEDERATION.format(extra=extra))
    cfg = load_federation(path)
    return cfg, cfg.parties[0]


def _party(tmp_path, b, c, extra=""):
    path = tmp_path / "a.toml"
    path.write_text(PARTY.format(b=b, c=c, extra=extra))
    return load_party(path)


def test_parties_simulated_in_one_process_share_its_cores(tmp_path, eight_cores):
    # three parties of `fedgrove simulate` on 8 cores: 2 threads each (their OpenMP teams asking for all 8
    # each spun for the same cores)
    assert kernel_threads(*_federation(tmp_path)) == 2


@pytest.mark.parametrize("b, c, expected", [
    ("127.0.0.1:50002", "localhost:50003", 2),      # all three on this machine
    ("127.0.0.1:50002", "10.0.0.7:50003", 4),       # one peer here, one elsewhere
    ("[::1]:50002", "192.168.1.4:50003", 4),        # IPv6 loopback
    ("10.0.0.6:50002", "bank-b.example:50003", 8),  # each party on its own machine
])
def test_a_party_process_shares_the_cores_with_its_peers_at_loopback_addresses(tmp_path, eight_cores, b, c,
                                                                                expected):
    assert kernel_threads(*_party(tmp_path, b, c)) == expected


def test_peers_at_the_host_this_party_listens_on_share_its_cores(tmp_path, eight_cores):
    cfg, spec = _party(tmp_path, "10.0.0.5:50002", "10.0.0.6:50003")
    assert kernel_threads(cfg, spec) == 8  # listening on 127.0.0.1: the peers are elsewhere
    path = tmp_path / "a.toml"
    path.write_text(path.read_text().replace('listen = "127.0.0.1:50001"', 'listen = "10.0.0.5:50001"'))
    assert kernel_threads(*load_party(path)) == 4  # b listens on this party's host
    path.write_text(path.read_text().replace('listen = "10.0.0.5:50001"', 'listen = "0.0.0.0:50001"'))
    assert kernel_threads(*load_party(path)) == 8  # every interface: no host to compare with


def test_params_n_threads_is_taken_as_given(tmp_path, eight_cores):
    assert kernel_threads(*_federation(tmp_path, "n_threads = 5")) == 5
    assert kernel_threads(*_party(tmp_path, "127.0.0.1:50002", "127.0.0.1:50003", "n_threads = 3")) == 3


def test_a_role_runs_its_kernels_with_those_threads(tmp_path, monkeypatch):
    # the limit is numba's, per thread: the role's own, set around its training and restored after
    import fedgrove.runner.run as run
    from fedgrove.runner import roles

    cfg, spec = _federation(tmp_path, "n_threads = 1")
    seen = {}
    before = numba.get_num_threads()

    def fake_role(ctx):
        seen["threads"] = numba.get_num_threads()
        raise RuntimeError("stop here")

    monkeypatch.setitem(roles.TRAIN, ("simfl", "party"), fake_role)
    monkeypatch.setattr(run, "check_same_settings", lambda *a, **k: None)
    cfg.output_dir = str(tmp_path / "out")
    with pytest.raises(RuntimeError, match="stop here"):
        run.run_role(cfg, spec, channel=None)
    assert seen["threads"] == 1 and numba.get_num_threads() == before


def test_the_python_runs_give_each_party_params_n_threads():
    # run_horizontal (as every run_*): each party's thread runs its kernels with GBDTParams.n_threads (a new
    # thread has numba's default, every core); read from the parties' own threads as they send
    n_threads = 1
    from fedgrove.engine.gbdt import GBDTParams
    from fedgrove.protocols.horizontal.simulate import run_horizontal
    from tests.conftest import make_classification

    X, y = make_classification(300)
    seen = []

    def observe(direction, peer, tag, message):
        seen.append(numba.get_num_threads())

    params = GBDTParams(n_estimators=1, max_depth=2, max_bins=8, n_threads=n_threads)
    run_horizontal([(X[:150], y[:150]), (X[150:], y[150:])], params,
                   observers={"aggregator": [observe], "client0": [observe]})
    assert seen and set(seen) == {n_threads}


def _limited(monkeypatch, cfg):
    """What _limit_he_threads leaves in the environment, in a process whose HEU pool has not started, and the
    threads gmpy2's OU then decrypts on (None: not set)."""
    import fedgrove.crypto.he as he
    import fedgrove.crypto.ou as ou
    import fedgrove.runner.run as run

    monkeypatch.setenv(he.HEU_THREADS_VARIABLE, "")  # recorded, so that what the runner sets is undone after
    monkeypatch.delenv(he.HEU_THREADS_VARIABLE)
    monkeypatch.setattr(he, "_heu_pool_started", False)
    monkeypatch.setattr(ou, "_threads", None)
    run._limit_he_threads(cfg, "a")
    return os.environ.get(he.HEU_THREADS_VARIABLE), ou._threads


def test_a_party_that_encrypts_with_heu_gives_it_its_threads(tmp_path, monkeypatch):
    # HEU's pool took every core in each party's process, whatever n_threads said; gmpy2's OU decrypts on as many
    path = tmp_path / "a.toml"
    path.write_text(PARTY.format(b="127.0.0.1:50002", c="127.0.0.1:50003", extra="n_threads = 3"))
    cfg, _ = load_party(path)
    assert _limited(monkeypatch, cfg) == (None, None)  # simfl encrypts nothing with HEU
    path.write_text(path.read_text().replace('protocol = "simfl"', 'protocol = "vertical"')
                    .replace('role = "party"', 'role = "active"'))
    assert _limited(monkeypatch, load_party(path)[0]) == ("3", 3)
    path.write_text(path.read_text() + '[he]\nbackend = "gmpy2"\n')
    assert _limited(monkeypatch, load_party(path)[0]) == ("3", 3)
    path.write_text(path.read_text().replace('backend = "gmpy2"', 'backend = "phe"\nscheme = "paillier"'))
    assert _limited(monkeypatch, load_party(path)[0]) == (None, None)
    path.write_text(path.read_text().replace("n_threads = 3", ""))
    path.write_text(path.read_text().replace('backend = "phe"', 'backend = "heu"'))
    assert _limited(monkeypatch, load_party(path)[0]) == (None, None)  # not given: HEU's default, every core
