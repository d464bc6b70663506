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

import contextlib
import json
from pathlib import Path

import pytest
import torch

import fixtures  # noqa: F401  (torchvision shim before transformers)
import transformers
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


@contextlib.contextmanager
def _returned_attention(loaded):
    """A list that each attention module's index is appended to as the module returns."""
    attns = families.get(loaded.family).attention_modules(loaded.model)
    returned: list[int] = []
    handles = [a.register_forward_hook(lambda *_args, i=i: returned.append(i))
               for i, a in enumerate(attns)]
    try:
        yield returned
    finally:
        for h in handles:
            h.remove()


def test_each_layer_is_handed_on_inside_the_forward_pass(tmp_path):
    for name, loaded, batch in _cases(tmp_path):
        arrivals = []
        with _returned_attention(loaded) as returned:
            got = capture_qkv(loaded, batch, sink=lambda layer, t: arrivals.append(
                (layer, len(returned), sorted(t))))
        # layer i arrives after attention i − 1 returned and before attention i returned
        assert arrivals == [(i, i, ["k", "q", "v"]) for i in range(loaded.n_layers)], name
        assert "q" not in got and got["layers"] == tuple(range(loaded.n_layers))


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


# --- --device-map: transformers places a hub model over the devices ----------------------------

def _llama_folder_spec(tmp_path: Path):
    """A save_pretrained Llama folder (config and weights) read as a hub model, as a user's
    downloaded checkpoint is."""
    from dataclasses import replace

    config = CONFIGS["llama"]()
    folder = tmp_path / "llama-hub"
    model = transformers.AutoModel.from_config(config)
    model.save_pretrained(folder)
    return replace(_spec(folder, config), source="hub", key="tiny-llama-hub")


def test_a_placed_model_captures_what_the_unplaced_one_does(tmp_path, monkeypatch):
    spec = _llama_folder_spec(tmp_path)
    batch = text_batch([9, 6, 3], vocab=64)
    plain = loading.load_model(spec)
    asked = []
    original = transformers.AutoModel.from_pretrained
    monkeypatch.setattr(transformers.AutoModel, "from_pretrained",
                        lambda *a, **kw: asked.append(kw.get("device_map")) or original(*a, **kw))
    # on one device transformers puts every weight there (hooks only across several devices)
    placed = loading.load_model(spec, placement={"device_map": "auto"})
    assert asked == ["auto"] and placed.checkpoint_hash == plain.checkpoint_hash
    for forward in (torch.float64, torch.bfloat16):
        a = capture_qkv(plain, batch, forward_dtype=forward)
        b = capture_qkv(placed, batch, forward_dtype=forward)
        for part in ("q", "k", "v"):
            torch.testing.assert_close(b[part], a[part], rtol=1e-6, atol=0)
    # a reduced forward precision: loaded in it, so the weights are never held wider
    narrow = loading.load_model(spec, placement={"device_map": "auto", "dtype": torch.bfloat16})
    assert {p.dtype for p in narrow.model.parameters()} == {torch.bfloat16}
    got = capture_qkv(narrow, batch, forward_dtype=torch.bfloat16)
    torch.testing.assert_close(got["k"], capture_qkv(plain, batch, forward_dtype=torch.bfloat16)["k"],
                               rtol=1e-6, atol=0)


def test_offloaded_weights_in_another_precision_are_refused_in_one_sentence():
    layer = torch.nn.Linear(4, 4, device="meta")  # what a device map leaves for offloaded weights
    with pytest.raises(NotImplementedError, match=r"^the device map offloaded weights stored in "
                       r"torch.float32 .* give --forward-dtype float32, or more devices$"):
        with forward_precision(layer, torch.float64):
            pass
    with forward_precision(layer, torch.float32):  # the weights' own precision: nothing to convert
        pass


def test_device_map_for_a_model_transformers_does_not_load_is_a_usage_error(pytester, tmp_path):
    from tests.test_decoders import usage_error

    line = usage_error(_claims(pytester, tmp_path, "--models", "control-vit_tiny_patch16_224",
                               "--device-map", "auto"), tmp_path)
    assert line == ("ERROR: --device-map places a model that transformers' from_pretrained loads "
                    "(a hub or package model of an HF family); control-vit_tiny_patch16_224 is a "
                    "random model of family timm-vit: drop --device-map for it")


def test_a_claim_run_with_a_device_map(pytester, tmp_path):
    """MiniLM (a package model of the BERT family) placed by accelerate, as a user runs it."""
    result = _claims(pytester, tmp_path, "--models", "all-MiniLM-L6-v2", "--layers", "0",
                     "--heads", "0", "--n-samples", "3", "--threads", "1", "--device-map", "auto",
                     "-k", "test_value_vectors and not model", "--report", "none")
    assert result.ret in (0, 1), result.stdout.str()[-3000:]
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["options"]["device_map"] == "auto"
    assert [r["test_id"] for r in results["records"]] == [
        "test_value_vectors[all-MiniLM-L6-v2-L00-H0]"]


# --- --layers: only the layers a run reads are captured -----------------------------------------

def test_the_forward_pass_stops_after_the_last_wanted_layer(tmp_path):
    from fixtures.models.capture_batches import capture_to_layer_files

    for name, loaded, batch in _cases(tmp_path):
        with _returned_attention(loaded) as ran:
            meta = capture_to_layer_files(loaded, [batch], tmp_path / name, layers=[0])
        assert ran == [] or ran == [0], name  # layer 0's hook may not even return; 1.. never run
        assert meta["layers"] == (0,) and meta["n_layers"] == 1
        assert sorted(p.name for p in (tmp_path / name).iterdir()) == ["layer_00.safetensors"]


def _capture_entries(cache: Path) -> dict[str, list[str]]:
    """Each capture entry of the cache → the layer files it holds."""
    return {entry.name: sorted(p.name for p in entry.glob("layer_*.safetensors"))
            for entry in (cache / "capture").iterdir() if entry.is_dir()}


def test_a_run_captures_only_its_layers_and_reuses_a_whole_capture(pytester, tmp_path):
    folder = _folder(tmp_path, CONFIGS["llama"]())
    args = ("--checkpoint", str(folder / "model.safetensors"), "--arch", str(folder),
            "--n-samples", "3", "--threads", "1", "--max-tokens", "16", "-k", "value_vectors",
            "--report", "none")

    def run(*more):
        result = _claims(pytester, tmp_path, *args, *more)
        assert result.ret in (0, 1), result.stdout.str()[-3000:]
        return json.loads((tmp_path / "out" / "results.json").read_text())

    # two captures each time: the model's and its random-init twin's (claim V, method §2.6),
    # both of the layers asked for
    first = run("--layers", "0")
    assert list(_capture_entries(tmp_path / "cache").values()) == [["layer_00.safetensors"]] * 2
    whole = run()
    entries = _capture_entries(tmp_path / "cache")
    assert sorted(entries.values()) == [["layer_00.safetensors"]] * 2 + [
        ["layer_00.safetensors", "layer_01.safetensors"]] * 2
    again = run("--layers", "1")  # read from the whole capture: no new entry
    assert _capture_entries(tmp_path / "cache") == entries
    heads = [r for r in first["records"] if r["level"] == "head"]
    assert heads
    for rec in heads:  # the same numbers from one layer's capture and the whole one
        twin = next(r for r in whole["records"] if r["test_id"] == rec["test_id"])
        assert twin["metrics"] == pytest.approx(rec["metrics"], rel=1e-12, abs=1e-15)
    assert {r["layer"] for r in again["records"] if r["level"] == "head"} == {1}


def test_grouped_query_keys_and_values_are_stored_once_per_kv_head(tmp_path):
    from safetensors.torch import load_file

    from fixtures.models.capture_batches import (capture_in_batches, capture_to_layer_files,
                                                 repeat_kv_heads)

    loaded = _llama(tmp_path)  # 4 query heads over 2 KV heads
    assert loaded.spec.n_rep == 2
    batch = text_batch([9, 6, 3], vocab=64)
    whole = capture_in_batches(loaded, [batch])
    meta = capture_to_layer_files(loaded, [batch], tmp_path / "files", kv_repeat=2)
    assert meta["kv_repeat"] == 2
    for layer in range(2):
        got = load_file(str(tmp_path / "files" / f"layer_{layer:02d}.safetensors"))
        assert got["q"].shape[1] == 4 and got["k"].shape[1] == got["v"].shape[1] == 2
        for name in ("q", "k", "v"):
            torch.testing.assert_close(repeat_kv_heads(got[name], 1 if name == "q" else 2),
                                       whole[name][layer], rtol=1e-6, atol=0)
    with pytest.raises(ValueError, match="layer 0: k and v are not 4 copies of each key/value head"):
        capture_to_layer_files(loaded, [batch], tmp_path / "wrong", kv_repeat=4)
