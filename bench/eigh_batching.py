"""``python -m bench.run --eigh-batching``: does one batched ``torch.linalg.eigh`` call beat a
loop of single-matrix calls on this device, and from which matrix size does the batched call
itself loop over its matrices?

On CUDA, torch hands small batched symmetric problems to cuSOLVER's batched Jacobi solver and, for
larger matrices, may call the one-matrix solver once per matrix (the size limit is torch's and
cuSOLVER's, not ours): a batched call then costs about ``batch`` single calls. This measures it
rather than assuming it: for every size, the seconds per matrix of one call on ``batch`` matrices,
of a loop of single calls, and of one call on a quarter of the batch (a batched call whose time
per matrix does not fall with the batch is a loop). Inputs are seeded symmetric matrices with a
spread spectrum, like the suite's centred Gram matrices; every batched result is checked against
the single calls (eigenvalues to a relative 1e-8 in float64, 1e-3 in float32).
"""

from __future__ import annotations

import time

import torch

EIGH_SIZES = (16, 24, 32, 33, 48, 64, 96, 128, 197, 256)
EIGH_BATCH = 256
EIGH_DTYPES = ("float64", "float32")


def _matrices(batch: int, n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    gen = torch.Generator().manual_seed(n)
    x = torch.randn(batch, n, n, generator=gen, dtype=torch.float64)
    spectrum = torch.logspace(0, -6, n, dtype=torch.float64)
    q = torch.linalg.qr(x).Q
    a = (q * spectrum) @ q.transpose(-1, -2)
    return ((a + a.transpose(-1, -2)) / 2).to(device=device, dtype=dtype)


def _seconds(fn, device: torch.device, repeats: int) -> float:
    """Median wall seconds of ``fn()`` over ``repeats`` runs after one warm-up, the device
    synchronised around each run."""
    fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def eigh_batching(device: torch.device, batch: int = EIGH_BATCH, sizes=EIGH_SIZES,
                  repeats: int = 3) -> list[dict]:
    """One row per (dtype, n): microseconds per matrix of the batched call on ``batch`` and on
    ``batch // 4`` matrices and of the loop of single calls, the loop/batched ratio, and whether
    the batched call behaves as a loop: its time per matrix at ``batch // 4`` within 25% of that
    at ``batch``, and the loop of single calls less than twice as slow."""
    rows = []
    for name in EIGH_DTYPES:
        dtype = getattr(torch, name)
        for n in sizes:
            a = _matrices(batch, n, dtype, device)
            quarter = a[: batch // 4].contiguous()
            batched = _seconds(lambda: torch.linalg.eigh(a), device, repeats) / batch
            small = _seconds(lambda: torch.linalg.eigh(quarter), device, repeats) / len(quarter)
            loop = _seconds(lambda: [torch.linalg.eigh(m) for m in a], device, 1) / batch
            got = torch.linalg.eigh(a).eigenvalues.double().cpu()
            ref = torch.stack([torch.linalg.eigh(m).eigenvalues for m in a]).double().cpu()
            tol = 1e-8 if dtype == torch.float64 else 1e-3
            agree = bool(((got - ref).abs() <= tol * ref.abs().amax(-1, keepdim=True)).all())
            rows.append({"dtype": name, "n": n, "batch": batch,
                         "batched_us": batched * 1e6, "quarter_batch_us": small * 1e6,
                         "loop_us": loop * 1e6, "loop_over_batched": loop / batched,
                         "batched_scales_like_a_loop": small <= 1.25 * batched and loop < 2 * batched,
                         "eigenvalues_agree": agree})
    return rows


def print_eigh_batching(rows: list[dict], device: str) -> None:
    print(f"torch.linalg.eigh on {device}: microseconds per matrix")
    print(f"{'dtype':8} {'n':>4} {'batched':>10} {'batch/4':>10} {'loop':>10} "
          f"{'loop/batched':>12}  batched loops?  agree")
    for r in rows:
        print(f"{r['dtype']:8} {r['n']:>4} {r['batched_us']:>10.1f} {r['quarter_batch_us']:>10.1f} "
              f"{r['loop_us']:>10.1f} {r['loop_over_batched']:>12.2f}  "
              f"{'yes' if r['batched_scales_like_a_loop'] else 'no':>14}  {r['eigenvalues_agree']}")
