"""Claim V's expected verdicts on the controls (method §12), under the rule set ``ours``.

Pure data (standard library only), named by claim V's spec (``controls``, claims/builtin.py) and
read by the run through :func:`fixtures.plugin.control_outcomes.expectation`:
``{control kind: {level: (verdicts, why)}}``, the kinds being the ladder members
(fixtures/models/families/kpca_oracle.py) and ``random-init-model`` (the default run's
random-initialised models). An empty verdict tuple is no expectation, with its reason.
"""

from __future__ import annotations

from .control_vocabulary import CROSSINGS, NOT_SUPPORTED, POSITIVE, REFUTED, SUPPORTED
LEVELS = ("head", "model")

_WHY_POS_V = ("V = V̂·M spans exactly V̂'s column space and the output projection undoes M, so the "
              "network is an exact kernel PCA of its keys (method §12.2)")
_WHY_NOISE_1PCT = "V is V̂ up to 1 % row-norm noise (method §12.2)"
_WHY_NEG_V = ("V carries no information from the keys' Gram eigenvectors: claim V is false by "
              "construction (method §12.4)")
_WHY_KEYS_V = ("V spans the (uncentred) keys' column space, which the top Gram eigenvectors "
               "approach as the kernel nears its linear term; how close at this scale is measured, "
               "not expected: no expectation (method §12.4)")
_WHY_RANDOM_V = ("at random initialisation values and keys are both linear maps of the same token "
                 "embeddings X, so span(V) shares X's dominant directions with span(V̂) (overlap "
                 "excess 0.45-0.47 on the random ViT, method §2.4): claim V is not expected to hold, "
                 "but it is not at chance either, so only 'not supported' is certain (method §12.5)")
_WHY_DOSE_V = {
    "noise-5pct": (SUPPORTED, "V is V̂ up to 5 % row-norm noise, far below where claim V's "
                   f"overlap excess crosses its support bar 0.9 on the calibration's dose-response "
                   f"({CROSSINGS}; method §2.4, §12.2)"),
    "noise-20pct": (SUPPORTED, "V is V̂ up to 20 % row-norm noise: on the calibration's "
                    "dose-response the overlap excess at eps = 0.2 is 0.96-1.0 under every key law, "
                    "above its support bar 0.9 (method §2.4, §12.2)"),
    "noise-100pct": (NOT_SUPPORTED, "V is V̂ plus noise as large as its rows: on the calibration's "
                     "dose-response the overlap excess at eps = 1 is 0.50-0.86, below its support "
                     "bar 0.9 under every key law; the span keeps part of V̂'s top directions, so "
                     "partial is allowed (method §2.4, §2.6, §12.2)"),
}



def expectations() -> dict[str, dict[str, tuple[tuple[str, ...], str]]]:
    """Claim V's expectation per control kind, the same at head and model level."""
    per_kind = {
        **{kind: (SUPPORTED, _WHY_POS_V) for kind in POSITIVE},
        "noise-1pct": (SUPPORTED, _WHY_NOISE_1PCT),
        **_WHY_DOSE_V,
        **{kind: (REFUTED, _WHY_NEG_V) for kind in ("null", "random-init", "random-init-p1")},
        "keys-p1": ((), _WHY_KEYS_V),
        "random-init-model": (NOT_SUPPORTED, _WHY_RANDOM_V),
    }
    return {kind: {level: exp for level in LEVELS} for kind, exp in per_kind.items()}
