"""Claims across training (method §14.4): the judged statistics of claims V, E and J at every
checkpoint of a series, step 0 (the random initialisation) included, each with its 95% bootstrap
interval over the fixed evaluation batch, and the paired change from step 0 to the last
checkpoint, which judges P1's "training moves V towards V̂" (``[claim_v_training]``).

Every checkpoint of a series is evaluated on the same fixed batch, so sample s at step 0 and
sample s at the last step are the same input: the change is paired per sample, and one set of
bootstrap resamples (seeded from the series' name) is used at every checkpoint, so intervals of
different checkpoints, and of their differences, resample the same inputs.
"""

from __future__ import annotations

import math

import torch

from checks.projection_summary import spearman_rho
from checks.stats import bootstrap_indices, excess_over_null, percentile_interval, seed_from

from . import verdicts
from .chance import above_pvalues, chance_settings
from .claim_e_curve import e_outcomes
from .claim_v_curve import v_outcomes

SECTION = "claim_v_training"
#: Claim V's metrics followed over training (the overlap beside P2's three judged metrics).
V_METRICS = ("optimal_cosine", "linear_cka", "kernel_cka", "subspace_overlap")


def resamples(n: int, series: str) -> torch.Tensor:
    """[R, n] bootstrap indices of the fixed batch, one set for every checkpoint of ``series``."""
    return bootstrap_indices(n, seed_from(f"dynamics-{series}"),
                             chance_settings().bootstrap_resamples)


def _interval(draws: torch.Tensor) -> list[float]:
    return [float(x) for x in percentile_interval(draws, chance_settings().confidence)]


# ---------------------------------------------------------------------------- per-sample values
def v_per_sample(per_layer: dict[int, dict[str, torch.Tensor]], heads: list[int]) -> dict[str, torch.Tensor]:
    """Per sample [S], the mean over its determined (layer, head) units of each claim-V metric
    of :data:`V_METRICS` and of its null (all units where a sample has no determined one)."""
    layers = sorted(per_layer)
    undet = torch.cat([per_layer[l]["undetermined"][:, heads] for l in layers], dim=1)
    keep = ~undet
    keep = torch.where(keep.any(1, keepdim=True), keep, torch.ones_like(keep))
    k = keep.to(torch.float64)
    out = overlap_sums(per_layer, heads)
    for name in V_METRICS:
        for n in (name, f"{name}_null"):
            x = torch.cat([per_layer[l][n][:, heads].to(torch.float64) for l in layers], dim=1)
            out[n] = (x * k).sum(1) / k.sum(1)
    return out


def overlap_sums(per_layer: dict[int, dict[str, torch.Tensor]], heads: list[int]) -> dict[str, torch.Tensor]:
    """Per sample [S], the sums over its determined (layer, head) units of the subspace overlap
    and of its token-shuffled null, and their count: what claim V's model record pools into
    the overlap excess (claims/claim_v.py, method §2.4)."""
    layers = sorted(per_layer)
    keep = ~torch.cat([per_layer[l]["undetermined"][:, heads] for l in layers], dim=1)
    k = keep.to(torch.float64)

    def total(name: str) -> torch.Tensor:
        x = torch.cat([per_layer[l][name][:, heads].to(torch.float64) for l in layers], dim=1)
        return (torch.where(keep, x, torch.zeros_like(x))).sum(1)
    return {"overlap_sum": total("subspace_overlap"), "overlap_null_sum": total("subspace_overlap_null"),
            "overlap_count": k.sum(1)}


def excess_draws(values: dict[str, torch.Tensor], idx: torch.Tensor) -> torch.Tensor:
    """Claim V's overlap excess (x − x₀)/(1 − x₀) of the pooled means over each resample's
    samples (rows of ``idx``; one row of all samples gives the point value), as claim V's model
    record and its interval pool them (method §2.4): [R]; NaN where a resample keeps no unit."""
    count = values["overlap_count"][idx].sum(1)
    ov = values["overlap_sum"][idx].sum(1) / count.clamp_min(1)
    ov0 = values["overlap_null_sum"][idx].sum(1) / count.clamp_min(1)
    return torch.where(count > 0, excess_over_null(ov, ov0), torch.full_like(ov, math.nan))


def excess_change(first: dict[str, torch.Tensor], last: dict[str, torch.Tensor],
                  idx: torch.Tensor) -> dict:
    """The change of claim V's overlap excess (the measure of its ``ours`` rule) from ``first``
    to ``last`` (:func:`v_per_sample` of two checkpoints of one batch), with the 95% interval of
    the paired change: the same resamples ``idx`` at both checkpoints, excess(last) −
    excess(first) per resample."""
    every = torch.arange(first["overlap_count"].shape[0]).unsqueeze(0)
    a, b = float(excess_draws(first, every)[0]), float(excess_draws(last, every)[0])
    return {"first": a, "last": b, "delta": b - a,
            "ci": _interval(excess_draws(last, idx) - excess_draws(first, idx)),
            "n": int(first["overlap_count"].shape[0])}


def gamma_per_sample(per_layer: dict[int, dict[str, torch.Tensor]], heads: list[int]) -> dict[str, torch.Tensor]:
    """Per sample [S], the mean over (layer, head) units of the relative γ spread of the learned
    V and of the two controls (method §4.2)."""
    layers = sorted(per_layer)
    return {name: torch.cat([per_layer[l][f"gamma_{name}"][:, heads].to(torch.float64)
                             for l in layers], dim=1).mean(1)
            for name in ("learned", "eigen", "perturbed")}


def j_per_sample(per_layer: dict[int, dict[str, torch.Tensor]], heads: list[int]) -> dict[str, torch.Tensor]:
    """Per sample [S], token-weighted sums of claim J's terms over (layer, head) units: the log of
    Σ N·mean‖φ‖², Σ N·mean‖h‖², Σ N (pooled as claims.claim_j.pooled_ci pools them)."""
    layers = sorted(per_layer)

    def cat(name):
        return torch.cat([per_layer[l][name][:, heads].to(torch.float64) for l in layers], dim=1)
    n = cat("n_tokens")
    return {"log_phi": torch.logsumexp(cat("log_phi_sq_mean") + n.log(), dim=1),
            "h": (cat("h_sq_mean") * n).sum(1), "tokens": n.sum(1)}


# ---------------------------------------------------------------------------- statistics
def j_draws(terms: dict[str, torch.Tensor], idx: torch.Tensor) -> torch.Tensor:
    """J_proj = mean‖φ‖² − mean‖h‖² pooled over each resample's samples (rows of ``idx``)
    (method §3.1, token-weighted): [R]."""
    total = terms["tokens"][idx].sum(1)
    phi = torch.exp(torch.logsumexp(terms["log_phi"][idx], dim=1) - total.log())
    return phi - terms["h"][idx].sum(1) / total


def position_draws(g: dict[str, torch.Tensor], idx: torch.Tensor) -> torch.Tensor:
    """The γ position (learned − eigen)/(perturbed − eigen) of each resample's means (method
    §4.2): [R]; NaN where the controls have no contrast."""
    m = {k: v[idx].mean(1) for k, v in g.items()}
    gap = m["perturbed"] - m["eigen"]
    return torch.where(gap > 0, (m["learned"] - m["eigen"]) / gap.clamp_min(1e-300),
                       torch.full_like(gap, math.nan))


def position(g: dict[str, torch.Tensor]) -> float | None:
    m = {k: float(v.mean()) for k, v in g.items()}
    gap = m["perturbed"] - m["eigen"]
    return (m["learned"] - m["eigen"]) / gap if gap > 0 else None


def paired_change(first: torch.Tensor, last: torch.Tensor, idx: torch.Tensor, seed: int) -> dict:
    """The change last − first of a per-sample value [S] paired over samples: its mean, 95%
    bootstrap interval (resamples ``idx``) and the one-sided sign-flip p-value of "it rises"
    (method §7.2), with ``n`` pairs."""
    d = (last.to(torch.float64) - first.to(torch.float64))
    p_up = above_pvalues(d.unsqueeze(1), None, seed)[0]
    p_down = above_pvalues(-d.unsqueeze(1), None, seed)[0]
    return {"first": float(first.mean()), "last": float(last.mean()), "delta": float(d.mean()),
            "ci": _interval(d[idx].mean(1)), "p_rises": float(p_up), "p_falls": float(p_down),
            "n": int(d.numel())}


def v_change(first: dict[str, torch.Tensor], last: dict[str, torch.Tensor], idx: torch.Tensor,
             series: str) -> dict:
    """Per metric of :data:`V_METRICS`: the paired change of the metric, and of its difference
    from its own null (``<metric>_vs_null``: the null moves too, since G changes with training);
    and the change of claim V's overlap excess (``subspace_overlap_excess``,
    :func:`excess_change`), which ``[claim_v_training]`` judges."""
    out = {}
    for name in V_METRICS:
        seed = seed_from(f"dynamics-{series}-{name}")
        out[name] = paired_change(first[name], last[name], idx, seed)
        out[f"{name}_vs_null"] = paired_change(first[name] - first[f"{name}_null"],
                                               last[name] - last[f"{name}_null"], idx, seed)
    out["subspace_overlap_excess"] = excess_change(first, last, idx)
    return out


def training_verdict(changes: dict[str, dict]) -> dict:
    """``[claim_v_training]`` on the paired changes of the metrics it names (``metrics``: the
    subspace overlap's excess (x − x₀)/(1 − x₀) over the token-shuffled null x₀, the measure of
    claim V's ``ours`` rule, method §2.4): supported when every judged change's interval lies above 0, refuted when
    every one lies below 0, inconclusive otherwise. The changes of the metrics it lists as
    ``evidence`` (P2's three) are carried beside the verdict, never judged. Returns
    ``{"verdict", "metrics", "judged", "evidence", "shown"}``."""
    section = verdicts.load_thresholds()[SECTION]
    names, shown = list(section["metrics"]), list(section.get("evidence", ()))
    missing = [n for n in names if n not in changes]
    if missing:
        raise KeyError(f"[{SECTION}] judges {missing}, which the changes lack")
    metrics = {"min_delta_ci_low": min(float(changes[n]["ci"][0]) for n in names),
               "max_delta_ci_high": max(float(changes[n]["ci"][1]) for n in names)}
    v = verdicts.judge(SECTION, metrics)
    return {"verdict": v.verdict, "metrics": metrics, "judged": names,
            "evidence": verdicts.format_evidence(v),
            "shown": {n: {k: changes[n].get(k) for k in ("delta", "ci")}
                      for n in shown if n in changes}}


def rho_interval(draws_by_step: torch.Tensor, steps: list[int]) -> dict:
    """Spearman's ρ between a statistic and the step, of the point estimates' series
    (``value``) and over the resamples (``ci``; rows of ``draws_by_step`` [checkpoints, R] are
    the same resamples at every checkpoint). None where fewer than 3 checkpoints."""
    if len(steps) < 3:
        return {"value": None, "ci": None}
    s = torch.tensor(steps, dtype=torch.float64)
    rhos = []
    for r in range(draws_by_step.shape[1]):
        col = draws_by_step[:, r]
        if not bool(torch.isfinite(col).all()) or float(col.max() - col.min()) == 0.0:
            continue
        rhos.append(float(spearman_rho(col, s)))
    return {"ci": _interval(torch.tensor(rhos, dtype=torch.float64)) if rhos else None}


# ---------------------------------------------------------------------------- a whole series
def _counts(records: dict, rule_set: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for rec in records.values():
        v = rec["verdicts"][rule_set]
        out[v] = out.get(v, 0) + 1
    return out


def series_dynamics(series: str, model: str, checkpoints: list[dict], heads: list[int],
                    head_dim: int, rules: str = "ours") -> dict:
    """Claims V, E and J over a series (method §14.4). ``checkpoints``: in step order, each
    ``{"step", "test_accuracy", "V", "E", "J"}`` with the per-layer metrics of every layer of
    that checkpoint. Returns the trajectory (each judged statistic with its interval, each
    checkpoint's verdicts), the paired change from the first to the last checkpoint with its
    interval, and the ``[claim_v_training]`` verdict on it."""
    from . import claim_j
    from . import multiverse as mv

    if len(checkpoints) < 2:
        raise ValueError(f"series {series}: claims across training need at least 2 checkpoints, "
                         f"got {len(checkpoints)}")
    n = next(iter(checkpoints[0]["V"].values()))["undetermined"].shape[0]
    idx = resamples(n, series)
    rows, v_samples, gamma_draws, j_draws_all, p1 = [], [], [], [], []
    for cp in checkpoints:
        v_out = v_outcomes(model, cp["V"], heads, rules)
        e_out = e_outcomes(model, cp["E"], heads, head_dim, rules)
        v_ps, g_ps, jt = v_per_sample(cp["V"], heads), gamma_per_sample(cp["E"], heads), \
            j_per_sample(cp["J"], heads)
        jd, pd = j_draws(jt, idx), position_draws(g_ps, idx)
        v_samples.append(v_ps)
        gamma_draws.append(pd)
        j_draws_all.append(jd)
        pooled = claim_j.pooled([cp["J"][l] for l in sorted(cp["J"])], heads)
        p1.append(pooled["p1_log_mean_error"])
        vm = v_out["model"]
        rows.append({
            "step": cp["step"], "test_accuracy": cp.get("test_accuracy"),
            "V": {"verdicts": vm["verdicts"],
                  "head_verdicts": {r: _counts(v_out["units"], r) for r in verdicts.RULE_SETS},
                  "metrics": {m: {"value": vm["metrics"][m], "ci": (vm.get("ci") or {}).get(m),
                                  "null": vm["null"].get(m)}
                              for m in (*V_METRICS, "subspace_overlap_excess")}},
            "E": {"verdicts": e_out["model"]["verdicts"],
                  "metrics": {m: {"value": e_out["model"]["metrics"].get(m),
                                  "ci": (e_out["model"].get("ci") or {}).get(m)}
                              for m in ("raw_vs_standardized_ratio", "max_route_ratio",
                                        "naive_finite_share")},
                  "gamma_position": {"value": position(g_ps), "ci": _interval(pd)},
                  "gamma_head_verdicts": {r: _counts(e_out["units"], r) for r in verdicts.RULE_SETS}},
            "J": {"j_proj": {"value": pooled["j_proj"], "ci": _interval(jd)},
                  **{k: pooled[k] for k in ("phi_sq_mean", "h_sq_mean", "log10_ratio",
                                            "bessel_share")},
                  "p1_code_log_mean_error": pooled["p1_log_mean_error"]}})
    steps = [cp["step"] for cp in checkpoints]
    v_delta = v_change(v_samples[0], v_samples[-1], idx, series)
    j_points = torch.tensor([r["J"]["j_proj"]["value"] for r in rows], dtype=torch.float64)
    s = torch.tensor(steps, dtype=torch.float64)

    def rho_of(values: list) -> float | None:
        if len(values) < 3 or any(v is None for v in values):
            return None
        x = torch.tensor(values, dtype=torch.float64)
        return None if float(x.max() - x.min()) == 0.0 else float(spearman_rho(x, s))

    p1_tail = [(st, v) for st, v in zip(steps, p1) if v is not None]
    change = {
        "from_step": steps[0], "to_step": steps[-1],
        "V": v_delta,
        "E": {"gamma_position": {"first": rows[0]["E"]["gamma_position"]["value"],
                                 "last": rows[-1]["E"]["gamma_position"]["value"],
                                 "ci": _interval(gamma_draws[-1] - gamma_draws[0])}},
        "J": {"j_proj": {"first": float(j_points[0]), "last": float(j_points[-1]),
                         "delta": float(j_points[-1] - j_points[0]),
                         "ci": _interval(j_draws_all[-1] - j_draws_all[0])}},
    }
    change["E"]["gamma_position"]["delta"] = (
        None if None in (change["E"]["gamma_position"]["first"], change["E"]["gamma_position"]["last"])
        else change["E"]["gamma_position"]["last"] - change["E"]["gamma_position"]["first"])
    trends = {"spearman_j": {"value": rho_of([float(x) for x in j_points]),
                             **rho_interval(torch.stack(j_draws_all), steps)},
              "spearman_gamma_position": {"value": rho_of([r["E"]["gamma_position"]["value"]
                                                           for r in rows]),
                                          **rho_interval(torch.stack(gamma_draws), steps)},
              # P1's logged quantity (method §3.5, §8.2): shown, never judged
              "spearman_p1_code": {"value": rho_of([v for _, v in p1_tail]) if len(p1_tail) == len(steps) else None,
                                   "first": p1[0], "last": p1[-1],
                                   "max_step": max(p1_tail, key=lambda t: t[1])[0] if p1_tail else None}}
    return {"series": series, "model": model, "steps": steps, "n_samples": int(n),
            "rules": rules, "trajectory": rows, "change": change, "trends": trends,
            "training_moves_v_towards_v_hat": training_verdict(v_delta)}


def seed_distribution(model: str, rows: list[dict], rules: str) -> dict:
    """Per claim and rule set, how many training seeds give each model verdict, and each
    headline metric's mean and spread over seeds (method §14.5). ``rows``: one per seed, with
    ``verdicts[claim][rule_set]`` and ``metrics[claim][name]``."""
    import statistics

    claims = sorted({c for r in rows for c in r["verdicts"]})
    dist = {c: {rs: {} for rs in verdicts.RULE_SETS} for c in claims}
    for r in rows:
        for c in claims:
            for rs in verdicts.RULE_SETS:
                v = r["verdicts"][c][rs]
                dist[c][rs][v] = dist[c][rs].get(v, 0) + 1
    spread = {}
    for c in claims:
        spread[c] = {}
        for name in rows[0]["metrics"].get(c, {}):
            xs = [r["metrics"][c][name] for r in rows if r["metrics"][c].get(name) is not None]
            spread[c][name] = {"mean": statistics.fmean(xs) if xs else None,
                               "sd": statistics.stdev(xs) if len(xs) > 1 else None,
                               "min": min(xs) if xs else None, "max": max(xs) if xs else None}
    return {"model": model, "n_seeds": len(rows), "seeds": rows, "rules": rules,
            "distribution": dist, "metric_spread": spread,
            "unanimous": {c: {rs: (next(iter(d)) if len(d) == 1 else None)
                              for rs, d in dist[c].items()} for c in claims}}


def dynamics_of_series(series: str, points, rules: str) -> dict:
    """``--training-dynamics``: :func:`series_dynamics` over the checkpoints ``points`` of a
    series (each with ``step``, ``run``, ``sidecar``), with claims V, E and J's per-layer metrics
    of every layer."""
    checkpoints, info = [], None
    for point in points:
        info = point.run.prepare()
        layers = range(info["n_layers"])
        checkpoints.append({"step": point.step, "test_accuracy": point.sidecar.get("test_accuracy"),
                            **{c: {l: point.run.layer_metrics(c, l) for l in layers}
                               for c in ("V", "E", "J")}})
    return series_dynamics(series, info["key"], checkpoints, list(range(info["n_heads"])),
                           info["head_dim"], rules=rules)


def seed_row(model: str, seed: int, run, layers: list[int], heads: list[int], rules: str) -> dict:
    """``--seeds``: one training seed's row of :func:`seed_distribution`: the model verdicts of
    claims V, J and E on the run of that seed's model, the head verdict counts of V and γ, and
    their headline metrics."""
    from . import claim_j
    from . import multiverse as mv

    info = run.prepare()
    v = v_outcomes(model, {l: run.layer_metrics("V", l) for l in layers}, heads, rules)
    e = e_outcomes(model, {l: run.layer_metrics("E", l) for l in layers}, heads,
                      info["head_dim"], rules)
    j = claim_j.model_record(model, {l: run.layer_metrics("J", l) for l in layers}, heads,
                             rules=rules).to_json()
    return {"seed": seed, "checkpoint_hash": info["checkpoint_hash"],
            "verdicts": {"V": v["model"]["verdicts"], "J": j["verdicts"],
                         "E": e["model"]["verdicts"]},
            "head_verdicts": {
                "V": {r: mv.counts(u["verdicts"][r] for u in v["units"].values())
                      for r in ("p2", "ours")},
                "E-gamma": {r: mv.counts(u["verdicts"][r] for u in e["units"].values())
                            for r in ("p2", "ours")}},
            "metrics": {"V": {m: v["model"]["metrics"][m] for m in mv.headline("V")},
                        "J": {m: j["metrics"][m] for m in mv.headline("J")},
                        "E": {m: e["model"]["metrics"][m] for m in mv.headline("E")}}}
