"""``python -m report merge A/results.json B/results.json … -o OUT/``: join the results.json files of
the shards of one run (``pytest claims/ --shard K/N``) into one results.json and report.html.

The merged file has the shape of a normal results.json (the report and the baseline gate read it
as they read one run's). Shards are joined only when they belong to one run: the same options,
thresholds, code version (git commit) and input sets, each shard once, each record once. Any
mismatch refuses the merge with one sentence naming the field and both values, and nothing is
written. Nothing in a shard is trusted: each is parsed strictly and validated against
docs/results.schema.json (record types, finite numbers, metric ranges); every test a shard ran
(its ``durations``) must have a record, a ``skipped`` reason or a ``not_run`` entry, every
record a test that ran, a shard that says ``complete: true`` no test under ``not_run``, and a
shard's ``summary`` the counts of what it holds (:func:`check_accounted`); a shard that says it
ended early (a time limit, ``scancel``, a fault), with few records or none, is merged as partial
and named. The shards' samples.jsonl (``--save-samples``) are joined when every shard
has one, and the merge is refused when only some have, or one is missing. Models of
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

from . import merge_layers
from .merge_account import MergeError, check_accounted
from .atomic import atomic_open, atomic_write_text
from .render import render_report
from .results_file import validate_results
from .summary import summary


def _record_key(rec: dict) -> tuple:
    """A record's identity and sort key (as pytest claims/ sorts its records)."""
    return (rec["claim"], rec["model"], rec.get("level", ""),
            -1 if rec.get("layer") is None else rec["layer"],
            -1 if rec.get("head") is None else rec["head"], rec.get("test_id", ""))

#: Top-level fields the merge builds itself; any other field is kept when every input agrees.
_BUILT = ("schema", "provenance", "options", "thresholds", "models", "records", "not_run",
          "complete", "exit_status", "summary", "durations", "errors", "skipped", "samples",
          "instrument_failures")
#: Provenance fields that must be equal across the inputs (code and numerics).
_SAME_PROVENANCE = ("git_commit", "dtype")


def _name(path: Path) -> str:
    """A path as the user gave it."""
    return str(path)


def load_input(path: Path) -> dict:
    """One results.json, checked to be complete JSON in the results schema."""
    from . import validate

    name = _name(path)
    try:
        data = validate.read_json(path, "")
    except validate.InvalidFile as exc:
        if not Path(path).exists():
            raise MergeError(f"{name}: no such file; give the results.json of each shard") from None
        if Path(path).is_dir():
            raise MergeError(f"{name} is a folder; give the results.json inside it") from None
        raise MergeError(f"{exc}; copy it again or rerun that shard") from None
    if not isinstance(data, dict) or data.get("schema") != RESULTS_SCHEMA:
        schema = data.get("schema") if isinstance(data, dict) else f"none: a JSON {type(data).__name__}"
        raise MergeError(f"{name} is not a kpca-claims results.json (schema {schema!r}, "
                         f"expected {RESULTS_SCHEMA!r})")
    try:
        validate_results(data)
    except ValueError as exc:
        raise MergeError(f"{name} is not a complete results.json: {exc}") from None
    try:
        validate.check(data, name, "results")
    except validate.InvalidFile as exc:
        raise MergeError(f"{exc}: a hand-edited or damaged shard? Rerun that shard") from None
    return data


def _first_difference(a, b, where: str) -> tuple[str, object, object] | None:
    """The dotted path of the first place where ``a`` and ``b`` differ, with the two values
    there (``<missing>`` for a key one side lacks), or None."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b), key=str):
            if key not in a or key not in b:
                return (f"{where}.{key}", a.get(key, _MISSING), b.get(key, _MISSING))
            found = _first_difference(a[key], b[key], f"{where}.{key}")
            if found:
                return found
        return None
    return None if a == b else (where, a, b)


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


_MISSING = _Missing()


def _samples(path: Path, data: dict) -> Path | None:
    """The samples file a shard names (``samples``, beside its results.json), or None."""
    name = data.get("samples")
    return None if not name else Path(path).parent / str(name)


def check_samples(inputs: list[tuple[Path, dict]], names: list[str]) -> list[Path] | None:
    """The shards' samples.jsonl files when every shard has one (--save-samples), None when
    none has; a mix, a missing file or a row that names a model of another shard is refused."""
    files = [_samples(p, d) for p, d in inputs]
    if not any(files):
        return None
    for name, f in zip(names, files):
        if f is None:
            other = names[next(i for i, x in enumerate(files) if x)]
            raise MergeError(f"{other} has per-sample values ({_name(_samples(*inputs[names.index(other)]))}) "
                             f"and {name} has none: run every shard with --save-samples, or none")
        if not f.is_file():
            raise MergeError(f"{name} names its per-sample values {f}, which does not exist: copy "
                             "it beside the shard's results.json, or rerun that shard")
    for name, f, (_, data) in zip(names, files, inputs):
        models = {r["model"] for r in data["records"]}
        try:
            with open(f, encoding="utf-8") as rows:
                for i, line in enumerate(rows, 1):
                    row = json.loads(line)
                    if not isinstance(row, dict) or row.get("model") not in models:
                        raise MergeError(f"{f} line {i} is not a per-sample row of a model of {name} "
                                         f"(model {row.get('model') if isinstance(row, dict) else row!r}): "
                                         "the samples file belongs to another shard")
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            if isinstance(exc, MergeError):
                raise
            raise MergeError(f"{f} cannot be read as JSON Lines ({exc}): copy it again or rerun "
                             "that shard") from None
    return files


def _input_sets(data: dict) -> dict:
    """(kind, source) of each input set → its content hash (models on the same images or texts
    share one input set; trained models have their own fixed batch)."""
    out = {}
    for key, info in data["models"].items():
        inp = info.get("input_set") or {}
        out[(inp.get("kind"), inp.get("source"))] = (inp.get("hash"), key)
    return out


def _check_inputs(inputs: list[tuple[Path, dict]], names: list[str]) -> None:
    """Each input given once, each accounted for, and all of one run: the same options,
    thresholds, submission and code, and the same content wherever models read one input set."""
    seen_paths: dict[str, str] = {}
    for (path, _), name in zip(inputs, names):
        real = os.path.realpath(path)
        if real in seen_paths:
            raise MergeError(f"{name} is given twice (as {seen_paths[real]} and {name}); "
                             "give each shard's results.json once")
        seen_paths[real] = name
    for name, (_, data) in zip(names, inputs):
        check_accounted(name, data)
    first_name, first = names[0], inputs[0][1]
    for name, (_, data) in zip(names[1:], inputs[1:]):
        for field in ("options", "thresholds"):
            diff = _first_difference(first[field], data[field], field)
            if diff:
                where, a, b = diff
                raise MergeError(
                    f"{first_name} and {name} differ in {where} ({a!r} and {b!r}): merge only "
                    "shards of one run, made with the same options and thresholds")
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


def _shards(inputs: list[tuple[Path, dict]], names: list[str]) -> tuple[set, int | None, dict]:
    """(declared models, shard count or None, {shard index: input name}): the shards of one run,
    each once."""
    declared: set[str] = set()
    shard_count = None
    shard_of: dict[int, str] = {}
    for name, (_, data) in zip(names, inputs):
        shard = data["provenance"].get("shard")
        if shard is None:
            declared.update(data["models"])
            continue
        if shard_count is None:
            shard_count, first_shard = shard["count"], shard
        differ = [f for f in ("count", "declared_models", "by", "declared_layers")
                  if shard.get(f) != first_shard.get(f)]
        if differ:
            raise MergeError(f"{names[0]} and {name} differ in provenance.shard.{differ[0]}: "
                             "they are shards of different runs (another --shard N, --shard-by "
                             "or selection)")
        if shard["index"] in shard_of:
            raise MergeError(f"{shard_of[shard['index']]} and {name} are both shard "
                             f"{shard['index']}/{shard['count']}: give each shard once")
        shard_of[shard["index"]] = name
        declared.update(shard["declared_models"])
    return declared, shard_count, shard_of


def _recorded_models(inputs: list[tuple[Path, dict]], names: list[str], by_layers: bool) -> set:
    """The models the inputs hold, every model and every record in one input only (layer shards
    share their models and their model records, which the merge rebuilds)."""
    model_in: dict[str, str] = {}
    record_in: dict[tuple, str] = {}
    for name, (_, data) in zip(names, inputs):
        for key in data["models"]:
            if key in model_in and not by_layers:  # layer shards share their models
                raise MergeError(f"{model_in[key]} and {name} both hold model {key}: each model "
                                 "must come from one shard only (the same shard twice?)")
            model_in[key] = name
        for rec in data["records"]:
            key = _record_key(rec)
            if key in record_in and not (by_layers and rec.get("level") == "model"):
                raise MergeError(f"{record_in[key]} and {name} both hold the record of "
                                 f"{rec.get('test_id') or key}: duplicate records cannot be merged")
            record_in[key] = name
    return set(model_in) | {r["model"] for _, d in inputs for r in d["records"]}


def _provenance(inputs: list[tuple[Path, dict]], names: list[str], command: str | None,
                declared: set, missing: list, shard_count: int | None, shard_of: dict) -> dict:
    """The merged run's provenance: the first input's, with the merge's date and command, the
    workers added up, each input's own summary and what is missing."""
    first = inputs[0][1]
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
    return prov


def _joined_fields(merged: dict, inputs: list[tuple[Path, dict]]) -> None:
    """The per-run fields recomputed or joined over the shards (one run's shape,
    docs/results-schema.md), added to ``merged``."""
    first = inputs[0][1]
    merged["summary"] = summary(merged["records"], merged["not_run"])
    durations: dict = {}  # a layer shard's model tests ran in every shard: their times add
    for _, d in inputs:
        for k, v in (d.get("durations") or {}).items():
            durations[k] = durations.get(k, 0.0) + v
    if durations or any("durations" in d for _, d in inputs):
        merged["durations"] = dict(sorted(durations.items()))
    failures = [e for _, d in inputs for e in d.get("instrument_failures", [])]
    if failures:  # controls that got a verdict they cannot have (method §12)
        merged["instrument_failures"] = failures
    skipped = {k: v for _, d in inputs for k, v in (d.get("skipped") or {}).items()}
    if skipped or any("skipped" in d for _, d in inputs):
        merged["skipped"] = dict(sorted(skipped.items()))
    errors = [e for _, d in inputs for e in d.get("errors", [])]
    if errors:
        merged["errors"] = errors
        merged["complete"] = False
    # fields other versions of the suite add (kept when every input agrees on them)
    for key in first:
        if key not in _BUILT and all(d.get(key) == first[key] for _, d in inputs):
            merged[key] = first[key]


def merge(inputs: list[tuple[Path, dict]], command: str | None = None) -> dict:
    """The merged results of ``inputs`` ((path, results) pairs, two or more shards of one run)."""
    if not inputs:
        raise MergeError("give at least one results.json to merge")
    names = [_name(p) for p, _ in inputs]
    _check_inputs(inputs, names)
    declared, shard_count, shard_of = _shards(inputs, names)
    by_layers = merge_layers.layer_run(inputs, names)
    missing = sorted(declared - _recorded_models(inputs, names, by_layers))
    models: dict = {}
    records: list = []
    not_run: set[str] = set()
    for _, data in inputs:
        models.update(data["models"])
        records.extend(data["records"])
        not_run.update(data["not_run"])
    if by_layers:  # every record of a sharded claim rebuilt over every layer (method §7)
        records = merge_layers.rebuilt_records(inputs, names)
    statuses = [int(d.get("exit_status", 0)) for _, d in inputs]
    odd = [s for s in statuses if s not in (0, 1, 9)]  # 9: that shard judged nothing
    judged = [s for s in statuses if s in (0, 1)]
    first = inputs[0][1]
    merged = {
        "schema": RESULTS_SCHEMA,
        "provenance": _provenance(inputs, names, command, declared, missing, shard_count,
                                  shard_of),
        "options": first["options"], "thresholds": first["thresholds"],
        "models": {k: models[k] for k in sorted(models)},
        "records": sorted(records, key=_record_key),
        "not_run": sorted(not_run),
        "complete": all(d["complete"] for _, d in inputs) and not missing and not not_run,
        "exit_status": odd[0] if odd else max(judged) if judged else 9,
    }
    if by_layers:  # the rebuilt records decide the exit; a missing shard's layers are named
        merge_layers.settle(merged, inputs)
    _joined_fields(merged, inputs)
    return merged


def merge_files(paths: list[Path], out_dir: Path, command: str | None = None) -> tuple[Path, Path, dict]:
    """Merge ``paths`` into ``out_dir``/results.json and report.html; nothing is written when
    the inputs are refused (MergeError) or the report cannot be rendered."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise MergeError(f"-o {_name(out_dir)} is {'a file' if out_dir.is_file() else 'a FIFO, a socket or a device'}, "
                         "not a folder; give a folder for results.json and report.html")
    inputs = [(Path(p), load_input(Path(p))) for p in paths]
    merged = merge(inputs, command)
    samples = check_samples(inputs, [_name(p) for p, _ in inputs])
    if samples:
        merged["samples"] = "samples.jsonl"
    from . import validate

    text = json.dumps(merged, indent=1, allow_nan=False)
    try:  # the merged file must be one its own schema accepts
        validate.check(json.loads(text), "the merged results", "results")
    except validate.InvalidFile as exc:
        raise MergeError(f"{exc}: the shards cannot be merged into a valid results.json") from None
    results_path, report_path = out_dir / "results.json", out_dir / "report.html"
    # renders (and validates) before anything is written; its method links relative to it
    html = render_report(json.loads(text), out_path=report_path)
    samples_path = out_dir / "samples.jsonl"
    written = [results_path, report_path] + ([samples_path] if samples else [])
    if any(os.path.realpath(w) == os.path.realpath(p) for w in written for p in [*paths, *(samples or [])]):
        raise MergeError(f"-o {_name(out_dir)} would overwrite an input; give another folder")
    out_dir.mkdir(parents=True, exist_ok=True)
    if samples:
        with atomic_open(samples_path) as f:
            for part in samples:
                with open(part, encoding="utf-8") as rows:
                    f.writelines(line if line.endswith("\n") else line + "\n" for line in rows)
    atomic_write_text(results_path, text)
    atomic_write_text(report_path, html)
    return results_path, report_path, merged
