"""Claim V (method §2): from per-sample metrics to per-head and per-model verdicts with evidence."""

from __future__ import annotations

import math

import torch

from checks.nulls import tost_pvalues
from checks.stats import (adjust_pvalues, bootstrap_weights, excess_over_null, masked_mean,
                          percentile_interval, seed_from, sign_flip_pvalues)

from . import verdicts
from .names import V_MEASURED
from .names import V_P2_CODE_METRICS as P2_CODE_METRICS
from .records import VRecord

CLAIM = "claim_v"
METRICS = V_MEASURED
#: The metrics tested against their null (method §7.2): the judged subspace overlap, and P2's
#: CKAs for the record. Not the optimal cosine: its matching ignores token order, so against the
#: token-shuffled null V̂ it scores exactly what it scores against V̂ (method §2.3).
CHANCE_METRICS = ("linear_cka", "kernel_cka", "subspace_overlap")


def _undetermined_max_share() -> float:
    return float(verdicts.load_thresholds()[CLAIM]["undetermined"]["max_share"])


def summarize(metrics: dict[str, torch.Tensor], keep: torch.Tensor) -> dict:
    """Means (and std) over the kept entries along dim 0 of every metric and its null; the
    subspace-overlap excess over its null (method §2). ``metrics`` values have shape [M]."""
    n = int(keep.sum())
    out = {"metrics": {}, "null": {}, "std": {}}
    for name in METRICS:
        mean, std = masked_mean(metrics[name].to(torch.float64), keep)
        null_mean, _ = masked_mean(metrics[f"{name}_null"].to(torch.float64), keep)
        out["metrics"][name] = float(mean)
        out["std"][name] = float(std)
        out["null"][name] = float(null_mean)
    out["metrics"]["subspace_overlap_excess"] = float(excess_over_null(
        out["metrics"]["subspace_overlap"], out["null"]["subspace_overlap"]))
    out["null"]["subspace_overlap_excess"] = 0.0
    out["n_used"] = n
    return out


def _undetermined_reason(n_undet: int, n_total: int, few: torch.Tensor | None,
                         n_tokens: torch.Tensor | None) -> str:
    """Why V̂ is undetermined: too few tokens (N ≤ d; P2's code dropped such heads silently) or an
    eigenvalue μ_d at round-off level (method §2)."""
    n_few = 0 if few is None else int(few.sum())
    parts = []
    if n_few:
        span = ""
        if n_tokens is not None:
            lo, hi = int(n_tokens[few].min()), int(n_tokens[few].max())
            span = f", N = {lo}" if lo == hi else f", N = {lo}..{hi}"
        parts.append(f"{n_few} of {n_total} samples have no more tokens than the head dimension "
                     f"(N <= d{span}), so V_hat has fewer than d determined columns")
    if n_undet - n_few:
        parts.append(f"{n_undet - n_few} of {n_total} samples have mu_d <= N*eps*||K_phi||_2")
    return "; ".join(parts) + ": V_hat is not determined by the keys (method §2)"


def interval_stats(metrics: dict[str, torch.Tensor], keep: torch.Tensor, seed: int,
                   per_unit: bool = False) -> dict | list[dict]:
    """95% percentile-bootstrap CIs over samples (method §7) of every metric's mean and its
    null's, and of the subspace-overlap excess (from the same resamples of overlap and null).

    ``metrics[name]`` and ``keep`` are [S, U]: S samples, U units per sample (the selected
    (layer, head) pairs of a model). Pooled (default): one interval set for the mean over all
    kept units, a resample drawing whole samples so each sample's heads stay together (model
    level). ``per_unit``: one interval set per unit (head level), all units sharing the resamples
    of ``seed``, so that the whole model costs one [R, S] × [S, units × metrics] product and a
    head's interval does not depend on which other heads are selected."""
    settings = verdicts.rule_set_settings()
    level = float(settings["confidence"])
    names = [n for name in METRICS for n in (name, f"{name}_null")]
    k = keep.to(torch.float64)  # [S, U]
    values = torch.stack([metrics[n].to(torch.float64) for n in names], dim=-1)  # [S, U, M]
    weights = bootstrap_weights(k.shape[0], seed, int(settings["bootstrap_resamples"]))  # [R, S]
    if per_unit:
        sums = (weights @ (values * k.unsqueeze(-1)).reshape(k.shape[0], -1)).reshape(
            weights.shape[0], *values.shape[1:])  # [R, U, M]
        counts = (weights @ k).unsqueeze(-1)  # [R, U, 1]
    else:
        sums = (weights @ (values * k.unsqueeze(-1)).sum(1)).unsqueeze(1)  # [R, 1, M]
        counts = (weights @ k.sum(1, keepdim=True)).unsqueeze(-1)  # [R, 1, 1]
    draws = torch.where(counts > 0, sums / counts.clamp_min(1), torch.full_like(sums, float("nan")))
    ov, ov_null = draws[..., names.index("subspace_overlap")], draws[..., names.index("subspace_overlap_null")]
    draws = torch.cat([draws, excess_over_null(ov, ov_null).unsqueeze(-1)], dim=-1)
    ci = percentile_interval(draws, level, n=int(k.shape[0])).tolist()  # [U, M + 1, 2]
    out = []
    for unit in ci:
        by_name = dict(zip([*names, "subspace_overlap_excess"], unit))
        out.append({"ci": {n: by_name[n] for n in (*METRICS, "subspace_overlap_excess")},
                    "ci_null": {n: by_name[f"{n}_null"] for n in METRICS}})
    return out if per_unit else out[0]


def chance_pvalues(metrics: dict[str, torch.Tensor], keep: torch.Tensor, seed: int,
                   equivalence: bool = False) -> torch.Tensor:
    """One-sided sign-flip p-values (method §7, :func:`checks.stats.sign_flip_pvalues`) of
    metric − null over samples, [U, len(CHANCE_METRICS)], for ``metrics`` [S, U] (each unit's
    kept samples). ``equivalence``: the p-values of the equivalence test "at chance" instead
    (TOST with the margins of ``[claim_v.ours.chance_margin]``, :func:`checks.nulls.tost_pvalues`;
    a metric without a margin gets p = 1)."""
    settings = verdicts.rule_set_settings()
    diffs = torch.stack([metrics[m].to(torch.float64) - metrics[f"{m}_null"].to(torch.float64)
                         for m in CHANCE_METRICS], dim=-1)  # [S, U, M]
    s, u, m = diffs.shape
    mask = keep.unsqueeze(-1).expand(s, u, m).reshape(s, u * m)
    resamples = int(settings["permutation_resamples"])
    if not equivalence:
        p = sign_flip_pvalues(diffs.reshape(s, u * m), mask, seed, resamples)
        return p.reshape(u, m)
    margins = verdicts.chance_margins(CLAIM)
    margin = torch.tensor([margins.get(name, math.nan) for name in CHANCE_METRICS],
                          dtype=torch.float64)
    p = tost_pvalues(diffs.reshape(s, u * m), mask, margin.repeat(u), seed, resamples)
    return torch.where(torch.isnan(margin).repeat(u), torch.ones_like(p), p).reshape(u, m)


def smallest_p(n_kept: int) -> float:
    """The smallest p-value the sign-flip test can give with ``n_kept`` samples: 2**−n when
    exact, 1/(R + 1) when Monte Carlo (method §7)."""
    from checks.stats import EXACT_SIGN_FLIP_MAX_N

    if n_kept <= EXACT_SIGN_FLIP_MAX_N:
        return 2.0 ** -int(n_kept)
    return 1.0 / (int(verdicts.rule_set_settings()["permutation_resamples"]) + 1.0)


def vs_null_record(p: torch.Tensor, p_adjusted: torch.Tensor, n_kept: int,
                   tost: torch.Tensor | None = None,
                   tost_adjusted: torch.Tensor | None = None) -> dict:
    """``{metric: {"p", "p_adjusted", "above_chance", "can_reject", "tost_p",
    "tost_p_adjusted", "at_chance", "margin"}}`` from p-values [len(CHANCE_METRICS)] of the
    test against chance and (optional) of the equivalence test (method §7.2). ``can_reject``
    is False when even the most extreme data could not reach p < alpha with ``n_kept`` samples
    (e.g. 2**−4 = 0.0625 with 4): then neither "above chance" nor "at chance" can be shown.
    "Not above chance" is never read as "at chance": only the equivalence test says that."""
    alpha = float(verdicts.rule_set_settings()["alpha"])
    can = smallest_p(n_kept) < alpha
    margins = verdicts.chance_margins(CLAIM)
    out = {}
    for i, m in enumerate(CHANCE_METRICS):
        entry = {"p": float(p[i]), "p_adjusted": float(p_adjusted[i]),
                 "above_chance": bool(float(p_adjusted[i]) < alpha), "can_reject": can}
        if tost is not None:
            adj = tost if tost_adjusted is None else tost_adjusted
            entry.update({"tost_p": float(tost[i]), "tost_p_adjusted": float(adj[i]),
                          "at_chance": bool(can and float(adj[i]) < alpha),
                          "margin": margins.get(m)})
        out[m] = entry
    return out


def _keep_mask(undetermined: torch.Tensor) -> tuple[torch.Tensor, bool]:
    keep = ~undetermined
    n_total = int(keep.numel())
    judged = n_total > 0 and int(keep.sum()) > 0 and \
        (n_total - int(keep.sum())) / n_total <= _undetermined_max_share()
    return (keep if judged else torch.ones_like(keep)), judged


_CHANCE_CACHE: dict[tuple, tuple[tuple, dict]] = {}


def head_seed(model: str) -> int:
    """The seed of the head-level bootstrap resamples of a model's claim-V records."""
    return seed_from(f"V-{model}-heads")


def head_statistics(model: str, per_layer: dict[int, dict[str, torch.Tensor]],
                    heads: list[int]) -> dict[tuple[int, int], dict]:
    """Per selected (layer, head) of a model: ``vs_null`` (the test against chance, BH-adjusted,
    or as ``[rule_sets.ours].correction`` says, across those heads, per metric) and ``ci`` /
    ``ci_null`` (bootstrap intervals, all heads in one pass) (method §7).

    All units share one sign matrix seeded from the model name, so a head's raw p-value does not
    depend on which heads are selected; the adjusted one depends on the selection (the family).
    Memoised per (model, selection, layer tensors): every head test of a model reuses one pass."""
    layers = sorted(per_layer)
    refs = tuple(per_layer[l] for l in layers)
    key = (model, tuple(layers), tuple(heads), tuple(map(id, refs)),
           tuple(sorted(verdicts.rule_set_settings().items())))
    hit = _CHANCE_CACHE.get(key)
    if hit is not None and all(a is b for a, b in zip(hit[0], refs)):  # ids are reused after GC
        return hit[1]
    metrics = {n: torch.cat([per_layer[l][n][:, heads] for l in layers], dim=1)
               for name in CHANCE_METRICS for n in (name, f"{name}_null")}
    undet = torch.cat([per_layer[l]["undetermined"][:, heads] for l in layers], dim=1)
    keep = torch.stack([_keep_mask(undet[:, u])[0] for u in range(undet.shape[1])], dim=1)
    p = chance_pvalues(metrics, keep, seed_from(f"{model}-V-vs-null"))  # [U, M]
    correction = verdicts.rule_set_settings()["correction"]
    adjusted = adjust_pvalues(p.T, correction).T
    tost = chance_pvalues(metrics, keep, seed_from(f"{model}-V-at-chance"), equivalence=True)
    tost_adjusted = adjust_pvalues(tost.T, correction).T
    units = [(l, h) for l in layers for h in heads]
    n_kept = keep.sum(0)
    result = {unit: {"vs_null": vs_null_record(p[i], adjusted[i], int(n_kept[i]), tost[i],
                                               tost_adjusted[i])}
              for i, unit in enumerate(units)}
    all_metrics = {n: torch.cat([per_layer[l][n][:, heads] for l in layers], dim=1)
                   for name in METRICS for n in (name, f"{name}_null")}
    for unit, stats in zip(units, interval_stats(all_metrics, keep, head_seed(model), per_unit=True)):
        result[unit].update(stats)
    if len(_CHANCE_CACHE) > 64:
        _CHANCE_CACHE.clear()
    _CHANCE_CACHE[key] = (refs, result)  # holds the layer dicts, so their ids stay theirs
    return result


def degenerate_bar() -> float:
    """``[claim_v.degenerate] max_effective_rows`` (method §2.2)."""
    return float(verdicts.load_thresholds()[CLAIM]["degenerate"]["max_effective_rows"])


def degeneracy(effective_rows: torch.Tensor | None, keep: torch.Tensor) -> tuple[float | None, bool]:
    """(median effective rows of G over the kept samples, whether the unit is degenerate:
    that median ≤ ``[claim_v.degenerate] max_effective_rows``, method §2.2)."""
    if effective_rows is None:
        return None, False
    rows = effective_rows.reshape(-1).to(torch.float64)
    kept = rows[keep.reshape(-1)] if bool(keep.any()) else rows
    median = float(kept.median())
    return median, median <= degenerate_bar()


def decide(metrics: dict[str, torch.Tensor], undetermined: torch.Tensor,
           few_tokens: torch.Tensor | None = None, n_tokens: torch.Tensor | None = None,
           seed: int = 0, vs_null: dict | None = None, rules: str = "ours",
           intervals: dict | None = None, effective_rows: torch.Tensor | None = None) -> dict:
    """The verdict for one unit (a head over its samples, or a model over its heads and samples).

    ``metrics[name]``, ``undetermined`` and the optional ``few_tokens`` (N ≤ d) and ``n_tokens``
    are tensors [S] (a head: one value per sample) or [S, U] (a model: U (layer, head) units per
    sample). ``seed`` seeds the bootstrap; ``vs_null`` is the head's test against chance (for a
    model, None: the test over samples of the per-sample mean difference is run here).
    ``rules`` picks the rule set whose verdict is ``"verdict"``; both are in ``"verdicts"``.
    ``intervals``: precomputed ``{"ci", "ci_null"}`` (:func:`head_statistics`); else computed
    here from ``seed``.
    """
    s = undetermined.shape[0] if undetermined.ndim else 1
    grid = {name: t.reshape(s, -1) for name, t in metrics.items()}
    undet2 = undetermined.reshape(s, -1)
    keep = ~undetermined.reshape(-1)
    flat = {name: t.reshape(-1) for name, t in grid.items()}
    n_total = int(keep.numel())
    n_undet = n_total - int(keep.sum())
    share = n_undet / max(n_total, 1)
    few = None if few_tokens is None else few_tokens.reshape(-1).bool() & ~keep
    lengths = None if n_tokens is None else n_tokens.reshape(-1)
    if n_total == 0 or share > _undetermined_max_share() or int(keep.sum()) == 0:
        summary = summarize(flat, torch.ones_like(keep))  # recorded, flagged, not judged
        stats = intervals or (interval_stats(grid, torch.ones_like(undet2), seed) if n_total else {})
        return {"verdict": verdicts.UNDETERMINED, **summary, **stats,
                "verdicts": {r: verdicts.UNDETERMINED for r in verdicts.RULE_SETS}, "rules": rules,
                **({"vs_null": vs_null} if vs_null else {}),
                "n_samples": n_total,
                "n_undetermined": n_undet, "n_few_tokens": 0 if few is None else int(few.sum()),
                "reason": _undetermined_reason(n_undet, n_total, few, lengths)}
    summary = summarize(flat, keep)
    keep2 = ~undet2
    stats = intervals or interval_stats(grid, keep2, seed)
    n_eff, degenerate = degeneracy(effective_rows, keep)
    if degenerate:  # method §2.2: V_hat is about one token's row; counted apart, never judged
        return {"verdict": verdicts.UNDETERMINED, **summary, **stats,
                "verdicts": {r: verdicts.UNDETERMINED for r in verdicts.RULE_SETS}, "rules": rules,
                **({"vs_null": vs_null} if vs_null else {}), "n_samples": n_total,
                "n_undetermined": n_undet, "effective_rows": n_eff, "degenerate": True,
                "reason": (f"degenerate: V_hat is carried by about one token (median effective "
                           f"number of rows of G, 1/sum w^2 with w the normalised 1/g^2 weights, "
                           f"{n_eff:.3g} <= {degenerate_bar():g}; method §2.2)")}
    if vs_null is None:  # model level: one test over samples of the per-sample mean difference
        k = keep2.to(torch.float64)
        count = k.sum(1, keepdim=True)
        per_sample = {n: ((grid[n].to(torch.float64) * k).sum(1, keepdim=True) / count.clamp_min(1))
                      for name in CHANCE_METRICS for n in (name, f"{name}_null")}
        p = chance_pvalues(per_sample, count > 0, seed)[0]
        tost = chance_pvalues(per_sample, count > 0, seed, equivalence=True)[0]
        vs_null = vs_null_record(p, p, int((count > 0).sum()), tost, tost)
    above = ({m: t["above_chance"] for m, t in vs_null.items()}
             if all(t.get("can_reject", True) for t in vs_null.values()) else None)
    at = {m: bool(t.get("at_chance")) for m, t in vs_null.items()}
    v, both = verdicts.judge_both(CLAIM, summary["metrics"], stats["ci"], above, rules,
                                  at_chance=at)
    return {"verdict": v.verdict, "verdicts": both, "rules": rules, **summary, **stats,
            "vs_null": vs_null, "n_samples": n_total, "n_undetermined": n_undet,
            **({"effective_rows": n_eff} if n_eff is not None else {}),
            "evidence": verdicts.format_evidence(
                v, summary["null"],
                extra={k: summary["metrics"][k] for k in ("subspace_overlap", "direct_cosine",
                                                         "pearson", "relative_frobenius",
                                                         "allclose")},
                ci=stats["ci"], vs_null=vs_null, both=both) + _p2_evidence(summary, rules)}


def _p2_evidence(summary: dict, rules: str) -> str:
    """Under ``ours``, P2's rules on P2's metrics (the ``p2`` rule set, on the means) after the
    chosen verdict's evidence, so a reader sees both (method §7.3)."""
    if rules == "p2":
        return ""
    p2 = verdicts.judge(CLAIM, summary["metrics"])
    return ("\n  P2's rules on P2's metrics (rule set p2, means):\n"
            + verdicts.format_evidence(p2, summary["null"]))


def p2_code_summary(layer_metrics: dict[str, torch.Tensor], head: int | None,
                    keep: torch.Tensor) -> dict | None:
    """The record fields of claim V's sign-dependent metrics computed with P2's code conventions
    (method §8.3; ``p2code_<metric>`` tensors of the layer, NaN for samples outside the seeded
    subset :func:`checks.p2_code.p2_code_subset`): ``p2_code`` (their means over the kept samples
    of the subset) and, when the subset leaves kept samples out, ``p2_code_units`` (how many
    (sample) units those means are over) and ``p2_code_exact`` (the exact metrics' means over the
    same units, for a paired comparison). None when the layer has none. Never judged."""
    if f"p2code_{P2_CODE_METRICS[0]}" not in layer_metrics:
        return None

    def pick(name: str) -> torch.Tensor:
        t = layer_metrics[name]
        return (t[:, head] if head is not None else t).to(torch.float64).reshape(-1)

    kept = keep.reshape(-1)
    computed = kept & torch.isfinite(pick(f"p2code_{P2_CODE_METRICS[0]}"))

    def mean(name: str) -> float:
        return float(masked_mean(torch.where(computed, pick(name), 0.0), computed)[0])

    out = {"p2_code": {name: mean(f"p2code_{name}") for name in P2_CODE_METRICS}}
    if int(computed.sum()) < int(kept.sum()) and all(n in layer_metrics for n in P2_CODE_METRICS):
        # a subset: say how many units, and give the exact means over the same units
        out["p2_code_units"] = int(computed.sum())
        out["p2_code_exact"] = {name: mean(name) for name in P2_CODE_METRICS}
    return out


_NOT_METRICS = ("undetermined", "mu_d", "threshold", "few_tokens", "n_tokens", "effective_rows")


def head_record(model: str, layer: int, head: int, layer_metrics: dict[str, torch.Tensor],
                statistics: dict | None = None, rules: str = "ours") -> VRecord:
    """The record of one head. ``statistics``: its entry of :func:`head_statistics` (the test
    against chance adjusted across the model's selected heads, and the intervals); without it
    the head is tested alone (no adjustment), with the same bootstrap resamples."""
    per_head = {name: t[:, head] for name, t in layer_metrics.items()
                if name not in _NOT_METRICS and not name.startswith("p2code_")}
    extra = {name: layer_metrics[name][:, head] for name in ("few_tokens", "n_tokens")
             if name in layer_metrics}
    undet = layer_metrics["undetermined"][:, head]
    if statistics is None:
        keep, _ = _keep_mask(undet)
        grid = {n: per_head[n].unsqueeze(1) for m in METRICS for n in (m, f"{m}_null")}
        p = chance_pvalues(grid, keep.unsqueeze(1), seed_from(f"{model}-V-vs-null"))[0]
        tost = chance_pvalues(grid, keep.unsqueeze(1), seed_from(f"{model}-V-at-chance"),
                              equivalence=True)[0]
        statistics = {"vs_null": vs_null_record(p, p, int(keep.sum()), tost, tost),
                      **interval_stats(grid, keep.unsqueeze(1), head_seed(model), per_unit=True)[0]}
    intervals = {k: statistics[k] for k in ("ci", "ci_null")}
    eff = layer_metrics["effective_rows"][:, head] if "effective_rows" in layer_metrics else None
    result = decide(per_head, undet, **extra, vs_null=statistics["vs_null"], rules=rules,
                    intervals=intervals, effective_rows=eff)
    result["mu_d_min"] = float(layer_metrics["mu_d"][:, head].min())
    result.update(p2_code_summary(layer_metrics, head, _keep_mask(undet)[0]) or {})
    return VRecord(claim="V", level="head", model=model, layer=layer, head=head, **result)


def model_record(model: str, per_layer: dict[int, dict[str, torch.Tensor]],
                 heads: list[int], head_verdicts: dict[str, int], rules: str = "ours",
                 head_verdicts_by_rules: dict[str, dict[str, int]] | None = None) -> VRecord:
    """P2's aggregation: the rule applied to the model average over (layer, head, sample); the
    CI resamples samples with all their (layer, head) units together."""
    names = [n for n in next(iter(per_layer.values()))
             if n not in ("mu_d", "threshold", "effective_rows") and not n.startswith("p2code_")]
    stacked = {n: torch.cat([m[n][:, heads] for m in per_layer.values()], dim=1) for n in names}
    undetermined = stacked.pop("undetermined")
    extra = {n: stacked.pop(n) for n in ("few_tokens", "n_tokens") if n in stacked}
    result = decide(stacked, undetermined, **extra, seed=seed_from(f"V-{model}-model"), rules=rules)
    keep = _keep_mask(undetermined.reshape(-1))[0]
    p2 = {f"p2code_{n}": torch.cat([m[f"p2code_{n}"][:, heads] for m in per_layer.values()], dim=1)
          for n in P2_CODE_METRICS if all(f"p2code_{n}" in m for m in per_layer.values())}
    if len(p2) == len(P2_CODE_METRICS):
        exact = {n: stacked[n] for n in P2_CODE_METRICS if n in stacked}
        result.update(p2_code_summary({**p2, **exact}, None, keep) or {})
    return VRecord(claim="V", level="model", model=model, layers=sorted(per_layer), heads=heads,
                   head_verdicts=head_verdicts,
                   head_verdicts_by_rules=head_verdicts_by_rules or None, **result)


def message(record: VRecord, what: str) -> str:
    """The failure/skip message of a claim-V test: verdict, each metric, threshold, source, null."""
    unit = "samples" if record.level == "head" else "(layer, head, sample) units"
    head = (f"claim V {record.verdict} for {what} "
            f"(mean over {record.n_used} of {record.n_samples} {unit}; "
            f"{record.n_undetermined} undetermined)")
    if record.verdict == verdicts.UNDETERMINED:
        return f"{head}: {record.reason}"
    return f"{head}\n{record.evidence}"

# ------------------------------------------------------------------ per-layer computation
# Called by the session through the claim's spec (claims/builtin.py): ``layer_metrics(ctx)`` with
# a fixtures.model_run.LayerContext; the session caches the result, checks it is finite and
# reports progress. Moved from fixtures/session.py (ModelRun._compute_claim_v, _p2_code).
def cache_settings() -> dict:
    """Settings the cached claim-V metrics depend on beyond the run options: the allclose
    tolerances of ``[claim_v.allclose]`` (method §2.1)."""
    return {"allclose": verdicts.allclose_tolerance()}


def layer_metrics(ctx) -> dict[str, torch.Tensor]:
    """Claim-V metrics of every (sample, head) of one layer: tensors of shape [B, H]."""
    from concurrent.futures import Future, ThreadPoolExecutor

    from checks.errors import NonFiniteError
    from checks.p2_code import p2_code_subset, scatter_rows
    from checks.row_similarity import matched_cosine
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
        optimal = torch.stack([f.result() for f in against_v_hat])
        ctx.fill(out, done_chunk, done_heads, {
            "optimal_cosine": optimal,
            # the optimal matching ignores token order: against ΠV̂ it is the same (method §2.3)
            "optimal_cosine_null": optimal.clone(),
            "p2code_optimal_cosine": scatter_rows([f.result() for f in p2code], rows,
                                                  *optimal.shape)})

    try:
        for chunk, heads, _q, k, v in ctx.groups():
            perm = torch.stack([nulls[b][heads] for b in chunk]).to(k.device)
            try:
                m = value_vector_metrics_batched(
                    k, v, scale=info["scale"], standardize=ctx.options.standardize,
                    convention=ctx.options.convention, null_perm=perm,
                    dtype=ctx.options.torch_dtype, defer_matching=True,
                    **verdicts.allclose_tolerance())
            except NonFiniteError as exc:
                raise ctx.located(exc, chunk, heads) from exc
            cos = m.pop("cosine_matrices")
            rows = [i for i, b in enumerate(chunk) if p2_samples[b]]
            p2code = _p2_code(k, v, info, ctx.options, m, rows)  # method §8.3: never judged
            pending.append((chunk, heads,  # one task per sample and target: [H, N, N] each
                            [pool.submit(matched_cosine, c) for c in cos[0]],
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
    return out


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
