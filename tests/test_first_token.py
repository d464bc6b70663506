"""The first token as a convention (method §5.8): ``--first-token exclude`` drops every sample's
first position from q, k and v before any claim is computed, the records say so, and a causal
decoder's specification curve has it as the compute axis ``tok0``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from claims import multiverse as mv
from fixtures.cache import Cache
from fixtures.engine.model_run import ModelRun
from fixtures.engine.multiverse_metrics import default_specification
from fixtures.engine.run_options import RunOptions
from fixtures.models.catalogue import REGISTRY
from tests.test_decoders import CONFIGS, _claims, _folder

pytestmark = pytest.mark.xdist_group("first-token")
pytest_plugins = ["pytester"]


def _run(tmp_path: Path, first_token: str) -> ModelRun:
    opts = RunOptions(n_samples=3, seed=0, cache_dir=str(tmp_path / "cache"), first_token=first_token)
    return ModelRun(REGISTRY["control-vit_tiny_patch16_224"], opts, Cache(opts.cache_dir))


def test_exclude_is_the_same_capture_without_position_0(tmp_path):
    kept, dropped = _run(tmp_path, "include"), _run(tmp_path, "exclude")
    full, cut = kept.layer_qkv(0), dropped.layer_qkv(0)
    for name in ("q", "k", "v"):
        assert torch.equal(cut[name], full[name][:, :, 1:])
    assert torch.equal(cut["token_mask"], full["token_mask"][:, 1:])
    # one capture, two sets of metrics under their own cache keys: the class token moves them
    v_in, v_out = kept.layer_metrics("V", 0), dropped.layer_metrics("V", 0)
    assert not torch.equal(v_in["optimal_cosine"], v_out["optimal_cosine"])
    assert _run(tmp_path, "exclude").layer_metrics("V", 0)["optimal_cosine"].equal(
        v_out["optimal_cosine"])  # read back from the cache, not the include entry


def test_the_first_token_axis_exists_for_causal_decoders_only():
    grid = mv.load_grid()
    axis = grid["first_token"]
    assert axis.label == "tok0" and axis.stage == "compute" and axis.values == ("include", "exclude")
    assert axis not in mv.axes_for(grid, "V", "text") and axis not in mv.axes_for(grid, "V", "image")
    assert axis in mv.axes_for(grid, "V", "text", causal=True)
    default = default_specification(RunOptions())
    assert default["first_token"] == "include"
    assert default_specification(RunOptions(first_token="exclude"))["first_token"] == "exclude"
    specs = mv.specifications(grid, "E", "text", default, causal=True)
    assert specs[0]["first_token"] == "include" and {s["first_token"] for s in specs} == {
        "include", "exclude"}
    assert RunOptions().recorded().get("first_token") is None  # earlier results stay comparable
    assert RunOptions(first_token="exclude").recorded()["first_token"] == "exclude"


def test_a_decoder_run_without_its_first_token_says_so_and_its_curve_has_both(pytester, tmp_path):
    """A Llama folder (2 KV heads): --first-token exclude records ``first_token: excluded`` and
    the option; --multiverse on the default run judges claims V and E with and without the sink."""
    folder = _folder(tmp_path, CONFIGS["llama"]())
    common = ("--checkpoint", str(folder / "model.safetensors"), "--arch", str(folder),
              "--layers", "0", "--n-samples", "4", "--threads", "1", "--max-tokens", "16")
    result = _claims(pytester, tmp_path, *common, "--first-token", "exclude",
                     "-k", "value_vectors")
    assert result.ret in (0, 1), result.stdout.str()[-3000:]
    records = json.loads((tmp_path / "out" / "results.json").read_text())["records"]
    assert records and all(r["first_token"] == "excluded" for r in records)
    assert all(r["options"]["first_token"] == "exclude" for r in records)
    result = _claims(pytester, tmp_path, *common, "--multiverse", "--out", str(tmp_path / "mv"))
    assert result.ret in (0, 1), result.stdout.str()[-3000:]
    data = json.loads((tmp_path / "mv" / "results.json").read_text())
    curve = data["specification_curve"]["models"]["checkpoint-model"]
    # claim J is not defined under a causal mask (method §5.5): no curve, and why (a --multiverse
    # run of any decoder ended in an internal fault before)
    assert "J" not in curve["entries"] and "causal mask" in curve["not_applicable"]["J"]
    for entry in ("V", "E"):
        rows = curve["entries"][entry]["specifications"]
        both = {r["axes"].get("first_token") for r in rows}
        assert both == {"include", "exclude"}, (entry, both)
        assert rows[0]["axes"]["first_token"] == "include"  # the run's own specification first
        assert any("tok0=exclude" in r["name"] and r.get("verdict") for r in rows)
    # every specification without the first token is computed without it: claim V's grid of
    # those tokens is its own (its cached layers were once keyed without the first token, so a
    # grid of the other token set was read back in its place), here for every V specification
    # but the default's own pair, whose include row carries the main run's matched values
    v_rows = curve["entries"]["V"]["specifications"]
    by_rest = {}
    for r in v_rows[1:]:
        rest = tuple(sorted((a, x) for a, x in r["axes"].items() if a != "first_token"))
        by_rest.setdefault(rest, {})[r["axes"]["first_token"]] = r["metrics"]
    pairs = [m for m in by_rest.values() if len(m) == 2]
    assert pairs and all(m["include"]["subspace_overlap_excess"]
                         != m["exclude"]["subspace_overlap_excess"] for m in pairs)
