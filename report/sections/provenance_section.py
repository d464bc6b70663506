"""This module owns the report's "Provenance" section: the run's provenance, versions, numeric
environment (method §13) and options, every model with its input set, and the records whose
options differ from the run's."""

from __future__ import annotations

from ..common import flat, fmt
from ..diff import leaves
from ..index import Index


def provenance_context(results: dict, index: Index) -> dict:
    prov = results["provenance"]
    run = [(k, flat(prov[k])) for k in sorted(prov) if k not in ("versions", "numeric_environment")]
    run += [("schema", results["schema"]), ("complete", fmt(results["complete"])),
            ("exit_status", fmt(results.get("exit_status")))]
    versions = sorted((k, v if v is not None else "not installed")
                      for k, v in (prov.get("versions") or {}).items())
    options = [(k, flat(v)) for k, v in sorted(results["options"].items())]
    # CPU, dispatch ISA, BLAS, threads, env variables: beside the versions (method §13)
    numeric = [(k, flat(v)) for k, v in leaves(prov.get("numeric_environment") or {}).items()]
    models = []
    for m in index.models():
        info = index.models_info.get(m)
        if info is None:
            models.append({"key": m, "missing": True})
            continue
        inp = info.get("input_set") or {}
        fields = [(k, flat(info[k])) for k in sorted(info) if k not in ("input_set", "key")]
        inp_fields = [(k, flat(inp[k])) for k in sorted(inp) if k not in ("names", "notes")]
        models.append({"key": m, "missing": False, "fields": fields, "input": inp_fields,
                       "notes": [str(n) for n in inp.get("notes") or []],
                       "names": [str(n) for n in inp.get("names") or []]})
    # options recorded on records that differ from the run's options (never expected)
    odd = sorted({r.test_id or "?" for r in index.records
                  if isinstance(r.options, dict) and r.options != results["options"]})
    return {"run": run, "versions": versions, "numeric": numeric, "options": options,
            "models": models,
            "odd_options": odd[:20], "n_odd_options": len(odd),
            "samples": results.get("samples") if isinstance(results.get("samples"), str) else None}
