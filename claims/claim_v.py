"""Claim V (method §2): from per-sample metrics to per-head and per-model verdicts with evidence."""

from __future__ import annotations

import torch

from checks.stats import excess_over_null, masked_mean, seed_from

from . import claim_v_partial as partial, round_off_widths as round_off, verdicts
from .chance import adjusted, chance_settings
from .names import V_MEASURED
from .names import V_P2_CODE_METRICS as P2_CODE_METRICS
from .records import VRecord, finite_or_none, head_sample_rows
from .claim_v_p2code import p2_code_evidence as _p2_evidence, p2_code_summary
from .claim_v_chance import (SECTION, CHANCE_METRICS, chance_pvalues, equivalence_margins,
                           interval_stats, vs_null_record)
METRICS = V_MEASURED


def _undetermined_max_share() -> float:
    return float(verdicts.load_thresholds()[SECTION]["undetermined"]["max_share"])


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


def _keep_mask(undetermined: torch.Tensor) -> tuple[torch.Tensor, bool]:
    keep = ~undetermined
    n_total = int(keep.numel())
    judged = n_total > 0 and int(keep.sum()) > 0 and \
        (n_total - int(keep.sum())) / n_total <= _undetermined_max_share()
    return (keep if judged else torch.ones_like(keep)), judged


def head_seed(model: str) -> int:
    """The seed of the head-level bootstrap resamples of a model's claim-V records."""
    return seed_from(f"V-{model}-heads")


def head_statistics(model: str, per_layer: dict[int, dict[str, torch.Tensor]],
                    heads: list[int], cache: dict | None = None) -> dict[tuple[int, int], dict]:
    """Per selected (layer, head) of a model: ``vs_null`` (the test against chance, BH-adjusted,
    or as ``[rule_sets.ours].correction`` says, across those heads, per metric) and ``ci`` /
    ``ci_null`` (bootstrap intervals, all heads in one pass) (method §7).

    All units share one sign matrix seeded from the model name, so a head's raw p-value does not
    depend on which heads are selected; the adjusted one depends on the selection (the family).
    ``cache``: a dict owned by the caller whose ``per_layer`` tensors are fixed (a model run's
    ``statistics``), where the result is kept under (model, selection, rule-set settings), so
    that every head test of a model reuses one pass; None: computed afresh. With the random-init
    twin's values in ``per_layer``, also ``vs_init_twin`` (method §2.6)."""
    layers = sorted(per_layer)
    key = ("V-head-statistics", model, tuple(layers), tuple(heads), chance_settings())
    if cache is not None and key in cache:
        return cache[key]
    metrics = {n: torch.cat([per_layer[l][n][:, heads] for l in layers], dim=1)
               for name in CHANCE_METRICS for n in (name, f"{name}_null")}
    undet = torch.cat([per_layer[l]["undetermined"][:, heads] for l in layers], dim=1)
    keep = torch.stack([_keep_mask(undet[:, u])[0] for u in range(undet.shape[1])], dim=1)
    p = chance_pvalues(metrics, keep, seed_from(f"{model}-V-vs-null"))  # [U, M]
    p_adjusted = adjusted(p.T).T
    tost = chance_pvalues(metrics, keep, seed_from(f"{model}-V-at-chance"), equivalence=True)
    tost_adjusted = adjusted(tost.T).T
    units = [(l, h) for l in layers for h in heads]
    n_kept = keep.sum(0)
    margins = equivalence_margins(metrics, keep)
    result = {unit: {"vs_null": vs_null_record(p[i], p_adjusted[i], int(n_kept[i]), tost[i],
                                               tost_adjusted[i], margins[i])}
              for i, unit in enumerate(units)}
    all_metrics = {n: torch.cat([per_layer[l][n][:, heads] for l in layers], dim=1)
                   for name in METRICS for n in (name, f"{name}_null")}
    for unit, stats in zip(units, interval_stats(all_metrics, keep, head_seed(model), per_unit=True)):
        result[unit].update(stats)
    if all(partial.has_twin(per_layer[l]) for l in layers):
        stacked = {n: torch.cat([per_layer[l][n][:, heads] for l in layers], dim=1)
                   for n in (partial.JUDGED, f"{partial.JUDGED}{partial.TWIN}")}
        for unit, test in zip(units, partial.head_tests(stacked, keep,
                                                        seed_from(f"{model}-V-vs-init-twin"))):
            result[unit]["vs_init_twin"] = test
    if cache is not None:
        cache[key] = result
    return result


def degenerate_bar() -> float:
    """``[claim_v.degenerate] max_effective_rows`` (method §2.2)."""
    return float(verdicts.load_thresholds()[SECTION]["degenerate"]["max_effective_rows"])


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
           intervals: dict | None = None, effective_rows: torch.Tensor | None = None,
           vs_twin: dict | None = None) -> dict:
    """The verdict for one unit (a head over its samples, or a model over its heads and samples).

    ``metrics[name]``, ``undetermined`` and the optional ``few_tokens`` (N ≤ d) and ``n_tokens``
    are tensors [S] (a head: one value per sample) or [S, U] (a model: U (layer, head) units per
    sample). ``seed`` seeds the bootstrap; ``vs_null`` is the head's test against chance (for a
    model, None: the test over samples of the per-sample mean difference is run here).
    ``rules`` picks the rule set whose verdict is ``"verdict"``; both are in ``"verdicts"``.
    ``intervals``: precomputed ``{"ci", "ci_null"}`` (:func:`head_statistics`); else computed
    here from ``seed``. ``vs_twin``: the head's test against the random-init twin
    (:func:`claims.claim_v_partial.head_tests`; a model: run here), for the tier "partial".
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
        vs_null = vs_null_record(p, p, int((count > 0).sum()), tost, tost,
                                 equivalence_margins(per_sample, count > 0)[0])
        if vs_twin is None:  # and its test against the random-init twin likewise (§2.6)
            vs_twin = partial.model_test(grid, keep2, seed_from(f"{seed}-V-vs-init-twin"))
    above = ({m: t["above_chance"] for m, t in vs_null.items()}
             if all(t.get("can_reject", True) for t in vs_null.values()) else None)
    at = {m: bool(t.get("at_chance")) for m, t in vs_null.items()}
    v, both = verdicts.judge_both(SECTION, summary["metrics"], stats["ci"], above, rules,
                                  at_chance=at)
    both["ours"], tier = partial.apply(both["ours"], vs_null, vs_twin)
    if rules == "ours" and both["ours"] != v.verdict:
        v.verdict = both["ours"]
    if tier:
        v.reason = f"{v.reason}; {tier}" if v.reason else tier
    twin_means = partial.summary(flat, keep)
    return {"verdict": v.verdict, "verdicts": both, "rules": rules, **summary, **stats,
            "vs_null": vs_null, "n_samples": n_total, "n_undetermined": n_undet,
            **({"init_twin": {**twin_means, **(vs_twin or {})}} if twin_means else {}),
            **({"effective_rows": n_eff} if n_eff is not None else {}),
            "evidence": verdicts.format_evidence(
                v, summary["null"],
                extra={k: summary["metrics"][k] for k in (
                    "subspace_overlap", "top_weighted_share", "shared_directions",
                    "direct_cosine", "pearson", "relative_frobenius", "allclose")},
                ci=stats["ci"], vs_null=vs_null, both=both)
            + partial.evidence(twin_means, vs_twin) + _p2_evidence(summary, rules)}


_NOT_METRICS = ("undetermined", "mu_d", "threshold", "few_tokens", "n_tokens", "effective_rows")


def head_record(model: str, layer: int, head: int, layer_metrics: dict[str, torch.Tensor],
                statistics: dict | None = None, rules: str = "ours") -> VRecord:
    """The record of one head. ``statistics``: its entry of :func:`head_statistics` (the test
    against chance adjusted across the model's selected heads, and the intervals); without it
    the head is tested alone (no adjustment), with the same bootstrap resamples."""
    per_head = {name: t[:, head] for name, t in layer_metrics.items()
                if name not in _NOT_METRICS and not name.startswith("p2code_")
                and not round_off.is_twin(name)}
    extra = {name: layer_metrics[name][:, head] for name in ("few_tokens", "n_tokens")
             if name in layer_metrics}
    undet = layer_metrics["undetermined"][:, head]
    if statistics is None:
        keep, _ = _keep_mask(undet)
        grid = {n: per_head[n].unsqueeze(1) for m in METRICS for n in (m, f"{m}_null")}
        p = chance_pvalues(grid, keep.unsqueeze(1), seed_from(f"{model}-V-vs-null"))[0]
        tost = chance_pvalues(grid, keep.unsqueeze(1), seed_from(f"{model}-V-at-chance"),
                              equivalence=True)[0]
        statistics = {"vs_null": vs_null_record(p, p, int(keep.sum()), tost, tost,
                                                equivalence_margins(grid, keep.unsqueeze(1))[0]),
                      **interval_stats(grid, keep.unsqueeze(1), head_seed(model), per_unit=True)[0]}
        if partial.has_twin(per_head):
            statistics["vs_init_twin"] = partial.head_tests(
                {n: t.unsqueeze(1) for n, t in per_head.items()}, keep.unsqueeze(1),
                seed_from(f"{model}-V-vs-init-twin"))[0]
    intervals = {k: statistics[k] for k in ("ci", "ci_null")}
    eff = layer_metrics["effective_rows"][:, head] if "effective_rows" in layer_metrics else None
    result = decide(per_head, undet, **extra, vs_null=statistics["vs_null"], rules=rules,
                    intervals=intervals, effective_rows=eff,
                    vs_twin=statistics.get("vs_init_twin"))
    result["mu_d_min"] = float(layer_metrics["mu_d"][:, head].min())
    result.update(p2_code_summary(layer_metrics, head, _keep_mask(undet)[0]) or {})
    return VRecord(claim="V", level="head", model=model, layer=layer, head=head, **result)


def model_record(model: str, per_layer: dict[int, dict[str, torch.Tensor]],
                 heads: list[int], head_verdicts: dict[str, int], rules: str = "ours",
                 head_verdicts_by_rules: dict[str, dict[str, int]] | None = None) -> VRecord:
    """P2's aggregation: the rule applied to the model average over (layer, head, sample); the
    CI resamples samples with all their (layer, head) units together."""
    names = [n for n in next(iter(per_layer.values()))
             if n not in ("mu_d", "threshold", "effective_rows") and not n.startswith("p2code_")
             and not round_off.is_twin(n)]
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


def head_records(model: str, per_layer: dict[int, dict[str, torch.Tensor]], heads: list[int],
                 rules: str = "ours", cache: dict | None = None) -> dict[tuple[int, int], VRecord]:
    """The record of every selected (layer, head) of a model, tested against chance and
    adjusted across them (:func:`head_statistics`, kept in ``cache``)."""
    stats = head_statistics(model, per_layer, heads, cache)
    return {(layer, head): head_record(model, layer, head, per_layer[layer],
                                       statistics=stats[(layer, head)], rules=rules)
            for layer in sorted(per_layer) for head in heads}


def verdict_counts(records) -> tuple[dict[str, int], dict[str, dict[str, int]]]:
    """How many of ``records`` got each verdict (in order of first appearance), overall and per
    rule set: the model record's ``head_verdicts`` and ``head_verdicts_by_rules``."""
    overall: dict[str, int] = {}
    by_rules: dict[str, dict[str, int]] = {}
    for rec in records:
        overall[rec["verdict"]] = overall.get(rec["verdict"], 0) + 1
        for rule_set, verdict in rec["verdicts"].items():
            counts = by_rules.setdefault(rule_set, {})
            counts[verdict] = counts.get(verdict, 0) + 1
    return overall, by_rules


def model_over_heads(model: str, per_layer: dict[int, dict[str, torch.Tensor]], heads: list[int],
                     rules: str = "ours", cache: dict | None = None
                     ) -> tuple[VRecord, dict[tuple[int, int], VRecord]]:
    """The model record with its head verdicts counted, and the head records it counts."""
    heads_of = head_records(model, per_layer, heads, rules, cache)
    counts, by_rules = verdict_counts(heads_of.values())
    record = model_record(model, per_layer, heads, counts, rules=rules,
                          head_verdicts_by_rules=by_rules)
    return record, heads_of


def record_for_head(run, model: str, layer: int, head: int, layers: list[int],
                    heads: list[int]) -> VRecord:
    """A head test's record from its model run (``run.layer_metrics``, ``run.options.rules``,
    ``run.statistics``): tested against chance across the selected ``layers`` × ``heads``, whose
    statistics the run keeps, so the model's head tests share one pass (method §7)."""
    per_layer = {l: run.layer_metrics("V", l) for l in layers}

    def build(layers_: dict, cache: dict | None) -> VRecord:
        stats = head_statistics(model, layers_, heads, cache)
        return head_record(model, layer, head, layers_[layer], statistics=stats.get((layer, head)),
                           rules=run.options.rules)
    twins = round_off.twin_layers(per_layer)  # method §13.2: the record's round-off widths
    return _named_twin(run, round_off.attach(build(per_layer, run.statistics), twins and build(
        twins, round_off.twin_cache(run.statistics))))


def _named_twin(run, record: VRecord) -> VRecord:
    """The record with its random-init twin named (``init_twin.twin``, method §2.6), as the run's
    info names it."""
    name = run.prepare().get("init_twin") if record.init_twin else None
    if name:
        record.init_twin = {"twin": name, **record.init_twin}
    return record


def record_for_model(run, model: str, layers: list[int], heads: list[int]) -> VRecord:
    """A model test's record from its model run: P2's aggregation over ``layers`` × ``heads``."""
    per_layer = {l: run.layer_metrics("V", l) for l in layers}
    record = model_over_heads(model, per_layer, heads, run.options.rules, run.statistics)[0]
    twins = round_off.twin_layers(per_layer)  # method §13.2: the record's round-off widths
    return _named_twin(run, round_off.attach(record, twins and model_over_heads(
        model, twins, heads, run.options.rules, round_off.twin_cache(run.statistics))[0]))


def model_message(record: VRecord) -> str:
    """The failure/skip message of a model test: :func:`message` naming the aggregation."""
    return message(record, f"model {record.model} (P2's aggregation over {len(record.layers)} "
                           f"layers x {len(record.heads)} heads x samples); head verdicts "
                           f"{record.head_verdicts}")


def message(record: VRecord, what: str) -> str:
    """The failure/skip message of a claim-V test: verdict, each metric, threshold, source, null."""
    unit = "samples" if record.level == "head" else "(layer, head, sample) units"
    head = (f"claim V {record.verdict} for {what} "
            f"(mean over {record.n_used} of {record.n_samples} {unit}; "
            f"{record.n_undetermined} undetermined)")
    if record.verdict == verdicts.UNDETERMINED:
        return f"{head}: {record.reason}"
    return f"{head}\n{record.evidence}"


def sample_rows(record: dict, run) -> list[dict]:
    """``--save-samples`` (``ClaimSpec.sample_rows``): one row per sample behind a head record,
    keyed like the record (claim, model, level, layer, head) plus ``sample`` (its index in the
    input set) and ``sample_name``: every per-sample metric and its null (``<metric>_null``),
    whether the sample is undetermined and whether it enters the record's means (``used``); the
    mean of a column over the used rows is the record's value (method §2). A model record's
    means are the means over the used rows of its heads' rows (``undetermined`` False, or all
    rows when the model itself is undetermined), so it has no rows of its own. Non-finite values
    are written as null."""
    if record.get("level") != "head":
        return []
    layer, head = record["layer"], record["head"]
    metrics = run.layer_metrics("V", layer)
    names = run.prepare()["input_set"].get("names") or []
    undetermined = metrics["undetermined"][:, head].bool()
    used = (torch.ones_like(undetermined) if record.get("verdict") == verdicts.UNDETERMINED
            else ~undetermined)
    rows = head_sample_rows("V", record, names, undetermined, used)
    for s, row in enumerate(rows):
        for name in METRICS:
            row[name] = finite_or_none(metrics[name][s, head])
            row[f"{name}_null"] = finite_or_none(metrics[f"{name}_null"][s, head])
    return rows
