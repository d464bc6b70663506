"""The capture one layer at a time and the precision of its forward pass (method §13.3).

- :func:`fixtures.models.capture.capture_qkv` hands each layer's q, k, v on from inside the
  forward pass, after that layer's attention has run and before the next one's has: the capture
  holds one layer at a time whatever the depth (checked by counting attention modules that have
  returned when each layer arrives, for the three ways a family captures: BERT's three
  projection hooks, timm's fused qkv hook, a decoder's attention kernel).
- What arrives layer by layer is what the in-memory capture returns.
- ``--forward-dtype``: the forward pass in bfloat16/float16/float32 changes q, k, v by about that
  precision's rounding and gives the caller its model back bit for bit; a claim run records it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import fixtures  # noqa: F401  (torchvision shim before transformers)
from fixtures.models import families, loading
from fixtures.models.capture import FORWARD_DTYPES, capture_qkv, forward_precision
from tests.test_capture import hf_spec, images, text_batch, vit_spec
from tests.test_decoders import CONFIGS, _claims, _folder, _spec

pytestmark = pytest.mark.xdist_group("decoders")
pytest_plugins = ["pytester"]


def _bert():
    return loading.load_model(hf_spec("bert", heads=4, hidden=32))


def _llama(tmp_path: Path):
    config = CONFIGS["llama"]()
    folder = tmp_path / "llama"
    config.save_pretrained(folder)
    return loading.load_model(_spec(folder, config))


def _cases(tmp_path: Path):
    """(name, loaded model, batch): one per way a family captures."""
    deeper = vit_spec("tiny-vit-4", depth=4)
    return [("bert", _bert(), text_batch([9, 6, 3])),
            ("timm", loading.load_model(deeper), images(2)),
            ("decoder", _llama(tmp_path), text_batch([9, 6, 3], vocab=64))]


def test_each_layer_is_handed_on_inside_the_forward_pass(tmp_path):
    for name, loaded, batch in _cases(tmp_path):
        attns = families.get(loaded.family).attention_modules(loaded.model)
        returned = []
        handles = [a.register_forward_hook(lambda *_args, i=i: returned.append(i))
                   for i, a in enumerate(attns)]
        arrivals = []
        try:
            got = capture_qkv(loaded, batch, sink=lambda layer, t: arrivals.append(
                (layer, len(returned), sorted(t))))
        finally:
            for h in handles:
                h.remove()
        # layer i arrives after attention i − 1 returned and before attention i returned
        assert arrivals == [(i, i, ["k", "q", "v"]) for i in range(len(attns))], name
        assert "q" not in got and got["layers"] == tuple(range(len(attns)))


def test_what_arrives_layer_by_layer_is_the_in_memory_capture(tmp_path):
    for name, loaded, batch in _cases(tmp_path):
        whole = capture_qkv(loaded, batch, layers=[1, 0])
        parts: dict[int, dict] = {}
        streamed = capture_qkv(loaded, batch, layers=[1, 0],
                               sink=lambda layer, t: parts.setdefault(layer, t))
        assert sorted(parts) == [0, 1] and whole["layers"] == streamed["layers"] == (1, 0)
        for row, layer in enumerate(whole["layers"]):  # the in-memory one in the order asked
            for part in ("q", "k", "v"):
                torch.testing.assert_close(parts[layer][part], whole[part][row], rtol=1e-6,
                                           atol=0, msg=f"{name} layer {layer} {part}")
        assert torch.equal(streamed["token_mask"], whole["token_mask"])
        torch.testing.assert_close(streamed["output"], whole["output"], rtol=1e-6, atol=0)


def test_forward_precision_gives_the_model_back_bit_for_bit():
    loaded = _bert()
    before = {k: v.clone() for k, v in loaded.model.state_dict().items()}
    for dtype in (torch.float64, torch.bfloat16, torch.float16, torch.float32):
        with forward_precision(loaded.model, dtype):
            floating = [p for p in loaded.model.parameters() if p.is_floating_point()]
            assert {p.dtype for p in floating} == {dtype}
        after = loaded.model.state_dict()
        assert all(after[k].dtype == v.dtype and torch.equal(after[k], v) for k, v in before.items())


@pytest.mark.parametrize("name", ["bfloat16", "float16", "float32"])
def test_a_reduced_precision_forward_moves_qkv_by_its_rounding(name):
    loaded = _bert()
    batch = text_batch([9, 6, 3])
    reference = capture_qkv(loaded, batch, dtype=torch.float64)  # float64 forward
    got = capture_qkv(loaded, batch, forward_dtype=FORWARD_DTYPES[name])
    eps = torch.finfo(FORWARD_DTYPES[name]).eps
    mask = got["token_mask"][None, :, None, :, None]
    for part in ("q", "k", "v"):
        assert got[part].dtype == torch.float32
        error = ((got[part].double() - reference[part]) * mask).abs().max()
        scale = reference[part].abs().max()
        # a few roundings of that precision through two layers, not the float64 pass's bits
        assert 0 < error <= 64 * eps * scale, (part, float(error / scale), eps)


def test_a_claim_run_records_the_forward_precision(pytester, tmp_path):
    folder = _folder(tmp_path, CONFIGS["llama"]())
    result = _claims(pytester, tmp_path, "--checkpoint", str(folder / "model.safetensors"),
                     "--arch", str(folder), "--layers", "1", "--heads", "0", "--n-samples", "3",
                     "--threads", "1", "--max-tokens", "16", "--forward-dtype", "bfloat16",
                     "-k", "value_vectors", "--report", "none")
    assert result.ret in (0, 1), result.stdout.str()[-3000:]
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["options"]["forward_dtype"] == "bfloat16"
    assert results["records"] and all(r["options"]["forward_dtype"] == "bfloat16"
                                      for r in results["records"])
