"""The README's Python examples run as printed (docs that match the code)."""

import re
from pathlib import Path

import pytest

README = Path(__file__).parents[2] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def test_the_readme_has_python_examples():
    assert len(BLOCKS) >= 2


@pytest.mark.parametrize("k", range(len(BLOCKS)))
def test_readme_python_example_runs(k, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # examples write files (model.json) into the working directory
    exec(compile(BLOCKS[k], f"README.md python block {k + 1}", "exec"), {"__name__": "__readme__"})
    printed = capsys.readouterr().out
    for name, accuracy in re.findall(r"^(HybridTree|SimFL|FV-tree) (0\.\d+)", printed, re.M):
        assert float(accuracy) > 0.85, (name, accuracy)  # a misread score (a broadcast) would be near 0.6
