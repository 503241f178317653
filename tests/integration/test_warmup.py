"""The warm-up before a party's first message compiles every kernel its protocol then uses.

Each case runs in a fresh process (numba's compiled versions live per process, whatever its disk cache
holds): warm up, list every kernel's compiled signatures, run the federation in one process, list again.  A
kernel compiled after the warm-up would be compiled mid-protocol, where a peer's timeout is running.
"""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fedgrove.cli.main import main

EXAMPLES = Path(__file__).parents[2] / "examples"

PROBE = """
import importlib, json, pkgutil, sys
from numba.core.registry import CPUDispatcher
import fedgrove
from fedgrove.runner.config import load_federation
from fedgrove.runner.run import simulate
from fedgrove.runner.warmup import warm_up

kernels = {}
for info in pkgutil.walk_packages(fedgrove.__path__, "fedgrove."):
    if info.name.startswith("fedgrove.cli"):
        continue
    module = importlib.import_module(info.name)
    kernels.update({f"{info.name}.{k}": v for k, v in vars(module).items()
                    if isinstance(v, CPUDispatcher) and v.__module__ == info.name})

def compiled():
    return {f"{name}{sig}" for name, d in kernels.items() for sig in d.signatures}

cfg = load_federation(sys.argv[1])
warm_up(cfg)
before = compiled()
simulate(cfg)
print(json.dumps({"warm": len(before), "later": sorted(compiled() - before)}))
"""

# example config, dataset, how `fedgrove partition` splits it, changes to [params]
CASES = {
    "vertical": ("vertical", "cancer", ["--scheme", "vertical", "--parties", "3"], {}),
    "vertical-multiclass": ("vertical", "wine", ["--scheme", "vertical", "--parties", "3"],
                            {"objective": '"multiclass"'}),
    "hybridtree": ("hybridtree", "cancer", ["--scheme", "hybrid", "--parties", "3"], {}),
    "forest": ("forest", "cancer", ["--scheme", "vertical", "--parties", "3"], {}),
    "simfl": ("simfl", "cancer", ["--scheme", "horizontal", "--mode", "unbalanced", "--parties", "3"], {}),
    "fvtree": ("fvtree", "cancer", ["--scheme", "horizontal", "--mode", "unbalanced", "--parties", "4"], {}),
    "horizontal-multiclass": ("horizontal", "wine", ["--scheme", "horizontal", "--parties", "3"],
                              {"objective": '"multiclass"', "n_classes": "3"}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_no_kernel_is_compiled_after_the_warm_up(tmp_path, case):
    from sklearn.datasets import load_breast_cancer, load_wine

    example, dataset, options, changes = CASES[case]
    loader = {"cancer": load_breast_cancer, "wine": load_wine}[dataset]
    loader(as_frame=True).frame.to_csv(tmp_path / "data.csv", index=False)
    text = (EXAMPLES / example / "federation.toml").read_text()
    test = ["--test-fraction", "0.2"] if "test = " in text else []  # prediction too, where the example has it
    assert main(["partition", str(tmp_path / "data.csv"), "--label", "target", *options, *test,
                 "--out", str(tmp_path / "parts")]) == 0
    text = re.sub(r"n_estimators = \d+", "n_estimators = 3", text)
    for key, value in changes.items():
        text, n = re.subn(rf"(?m)^{key} = .*$", f"{key} = {value}", text)
        if n == 0:
            text = text.replace("[params]\n", f"[params]\n{key} = {value}\n")
    (tmp_path / "federation.toml").write_text(text)
    run = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path / "federation.toml")], capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["warm"] > 5  # the probe sees the kernels
    assert result["later"] == [], result["later"]
