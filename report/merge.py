"""``python -m report merge A/results.json B/results.json … -o OUT/``: join the results.json files of
the shards of one run (``pytest claims/ --shard K/N``) into one results.json and report.html.

The merged file has the shape of a normal results.json (the report and the baseline gate read it
as they read one run's). Shards are joined only when they belong to one run: the same options,
thresholds, code version (git commit) and input sets, each shard once, each record once. Any
mismatch refuses the merge with one sentence naming the field, and nothing is written. Models of
the declared run that no input holds (a shard that failed or was not given) are listed under
``provenance.missing_models`` and the merge is marked partial (``complete: false``), as an
interrupted run is.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
from pathlib import Path

from claims.names import RESULTS_SCHEMA

from .atomic import atomic_write_text
from .render import render_report, validate_results


def _record_key(rec: dict) -> tuple:
    """A record's identity and sort key (as pytest claims/ sorts its records)."""
    return (rec["claim"], rec["model"], rec.get("level", ""),
            -1 if rec.get("layer") is None else rec["layer"],
            -1 if rec.get("head") is None else rec["head"], rec.get("test_id", ""))

#: Top-level fields the merge builds itself; any other field is kept when every input agrees.
_BUILT = ("schema", "provenance", "options", "thresholds", "models", "records", "not_run",
          "complete", "exit_status", "summary", "durations", "errors")
#: Provenance fields that must be equal across the inputs (code and numerics).
_SAME_PROVENANCE = ("git_commit", "dtype")


class MergeError(ValueError):
    """The inputs cannot be merged; the message is one sentence naming the field."""


def _name(path: Path) -> str:
    """A path as the user gave it."""
    return str(path)


def load_input(path: Path) -> dict:
    """One results.json, checked to be complete JSON in the results schema."""
    name = _name(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise MergeError(f"{name}: no such file; give the results.json of each shard") from None
    except IsADirectoryError:
        raise MergeError(f"{name} is a folder; give the results.json inside it") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise MergeError(f"{name} cannot be read ({exc})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise MergeError(f"{name} is not complete JSON ({exc.msg} at line {exc.lineno}): a "
                         "truncated file? Copy it again or rerun that shard") from None
    if not isinstance(data, dict) or data.get("schema") != RESULTS_SCHEMA:
        schema = data.get("schema") if isinstance(data, dict) else None
        raise MergeError(f"{name} is not a kpca-claims results.json (schema {schema!r}, "
                         f"expected {RESULTS_SCHEMA!r})")
    try:
        validate_results(data)
    except ValueError as exc:
        raise MergeError(f"{name} is not a complete results.json: {exc}") from None
    return data


def _first_difference(a, b, where: str) -> str | None:
    """The dotted path of the first place where ``a`` and ``b`` differ, or None."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b), key=str):
            if key not in a or key not in b:
                return f"{where}.{key}"
            found = _first_difference(a[key], b[key], f"{where}.{key}")
            if found:
                return found
        return None
    return None if a == b else where


def _get(data: dict, dotted: str):
    value = data
    for part in dotted.split(".")[1:]:
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _input_sets(data: dict) -> dict:
    """(kind, source) of each input set → its content hash (models on the same images or texts
    share one input set; trained models have their own fixed batch)."""
    out = {}
    for key, info in data["models"].items():
        inp = info.get("input_set") or {}
        out[(inp.get("kind"), inp.get("source"))] = (inp.get("hash"), key)
    return out


def merge(inputs: list[tuple[Path, dict]], command: str | None = None) -> dict:
    """The merged results of ``inputs`` ((path, results) pairs, two or more shards of one run)."""
    if not inputs:
        raise MergeError("give at least one results.json to merge")
    names = [_name(p) for p, _ in inputs]
    seen_paths: dict[str, str] = {}
    for (path, _), name in zip(inputs, names):
        real = os.path.realpath(path)
        if real in seen_paths:
            raise MergeError(f"{name} is given twice (as {seen_paths[real]} and {name}); "
                             "give each shard's results.json once")
        seen_paths[real] = name
    first_name, first = names[0], inputs[0][1]
    for name, (_, data) in zip(names[1:], inputs[1:]):
        for field in ("options", "thresholds"):
            diff = _first_difference(first[field], data[field], field)
            if diff:
                raise MergeError(
                    f"{first_name} and {name} differ in {diff} ({_get(first, diff)!r} and "
                    f"{_get(data, diff)!r}): merge only shards of one run, made with the same "
                    "options and thresholds")
        a, b = first["provenance"].get("run_id"), data["provenance"].get("run_id")
        if a != b:  # scripts/slurm-shards.sh: shard folders of an earlier submission
            raise MergeError(f"{first_name} and {name} differ in provenance.run_id ({a!r} and "
                             f"{b!r}): they come from different submissions (a stale shard "
                             "folder?); merge only the shards of one run")
        for field in _SAME_PROVENANCE:
            a, b = first["provenance"].get(field), data["provenance"].get(field)
            if a != b:
                what = "code versions" if field == "git_commit" else field
                raise MergeError(f"{first_name} and {name} differ in provenance.{field} ({a!r} "
                                 f"and {b!r}): the shards ran different {what}; rerun them "
                                 "from one checkout")
    # input sets: models that read the same images or texts must have read the same content
    sets: dict = {}
    for name, (_, data) in zip(names, inputs):
        for kind_source, (digest, key) in _input_sets(data).items():
            if kind_source in sets and sets[kind_source][0] != digest:
                other_name, other_key = sets[kind_source][1:]
                raise MergeError(
                    f"{other_name} and {name} differ in models.{key}.input_set.hash (model "
                    f"{other_key} and {key} read different {kind_source[0]} inputs from the "
                    "same source): merge only shards made with the same input files")
            sets.setdefault(kind_source, (digest, name, key))
    # shards: one run, each shard once
    declared: set[str] = set()
    shard_count = None
    shard_of: dict[int, str] = {}
    for name, (_, data) in zip(names, inputs):
        shard = data["provenance"].get("shard")
        if shard is None:
            declared.update(data["models"])
            continue
        if shard_count is None:
            shard_count, declared_run = shard["count"], shard["declared_models"]
        if shard["count"] != shard_count or shard["declared_models"] != declared_run:
            field = "count" if shard["count"] != shard_count else "declared_models"
            raise MergeError(f"{names[0]} and {name} differ in provenance.shard.{field}: they "
                             "are shards of different runs (another --shard N or selection)")
        if shard["index"] in shard_of:
            raise MergeError(f"{shard_of[shard['index']]} and {name} are both shard "
                             f"{shard['index']}/{shard['count']}: give each shard once")
        shard_of[shard["index"]] = name
        declared.update(shard["declared_models"])
    # every model and every record once
    model_in: dict[str, str] = {}
    record_in: dict[tuple, str] = {}
    for name, (_, data) in zip(names, inputs):
        for key in data["models"]:
            if key in model_in:
                raise MergeError(f"{model_in[key]} and {name} both hold model {key}: each model "
                                 "must come from one shard only (the same shard twice?)")
            model_in[key] = name
        for rec in data["records"]:
            key = _record_key(rec)
            if key in record_in:
                raise MergeError(f"{record_in[key]} and {name} both hold the record of "
                                 f"{rec.get('test_id') or key}: duplicate records cannot be merged")
            record_in[key] = name
    recorded_models = set(model_in) | {r["model"] for _, d in inputs for r in d["records"]}
    missing = sorted(declared - recorded_models)

    models: dict = {}
    records: list = []
    not_run: set[str] = set()
    for _, data in inputs:
        models.update(data["models"])
        records.extend(data["records"])
        not_run.update(data["not_run"])
    statuses = [int(d.get("exit_status", 0)) for _, d in inputs]
    odd = [s for s in statuses if s not in (0, 1)]
    exit_status = odd[0] if odd else max(statuses)
    complete = all(d["complete"] for _, d in inputs) and not missing and not not_run
    prov = dict(first["provenance"])
    prov.pop("shard", None)
    prov.update({
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": command or "python -m report merge " + " ".join(names),
        "workers": sum(int(d["provenance"].get("workers") or 0) for _, d in inputs),
        "merged_from": [{"file": name, "shard": (
            f"{d['provenance']['shard']['index']}/{d['provenance']['shard']['count']}"
            if d["provenance"].get("shard") else None),
            "models": sorted(d["models"]), "date": d["provenance"].get("date"),
            "command": d["provenance"].get("command"),
            "platform": d["provenance"].get("platform"), "device": d["provenance"].get("device"),
            "complete": d["complete"], "exit_status": d.get("exit_status"),
            **({"interrupted_by": d["interrupted_by"]} if d.get("interrupted_by") else {}),
            "not_run": len(d["not_run"])}
            for name, (_, d) in zip(names, inputs)],
        "declared_models": sorted(declared),
        "missing_models": missing,
    })
    if shard_count is not None:
        prov["shard_count"] = shard_count
        prov["missing_shards"] = sorted(set(range(1, shard_count + 1)) - set(shard_of))
    if any(d["provenance"].get("accelerator_path") for _, d in inputs):
        prov["accelerator_path"] = True
    merged = {
        "schema": RESULTS_SCHEMA, "provenance": prov, "options": first["options"],
        "thresholds": first["thresholds"],
        "models": {k: models[k] for k in sorted(models)},
        "records": sorted(records, key=_record_key),
        "not_run": sorted(not_run),
        "complete": complete,
        "exit_status": exit_status,
    }
    # per-run fields recomputed or joined over the shards (one run's shape, docs/results-schema.md)
    from .summary import summary

    merged["summary"] = summary(merged["records"], merged["not_run"])
    durations = {k: v for _, d in inputs for k, v in (d.get("durations") or {}).items()}
    if durations or any("durations" in d for _, d in inputs):
        merged["durations"] = dict(sorted(durations.items()))
    errors = [e for _, d in inputs for e in d.get("errors", [])]
    if errors:
        merged["errors"] = errors
        merged["complete"] = False
    # fields other versions of the suite add (kept when every input agrees on them)
    for key in first:
        if key not in _BUILT and all(d.get(key) == first[key] for _, d in inputs):
            merged[key] = first[key]
    return merged


def merge_files(paths: list[Path], out_dir: Path, command: str | None = None) -> tuple[Path, Path, dict]:
    """Merge ``paths`` into ``out_dir``/results.json and report.html; nothing is written when
    the inputs are refused (MergeError) or the report cannot be rendered."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise MergeError(f"-o {_name(out_dir)} is a file; give a folder for results.json and "
                         "report.html")
    inputs = [(Path(p), load_input(Path(p))) for p in paths]
    merged = merge(inputs, command)
    text = json.dumps(merged, indent=1, allow_nan=False)
    html = render_report(json.loads(text))  # renders (and validates) before anything is written
    results_path, report_path = out_dir / "results.json", out_dir / "report.html"
    if any(os.path.realpath(results_path) == os.path.realpath(p) for p in paths):
        raise MergeError(f"-o {_name(out_dir)} would overwrite an input; give another folder")
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(results_path, text)
    atomic_write_text(report_path, html)
    return results_path, report_path, merged
