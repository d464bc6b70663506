"""Paired differences over training seeds, with a Student-t interval (claim R, method §15.4).

Claim R compares two model variants trained with the same seeds (same data order, same split):
per seed i, d_i = metric(RPC-SymViT_i) − metric(SymViT_i). The seeds are the unit of
replication, so the interval is the t interval of the mean of the d_i over n seeds,
d̄ ± t_{n−1, 1−α/2} · sd(d)/√n (method Eq. 15.8). With n = 1 there is no interval (None).

>>> r = paired_difference([0.9, 0.8, 0.85], [0.88, 0.79, 0.80])
>>> round(r["mean_diff"], 4), r["n"]
(0.0267, 3)
>>> [round(b, 4) for b in r["ci"]]
[-0.025, 0.0784]
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (SciPy)."""
    from scipy.stats import t

    return float(t.ppf(p, df))


def paired_difference(treated: Sequence[float], control: Sequence[float],
                      level: float = 0.95) -> dict:
    """Mean paired difference ``treated − control`` over seeds, its t interval at ``level``,
    the per-seed differences, and each arm's mean.

    Returns ``{"mean_diff", "ci" ([lo, hi] or None when n < 2), "sd", "n", "diffs",
    "treated_mean", "control_mean"}``. Non-finite inputs are an error naming the seed."""
    a, b = [float(x) for x in treated], [float(x) for x in control]
    if len(a) != len(b) or not a:
        raise ValueError(f"paired_difference needs two equally long, non-empty lists, got "
                         f"{len(a)} and {len(b)} values")
    for i, (x, y) in enumerate(zip(a, b)):
        if not (math.isfinite(x) and math.isfinite(y)):
            raise ValueError(f"seed {i}: non-finite value in the paired comparison ({x}, {y})")
    d = [x - y for x, y in zip(a, b)]
    n = len(d)
    mean = sum(d) / n
    if n < 2:
        return {"mean_diff": mean, "ci": None, "sd": None, "n": n, "diffs": d,
                "treated_mean": sum(a) / n, "control_mean": sum(b) / n}
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1))
    half = t_quantile(0.5 + level / 2, n - 1) * sd / math.sqrt(n)  # Eq. 15.8
    return {"mean_diff": mean, "ci": [mean - half, mean + half], "sd": sd, "n": n, "diffs": d,
            "treated_mean": sum(a) / n, "control_mean": sum(b) / n}
