"""A :class:`~fixtures.engine.model_run.ModelRun` without a model, shared by the project's own
tests: one layer of captured q, k, v drawn from a seed, for code that takes a run (the claims'
per-layer computations, the specification curve's grid, the per-layer metrics cache).

Import it as ``from tests._synthetic_run import SyntheticRun`` (the checkout is on ``sys.path``
when pytest runs from it)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from fixtures.engine.model_run import ModelRun
from fixtures.engine.run_options import RunOptions

#: Samples, heads, tokens and head dimension of the synthetic layer.
B, H, N, D = 6, 2, 12, 4


class SyntheticRun(ModelRun):
    """One layer of captured q, k, v without a model: samples 0-3 have N tokens, 4-5 have N - 2
    (so the layer has two token-count groups, as a text model's has). ``cache``: a
    :class:`fixtures.cache.Cache` for :meth:`layer_metrics` (None: only
    :meth:`compute_layer`); ``tag`` marks a derived run, as the session's are."""

    def __init__(self, seed: int = 0, cache=None, tag: str = ""):
        super().__init__(SimpleNamespace(key="synthetic"), RunOptions(), cache=cache, tag=tag)
        g = torch.Generator().manual_seed(seed)
        k = torch.randn(B, H, N, D, generator=g)
        v = torch.randn(B, H, N, D, generator=g)
        mask = torch.ones(B, N, dtype=torch.bool)
        mask[4:, N - 2:] = False
        self._data = {"q": k.clone(), "k": k, "v": v, "token_mask": mask}
        self._info = {"input_set": {"n_samples": B, "names": [f"s{i}" for i in range(B)]},
                      "n_heads": H, "head_dim": D, "scale": None, "n_layers": 1,
                      "capture_key": "synthetic"}

    def prepare(self) -> dict:
        return self._info

    def layer_qkv(self, layer: int) -> dict:
        return self._data
