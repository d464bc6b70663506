"""The merge of layer shards (``pytest claims/ --shard K/N --shard-by layers``): one model's layers
run in N jobs, joined into the records one run over every layer gives.

A layer shard is a run over its range of layers, so its per-layer and per-head numbers are the
run's, but not every decision: claim V's head tests are adjusted across all the selected layers
and heads, and a model record aggregates every layer (method §7). Each shard therefore leaves the
per-layer metrics its records were computed from (``layer-metrics/`` beside its results.json,
listed with their sha256 in ``provenance.shard.layer_metrics``); this module checks each file
against that list, and rebuilds every record of a claim that declares its record functions
(``ClaimSpec.records``) through :func:`claims.stored_run.rebuild` over the union of the shards'
layers. What the run itself added to a record (test id, options, KV head, the model's notes) is
kept from the shard's record: its keys beyond those the claim gives over the shard's own layers.
A shard that is missing leaves its layers out, and the merge says so (``missing_layers``,
``complete: false``).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from safetensors.torch import load

from claims.records import as_json, plain, undefined_intervals
from claims.registry import get
from claims.stored_run import StoredRun, rebuild
from claims.outcome import outcome_of

from .merge_account import MergeError


def layer_run(inputs: list[tuple[Path, dict]], names: list[str]) -> bool:
    """Whether ``inputs`` are layer shards; a mix of layer shards and other files is refused."""
    kinds = [is_layer_shard(d) for _, d in inputs]
    if any(kinds) and not all(kinds):
        raise MergeError(f"{names[kinds.index(False)]} is not a layer shard (--shard-by layers) "
                         f"like {names[kinds.index(True)]}: merge layer shards only with the "
                         "other shards of their run")
    return bool(kinds) and kinds[0]


def is_layer_shard(data: dict) -> bool:
    """Whether a results.json is a layer shard's."""
    return (data["provenance"].get("shard") or {}).get("by") == "layers"


def _metrics_of(path: Path, name: str, data: dict) -> dict[tuple, dict]:
    """The per-layer metrics a shard lists, each file checked against its sha256:
    {(model, claim, layer): tensors}."""
    base = Path(path).resolve().parent
    out = {}
    for row in data["provenance"]["shard"].get("layer_metrics") or []:
        file = (base / str(row.get("file", ""))).resolve()
        if base not in file.parents or not file.is_file():
            raise MergeError(
                f"{name} lists {row.get('file')!r}, which is not a file beside it: copy the "
                "shard's whole folder (results.json and layer-metrics/), or rerun that shard")
        blob = file.read_bytes()
        if hashlib.sha256(blob).hexdigest() != row.get("sha256"):
            raise MergeError(f"{file} is not the file {name} wrote (its sha256 differs from "
                             "provenance.shard.layer_metrics): rerun that shard")
        out[(str(row["model"]), str(row["claim"]), int(row["layer"]))] = load(blob)
    return out


def _declared(claim: str) -> dict:
    """A claim's record functions (``ClaimSpec.records``); none for a claim not registered."""
    try:
        return get(claim).records
    except KeyError:
        return {}


def _finish(record, decorations: dict) -> dict:
    """A rebuilt record as the run writes it: JSON, undefined intervals said, the run's fields
    and the test's outcome (pass when supported, skip when undetermined, else fail)."""
    rec = undefined_intervals(plain(as_json(record)))
    rec.update(decorations)
    rec["outcome"] = outcome_of(rec["verdict"])
    return rec


def _family(shards: list[tuple[dict, dict]], model: str, claim: str) -> tuple[list, list, dict]:
    """(every layer, heads, {shard index: its layers}) of a claim's model records of ``model``."""
    own = {}
    heads = None
    for shard, data in shards:
        for rec in data["records"]:
            if rec["model"] == model and rec["claim"] == claim and rec.get("level") == "model":
                own[shard["index"]] = list(rec["layers"])
                heads = list(rec["heads"])
    if heads is None:
        raise MergeError(f"no layer shard holds the model record of claim {claim} for "
                         f"{model}: its head records cannot be adjusted across the model's "
                         "layers; run the model-level tests in every shard")
    return sorted({x for layers in own.values() for x in layers}), heads, own


def rebuilt_records(inputs: list[tuple[Path, dict]], names: list[str]) -> list[dict]:
    """The records of the layer shards ``inputs``, each claim's rebuilt over every layer
    (:mod:`claims.stored_run`); the shards' records of other claims (a series) as they are."""
    metrics: dict[tuple, dict] = {}
    for (path, data), name in zip(inputs, names):
        for key, tensors in _metrics_of(path, name, data).items():
            if key in metrics:
                raise MergeError(f"two shards hold the metrics of {key[0]} claim {key[1]} "
                                 f"layer {key[2]} ({name} is one): give each shard once")
            metrics[key] = tensors
    shards = [(d["provenance"]["shard"], d) for _, d in inputs]
    rules = inputs[0][1]["options"].get("rules", "ours")
    info = {m: i for _, d in inputs for m, i in d["models"].items()}
    full, mine, views, families, out, done = {}, {}, {}, {}, [], set()
    for shard, data in shards:
        for rec in data["records"]:
            model, claim, level = rec["model"], rec["claim"], rec.get("level")
            if level not in _declared(claim):
                if level == "model":
                    raise MergeError(
                        f"claim {claim} declares no record functions (ClaimSpec.records), so its "
                        f"model record of {model} cannot be rebuilt over every layer: run that "
                        "model in one job, or declare them")
                out.append(rec)  # a trend's series record (shard 1), or a claim's own records
                continue
            if (model, claim, level, rec.get("layer"), rec.get("head")) in done:
                continue  # a model record: one per shard, rebuilt once
            done.add((model, claim, level, rec.get("layer"), rec.get("head")))
            if (model, claim) not in families:
                families[(model, claim)] = _family(shards, model, claim)
            layers, heads, own = families[(model, claim)]
            if model not in full:  # one run over every layer, one per shard's own layers
                mine[model] = {k[1:]: v for k, v in metrics.items() if k[0] == model}
                full[model] = StoredRun(mine[model], info[model], rules)
            args = dict(claim=claim, level=level, model=model, heads=heads,
                        layer=rec.get("layer"), head=rec.get("head"))
            view = views.setdefault((model, shard["index"]),
                                    StoredRun(mine[model], info[model], rules))
            try:  # the record as the shard made it (its keys), and over every layer
                as_run = _finish(rebuild(run=view, layers=own[shard["index"]], **args), {})
                fresh = rebuild(run=full[model], layers=layers, **args)
            except KeyError as exc:
                raise MergeError(f"the layer shards lack metrics the record "
                                 f"{rec.get('test_id')} needs ({exc.args[0]}): rerun the "
                                 "shard of that layer") from None
            decorations = {k: v for k, v in rec.items()
                           if k not in as_run and k not in ("undefined", "outcome")}
            out.append(_finish(fresh, decorations))
    return out


def settle(merged: dict, inputs: list[tuple[Path, dict]]) -> None:
    """The merged run's exit status from its rebuilt records (1 when a claim test fails, as one
    run's pytest; a shard's fault status stays), and ``provenance.missing_layers``: a layer no
    shard ran makes the merge partial. Each model's facts must agree across the shards but for
    ``capture_key``, which names the shards' captures joined by ``+``."""
    inputs = sorted(inputs, key=lambda pair: pair[1]["provenance"]["shard"]["index"])
    for model in merged["models"]:  # one model: its facts agree but for the capture's layers
        infos = [d["models"][model] for _, d in inputs if model in d["models"]]
        for info in infos[1:]:
            differ = [k for k in set(info) | set(infos[0])
                      if k != "capture_key" and info.get(k) != infos[0].get(k)]
            if differ:
                raise MergeError(f"the layer shards differ in models.{model}.{sorted(differ)[0]}: "
                                 "they did not run the same model on the same inputs")
        keys = list(dict.fromkeys(i["capture_key"] for i in infos if "capture_key" in i))
        if keys:  # the captures of the shards' layer ranges, in shard order
            merged["models"][model] = {**infos[0], "capture_key": "+".join(keys)}
    if merged["exit_status"] in (0, 1):
        merged["exit_status"] = int(any(r.get("outcome") == "failed" for r in merged["records"]))
    gone = missing_layers(inputs)
    merged["provenance"]["missing_layers"] = gone
    if gone:
        merged["complete"] = False


def missing_layers(inputs: list[tuple[Path, dict]]) -> dict[str, list[int]]:
    """Per model, the declared layers no shard ran."""
    declared = inputs[0][1]["provenance"]["shard"]["declared_layers"]
    ran: dict[str, set] = {}
    for _, data in inputs:
        for model, layers in data["provenance"]["shard"]["layers"].items():
            ran.setdefault(model, set()).update(layers)
    gone = {m: sorted(set(ls) - ran.get(m, set())) for m, ls in declared.items()}
    return {m: ls for m, ls in gone.items() if ls}
