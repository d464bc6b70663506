"""Where each batched factorisation of ``checks`` runs: every ``eigh``, ``eigvalsh``, ``qr``,
``svd`` and ``svdvals`` of ``checks/`` goes through the functions here, which send a CUDA batch
to the CPU (and the result back) in the sizes where one CPU thread was measured faster than the
GPU, and call ``torch.linalg`` as it is everywhere else. A CPU tensor never moves, so a CPU
run's numbers are those of the direct call, by construction.

Measured on an NVIDIA H200 (torch 2.11.0+cu130) against one thread of a 2-core Intel Xeon,
``python -m bench.run --linalg-batching [--device cuda]``, 256 seeded matrices per size,
microseconds per matrix (``bench/h200/linalg_batching.json``, ``bench/linalg_batching.json``,
docs/devices.md):

- ``eigh`` of n × n: cuSOLVER solves a batch up to n = 32 in one kernel (float64 n = 32: 1.7)
  and loops over the matrices above (n = 33: 464, CPU 65; n = 128: 1,518, CPU 893; n = 197:
  1,603, CPU 2,260). float32 on the GPU was slower than the CPU at every n from 33 to 256.
- ``svd`` of n × (n // 4 + 1): the same, one kernel up to 32 rows (float64 32 × 9: 1.5), a loop
  above (33 × 9: 531, CPU 16; 256 × 65: 3,073, CPU 777); the CPU was faster at every size from
  33 to 256 rows, in both dtypes.
- ``qr`` of n × (n // 4 + 1): about 60–85 per matrix on the GPU at every size (the batched call
  costs what its matrices cost one by one), the CPU 1.3 at 16 rows, 41 at 128 (float64; float32
  35) and 132 at 197 (float32 89), where the GPU's 80 (63) wins.

The bounds below are those measurements; a size or dtype not measured stays where it is.
"""

from __future__ import annotations

import torch

#: The largest n (rows) that torch's batched ``eigh`` and ``svd`` on CUDA solve in one batched
#: kernel; above it they loop over the matrices.
CUDA_ONE_KERNEL_MAX_N = 32
#: Per op and dtype, the range of n (the larger side: the rows of the suite's tall matrices, the
#: order of a symmetric one) in which a CUDA batch is solved on the CPU: (smallest, largest),
#: both included.
HOST_RANGE = {
    "eigh": {torch.float64: (CUDA_ONE_KERNEL_MAX_N + 1, 160),
             torch.float32: (CUDA_ONE_KERNEL_MAX_N + 1, 256)},
    "svd": {torch.float64: (CUDA_ONE_KERNEL_MAX_N + 1, 256),
            torch.float32: (CUDA_ONE_KERNEL_MAX_N + 1, 256)},
    "qr": {torch.float64: (1, 128), torch.float32: (1, 128)},
}


def on_host(op: str, matrix: torch.Tensor) -> bool:
    """Whether ``op`` ("eigh", "svd" or "qr"; ``eigvalsh`` and ``svdvals`` as their full
    solvers) solves ``matrix`` [..., m, k] on the CPU: a CUDA tensor whose larger side
    n = max(m, k) lies in :data:`HOST_RANGE` of the op and dtype. Never for a CPU tensor.

    >>> on_host("eigh", torch.zeros(4, 64, 64, dtype=torch.float64))
    False
    """
    low, high = HOST_RANGE[op].get(matrix.dtype, (1, 0))
    return matrix.device.type == "cuda" and low <= max(matrix.shape[-2:]) <= high


def _back(values: tuple, device: torch.device) -> tuple:
    return tuple(v.to(device) for v in values)


def eigh(sym: torch.Tensor) -> torch.return_types.linalg_eigh:
    """``torch.linalg.eigh`` of symmetric ``sym`` [..., n, n] (ascending, the solver's signs),
    run where :func:`on_host` says and returned on ``sym``'s device."""
    if on_host("eigh", sym):
        return torch.return_types.linalg_eigh(_back(torch.linalg.eigh(sym.cpu()), sym.device))
    return torch.linalg.eigh(sym)


def eigvalsh(sym: torch.Tensor) -> torch.Tensor:
    """``torch.linalg.eigvalsh`` of symmetric ``sym`` [..., n, n] (ascending), run where
    :func:`on_host` says and returned on ``sym``'s device."""
    if on_host("eigh", sym):
        return torch.linalg.eigvalsh(sym.cpu()).to(sym.device)
    return torch.linalg.eigvalsh(sym)


def qr(x: torch.Tensor, mode: str = "reduced") -> torch.return_types.linalg_qr:
    """``torch.linalg.qr(x, mode)``, run where :func:`on_host` says, on ``x``'s device."""
    if on_host("qr", x):
        return torch.return_types.linalg_qr(_back(torch.linalg.qr(x.cpu(), mode=mode), x.device))
    return torch.linalg.qr(x, mode=mode)


def svd(x: torch.Tensor, full_matrices: bool = True) -> torch.return_types.linalg_svd:
    """``torch.linalg.svd(x, full_matrices)``, run where :func:`on_host` says, on ``x``'s
    device."""
    if on_host("svd", x):
        return torch.return_types.linalg_svd(
            _back(torch.linalg.svd(x.cpu(), full_matrices=full_matrices), x.device))
    return torch.linalg.svd(x, full_matrices=full_matrices)


def svdvals(x: torch.Tensor) -> torch.Tensor:
    """``torch.linalg.svdvals(x)``, run where :func:`on_host` says, on ``x``'s device."""
    if on_host("svd", x):
        return torch.linalg.svdvals(x.cpu()).to(x.device)
    return torch.linalg.svdvals(x)
