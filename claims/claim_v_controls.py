"""Claim V's expected verdicts on the controls (method §12), under the rule set ``ours``.

Pure data (standard library only), named by claim V's spec (``controls``, claims/builtin.py) and
read by the run through :func:`fixtures.plugin.control_outcomes.expectation`:
``{control kind: {level: (verdicts, why)}}``, the kinds being the ladder members
(fixtures/models/families/kpca_oracle.py) and ``random-init-model`` (the default run's
random-initialised models). An empty verdict tuple is no expectation, with its reason.
"""

from __future__ import annotations

from .control_vocabulary import DOSES, NOT_SUPPORTED, POSITIVE, REFUTED, SUPPORTED, WHY_DOSE
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
WHY_DOSE = ("dose-response point: V is V̂ plus row-norm noise of this size, so the claim holds "
             "only approximately; reported to show where the verdict turns, not judged "
             "(method §12.2)")



def expectations() -> dict[str, dict[str, tuple[tuple[str, ...], str]]]:
    """Claim V's expectation per control kind, the same at head and model level."""
    per_kind = {
        **{kind: (SUPPORTED, _WHY_POS_V) for kind in POSITIVE},
        "noise-1pct": (SUPPORTED, _WHY_NOISE_1PCT),
        **{kind: ((), WHY_DOSE) for kind in DOSES},
        **{kind: (REFUTED, _WHY_NEG_V) for kind in ("null", "random-init", "random-init-p1")},
        "keys-p1": ((), _WHY_KEYS_V),
        "random-init-model": (NOT_SUPPORTED, _WHY_RANDOM_V),
    }
    return {kind: {level: exp for level in LEVELS} for kind, exp in per_kind.items()}
