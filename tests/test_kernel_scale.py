"""``--kernel-scale`` (method §1.7): every claim of a run reads one kernel, exp(s·qᵀk) at s =
the factor × the model's softmax scale: claims V, J and E of a run at factor F are exactly the
claims of the same capture whose softmax scale is F times larger; recorded only when not 1, and
its metrics cached under their own key."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from fixtures.engine.layer_context import kernel_info
from fixtures.engine.run_options import RunOptions
from tests._synthetic_run import D, SyntheticRun


def _run(factor: float = 1.0, scale: float | None = None) -> SyntheticRun:
    run = SyntheticRun(tag="kernel")  # a tagged run: no round-off twins (faster, same rule)
    run._info = {**run._info, "scale": scale}
    run.options = dataclasses.replace(run.options, kernel_scale=factor)
    return run


def test_the_kernel_is_the_models_scale_times_the_factor():
    assert kernel_info(_run())["scale"] is None  # factor 1: the model's facts as they are
    assert kernel_info(_run(2.0))["scale"] == pytest.approx(2.0 / math.sqrt(D))
    assert kernel_info(_run(0.5, scale=0.3))["scale"] == pytest.approx(0.15)


@pytest.mark.parametrize("claim", ["V", "J", "E"])
def test_every_claim_at_factor_f_is_the_claim_of_an_f_times_larger_softmax_scale(claim):
    scaled = _run(2.0, scale=0.25).compute_layer(claim, 0)
    direct = _run(1.0, scale=0.5).compute_layer(claim, 0)
    own = _run(1.0, scale=0.25).compute_layer(claim, 0)
    assert set(scaled) == set(direct)
    for name, value in scaled.items():
        torch.testing.assert_close(value, direct[name], rtol=0, atol=0, equal_nan=True, msg=name)
    assert any(not torch.equal(scaled[n], own[n]) for n in scaled
               if scaled[n].dtype != torch.bool)  # the factor changes the numbers


def test_the_factor_is_recorded_and_keys_the_metrics_only_when_it_is_not_one():
    assert "kernel_scale" not in RunOptions().recorded()  # earlier results stay comparable
    assert RunOptions(kernel_scale=0.5).recorded()["kernel_scale"] == 0.5
    assert "kernel_scale" not in _run().metrics_key_options()
    assert _run(2.0).metrics_key_options()["kernel_scale"] == 2.0


def test_a_grid_axis_over_the_kernel_scale_makes_runs_at_that_scale():
    """The kernel scale is an axis of the shipped specification curve (method §1.7, §14.1): its
    values, as the grid spells them, become the derived runs' factor, its default is the run's
    own, and it is varied alone (two more specifications per claim); crossed, it would triple
    the grid."""
    from claims import multiverse as mv
    from fixtures.engine.multiverse_metrics import _options_for, default_specification

    grid = mv.load_grid()
    axis = grid["kernel_scale"]
    assert (axis.values, axis.claims, axis.crossed) == (("1.0", "0.5", "2.0"), ("V", "J", "E"),
                                                        False)
    assert default_specification(RunOptions(), grid)["kernel_scale"] == "1.0"
    assert default_specification(RunOptions(kernel_scale=0.5), grid)["kernel_scale"] == "0.5"
    options, padding = _options_for(grid, RunOptions(), (("kernel_scale", "0.5"),))
    assert options.kernel_scale == 0.5 and isinstance(options.kernel_scale, float)
    assert padding == "out"
    default = default_specification(RunOptions(), grid)
    alone = mv.specifications(grid, "E", "image", default)
    crossed = dict(grid, kernel_scale=dataclasses.replace(axis, crossed=True))
    assert len(mv.specifications(crossed, "E", "image", default)) == 3 * (len(alone) - 2)


def test_claim_v_computes_a_grid_per_kernel_scale_and_its_takers_read_that_grid():
    """Under a kernel-scale axis, claim V's route computes its grid on the run of that scale (an
    axis its one grid does not cover), and claim J's and E's runs of that scale read the stores
    of that grid: the route's variant and the takers' store group are the same pairs."""
    from types import SimpleNamespace

    from claims import multiverse as mv
    from claims.claim_v_curve import VRoute
    from fixtures.engine.multiverse_metrics import CurveContext, default_specification

    grid = dict(mv.load_grid())
    grid["kernel_scale"] = mv.Axis(name="kernel_scale", label="kscale", values=("1.0", "0.5"),
                                   claims=("V", "J", "E"), stage="compute",
                                   option="kernel_scale", why="w")
    default = default_specification(RunOptions(), grid)
    ctx = SimpleNamespace(grid=grid, default=default, modality="image", causal=False, extra={})
    route = VRoute(ctx)
    spec = {**{a: default[a] for a in ("axis_convention", "standardize", "dtype", "null")},
            "standardize": "on", "kernel_scale": "0.5"}
    assert route.variant_of(spec) == (("kernel_scale", "0.5"),)
    assert route.variant_of({**spec, "kernel_scale": "1.0"}) == ()  # the base run's grid
    curve = SimpleNamespace(grid=grid)
    j_changed = (("standardize", "on"), ("dtype", "float32"), ("kernel_scale", "0.5"))
    assert CurveContext.group_of(curve, j_changed, ("standardize", "dtype")) == \
        route.variant_of(spec)
    assert CurveContext.group_of(curve, j_changed[:1] + j_changed[2:], ("standardize",)) == \
        route.variant_of(spec)
