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


def test_a_checkpoint_run_skips_claim_js_output_fit_under_its_own_cache_key(tmp_path):
    """A series' checkpoints feed claim J's trend and the training dynamics, which read J_proj's
    pooled terms only: their runs skip the output fit (method §3.6), every other number the same
    to the bit, cached apart from a run that fits."""
    from types import SimpleNamespace

    import torch

    from claims import claim_j
    from fixtures.cache import Cache
    from fixtures.engine.claim_session import ClaimSession
    from fixtures.engine.run_options import RunOptions
    from tests._synthetic_run import SyntheticRun

    cache = Cache(str(tmp_path))
    full_run, point = SyntheticRun(cache=cache, tag="step 45"), SyntheticRun(cache=cache, tag="step 45")
    point.output_fit = False
    for run in (full_run, point):  # claim J needs the attention's scale
        run._info = {**run._info, "scale": 0.5}
    full, terms = full_run.layer_metrics("J", 0), point.layer_metrics("J", 0)
    assert set(full) - set(terms) == {"output_r2", "output_r2_null", "token_fit_h_sq"}
    assert set(terms) <= set(full)
    for name, value in terms.items():  # NaN past a sample's own tokens
        torch.testing.assert_close(value, full[name], rtol=0, atol=0, equal_nan=True, msg=name)
    assert claim_j.pooled([terms], [0, 1]) == claim_j.pooled([full], [0, 1])
    assert len(list((tmp_path / "claim_J").glob("*/metrics.safetensors"))) == 2
    # the session marks every checkpoint run of a series so
    spec = SimpleNamespace(key="m", source="local", checkpoint="x")
    session = ClaimSession({}, RunOptions(cache_dir=str(tmp_path)), series={"s": [(0, spec), (9, spec)]})
    assert [p.run.output_fit for p in session.series("s")] == [False, False]
    # and every checkpoint of a model it trains, not that model's own run (nothing is loaded here)
    from fixtures.models.catalogue import REGISTRY

    trained = REGISTRY["tiny-vit-digits-softmax"]
    session = ClaimSession({trained.key: trained}, RunOptions(cache_dir=str(tmp_path)))
    assert session._trained_run(trained, 3, "step 135").output_fit is False
    assert session.run(trained.key).output_fit is True
