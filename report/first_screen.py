"""The report's first screen: does P1 hold here, and how sure are we?

Above everything else, at 1400 px within the first 1000 px: the claims × models verdict grid
(each cell the model-level verdict, its judged numbers with their 95% interval and null, and the
unit counts), one sentence per claim saying how it is judged (the rule of the run's rule set),
and three lines on what the verdicts rest on: the controls (all as expected, which failed, which
were underpowered), whether the run reproduces the shipped reference, and whether it is complete.

Only claims the run asked for are shown: a registered claim without a record, a test that did
not run or a skip (claim R in a run without ``--rpc``) is named once as not requested, never as
missing.
"""

from __future__ import annotations

from collections.abc import Mapping

from .common import fmt
from .index import Index, spec_of
from .overview import _test_file_claims

#: How the first screen names a metric (raw keys of the records elsewhere stay in code font).
METRIC_WORDS = {
    "subspace_overlap_excess": "overlap excess over chance",
    "top_weighted_share": "top-weighted share", "shared_directions": "directions shared",
    "optimal_cosine": "optimal cosine", "linear_cka": "linear CKA", "kernel_cka": "kernel CKA",
    "output_r2": "output-fit R²", "output_r2_excess": "output-fit R² excess over chance",
    "fit_median_log10_ratio": "median log10 ‖h*‖²/‖φ(q)‖² at the fit",
    "fit_bessel_share": "Bessel share at the fit", "log10_ratio": "log10 ‖h‖²/‖φ(q)‖²",
    "bessel_share": "Bessel share", "max_route_ratio": "largest route ratio",
    "naive_finite_share": "finite share of the naive float32 route",
    "raw_vs_standardized_ratio": "raw vs standardised ratio",
    "gamma_position": "γ position", "gamma_subspace_position": "γ subspace position",
    "gamma_direction_position": "γ direction position", "min_j_proj": "smallest J_proj",
    "spearman_j": "Spearman ρ(J_proj, step)",
}
_DIRECTION = {">=": "≥", "<=": "≤", ">": ">", "<": "<"}


def metric_words(name: str) -> str:
    """A metric key as words (``subspace_overlap_excess`` → ``overlap excess over chance``)."""
    return METRIC_WORDS.get(name) or str(name).replace("_", " ").replace(" cka", " CKA")


# ------------------------------------------------------------------------------ requested claims
def requested_claims(results: dict, full_index: Index) -> tuple[list[str], list[str]]:
    """(claims the run asked for, registered claims it did not ask for). A claim is asked for
    when any record (a control's included), a not-run test or a skipped test names it."""
    asked = {r.claim for r in full_index.records}
    file_claims = _test_file_claims()
    for node in [*(results.get("not_run") or []), *(results.get("skipped") or {})]:
        claim = file_claims.get(str(node).split("::")[0].rsplit("/", 1)[-1])
        if claim:
            asked.add(claim)
    every = full_index.claims()
    return [c for c in every if c in asked], [c for c in every if c not in asked]


# ------------------------------------------------------------------------------ rules in words
def _rule_section(results: dict, claim: str) -> dict:
    spec = spec_of(claim)
    section = results["thresholds"].get(spec.section if spec else f"claim_{claim.lower()}")
    return section if isinstance(section, dict) else {}


def _ruleset_tables(section: dict, rules: str) -> tuple[dict, dict, dict]:
    """(supported, refuted, the ours extras) of a rule section under the run's rule set."""
    ours = section.get("ours") if isinstance(section.get("ours"), dict) else {}
    if rules == "ours" and ("supported" in ours or "refuted" in ours):
        return ours.get("supported") or {}, ours.get("refuted") or {}, ours
    return section.get("supported") or {}, section.get("refuted") or {}, ours if rules == "ours" else {}


def _bars(table: dict) -> list[str]:
    return [f"{metric_words(m)} {_DIRECTION.get(r.get('direction'), r.get('direction'))} "
            f"{fmt(r.get('value'))}" for m, r in table.items() if isinstance(r, dict)]


def judged_metrics(results: dict, claim: str) -> list[str]:
    """The metrics the run's rule set judges a claim's model-level record on."""
    sup, ref, _ = _ruleset_tables(_rule_section(results, claim), results["options"].get("rules", "ours"))
    names: list[str] = []
    for m in [*sup, *ref]:
        if isinstance((sup.get(m) or ref.get(m)), dict) and m not in names:
            names.append(m)
    return names


def rule_sentence(results: dict, claim: str) -> str:
    """How a claim's model-level verdict is decided, in one sentence (from the run's thresholds)."""
    rules = results["options"].get("rules", "ours")
    section = _rule_section(results, claim)
    sup, ref, extra = _ruleset_tables(section, rules)
    if not sup and not ref:
        return f"rule set {rules}, whose thresholds record no rule for this claim"
    over = " over the whole 95% interval" if rules == "ours" else " on the mean over samples"
    mode = extra.get("refuted_mode", section.get("refuted_mode", "all"))
    parts = []
    if sup:
        parts.append("supported when " + " and ".join(_bars(sup)) + over)
    refuted = _bars(ref)
    chance = [metric_words(m) for m in extra.get("at_chance_metrics") or []] if rules == "ours" else []
    refuted += [f"{m} at chance (equivalence test)" for m in chance]
    if refuted:
        parts.append("refuted when " + (" or " if mode == "any" or chance else " and ").join(refuted))
    return f"rule set {rules}: " + "; ".join(parts) + "; inconclusive otherwise"


# ------------------------------------------------------------------------------ judged numbers
def judged_numbers(rec, names: list[str]) -> list[str]:
    """``overlap excess over chance 0.103 [0.099, 0.107], null 0.11`` for each judged metric
    with a value on the record."""
    out = []
    for name in names:
        value = rec.metric(name)
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            continue
        text = f"{metric_words(name)} {fmt(value)}"
        interval = rec.lookup("ci", name)
        if isinstance(interval, (list, tuple)) and len(interval) == 2:
            text += f" [{fmt(interval[0])}, {fmt(interval[1])}]"
        n = rec.lookup("null", name)
        if isinstance(n, (int, float)) and not isinstance(n, bool) and n != 0:
            text += f", null {fmt(n)}"
        out.append(text)
    return out


def tier_numbers(rec) -> list[str]:
    """For a partial record (claim V, method §2.6), what its tier was judged on, first:
    ``top-weighted share 0.178 [0.172, 0.184], null 0.092, random-init twin 0.127``."""
    twin = rec.get("init_twin") if isinstance(rec, Mapping) else None
    if rec.verdict != "partial" or not twin:
        return []
    text = judged_numbers(rec, ["top_weighted_share"])
    return [f"{t}, random-init twin {fmt(twin.get('top_weighted_share'))}" for t in text]


def short_reason(reason: str | None, limit: int = 110) -> str:
    """An undetermined record's reason cut to a cell's measure (the whole in the cell's title)."""
    text = str(reason or "no reason recorded")
    if ": " in text and text.index(": ") < 90 and "have no value" in text[:text.index(": ")]:
        text = text.split(": ", 1)[1]  # "a, b have no value: why" → "why"
    return text if len(text) <= limit else text[:limit].rsplit(" ", 1)[0] + " …"


# ------------------------------------------------------------------------------ the run's state
#: What an exit status says (fixtures/plugin/state.py owns the codes; the report reads them).
EXIT_WORDS = {0: "every claim test supported", 1: "some claim not supported: the run's finding, "
              "not a fault", 2: "interrupted", 3: "an internal error", 5: "nothing collected",
              6: "a regression against the baseline", 7: "a fault of the machine",
              8: "a control got a verdict it cannot have (an instrument failure)",
              9: "nothing judged: no claim test reached a verdict"}


def control_outcome(rec: dict) -> str:
    """``failed``, ``met``, ``underpowered`` or ``none`` (no expectation) for a control record:
    its ``expected.outcome`` as the run wrote it (fixtures/models/controls.py: ``as_expected``,
    ``instrument_failure``, ``underpowered``, ``no_expectation``), else ``expected.met``. An
    underpowered control (too few samples to reach its expected verdict) is read from the record,
    never decided here; it is neither a hit nor a miss."""
    expected = rec.get("expected") if isinstance(rec.get("expected"), dict) else {}
    outcome = expected.get("outcome", rec.get("control_outcome"))
    if outcome in _OUTCOMES:
        return _OUTCOMES[outcome]
    if expected.get("met") is False:
        return "failed"
    if expected.get("met") is True:
        return "met"
    return "none"


_OUTCOMES = {"as_expected": "met", "instrument_failure": "failed", "underpowered": "underpowered",
             "no_expectation": "none"}


def controls_state(results: dict) -> dict | None:
    """The controls in one line (None without controls): ``kind`` ok / bad / note, a sentence,
    and the counts by outcome, the records without an expectation counted apart."""
    records = [r for r in results["records"] if r.get("control")]
    if not records:
        return None
    n = {k: 0 for k in ("met", "failed", "underpowered", "none")}
    roles: dict[str, int] = {}
    failed_models: list[str] = []
    for r in records:
        outcome = control_outcome(r)
        n[outcome] += 1
        roles[r["control"]] = roles.get(r["control"], 0) + 1
        if outcome == "failed" and r["model"] not in failed_models:
            failed_models.append(r["model"])
    judged = n["met"] + n["failed"]
    models = len({r["model"] for r in records})
    if n["failed"]:
        text = (f"{n['failed']} instrument failure{'s' if n['failed'] != 1 else ''}: "
                f"{n['met']} of {judged} control records with an expectation as expected; "
                f"failed on {', '.join(sorted(failed_models)[:4])}"
                + (f" and {len(failed_models) - 4} more" if len(failed_models) > 4 else "")
                + ". The same rules judge the models under test")
        kind = "bad"
    else:
        text = (f"all {judged} control records with an expectation as expected "
                f"({models} control{'s' if models != 1 else ''})")
        kind = "ok"
    extra = []
    if n["underpowered"]:
        extra.append(f"{n['underpowered']} underpowered (too few samples to power the control; "
                     "neither as expected nor failed)")
        kind = "note" if kind == "ok" else kind
    if n["none"]:
        extra.append(f"{n['none']} without an expectation (claims a control makes no promise "
                     "for), shown, not judged")
    return {"kind": kind, "text": text + ("; " + "; ".join(extra) if extra else "") + ".",
            "counts": n, "judged": judged, "records": len(records)}


def completeness_state(results: dict, reasons: list[str]) -> dict:
    status = results.get("exit_status")
    words = EXIT_WORDS.get(status) if isinstance(status, int) else None
    exit_text = f"exit status {fmt(status)}" + (f" ({words})" if words else "")
    n_records = len(results["records"])
    merged = (results.get("provenance") or {}).get("merged_from")
    if merged:
        exit_text = f"a merge of {len(merged)} shard{'s' if len(merged) != 1 else ''}; " + exit_text
    if results["complete"] and not results["not_run"]:
        return {"kind": "ok", "text": f"complete: every collected claim test ran and left a record "
                                      f"({n_records} records); {exit_text}."}
    n_not_run = len(results["not_run"])
    why = "; ".join(reasons) if reasons else f"{n_not_run} collected claim tests did not run"
    return {"kind": "bad", "text": f"partial: {why}; {n_records} records; {exit_text}. "
                                   "The summary lists what did not run."}


def _same_selection(results: dict, reference: dict) -> str | None:
    """None when a run has the shipped reference's selection (models, options, claim tests);
    else why not, in a few words."""
    from .diff import FREE_OPTIONS, _record_id

    mine, theirs = set(results.get("models") or {}), set(reference.get("models") or {})
    if mine != theirs:
        return (f"models differ from the reference's ({len(mine - theirs)} not in it, "
                f"{len(theirs - mine)} of its {len(theirs)} not here)")
    a, b = results.get("options") or {}, reference.get("options") or {}
    for key in sorted(set(a) | set(b)):
        if key not in FREE_OPTIONS and a.get(key) != b.get(key):
            return f"option {key} is {fmt(a.get(key))}, the reference's {fmt(b.get(key))}"
    if {_record_id(r) for r in results["records"]} != {_record_id(r) for r in reference["records"]}:
        return "other claim tests than the reference's (another layer, head or claim selection)"
    return None


def reproduce_state(results: dict, reference_path=None) -> dict:
    """Whether the run reproduces the shipped reference (``reference/results.json``): the
    reference-weights status of its models and, when the selection is the reference's (the
    default run), ``report diff``'s headline; read from the reference file of this checkout."""
    import json
    from pathlib import Path

    from .diff import NOT_COMPARABLE, REPRODUCES, compare, headline
    from .reference import REFERENCE
    from .reference_weights import annotate, not_reference

    path = Path(reference_path or REFERENCE)
    try:
        reference = json.loads(path.read_text(encoding="utf-8"))
        assert isinstance(reference.get("records"), list)
    except (OSError, ValueError, AssertionError, AttributeError):
        return {"kind": "note", "text": "not compared: no shipped reference "
                                        "(reference/results.json) could be read.", "notes": []}
    models = results.get("models") or {}
    if not all("reference_weights" in m for m in models.values() if isinstance(m, dict)):
        models = annotate({k: m for k, m in models.items() if isinstance(m, dict)},
                          {k: m.get("checkpoint_hash") for k, m in reference["models"].items()})
    notes = not_reference(models)
    why_not = _same_selection(results, reference)
    if why_not:
        return {"kind": "note", "notes": notes, "text": (
            f"not the default run's selection, so nothing to compare with the shipped reference: "
            f"{why_not} (python -m report diff compares any two runs).")}
    d = compare(results, reference)
    kind = {REPRODUCES: "ok", NOT_COMPARABLE: "note"}.get(d.status, "bad")
    return {"kind": kind, "notes": notes, "text": headline(d).replace(" the reference", " the "
            "shipped reference (reference/results.json)", 1) + "."}


# ------------------------------------------------------------------------------ the grid
def enrich_grid(grid: dict, results: dict, index: Index, claims: list[str]) -> dict:
    """The verdict grid of :func:`report.overview.grid_context` with the requested claims only,
    each cell with its judged numbers (or, undetermined, why) and its note's kind: ``bad`` for
    a test that was interrupted, ``plain`` for a claim a model has no record of."""
    keep = [i for i, c in enumerate(grid["claims"]) if c in claims]
    names = {c: judged_metrics(results, c) for c in claims}
    for row in grid["rows"]:
        row["cells"] = [row["cells"][i] for i in keep]
        for cell in row["cells"]:
            rec = index.model_record(cell["claim"], row["model"])
            cell["judged"] = (tier_numbers(rec) + judged_numbers(rec, names[cell["claim"]])
                              if rec else [])
            cell["reason"] = (short_reason(rec.reason) if rec is not None
                              and rec.verdict == "undetermined" else "")
            cell["title"] = str(rec.reason or "") if rec is not None else ""
            cell["note_kind"] = "bad" if cell.get("note") in ("interrupted",
                                                              "model-level test not run") else "plain"
    return {**grid, "claims": [grid["claims"][i] for i in keep]}


def claim_lines(results: dict, claims: list[str], not_requested: list[str]) -> dict:
    """One sentence per requested claim (title, source, how it is judged), and the claims the
    run did not ask for in one line."""
    lines = []
    for c in claims:
        spec = spec_of(c)
        lines.append({"letter": c, "title": spec.title if spec else f"claim {c}",
                      "source": spec.source if spec else "", "rule": rule_sentence(results, c)})
    skipped = [_not_requested(c) for c in not_requested]
    return {"lines": lines, "not_requested": skipped}


def _not_requested(claim: str) -> str:
    """A claim the run did not ask for, with how to ask for it where its tests carry a marker."""
    spec = spec_of(claim)
    text = f"claim {claim} ({spec.title if spec else claim})"
    marker = (getattr(spec, "extra", None) or {}).get("marker") if spec else None
    return f"{text}, asked for with pytest claims/ -m {marker}" if marker else text
