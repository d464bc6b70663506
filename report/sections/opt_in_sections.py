"""The report sections of the opt-in analyses (method §14): the specification curve
(results.json ``specification_curve``), claims across training (``training_dynamics``) and the
spread over training seeds (``seed_spread``). Each builds a plain context for its part of
report/templates/opt_in.html.j2; a results file without the field gets no section."""

from __future__ import annotations

from ..common import VERDICTS, fmt

#: What each curve entry judges, in words a reader needs no method document for.
ENTRY_TITLES = {
    "V": "Claim V: value vectors are the Gram eigenvectors (model verdict)",
    "J": "Claim J: attention minimises the KPCA projection loss (model verdict)",
    "E": "Claim E: Gram eigenvalue statistics are reproducible (model verdict)",
    "E-gamma": "Claim E: γ constancy of the recovered axes (one verdict per head)",
}
UNIT_WORDS = {"head": "heads", "layer": "layers"}
ORDER = {v: i for i, v in enumerate(("supported", "inconclusive", "undetermined", "refuted"))}


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.0f}%"


def _moving(effects: dict, grid: dict) -> list[dict]:
    """The axes that move a verdict, most first: label, flips and share of comparisons."""
    rows = [{"axis": grid.get(a, {}).get("label", a), "name": a, "flips": e["flips"],
             "comparisons": e["comparisons"], "share": _pct(e["share"])}
            for a, e in effects.items() if e["flips"]]
    return sorted(rows, key=lambda r: -r["flips"] / max(r["comparisons"], 1))


def _cells(specs: list[dict], unit: str | None) -> list[dict]:
    """One cell per specification, sorted by verdict (model entries) or by the share of refuted
    units; each says its name, verdict (or unit counts) and whether it is the default."""
    cells = []
    for i, s in enumerate(specs):
        cell = {"name": s["name"], "default": i == 0, "verdict": s.get("verdict"),
                "reason": s.get("reason"), "bars": None, "counts": None}
        if unit is not None and s.get("units"):
            n = len(s["units"])
            cell["bars"] = [{"verdict": v, "share": 100 * sum(1 for u in s["units"] if u == v) / n}
                            for v in ORDER if any(u == v for u in s["units"])]
            cell["counts"] = s.get("unit_counts") or {}
            cell["refuted_share"] = sum(1 for u in s["units"] if u == "refuted") / n
        cells.append(cell)
    if any(c["verdict"] for c in cells):
        return sorted(cells, key=lambda c: (ORDER.get(c["verdict"], 9), not c["default"]))
    return sorted(cells, key=lambda c: (c.get("refuted_share", 0), not c["default"]))


def _with_bounds(spec: dict) -> dict:
    """A specification's headline metrics for the table; a metric known only between bounds
    (claim V's optimal cosine where no verdict needed the matching, method §14.1) as
    ``"0.31–0.62 (bounds)"``."""
    out = dict(spec.get("metrics") or {})
    for name, (lo, hi) in (spec.get("bounds") or {}).items():
        if out.get(name) is None:
            out[name] = f"{fmt(lo)}–{fmt(hi)} (bounds)"
    return out


def _same_rules(entry: dict) -> dict:
    """The verdict every specification judged by this run's rule set gives (None when they
    differ), and that rule set: ``{"rules", "survives_rules", "n_rules"}``."""
    specs = entry["specifications"]
    rules = specs[0]["axes"].get("rules")
    same = [s.get("verdict") for s in specs if s["axes"].get("rules") == rules]
    return {"rules": rules, "n_rules": len(same),
            "survives_rules": same[0] if same and all(v == same[0] for v in same) else None}


def curve_context(results: dict) -> dict | None:
    data = results.get("specification_curve")
    if not isinstance(data, dict) or not data.get("models"):
        return None
    grid = data.get("grid", {})
    entries = []
    for entry, title in ENTRY_TITLES.items():
        rows = []
        for model, curve in data["models"].items():
            e = curve["entries"].get(entry)
            if e is None:
                continue
            unit = e.get("unit")
            row = {"model": model, "n": e["n_specifications"], "cells": _cells(e["specifications"], unit if entry == "E-gamma" else None),
                   "default": e["specifications"][0]["name"], "unit": unit, "has_model": False,
                   "shares": None, "survives": None, "default_verdict": None, "moving": [],
                   "units": None}
            if "model" in e:
                m = e["model"]
                row.update(has_model=True, shares=[(v, _pct(m["shares"].get(v))) for v in VERDICTS
                                   if m["shares"].get(v)],
                           survives=m["survives"], default_verdict=m["default_verdict"],
                           moving=_moving(m["axis_effects"], grid))
            if "units" in e and unit:
                u = e["units"]
                row["units"] = {"n": u["n_units"], "robust": u["robust"],
                                "robust_counts": {k: v for k, v in u["robust_counts"].items() if v},
                                "shares": [(v, _pct(u["shares"].get(v))) for v in VERDICTS
                                           if u["shares"].get(v)],
                                "moving": _moving(u["axis_effects"], grid),
                                "word": UNIT_WORDS.get(unit, unit + "s")}
            row["table"] = [{"name": s["name"], "verdict": s.get("verdict"),
                             "counts": s.get("unit_counts"), "reason": s.get("reason"),
                             "metrics": _with_bounds(s)} for s in e["specifications"]]
            rows.append(row)
        if rows:
            entries.append({"entry": entry, "title": title, "rows": rows,
                            "anchor": "curve-" + entry.lower()})
    check = data.get("default_matches_main") or {}
    axes = [{"name": n, "label": a.get("label", n), "choices": a.get("values", []),
             "claims": ", ".join(a.get("claims", [])), "stage": a.get("stage"),
             "modality": a.get("modality"), "why": a.get("why", "")} for n, a in grid.items()]
    headline = []
    for e in entries:
        for r in e["rows"]:
            if r["has_model"]:
                headline.append({"entry": e["entry"], "model": r["model"], "survives": r["survives"],
                                 "default": r["default_verdict"],
                                 **_same_rules(data["models"][r["model"]]["entries"][e["entry"]])})
    return {"entries": entries, "axes": axes, "check": check, "headline": headline,
            "seconds": data.get("seconds"), "cpu_seconds": data.get("cpu_seconds")}


def _ci(x: dict | None) -> str:
    if not x or x.get("value") is None:
        return "—"
    ci = x.get("ci")
    v = x["value"]
    return f"{v:.4g}" + (f" [{ci[0]:.4g}, {ci[1]:.4g}]" if ci else "")


def _change(c: dict) -> str:
    if c.get("delta") is None:
        return "—"
    ci = c.get("ci")
    return f"{c['delta']:+.4g}" + (f" [{ci[0]:+.4g}, {ci[1]:+.4g}]" if ci else "")


#: How the report names the changes that ``[claim_v_training]`` judges (claims/dynamics.py).
JUDGED_NAMES = {"subspace_overlap_excess": "claim V's subspace-overlap excess over its token-shuffled "
                                          "null, (overlap − null)/(1 − null)",
                **{m: f"claim V's {m.replace('_', ' ')}" for m in
                   ("optimal_cosine", "linear_cka", "kernel_cka", "subspace_overlap")},
                **{f"{m}_vs_null": f"claim V's {m.replace('_', ' ')} minus its null" for m in
                   ("optimal_cosine", "linear_cka", "kernel_cka")}}


def dynamics_context(results: dict) -> list[dict]:
    data = results.get("training_dynamics")
    if not isinstance(data, dict):
        return []
    out = []
    for name, s in data.get("series", {}).items():
        rows = [{"step": r["step"], "acc": r.get("test_accuracy"),
                 "oc": _ci(r["V"]["metrics"]["optimal_cosine"]),
                 "lc": _ci(r["V"]["metrics"]["linear_cka"]),
                 "kc": _ci(r["V"]["metrics"]["kernel_cka"]),
                 "ov": _ci(r["V"]["metrics"]["subspace_overlap"]),
                 "v": r["V"]["verdicts"], "gamma": _ci(r["E"]["gamma_position"]),
                 "e": r["E"]["verdicts"], "j": _ci(r["J"]["j_proj"]),
                 "ratio": r["J"]["log10_ratio"], "p1": r["J"]["p1_code_log_mean_error"]}
                for r in s["trajectory"]]
        ch = s["change"]
        changes = [{"what": f"claim V {m.replace('_', ' ')}", "first": ch["V"][m]["first"],
                    "last": ch["V"][m]["last"], "change": _change(ch["V"][m]),
                    "vs_null": _change(ch["V"][f"{m}_vs_null"])}
                   for m in ("optimal_cosine", "linear_cka", "kernel_cka", "subspace_overlap")]
        if "subspace_overlap_excess" in ch["V"]:  # the change [claim_v_training] judges
            ex = ch["V"]["subspace_overlap_excess"]
            changes.append({"what": "claim V subspace-overlap excess (overlap − null)/(1 − null), "
                                    "judged", "first": ex["first"], "last": ex["last"],
                            "change": _change(ex), "vs_null": "—"})
        changes.append({"what": "claim E γ position (0 = eigenvectors, 1 = perturbed control)",
                        "first": ch["E"]["gamma_position"]["first"],
                        "last": ch["E"]["gamma_position"]["last"],
                        "change": _change(ch["E"]["gamma_position"]), "vs_null": "—"})
        changes.append({"what": "claim J J_proj", "first": ch["J"]["j_proj"]["first"],
                        "last": ch["J"]["j_proj"]["last"], "change": _change(ch["J"]["j_proj"]),
                        "vs_null": "—"})
        t = s["trends"]
        out.append({"name": name, "steps": s["steps"], "rows": rows, "changes": changes,
                    "from_step": ch["from_step"], "to_step": ch["to_step"],
                    "verdict": s["training_moves_v_towards_v_hat"], "n": s["n_samples"],
                    "judged": [JUDGED_NAMES.get(m, m)
                               for m in s["training_moves_v_towards_v_hat"].get("judged", ())],
                    "rho_j": t["spearman_j"], "rho_gamma": t["spearman_gamma_position"],
                    "p1": t["spearman_p1_code"]})
    return out


def seeds_context(results: dict) -> dict | None:
    data = results.get("seed_spread")
    if not isinstance(data, dict) or not data.get("models"):
        return None
    models = []
    for name, m in data["models"].items():
        rows = []
        for claim, by_rules in m["distribution"].items():
            for rule_set, dist in by_rules.items():
                rows.append({"claim": claim, "rules": rule_set,
                             "dist": sorted(dist.items(), key=lambda kv: ORDER.get(kv[0], 9)),
                             "unanimous": m["unanimous"][claim][rule_set]})
        spread = [{"claim": c, "metric": k, **v} for c, ms in m["metric_spread"].items()
                  for k, v in ms.items()]
        models.append({"name": name, "n": m["n_seeds"], "rows": rows, "spread": spread,
                       "seeds": m["seeds"], "rules": m["rules"]})
    return {"models": models, "n_seeds": data.get("n_seeds"), "min_for_statement": 5}


def context(results: dict) -> dict:
    """The opt-in sections' context: ``curve``, ``dynamics`` and ``seeds`` (None/empty when the
    run did not ask for them) and ``n``, how many sections there are."""
    curve, dyn, seeds = curve_context(results), dynamics_context(results), seeds_context(results)
    return {"curve": curve, "dynamics": dyn, "seeds": seeds,
            "n": int(curve is not None) + int(bool(dyn) or seeds is not None)}
