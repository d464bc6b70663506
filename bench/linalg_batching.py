"""``python -m bench.run --linalg-batching``: does one batched call of torch's ``eigh``, ``qr`` and
``svd`` beat a loop of single-matrix calls on this device, and from which matrix size does the
batched call itself loop over its matrices?

On CUDA, torch hands small batched symmetric eigenproblems to cuSOLVER's batched Jacobi solver
and, above 32 × 32, calls the one-matrix solver once per matrix: a batched call then costs about
``batch`` single calls (measured on an H200: docs/devices.md). Whether ``qr`` and ``svd`` do the
same on a given machine is what this measures too, on the shapes the suite factorises: ``eigh``
of n × n symmetric matrices (the Gram matrices, n the tokens), ``qr`` and ``svd`` of n × k tall
matrices with k = n // 4 + 1 (a value or key matrix and its bias column, N × (d + 1)). For every
op and size: seconds per matrix of one call on ``batch`` matrices, of one call on a quarter of
them, and of a loop of single calls (a batched call whose time per matrix does not fall with the
batch and is close to the loop's is a loop). Inputs are seeded, with a spread spectrum like the
suite's; every batched result is checked against the single calls (eigenvalues or singular
values, and ``|R|``'s diagonal, to a relative 1e-8 in float64, 1e-3 in float32).
"""

from __future__ import annotations

import time

import torch

SIZES = (16, 24, 32, 33, 48, 64, 96, 128, 197, 256)
BATCH = 256
DTYPES = ("float64", "float32")
OPS = ("eigh", "qr", "svd")


def _matrices(op: str, batch: int, n: int, dtype: torch.dtype,
              device: torch.device) -> torch.Tensor:
    """Seeded inputs of ``op`` at size n: symmetric n × n with eigenvalues 1 … 1e-6 for ``eigh``,
    n × (n // 4 + 1) with singular values 1 … 1e-6 for ``qr`` and ``svd``."""
    gen = torch.Generator().manual_seed(n)
    cols = n if op == "eigh" else n // 4 + 1
    q = torch.linalg.qr(torch.randn(batch, n, n, generator=gen, dtype=torch.float64)).Q
    spectrum = torch.logspace(0, -6, cols, dtype=torch.float64)
    if op == "eigh":
        a = (q * spectrum) @ q.transpose(-1, -2)
        a = (a + a.transpose(-1, -2)) / 2
    else:
        right = torch.linalg.qr(torch.randn(batch, cols, cols, generator=gen,
                                            dtype=torch.float64)).Q
        a = (q[..., :cols] * spectrum) @ right.transpose(-1, -2)
    return a.to(device=device, dtype=dtype)


def _solve(op: str, a: torch.Tensor):
    if op == "eigh":
        return torch.linalg.eigh(a)
    if op == "qr":
        return torch.linalg.qr(a)
    return torch.linalg.svd(a, full_matrices=False)


def _invariants(op: str, solved) -> torch.Tensor:
    """What every solver must agree on, from ``_solve``'s result: eigenvalues, |diag R|, or
    singular values [..., k]."""
    if op == "eigh":
        return solved.eigenvalues
    if op == "qr":
        return solved.R.diagonal(dim1=-2, dim2=-1).abs()
    return solved.S


def _timed(fn, device: torch.device) -> tuple[float, object]:
    """(wall seconds, result) of one call of ``fn()``, the device synchronised around it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    value = fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0, value


def _seconds(fn, device: torch.device, repeats: int) -> float:
    """Median wall seconds of ``fn()`` over ``repeats`` runs after one warm-up."""
    fn()
    times = sorted(_timed(fn, device)[0] for _ in range(repeats))
    return times[len(times) // 2]


def linalg_batching(device: torch.device, batch: int = BATCH, sizes=SIZES, ops=OPS,
                    repeats: int = 3, progress=None) -> list[dict]:
    """One row per (op, dtype, n): microseconds per matrix of the batched call on ``batch`` and on
    ``batch // 4`` matrices and of the loop of single calls, the loop/batched ratio, and whether
    the batched call behaves as a loop: its time per matrix at ``batch // 4`` within 25% of that
    at ``batch``, and the loop of single calls less than twice as slow. The inputs of (op, n) are
    made once, in float64, and rounded for float32; the timed loop (after one warm-up single call)
    gives the reference the batched result is checked against. ``progress(row)`` is called as
    each row is done."""
    rows = []
    for op in ops:
        for n in sizes:
            a64 = _matrices(op, batch, n, torch.float64, torch.device("cpu"))
            for name in DTYPES:
                a = a64.to(device=device, dtype=getattr(torch, name))
                rows.append(_row(op, name, n, a, device, repeats))
                if progress is not None:
                    progress(rows[-1])
    return sorted(rows, key=lambda r: (ops.index(r["op"]), DTYPES.index(r["dtype"]),
                                       sizes.index(r["n"])))


def _row(op: str, name: str, n: int, a: torch.Tensor, device: torch.device,
         repeats: int) -> dict:
    batch = len(a)
    quarter = a[: batch // 4].contiguous()
    batched = _seconds(lambda: _solve(op, a), device, repeats) / batch
    small = _seconds(lambda: _solve(op, quarter), device, repeats) / len(quarter)
    _solve(op, a[0])  # the single call's warm-up; the timed loop's results are the reference
    seconds, singles = _timed(lambda: [_solve(op, m) for m in a], device)
    loop = seconds / batch
    got = _invariants(op, _solve(op, a)).double().cpu()
    ref = torch.stack([_invariants(op, s) for s in singles]).double().cpu()
    tol = 1e-8 if a.dtype == torch.float64 else 1e-3
    agree = bool(((got - ref).abs() <= tol * ref.abs().amax(-1, keepdim=True)).all())
    return {"op": op, "dtype": name, "n": n, "shape": list(a.shape[-2:]), "batch": batch,
            "batched_us": batched * 1e6, "quarter_batch_us": small * 1e6, "loop_us": loop * 1e6,
            "loop_over_batched": loop / batched,
            "batched_scales_like_a_loop": small <= 1.25 * batched and loop < 2 * batched,
            "agree": agree}


HEADER = (f"{'op':5} {'dtype':8} {'shape':>9} {'batched':>10} {'batch/4':>10} {'loop':>10} "
          f"{'loop/batched':>12}  batched loops?  agree")


def format_row(r: dict) -> str:
    shape = "x".join(map(str, r["shape"]))
    return (f"{r['op']:5} {r['dtype']:8} {shape:>9} {r['batched_us']:>10.1f} "
            f"{r['quarter_batch_us']:>10.1f} {r['loop_us']:>10.1f} "
            f"{r['loop_over_batched']:>12.2f}  "
            f"{'yes' if r['batched_scales_like_a_loop'] else 'no':>14}  {r['agree']}")
