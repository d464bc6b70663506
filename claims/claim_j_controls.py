"""Claim J's expected verdicts on the controls (method §12), under the rule set ``ours``.

Pure data (standard library only), named by claim J's spec (``controls``, claims/builtin.py) and
read by the run through :func:`fixtures.plugin.control_outcomes.expectation`:
``{control kind: {level: (verdicts, why)}}``, the kinds being the ladder members
(fixtures/models/families/kpca_oracle.py) and ``random-init-model`` (the default run's
random-initialised models). An empty verdict tuple is no expectation, with its reason; its
series records have none.
"""

from __future__ import annotations

from .control_vocabulary import NOT_REFUTED, NOT_SUPPORTED, POSITIVE, REFUTED, SUPPORTED

_WHY_POS_J = ("softmax(s·QKᵀ)·V̂ projects φ(q) onto unit principal axes (kpca convention), so "
              "‖h‖² ≤ ‖φ(q)‖² for every token; a twin's W_O undoes its M or scale (method §12.2)")
_WHY_NEG_J = ("h is not a projection of φ(q), so claim J is false; but V = X·W_V shares the token "
              "embeddings X with the keys, so softmax·V can explain part of the KPCA head's output "
              "beyond chance (output-fit excess 0.16-0.28 measured on the ladder's random-init "
              "member), and only 'not supported' is certain (method §3.6, §12.4)")
_WHY_NULL_J = ("V is independent of the keys, so softmax·V explains the KPCA head's output no better "
               "than the token-shuffled V̂ does: the output fit's R² is at chance, which the "
               "equivalence test shows (refuted, method §3.6, §12.4)")
_WHY_NULL_J_LAYER = ("V is independent of the keys, so the output fit's excess is 0 in expectation; "
                     "one layer's 100 images leave its interval about 0.2 wide, wider than the "
                     "equivalence margin (a tenth of the room above the null), so a layer is "
                     "shown at chance (refuted) or left inconclusive, never supported; the model, "
                     "pooling its layers, is shown at chance (method §3.6, §7.2, §12.4)")
_WHY_P1_J = ("h is not a projection of φ(q); at P1's kernel scale the attention is smooth and the "
             "token-shuffled V̂ already explains most of the output (null R² 0.8-0.9), so a rule "
             "that read a high R² as support would support this head: claim J must not be "
             "supported (method §3.6, §12.4)")
_DOSE_J = {
    "noise-5pct": (SUPPORTED, "V is V̂ up to 5 % row-norm noise E: the head's output A·V differs "
                   "from the KPCA head's by A·E, that noise averaged by the attention rows (it "
                   "stays near 5 % only where a query attends to a single token), far inside "
                   "the output fit's support bar (excess 0.9; method §3.6, §12.2)"),
    "noise-20pct": (NOT_REFUTED, "V is V̂ up to 20 % row-norm noise E: A·E, averaged by the "
                    "attention rows, leaves the fit's excess far above the refute bar 0.1; "
                    "whether it reaches 0.9 depends on how many tokens each query attends to "
                    "(method §3.6, §12.2)"),
    "noise-100pct": ((), "V is V̂ plus noise as large as its rows, but claim J reads the head's "
                     "output A·V, in which the attention averages the row noise over the tokens "
                     "each query attends to (by about 1/sqrt(n_eff)): how much of the fit survives "
                     "is what this point measures, so no expectation (method §3.6, §12.2)"),
}



def _both(exp: tuple[tuple[str, ...], str]) -> dict[str, tuple[tuple[str, ...], str]]:
    return {"layer": exp, "model": exp}


def expectations() -> dict[str, dict[str, tuple[tuple[str, ...], str]]]:
    """Claim J's expectation per control kind, at layer and model level."""
    return {
        **{kind: _both((SUPPORTED, _WHY_POS_J)) for kind in (*POSITIVE, "noise-1pct")},
        **{kind: _both(exp) for kind, exp in _DOSE_J.items()},
        "null": {"layer": (NOT_SUPPORTED, _WHY_NULL_J_LAYER), "model": (REFUTED, _WHY_NULL_J)},
        "random-init": _both((NOT_SUPPORTED, _WHY_NEG_J)),
        "random-init-p1": _both((NOT_SUPPORTED, _WHY_P1_J)),
        "keys-p1": _both((NOT_SUPPORTED, _WHY_P1_J)),
        "random-init-model": _both((NOT_SUPPORTED, _WHY_NEG_J)),
    }
