"""Claim V's grid of the specification curve (``--multiverse``, method §14.1), one layer at a time:
the per-layer metrics of claim V under every (standardise, dtype) × axis convention × null with
one Gram matrix and eigendecomposition per (standardise, dtype) (:func:`v_grid_layer`), the
optimal cosine as bounds, and its exact value from the Hungarian matching (:func:`v_matched_layer`)
only where a verdict needs it. claims/claim_v_curve.py runs them over the layers, cached.

Both take a layer context (``ctx``: :class:`fixtures.engine.layer_context.LayerContext`, as a
claim's ``layer_metrics`` does): its batches, its model's facts, and ``fill``/``located``. The
Gram matrices of a batch as this grid builds them (:func:`grid_gram`, :func:`v_hat_of_batch`) are
also what claim J's V̂ and claim E's values of a specification are computed from where the grid
did not leave them (method §14.1), so that the numbers do not depend on the cache.
"""

from __future__ import annotations

import torch

from checks import metric_suite, row_similarity
from checks.degenerate import effective_rows
from checks.errors import NonFiniteError, check_finite
from checks.gram import KeyGram, kpca_values
from checks.row_similarity import cosine_pair
from checks.stats import seed_from
from checks.leading_directions import shuffled_directions
from checks.value_vectors import (DIRECTION_NAMES, direction_weights, _pad_columns,
                                  directions_from_bases, random_orthonormal)

from . import verdicts
from .claim_v_layer import twin_directions

#: The values of the null axis (claims/specifications.toml ``[axes.null]``, method §2.3, §14.2):
#: the token-shuffled V̂ that the claim tests use, and P2's random-basis V̂₀ = G(I − 11ᵀ/N)A₀.
NULLS = ("token-shuffled", "random-basis")
DEFAULT_NULL = "token-shuffled"
#: The targets :func:`_v_targets` stacks, in order. The suite of :func:`v_grid_layer` puts its
#: metrics in the order V̂ (p2, kpca), the token-shuffled ΠV̂ (p2, kpca), V̂₀.
TARGETS = ("p2", "kpca", "random-basis")
DTYPES = {"float64": torch.float64, "float32": torch.float32}


def combo_key(std: bool, dtype: str, convention: str, null: str) -> str:
    """The name of one (standardise, dtype, axis convention, null) combination's metrics."""
    return f"std={'on' if std else 'off'}|dtype={dtype}|axes={convention}|null={null}"


def padded_v_hat(gram: KeyGram, convention: str, d: int) -> torch.Tensor:
    """V̂ [..., n, d] of a :class:`checks.gram.KeyGram` under ``convention``, right-padded with
    zero columns where n < d: the grid's targets and a specification's claim-J V̂."""
    return _pad_columns(gram.kpca_values(convention), d)


def grid_gram(k: torch.Tensor, info: dict, standardize: bool, dtype: torch.dtype) -> KeyGram:
    """The :class:`checks.gram.KeyGram` of a batch of keys [b, h, n, d] with its top d
    eigenpairs, as the grid builds it per (standardisation, precision), and everything that must
    give the grid's bits: the matching, a specification's claim-J V̂ (:func:`v_hat_of_batch`)
    and claim E's values (claims/claim_e_layer.py)."""
    return KeyGram(k, scale=info["scale"], standardize=standardize, dtype=dtype,
                   top=info["head_dim"])


def v_hat_of_batch(k: torch.Tensor, info: dict, standardize: bool, dtype: torch.dtype,
                   convention: str) -> torch.Tensor:
    """V̂ [b, h, n, d] of a batch of keys from one batched eigendecomposition, as the grid builds
    it (:func:`padded_v_hat`, :func:`_v_targets`), for a specification's claim J whose batch the
    grid did not leave: the same bits either way (tests/test_multiverse_v_grid.py)."""
    return padded_v_hat(grid_gram(k, info, standardize, dtype), convention, info["head_dim"])


def random_basis_axes(head_id, heads: slice, chunk: list[int], n: int, m: int,
                      n_heads: int) -> torch.Tensor:
    """P2's null axes A₀ [b, h, n, m] for the samples ``chunk`` and heads ``heads`` of a layer:
    a uniformly random orthonormal basis per (sample, head), from one generator per (head,
    sample) seeded from the head's id (``head_id(h)``) and the sample index, so a sample's A₀
    does not depend on how samples are grouped (method §2.3,
    :func:`checks.value_vectors.random_orthonormal`)."""
    rows = []
    for b in chunk:
        rows.append(torch.stack([random_orthonormal(n, m, seed_from(f"{head_id(h)}-A0-{b}"))
                                 for h in range(n_heads)[heads]]))
    return torch.stack(rows)


def _v_targets(info: dict, gram: KeyGram, k: torch.Tensor, v: torch.Tensor, a0: torch.Tensor,
               tdtype: torch.dtype):
    """V in ``tdtype`` and the three computed targets [3, b, h, n, d] of one batch from its
    ``gram``: V̂ under the p2 and the kpca convention (:data:`TARGETS`) and P2's random-basis
    V̂₀ (one code path for :func:`v_grid_layer` and :func:`v_matched_layer`, so the matching sees
    the very cosine matrices of the grid's suite). The token-shuffled nulls ΠV̂ are not built:
    their metrics come from V̂'s operands with the tokens permuted
    (:func:`checks.metric_suite.permuted`)."""
    d = info["head_dim"]
    hats = [padded_v_hat(gram, c, d) for c in ("p2", "kpca")]
    v0 = _pad_columns(kpca_values(a0.to(device=k.device, dtype=tdtype), gram.log_g), d)
    return v.to(tdtype), torch.stack([*hats, v0])


def _v_batches(ctx):
    """The grid's batches of one layer: (chunk, heads, k, v, ΠV̂'s permutations, A₀), the
    permutations those of claims/claim_v_layer.py's layer_metrics (the same ΠV̂ as the claim
    test)."""
    info = ctx.info
    n_heads = info["n_heads"]
    gens = [torch.Generator().manual_seed(seed_from(ctx.head_id(h))) for h in range(n_heads)]
    perms = [torch.stack([torch.randperm(int(n), generator=g) for g in gens])
             for n in ctx.token_counts()]
    for chunk, heads, _q, k, v in ctx.groups():
        n = k.shape[-2]
        perm = torch.stack([perms[b][heads] for b in chunk]).to(k.device)
        a0 = random_basis_axes(ctx.head_id, heads, chunk, n, min(n, info["head_dim"]), n_heads)
        yield chunk, heads, k, v, perm, a0


def _directions(ox: dict, oy: dict, gram: KeyGram, perm: torch.Tensor, own: int) -> dict:
    """Method §2.6's direction metrics of V against the run's V̂ (target ``own``: its axis
    convention), with the token-shuffled ΠV̂ and P2's V̂₀ as nulls, from the bases the suite's
    operands made (V's centred basis, the targets' nested directions): {null: metrics}."""
    qx = ox["basis"][0][0]
    q, valid = oy["nested"]
    nested = (q[own], valid[own])
    weights = direction_weights(gram.eigenvalues, qx.shape[-1])
    bar = verdicts.shared_bar()
    return {"token-shuffled": directions_from_bases(qx, nested, shuffled_directions(nested, perm),
                                                    weights, bar),
            "random-basis": directions_from_bases(qx, nested, (q[2], valid[2]), weights, bar)}


def _suite(ox: dict, oy: dict, perm: torch.Tensor, tol: dict) -> dict:
    """The suite's metrics of V's operands ``ox`` against the operands ``oy`` of the three
    targets, [5, b, h] each: V̂ (p2, kpca), ΠV̂ (p2, kpca; V̂'s operands with the tokens
    permuted), V̂₀."""
    each = [{name: (tuple(x[i] for x in op) if isinstance(op, tuple) else op[i])
             for name, op in oy.items()} for i in range(len(TARGETS))]
    parts = [metric_suite.pair_metrics(ox, oy, **tol), *(
        metric_suite.pair_metrics(ox, metric_suite.leading(
            metric_suite.permuted(each[ci], perm)), **tol) for ci in (0, 1))]
    order = [0, 1, 3, 4, 2]  # parts hold [p2, kpca, V̂₀], [Πp2], [Πkpca]
    return {name: torch.cat([part[name] for part in parts])[order] for name in parts[0]}


def v_grid_layer(ctx, combos: list[tuple[bool, str]], v_hat_out: dict | None = None,
                 convention: str = "p2", offer_grams=None) -> tuple[dict, dict]:
    """Claim V's per-(sample, head) metrics of one layer under every (standardise, dtype) of
    ``combos`` × axis convention × null (:data:`NULLS`), with one Gram matrix and one
    eigendecomposition per (standardise, dtype): the axis convention rescales V̂'s columns and
    the null is built from the same V̂ (ΠV̂) or the same G (V̂₀), so neither needs its own.

    No Hungarian matching: the layer carries the optimal cosine's bounds,
    ``optimal_cosine`` = the identity matching (the direct cosine, a lower bound) and
    ``optimal_cosine_hi`` = the mean of the row maxima of the cosine matrix (an upper bound;
    the same for ``_null``), which :func:`claims.multiverse.v_bounded` uses to decide whether
    any verdict depends on the exact value; where one does, :func:`v_matched_layer` gives it.
    P2's-code subset (method §8.3, never judged) is left out.

    ``v_hat_out``: ``offer(batch key, {(std, dtype): V̂})`` (the ``v_hat`` channel: each batch's
    finite V̂ under ``convention`` for the combinations a specification's claim J takes).
    ``offer_grams``: ``offer(batch key, payload)`` (the ``grams`` channel): where both float64
    combinations are in ``combos``, their two Gram matrices (raw and standardised keys, top d
    eigenpairs) with the batch's keys and values, for the specifications whose claim E takes
    its values from this grid.

    Returns ``(metrics, errors)``: ``metrics[combo_key(...)]`` → {name: Tensor [B, H]};
    ``errors[(std, dtype)]`` → why that combination has no numbers (e.g. a non-finite
    intermediate in float32)."""
    info = ctx.info
    d = info["head_dim"]
    tol = verdicts.allclose_tolerance()
    out: dict[str, dict] = {}
    owner: dict[str, tuple] = {}
    errors: dict[tuple, str] = {}
    share_grams = offer_grams is not None and {(False, "float64"), (True, "float64")} <= set(combos)
    for chunk, heads, k, v, perm, a0 in _v_batches(ctx):
        n = k.shape[-2]
        v_side: dict[str, dict] = {}  # V's operands per dtype: the same for every standardisation
        grams64: dict[bool, KeyGram] = {}  # the two float64 Gram matrices (``offer_grams``)
        for std, dtype in combos:
            if (std, dtype) in errors:
                continue
            tdtype = DTYPES[dtype]
            try:
                gram = grid_gram(k, info, std, tdtype)
                if share_grams and dtype == "float64":
                    grams64[std] = gram
                vv, targets = _v_targets(info, gram, k, v, a0, tdtype)
                if dtype not in v_side:
                    check_finite(vv, "x (learned values)")
                    v_side[dtype] = metric_suite.leading(metric_suite.operands(vv))
                for t in targets:
                    check_finite(t, "y (KPCA values)")
                if v_hat_out is not None:  # finite: claim J's V̂ of this combination
                    v_hat_out(ctx.batch_key(chunk, heads),
                              {(std, dtype): targets[TARGETS.index(convention)].clone()})
                ox, oy = v_side[dtype], metric_suite.operands(targets, nested=True)
                suite = _suite(ox, oy, perm, tol)
                dirs = _directions(ox, oy, gram, perm, TARGETS.index(convention))
                cos = cosine_pair(ox["unit"], oy["unit"])  # [3, b, h, n, n]: TARGETS
                common = {"undetermined": gram.undetermined,
                          "mu_d": (gram.eigenvalues[..., d - 1] if d <= n else
                                   torch.zeros(gram.undetermined.shape, dtype=tdtype)),
                          "effective_rows": effective_rows(gram.log_g)}
            except NonFiniteError as exc:
                errors[(std, dtype)] = str(ctx.located(exc, chunk, heads))
                continue
            common["n_tokens"] = torch.full(common["undetermined"].shape, float(n))
            common["few_tokens"] = torch.full(common["undetermined"].shape, n <= d)
            # the mean row maximum bounds the optimal cosine from above; ΠV̂ permutes the
            # columns of V̂'s cosine matrix, which leaves the bound (and the optimum) unchanged
            upper = torch.minimum(cos.amax(-1).mean(-1), cos.amax(-2).mean(-1))  # [3, b, h]
            for ci, conv in enumerate(("p2", "kpca")):
                for null, ti, ui in (("token-shuffled", 2 + ci, ci), ("random-basis", 4, 2)):
                    vals = dict(common)
                    for name, both in suite.items():
                        vals[name] = both[ci].to(torch.float64)
                        vals[f"{name}_null"] = both[ti].to(torch.float64)
                    vals["optimal_cosine"] = suite["direct_cosine"][ci].to(torch.float64)
                    vals["optimal_cosine_hi"] = upper[ci]
                    vals["optimal_cosine_null"] = suite["direct_cosine"][ti].to(torch.float64)
                    vals["optimal_cosine_null_hi"] = upper[ui]
                    vals.update({n: t.to(torch.float64) for n, t in dirs[null].items()})
                    key = combo_key(std, dtype, conv, null)
                    owner[key] = (std, dtype)
                    ctx.fill(out.setdefault(key, {}), chunk, heads, vals)
        if len(grams64) == 2:
            offer_grams(ctx.batch_key(chunk, heads),
                        {"model": ctx.model, "layer": ctx.layer, "info": info, "chunk": chunk,
                         "heads": heads, "k": k, "v": v, "grams": (grams64[False], grams64[True])})
    _grid_twin(ctx, combos, out, owner, errors, convention)
    for key, values in out.items():  # as the claim tests: a non-finite metric has no verdict
        for name, t in values.items():
            if t.dtype != torch.bool and not bool(torch.isfinite(t).all()):
                bad = torch.nonzero(~torch.isfinite(t))[0].tolist()
                errors.setdefault(owner[key], f"claim V: {name} is not finite for model "
                                              f"{ctx.model}, layer {ctx.layer}, head {bad[1]}, "
                                              f"sample {bad[0]}")
    return {k: m for k, m in out.items() if owner[k] not in errors}, errors


def _grid_twin(ctx, combos: list[tuple[bool, str]], out: dict, owner: dict, errors: dict,
               convention: str) -> None:
    """The random-init twin's directions (method §2.6) of every (standardise, dtype) of
    ``combos`` that has numbers, added to each of its combinations in ``out`` as the claim's
    layer does (claims/claim_v_layer.py ``twin_directions``); none without a twin."""
    twin = ctx.init_twin()
    if twin is None:
        return
    for std, dtype in combos:
        keys = [k for k, o in owner.items() if o == (std, dtype) and k in out]
        if (std, dtype) in errors or not keys:
            continue
        if twin.run is ctx.run:  # a random-init model is its own twin
            values = {f"{n}_init_twin": out[keys[0]][n].clone() for n in DIRECTION_NAMES}
        else:
            try:
                values = twin_directions(twin, standardize=std, convention=convention,
                                         dtype=DTYPES[dtype], located=False)
            except NonFiniteError as exc:
                errors[(std, dtype)] = f"the random-init twin: {exc}"
                continue
        for key in keys:  # a copy each: the layer's tensors are saved apart
            out[key].update({n: t.clone() for n, t in values.items()})


def v_matched_layer(ctx, std: bool, dtype: str,
                    heads: list[int] | None = None) -> dict[str, torch.Tensor]:
    """The exact optimal cosine of one layer under (``std``, ``dtype``) for both axis
    conventions, and of its nulls, [B, H] each: ``"<conv>"`` (V against V̂; against ΠV̂ the
    matching ignores token order, so the token-shuffled null's value is the same, method §2.3)
    and ``"random-basis"`` (V against V̂₀, which does not depend on the convention). The cosine
    matrices are those of :func:`v_grid_layer`'s suite (:func:`checks.metric_suite.suite_cosines`
    on the same targets), without its other metrics: only the Hungarian step is added.

    ``heads``: match only these heads (NaN in the other columns); default every head."""
    info = ctx.info
    shape = ctx.shape
    tdtype = DTYPES[dtype]
    out: dict[str, torch.Tensor] = {}
    for chunk, hs, k, v, _perm, a0 in _v_batches(ctx):
        local = list(range(hs.stop - (hs.start or 0)))
        if heads is not None:
            local = [h - (hs.start or 0) for h in heads if h in range(shape[1])[hs]]
            if not local:
                continue
            k, v, a0 = k[:, local], v[:, local], a0[:, local]
        gram = grid_gram(k, info, std, tdtype)
        vv, targets = _v_targets(info, gram, k, v, a0, tdtype)
        cos = metric_suite.suite_cosines(vv, targets)
        for ti, name in enumerate(TARGETS):
            if name not in out:
                out[name] = torch.full(shape, float("nan"), dtype=torch.float64)
            exact = torch.stack([row_similarity.matched_cosine(c) for c in cos[ti]])
            columns = [(hs.start or 0) + h for h in local]
            out[name][torch.tensor(chunk)[:, None], torch.tensor(columns)[None, :]] = \
                exact.to("cpu", torch.float64)
    return out
