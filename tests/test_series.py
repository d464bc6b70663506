"""Checkpoint series for claim J's trend: ordering by step, and clear errors."""

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import fixtures  # noqa: F401
import timm
from fixtures.models.checkpoint_series import SeriesError, resolve_series, series_specs, step_of


def _touch(folder: Path, *names: str) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for name in names:
        (folder / name).write_bytes(b"x")
        out.append(folder / name)
    return out


def test_steps_are_read_from_names_and_ordered_numerically(tmp_path):
    _touch(tmp_path / "run", "step_100.safetensors", "step_20.safetensors", "step_3.pth",
           "notes.txt")
    name, points = resolve_series(str(tmp_path / "run"))
    assert name == "series-run"
    assert [s for s, _ in points] == [3, 20, 100]
    assert step_of(Path("ckpt-epoch12.bin")) == 12
    _, globbed = resolve_series(str(tmp_path / "run" / "step_*.safetensors"))
    assert [s for s, _ in globbed] == [20, 100]


def test_explicit_list_keeps_the_given_order_when_names_carry_no_step(tmp_path):
    files = _touch(tmp_path, "first.safetensors", "second.safetensors")
    _, points = resolve_series(",".join(str(f) for f in files))
    assert [s for s, _ in points] == [0, 1] and [p.name for _, p in points] == [
        "first.safetensors", "second.safetensors"]


def test_empty_series_is_a_clear_error(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(SeriesError, match="matches no checkpoint file"):
        resolve_series(str(tmp_path / "empty"))


def test_unparseable_and_duplicate_steps_are_clear_errors(tmp_path):
    _touch(tmp_path / "a", "final.safetensors", "step_1.safetensors")
    with pytest.raises(SeriesError, match="cannot read a step number.*final.safetensors"):
        resolve_series(str(tmp_path / "a"))
    _touch(tmp_path / "b", "run1_step_5.safetensors", "run2_step_5.safetensors")
    with pytest.raises(SeriesError, match="same step 5"):
        resolve_series(str(tmp_path / "b"))


def test_mixed_architectures_stop_naming_the_file(tmp_path):
    folder = tmp_path / "mixed"
    folder.mkdir()
    for step, (arch, depth) in enumerate((("vit_tiny_patch16_224", 12),
                                          ("vit_small_patch16_224", 1))):
        model = timm.create_model(arch, pretrained=False, depth=depth)
        save_file({k: v.contiguous() for k, v in model.state_dict().items()},
                  str(folder / f"step_{step}.safetensors"))
    with pytest.raises(SeriesError, match="step_1.safetensors.*does not fit --arch"):
        series_specs(str(folder), "vit_tiny_patch16_224")


def test_a_checkpoint_run_fits_the_output_that_the_ours_trend_reads(tmp_path):
    """Claim J's trend under `ours` reads the output fit's excess at every checkpoint (method
    §3.4): a checkpoint's run computes the fit like any run, and its trend point carries the
    pooled R² and null that :func:`claims.claim_j.fit_excess` turns into the excess."""
    from types import SimpleNamespace

    from claims import claim_j
    from fixtures.cache import Cache
    from tests._synthetic_run import SyntheticRun

    point_run = SyntheticRun(cache=Cache(str(tmp_path)), tag="step 45")
    point_run._info = {**point_run._info, "scale": 0.5, "checkpoint_hash": "h"}
    terms = point_run.layer_metrics("J", 0)
    assert {"output_r2", "output_r2_null", "token_fit_h_sq"} <= set(terms)
    point = SimpleNamespace(step=45, run=point_run, sidecar={}, record_fields=lambda: {})
    row = claim_j.trend_point(point)
    r2 = torch.cat([point_run.layer_metrics("J", layer)["output_r2"].reshape(-1)
                    for layer in range(point_run.prepare()["n_layers"])])
    assert row["output_r2"] == pytest.approx(float(r2[torch.isfinite(r2)].mean()), rel=1e-12)
    assert claim_j.fit_excess(row) == pytest.approx(
        (row["output_r2"] - row["output_r2_null"]) / (1 - row["output_r2_null"]))
