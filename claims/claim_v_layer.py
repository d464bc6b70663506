"""Claim V's per-layer computation (method §2): the metrics of every (sample, head) of one layer.

Called by the session through the claim's spec (claims/builtin.py): ``layer_metrics(ctx)`` with a
fixtures.engine.layer_context.LayerContext; the session caches the result, checks it is finite
and reports progress."""

from __future__ import annotations

import torch

from checks.errors import NonFiniteError
from checks.stats import seed_from
from checks.value_vectors import DIRECTION_NAMES, init_twin_directions as twin_of

from . import verdicts


def cache_settings() -> dict:
    """Settings the cached claim-V metrics depend on beyond the run options: the allclose
    tolerances of ``[claim_v.allclose]`` (method §2.1) and the shared-direction bar of
    ``[claim_v.partial]`` (method §2.6)."""
    return {"allclose": verdicts.allclose_tolerance(), "shared_bar": verdicts.shared_bar()}


def layer_metrics(ctx) -> dict[str, torch.Tensor]:
    """Claim-V metrics of every (sample, head) of one layer: tensors of shape [B, H]."""
    from concurrent.futures import Future, ThreadPoolExecutor

    from checks.p2_code import p2_code_subset, scatter_rows
    from checks.row_similarity import matched_cosine, matched_cosine_twin
    from checks.value_vectors import value_vector_metrics_batched

    info = ctx.info
    shape = ctx.shape
    d = info["head_dim"]
    lengths = ctx.token_counts()
    gens = [torch.Generator().manual_seed(seed_from(ctx.head_id(h)))
            for h in range(shape[1])]
    # The null's token permutations (ΠV̂, method §2.3), in sample order for every head whatever
    # the grouping: one generator per head, one permutation per (sample, head).
    nulls = [torch.stack([torch.randperm(int(n), generator=g) for g in gens]) for n in lengths]
    p2_samples = p2_code_subset(shape[0], ctx.model)  # method §8.3: a seeded subset
    out: dict[str, torch.Tensor] = {}
    # The Hungarian steps (scipy, CPU; it releases the GIL) of one batch run in other threads
    # (one on the CPU, several beside a GPU: assignment_threads) while the next batch's
    # tensor math runs here; at most two batches of cosine matrices wait, so memory stays
    # bounded.
    pool = ThreadPoolExecutor(max_workers=ctx.assignment_threads,
                              thread_name_prefix="kpca-assignment")
    pending: list[tuple[list[int], slice, list[Future], list[Future], list[int],
                        list[Future]]] = []

    def finish_oldest() -> None:
        done_chunk, done_heads, against_v_hat, against_null, rows, p2code = pending.pop(0)
        results = [f.result() for f in against_v_hat]
        twin = isinstance(results[0], tuple)  # (optimum, its round-off twin), method §13.2
        optimal = torch.stack([r[0] for r in results] if twin else results)
        values = {
            "optimal_cosine": optimal,
            # the optimal matching ignores token order: against ΠV̂ it is the same (method §2.3)
            "optimal_cosine_null": optimal.clone(),
            "p2code_optimal_cosine": scatter_rows([f.result() for f in p2code], rows,
                                                  *optimal.shape)}
        if twin:
            values["twin_optimal_cosine"] = torch.stack([r[1] for r in results])
            values["twin_optimal_cosine_null"] = values["twin_optimal_cosine"].clone()
        ctx.fill(out, done_chunk, done_heads, values)

    try:
        for chunk, heads, _q, k, v in ctx.groups():
            perm = torch.stack([nulls[b][heads] for b in chunk]).to(k.device)
            try:
                m = value_vector_metrics_batched(
                    k, v, scale=info["scale"], standardize=ctx.options.standardize,
                    convention=ctx.options.convention, null_perm=perm,
                    dtype=ctx.options.torch_dtype, defer_matching=True,
                    round_off=ctx.round_off_twins and ctx.options.torch_dtype == torch.float64,
                    shared_bar=verdicts.shared_bar(), **verdicts.allclose_tolerance())
            except NonFiniteError as exc:
                raise ctx.located(exc, chunk, heads) from exc
            cos = m.pop("cosine_matrices")
            twin_cos = m.pop("twin_cosine_matrices", None)
            rows = [i for i, b in enumerate(chunk) if p2_samples[b]]
            p2code = _p2_code(k, v, info, ctx.options, m, rows)  # method §8.3: never judged
            pending.append((chunk, heads,  # one task per sample and target: [H, N, N] each
                            [pool.submit(matched_cosine, c) for c in cos[0]] if twin_cos is None
                            else [pool.submit(matched_cosine_twin, c, t)
                                  for c, t in zip(cos[0], twin_cos[0])],
                            [],  # no matching against ΠV̂: it would repeat the one above
                            rows, [pool.submit(matched_cosine, c) for c in p2code]))
            n_tok = k.shape[-2]
            m["n_tokens"] = torch.full(m["undetermined"].shape, float(n_tok))
            m["few_tokens"] = torch.full(m["undetermined"].shape, n_tok <= d)  # N ≤ d: μ_d = 0
            ctx.fill(out, chunk, heads, m)
            while len(pending) > 1:
                finish_oldest()
        while pending:
            finish_oldest()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    out.update(init_twin_directions(ctx, out))
    return out


def init_twin_directions(ctx, out: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The directions each head of the model's random-init twin shares with its own V̂ (method
    §2.6), [B, H] per name of :data:`checks.value_vectors.DIRECTION_NAMES` + ``"_init_twin"``, paired
    with the model's (sample, head); a random-init model is its own twin (its own values); {}
    where there is no twin."""
    twin = ctx.init_twin()
    if twin is None:
        return {}
    if twin.run is ctx.run:
        return {f"{name}_init_twin": out[name].clone() for name in DIRECTION_NAMES}
    return twin_directions(twin, standardize=ctx.options.standardize,
                           convention=ctx.options.convention, dtype=ctx.options.torch_dtype)


def twin_directions(twin, *, standardize: bool, convention: str, dtype: torch.dtype,
                    located: bool = True) -> dict[str, torch.Tensor]:
    """The directions of every head of the twin ``twin`` (a ``LayerContext.init_twin()``) under
    these settings, [B, H] per name, as :func:`init_twin_directions` and claim V's grid
    (claims/claim_v_grid.py) take them. A non-finite intermediate raises the engine's located
    error, or the NonFiniteError itself with ``located=False`` (the grid's: it makes that
    combination undetermined)."""
    values: dict[str, torch.Tensor] = {}
    for chunk, heads, _q, k, v in twin.groups():
        try:
            twin.fill(values, chunk, heads, twin_of(
                k, v, scale=twin.info["scale"], standardize=standardize, convention=convention,
                dtype=dtype, bar=verdicts.shared_bar()))
        except NonFiniteError as exc:
            if not located:
                raise
            raise twin.located(exc, chunk, heads) from exc
    return values


def _p2_code(k: torch.Tensor, v: torch.Tensor, info: dict, options, m: dict,
             rows: list[int]) -> list[torch.Tensor]:
    """Claim V's sign-dependent metrics with P2's code conventions (method §8.3) for the samples
    ``rows`` of the batch (NaN for the others), added to ``m`` as ``p2code_direct_cosine`` and
    ``p2code_pearson``; returns those samples' cosine matrices, whose Hungarian step gives
    ``p2code_optimal_cosine``."""
    from checks.p2_code import p2_code_metrics_on

    p2, cos = p2_code_metrics_on(k, v, rows, scale=info["scale"], standardize=options.standardize)
    m["p2code_direct_cosine"], m["p2code_pearson"] = p2["direct_cosine"], p2["pearson"]
    return cos
