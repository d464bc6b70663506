"""fixtures/torchvision_compat.py: the operator schemas are defined only where torchvision's own
extension cannot load. Each case runs in a fresh interpreter, because the shim acts once per
process, before torchvision's first import."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_PROBE = """
import json, torch
calls = []
def load_library(path):
    calls.append(path)
    {action}
torch.ops.load_library = load_library
from fixtures import torchvision_compat as shim   # fixtures/__init__.py applies the shim
defined = shim._LIBRARY is not None
print(json.dumps({{"calls": calls, "defined": defined,
                  "nms": shim._has_op("nms"), "qnms": shim._has_op("qnms"),
                  "again": shim.apply()}}))
"""


def _probe(action: str) -> dict:
    out = subprocess.run([sys.executable, "-c", _PROBE.format(action=action)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_where_the_extension_loads_nothing_is_defined():
    """A CUDA machine's torch with its own torchvision (seen on an H200: torch 2.11.0+cu130,
    torchvision 0.26.0+cu130): defining the schemas there made torchvision's extension abort the
    process when it registered the same operators."""
    got = _probe("pass")
    assert len(got["calls"]) == 1
    library = Path(got["calls"][0])
    assert library.parent.name == "torchvision" and library.name.startswith("_C")
    assert not got["defined"]
    assert got["again"] is False


def test_where_the_extension_cannot_load_both_schemas_are_defined():
    """The CPU torch with the CUDA torchvision pip picks for it: the extension's load fails, so
    nms and qnms get their schemas and timm's import of torchvision works."""
    got = _probe("raise OSError('undefined symbol')")
    assert len(got["calls"]) == 1
    assert got["defined"] and got["nms"] and got["qnms"]
    assert got["again"] is False  # once per process
