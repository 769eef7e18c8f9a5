"""The package layout never shadows the standard library."""

import importlib
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_import_operator_is_the_standard_library_module():
    mod = importlib.import_module("operator")
    stdlib = Path(sysconfig.get_paths()["stdlib"]).resolve()
    # The C-accelerated module has no __file__ on some builds; the pure one lives in stdlib.
    origin = Path(getattr(mod, "__file__", stdlib / "operator.py")).resolve()
    assert origin.parent == stdlib, f"`import operator` resolved to {origin}, not the stdlib"
    assert mod.itemgetter(1)([0, 7]) == 7


def test_operator_directory_is_not_a_package():
    assert not (ROOT / "operator" / "__init__.py").exists(), (
        "operator/ must not be a package: it would shadow the standard library's `operator`"
    )
    assert "sandlot" in sys.modules or importlib.import_module("sandlot")
