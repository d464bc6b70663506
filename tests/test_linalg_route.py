"""checks.linalg_route's choice of where a batched factorisation runs (its docstring and
docs/devices.md give the H200 measurements behind the bounds), that the route to the CPU returns
the solver's own result, and that every eigh, eigvalsh, qr, svd and svdvals of checks/ goes
through it."""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from checks import linalg_route as la
from checks.output_fit import least_squares_fit

ROOT = Path(__file__).resolve().parent.parent
ROUTED = ("eigh", "eigvalsh", "qr", "svd", "svdvals")


def _batch(m: int, k: int | None = None, device: str = "cuda", dtype=torch.float64):
    """A stand-in with a batch's device, dtype and shape: a CUDA tensor cannot be made here."""
    return SimpleNamespace(device=torch.device(device), dtype=dtype,
                           shape=(7, m, m if k is None else k))


@pytest.mark.parametrize("op, m, k, dtype, expected", [
    ("eigh", 16, None, torch.float64, False), ("eigh", 32, None, torch.float64, False),
    ("eigh", 33, None, torch.float64, True), ("eigh", 160, None, torch.float64, True),
    ("eigh", 161, None, torch.float64, False), ("eigh", 197, None, torch.float64, False),
    ("eigh", 33, None, torch.float32, True), ("eigh", 256, None, torch.float32, True),
    ("eigh", 257, None, torch.float32, False), ("eigh", 64, None, torch.float16, False),
    ("svd", 32, 9, torch.float64, False), ("svd", 33, 9, torch.float64, True),
    ("svd", 9, 33, torch.float64, True),  # the larger side decides
    ("svd", 256, 65, torch.float32, True), ("svd", 257, 65, torch.float64, False),
    ("qr", 1, 1, torch.float64, True), ("qr", 128, 33, torch.float64, True),
    ("qr", 129, 33, torch.float64, False), ("qr", 197, 65, torch.float32, False),
    ("qr", 64, 17, torch.bfloat16, False),  # not measured: left where it is
])
def test_a_cuda_batch_goes_to_the_cpu_exactly_in_the_measured_range(op, m, k, dtype, expected):
    assert la.on_host(op, _batch(m, k, dtype=dtype)) is expected


@pytest.mark.parametrize("op", ["eigh", "svd", "qr"])
@pytest.mark.parametrize("n", [16, 64, 197, 512])
def test_a_cpu_batch_never_moves(op, n):
    assert la.on_host(op, _batch(n, device="cpu")) is False
    assert la.on_host(op, torch.zeros(2, n, n // 4 + 1, dtype=torch.float64)) is False


def test_the_host_route_returns_the_solvers_own_result(monkeypatch):
    """The branch taken on a GPU (to the CPU and back), run here by forcing it: the same results
    as torch.linalg's, to the bit, with their names, on the input's device."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, 40, 40, generator=gen, dtype=torch.float64)
    sym = x + x.transpose(-1, -2)
    tall = x[..., :11]
    direct = {"eigh": torch.linalg.eigh(sym), "eigvalsh": torch.linalg.eigvalsh(sym),
              "qr": torch.linalg.qr(tall), "svd": torch.linalg.svd(tall, full_matrices=False),
              "svdvals": torch.linalg.svdvals(tall)}
    monkeypatch.setattr(la, "on_host", lambda op, matrix: True)
    routed = {"eigh": la.eigh(sym), "eigvalsh": la.eigvalsh(sym), "qr": la.qr(tall),
              "svd": la.svd(tall, full_matrices=False), "svdvals": la.svdvals(tall)}
    for op in ROUTED:
        got, want = routed[op], direct[op]
        if isinstance(want, torch.Tensor):
            got, want = (got,), (want,)
        else:
            assert type(got) is type(want)  # .Q / .eigenvectors / .S work as before
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert torch.equal(g, w) and g.device == sym.device, op
    assert la.qr(tall, mode="r").Q.numel() == 0  # the mode is passed on


def test_the_output_fit_gives_the_same_fit_down_either_route(monkeypatch):
    """least_squares_fit no longer branches on the device: a rank-deficient item takes gelsd on
    the CPU down both routes, the full-rank ones the QR projection."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(3, 12, 4, generator=gen, dtype=torch.float64)
    x[1, :, 3] = x[1, :, 0] - 2 * x[1, :, 2]
    t = torch.randn(3, 12, 4, generator=gen, dtype=torch.float64)
    direct = least_squares_fit(x, t)
    monkeypatch.setattr(la, "on_host", lambda op, matrix: True)
    assert torch.equal(least_squares_fit(x, t), direct)
    for i in range(3):
        ref = x[i] @ torch.linalg.lstsq(x[i], t[i], driver="gelsd").solution
        assert torch.allclose(direct[i], ref, rtol=0, atol=1e-12)


def _direct_calls(path: Path) -> list[str]:
    calls = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.Attribute) and node.attr in ROUTED
                and isinstance(node.value, ast.Attribute) and node.value.attr == "linalg"):
            calls.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return calls


def test_every_factorisation_of_checks_goes_through_the_router():
    """A direct torch.linalg.eigh/eigvalsh/qr/svd/svdvals in checks/ would loop per matrix on a
    GPU again (docs/devices.md)."""
    found = [call for path in sorted((ROOT / "checks").glob("*.py"))
             if path.name != "linalg_route.py" for call in _direct_calls(path)]
    assert found == []
    assert len(_direct_calls(ROOT / "checks" / "linalg_route.py")) >= 10  # the scan sees calls
