"""The records of a results file, typed (:mod:`claims.records`) and grouped for the report by
(claim, model, level), and the claims the report shows: every registered claim
(:func:`claims.registry.all_claims`), then any other claim the records name.
"""

from __future__ import annotations

from claims import registry
from claims.records import Record


def _unit_key(rec: Record) -> tuple:
    return (-1 if rec.layer is None else rec.layer, -1 if rec.head is None else rec.head,
            rec.test_id or "")


def spec_of(claim: str) -> registry.ClaimSpec | None:
    """The registered spec of ``claim``; None for a claim this process has not registered (a
    results file of a third-party claim: the report shows it with the generic section)."""
    return next((s for s in registry.all_claims() if s.id == claim), None)


class Index:
    """The typed records of a results file, grouped by (claim, model, level), each group sorted."""

    def __init__(self, results: dict):
        self.results = results
        self.records = [Record.from_json(r) for r in results["records"]]
        self.groups: dict[tuple[str, str, str], list[Record]] = {}
        for rec in self.records:
            self.groups.setdefault((rec.claim, rec.model, rec.level), []).append(rec)
        for group in self.groups.values():
            group.sort(key=_unit_key)
        self.models_info = results["models"]

    def get(self, claim: str, model: str, level: str) -> list[Record]:
        return self.groups.get((claim, model, level), [])

    def model_record(self, claim: str, model: str) -> Record | None:
        recs = self.get(claim, model, "model")
        return recs[0] if recs else None

    def claims(self) -> list[str]:
        """The registered claims always (a claim without records reads "not run"), in
        registration order, then any other claim the records name, sorted."""
        registered = [s.id for s in registry.all_claims()]
        extra = sorted({c for c, _, _ in self.groups} - set(registered))
        return registered + extra

    def models(self) -> list[str]:
        """Model keys (not series): the recorded models, then any model only records name;
        real models first, controls after, each group sorted by key."""
        keys = set(self.models_info)
        keys |= {m for (_, m, level) in self.groups if level != "series"}
        return sorted(keys, key=lambda k: (bool(self._info(k).get("control")), k))

    def _info(self, model: str) -> dict:
        info = self.models_info.get(model)
        return info if isinstance(info, dict) else {}

    def series(self) -> list[Record]:
        return sorted((r for (c, _, lv), g in self.groups.items() if lv == "series" for r in g),
                      key=lambda r: (r.claim, r.model, r.test_id or ""))

    def units(self, claim: str, model: str) -> list[Record]:
        """Head and layer records of a claim for a model."""
        return self.get(claim, model, "head") + self.get(claim, model, "layer")

    def layers_heads(self, model: str) -> tuple[list[int], list[int]]:
        """The layers and heads this run covered for a model (the union over claims, including
        the model records' ``layers``/``heads``); the model's full range when nothing says."""
        layers, heads = set(), set()
        for (_, m, level), group in self.groups.items():
            if m != model or level == "series":
                continue
            for rec in group:
                if rec.layer is not None:
                    layers.add(rec.layer)
                if rec.head is not None:
                    heads.add(rec.head)
                if level == "model":
                    for name, into in (("layers", layers), ("heads", heads)):
                        listed = getattr(rec, name, None) or rec.extra.get(name)
                        if isinstance(listed, list):
                            into.update(x for x in listed if isinstance(x, int))
        info = self._info(model)
        if not layers and isinstance(info.get("n_layers"), int):
            layers = set(range(info["n_layers"]))
        if not heads and isinstance(info.get("n_heads"), int):
            heads = set(range(info["n_heads"]))
        return sorted(layers), sorted(heads)
