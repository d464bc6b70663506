"""Hub pinning and which weights ran: --revision reaches transformers and timm's hub route, the
resolved commit is recorded, the EMA/non-EMA choice of a checkpoint container is recorded, and a
checkpoint trained with P1's standardised attention is refused as a plain ViT."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import fixtures  # noqa: F401  (torchvision shim before timm)
import timm
from fixtures.models import checkpoints, hub, loading as models, catalogue as registry
from fixtures.plugin import _apply_revisions
from fixtures.training import METADATA_KEY

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _tiny_vit_state() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False)
    return {k: v.contiguous() for k, v in model.state_dict().items()}


def test_hf_revision_is_passed_and_its_commit_recorded(monkeypatch):
    from transformers import AutoModel, BertConfig, BertModel

    seen = {}

    def fake_from_pretrained(path, **kwargs):
        seen.update(kwargs, path=path)
        torch.manual_seed(0)
        model = BertModel(BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=128, vocab_size=100))
        model.config._commit_hash = COMMIT  # what from_pretrained sets for a hub download
        return model

    monkeypatch.setattr(AutoModel, "from_pretrained", fake_from_pretrained)
    spec = registry.ModelSpec(key="hub-bert", family="hf-bert", source="hub", arch="bert",
                              modality="text", n_layers=2, n_heads=2, head_dim=32, revision="v1.0")
    loaded = models.load_model(spec)
    assert seen["revision"] == "v1.0"
    assert (loaded.hub_revision, loaded.hub_commit) == ("v1.0", COMMIT)
    assert loaded.weights == "as published on the hub"


def test_timm_hub_revision_goes_through_the_hub_id(monkeypatch, tmp_path):
    real = timm.create_model
    seen = {}

    def fake_create(name, pretrained=False, pretrained_cfg_overlay=None, **kwargs):
        seen.update(name=name, pretrained=pretrained, overlay=pretrained_cfg_overlay)
        return real(name, pretrained=False, **kwargs)  # offline: no download

    monkeypatch.setattr(timm, "create_model", fake_create)
    # a branch name resolves through the hub cache's refs/<branch>, as huggingface_hub writes it
    repo = hub.timm_hub_id("vit_tiny_patch16_224")
    refs = tmp_path / f"models--{repo.replace('/', '--')}" / "refs"
    refs.mkdir(parents=True)
    (refs / "v2").write_text(COMMIT)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    spec = registry.ModelSpec(key="vit_tiny_patch16_224", family="timm-vit", source="hub",
                              arch="vit_tiny_patch16_224", modality="image", n_layers=12,
                              n_heads=3, head_dim=64, revision="v2")
    loaded = models.load_model(spec)
    assert seen["pretrained"] and seen["overlay"] == {"hf_hub_id": f"{repo}@v2"}
    assert (loaded.hub_revision, loaded.hub_commit) == ("v2", COMMIT)


@pytest.mark.parametrize("container, expect", [
    ({"state_dict": 1, "state_dict_ema": 1}, "non-EMA weights; state_dict_ema also present, not used"),
    ({"state_dict_ema": 1}, "EMA weights"),
    ({"state_dict": 1}, "['state_dict'] (non-EMA weights)"),
])
def test_the_weights_a_container_provided_are_recorded(tmp_path, container, expect):
    state = _tiny_vit_state()
    path = tmp_path / "ckpt.pth"
    torch.save({k: state for k in container}, path)
    spec = models.spec_for_checkpoint(path, "vit_tiny_patch16_224")
    loaded = models.load_model(spec)
    assert expect in loaded.weights


def _trained_like(tmp_path: Path, variant: str) -> Path:
    """A checkpoint written the way fixtures/training/series.py writes them: metadata + JSON sidecar."""
    path = tmp_path / "step_000045.safetensors"
    meta = {"config_hash": "c0ffee", "step": 45, "epoch": 1}
    save_file(_tiny_vit_state(), str(path), metadata={METADATA_KEY: json.dumps(meta)})
    path.with_suffix(".json").write_text(json.dumps({**meta, "variant": variant}))
    return path


def test_p1_standardized_checkpoint_is_refused_as_a_plain_vit(tmp_path):
    path = _trained_like(tmp_path, "p1-standardized")
    spec = models.spec_for_checkpoint(path, "vit_tiny_patch16_224")
    with pytest.raises(checkpoints.CheckpointError) as err:
        models.validate_checkpoint(spec)
    text = str(err.value)
    assert "standardised attention" in text and "--arch vit_tiny_patch16_224" in text
    assert "\n" not in text and text.count(". ") == 0  # one sentence
    with pytest.raises(checkpoints.CheckpointError):
        models.load_model(spec)


def test_softmax_trained_checkpoint_still_loads(tmp_path):
    path = _trained_like(tmp_path, "softmax")
    spec = models.spec_for_checkpoint(path, "vit_tiny_patch16_224")
    models.validate_checkpoint(spec)
    assert checkpoints.training_variant(path) == "softmax"


def test_revision_option_names_its_model_when_ambiguous():
    specs = {s.key: s for s in registry.resolve_models(["paper-text"])}
    with pytest.raises(pytest.UsageError, match="name the model: --revision MODEL=REV"):
        _apply_revisions(specs, "main")
    key = next(iter(specs))
    out = _apply_revisions(specs, f"{key}={COMMIT}")
    assert out[key].revision == COMMIT and all(s.revision is None for k, s in out.items() if k != key)
    with pytest.raises(pytest.UsageError, match="not MODEL=REV for a selected hub model"):
        _apply_revisions(specs, "no-such-model=main")
    one = {key: specs[key]}
    assert _apply_revisions(one, "v1")[key].revision == "v1"
