"""Claim E's per-layer computation (method §4): top-d Gram eigenvalues by three routes, the naive
route's finiteness and the γ terms of every (sample, head) of one layer.

Called by the session through the claim's spec (claims/builtin.py): ``layer_metrics(ctx)`` with a
fixtures.engine.layer_context.LayerContext."""

from __future__ import annotations

import torch

from checks import spectrum
from checks.errors import NonFiniteError
from checks.stats import seed_from

from .claim_v_grid import grid_gram

def gamma_seeds(model: str, layer: int, samples: list[int], heads: slice) -> list[int]:
    """One seed per (sample, head) of a batch for claim E's perturbed control (method §4), in
    batch order: each item's draw depends on its own seed alone, not on how the samples and heads
    were batched (``--max-memory``, the device), so CPU, GPU and resumed runs agree."""
    return [seed_from(f"{model}-L{layer:02d}-E-s{b}-h{h}") for b in samples
            for h in range(heads.start or 0, heads.stop)]


def gamma_null_permutations(model: str, layer: int, samples: list[int], heads: slice,
                            n: int) -> torch.Tensor:
    """The token permutations [b, h, n] of γ's chance level (method §4.2): one per (sample,
    head), each from its own seed, so the null does not depend on how the run was batched."""
    return torch.stack([
        torch.stack([torch.randperm(n, generator=torch.Generator().manual_seed(
            seed_from(f"{model}-L{layer:02d}-E-null-s{b}-h{h}")))
            for h in range(heads.start or 0, heads.stop)]) for b in samples])


def gamma_terms(gamma: dict) -> dict[str, torch.Tensor]:
    """The per-head γ terms :func:`head_record` reads, from the output of
    :func:`checks.gamma.gamma_spread_batched` (with ``null_perm``): each candidate's mean relative
    and absolute spread, and its invariant-subspace residual ρ and direction overlap ω (method §4.2)."""
    terms = {}
    for name in ("learned", "eigen", "perturbed"):
        terms[f"gamma_{name}"] = gamma[name].mean(-1)
        terms[f"gamma_{name}_abs"] = gamma[f"{name}_abs"].mean(-1)
    for name in ("learned", "eigen", "perturbed", "null"):  # method §4.2
        terms[f"gamma_{name}_subspace"] = gamma[f"{name}_subspace"]
        terms[f"gamma_{name}_directions"] = gamma[f"{name}_directions"]
    for name in ("learned", "null"):  # how far round-off moves ω (method §4.2, "Precision")
        terms[f"gamma_{name}_directions_precision"] = gamma[f"{name}_directions_precision"]
    if "learned_twin" in gamma:  # the round-off twins, for the records' widths (method §13.2)
        for name in ("learned", "eigen", "perturbed"):
            terms[f"twin_gamma_{name}"] = gamma[f"{name}_twin"].mean(-1)
            terms[f"twin_gamma_{name}_abs"] = gamma[f"{name}_abs_twin"].mean(-1)
        for name in ("learned", "eigen", "perturbed", "null"):
            terms[f"twin_gamma_{name}_subspace"] = gamma[f"{name}_subspace_twin"]
            terms[f"twin_gamma_{name}_directions"] = gamma[f"{name}_directions_twin"]
    return terms


def batch_values(model: str, layer: int, info: dict, chunk: list[int], heads: slice,
                 k: torch.Tensor, v: torch.Tensor, standardize: bool, round_off: bool,
                 grams: tuple | None = None, naive=None) -> dict[str, torch.Tensor]:
    """Claim E's values of one batch [b, h, ...] (keys and values [b, h, n, d] of the samples
    ``chunk`` and heads ``heads`` of a layer), γ judged on the ``standardize`` route.

    ``grams``: the (raw, standardised) :class:`checks.gram.KeyGram` of ``k`` with top-d
    eigenpairs when the caller has them (claim V's grid of the specification curve, method
    §14.1), and ``naive`` the batch's :func:`checks.spectrum.naive_gram_spectrum`; None: computed
    here, the route γ is not judged on as eigenvalues only. Raises
    :class:`checks.errors.NonFiniteError` for a non-finite intermediate."""
    from checks import gamma as gamma_constancy
    from checks.degenerate import effective_rows
    from checks.gram import KeyGram

    d = info["head_dim"]

    def top_d(mu: torch.Tensor) -> torch.Tensor:  # P2 takes the first d by signed order
        mu = mu[..., :d]
        return torch.nn.functional.pad(mu, (0, d - mu.shape[-1])) if mu.shape[-1] < d else mu

    if grams is None:
        # One KeyGram per key route (raw, standardised), each keeping only the top d pairs
        # (P2 reads the first d eigenvalues); the route γ is judged on (--standardize) keeps
        # its eigenvectors and is handed to γ, the other is eigenvalues only.
        top = min(d, k.shape[-2])
        grams = tuple(KeyGram(k, scale=info["scale"], standardize=s, top=top,
                              eigenvectors=s == standardize) for s in (False, True))
    raw, std = grams
    judged = std if standardize else raw
    if naive is None:
        naive = spectrum.naive_gram_spectrum(k, scale=info["scale"])
    gamma = gamma_constancy.gamma_spread_batched(
        k, v, scale=info["scale"], standardize=standardize,
        seed=gamma_seeds(model, layer, chunk, heads), gram=judged,
        null_perm=gamma_null_permutations(model, layer, chunk, heads,
                                          k.shape[-2]).to(k.device),
        round_off=round_off)
    values = {"mu_log_raw": top_d(raw.eigenvalues),
              "mu_log_standardized": top_d(std.eigenvalues),
              "mu_naive_float32": torch.nan_to_num(top_d(naive.mu), nan=0.0),
              "naive_finite": naive.finite,
              "undetermined": gamma["undetermined"]}
    for stage, mask in naive.first_nonfinite_stage.items():
        values[f"naive_bad_{stage}"] = mask
    values.update(gamma_terms(gamma))
    values["effective_rows"] = effective_rows(judged.log_g)  # method §2.2: degenerate heads
    # the token count: a sample of fewer tokens than d has fewer eigenvalues than P2 reads
    values["n_tokens"] = torch.full(tuple(k.shape[:2]), float(k.shape[-2]), dtype=torch.float64)
    return values


def values_from_grams(payload: dict, keys: list[tuple]) -> dict:
    """Claim E's intake of the ``grams`` channel (``ClaimSpec.intake``): its values of one batch
    from claim V's grid's (raw, standardised) float64 Gram matrices (``payload``: the batch's
    ``model``, ``layer``, ``info``, ``chunk``, ``heads``, ``k``, ``v`` and ``grams``), per store
    key ``(standardize,)``, γ judged on that route, one naive spectrum for both (a specification's
    run: no round-off twins, method §13.2). A non-finite intermediate leaves the batch to the
    claim, which computes it again and names the failure: ``{}``."""
    p = payload
    try:
        naive = spectrum.naive_gram_spectrum(p["k"], scale=p["info"]["scale"])
        return {key: batch_values(p["model"], p["layer"], p["info"], p["chunk"], p["heads"],
                                  p["k"], p["v"], key[0], False, grams=p["grams"], naive=naive)
                for key in keys}
    except NonFiniteError:
        return {}


def layer_metrics(ctx) -> dict[str, torch.Tensor]:
    """Claim-E quantities of one layer: top-d |μ| by three routes [B, H, d], naive-route
    finiteness [B, H], and γ spreads (relative and absolute, mean over components) [B, H]."""

    out: dict[str, torch.Tensor] = {}
    for chunk, heads, _q, k, v in ctx.groups():
        try:
            values = ctx.take("grams", chunk, heads)
            if values is None:
                # a specification's run whose batch the grid did not leave: its Gram matrices
                # as the grid builds them, so the numbers do not depend on the cache
                grams = (tuple(grid_gram(k, ctx.info, s, torch.float64) for s in (False, True))
                         if ctx.takes("grams") else None)
                values = batch_values(
                    ctx.model, ctx.layer, ctx.info, chunk, heads, k, v, ctx.options.standardize,
                    ctx.round_off_twins, grams=grams)
        except NonFiniteError as exc:
            raise ctx.located(exc, chunk, heads) from exc
        ctx.fill(out, chunk, heads, values)
    return out
