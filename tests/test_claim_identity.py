"""Golden records of a small default-style claim run: the claim code gives the records it gave
when the golden was written, on any x86-64 CPU.

The golden file ``tests/data/claim_identity.json`` holds the ``records`` and ``models`` of this
module's :data:`RUN` on a fresh cache, one torch thread, passed through :func:`normalise`, the
one place that says what is allowed to differ between two runs:

- absolute paths: the checkout (``<root>``) and the cache folder (``<cache>``);
- ``models.<key>.capture_key``: a hash of the capture code's sources, which changes whenever
  that code is edited, not when its numbers do;
- ``models.<key>.training.reference`` and ``…differing_steps``: whether a trained model matches
  the shipped hashes of that checkout (tests/test_reference.py checks those).

It was first written by the code of commit 6070d57 (before the claim interface) and rewritten
when the capture's forward pass moved to float64 and the tiny ViTs to pinned training (method
§13), again when the `ours` rules moved to invariant metrics and calibrated nulls (method
§2.4, §3.6, §4.2, §7.2), and when γ's positions were anchored at the exact eigenvectors and ω
that round-off decides was taken out of the judgement (method §4.2, "Precision"; no verdict
moved), and once more, its series' checkpoint paths only, when the trained ViTs became shipped
data copied into the cache (``trained/…`` with ``checkpoint_base: "cache"``, where a symlinked
cache had recorded ``<cache>/trained/…``; no number moved), and when the equivalence margins
became shares of the room above the null and claim J's support moved to the output fit's excess
(method §3.6, §7.2: every TOST p moved, one claim-J layer went from refuted to inconclusive),
and when the subspace overlap became that of the centred column spaces (method §2.1: every
overlap rose by 0.006-0.019, no verdict moved), and when claim J's trend got its `ours` rule on
the output fit's excess (method §3.4: the checkpoints now carry the fit; the tiny ViT's trend is
`ours`-undetermined, the null leaving no room, `p2` still refuted), and when every `vs_null`
entry got the same fields (method §7.2: `smallest_p`, `n_samples`, and claim J's adjusted p and
`can_reject` added; no number moved), and when claim V got its tier "partial" (method §2.6:
every claim-V record carries the top-weighted share and the shared directions with their nulls,
intervals and the random-init twin's test; MiniLM's L00 heads 0 and 1 moved from refuted to
partial; the models' info names their twin), and when γ's ρ and ω came to judge span([Â, h])
with the value bias's direction h = g − ḡ, anchored at the measured eigen control, and ω's bar
moved to 0.11 (method §4.2: every ρ and ω moved; tiny-vit-digits-softmax L01-H1's claim E went
from inconclusive to refuted, its ρ position 0.469 [0.347, 0.583] → 0.509 [0.370, 0.645]). Its numbers agree within their tolerances under every emulated CPU setting of
tests/test_cpu_emulation.py, MKL on SSE4.2 with CBWR included. The golden crosses machines, so it is compared through :func:`report.tolerances.differences`:
verdicts, counts, names, hashes and key order exactly, every number within the tolerance of its
field kind (declared once, in :mod:`report.tolerances`), the evidence text through its numbers.
Same-machine identity (serial against ``-n``, shards against one run, cache against fresh) stays
bitwise in the tests that check it (tests/test_end_to_end.py, tests/test_cache.py).

Regenerate (only when a change of numbers is intended, and say so in the commit)::

    python tests/test_claim_identity.py RESULTS_JSON CACHE_DIR > tests/data/claim_identity.json
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from report.tolerances import differences

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "data" / "claim_identity.json"
pytest_plugins = ["pytester"]

#: The selection: a text model with padding (samples of different lengths) and a trained ViT
#: with its checkpoint series, so head, layer, model and series records of V, J and E all occur.
RUN = ("--models", "all-MiniLM-L6-v2,tiny-vit-digits-softmax", "--n-samples", "6",
       "--layers", "0,1", "--heads", "0,1,2", "--threads", "1", "--report", "none")
VOLATILE_MODEL_FIELDS = ("capture_key",)
VOLATILE_TRAINING_FIELDS = ("reference", "differing_steps")


def normalise(results: dict, cache_dir: str | os.PathLike) -> dict:
    """The parts of a results.json that must not change, with paths made relative (see the
    module docstring): ``{"records": [...], "models": {...}}``."""
    def paths(obj):
        if isinstance(obj, dict):
            return {k: paths(v) for k, v in obj.items()}
        if isinstance(obj, list):
            return [paths(v) for v in obj]
        if isinstance(obj, str):
            return obj.replace(str(ROOT), "<root>").replace(str(cache_dir), "<cache>")
        return obj

    models = {key: {k: v for k, v in model.items() if k not in VOLATILE_MODEL_FIELDS}
              for key, model in results["models"].items()}
    for model in models.values():
        if isinstance(model.get("training"), dict):
            model["training"] = {k: v for k, v in model["training"].items()
                                 if k not in VOLATILE_TRAINING_FIELDS}
    return paths({"records": results["records"], "models": models})


def _trained_cache(cache: Path) -> None:
    """A fresh cache folder: the trained ViT is the shipped one, copied in and verified by the
    run (fixtures/training/shipped_weights.py), the same weights on any machine."""
    cache.mkdir(parents=True)


@pytest.mark.slow
def test_claim_records_match_the_golden_within_declared_tolerances(pytester, tmp_path):
    cache, out = tmp_path / "cache", tmp_path / "out"
    _trained_cache(cache)
    run = pytester.runpytest_subprocess(
        str(ROOT / "claims"), "--rootdir", str(ROOT), "-c", str(ROOT / "pyproject.toml"),
        "-p", "no:cacheprovider", *RUN, "--out", str(out), "--cache-dir", str(cache), "-q",
        timeout=600)
    assert run.ret in (0, 1), run.stdout.str()[-3000:]
    got = normalise(json.loads((out / "results.json").read_text()), cache)
    want = json.loads(GOLDEN.read_text())
    assert [r["test_id"] for r in got["records"]] == [r["test_id"] for r in want["records"]]
    for mine, theirs in zip(got["records"], want["records"]):
        moved = differences(_sorted(mine), theirs)
        assert moved == [], f"record {theirs['test_id']} ({theirs['claim']}, {theirs['level']}) " \
                            f"changed: {moved[:5]}"
    assert sorted(got["models"]) == sorted(want["models"])
    for key, model in want["models"].items():
        kept = {k: got["models"][key].get(k) for k in model}
        assert differences(_sorted(kept), model) == [], key


def _sorted(obj):
    """``obj`` with its keys in the golden's order (the golden is written with sorted keys)."""
    return json.loads(json.dumps(obj, sort_keys=True))


def test_normalise_strips_only_paths_and_the_capture_key():
    results = {"records": [{"claim": "J", "points": [{"checkpoint": "/tmp/c/trained/a.safetensors"}],
                            "j": 0.1}],
               "models": {"m": {"capture_key": "abc", "input_set": {"source": f"{ROOT}/x.txt"},
                                "n_heads": 3}},
               "provenance": {"date": "today"}}
    assert normalise(results, "/tmp/c") == {
        "records": [{"claim": "J", "points": [{"checkpoint": "<cache>/trained/a.safetensors"}],
                     "j": 0.1}],
        "models": {"m": {"input_set": {"source": "<root>/x.txt"}, "n_heads": 3}}}


if __name__ == "__main__":  # regenerate the golden file from a run of RUN (module docstring)
    print(json.dumps(normalise(json.loads(Path(sys.argv[1]).read_text()), sys.argv[2]),
                     indent=1, sort_keys=True))
