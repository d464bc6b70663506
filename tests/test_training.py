"""Tests of fixtures/training/: our own tiny ViT trajectory for claim J's trend over training.

Every training run here uses a tiny config (1 block, embed 48, 17 tokens, 2 epochs) that trains in
about a second; the default config is measured by hand (see the module docstring of the fixture).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import threading

import pytest
import torch
from safetensors.torch import load_file

from fixtures import training
from fixtures.training import (StandardizedAttention, TrainConfig, build_model, cached_series,
                               digits_split, fixed_batch, load_checkpoint, lr_factor, train_series,
                               vit_kwargs)
from timm.models.vision_transformer import Attention, VisionTransformer

TINY = dict(epochs=2, batch_size=64, depth=1, embed_dim=48, num_heads=6, img_size=16,
            patch_size=4, mlp_ratio=2.0, lr=3e-3, warmup_epochs=0.5, threads=1,
            numerics="native")


def tiny(variant: str = "p1-standardized", **changes) -> TrainConfig:
    return TrainConfig(variant=variant, **{**TINY, **changes})


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One tiny training run per variant, shared by the tests that only read them."""
    root = tmp_path_factory.mktemp("runs")
    return {v: train_series(tiny(v), root / v) for v in training.VARIANTS}


def state_dicts(series) -> list[dict[str, torch.Tensor]]:
    return [load_file(str(path)) for _, path, _ in series.checkpoints]


def assert_bitwise_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].dtype == b[name].dtype and torch.equal(a[name], b[name]), name


# ---------------------------------------------------------------------------------- config


def test_config_hash_is_stable_and_sensitive():
    base = tiny()
    assert base.config_hash() == tiny().config_hash()
    assert TrainConfig.from_dict(base.to_dict()) == base
    hashes = {base.config_hash()}
    for change in (dict(seed=1), dict(variant="softmax"), dict(lr=1e-3), dict(epochs=3),
                   dict(threads=2), dict(upsample="nearest")):
        hashes.add(dataclasses.replace(base, **change).config_hash())
    assert len(hashes) == 7


@pytest.mark.parametrize("bad, field", [
    (dict(variant="linear"), "variant"),
    (dict(embed_dim=50), "embed_dim"),
    (dict(img_size=18), "img_size"),
    (dict(epochs=0), "epochs"),
    (dict(test_fraction=1.0), "test_fraction"),
    (dict(lr=float("nan")), "lr"),
    (dict(upsample="cubic"), "upsample"),
])
def test_config_rejects_bad_values(bad, field):
    with pytest.raises(ValueError, match=field):
        tiny(**bad)


def test_from_dict_names_unknown_fields():
    with pytest.raises(ValueError, match="colour"):
        TrainConfig.from_dict({**tiny().to_dict(), "colour": 1})


def test_default_config_is_p1_shaped():
    config = TrainConfig()
    assert (config.num_heads, config.head_dim) == (6, 32)
    assert config.num_tokens == 65 > config.head_dim + 1
    assert 4 <= config.depth <= 6


def test_lr_schedule_known_values():
    assert lr_factor(0, 4, 20) == pytest.approx(0.25)
    assert lr_factor(3, 4, 20) == pytest.approx(1.0)
    assert lr_factor(4, 4, 20) == pytest.approx(1.0)
    assert lr_factor(12, 4, 20) == pytest.approx(0.5)  # halfway through the cosine
    assert lr_factor(20, 4, 20) == pytest.approx(0.0, abs=1e-12)


# ---------------------------------------------------------------------------------- data


def test_digits_split_is_stratified_and_standardised():
    config = tiny()
    split = digits_split(config)
    n_train, n_test = split.train_labels.numel(), split.test_labels.numel()
    assert n_train + n_test == 1797 and n_test == math.ceil(0.2 * 1797)
    assert split.train_images.shape == (n_train, 1, 16, 16)
    assert split.train_images.dtype == torch.float32
    # standardised with the training pixels' own statistics
    assert float(split.train_images.mean()) == pytest.approx(0.0, abs=1e-5)
    assert float(split.train_images.std()) == pytest.approx(1.0, abs=1e-5)
    # stratified: every class's share of the test set is within one image of 20 %
    counts = torch.bincount(split.test_labels, minlength=10)
    totals = counts + torch.bincount(split.train_labels, minlength=10)
    assert torch.all((counts - 0.2 * totals).abs() <= 1)


def test_upscale_nearest_repeats_pixels():
    pixels = torch.arange(64, dtype=torch.float64).reshape(1, 8, 8) % 17
    big = training.upscale_digits(pixels, 32, "nearest")
    expected = (pixels / 16).repeat_interleave(4, -1).repeat_interleave(4, -2).float()
    assert torch.equal(big[:, 0], expected)


def test_fixed_batch_is_the_first_test_images():
    config = tiny()
    batch = fixed_batch(config, 12)
    assert batch.shape == (12, 1, 16, 16) and batch.dtype == torch.float32
    assert torch.equal(batch, digits_split(config).test_images[:12])
    assert torch.equal(fixed_batch(config, 5), batch[:5])
    assert torch.equal(fixed_batch(tiny("softmax", seed=3), 12), batch)  # same for both variants
    three = fixed_batch(tiny(in_chans=3), 4)
    assert three.shape == (4, 3, 16, 16) and torch.equal(three[:, 2], batch[:4, 0])
    with pytest.raises(ValueError, match="fixed_batch n"):
        fixed_batch(config, 0)
    with pytest.raises(ValueError, match="fixed_batch n"):
        fixed_batch(config, 10_000)


# ---------------------------------------------------------------------------------- model


def test_variants_share_parameters_and_initial_weights():
    p1, soft = build_model(tiny()), build_model(tiny("softmax"))
    assert_bitwise_equal(p1.state_dict(), soft.state_dict())
    assert not p1.training and not soft.training
    for a, b in zip(p1.blocks, soft.blocks):
        assert isinstance(a.attn, StandardizedAttention) and a.attn.qk_standardize is True
        assert type(b.attn) is Attention and not getattr(b.attn, "qk_standardize", False)
    # the same attention modules, the same weights, different outputs: the swap is not a no-op
    x = fixed_batch(tiny(), 4)
    with torch.no_grad():
        assert not torch.allclose(p1(x), soft(x))


def test_build_model_leaves_global_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_model(tiny())
    assert torch.equal(torch.rand(3), expected)


def test_standardized_attention_standardises_q_and_k(monkeypatch):
    torch.manual_seed(0)
    attn = build_model(tiny()).blocks[0].attn.double()
    seen = {}
    original = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, **kwargs):
        seen.update(q=q, k=k, scale=kwargs.get("scale"))
        return original(q, k, v, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    x = 3.0 * torch.randn(2, 17, 48, dtype=torch.float64) + 1.0
    with torch.no_grad():
        attn(x)
    d = attn.head_dim
    assert seen["scale"] == pytest.approx(d ** -0.5)
    for name in ("q", "k"):
        t = seen[name]
        assert t.shape == (2, 6, 17, d)
        assert t.mean(-1).abs().max() < 1e-12
        # unbiased std over the head features is 1 up to the 1e-8 in the denominator
        assert (t.std(-1, unbiased=True) - 1).abs().max() < 1e-6
        assert (t.pow(2).sum(-1) / (d - 1) - 1).abs().max() < 1e-6


def test_standardized_attention_equals_manual_float64():
    torch.manual_seed(1)
    attn = build_model(tiny()).blocks[0].attn.double()
    x = torch.randn(3, 17, 48, dtype=torch.float64)
    with torch.no_grad():
        got = attn(x)
        B, N, C, H = 3, 17, 48, 6
        d = C // H
        qkv = x @ attn.qkv.weight.T + attn.qkv.bias
        q, k, v = (qkv[..., i * C:(i + 1) * C].reshape(B, N, H, d).transpose(1, 2) for i in range(3))

        def standardise(t):  # written out independently of checks.gram
            centred = t - t.sum(-1, keepdim=True) / d
            std = torch.sqrt(centred.pow(2).sum(-1, keepdim=True) / (d - 1))
            return centred / (std + 1e-8)

        weights = torch.softmax(standardise(q) @ standardise(k).transpose(-1, -2) / math.sqrt(d), -1)
        heads = (weights @ v).transpose(1, 2).reshape(B, N, C)
        expected = heads @ attn.proj.weight.T + attn.proj.bias
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------------------- training


def test_checkpoints_for_step_zero_and_every_epoch(runs):
    config = tiny()
    series = runs["p1-standardized"]
    steps_per_epoch = math.ceil(digits_split(config).train_labels.numel() / config.batch_size)
    assert series.steps == [0, steps_per_epoch, 2 * steps_per_epoch]
    manifest = json.loads((series.folder / "manifest.json").read_text())
    assert manifest["complete"] and manifest["config_hash"] == config.config_hash()
    assert [e["file"] for e in manifest["checkpoints"]] == [
        f"step_{s:06d}.safetensors" for s in series.steps]
    for epoch, (step, path, sidecar) in enumerate(series.checkpoints):
        assert path.name == f"step_{step:06d}.safetensors" and path.is_file()
        on_disk = json.loads(path.with_suffix(".json").read_text())
        assert on_disk == sidecar
        assert (sidecar["step"], sidecar["epoch"]) == (step, epoch)
        assert TrainConfig.from_dict(sidecar["config"]) == config
        assert 0.0 <= sidecar["test_accuracy"] <= 1.0
        assert math.isfinite(sidecar["train_loss"]) and math.isfinite(sidecar["test_loss"])
    assert series.final_accuracy == series.checkpoints[-1][2]["test_accuracy"]
    assert series.train_seconds > 0
    # nothing but the run itself in the parent folder: the temporary folder was renamed
    assert sorted(p.name for p in series.folder.parent.iterdir()) == sorted(training.VARIANTS)


def test_step_zero_is_the_initial_model_and_training_changes_it(runs):
    config = tiny()
    states = state_dicts(runs["p1-standardized"])
    assert_bitwise_equal(states[0], build_model(config).state_dict())
    for before, after in zip(states, states[1:]):
        assert any(not torch.equal(before[n], after[n]) for n in before)


def test_tiny_run_learns(runs):
    for series in runs.values():
        first, last = series.checkpoints[0][2], series.checkpoints[-1][2]
        assert last["test_loss"] < first["test_loss"]
        assert last["train_loss"] < first["train_loss"]
        assert last["test_accuracy"] > 0.2  # chance is 0.1; the tiny runs reach 0.34 and 0.49


def test_training_is_deterministic_for_a_seed(runs, tmp_path):
    torch.manual_seed(7)
    expected_next = torch.rand(2)
    torch.manual_seed(7)
    again = train_series(tiny(), tmp_path / "again")
    assert torch.equal(torch.rand(2), expected_next)  # the caller's RNG is untouched
    first = runs["p1-standardized"]
    for a, b in zip(state_dicts(first), state_dicts(again)):
        assert_bitwise_equal(a, b)
    sha = lambda series: [sidecar["sha256"] for *_, sidecar in series.checkpoints]  # noqa: E731
    assert sha(first) == sha(again)  # the files themselves are byte-identical
    other_seed = train_series(tiny(seed=1), tmp_path / "other")
    assert not torch.equal(state_dicts(other_seed)[-1]["head.weight"],
                           state_dicts(first)[-1]["head.weight"])


def test_training_restores_thread_count_and_determinism_flag(tmp_path):
    outer = torch.get_num_threads()
    deterministic_before = torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(2)  # the run pins 1 thread (tiny config) and must give 2 back
    try:
        train_series(tiny(epochs=1), tmp_path / "run")
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(outer)
    assert torch.are_deterministic_algorithms_enabled() == deterministic_before


def test_progress_called_once_per_checkpoint(tmp_path):
    lines = []
    series = train_series(tiny(epochs=1), tmp_path / "run",
                          progress=lambda r: lines.append(training.format_progress(r)))
    assert len(lines) == len(series.checkpoints) == 2
    assert "epoch   1/1" in lines[-1] and "test acc" in lines[-1]


def test_train_series_refuses_a_nonempty_folder(tmp_path):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "x").write_text("x")
    with pytest.raises(FileExistsError, match="taken"):
        train_series(tiny(), tmp_path / "taken")


# ---------------------------------------------------------------------------------- loading


def test_softmax_checkpoint_is_a_plain_timm_state_dict(runs):
    config = tiny("softmax")
    series = runs["softmax"]
    path = series.checkpoints[-1][1]
    plain = VisionTransformer(**vit_kwargs(config)).eval()
    plain.load_state_dict(load_file(str(path)), strict=True)
    ours = load_checkpoint(config, path)
    assert not ours.training
    x = fixed_batch(config, 8)
    with torch.no_grad():
        assert torch.equal(plain(x), ours(x))
    # the p1 checkpoint has the same names (it also loads strictly) but is not the same function
    p1_path = runs["p1-standardized"].checkpoints[-1][1]
    plain.load_state_dict(load_file(str(p1_path)), strict=True)
    with torch.no_grad():
        assert not torch.allclose(plain(x), load_checkpoint(tiny(), p1_path)(x))


def test_load_checkpoint_errors(runs, tmp_path):
    path = runs["softmax"].checkpoints[-1][1]
    with pytest.raises(ValueError, match="config hash"):
        load_checkpoint(tiny(), path)  # a softmax checkpoint is not a p1 one
    with pytest.raises(FileNotFoundError, match="nowhere.safetensors"):
        load_checkpoint(tiny(), tmp_path / "nowhere.safetensors")


# ---------------------------------------------------------------------------------- cache


@pytest.fixture
def counted(monkeypatch):
    calls = []
    real = training.train_series

    def counting(*args, **kwargs):
        calls.append(args[0])
        return real(*args, **kwargs)

    # cached_series calls the train_series of its own module
    monkeypatch.setattr(training.series, "train_series", counting)
    return calls


def test_cached_series_trains_once(tmp_path, counted):
    config = tiny(epochs=1)
    first = cached_series(config, tmp_path)
    assert first.folder == tmp_path / "trained" / config.config_hash()
    stamp = os.stat(first.folder / "manifest.json").st_mtime_ns
    second = cached_series(config, tmp_path)
    assert len(counted) == 1
    assert os.stat(second.folder / "manifest.json").st_mtime_ns == stamp
    assert second.steps == first.steps and second.final_accuracy == first.final_accuracy
    assert [s for *_, s in second.checkpoints] == [s for *_, s in first.checkpoints]


def test_cached_series_concurrent_callers_train_once(tmp_path, counted):
    config = tiny(epochs=1, seed=5)
    results, errors = [], []

    def call():
        try:
            results.append(cached_series(config, tmp_path))
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=call) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(results) == 2
    assert len(counted) == 1
    assert results[0].folder == results[1].folder


def test_cached_series_never_trusts_a_broken_folder(tmp_path, counted):
    config = tiny(epochs=1, seed=6)
    series = cached_series(config, tmp_path)
    series.checkpoints[-1][1].unlink()  # a lost checkpoint
    repaired = cached_series(config, tmp_path)
    assert len(counted) == 2 and repaired.checkpoints[-1][1].is_file()
    # a folder without a manifest (as an interrupted copy would leave) is retrained, not read
    (repaired.folder / "manifest.json").unlink()
    cached_series(config, tmp_path)
    assert len(counted) == 3
    # a truncated checkpoint is caught by its recorded size
    path = cached_series(config, tmp_path).checkpoints[0][1]
    path.write_bytes(path.read_bytes()[:100])
    assert training.read_series(config, path.parent) is None
    cached_series(config, tmp_path)
    assert len(counted) == 4
    leftovers = [p.name for p in (tmp_path / "trained").iterdir()
                 if p.name.startswith(".") and not p.name.endswith(".lock")]
    assert leftovers == []


# ------------------------------------------------------------------------ shipped weights


def _ship(tmp_path, monkeypatch, series_list) -> Path:
    """Make ``series_list`` the shipped series of a private copy (files and hash file), as
    ``python -m fixtures.training.ship --write`` would."""
    from fixtures.training import shipped_hashes, shipped_weights

    root, anchor = tmp_path / "shipped", tmp_path / "reference_hashes.json"
    monkeypatch.setattr(shipped_weights, "SHIPPED_ROOT", root)
    monkeypatch.setattr(shipped_hashes, "REFERENCE_FILE", anchor)
    shipped_weights.write(series_list, root, anchor)
    return root


def test_a_shipped_config_is_copied_verified_into_the_cache_and_never_trained(
        tmp_path, monkeypatch, counted):
    """A config with shipped weights: the cache gets a verified copy of the shipped files (no
    training), and a cache folder that holds other weights for it (trained on this machine by an
    earlier version, on a CPU of another kind) is replaced by the shipped files, not used."""
    config = tiny(epochs=1, seed=11)
    shipped = train_series(config, tmp_path / "made-elsewhere")
    _ship(tmp_path, monkeypatch, [shipped])
    got = cached_series(config, tmp_path / "cache")
    assert counted == [] and got.origin == "shipped"
    assert got.folder == tmp_path / "cache" / "trained" / config.config_hash()
    assert [s["sha256"] for *_, s in got.checkpoints] == \
        [s["sha256"] for *_, s in shipped.checkpoints]
    # other weights under the same config hash (as another CPU trains them): replaced
    other = train_series(tiny(epochs=1, seed=12), tmp_path / "other")
    folder = got.folder
    for (_, mine, _), (_, theirs, _) in zip(got.checkpoints, other.checkpoints):
        mine.write_bytes(theirs.read_bytes())  # same size, other bits
    again = cached_series(config, tmp_path / "cache")
    assert counted == [] and again.origin == "shipped" and again.folder == folder
    assert all(training.series.file_sha256(path) == s["sha256"]
               for _, path, s in again.checkpoints)
    assert training.shipped_hashes.check(again)["reference"] == "matches"


def test_the_command_line_says_whether_this_machine_reproduces_the_shipped_files(
        tmp_path, monkeypatch, capsys):
    """``python -m fixtures.training``'s last line: a fact about this machine, exit 0 either
    way, with this CPU and the shipped files' CPU named; no line of judgement for a config with
    nothing shipped."""
    from fixtures.training import shipped_weights

    args = ["--variant", "softmax", "--epochs", "1", "--depth", "1", "--embed-dim", "48",
            "--batch-size", "256", "--threads", "1", "--numerics", "native"]
    first = tmp_path / "first"
    assert training.main([*args, "--out", str(first)]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("No weights are shipped for config")
    series = training.read_series(TrainConfig(variant="softmax", epochs=1, depth=1, embed_dim=48,
                                              batch_size=256, threads=1, numerics="native"),
                                  first)
    _ship(tmp_path, monkeypatch, [series])
    assert training.main([*args, "--out", str(tmp_path / "second")]) == 0
    line = capsys.readouterr().out.splitlines()[-1]
    here = numeric_env_cpu_model()
    assert line.startswith("This machine's training reproduces the shipped weights"), line
    assert here in line
    # a shipped file of other bits: "does not reproduce", at the step that differs, exit 0
    shipped = shipped_weights.folder_of(series.config)
    anchor = json.loads(training.shipped_hashes.REFERENCE_FILE.read_text())
    anchor["series"][series.config.config_hash()]["checkpoints"][str(series.steps[-1])] = "0" * 64
    training.shipped_hashes.REFERENCE_FILE.write_text(json.dumps(anchor))
    assert training.main([*args, "--out", str(tmp_path / "third")]) == 0
    line = capsys.readouterr().out.splitlines()[-1]
    assert line.startswith("This machine's training does not reproduce the shipped weights "
                           f"{shipped}: the checkpoints at steps {series.steps[-1]} differ"), line
    assert "the default run checks the shipped files either way" in line


def test_the_command_line_refuses_an_output_that_exists_before_training(tmp_path, capsys):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "keep.txt").write_text("mine")
    with pytest.raises(SystemExit) as exit_info:
        training.main(["--out", str(tmp_path / "taken")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "already exists and is not an empty folder" in err[0]
    assert (tmp_path / "taken" / "keep.txt").read_text() == "mine"


def numeric_env_cpu_model() -> str:
    from fixtures import numeric_env

    return str(numeric_env.cpu_info()["model"])


# ---------------------------------------------------------------------------------- CLI


def test_command_line(tmp_path, capsys):
    out = tmp_path / "cli"
    code = training.main(["--variant", "softmax", "--out", str(out), "--epochs", "1",
                          "--depth", "1", "--embed-dim", "48", "--batch-size", "256",
                          "--threads", "1"])
    assert code == 0
    captured = capsys.readouterr()
    assert "final test accuracy" in captured.out and "epoch   1/1" in captured.err
    manifest = json.loads((out / "manifest.json").read_text())
    assert [e["step"] for e in manifest["checkpoints"]] == [0, math.ceil(1437 / 256)]
    assert manifest["variant"] == "softmax"


def test_step_zero_of_both_variants_share_weights_but_not_a_capture():
    """Regression: the untrained checkpoints of the softmax and the P1-standardised tiny ViT have
    identical weights (same seed; standardised attention has no parameters), so a capture keyed
    on the weights alone served one variant the other's q, k, v, depending on which a worker
    captured first. The capture key also holds the model's module classes."""
    from fixtures.models.checkpoints import state_dict_hash
    from fixtures.engine.model_run import module_fingerprint
    from fixtures.training import TrainConfig, build_model

    softmax = build_model(TrainConfig(variant="softmax"))
    p1 = build_model(TrainConfig(variant="p1-standardized"))
    assert state_dict_hash(softmax.state_dict()) == state_dict_hash(p1.state_dict())
    assert module_fingerprint(softmax) != module_fingerprint(p1)
    assert module_fingerprint(softmax) == module_fingerprint(build_model(TrainConfig(variant="softmax")))


def test_a_name_patched_on_the_package_is_called_after_sys_modules_lost_it(monkeypatch):
    """pytester restores sys.modules after an in-process run, dropping fixtures.training while
    the ``fixtures`` package still names it. The lazy loader then imported the submodule under a
    second package, which later ``from fixtures import training`` returned, so a test's patch of
    ``cached_series`` was not the one called and a real training ran (seen in
    tests/test_multiverse.py under xdist). Now the loader puts its package back."""
    import sys

    import fixtures

    package = fixtures.training
    monkeypatch.delitem(sys.modules, "fixtures.training")
    monkeypatch.delitem(package.__dict__, "train_series", raising=False)
    monkeypatch.delitem(sys.modules, "fixtures.training.series", raising=False)
    monkeypatch.setattr(package, "train_series", lambda *a, **k: "patched")
    from fixtures import training as again

    assert again is package and fixtures.training is package
    assert sys.modules["fixtures.training"] is package
    assert again.train_series() == "patched"
