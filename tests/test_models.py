"""Registry, loaders and checkpoints: fixtures/models/catalogue.py and fixtures/models/loading.py."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

import fixtures  # noqa: F401  (torchvision compat before timm)
from safetensors.torch import load_file, save_file

from fixtures.models import loading as models
from fixtures.models import checkpoints, hub
from fixtures.models.checkpoints import CheckpointError, state_dict_hash
from fixtures.models.families.timm_vit import load_timm_pretrained_file
from fixtures.models.loading import ModelShapeError, load_model
from fixtures.models.loading import spec_for_checkpoint
from fixtures.models.catalogue import GROUPS, REGISTRY, ModelSpec, register, resolve_models

TINY_VIT = dict(depth=2, img_size=64)  # vit_tiny width (192, 3 heads of 64), 2 blocks, 16 patches
TINY_BERT = dict(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                 intermediate_size=64, max_position_embeddings=64)


def tiny_vit_spec(key="tiny-vit", seed=0, arch="vit_tiny_patch16_224", **extra) -> ModelSpec:
    kwargs = {**TINY_VIT, **extra}
    return ModelSpec(key=key, family="timm-vit", source="random", arch=arch, modality="image",
                     n_layers=kwargs["depth"], n_heads=3, head_dim=64, seed=seed, control=True,
                     model_kwargs=tuple(sorted(kwargs.items())), label="test")


def tiny_bert_spec(key="tiny-bert", seed=0) -> ModelSpec:
    return ModelSpec(key=key, family="hf-bert", source="random", arch="bert", modality="text",
                     n_layers=2, n_heads=4, head_dim=8, seed=seed, control=True,
                     model_kwargs=tuple(sorted(TINY_BERT.items())), label="test")


def same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.fixture(scope="module")
def tiny_vit():
    return load_model(tiny_vit_spec())


@pytest.fixture(scope="module")
def tiny_bert():
    return load_model(tiny_bert_spec())


# --- registry ------------------------------------------------------------------------------------

def test_groups_hold_the_papers_models():
    ladder = [s.key for s in resolve_models(["controls"])]
    assert ladder[0] == "kpca-oracle" and len(ladder) == 18  # the control ladder (method §12, §12.4)
    assert [s.key for s in resolve_models(["default"])] == [
        "smollm2-135m-instruct-q4", "all-MiniLM-L6-v2", "control-vit_tiny_patch16_224", "control-bert-minilm-shape",
        "tiny-vit-digits-softmax", "tiny-vit-digits-p1-standardized", *ladder]
    vision = resolve_models(["paper-vision"])
    text = resolve_models(["paper-text"])
    assert len(vision) == 10 and {s.family for s in vision} == {"timm-vit"}
    assert len(text) == 9 and {s.family for s in text} == {"hf-bert"}
    assert {s.arch for s in text} >= {"bert-base-uncased", "studio-ousia/luke-base",
                                      "sentence-transformers/all-MiniLM-L6-v2"}
    assert resolve_models(["paper"]) == vision + text
    assert all(s.source == "hub" for s in vision + text)
    assert [s.control for s in resolve_models("default")] == [False, False, True, True, False, False] \
        + [True] * len(ladder)
    assert {s.source for s in resolve_models("default")} == {"package", "random", "trained"}


def test_selection_by_hub_name_dedupes_and_keeps_order():
    got = resolve_models(["google/electra-small-discriminator", "vit_tiny_patch16_224",
                          "google--electra-small-discriminator", "paper-vision"])
    assert got[0].key == "google--electra-small-discriminator" and got[0].n_heads == 4
    assert got[1].key == "vit_tiny_patch16_224"
    assert len(got) == 11  # electra + the ten vision models, vit_tiny once
    assert [s.key for s in resolve_models("all-MiniLM-L6-v2,default")][0] == "all-MiniLM-L6-v2"


def test_unknown_model_lists_known_names_and_groups():
    with pytest.raises(ValueError, match="unknown model 'vit_huge'") as err:
        resolve_models(["default", "vit_huge"])
    for name in ("vit_tiny_patch16_224", "all-MiniLM-L6-v2", "studio-ousia--luke-base", *GROUPS):
        assert name in str(err.value)
    with pytest.raises(ValueError, match="empty model selection"):
        resolve_models([])


def test_spec_validation_and_register_conflict():
    with pytest.raises(ValueError, match="family"):
        ModelSpec(key="x", family="gpt", source="hub", arch="x", modality="text",
                  n_layers=1, n_heads=1, head_dim=1)
    with pytest.raises(ValueError, match="seed"):
        ModelSpec(key="x", family="hf-bert", source="random", arch="bert", modality="text",
                  n_layers=1, n_heads=1, head_dim=1)
    with pytest.raises(ValueError, match="already registered"):
        register(tiny_vit_spec(key="vit_tiny_patch16_224"))


@pytest.mark.parametrize("spec", [s for s in REGISTRY.values()
                                  if s.family == "timm-vit" and s.source != "trained"],
                         ids=lambda s: s.key)
def test_timm_registry_facts_match_the_architecture(spec):
    # Built on the meta device: an independent route to the hard-coded counts.
    assert models.arch_shape(spec.arch) == ("timm-vit", spec.n_layers, spec.n_heads, spec.head_dim)


@pytest.mark.parametrize("spec", [s for s in REGISTRY.values() if s.source == "trained"],
                         ids=lambda s: s.key)
def test_trained_registry_facts_match_their_training_config(spec):
    from fixtures import training
    from fixtures.engine.claim_session import trained_config

    config = trained_config(spec)
    model = training.build_model(config)
    assert (len(model.blocks), model.blocks[0].attn.num_heads, config.head_dim) == (
        spec.n_layers, spec.n_heads, spec.head_dim)


# --- loading -------------------------------------------------------------------------------------

def test_minilm_package_counts_scale_and_hash(tmp_path):
    loaded = load_model(REGISTRY["all-MiniLM-L6-v2"])
    assert (loaded.n_layers, loaded.n_heads, loaded.head_dim) == (6, 12, 32)
    assert loaded.scale == pytest.approx(1 / math.sqrt(32), rel=1e-15)
    assert not loaded.model.training and loaded.tokenizer is not None
    assert type(loaded.model).__name__ == "BertModel"
    # The hash of the weights read straight from the package's file (minus the non-persistent
    # position_ids buffer the file carries) equals the hash of the loaded model.
    folder = Path(hub.resolve_arch_path(REGISTRY["all-MiniLM-L6-v2"].arch))
    raw = load_file(str(folder / "model.safetensors"))
    raw.pop("embeddings.position_ids", None)
    assert state_dict_hash(raw) == loaded.checkpoint_hash
    # Wrong registry facts are refused, naming both numbers.
    wrong = ModelSpec(key="minilm-wrong", family="hf-bert", source="package", arch=loaded.spec.arch,
                      modality="text", n_layers=6, n_heads=8, head_dim=32)
    with pytest.raises(ModelShapeError, match="n_heads: registry says 8, model has 12"):
        models.verify_shape(loaded.model, wrong)


def test_random_controls_are_seeded_and_leave_the_rng_alone(tiny_vit):
    state = torch.random.get_rng_state()
    again = load_model(tiny_vit_spec())
    assert torch.equal(state, torch.random.get_rng_state())
    assert again.checkpoint_hash == tiny_vit.checkpoint_hash and same_weights(again.model, tiny_vit.model)
    other = load_model(tiny_vit_spec(seed=1))
    assert other.checkpoint_hash != tiny_vit.checkpoint_hash
    assert tiny_vit.data_config["input_size"] == (3, 64, 64)
    assert tiny_vit.data_config["mean"] == (0.5, 0.5, 0.5)  # vit_tiny's augreg pretrained_cfg
    assert tiny_vit.scale == 64 ** -0.5 and not tiny_vit.model.training


def test_bert_control_has_minilm_shape_and_tokenizer():
    spec = REGISTRY["control-bert-minilm-shape"]
    a, b = load_model(spec), load_model(spec)
    assert a.checkpoint_hash == b.checkpoint_hash
    assert (a.n_layers, a.n_heads, a.head_dim, a.model.config.hidden_size) == (6, 12, 32, 384)
    assert a.tokenizer is not None and a.tokenizer("kernel")["input_ids"][0] == a.tokenizer.cls_token_id
    assert a.checkpoint_hash != load_model(REGISTRY["all-MiniLM-L6-v2"]).checkpoint_hash


def test_state_dict_hash_sees_names_dtypes_shapes_and_values():
    sd = {"a": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.ones(3)}
    h = state_dict_hash(sd)
    assert h == state_dict_hash(dict(reversed(list(sd.items()))))
    assert h != state_dict_hash({"a": sd["a"].reshape(3, 2), "b": sd["b"]})
    assert h != state_dict_hash({"a": sd["a"].double(), "b": sd["b"]})
    assert h != state_dict_hash({"A": sd["a"], "b": sd["b"]})
    bumped = sd["a"].clone()
    bumped[1, 2] = torch.nextafter(bumped[1, 2], torch.tensor(10.0))
    assert h != state_dict_hash({"a": bumped, "b": sd["b"]})


# --- the hub routes, offline ---------------------------------------------------------------------

def test_timm_pretrained_route_reads_a_file_bit_identically(tiny_vit, tmp_path):
    path = tmp_path / "weights.safetensors"
    save_file(tiny_vit.model.state_dict(), str(path))
    model = load_timm_pretrained_file("vit_tiny_patch16_224", path, **TINY_VIT)
    assert same_weights(model, tiny_vit.model) and not model.training
    assert state_dict_hash(model.state_dict()) == tiny_vit.checkpoint_hash


def test_timm_pretrained_route_errors_name_the_file(tiny_vit, tmp_path):
    missing = tmp_path / "nowhere" / "w.safetensors"
    with pytest.raises(CheckpointError, match=str(missing)):
        load_timm_pretrained_file("vit_tiny_patch16_224", missing, **TINY_VIT)
    path = tmp_path / "w.safetensors"
    save_file(tiny_vit.model.state_dict(), str(path))
    path.write_bytes(path.read_bytes()[:5000])
    with pytest.raises(CheckpointError, match="w.safetensors"):
        load_timm_pretrained_file("vit_tiny_patch16_224", path, **TINY_VIT)


def test_hf_from_pretrained_route_reads_a_saved_folder(tiny_bert, tmp_path):
    tiny_bert.model.save_pretrained(tmp_path / "tiny")
    spec = ModelSpec(key="tiny-bert-folder", family="hf-bert", source="hub", arch=str(tmp_path / "tiny"),
                     modality="text", n_layers=2, n_heads=4, head_dim=8)
    loaded = load_model(spec)
    assert type(loaded.model).__name__ == "BertModel" and not loaded.model.training
    assert loaded.checkpoint_hash == tiny_bert.checkpoint_hash and same_weights(loaded.model, tiny_bert.model)
    assert loaded.tokenizer is None  # the folder holds no tokenizer
    assert loaded.scale == 8 ** -0.5


# --- user checkpoints ----------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["safetensors", "pth-plain", "pth-state_dict", "pt-model-module"])
def test_timm_user_checkpoint_formats(tiny_vit, tmp_path, fmt):
    sd = tiny_vit.model.state_dict()
    if fmt == "safetensors":
        path = tmp_path / "run.safetensors"
        save_file(sd, str(path))
    elif fmt == "pth-plain":
        path = tmp_path / "run.pth"
        torch.save(sd, path)
    elif fmt == "pth-state_dict":
        path = tmp_path / "run.pth"
        torch.save({"state_dict": sd, "epoch": 3}, path)
    else:  # a DeiT-style training checkpoint of a DataParallel model
        path = tmp_path / "run.pt"
        torch.save({"model": {"module." + k: v for k, v in sd.items()}, "epoch": 3}, path)
    spec = spec_for_checkpoint(path, "vit_tiny_patch16_224", **TINY_VIT)
    assert (spec.key, spec.source, spec.family, spec.modality) == ("checkpoint-run", "checkpoint", "timm-vit", "image")
    assert (spec.n_layers, spec.n_heads, spec.head_dim) == (2, 3, 64)
    loaded = load_model(spec)
    assert loaded.checkpoint_hash == tiny_vit.checkpoint_hash and same_weights(loaded.model, tiny_vit.model)


def test_hf_user_checkpoint_with_task_prefix_and_old_buffer(tiny_bert, tmp_path):
    tiny_bert.model.config.save_pretrained(tmp_path / "arch")
    sd = {"bert." + k: v for k, v in tiny_bert.model.state_dict().items()}
    sd["bert.embeddings.position_ids"] = torch.arange(64)[None]  # as older transformers saved it
    torch.save(sd, tmp_path / "ft.bin")
    spec = spec_for_checkpoint(tmp_path / "ft.bin", str(tmp_path / "arch"))
    assert (spec.family, spec.n_layers, spec.n_heads, spec.head_dim) == ("hf-bert", 2, 4, 8)
    loaded = load_model(spec)
    assert loaded.checkpoint_hash == tiny_bert.checkpoint_hash


def test_wrong_arch_names_the_key_and_both_shapes(tiny_vit, tmp_path):
    path = tmp_path / "tiny.safetensors"
    save_file(tiny_vit.model.state_dict(), str(path))
    spec = spec_for_checkpoint(path, "vit_small_patch16_224", **TINY_VIT)
    with pytest.raises(CheckpointError) as err:
        load_model(spec)
    msg = str(err.value)
    assert "'cls_token'" in msg and "(1, 1, 192)" in msg and "(1, 1, 384)" in msg and str(path) in msg
    deeper = spec_for_checkpoint(path, "vit_tiny_patch16_224", depth=3, img_size=64)
    with pytest.raises(CheckpointError, match=r"missing keys: 'blocks\.2\.norm1\.weight'"):
        load_model(deeper)


def test_missing_corrupt_and_unknown_checkpoints(tiny_vit, tmp_path):
    missing = tmp_path / "gone.pth"
    with pytest.raises(CheckpointError, match=f"not found: {missing}"):
        load_model(spec_for_checkpoint(missing, "vit_tiny_patch16_224", **TINY_VIT))
    trunc = tmp_path / "cut.safetensors"
    save_file(tiny_vit.model.state_dict(), str(trunc))
    trunc.write_bytes(trunc.read_bytes()[: trunc.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="cut.safetensors"):
        load_model(spec_for_checkpoint(trunc, "vit_tiny_patch16_224", **TINY_VIT))
    junk = tmp_path / "junk.pth"
    junk.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="junk.pth"):
        checkpoints.read_checkpoint(junk)
    nested = tmp_path / "nested.pth"
    torch.save({"epoch": 1, "optimizer": {"lr": 0.1}}, nested)
    with pytest.raises(CheckpointError, match="no state dict of tensors"):
        checkpoints.read_checkpoint(nested)
    odd = tmp_path / "w.ckpt"
    odd.write_bytes(b"x")
    with pytest.raises(CheckpointError, match="unknown checkpoint format"):
        checkpoints.read_checkpoint(odd)


def test_arch_errors(tmp_path):
    with pytest.raises(ValueError, match="neither a timm model name nor"):
        spec_for_checkpoint("w.pth", str(tmp_path / "no_such_arch_folder"))
    with pytest.raises(NotImplementedError, match="model_type 't5'"):
        spec_for_checkpoint("w.pth", "t5")
