"""``python -m report diff RUN REFERENCE``: does a run reproduce a reference run?

Compares two results.json files record by record (method §13) and prints, in a screenful:

- first, the verdict (REPRODUCES, DOES NOT REPRODUCE, NOT COMPARABLE), its exit status and why,
  in one line (:func:`headline`; repeated as the last line);
- whether the two are comparable at all: the same options, models, checkpoints (weight hashes)
  and inputs, and the same claim tests; when not, what differs, and exit 4;
- what differs but does not decide: package versions, the numeric environment (CPU, torch's
  dispatch ISA, BLAS, threads, environment variables), the commit;
- verdict changes: which records, old → new;
- for every claim × model, the largest relative difference of any number and its tolerance
  (:mod:`report.tolerances`: one tolerance per field kind), and every number outside its tolerance;
- the rules (thresholds) when they differ.

Exit status: 0 the run reproduces the reference; 6 a verdict, a rule, an exact field or a number
outside its tolerance differs; 4 the two are not comparable; 2 a file is missing or not a
results.json (parsed strictly and validated against the schema: :func:`load`), or ``--json``
names an input, a folder, a device or a file this user cannot write (refused before anything is
compared or written). Names in the messages are printable (escape codes written as ``\x1b``).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from checks._validation import printable

from .atomic import atomic_write_text
from .baseline import FREE_OPTIONS, implied_record, with_implied_options
from .tolerances import ROUND_OFF_FACTOR, TOLERANCES, added_since, kind_of, metric_of, rel_diff, round_off_widths

REPRODUCES, CHANGED, NOT_COMPARABLE, BAD_INPUT = 0, 6, 4, 2

#: Model fields that must agree: which weights, which inputs.
MODEL_IDENTITY = ("checkpoint_hash", "input_set.hash", "input_set.tensor_hash")
#: Record fields holding file paths: compared by file name (the cache folder differs per user).
PATH_FIELDS = ("checkpoint", "path")


class DiffInputError(ValueError):
    """A file that is missing or is not a results.json."""


def load(path: str | Path, what: str = "results file") -> dict:
    """A results.json read as every reader reads one (report/validate.py: strict JSON, the
    schema, :func:`~report.results_file.validate_results`); else DiffInputError in one sentence:
    a NaN, a string metric or a baseline file given as a run is refused, never compared."""
    from . import validate
    from .results_file import validate_results

    name = f"{what} {path}"
    try:
        data = validate.require_object(validate.read_json(path, what), name)
        if data.get("schema") == "kpca-claims/baseline/2":
            raise DiffInputError(f"{name} is a baseline file (written by --update-baseline), not the results.json "
                                 "of a run: give the results.json a run wrote (a baseline is compared by pytest claims/ --baseline)")
        validate.check(data, name, "results")
        validate_results(data)
    except (validate.InvalidFile, DiffInputError) as exc:
        raise DiffInputError(str(exc)) from None
    except ValueError as exc:
        raise DiffInputError(f"{name}: {exc}") from None
    return data


def leaves(obj, prefix: str = "") -> dict[str, object]:
    """``{"metrics.optimal_cosine": 0.31, "ci.optimal_cosine[0]": 0.30, ...}``."""
    out: dict[str, object] = {}
    if isinstance(obj, dict):
        for key, value in obj.items():
            out.update(leaves(value, f"{prefix}.{key}" if prefix else str(key)))
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            out.update(leaves(value, f"{prefix}[{i}]"))
    else:
        out[prefix] = obj
    return out


def _metric(path: str) -> str:
    """The metric a leaf belongs to: its path without indices, at most two keys deep."""
    bare = ".".join(part.split("[")[0] for part in path.split("."))
    return ".".join(bare.split(".")[:2])


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _record_id(rec: dict) -> str:
    return rec.get("test_id") or f"{rec.get('claim')}/{rec.get('level')}/{rec.get('model')}/" \
                                  f"L{rec.get('layer')}/H{rec.get('head')}"


@dataclass
class Worst:
    rel: float = 0.0
    path: str = ""
    kind: str = "judged"
    run: float | None = None
    ref: float | None = None
    n: int = 0
    outside: int = 0


@dataclass
class Diff:
    not_comparable: list[str] = field(default_factory=list)
    informational: list[str] = field(default_factory=list)
    verdicts: list[str] = field(default_factory=list)
    outside: list[str] = field(default_factory=list)
    exact: list[str] = field(default_factory=list)
    rules: list[str] = field(default_factory=list)
    only_run: list[str] = field(default_factory=list)
    only_ref: list[str] = field(default_factory=list)
    worst: dict = field(default_factory=dict)  # (claim, model) -> {metric: Worst}
    presence: dict = field(default_factory=dict)  # kind -> Worst, kinds not compared by value
    n_records: int = 0
    n_numbers: int = 0

    @property
    def status(self) -> int:
        if self.not_comparable:
            return NOT_COMPARABLE
        if self.verdicts or self.outside or self.exact or self.rules:
            return CHANGED
        return REPRODUCES


def _compare_dicts(a: dict, b: dict, what: str, skip=()) -> list[str]:
    la, lb = leaves(a), leaves(b)
    out = []
    for key in sorted(set(la) | set(lb)):
        if any(key == s or key.startswith(s + ".") for s in skip):
            continue
        if la.get(key, "<absent>") != lb.get(key, "<absent>"):
            out.append(f"{what} {key}: {_show(la.get(key, '<absent>'))} → "
                       f"{_show(lb.get(key, '<absent>'))}")
    return out


def _show(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, float):
        return f"{v:.10g}"
    return str(v)


def compare(run: dict, ref: dict) -> Diff:
    """The differences of ``run`` against ``ref`` (see the module docstring)."""
    d = Diff()
    # --- comparable at all?
    opt_run, opt_ref = (with_implied_options(r.get("options")) for r in (run, ref))
    d.not_comparable += [f"option {line.strip()}" for line in
                         _compare_dicts(opt_ref, opt_run, "", skip=FREE_OPTIONS)]
    models_run, models_ref = run.get("models") or {}, ref.get("models") or {}
    for key in sorted(set(models_ref) - set(models_run)):
        d.not_comparable.append(f"model {key} only in the reference")
    for key in sorted(set(models_run) - set(models_ref)):
        d.not_comparable.append(f"model {key} only in the run")
    for key in sorted(set(models_run) & set(models_ref)):
        a, b = leaves(models_ref[key]), leaves(models_run[key])
        for name in MODEL_IDENTITY:
            if a.get(name) != b.get(name):
                d.not_comparable.append(f"model {key}: {name} {_show(a.get(name))} → "
                                        f"{_show(b.get(name))} (other weights or inputs)")
    recs_run = {_record_id(r): r for r in run["records"]}
    recs_ref = {_record_id(r): r for r in ref["records"]}
    d.only_run = sorted(set(recs_run) - set(recs_ref))
    d.only_ref = sorted(set(recs_ref) - set(recs_run))
    if d.only_run or d.only_ref:
        d.not_comparable.append(f"the runs hold other claim tests: {len(d.only_run)} only in the "
                                f"run, {len(d.only_ref)} only in the reference (another selection)")
    # --- what differs without deciding
    prov_run, prov_ref = run.get("provenance") or {}, ref.get("provenance") or {}
    d.informational += _compare_dicts(prov_ref.get("versions") or {},
                                      prov_run.get("versions") or {}, "version")
    d.informational += _compare_dicts(prov_ref.get("numeric_environment") or {},
                                      prov_run.get("numeric_environment") or {},
                                      "numeric environment")
    if prov_run.get("git_commit") != prov_ref.get("git_commit"):
        d.informational.append(f"commit {prov_ref.get('git_commit')} → {prov_run.get('git_commit')}")
    if opt_run.get("device") != opt_ref.get("device"):
        d.informational.append(f"option device {opt_ref.get('device')} → {opt_run.get('device')}")
    d.rules = _compare_dicts(ref.get("thresholds") or {}, run.get("thresholds") or {}, "rule")
    # --- the records both hold
    added = sum(_compare_record(d, rid, recs_run[rid], recs_ref[rid])
                for rid in sorted(set(recs_run) & set(recs_ref)))
    if added:  # fields newer than the reference (report/tolerances.py ADDED_FIELDS)
        d.informational.append(f"{added} fields added since the reference, not compared")
    return d


def _compare_record(d: Diff, rid: str, run: dict, ref: dict) -> int:
    d.n_records += 1
    if run.get("verdict") != ref.get("verdict") or run.get("verdicts") != ref.get("verdicts"):
        old = ref.get("verdicts") or {"": ref.get("verdict")}
        new = run.get("verdicts") or {"": run.get("verdict")}
        moved = ", ".join(f"{k or 'verdict'} {old.get(k)} → {new.get(k)}"
                          for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k))
        fallback = f"{ref.get('verdict')} → {run.get('verdict')}"
        d.verdicts.append(f"{rid}: {moved or fallback}")
    a, b = leaves(implied_record(run)), leaves(implied_record(ref))
    widths = round_off_widths(run, ref)  # method §13.2: numbers round-off moves, and how far
    group = d.worst.setdefault((run.get("claim"), run.get("model")), {})
    added = {path for path in set(a) - set(b) if added_since(path)}  # returned, not compared
    for path in sorted((set(a) | set(b)) - added):
        if path in ("verdict", "outcome") or path.startswith("verdicts."):
            continue  # verdicts are listed above; outcome follows the verdict
        va, vb = a.get(path, "<absent>"), b.get(path, "<absent>")
        kind = kind_of(path, vb if va == "<absent>" else va)
        if kind == "text":
            continue
        if path.split(".")[-1].split("[")[0] in PATH_FIELDS and isinstance(va, str) \
                and isinstance(vb, str):
            va, vb = Path(va).name, Path(vb).name
        if _is_number(va) and _is_number(vb) and kind != "exact":
            tol = TOLERANCES[kind]
            fa, fb = float(va), float(vb)
            d.n_numbers += 1
            w = group.setdefault(_metric(path), Worst(kind=kind))
            w.n += 1
            r = rel_diff(fa, fb)
            width = widths.get(metric_of(path), 0.0)
            ok = tol.agree(fa, fb, width)
            if not ok:
                w.outside += 1
                wider = f" + {ROUND_OFF_FACTOR:g} x round-off width {width:.2g}" if width else ""
                d.outside.append(f"{rid} {path}: {_show(vb)} → {_show(va)} (relative "
                                 f"{r:.2g}; {kind} tolerance {tol.describe()}{wider})")
            if r > w.rel or not w.path:
                w.rel, w.path, w.run, w.ref = r, path, fa, fb
            if not tol.by_value:
                p = d.presence.setdefault(kind, Worst(kind=kind))
                p.n += 1
                p.outside += not ok
                if r > p.rel or not p.path:
                    p.rel, p.path, p.run, p.ref = r, f"{rid} {path}", fa, fb
        elif va != vb:
            d.exact.append(f"{rid} {path}: {_show(vb)} → {_show(va)}")
    return len(added)


def _env_line(results: dict) -> str:
    prov = results.get("provenance") or {}
    env = prov.get("numeric_environment") or {}
    cpu = (env.get("cpu") or {}).get("model") or prov.get("platform") or "?"
    blas = (env.get("blas") or {}).get("torch") or {}
    blas_s = f"{blas.get('blas', '?')} {blas.get('mkl_version') or blas.get('openblas_version') or ''}".strip()
    return (f"commit {str(prov.get('git_commit', '?'))[:12]}, {prov.get('date', '?')}, {cpu}, "
            f"torch {(prov.get('versions') or {}).get('torch', '?')} dispatching to "
            f"{env.get('torch_cpu_capability', '?')}, BLAS {blas_s}")


def _limited(lines: list[str], limit: int) -> list[str]:
    if len(lines) <= limit:
        return lines
    return lines[:limit] + [f"… and {len(lines) - limit} more (--all lists them)"]


def headline(d: Diff) -> str:
    """The first line of a diff: the verdict, its exit status and why, in one sentence."""
    if d.status == NOT_COMPARABLE:
        more = len(d.not_comparable) - 1
        return (f"NOT COMPARABLE with the reference (exit 4): {d.not_comparable[0]}"
                + (f" (and {more} more reason{'s' if more != 1 else ''} below)" if more else ""))
    counts = (f"{d.n_records} records, {len(d.verdicts)} verdicts changed, {len(d.outside)} of "
              f"{d.n_numbers} numbers outside their tolerance")
    if d.status == REPRODUCES:
        return f"REPRODUCES the reference (exit 0): {counts}"
    extra = [f"{len(x)} {what}" for x, what in ((d.rules, "rules differ"),
                                                  (d.exact, "exact fields differ")) if x]
    return f"DOES NOT REPRODUCE the reference (exit 6): {', '.join([counts, *extra])}"


def format_diff(d: Diff, run_path, ref_path, run: dict, ref: dict, show_all: bool = False,
                limit: int = 8) -> str:
    """The diff as a person reads it: the verdict first (:func:`headline`), then the two runs,
    what makes them not comparable, what differs without deciding, and the details; the verdict
    is repeated as the last line."""
    lim = 10**9 if show_all else limit
    out = [headline(d),
           f"report diff: {run_path}",
           f"    against: {ref_path}",
           f"  run:       {_env_line(run)}",
           f"  reference: {_env_line(ref)}"]
    if d.not_comparable:
        out.append("NOT COMPARABLE: the two runs checked different things:")
        out += [f"  {line}" for line in _limited(d.not_comparable, lim)]
        out += [f"  only in the run: {rid}" for rid in _limited(d.only_run, 3 if not show_all else lim)]
        out += [f"  only in the reference: {rid}"
                for rid in _limited(d.only_ref, 3 if not show_all else lim)]
    if d.informational:
        out.append("differs, not deciding (versions, numeric environment, commit):")
        out += [f"  {line}" for line in _limited(d.informational, lim)]
    else:
        out.append("versions, numeric environment and commit: the same")
    if d.rules:
        out.append(f"rules that differ ({len(d.rules)}):")
        out += [f"  {line}" for line in _limited(d.rules, lim)]
    out.append(f"records compared: {d.n_records}; verdicts changed: {len(d.verdicts)}")
    out += [f"  {line}" for line in _limited(d.verdicts, lim)]
    out.append(f"numbers compared: {d.n_numbers}; outside their tolerance: {len(d.outside)}")
    out += [f"  {line}" for line in _limited(d.outside, lim)]
    if d.exact:
        out.append(f"exact fields that differ: {len(d.exact)}")
        out += [f"  {line}" for line in _limited(d.exact, lim)]
    if d.worst:
        out.append("largest relative difference per claim × model (its metric, kind, tolerance):")
        rows = []
        for (claim, model), metrics in sorted(d.worst.items(), key=lambda kv: tuple(map(str, kv[0]))):
            # numbers compared by value first: a solver-dependent one is listed below them
            items = sorted(metrics.items(), key=lambda kv: (
                -kv[1].outside, not TOLERANCES[kv[1].kind].by_value, -kv[1].rel))
            for metric, w in (items if show_all else items[:1]):
                tol = TOLERANCES[w.kind]
                rows.append(f"  {claim:<3} {model:<34} {metric:<32} {w.rel:>9.2g}  "
                            f"{w.kind:<9} {tol.describe()}"
                            + (f"  {w.outside} outside" if w.outside else ""))
        out += rows
    for kind, w in sorted(d.presence.items()):
        tol = TOLERANCES[kind]
        out.append(f"{kind}: {w.n} numbers compared for presence and finiteness only, never "
                   f"judged (report/tolerances.py); largest relative difference {w.rel:.2g} at "
                   f"{w.path}"
                   + (f"; {w.outside} not finite on one side only" if w.outside else ""))
    out.append(headline(d))
    return "\n".join(out)


def _json_output_problem(path: Path, inputs: tuple[Path, ...]) -> str | None:
    """Why ``--json PATH`` cannot be written (checked before anything is compared), or None:
    an input, a folder, not a regular file, in no folder, or not writable by this user."""
    for given in inputs:
        try:
            if path.exists() and given.exists() and path.samefile(given):
                return f"is the input {given}: it would be overwritten; name a new file"
        except OSError:
            pass
    if path.is_dir():
        return "is a folder; name a file"
    if path.exists() and not path.is_file():
        return "is not a regular file (a device, a FIFO or a socket); name a new file"
    folder = path.parent
    if not folder.is_dir():
        return f"is in {folder}, which is not an existing folder"
    if path.exists() and not os.access(path, os.W_OK):
        return "is not writable by this user; fix its permissions or name another file"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"is in {folder}, which this user cannot write into; name a file in another folder"
    return None


def main(argv: list[str]) -> int:
    import argparse
    import sys

    parser = argparse.ArgumentParser(
        prog="python -m report diff",
        description="Say whether a run reproduces a reference run: exit 0 it does, 6 a verdict "
                    "or a number left its tolerance, 4 the runs are not comparable (docs/reproduce.md).")
    parser.add_argument("run", type=Path, help="the results.json of your run")
    parser.add_argument("reference", type=Path, help="the reference results.json (e.g. reference/results.json)")
    parser.add_argument("--all", action="store_true", help="list every difference and every claim × model × metric")
    parser.add_argument("--json", type=Path, default=None,
                        help="also write the differences as JSON to this file")
    args = parser.parse_args(argv)
    if args.json is not None:
        problem = _json_output_problem(args.json, (args.run, args.reference))
        if problem:
            parser.exit(BAD_INPUT, printable(f"{parser.prog}: error: --json {args.json} "
                                             f"{problem}; nothing was compared or written") + "\n")
    try:
        run, ref = load(args.run, "run"), load(args.reference, "reference")
    except DiffInputError as exc:
        parser.exit(BAD_INPUT, printable(f"{parser.prog}: error: {exc}; nothing was compared") + "\n")
    d = compare(run, ref)
    try:
        print(format_diff(d, args.run, args.reference, run, ref, show_all=args.all))
        sys.stdout.flush()
    except BrokenPipeError:  # `report diff … | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    if args.json is not None:
        worst = {f"{c}/{m}": {k: {"rel": (w.rel if math.isfinite(w.rel) else None), "path": w.path,
                                  "kind": w.kind, "n": w.n, "outside": w.outside}
                              for k, w in ms.items()} for (c, m), ms in d.worst.items()}
        atomic_write_text(args.json, json.dumps(
            {"status": d.status, "not_comparable": d.not_comparable,
             "informational": d.informational, "verdicts": d.verdicts, "outside": d.outside,
             "exact": d.exact, "rules": d.rules, "only_run": d.only_run, "only_ref": d.only_ref,
             "n_records": d.n_records, "n_numbers": d.n_numbers, "worst": worst},
            indent=1, sort_keys=True) + "\n")
    sys.stdout.flush()
    return d.status
