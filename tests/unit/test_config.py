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


def _load(tmp_path, extra):
    path = tmp_path / "federation.toml"
    path.write_text(BASE.format(extra=extra))
    return load_federation(path)


def test_timeouts_default_and_read(tmp_path):
    cfg = _load(tmp_path, "")
    assert (cfg.timeout, cfg.startup_timeout) == (60.0, 300.0)
    cfg = _load(tmp_path, "timeout = 5\nstartup_timeout = 30")
    assert (cfg.timeout, cfg.startup_timeout) == (5.0, 30.0)


@pytest.mark.parametrize("extra, message", [
    ("startup_timeout = 0", "federation.startup_timeout must be a positive number of seconds, got 0"),
    ("startup_timeout = \"long\"", "federation.startup_timeout must be a positive number"),
    ("timeout = -1", "federation.timeout must be a positive number of seconds, got -1"),
    ("timout = 5", r"\[federation\]: unknown keys \['timout'\]"),
])
def test_bad_federation_keys_are_named(tmp_path, extra, message):
    with pytest.raises(InvalidParameterError, match=message):
        _load(tmp_path, extra)


def test_he_table_is_checked(tmp_path):
    assert _load(tmp_path, "[he]\nscheme = \"paillier\"\nrows_per_ciphertext = 2").he["rows_per_ciphertext"] == 2
    with pytest.raises(InvalidParameterError, match=r"\[he\] rows_per_ciphertext must be an integer from 1 to 16, "
                                                    r"got 0"):
        _load(tmp_path, "[he]\nrows_per_ciphertext = 0")
    with pytest.raises(InvalidParameterError, match=r"\[he\]: unknown keys \['keybits'\]"):
        _load(tmp_path, "[he]\nkeybits = 3072")
