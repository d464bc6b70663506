"""Eigenpairs of batched symmetric matrices in the project's conventions (method §1): eigenvalues
descending, each eigenvector's sign fixed so that its entry of largest magnitude is positive, so
that no result depends on the eigensolver. The building block of :mod:`checks.gram` and
:mod:`checks.topk` (which both import it; it imports neither).

Every symmetric eigensolve of ``checks`` goes through :func:`eigh` or :func:`eigvalsh` here,
which choose where it runs: torch's batched solver on CUDA takes matrices up to 32 × 32 in one
batched kernel and loops over the matrices above that, one cuSOLVER call each. Measured on an
NVIDIA H200 (torch 2.11.0+cu130, ``python -m bench.run --linalg-batching``, docs/devices.md)
against one thread of a 2-core Intel Xeon, microseconds per matrix in float64: n = 32, 1.8 on
the GPU; n = 33, 503 (CPU 65); n = 64, 813 (214); n = 128, 1,553 (893); n = 197, 1,622 (2,260).
In float32 the GPU was slower at every n from 33 to 256 (at 256, 7,294 against 2,763). So a CUDA
batch of such matrices is solved on the CPU up to the sizes where that was measured faster
(:data:`HOST_FASTER_MAX_N`), and moved back.
"""

from __future__ import annotations

import torch

#: The largest n that torch's batched ``eigh`` on CUDA solves in one batched kernel (measured:
#: 1.8 µs per 32 × 32 float64 matrix on an H200, 503 µs per 33 × 33).
CUDA_ONE_KERNEL_MAX_N = 32
#: Per dtype, the largest n up to which one CPU thread was measured faster than the GPU's
#: per-matrix loop (float64: between n = 128 and 197; float32: every size measured, up to 256).
HOST_FASTER_MAX_N = {torch.float64: 160, torch.float32: 256}


def on_host(matrix: torch.Tensor) -> bool:
    """Whether :func:`eigh` and :func:`eigvalsh` solve ``matrix`` [..., n, n] on the CPU: a CUDA
    tensor whose n is above :data:`CUDA_ONE_KERNEL_MAX_N` and at most :data:`HOST_FASTER_MAX_N`
    of its dtype. Never for a CPU tensor.

    >>> on_host(torch.zeros(4, 64, 64, dtype=torch.float64))
    False
    """
    n = matrix.shape[-1]
    return (matrix.device.type == "cuda"
            and CUDA_ONE_KERNEL_MAX_N < n <= HOST_FASTER_MAX_N.get(matrix.dtype, 0))


def eigh(sym: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.linalg.eigh`` of symmetric ``sym`` [..., n, n] (ascending, the solver's signs), run
    where :func:`on_host` says and returned on ``sym``'s device."""
    if on_host(sym):
        mu, vecs = torch.linalg.eigh(sym.cpu())
        return mu.to(sym.device), vecs.to(sym.device)
    return torch.linalg.eigh(sym)


def eigvalsh(sym: torch.Tensor) -> torch.Tensor:
    """``torch.linalg.eigvalsh`` of symmetric ``sym`` [..., n, n] (ascending), run where
    :func:`on_host` says and returned on ``sym``'s device."""
    if on_host(sym):
        return torch.linalg.eigvalsh(sym.cpu()).to(sym.device)
    return torch.linalg.eigvalsh(sym)


def fix_signs(vectors: torch.Tensor) -> torch.Tensor:
    """Flip each column so that its entry of largest magnitude is positive (method §1).

    ``vectors`` has shape [..., N, m]; the sign rule makes results independent of the eigensolver.

    >>> fix_signs(torch.tensor([[0.6, 0.1], [-0.8, -0.2]])).tolist()
    [[-0.6000000238418579, -0.10000000149011612], [0.800000011920929, 0.20000000298023224]]
    """
    idx = vectors.abs().argmax(dim=-2, keepdim=True)
    pivot = torch.gather(vectors, -2, idx)
    signs = torch.where(pivot < 0, -1.0, 1.0).to(vectors.dtype)
    return vectors * signs


def sorted_eigh(matrix: torch.Tensor, top: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Eigenpairs of symmetric matrices, eigenvalues descending, signs fixed by :func:`fix_signs`.

    Returns (μ [..., M], A [..., N, M]) with K A = A diag(μ) and unit columns: all N pairs, or the
    ``top`` leading ones (only those are flipped and sign-fixed).

    >>> mu, a = sorted_eigh(torch.tensor([[2.0, 0.0], [0.0, 3.0]], dtype=torch.float64))
    >>> mu.tolist(), a.tolist()
    ([3.0, 2.0], [[0.0, 1.0], [1.0, 0.0]])
    """
    sym = 0.5 * (matrix + matrix.transpose(-1, -2))
    mu, vecs = eigh(sym)
    m = matrix.shape[-1] if top is None else top
    return mu[..., -m:].flip(-1), fix_signs(vecs[..., -m:].flip(-1))


def sorted_eigvalsh(matrix: torch.Tensor, top: int | None = None) -> torch.Tensor:
    """Eigenvalues of symmetric matrices, descending: all N, or the ``top`` leading ones [..., M].

    No eigenvectors (LAPACK's values-only path): for callers that need the spectrum alone.
    """
    sym = 0.5 * (matrix + matrix.transpose(-1, -2))
    mu = eigvalsh(sym).flip(-1)
    return mu if top is None else mu[..., :top]
