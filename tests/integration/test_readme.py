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


@pytest.mark.slow
def test_readme_quick_start_commands_run_as_printed(tmp_path):
    # the Quick start's shell commands, in order, in a copy of the examples (about a minute and a half); the
    # gRPC lines start real processes on the example configs' ports
    import os
    import shutil
    import subprocess
    import sys

    quick = README.read_text().split("## Quick start", 1)[1].split("\n## ", 1)[0]
    commands = "\n".join(re.findall(r"```bash\n(.*?)```", quick, re.S))
    assert "fedgrove train" in commands and "fedgrove simulate" in commands and "fedgrove party" in commands
    shutil.copytree(README.parent / "examples", tmp_path / "examples",
                    ignore=shutil.ignore_patterns("parts", "certs", "runs"))
    bin_dir = Path(sys.executable).parent  # the fedgrove console script of this environment
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}"}
    done = subprocess.run(["bash", "-e", "-c", commands + "\nwait\n"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "predictions.csv").exists()
    assert (tmp_path / "examples" / "vertical" / "runs" / "grpc" / "party0.model.json").exists()


EXAMPLES = sorted(p.parent.name for p in (README.parent / "examples").glob("*/README.md"))


def test_every_example_with_a_readme_is_run_below():
    assert {"forest", "fvtree", "horizontal", "hybridtree", "simfl", "vertical"} <= set(EXAMPLES)


@pytest.mark.slow
@pytest.mark.parametrize("name", EXAMPLES)
def test_example_readme_commands_run_as_printed(name, tmp_path):
    # each example's shell commands, in order, in a copy of the examples (half a minute to a minute each): the
    # partition, certificates, the simulation, the gRPC processes on the example's ports and what follows
    import os
    import shutil
    import subprocess
    import sys

    text = (README.parent / "examples" / name / "README.md").read_text()
    commands = "\n".join(re.findall(r"```bash\n(.*?)```", text, re.S))
    assert "fedgrove simulate" in commands and "fedgrove party" in commands
    shutil.copytree(README.parent / "examples", tmp_path / "examples",
                    ignore=shutil.ignore_patterns("parts", "certs", "runs"))
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}"}
    done = subprocess.run(["bash", "-e", "-c", commands + "\nwait\n"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    runs = tmp_path / "examples" / name / "runs"
    assert list(runs.glob("simulated/*.model.json")) and list(runs.glob("grpc/*.model.json"))
    scores = [float(a) for a in re.findall(r"accuracy (0\.\d+)", done.stdout + done.stderr)]
    assert scores and min(scores) > 0.9, scores  # breast cancer: every protocol scores 0.93-0.98
