"""Claim V under P2's conventions, beside our verdict: P2's rules on P2's metrics in the evidence
(method §7.3), and the record fields of the metrics computed the way P2's code computes them
(method §8.3), never judged."""

from __future__ import annotations

import torch

from checks.stats import masked_mean

from . import verdicts
from .claim_v_chance import SECTION
from .names import V_P2_CODE_METRICS as P2_CODE_METRICS


def p2_code_evidence(summary: dict, rules: str) -> str:
    """Under ``ours``, P2's rules on P2's metrics (the ``p2`` rule set, on the means) after the
    chosen verdict's evidence, so a reader sees both (method §7.3)."""
    if rules == "p2":
        return ""
    p2 = verdicts.judge(SECTION, summary["metrics"])
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
