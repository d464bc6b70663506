"""TEMPORARY, tests only (see tests/_claim_specs.py): the Python processes the tests start (the
report's command line, pytester subprocess runs) register the built-in claims' report sections
too, as ``import claims`` will once the claim interface registers them."""

import sys
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.append(_ROOT)
try:
    from tests._claim_specs import ensure_builtin_specs
except ImportError:  # another checkout's tests, or torch-free tooling: nothing to register
    pass
else:
    ensure_builtin_specs()
