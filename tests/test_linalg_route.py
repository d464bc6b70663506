"""checks.eigen's choice of where a symmetric eigensolve runs (its docstring and docs/devices.md
give the H200 measurements behind the bounds), and that every eigensolve of checks/ goes through
it."""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from checks import eigen

ROOT = Path(__file__).resolve().parent.parent


def _batch(n: int, device: str = "cuda", dtype=torch.float64):
    """A stand-in with a batch's device, dtype and shape: a CUDA tensor cannot be made here."""
    return SimpleNamespace(device=torch.device(device), dtype=dtype, shape=(7, n, n))


@pytest.mark.parametrize("n, dtype, expected", [
    (16, torch.float64, False), (32, torch.float64, False),  # cuSOLVER's batched kernel
    (33, torch.float64, True), (128, torch.float64, True), (160, torch.float64, True),
    (161, torch.float64, False), (197, torch.float64, False),  # the GPU's loop was faster
    (33, torch.float32, True), (256, torch.float32, True), (257, torch.float32, False),
    (64, torch.float16, False),  # not measured: left where it is
])
def test_a_cuda_batch_goes_to_the_cpu_exactly_in_the_measured_range(n, dtype, expected):
    assert eigen.on_host(_batch(n, dtype=dtype)) is expected


@pytest.mark.parametrize("n", [16, 64, 197, 512])
def test_a_cpu_batch_never_moves(n):
    assert eigen.on_host(_batch(n, device="cpu")) is False
    assert eigen.on_host(torch.zeros(2, n, n, dtype=torch.float64)) is False


def test_the_host_route_returns_the_solvers_own_result(monkeypatch):
    """The branch taken on a GPU (to the CPU and back), run here by forcing it: the same
    eigenpairs as torch.linalg's, to the bit, on the input's device."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, 40, 40, generator=gen, dtype=torch.float64)
    sym = x + x.transpose(-1, -2)
    direct_mu, direct_vecs = torch.linalg.eigh(sym)
    monkeypatch.setattr(eigen, "on_host", lambda matrix: True)
    mu, vecs = eigen.eigh(sym)
    assert torch.equal(mu, direct_mu) and torch.equal(vecs, direct_vecs)
    assert mu.device == sym.device and vecs.device == sym.device
    assert torch.equal(eigen.eigvalsh(sym), torch.linalg.eigvalsh(sym))


def _direct_eigensolves(path: Path) -> list[str]:
    calls = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.Attribute) and node.attr in ("eigh", "eigvalsh")
                and isinstance(node.value, ast.Attribute) and node.value.attr == "linalg"):
            calls.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return calls


def test_every_eigensolve_of_checks_goes_through_the_router():
    """A direct torch.linalg.eigh/eigvalsh in checks/ would loop per matrix on a GPU again."""
    found = [call for path in sorted((ROOT / "checks").glob("*.py")) if path.name != "eigen.py"
             for call in _direct_eigensolves(path)]
    assert found == []
    assert _direct_eigensolves(ROOT / "checks" / "eigen.py")  # the scan does see calls
