"""The report's opening parts: which collected tests did not run, the setup differences from P2,
the summary of claims and models, and the claims × models verdict grid. The claims come from the
registry (titles, statements, sources and units of their :class:`~claims.registry.ClaimSpec`);
a claim the records name that is not registered is shown with what the results say of it."""

from __future__ import annotations

from claims import registry

from .common import count, fmt
from .index import Index, spec_of
from .partial import declared_models

#: How a claim's unit reads in counts.
UNIT_WORDS = {"head": "heads", "layer": "layers"}


def _test_file_claims() -> dict[str, str]:
    """The claim each registered claim's test module judges, by file name (its spec's ``tests``,
    e.g. ``"claims/test_value_vectors.py"``): labels not-run node ids of a claim that left no
    record."""
    return {spec.tests.rsplit("/", 1)[-1]: spec.id for spec in registry.all_claims() if spec.tests}


def _test_function(node_id: str) -> str:
    """``claims/test_x.py::test_f[param]`` → ``test_f``."""
    return node_id.split("::")[-1].split("[", 1)[0]


def _node_model(node_id: str, models: list[str]) -> str:
    """The model a node id's parameter names (the longest model key it starts with)."""
    param = node_id.split("[", 1)[1].rstrip("]") if "[" in node_id else ""
    hits = [m for m in models if param == m or param.startswith(m + "-")]
    return max(hits, key=len) if hits else "(unknown model)"




def not_run_groups(index: Index) -> list[dict]:
    """The not-run node ids grouped by (claim, test function, model), with counts and examples."""
    func_claim = {}
    for rec in index.records:
        func_claim.setdefault(_test_function(rec.test_id or ""), rec.claim)
    # models of the declared run that left no record (a shard cut short) still name their tests
    models = sorted(set(index.models()) | set(declared_models(index.results)))
    file_claims = _test_file_claims()
    groups: dict[tuple[str, str, str], list[str]] = {}
    for node in sorted(str(n) for n in index.results["not_run"]):
        func = _test_function(node)
        file_claim = file_claims.get(node.split("::")[0].rsplit("/", 1)[-1], "?")
        key = (func_claim.get(func, file_claim), func, _node_model(node, models))
        groups.setdefault(key, []).append(node)
    return [{"claim": c, "function": f, "model": m, "count": len(ids), "examples": ids[:3]}
            for (c, f, m), ids in sorted(groups.items())]


# ------------------------------------------------------------------------------------ summary
def setup_differences(results: dict, index: Index) -> list[dict]:
    """Where this run's setup differs from P2's, read from the run's options and models.

    Each row: aspect, this run, P2 (as method §8 records it), and whether it differs.
    """
    opts = results["options"]
    infos = [index.models_info.get(m, {}) for m in index.models()]
    text_models = [i.get("key", "?") for i in infos if i.get("modality") == "text"]
    in_model = sorted(i.get("key", "?") for i in infos if i.get("standardized_qk_in_model"))
    dtype = opts.get("dtype") or results["provenance"].get("dtype") or "not recorded"
    std = opts.get("standardize")
    rows = [{
        "aspect": "Eigenvector signs",
        "ours": opts.get("sign_rule") or "each eigenvector's sign fixed so that its entry of "
                                           "largest magnitude is positive (independent of the "
                                           "eigensolver)",
        "p2": "no sign rule stated", "differs": True}]
    rows.append({
        "aspect": "Padding tokens (text models)",
        "ours": (opts.get("padding") or "excluded through the attention mask")
        + (f" — text models in this run: {', '.join(sorted(text_models))}" if text_models
           else " — no text model in this run"),
        "p2": "P2's language scripts include padding (method §1)", "differs": bool(text_models)})
    rows.append({
        "aspect": "Precision of Gram matrices and spectra",
        "ours": f"{dtype}, normalised Gram computed in log space (entries in (0, 1])",
        "p2": "exp(S) directly; P2 reports NaN for some models without key standardisation "
              "(method §1)", "differs": True})
    std_text = ("on: keys and queries standardised per token before the kernel" if std
                else "off: raw keys and queries" if std is not None else "not recorded")
    if in_model:
        std_text += f"; standardised inside the model itself: {', '.join(in_model)}"
    rows.append({
        "aspect": "Key/query standardisation", "ours": std_text,
        "p2": "standardises keys before its eigenvalue statistics (method §1); claim E here "
              "reports raw and standardised routes side by side", "differs": not std})
    conv = opts.get("axis_convention")
    conv_text = {"p2": "unit eigenvectors ‖a_m‖ = 1 (P2's convention)",
                 "kpca": "a_m/√μ_m, unit axes in feature space (not P2's convention)"}
    rows.append({"aspect": "Axis normalisation",
                 "ours": conv_text.get(conv, f"{conv!r}" if conv else "not recorded"),
                 "p2": "unit eigenvectors (method §1)", "differs": conv != "p2"})
    n_req = opts.get("n_samples_requested")
    used = sorted({(i.get("input_set") or {}).get("n_samples") for i in infos} - {None})
    rows.append({"aspect": "Samples per model",
                 "ours": f"{fmt(n_req)} requested" + (f"; used {', '.join(map(str, used))}"
                                                      if used else ""),
                 "p2": "100 (value vectors), 25 (eigenvalue statistics) (method §5)",
                 "differs": n_req != 100})
    rows.append({"aspect": "Chance level",
                 "ours": "every judged metric beside its value on a token-shuffled null (claim V: "
                         "V̂ with its tokens shuffled; claim J and γ: V with its tokens shuffled; "
                         "seeded from the test id), at chance decided by an equivalence test",
                 "p2": "not part of P2's protocol (method §2: ours)", "differs": True})
    return rows


def summary_context(results: dict, index: Index, requested: list[str] | None = None) -> dict:
    """Scope, method and result counts for the report's opening section, of the claims the run
    asked for (``requested``, default every claim of the index)."""
    claims = []
    for c in index.claims() if requested is None else requested:
        spec = spec_of(c)
        section = results["thresholds"].get(f"claim_{c.lower()}")
        described = section.get("description") if isinstance(section, dict) else None
        models_run = [m for m in index.models() if index.units(c, m) or index.model_record(c, m)]
        model_counts = count([r for m in index.models() for r in index.get(c, m, "model")])
        unit_counts = count([r for m in index.models() for r in index.units(c, m)])
        series = [r for r in index.series() if r.claim == c]
        claims.append({
            "letter": c, "title": spec.title if spec else described or f"claim {c}",
            "source": spec.source if spec else "", "statement": spec.statement if spec else "",
            "models_run": models_run, "model_counts": model_counts,
            "unit_counts": unit_counts, "series_counts": count(series),
            "n_series": len(series),
            "units": UNIT_WORDS.get(spec.unit if spec else "", "units"),
        })
    models = []
    for m in index.models():
        info = index.models_info.get(m, {})
        inp = info.get("input_set") or {}
        layers, heads = index.layers_heads(m)
        models.append({
            "key": m, "label": info.get("label", "not recorded (no provenance for this model)"),
            "modality": info.get("modality", "—"), "control": bool(info.get("control")),
            "shape": (f"{fmt(info.get('n_layers'))} layers × {fmt(info.get('n_heads'))} heads × "
                      f"head dim {fmt(info.get('head_dim'))}"),
            "selection": f"{len(layers)} layers × {len(heads)} heads checked",
            "inputs": (f"{fmt(inp.get('n_samples'))} {plural(inp.get('kind'), inp.get('n_samples'))}"
                       f" from {inp.get('source', 'unrecorded source')}") if inp else "not recorded",
        })
    return {"claims": claims, "models": models,
            "differences": setup_differences(results, index),
            "options": results["options"], "n_records": len(results["records"])}



def grid_context(results: dict, index: Index, not_run: list[dict]) -> dict:
    """The claims × models verdict grid: the model-level verdict and the unit verdict counts."""
    pending = {(g["claim"], g["model"]) for g in not_run}
    rows = []
    for m in index.models():
        info = index.models_info.get(m, {})
        cells = []
        for c in index.claims():
            rec = index.model_record(c, m)
            units = index.units(c, m)
            counts = count(units)
            spec = spec_of(c)
            unit_name = UNIT_WORDS.get(spec.unit if spec else "", "units")
            if rec is None and not units:
                cells.append({"claim": c, "verdict": None, "word": "not run",
                              "counts": [], "note": "interrupted" if (c, m) in pending else
                              "no record for this claim and model"})
                continue
            note = "" if rec else ("model-level test not run" if (c, m) in pending or
                                   not results["complete"] else "no model-level record")
            cells.append({"claim": c, "verdict": rec.verdict if rec else None,
                          "word": rec.verdict if rec else "no model verdict",
                          "counts": [(v, n) for v, n in counts.items() if n],
                          "n_units": len(units), "unit_name": unit_name, "note": note})
        rows.append({"model": m, "control": bool(info.get("control")),
                     "label": info.get("label", ""), "cells": cells})
    return {"claims": index.claims(), "rows": rows}


def plural(kind: str | None, n) -> str:
    """``image`` → ``images`` for a count other than 1 (the input set records its kind singular)."""
    if not kind:
        return "inputs"
    return kind if n == 1 or kind.endswith("s") else f"{kind}s"

