"""The test of a metric against its null, written once for claims V, J and E's γ (method §7.2):
the settings of ``[rule_sets.ours]`` read once (:func:`chance_settings`), the p-values
("above chance": one-sided sign-flip test; "at chance": TOST with a margin), their adjustment,
and the one record every ``vs_null`` entry is (:class:`ChanceTest`, :func:`chance_test`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import TypedDict

import torch

from checks.nulls import tost_pvalues
from checks.stats import EXACT_SIGN_FLIP_MAX_N, adjust_pvalues, sign_flip_pvalues

from . import verdicts


@dataclass(frozen=True)
class ChanceSettings:
    """``[rule_sets.ours]``: the interval level and resample count of every bootstrap, the
    permutation count of every sign-flip test, alpha, and the multiplicity correction."""

    confidence: float
    bootstrap_resamples: int
    permutation_resamples: int
    alpha: float
    correction: str


def chance_settings() -> ChanceSettings:
    """The settings of the thresholds file in use (``claims.verdicts.THRESHOLDS_FILE``), read
    once per file."""
    return _settings_of(str(verdicts.THRESHOLDS_FILE))


@lru_cache(maxsize=None)
def _settings_of(path: str) -> ChanceSettings:
    s = verdicts.rule_set_settings(path)
    return ChanceSettings(confidence=float(s["confidence"]),
                          bootstrap_resamples=int(s["bootstrap_resamples"]),
                          permutation_resamples=int(s["permutation_resamples"]),
                          alpha=float(s["alpha"]), correction=str(s["correction"]))


class ChanceTest(TypedDict):
    """One metric's test against its null, as every record's ``vs_null`` holds it (method §7.2).

    ``p_adjusted`` / ``tost_p_adjusted``: adjusted across the family the record states (claim V:
    the model's selected heads, per metric; γ: the layer's heads; a record tested alone, as claim
    J's output fit and every model-level record: the one test, adjusted = raw). ``above_chance``:
    p_adjusted < alpha. ``at_chance``: can_reject and tost_p_adjusted < alpha. ``margin``: the
    absolute equivalence margin, ``margin_share`` its share of the room above the null.
    ``can_reject``: ``smallest_p`` (the smallest p the test can give with ``n_samples``) < alpha."""

    p: float
    p_adjusted: float
    above_chance: bool
    tost_p: float
    tost_p_adjusted: float
    at_chance: bool
    margin: float | None
    margin_share: float | None
    can_reject: bool
    smallest_p: float
    n_samples: int


def smallest_p(n_samples: int) -> float:
    """The smallest p-value the sign-flip test can give with ``n_samples`` samples: 2**−n when
    exact, 1/(R + 1) when Monte Carlo (method §7.2)."""
    if n_samples <= EXACT_SIGN_FLIP_MAX_N:
        return 2.0 ** -int(n_samples)
    return 1.0 / (chance_settings().permutation_resamples + 1.0)


def chance_test(p, p_adjusted, tost_p, tost_p_adjusted, margin, margin_share,
                n_samples: int) -> ChanceTest:
    """The :class:`ChanceTest` of one metric from its p-values (floats or 0-d tensors), its
    margin (None or NaN: none) and share, and its number of samples."""
    alpha = chance_settings().alpha
    low = smallest_p(int(n_samples))
    can = low < alpha
    absolute = None if margin is None or math.isnan(float(margin)) else float(margin)
    return ChanceTest(p=float(p), p_adjusted=float(p_adjusted),
                      above_chance=bool(float(p_adjusted) < alpha), tost_p=float(tost_p),
                      tost_p_adjusted=float(tost_p_adjusted),
                      at_chance=bool(can and float(tost_p_adjusted) < alpha), margin=absolute,
                      margin_share=None if margin_share is None else float(margin_share),
                      can_reject=can, smallest_p=low, n_samples=int(n_samples))


def above_pvalues(diff: torch.Tensor, keep: torch.Tensor | None, seed: int) -> torch.Tensor:
    """One-sided sign-flip p-values of mean(diff) > 0 over samples (dim 0) of ``diff`` [S, U]
    (:func:`checks.stats.sign_flip_pvalues`), with the settings' permutation count."""
    return sign_flip_pvalues(diff, keep, seed, chance_settings().permutation_resamples)


def tost_p(diff: torch.Tensor, keep: torch.Tensor | None, margin, seed: int) -> torch.Tensor:
    """TOST p-values of |mean(diff)| < ``margin`` over samples (:func:`checks.nulls.tost_pvalues`),
    with the settings' permutation count."""
    return tost_pvalues(diff, keep, margin, seed, chance_settings().permutation_resamples)


def adjusted(p: torch.Tensor) -> torch.Tensor:
    """``p`` adjusted over its last axis by the settings' correction (method §7.2)."""
    return adjust_pvalues(p, chance_settings().correction)
