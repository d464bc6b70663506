"""The bench's table: per model and claim, each stage's seconds (ours and the loop's, wall and CPU),
the ratio loop / ours and peak memory, printed after a run (:func:`print_table`) and written into
docs/performance.md between its markers from a results file (:func:`update_doc`, ``python -m
bench.run --write-table``), so that the page's figures are always those of one recorded run.
"""

from __future__ import annotations

import json
from pathlib import Path

from .timing import MIB, ROOT


def stage_rows(res: dict) -> list[dict]:
    """Per-stage rows (seconds, ratio reference/ours) for one model's result."""
    ow, oc = res["ours"]["wall"], res["ours"]["cpu"]
    rw, rc = res["reference"]["wall"], res["reference"]["cpu"]
    n_ref = res["reference"]["n_heads_measured"]
    factor = res["n_heads_total"] / n_ref if n_ref else None
    g = lambda d, k: d.get(k, 0.0)  # noqa: E731
    main = ("gram@main", "eigen@main", "vvmb@main", "assignment@main", "p2code@main")  # exclusive
    ours = {
        "gram": (g(ow, "gram"), g(oc, "gram")),
        "eigen": (g(ow, "eigen"), g(oc, "eigen")),
        "metrics": (g(ow, "vvmb"), g(oc, "vvmb")),
        "assignment": (g(ow, "assignment"), g(oc, "assignment")),
    }
    rows = [{"stage": "load model", "ours_wall_s": g(ow, "load"), "ours_cpu_s": g(oc, "load")}]
    cap = res["reference"].get("capture")
    row = {"stage": "capture", "ours_wall_s": g(ow, "capture"), "ours_cpu_s": g(oc, "capture")}
    if cap:
        f = res["n_samples"] / cap["n_samples_measured"]
        row.update(ref_wall_s=cap["wall"] * f, ref_cpu_s=cap["cpu"] * f, ref_extrapolated=f > 1,
                   ref_measured=f"{cap['n_samples_measured']} samples, 1 per forward pass")
    rows.append(row)
    for stage, (w, c) in ours.items():
        label = stage if stage != "assignment" or g(ow, "assignment@main") else \
            "assignment (2nd thread, overlapped)"
        row = {"stage": label, "ours_wall_s": w, "ours_cpu_s": c}
        if factor:
            row.update(ref_wall_s=g(rw, stage) * factor, ref_cpu_s=g(rc, stage) * factor,
                       ref_extrapolated=factor > 1, ref_measured=f"{n_ref} heads")
        rows.append(row)
    if "p2code" in ow:  # the loop has no p2-code variant (method §8.3): ours only
        rows.append({"stage": "p2-code variant (subset, never judged)", "ours_wall_s": g(ow, "p2code"),
                     "ours_cpu_s": g(oc, "p2code")})
    rows.append({"stage": "session (nulls, layer I/O, cache, waits)",
                 "ours_wall_s": g(ow, "claim_v") - sum(g(ow, k) for k in main),
                 "ours_cpu_s": None})
    row = {"stage": "claim V, all heads (incl. session)", "ours_wall_s": g(ow, "claim_v"),
           "ours_cpu_s": g(oc, "claim_v")}
    if factor:
        row.update(ref_wall_s=sum(rw.values()) * factor, ref_cpu_s=sum(rc.values()) * factor,
                   ref_extrapolated=factor > 1, ref_measured=f"{n_ref} heads")
    rows.append(row)
    rows.append({"stage": "report (records + HTML)", "ours_wall_s": g(ow, "report"),
                 "ours_cpu_s": g(oc, "report")})
    for row in rows:
        row.setdefault("claim", "V")
    ok = res["agreement"] is None or res["agreement"]["passed"]
    for row in rows:
        if "ref_wall_s" in row and row["ours_wall_s"] > 0:
            row["ratio_wall"] = row["ref_wall_s"] / row["ours_wall_s"] if ok else None
            row["ratio_cpu"] = row["ref_cpu_s"] / max(row["ours_cpu_s"], 1e-9) if ok else None
    mem = res["memory_mb"]
    for row in rows:
        phase = {"load model": "load+capture", "capture": "load+capture",
                 "report (records + HTML)": "report"}.get(row["stage"], "claim_v")
        row["peak_rss_mb"] = mem[phase]["peak"]
        row["rss_phase"] = phase
    for claim, c in res.get("claims", {}).items():
        rows += claim_rows(claim, c)
    return rows


CLAIM_STAGES = {"J": ("phi", "h", "summaries"), "E": ("gram", "eigen", "naive", "gamma")}
#: Stages of ours the loop does not compute (claim J's output fit, method §3.6): shown on their
#: own row, and left out of the claim's total so that its ratio compares the same work.
OURS_ONLY = {"J": {"output fit": "the output fit"}}


def claim_rows(claim: str, c: dict) -> list[dict]:
    """Rows of claim J or E: each stage (exclusive), the session's rest, and the total."""
    ow, oc = c["ours"]["wall"], c["ours"]["cpu"]
    rw, rc = c["reference"]["wall"], c["reference"]["cpu"]
    n_ref = c["reference"]["n_heads_measured"]
    factor = c["n_heads_total"] / n_ref if n_ref else None
    g = lambda d, k: d.get(k, 0.0)  # noqa: E731
    stages = CLAIM_STAGES[claim]
    rows = []
    for stage in stages:
        rows.append({"stage": stage, "ours_wall_s": g(ow, stage), "ours_cpu_s": g(oc, stage),
                     "ref_wall_s": g(rw, stage) * factor if factor else None,
                     "ref_cpu_s": g(rc, stage) * factor if factor else None})
    only = [s for s in OURS_ONLY.get(claim, {}) if s in ow]
    for stage in only:
        rows.append({"stage": f"{stage} (ours only: the loop has none)",
                     "ours_wall_s": g(ow, stage), "ours_cpu_s": g(oc, stage)})
    rows.append({"stage": "session (layer I/O, cache, chunking)",
                 "ours_wall_s": g(ow, "total") - sum(g(ow, s) for s in (*stages, *only)),
                 "ours_cpu_s": None})
    without = "".join(f", without {OURS_ONLY[claim][s]}" for s in only)
    rows.append({"stage": f"claim {claim}, all heads (incl. session{without})",
                 "ours_wall_s": g(ow, "total") - sum(g(ow, s) for s in only),
                 "ours_cpu_s": g(oc, "total") - sum(g(oc, s) for s in only),
                 "ref_wall_s": sum(rw.values()) * factor if factor else None,
                 "ref_cpu_s": sum(rc.values()) * factor if factor else None})
    ok = c["agreement"] is None or c["agreement"]["passed"]
    for row in rows:
        row["claim"] = claim
        if row.get("ref_wall_s") is None:
            row.pop("ref_wall_s", None), row.pop("ref_cpu_s", None)
            continue
        row.update(ref_extrapolated=factor > 1, ref_measured=f"{n_ref} heads")
        if row["ours_wall_s"] > 0:
            row["ratio_wall"] = row["ref_wall_s"] / row["ours_wall_s"] if ok else None
            row["ratio_cpu"] = row["ref_cpu_s"] / max(row["ours_cpu_s"], 1e-9) if ok else None
        row["peak_rss_mb"] = c["memory_mb"]["peak"]
        row["rss_phase"] = f"claim_{claim}"
    for row in rows:
        row.setdefault("peak_rss_mb", c["memory_mb"]["peak"])
    return rows


def _fmt(x, digits=1) -> str:
    if x is None:
        return "-"
    return f"{x:.{digits}f}"


def print_table(results: dict) -> None:
    print("\n" + "=" * 118)
    print(f"threads {results['machine']['threads']}, load average before/after "
          f"{results['machine']['load_before']} / {results['machine']['load_after']}; "
          "ref* = extrapolated from a measured subset; ratio = reference / ours")
    for res in results["models"]:
        print(f"\n{res['model']}: {res['n_samples']} samples x {res['n_layers']} layers x "
              f"{res['n_heads']} heads = {res['n_heads_total']} heads, N {res['tokens']['min']}-"
              f"{res['tokens']['max']}, d {res['head_dim']}; max_memory "
              f"{res['chunks']['max_memory_bytes'] / MIB:.0f} MiB -> chunks of "
              f"{res['chunks']['samples_per_chunk']} samples")
        print(f"  {'claim':5s} {'stage':40s} {'ours s':>9s} {'ours cpu':>9s} {'ref s':>10s} {'ref cpu':>10s} "
              f"{'ratio':>7s} {'ratio cpu':>9s} {'peak RSS MiB':>13s}")
        for row in res["stages"]:
            star = "*" if row.get("ref_extrapolated") else " "
            ref = _fmt(row.get("ref_wall_s")) + (star if "ref_wall_s" in row else " ")
            refc = _fmt(row.get("ref_cpu_s")) + (star if "ref_cpu_s" in row else " ")
            print(f"  {row['claim']:5s} {row['stage']:40s} {_fmt(row['ours_wall_s'], 2):>9s} "
                  f"{_fmt(row['ours_cpu_s'], 2):>9s} {ref:>10s} {refc:>10s} "
                  f"{_fmt(row.get('ratio_wall'), 2):>7s} {_fmt(row.get('ratio_cpu'), 2):>9s} "
                  f"{row['peak_rss_mb']:13.0f}")
        ag = res["agreement"]
        if ag:
            worst = (max(ag["worst"].items(), key=lambda kv: kv[1]["rel_err"])
                     if ag["worst"] else None)
            print(f"  agreement on {ag['n_heads_checked']} heads (rtol {ag['rtol']:g}): "
                  f"{'PASSED' if ag['passed'] else 'FAILED'}; worst "
                  f"{worst[0] if worst else '-'} {worst[1]['rel_err'] if worst else 0:.2e}; "
                  f"{ag['n_undetermined_nulls_only']} undetermined (nulls only); threshold "
                  f"(Lanczos vs eigvalsh) max rel diff {ag['threshold_max_rel_diff']:.1e}")
        for claim, c in res.get("claims", {}).items():
            ag = c["agreement"]
            if ag:
                worst = max(ag["worst"].items(), key=lambda kv: kv[1]["rel_err"], default=None)
                print(f"  claim {claim} agreement on {ag['n_heads_checked']} heads (rtol "
                      f"{ag['rtol']:g}): {'PASSED' if ag['passed'] else 'FAILED'}; worst "
                      f"{worst[0] if worst else '-'} {worst[1]['rel_err'] if worst else 0:.2e}")
        print("  memory (MiB): " + ", ".join(
            f"{k}: start {v['start']:.0f} peak {v['peak']:.0f} (+{v['peak_minus_start']:.0f})"
            for k, v in res["memory_mb"].items()))


TABLE_START = "<!-- bench-table:start (python -m bench.run --write-table) -->"
TABLE_END = "<!-- bench-table:end -->"
#: The page that holds the table.
DOC = ROOT / "docs" / "performance.md"


def speed_table(results: dict) -> str:
    """The Speed table of docs/performance.md, from a bench results file: per model and claim,
    each stage's seconds (ours / loop, CPU), the ratio, and peak memory."""
    m = results["machine"]
    lines = [TABLE_START,
             f"Measured {results.get('date_utc', '?')} UTC at commit {results.get('commit', '?')}, "
             f"{m['cpus']} CPUs ({m.get('cpu_model', '?')}), torch/BLAS threads "
             f"{m['threads'].get('torch')}, {results.get('repeats', 1)} run; load average before "
             f"/ after {m['load_before'][0]} / {m['load_after'][0]}. Seconds are per-thread CPU "
             "time (wall time on a shared machine measures the neighbours); `*` = the loop was "
             "timed on a subset of heads and extrapolated.", ""]
    for res in results["models"]:
        lines += [f"**{res['model']}**: {res['n_samples']} samples, {res['n_heads_total']:,} "
                  f"heads, N {res['tokens']['min']}–{res['tokens']['max']}, d {res['head_dim']}.",
                  "", "| claim | stage | ours CPU s | loop CPU s | ratio CPU | ours wall s | "
                  "ratio wall | peak RSS MiB |", "|---|---|---|---|---|---|---|---|"]
        for row in res["stages"]:
            if row["stage"] in ("load model", "report (records + HTML)"):
                continue
            star = "*" if row.get("ref_extrapolated") else ""
            ref = f"{row['ref_cpu_s']:.1f}{star}" if row.get("ref_cpu_s") is not None else "–"
            bold = "**" if "all heads" in row["stage"] else ""
            lines.append(
                f"| {row['claim']} | {bold}{row['stage']}{bold} | {_fmt(row['ours_cpu_s'])} | "
                f"{ref} | {bold}{_fmt(row.get('ratio_cpu'), 2)}{bold} | "
                f"{_fmt(row['ours_wall_s'])} | {_fmt(row.get('ratio_wall'), 2)} | "
                f"{row['peak_rss_mb']:.0f} |")
        agree = [f"V {'passed' if (res['agreement'] or {}).get('passed') else 'FAILED'}"]
        agree += [f"{c} {'passed' if (x['agreement'] or {}).get('passed') else 'FAILED'}"
                  for c, x in res.get("claims", {}).items()]
        lines += ["", "Agreement with the loop (1e-6 relative): " + ", ".join(agree) + ".", ""]
    lines.append(TABLE_END)
    return "\n".join(lines)


def update_doc(results_path: Path, doc: Path = DOC) -> None:
    """Replace the block between :data:`TABLE_START` and :data:`TABLE_END` in ``doc`` by
    :func:`speed_table` of ``results_path``."""
    text = doc.read_text()
    if TABLE_START not in text or TABLE_END not in text:
        raise SystemExit(f"{doc} has no bench table markers ({TABLE_START!r} ... "
                         f"{TABLE_END!r}); add them where the table belongs")
    head, rest = text.split(TABLE_START, 1)
    tail = rest.split(TABLE_END, 1)[1]
    table = speed_table(json.loads(results_path.read_text()))
    doc.write_text(head + table + tail)


# ---------------------------------------------------------------- the pipeline table (--pipeline)
PIPELINE_START = "<!-- pipeline-table:start (python -m bench.run --write-table) -->"
PIPELINE_END = "<!-- pipeline-table:end -->"
#: Stages shown in this order (then any other, by total CPU time); ``other`` and the process's
#: start last. Labels ending in `` (V)`` etc. are shared kernels, by the claim they ran for.
PIPELINE_ORDER = ("load model", "inputs & prepare", "capture", "layer I/O", "claim V per-layer",
                  "Gram matrices & threshold (V)", "eigendecompositions (V)",
                  "column bases (QR, rank) (V)", "V ", "claim J per-layer", "J ",
                  "Gram matrices & threshold (J)", "eigendecompositions (J)",
                  "claim E per-layer", "Gram matrices & threshold (E)", "eigendecompositions (E)",
                  "E ", "statistics", "records", "results.json", "pytest",
                  "python start", "child processes", "other")


def _stage_rank(label: str, totals: dict) -> tuple:
    for i, prefix in enumerate(PIPELINE_ORDER):
        if label.startswith(prefix):
            return (i, -totals.get(label, 0.0), label)
    return (PIPELINE_ORDER.index("statistics") - 0.5, -totals.get(label, 0.0), label)


def pipeline_stages(results: dict) -> list[str]:
    """Every stage of any model, in :data:`PIPELINE_ORDER`."""
    totals: dict[str, float] = {}
    for m in results["models"]:
        for k, v in m["stages_cpu_s"].items():
            totals[k] = totals.get(k, 0.0) + v
    return sorted(totals, key=lambda s: _stage_rank(s, totals))


def _cell(cpu: float | None, total: float) -> str:
    if cpu is None or abs(cpu) < 0.05:
        return "–"
    return f"{cpu:.1f} ({100 * cpu / total:.0f}%)" if total > 0 else f"{cpu:.1f}"


def kernel_line(results: dict) -> str:
    """The kernels against the loop, measured in the same run: ``claim V 1.31×, ...``."""
    parts = []
    for k in results.get("kernels", []):
        ratios = ", ".join(
            f"claim {c} {x['ratio_cpu']:.2f}× ({x['ours_cpu_s']:.1f} s ours, "
            f"{x['loop_cpu_s']:.1f} s loop{'*' if x['loop_extrapolated'] else ''})"
            for c, x in k["claims"].items() if x.get("ratio_cpu") is not None)
        agree = "agreement with the loop passed" if k["agreement_passed"] else "AGREEMENT FAILED"
        parts.append(f"{k['model']} ({k['n_samples']} samples, {k['n_heads_total']:,} heads): "
                     f"{ratios or 'no ratio'}; {agree}")
    return "; ".join(parts)


def pipeline_table(results: dict) -> str:
    """The per-model × stage table of docs/performance.md from ``bench/pipeline.json``: each
    stage's CPU seconds and its share of the model's total, the machine, the date, and the
    kernels-vs-loop ratio of the same run."""
    m = results["machine"]
    models = results["models"]
    lines = [PIPELINE_START,
             f"Measured {results.get('date_utc', '?')} UTC at commit {results.get('commit', '?')} "
             f"on {m['cpus']} CPUs ({m.get('cpu_model', '?')}), torch {m.get('torch', '?')}, "
             f"Python {m.get('python', '?')}, 1 thread per process, {results.get('n_samples')} "
             f"samples per model, 1 run; load average before / after {m['load_before'][0]} / "
             f"{m.get('load_after', ['?'])[0]}. Each model ran alone in a fresh process "
             "(`pytest claims/ --models M -n 0 --threads 1`, fresh cache); cells are per-thread "
             "CPU seconds (share of the model's total); a stage nested in another counts once.",
             "",
             "| stage | " + " | ".join(r.get("label", r["models"]) for r in models) + " |",
             "|---|" + "---|" * len(models)]
    for stage in pipeline_stages(results):
        lines.append(f"| {stage} | " + " | ".join(
            _cell(r["stages_cpu_s"].get(stage), r["cpu_s"]) for r in models) + " |")
    lines.append("| **total CPU s** | " + " | ".join(f"**{r['cpu_s']:.1f}**" for r in models)
                 + " |")
    lines.append("| wall s (one process) | " + " | ".join(f"{r['wall_s']:.1f}" for r in models)
                 + " |")
    total = sum(r["cpu_s"] for r in models)
    lines += ["", f"All models: {total:.1f} CPU s."]
    kl = kernel_line(results)
    if kl:
        lines += ["", f"Kernels against the loop reference in the same run (CPU, ours vs loop; "
                      f"`*` extrapolated from a subset of heads): {kl}."]
    missing = sorted({t for r in models for t in r.get("missing_targets", [])})
    if missing:
        lines += ["", "Not wrapped (target missing, its time counted in its caller): "
                  + ", ".join(f"`{t.split(' ')[0]}`" for t in missing) + "."]
    lines += ["", PIPELINE_END]
    return "\n".join(lines)


def print_pipeline(results: dict) -> None:
    """The pipeline table on the terminal (the same markdown), then the kernel ratio."""
    print("\n" + pipeline_table(results).split("\n", 1)[1].rsplit("\n", 1)[0])


def replace_block(text: str, start: str, end: str, block: str, doc: Path) -> str:
    if start not in text or end not in text:
        raise SystemExit(f"{doc} has no table markers ({start!r} ... {end!r}); add them where "
                         "the table belongs")
    head, rest = text.split(start, 1)
    return head + block + rest.split(end, 1)[1]


def update_pipeline_doc(results_path: Path, doc: Path = DOC) -> None:
    """Replace the block between :data:`PIPELINE_START` and :data:`PIPELINE_END` in ``doc`` by
    :func:`pipeline_table` of ``results_path``."""
    text = doc.read_text()
    doc.write_text(replace_block(text, PIPELINE_START, PIPELINE_END,
                                 pipeline_table(json.loads(results_path.read_text())), doc))
