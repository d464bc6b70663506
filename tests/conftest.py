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


@pytest.fixture(autouse=True, scope="session")
def _runs_cache_outside_the_checkout(tmp_path_factory):
    """Every claim run a test starts without ``--cache-dir`` (pytester, a subprocess, a ``python
    -m`` tool) caches under this session's temporary folder, through ``KPCA_CACHE``, which the
    plugin and fixtures.cache read for their default: not in the checkout's ``.kpca-cache``,
    which is the user's own cache (README command 1's). Before, the suite wrote 87 MB of
    captures and metrics there and read back whatever a user's earlier runs had left. A test that
    sets ``KPCA_CACHE`` itself (monkeypatch) still wins for its own duration."""
    before = os.environ.get("KPCA_CACHE")
    os.environ["KPCA_CACHE"] = str(tmp_path_factory.mktemp("kpca") / "cache")  # made on first use
    yield
    if before is None:
        os.environ.pop("KPCA_CACHE", None)
    else:
        os.environ["KPCA_CACHE"] = before


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
