"""Claim J's per-layer computation (method §3): the projection-loss terms and the output fit of
every (sample, head) of one layer.

Called by the session through the claim's spec (claims/builtin.py): ``layer_metrics(ctx)`` with a
fixtures.engine.layer_context.LayerContext."""

from __future__ import annotations

import math

import torch

from checks.gram import KeyGram, standardize_tokens
from checks.nulls import shuffled_token_null
from checks.output_fit import kpca_output_fit
from checks.stats import seed_from

from .claim_v_grid import v_hat_of_batch

#: The per-token tensors of the layer terms [B, H, N_max] (method §3.7).
TOKEN_TERMS = ("token_log_phi_sq", "token_h_sq", "token_fit_h_sq")


def output_fit_terms(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                     convention: str, perm: torch.Tensor,
                     v_hat: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """The KPCA output fit of method §3.6 for a batch [..., n, d] of (already cast and
    standardised) queries, keys and values: V̂ of the keys, the attention probabilities, the fit
    of softmax·V̂ by softmax·V up to V·M + 1cᵀ, and its null with the token-shuffled V
    (``perm`` [..., n], the null's token permutations).

    The whole batch is solved in one batched call of each step, so a head's numbers depend on
    the batch it shares only through round-off: MKL's LAPACK and BLAS round a matrix that does
    not start on a 16-byte boundary differently, and in a batch of N×N matrices with odd N every
    second one does not (method §6.1: ‖h*‖² moved by up to 4e-14 relative between 12 heads in one
    batch and one head alone on all-MiniLM-L6-v2, N = 79). Solving each head on its own made
    the bits independent of the batch but cost 1-3 ms of overhead per head, most of claim J's
    trend over training checkpoints (21,600 heads per tiny ViT series).

    ``v_hat`` [..., n, ≥ min(d, n)]: V̂ computed by the caller (a specification of the curve
    takes it from claim V's grid, method §14.1); its first min(d, n) columns are used. None: V̂
    of the keys, computed here.
    """
    top = min(v.shape[-1], k.shape[-2])
    if v_hat is None:
        v_hat = KeyGram(k, scale=scale, dtype=k.dtype, top=top).kpca_values(convention)
    else:  # contiguous, as computed here: a grid's V̂ is a view of wider columns, and BLAS
        v_hat = v_hat[..., :top].contiguous()  # rounds a strided operand differently
    probs = torch.softmax(scale * q @ k.transpose(-1, -2), dim=-1)
    return kpca_output_fit(probs, v, v_hat, shuffled_token_null(v, perm))


def batch_terms(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                standardize: bool, convention: str, perm: torch.Tensor,
                dtype: torch.dtype = torch.float64, fit: bool = True,
                v_hat: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Claim J's terms of a batch of heads q, k, v [b, h, n, d] (one token count): the token
    means [b, h] of method §3.1, the output fit [b, h] of method §3.6 with ``perm`` [b, h, n]
    the null's token permutations, and the per-token tensors [b, h, n] of :data:`TOKEN_TERMS`.
    ``fit=False``: without the output fit (``output_r2``, ``output_r2_null``,
    ``token_fit_h_sq``), for a run that reads J_proj's terms only. ``v_hat``: the fit's V̂ when
    the caller has it (:func:`output_fit_terms`)."""
    from checks.projection import log_phi_sq_norm_p1_code, projection_terms_batched

    exact = projection_terms_batched(q, k, v, scale=scale, standardize=standardize, dtype=dtype)
    # The p1-code variant differs from the exact terms only in ‖φ‖² (h is the same):
    # its log ‖φ‖² alone, on the same (cast, standardised) q and k, not the whole set.
    qd, kd = q.to(dtype), k.to(dtype)
    if standardize:
        qd, kd = standardize_tokens(qd), standardize_tokens(kd)
    p1 = {"log_phi_sq": log_phi_sq_norm_p1_code(qd, kd, scale)}
    n_tok = q.shape[-2]
    fitted = {}
    if fit and n_tok < q.shape[-1]:  # V̂ has fewer than d columns (N < d, method §2): no fit
        nan = torch.full(exact["j_proj"].shape, math.nan, dtype=torch.float64)
        fitted = {"token_fit_h_sq": torch.full(exact["h_sq"].shape, math.nan, dtype=torch.float64),
                  "output_r2": nan, "output_r2_null": nan.clone()}
    elif fit:
        terms = output_fit_terms(qd, kd, v.to(dtype), scale, convention, perm, v_hat)
        fitted = {"token_fit_h_sq": terms["fitted_h_sq"], "output_r2": terms["r2"],
                  "output_r2_null": terms["r2_null"]}
    return {
        "token_log_phi_sq": exact["log_phi_sq"], "token_h_sq": exact["h_sq"], **fitted,
        # log of the token mean of ‖φ‖², exact even where ‖φ‖² underflows
        "log_phi_sq_mean": torch.logsumexp(exact["log_phi_sq"], -1) - math.log(n_tok),
        "phi_sq_mean": exact["phi_sq"].mean(-1),
        "h_sq_mean": exact["h_sq"].mean(-1),
        "j_proj": exact["j_proj"],
        "bessel_share": exact["bessel_share"],
        "n_tokens": torch.full(exact["j_proj"].shape, float(n_tok)),
        "p1_log_phi_sq_mean": torch.logsumexp(p1["log_phi_sq"], -1) - math.log(n_tok),
    }


def taken_v_hat(ctx, chunk: list[int], heads: slice, k: torch.Tensor) -> torch.Tensor | None:
    """V̂ [b, h, n, d] of one batch for a specification's run that takes the ``v_hat`` channel
    (``ClaimSpec.takes``): claim V's grid's, when it left this batch's (taken out), else the same
    batched computation here (:func:`claims.claim_v_grid.v_hat_of_batch`), so the numbers do not
    depend on whether the grid came from the cache; None for the claim tests' runs (the fit
    computes its batch's own)."""
    if not ctx.takes("v_hat"):
        return None
    found = ctx.take("v_hat", chunk, heads)
    if found is not None:
        return found.to(k.device)
    opts = ctx.options
    return v_hat_of_batch(k, ctx.info, opts.standardize, opts.torch_dtype, opts.convention)


def layer_metrics(ctx) -> dict[str, torch.Tensor]:
    """Claim-J terms of every (sample, head) of one layer, [B, H]: token means of ‖φ‖² (also
    in log space) and ‖h‖², J_proj, the Bessel share, the token count, and the p1-code ‖φ‖²;
    the output fit's R² and its null [B, H] (method §3.6; NaN for a sample of fewer tokens than
    the head dimension, whose V̂ has fewer than d columns); and per token [B, H, N_max] (NaN past
    a sample's own N): log ‖φ‖², ‖h‖² and the fitted ‖h*‖² (method §3.7)."""
    from checks.errors import NonFiniteError

    info = ctx.info
    dtype = ctx.options.torch_dtype
    out: dict[str, torch.Tensor] = {}
    lengths = ctx.token_counts()
    n_max = int(max(lengths))
    gens = [torch.Generator().manual_seed(seed_from("J-" + ctx.head_id(h)))
            for h in range(ctx.shape[1])]
    # the output fit's null permutations (ΠV̂, method §3.6), in sample order for every head
    nulls = [torch.stack([torch.randperm(int(n), generator=g) for g in gens]) for n in lengths]

    def padded(x: torch.Tensor) -> torch.Tensor:  # [b, h, n] -> [b, h, n_max], NaN beyond n
        return torch.nn.functional.pad(x.to(torch.float64), (0, n_max - x.shape[-1]),
                                       value=math.nan)

    for chunk, heads, q, k, v in ctx.groups():
        perm = torch.stack([nulls[b][heads] for b in chunk]).to(k.device)
        try:
            values = batch_terms(q, k, v, info["scale"], ctx.options.standardize,
                                 ctx.options.convention, perm, dtype,
                                 v_hat=taken_v_hat(ctx, chunk, heads, k))
        except NonFiniteError as exc:
            raise ctx.located(exc, chunk, heads) from exc
        for name in TOKEN_TERMS:
            if name in values:
                values[name] = padded(values[name])
        ctx.fill(out, chunk, heads, values)
    return out
