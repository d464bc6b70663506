"""What the claims' expectations on the controls (``claims/claim_*_controls.py``, method §12)
share: the verdict sets an expectation allows, the ladder's positive members and the sentence of
its dose-response points, which is the same whatever the claim. Standard library only.
fixtures/models/controls.py keeps its own copy of the verdict sets (it may not import claims)
to label an expectation; tests/test_controls.py checks the two agree."""

from __future__ import annotations

SUPPORTED = ("supported",)
REFUTED = ("refuted",)
NOT_SUPPORTED = ("refuted", "inconclusive", "undetermined", "partial")  # undetermined: the rule cannot tell

#: The ladder's exact kernel-PCA members (V̂ up to a map the network undoes); ``noise-1pct``, a
#: positive control too, each claim states apart where its reason differs.
POSITIVE = ("vhat", "rotated", "mixed-cond10", "mixed-cond100", "mixed-cond1000", "scaled-10",
            "scaled-100", "scaled-1000", "signs", "permuted")
#: The ladder's dose-response points: reported, not judged.
DOSES = ("noise-5pct", "noise-20pct", "noise-100pct")
WHY_DOSE = ("dose-response point: V is V̂ plus row-norm noise of this size, so the claim holds "
            "only approximately; reported to show where the verdict turns, not judged "
            "(method §12.2)")
