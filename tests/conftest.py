"""Fixtures shared by the project's own tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

#: The thread variables a nested run reads when it starts (torch's OpenMP pool, MKL).
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


@pytest.fixture(autouse=True)
def _nested_runs_get_one_thread(monkeypatch):
    """Under xdist, every process a test starts (a ``pytest claims/`` run through pytester, a
    ``python -m`` tool) inherits one thread, the worker's own share, as the worker itself runs
    with (fixtures/plugin/configure.py). Without it a nested run takes OMP_NUM_THREADS (CI
    exports 2, one per core) beside the other worker's math: two OpenMP pools on two cores spin
    against each other: the --multiverse and --training-dynamics runs of
    tests/test_multiverse.py, run side by side, took 22 minutes each with two threads and 21 s
    and 32 s with one."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        for name in THREAD_VARIABLES:
            monkeypatch.setenv(name, "1")


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
