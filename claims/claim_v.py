"""Claim V (spec §2): from per-sample metrics to per-head and per-model verdicts with evidence."""

from __future__ import annotations

import torch

from checks.stats import excess_over_null, masked_mean

from . import verdicts
from .names import V_MEASURED

CLAIM = "claim_v"
METRICS = V_MEASURED


def _undetermined_max_share() -> float:
    return float(verdicts.load_thresholds()[CLAIM]["undetermined"]["max_share"])


def summarize(metrics: dict[str, torch.Tensor], keep: torch.Tensor) -> dict:
    """Means (and std) over the kept entries along dim 0 of every metric and its null; the
    subspace-overlap excess over its null (spec §2). ``metrics`` values have shape [M]."""
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
    eigenvalue μ_d at round-off level (spec §2)."""
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
    return "; ".join(parts) + ": V_hat is not determined by the keys (spec §2)"


def decide(metrics: dict[str, torch.Tensor], undetermined: torch.Tensor,
           few_tokens: torch.Tensor | None = None, n_tokens: torch.Tensor | None = None) -> dict:
    """The verdict for one unit (a head over its samples, or a model over its heads and samples).

    ``metrics[name]``, ``undetermined`` and the optional ``few_tokens`` (N ≤ d) and ``n_tokens``
    are flat tensors over the unit's samples.
    """
    keep = ~undetermined.reshape(-1)
    flat = {name: t.reshape(-1) for name, t in metrics.items()}
    n_total = int(keep.numel())
    n_undet = n_total - int(keep.sum())
    share = n_undet / max(n_total, 1)
    few = None if few_tokens is None else few_tokens.reshape(-1).bool() & ~keep
    lengths = None if n_tokens is None else n_tokens.reshape(-1)
    if n_total == 0 or share > _undetermined_max_share() or int(keep.sum()) == 0:
        summary = summarize(flat, torch.ones_like(keep))  # recorded, flagged, not judged
        return {"verdict": verdicts.UNDETERMINED, **summary, "n_samples": n_total,
                "n_undetermined": n_undet, "n_few_tokens": 0 if few is None else int(few.sum()),
                "reason": _undetermined_reason(n_undet, n_total, few, lengths)}
    summary = summarize(flat, keep)
    v = verdicts.judge(CLAIM, summary["metrics"])
    return {"verdict": v.verdict, **summary, "n_samples": n_total, "n_undetermined": n_undet,
            "evidence": verdicts.format_evidence(
                v, summary["null"],
                extra={k: summary["metrics"][k] for k in ("subspace_overlap", "direct_cosine",
                                                         "pearson", "relative_frobenius",
                                                         "allclose")})}


def head_record(model: str, layer: int, head: int, layer_metrics: dict[str, torch.Tensor]) -> dict:
    per_head = {name: t[:, head] for name, t in layer_metrics.items()
                if name not in ("undetermined", "mu_d", "threshold", "few_tokens", "n_tokens")}
    extra = {name: layer_metrics[name][:, head] for name in ("few_tokens", "n_tokens")
             if name in layer_metrics}
    result = decide(per_head, layer_metrics["undetermined"][:, head], **extra)
    result["mu_d_min"] = float(layer_metrics["mu_d"][:, head].min())
    return {"claim": "V", "level": "head", "model": model, "layer": layer, "head": head, **result}


def model_record(model: str, per_layer: dict[int, dict[str, torch.Tensor]],
                 heads: list[int], head_verdicts: dict[str, int]) -> dict:
    """P2's aggregation: the rule applied to the model average over (layer, head, sample)."""
    names = [n for n in next(iter(per_layer.values())) if n not in ("mu_d", "threshold")]
    stacked = {n: torch.cat([m[n][:, heads].reshape(-1) for m in per_layer.values()]) for n in names}
    undetermined = stacked.pop("undetermined")
    extra = {n: stacked.pop(n) for n in ("few_tokens", "n_tokens") if n in stacked}
    result = decide(stacked, undetermined, **extra)
    return {"claim": "V", "level": "model", "model": model, "layer": None, "head": None,
            "layers": sorted(per_layer), "heads": heads, "head_verdicts": head_verdicts, **result}


def message(record: dict, what: str) -> str:
    """The failure/skip message of a claim-V test: verdict, each metric, threshold, source, null."""
    unit = "samples" if record["level"] == "head" else "(layer, head, sample) units"
    head = (f"claim V {record['verdict']} for {what} "
            f"(mean over {record['n_used']} of {record['n_samples']} {unit}; "
            f"{record['n_undetermined']} undetermined)")
    if record["verdict"] == verdicts.UNDETERMINED:
        return f"{head}: {record['reason']}"
    return f"{head}\n{record['evidence']}"
