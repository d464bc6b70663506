"""The shipped reference results and the README numbers generated from them.

``reference/results.json`` is the judged part of the results of command 1 (``pytest claims/``
on the default models, every option at its default): provenance (commit, versions, numeric
environment), options, rules, models (weight hashes, inputs) and every record without its
evidence text (which is made from the record's numbers) and without timings. Users compare their
own run with it (``python -m report diff``, docs/reproduce.md); the README's block between
:data:`BEGIN` and :data:`END` is generated from it (:func:`readme_block`), never typed.

``python -m report reference --write`` regenerates both: it runs command 1 in a subprocess on a
fresh output folder (the cache is reused: it is keyed by code, options and weights), keeps the
judged part and rewrites the README block. The trained models it checks are the shipped weights
(``fixtures/data/trained/``), which it leaves as they are: they change only with
``python -m fixtures.training.ship --write`` (docs/reproduce.md).
``--from RESULTS`` skips the run and takes an existing results.json of command 1.
``python -m report reference --check`` exits 1 when the README block and the reference disagree.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

from claims.registry import all_claims

from .atomic import atomic_write_text

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "reference" / "results.json"
#: The reference of CI's smoke selection (.ci/run compares its smoke run with it).
SMOKE = ROOT / "reference" / "smoke.json"
SMOKE_SELECTION = ("--models", "default", "--layers", "0", "--heads", "0,1", "--n-samples", "8")
README = ROOT / "README.md"
BEGIN = "<!-- reference:begin"
END = "<!-- reference:end -->"
#: Command 1 as ``--write`` runs it (README): the default models, every option at its default.
COMMAND_1 = ("-m", "pytest", "claims/", "-n", "2", "-p", "no:cacheprovider", "--report", "none")
#: Fields of a results.json that are timings or local paths, not results.
DROP_TOP = ("durations",)
DROP_RECORD = ("evidence",)
VERDICTS = ("supported", "partial", "refuted", "inconclusive", "undetermined")  # every count shown


def judged_part(results: dict) -> dict:
    """``results`` without the evidence text, the timings and the local checkpoint folders."""
    out = {k: v for k, v in results.items() if k not in DROP_TOP}
    out["records"] = [_strip_record(r) for r in results["records"]]
    return out


def _strip_record(rec: dict) -> dict:
    rec = {k: v for k, v in rec.items() if k not in DROP_RECORD}
    if isinstance(rec.get("series"), list):  # checkpoint files: by name (the cache folder is local)
        rec["series"] = [dict(p, checkpoint=Path(p["checkpoint"]).name)
                         if isinstance(p, dict) and isinstance(p.get("checkpoint"), str) else p
                         for p in rec["series"]]
    return rec


# ----------------------------------------------------------------------------- README block
def _num(x, digits: int = 3) -> str:
    if x is None:
        return "undefined"
    text = f"{x:.{digits}g}" if abs(x) < 1e4 else f"{x:.{digits}g}".replace("e+", "e")
    return text.replace("-", "−")


def _with_ci(rec: dict | None, metric: str) -> str:
    if rec is None:
        return "—"
    value = (rec.get("metrics") or {}).get(metric)
    ci = (rec.get("ci") or {}).get(metric)
    return _num(value) + (f" [{_num(ci[0])}, {_num(ci[1])}]" if ci else "")


def _share_cell(rec: dict) -> str:
    """Claim V's top-weighted share with its interval, null and random-init twin, and the shared
    directions beside the twin's (method §2.6); "" for a record without a twin."""
    twin = rec.get("init_twin") or {}
    metrics, null = rec.get("metrics") or {}, rec.get("null") or {}
    if not twin or "top_weighted_share" not in metrics:
        return ""
    return (f"top-weighted share {_with_ci(rec, 'top_weighted_share')} (null "
            f"{_num(null.get('top_weighted_share'))}, random-init twin "
            f"{_num(twin.get('top_weighted_share'))}), {_num(metrics.get('shared_directions'))} "
            f"directions shared (twin {_num(twin.get('shared_directions'))})")


def _counts(recs: list[dict], rules: str = "ours") -> str:
    c = Counter((r.get("verdicts") or {}).get(rules, r.get("verdict")) for r in recs)
    return ", ".join(f"{c[v]} {v}" for v in VERDICTS if c[v]) or "—"


def _one(recs: list[dict], claim: str, level: str) -> dict | None:
    found = [r for r in recs if r["claim"] == claim and r.get("level") == level]
    return found[0] if found else None


def _j_model_cell(rec: dict | None) -> str:
    """Claim J's model record in robust numbers (method §3.6, §3.7): the `ours` verdict with the
    output fit's excess over its null and the null's R², then the per-token median log10
    ‖h‖²/‖φ‖² and P2's trimmed median. No interval on the pooled ratio of means: a handful of
    tokens carry it."""
    if rec is None:
        return "—"
    m, tokens = rec.get("metrics") or {}, rec.get("tokens") or {}
    verdict = (rec.get("verdicts") or {}).get("ours", rec.get("verdict"))
    null = (rec.get("output_fit") or {}).get("output_r2_null")
    if m.get("output_r2_excess") is not None:
        fit = (f"fit excess {_with_ci(rec, 'output_r2_excess')}"
               + (f" (null R² {_num(null, 4)})" if null is not None else ""))
    else:
        fit = f"no fit room (null R² {_num(null, 6)})" if null is not None else "no fit"
    per_token = (f"; per-token median log10 ratio {_num(tokens.get('median_log10_ratio'))}, "
                 f"trimmed {_num(tokens.get('p2_appendix_log10_ratio'))}"
                 if tokens.get("median_log10_ratio") is not None else "")
    return f"**{verdict}**: {fit}{per_token}"


def _decoder_notes(info: dict, recs: list[dict], model_rec: dict | None) -> str:
    """What a model's row says beyond its key: its quantisation label, claims V and E judged per
    KV head (grouped-query attention, method §5.7), the layers checked when not all of them (a
    model's default layers), whether a causal decoder's first token is among the tokens (§5.8)."""
    notes = list(dict.fromkeys(r["quantised"] for r in recs if r.get("quantised")))
    if any(r.get("kv_head") is not None for r in recs):
        notes.append("V and E heads are KV heads")
    layers = (model_rec or {}).get("layers")
    if isinstance(layers, list) and isinstance(info.get("n_layers"), int) \
            and len(layers) < info["n_layers"]:
        notes.append(f"layers {', '.join(map(str, layers))} of {info['n_layers']}")
    first = {r.get("first_token") for r in recs} - {None}
    if first:
        notes.append(f"first token {'/'.join(sorted(first))}")
    return f" ({'; '.join(notes)})" if notes else ""


def skipped_claims(skipped: dict, model: str) -> dict[str, str]:
    """{claim: why} for the claims a model's tests were all skipped for without a record (results'
    ``skipped``): the reason's clause after "for MODEL: " (claim J under a causal mask)."""
    out = {}
    for node, reason in (skipped or {}).items():
        spec = next((c for c in all_claims() if c.tests and node.startswith(c.tests + "::")), None)
        if spec is None or f"[{model}" not in node:
            continue
        why = reason.split(f"for {model}: ", 1)[-1].split(": ", 1)[0]
        why = why.removeprefix(f"claim {spec.id} ").removeprefix("is ").strip()
        out.setdefault(spec.id, re.sub(r" \((method §[\d.]+)\)$", r", \1", why))
    return out


def _model_row(key: str, info: dict, recs: list[dict], skipped: dict | None = None) -> str:
    heads_v = [r for r in recs if r["claim"] == "V" and r.get("level") == "head"]
    v_model = _one(recs, "V", "model")
    j_layers = [r for r in recs if r["claim"] == "J" and r.get("level") == "layer"]
    j_model, j_series = _one(recs, "J", "model"), _one(recs, "J", "series")
    e_model = _one(recs, "E", "model")
    gamma = [r for r in recs if r["claim"] == "E" and r.get("level") == "head"]
    name = key
    if j_series and j_series.get("series"):
        acc = j_series["series"][-1].get("test_accuracy")
        if acc is not None:
            name += f" (test acc. {acc:.3f})"
    if info.get("control"):
        name += " (control)"
    name += _decoder_notes(info, recs, v_model or e_model)
    v_heads = f"{_counts(heads_v, 'p2')} → **{_counts(heads_v)}**" if heads_v else "—"
    if v_model:
        vv = v_model.get("verdicts") or {}
        null = (v_model.get("null") or {}).get("optimal_cosine")
        ours = vv.get("ours", v_model["verdict"])
        parts = [f"overlap excess {_with_ci(v_model, 'subspace_overlap_excess')}",
                 _share_cell(v_model)]
        parts = [p for p in (parts[::-1] if ours == "partial" else parts) if p]
        v_mod = (f"{vv.get('p2')} → **{ours}**: " + "; ".join(parts) + "; optimal cosine "
                 f"{_num((v_model.get('metrics') or {}).get('optimal_cosine'))}"
                 + (f" (null {_num(null)})" if null is not None else ""))
    else:
        v_mod = "—"
    j = f"{_counts(j_layers)}; {_j_model_cell(j_model)}" if j_layers or j_model else "—"
    if j == "—" and (skipped or {}).get("J"):  # skipped without a verdict: say why
        j = f"— ({skipped['J']})"
    trend = "—"
    if j_series:
        m = j_series.get("metrics") or {}
        tv = j_series.get("verdicts") or {}
        trend = (f"{tv.get('p2', j_series['verdict'])} → **{tv.get('ours', j_series['verdict'])}**:"
                 f" min J_proj {_num(m.get('min_j_proj'))}, ρ {_num(m.get('spearman_j'), 2)}; "
                 f"fit-excess ρ {_num(m.get('spearman_fit_excess'), 2)}")
    e = (f"{e_model['verdict']} ×{_with_ci(e_model, 'raw_vs_standardized_ratio')}"
         if e_model else "—")
    others = sorted({r["claim"] for r in recs} - {"V", "J", "E"})
    other = "; ".join(f"{c}: {_counts([r for r in recs if r['claim'] == c])}" for c in others)
    return (f"| {name} | {v_heads} | {v_mod} | {j} | {trend} | {e} | {_counts(gamma) if gamma else '—'}"
            f" | {other or '—'} |")


def readme_block(reference: dict) -> str:
    """The README's generated block (between the markers, markers excluded) for ``reference``."""
    prov = reference.get("provenance") or {}
    env = prov.get("numeric_environment") or {}
    blas = ((env.get("blas") or {}).get("torch") or {})
    everything = reference["records"]
    recs = [r for r in everything if not r.get("control")]  # the models under test (method §12)
    controls = [r for r in everything if r.get("control")]
    total = Counter(r.get("verdict") for r in recs)
    lines = [
        f"Reference run of command 1 (`reference/results.json`): commit "
        f"`{str(prov.get('git_commit', '?'))[:12]}`, {str(prov.get('date', '?'))[:10]}, "
        f"{(env.get('cpu') or {}).get('model', '?')}, torch {(prov.get('versions') or {}).get('torch', '?')} "
        f"({env.get('torch_cpu_capability', '?')} kernels, BLAS {blas.get('blas', '?')} "
        f"{blas.get('mkl_version') or blas.get('openblas_version') or ''}".rstrip() + "), "
        f"{prov.get('workers', 0)} workers.",
        "",
        f"{len(recs)} claim tests: {total['supported']} supported (passed), "
        + (f"{total['partial']} partial, " if total["partial"] else "") +
        f"{total['refuted']} refuted, {total['inconclusive']} inconclusive, "
        f"{total['undetermined']} undetermined "
        f"(rules `{(reference.get('options') or {}).get('rules', 'ours')}`) of the models under "
        f"test; exit {reference.get('exit_status', '?')}. Intervals are 95% bootstrap CIs.",
        "",
        _controls_line(controls),
        "",
        "| model | claim V heads: `p2` → `ours` | claim V model (`p2` → `ours`) | claim J layers; "
        "model (`ours`) | claim J trend: `p2` → `ours` | claim E model: raw vs standardised | γ heads "
        "| other claims |",
        "|---|---|---|---|---|---|---|---|",
    ]
    by_model: dict[str, list[dict]] = {}
    for rec in recs:  # the controls have their own section in the report
        by_model.setdefault(rec["model"], []).append(rec)
    models = reference.get("models") or {}
    for key in sorted(by_model, key=lambda k: (bool((models.get(k) or {}).get("control")), k)):
        lines.append(_model_row(key, models.get(key) or {}, by_model[key],
                                skipped_claims(reference.get("skipped") or {}, key)))
    return "\n".join(lines) + "\n"


def _controls_line(controls: list[dict]) -> str:
    """One sentence on the controls (method §12): per role, records, met and missed expectations."""
    if not controls:
        return "No controls in this run."
    parts = []
    for role in ("positive", "negative", "dose-response"):
        mine = [r for r in controls if r.get("control") == role]
        if not mine:
            continue
        met = sum(1 for r in mine if (r.get("expected") or {}).get("met") is True)
        missed = sum(1 for r in mine if (r.get("expected") or {}).get("met") is False)
        parts.append(f"{role} {len(mine)} records: {met} as expected, {missed} instrument failures")
    return ("Controls, counted apart (the report's Controls section, method §12): "
            + "; ".join(parts) + ".")


_BLOCK = re.compile(re.escape(BEGIN) + r"[^\n]*-->\n(.*?)" + re.escape(END), re.S)


def readme_section(text: str) -> str | None:
    """The text between the markers of ``text`` (wherever they sit), or None without them."""
    m = _BLOCK.search(text)
    return m.group(1) if m else None


def update_readme(reference: dict, readme: Path = README) -> None:
    text = readme.read_text()
    if readme_section(text) is None:
        raise SystemExit(f"{readme} has no reference block markers ({BEGIN} … -->, {END}): "
                         "add them where the generated numbers belong")
    block = readme_block(reference)
    head = (f"{BEGIN} generated by `python -m report reference --write` from "
            f"reference/results.json: do not edit by hand -->\n")
    new = _BLOCK.sub(lambda m: head + block + END, text, count=1)
    if new != text:
        atomic_write_text(readme, new)


# ----------------------------------------------------------------------------- the command
def _run_command_1(out: Path, extra: list[str]) -> Path:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    cmd = [sys.executable, *COMMAND_1, "--out", str(out), *extra]
    print("running command 1:", " ".join(cmd), flush=True)
    rc = subprocess.call(cmd, cwd=ROOT, env=env)
    results = out / "results.json"
    if rc not in (0, 1) or not results.is_file():
        raise SystemExit(f"command 1 failed (pytest exit {rc}); nothing was written")
    return results


def write_reference(results_path: Path, reference_path: Path = REFERENCE,
                    readme: Path = README) -> dict:
    results = json.loads(results_path.read_text())
    if not results.get("complete"):
        raise SystemExit(f"{results_path} is not a complete run (errors or tests not run): "
                         "a reference must be whole")
    ref = judged_part(results)
    reference_path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(reference_path, json.dumps(ref, indent=1, sort_keys=True) + "\n")
    update_readme(ref, readme)
    return ref


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m report reference",
        description="Regenerate the shipped reference results (reference/results.json) and "
                    "the README block made from them; or check the README block against the "
                    "reference.")
    parser.add_argument("--write", action="store_true",
                        help="run command 1 (or take --from) and rewrite the reference and the "
                             "README block")
    parser.add_argument("--from", dest="source", type=Path, default=None,
                        help="an existing results.json of command 1 instead of a new run")
    parser.add_argument("--write-smoke", action="store_true",
                        help="run CI's smoke selection and write reference/smoke.json")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when the README block differs from the reference")
    args, extra = parser.parse_known_args(argv)
    if args.write_smoke:
        with tempfile.TemporaryDirectory(prefix="kpca-smoke-") as tmp:
            results = json.loads(_run_command_1(Path(tmp), [*SMOKE_SELECTION, *extra]).read_text())
        SMOKE.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(SMOKE, json.dumps(judged_part(results), indent=1, sort_keys=True) + "\n")
        print(SMOKE)
        return 0
    if args.write:
        if args.source is None:
            with tempfile.TemporaryDirectory(prefix="kpca-reference-") as tmp:
                write_reference(_run_command_1(Path(tmp), extra), REFERENCE)
        else:
            write_reference(args.source, REFERENCE)
        print(REFERENCE)
        print(README)
        return 0
    reference = json.loads(REFERENCE.read_text())
    want, got = readme_block(reference), readme_section(README.read_text())
    if got != want:
        print("README.md's reference block differs from reference/results.json: run "
              "`python -m report reference --write --from reference/results.json`",
              file=sys.stderr)
        return 1
    print("README.md's reference block matches reference/results.json")
    return 0
