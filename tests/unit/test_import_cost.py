"""What importing the command line and the engine pulls in: scikit-learn (and scipy's bulk with it) waits for
the first score, since its import took 0.7-1.0 s of every ``fedgrove train`` that scores nothing, and
``scipy.special`` for the first probabilities (85 ms; numba imports scipy's top package itself)."""

import subprocess
import sys

CHECK = """
import sys
import fedgrove.cli.main, fedgrove.engine.gbdt, fedgrove.engine.forest
loaded = sorted(m for m in sys.modules if m.split(".")[0] == "sklearn" or m.startswith("scipy.special"))
print(len(loaded), loaded[:3])
from fedgrove.metrics import auc
print(auc([0, 1, 1, 0], [0.1, 0.9, 0.8, 0.3]), "sklearn" in sys.modules)
"""


def test_the_cli_and_the_engine_import_scikit_learn_and_scipy_only_to_score():
    done = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    first, second = done.stdout.splitlines()
    assert first == "0 []", first
    assert second == "1.0 True", second
