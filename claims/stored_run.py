"""A model run made of stored per-layer metrics, and the records its claims make from it.

The records of a claim test come from its model run through three things: ``run.layer_metrics(
claim, layer)``, ``run.options.rules`` and ``run.prepare()`` (the model's facts), with
``run.statistics`` as a shared cache (:mod:`fixtures.engine.model_run`). :class:`StoredRun` gives
the same from metrics computed elsewhere (the files of layer shards, ``--shard-by layers``), so
that :func:`rebuild` calls a claim's own record functions (``ClaimSpec.records``) over every
layer and gives the records one run over those layers gives: nothing is recomputed but the
decisions (nulls' adjustments, intervals, verdicts), which read every layer (method §7).

>>> import torch
>>> run = StoredRun({("X", 0): {"a": torch.zeros(2, 1)}}, {"head_dim": 4}, "ours")
>>> run.layer_metrics("X", 0)["a"].shape, run.prepare()["head_dim"], run.options.rules
(torch.Size([2, 1]), 4, 'ours')
"""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import torch

from .registry import get, resolve

#: The arguments a record function may name (``ClaimSpec.records``).
ARGUMENTS = ("run", "model", "layer", "head", "layers", "heads")


class StoredRun:
    """``layer_metrics``, ``prepare``, ``options.rules`` and ``statistics`` of a model run, from
    ``metrics`` ({(claim, layer): {name: tensor}}), the model's facts ``info`` (results.json's
    ``models[key]``) and the rule set ``rules``."""

    def __init__(self, metrics: dict[tuple[str, int], dict[str, torch.Tensor]], info: dict,
                 rules: str):
        self._metrics = metrics
        self._info = info
        self.options = SimpleNamespace(rules=rules)
        self.statistics: dict = {}

    def layer_metrics(self, claim: str, layer: int) -> dict[str, torch.Tensor]:
        try:
            return self._metrics[(claim, layer)]
        except KeyError:
            raise KeyError(f"no stored metrics of claim {claim} at layer {layer}") from None

    def prepare(self) -> dict:
        return self._info


def rebuild(claim: str, level: str, run, model: str, layers: list[int], heads: list[int],
            layer: int | None = None, head: int | None = None):
    """The record of ``claim`` at ``level`` (its ``ClaimSpec.records`` function, given the
    arguments it names among :data:`ARGUMENTS`); KeyError when the claim declares none."""
    spec = get(claim)
    if level not in spec.records:
        raise KeyError(f"claim {claim} declares no record function of level {level!r} "
                       "(ClaimSpec.records)")
    fn = resolve(spec.records[level])
    given = {"run": run, "model": model, "layer": layer, "head": head, "layers": layers,
             "heads": heads}
    return fn(**{name: given[name] for name in inspect.signature(fn).parameters if name in given})
