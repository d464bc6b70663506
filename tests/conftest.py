"""Fixtures shared by the project's own tests."""

from __future__ import annotations

from pathlib import Path

import pytest



@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory) -> Path:
    """A random-init vit_tiny_patch16_224 (seed 0) saved as safetensors: a user checkpoint for
    ``--checkpoint … --arch vit_tiny_patch16_224`` runs."""
    import timm
    import torch
    from safetensors.torch import save_file

    import fixtures  # noqa: F401  (the torchvision shim before timm)

    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False)
    path = tmp_path_factory.mktemp("ckpt") / "tiny.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return path
