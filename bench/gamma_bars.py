"""``python -m bench.gamma_bars``: where γ's `ours` bars sit on the synthetic dose-response
(method §4.2, "Calibration"), the measurement behind ``[claim_e_gamma.ours.supported]``.

Per key law (unit-variance keys at d = 32 and d = 8, keys of variance 0.25 at d = 32; N = 65,
20 samples, seeds 0 and 1): V = V̂ + ε·‖v̂_j‖·z_j with one noise draw z scaled by ε over a grid
of ε, every dose a head of one layer judged through the claims' own record functions
(claim V's ``head_record``, claim E's ``head_record``). It prints

- ρ's position (``gamma_subspace_position``) where claim V's overlap excess crosses its support
  bar 0.9: the range the ρ bar 0.35 must lie in;
- ω's position (``gamma_direction_position``) where ρ's position crosses 0.35: the ω bar sits
  just below the least of them;

each by linear interpolation in ε between the two grid doses around the crossing. Nothing is
judged; it takes about a minute on one core.

    python -m bench.gamma_bars
"""

from __future__ import annotations

import argparse
import math

import numpy as np
import torch

from checks.degenerate import effective_rows
from checks.gamma import gamma_spread_batched
from checks.gram import KeyGram
from checks.nulls import token_permutations
from checks.value_vectors import value_vector_metrics_batched
from claims import claim_e, claim_e_layer, claim_v

F64 = torch.float64
N, S = 65, 20
LAWS = ((32, 1.0), (32, 0.25), (8, 1.0))  # (d, key variance)
EPS = tuple(float(e) for e in np.round(np.linspace(0.1, 1.3, 49), 3))


def dose_response(d: int, variance: float, seed: int) -> dict[str, list[float]]:
    """Claim V's overlap excess and γ's two positions at every dose of :data:`EPS`."""
    gen = torch.Generator().manual_seed(seed)
    k = torch.randn(S, N, d, generator=gen, dtype=F64) * math.sqrt(variance)
    v_hat = KeyGram(k).kpca_values("p2")
    z = torch.randn(S, N, d, generator=gen, dtype=F64)
    v = torch.stack([v_hat + e * z * v_hat.norm(dim=-1, keepdim=True) / math.sqrt(d)
                     for e in EPS], dim=1)
    heads = v.shape[1]
    kk = k.unsqueeze(1).expand(-1, heads, -1, -1)
    m = value_vector_metrics_batched(kk, v, null_perm=token_permutations(N, 7, (S, heads)),
                                     atol=1e-5, rtol=1e-3)
    stats = claim_v.head_statistics("dose", {0: m}, list(range(heads)))
    g = gamma_spread_batched(kk, v, seed=0, null_perm=token_permutations(N, 3, (S, heads)))
    t = {"undetermined": g["undetermined"], "effective_rows": effective_rows(KeyGram(kk).log_g),
         **claim_e_layer.gamma_terms(g)}
    out: dict[str, list[float]] = {"overlap": [], "rho": [], "omega": []}
    for i in range(heads):
        mv = claim_v.head_record("dose", 0, i, m, statistics=stats[(0, i)])["metrics"]
        me = claim_e.head_record("dose", 0, i, t)["metrics"]
        out["overlap"].append(mv["subspace_overlap_excess"])
        out["rho"].append(me["gamma_subspace_position"])
        out["omega"].append(me["gamma_direction_position"])
    return out


def crossing(xs: list[float], bar: float, ys: list[float]) -> tuple[float, float] | None:
    """(y, ε) where xs first crosses ``bar``, linear between the two doses around it."""
    for i in range(len(xs) - 1):
        a, b = xs[i], xs[i + 1]
        if a != b and (a - bar) * (b - bar) <= 0:
            f = (bar - a) / (b - a)
            return ys[i] + f * (ys[i + 1] - ys[i]), EPS[i] + f * (EPS[i + 1] - EPS[i])
    return None


def _said(c: tuple[float, float] | None) -> str:
    return "not crossed" if c is None else f"{c[0]:.3f} (eps {c[1]:.3f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gamma_bars", description=__doc__)
    parser.add_argument("--seeds", type=int, default=2, help="seeds 0..N-1 per key law (2)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    for d, variance in LAWS:
        for seed in range(args.seeds):
            r = dose_response(d, variance, seed)
            at_v = crossing(r["overlap"], 0.9, r["rho"])
            at_rho = crossing(r["rho"], 0.35, r["omega"])
            print(f"d={d} key variance={variance} seed={seed}: rho position where claim V's "
                  f"overlap excess = 0.9: {_said(at_v)}; omega position where rho position = "
                  f"0.35: {_said(at_rho)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
