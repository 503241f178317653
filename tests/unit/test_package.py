"""The package's own names: the common ones importable from ``fedgrove``, loaded when first asked for."""

import importlib
import subprocess
import sys

import pytest

import fedgrove


@pytest.mark.parametrize("name", sorted(fedgrove._LAZY))
def test_each_top_level_name_is_the_one_its_module_defines(name):
    module = importlib.import_module(fedgrove._LAZY[name])
    assert getattr(fedgrove, name) is getattr(module, name)
    assert name in fedgrove.__all__ and name in dir(fedgrove)


def test_an_unknown_name_is_an_attribute_error_naming_it():
    with pytest.raises(AttributeError, match="module 'fedgrove' has no attribute 'train_gdbt'"):
        fedgrove.train_gdbt  # noqa: B018


def test_importing_the_package_loads_neither_numba_nor_the_protocols():
    # the command line imports fedgrove on every start; numba and HEU take seconds to load
    code = ("import sys, fedgrove; print(sorted(m for m in ('numba', 'heu', 'grpc', 'fedgrove.engine.gbdt', "
            "'fedgrove.protocols') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"

