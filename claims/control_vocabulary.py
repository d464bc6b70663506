"""What the claims' expectations on the controls (``claims/claim_*_controls.py``, method §12)
share: the verdict sets an expectation allows, the ladder's positive members and the sentence of
its dose-response points, which is the same whatever the claim. Standard library only.
fixtures/models/controls.py keeps its own copy of the verdict sets (it may not import claims)
to label an expectation; tests/test_controls.py checks the two agree."""

from __future__ import annotations

SUPPORTED = ("supported",)
REFUTED = ("refuted",)
NOT_SUPPORTED = ("refuted", "inconclusive", "undetermined", "partial")  # undetermined: the rule cannot tell
NOT_REFUTED = ("supported", "partial", "inconclusive")  # where a dose's verdict turns

#: The ladder's exact kernel-PCA members (V̂ up to a map the network undoes); ``noise-1pct``, a
#: positive control too, each claim states apart where its reason differs.
POSITIVE = ("vhat", "rotated", "mixed-cond10", "mixed-cond100", "mixed-cond1000", "scaled-10",
            "scaled-100", "scaled-1000", "signs", "permuted")
#: The ladder's dose-response points, V = V̂ + ε·‖v̂_j‖·z_j: each claim states per dose what
#: the calibration of its bars implies (method §12.2).
DOSES = ("noise-5pct", "noise-20pct", "noise-100pct")
#: Where claims V and γ cross their bars on the calibration's dose-response (method §2.4, §4.2):
#: claim V's overlap excess reaches 0.9 at ε ≈ 0.33–0.87 and γ's ρ position 0.35 at ε ≈ 0.28–1.0
#: over unit-variance keys at d = 32 and d = 8 and keys of variance 0.25 (N = 65).
CROSSINGS = "eps 0.28-1.0 for the calibration's key laws"
