"""Claim E's expected verdicts on the controls (method §12), under the rule set ``ours``.

Pure data (standard library only), named by claim E's spec (``controls``, claims/builtin.py) and
read by the run through :func:`fixtures.plugin.control_outcomes.expectation`:
``{control kind: {level: (verdicts, why)}}``, the kinds being the ladder members
(fixtures/models/families/kpca_oracle.py) and ``random-init-model`` (the default run's
random-initialised models). An empty verdict tuple is no expectation, with its reason. Its head
records judge γ (the axes recovered from V), its model records the route statistics.
"""

from __future__ import annotations

from .control_vocabulary import DOSES, NOT_SUPPORTED, POSITIVE, REFUTED, SUPPORTED, WHY_DOSE

_WHY_POS_GAMMA = ("the axes recovered from V are Gram eigenvectors up to the map W_O undoes "
                  "(method §12.2)")
_WHY_E_STD = ("the model standardises its keys per token, so raw and standardised routes see the "
              "same keys and s·kᵀk ≤ (d−1)/√d keeps the naive float32 route finite: claim E's "
              "route statistics agree by construction (method §12.3)")
_WHY_NEG_GAMMA = "the axes recovered from V are not Gram eigenvectors (method §12.4)"
_WHY_KEYS_V = ("V spans the (uncentred) keys' column space, which the top Gram eigenvectors "
               "approach as the kernel nears its linear term; how close at this scale is measured, "
               "not expected: no expectation (method §12.4)")
_WHY_E_P1 = ("the keys are not standardised, so claim E's raw and standardised routes see different "
             "keys: no expectation (method §12.5)")
_WHY_E_RANDOM = ("claim E's route statistics measure the numerics of the keys' spectrum, which "
                 "random weights neither make nor break: no expectation (method §12.5)")
_WHY_RANDOM_GAMMA = ("at random initialisation the centred key Gram has a few dominant directions, "
                     "which span(V) = span(X·W_V) shares with the keys: the residual ρ, decided by "
                     "those few directions, is small and far from its token-shuffled null, while "
                     "the direction-wise overlap ω shows the rest of the span is not invariant "
                     "(random ViT: ρ position 0.16-0.23, ω position 0.54-0.63 against the bar 0.1). Not "
                     "a true null, so only 'not supported' is certain (method §4.2, §12.5)")
WHY_DOSE = ("dose-response point: V is V̂ plus row-norm noise of this size, so the claim holds "
             "only approximately; reported to show where the verdict turns, not judged "
             "(method §12.2)")

_STANDARDISED = (SUPPORTED, _WHY_E_STD)


def expectations() -> dict[str, dict[str, tuple[tuple[str, ...], str]]]:
    """Claim E's expectation per control kind: γ at head level, the routes at model level."""
    return {
        **{kind: {"head": (SUPPORTED, _WHY_POS_GAMMA), "model": _STANDARDISED}
           for kind in (*POSITIVE, "noise-1pct")},
        **{kind: {"head": ((), WHY_DOSE), "model": _STANDARDISED}
           for kind in DOSES},
        **{kind: {"head": (REFUTED, _WHY_NEG_GAMMA), "model": _STANDARDISED}
           for kind in ("null", "random-init")},
        "random-init-p1": {"head": (REFUTED, _WHY_NEG_GAMMA), "model": ((), _WHY_E_P1)},
        "keys-p1": {"head": ((), _WHY_KEYS_V), "model": ((), _WHY_E_P1)},
        "random-init-model": {"head": (NOT_SUPPORTED, _WHY_RANDOM_GAMMA),
                              "model": ((), _WHY_E_RANDOM)},
    }
