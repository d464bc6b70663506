"""Bad input: what a user sees for each mistake (the table in docs/bad-inputs.md).

A user mistake must stop ``pytest claims/`` before any test runs: exit code 4 (usage error) and
ONE sentence on stderr (``ERROR: ...``) that names the file and says what to do, with no
traceback and no results.json. Inputs that are usable but were skipped or shortened produce a
warning in the run's output and a note in results.json. Numerical trouble (NaN/Inf weights, keys
that overflow a naive exp, degenerate key sets, N < d) is an explicit error or an *undetermined*
flag, never a silent NaN.

The ``pytest claims/`` runs here are in-process (pytester), which exercises the same option
parsing, configure-time validation and ``ERROR:`` printing as a subprocess at a fraction of its
start-up cost; tests/test_end_to_end.py and tests/test_interrupts.py run real subprocesses.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import save_file

import fixtures  # noqa: F401  (torchvision shim before timm)
import timm  # imported here so that in-process runs never import (and register) it twice
import transformers  # noqa: F401
from transformers import BertModel  # noqa: F401

from checks import gamma as gamma_constancy
from checks import spectrum
from checks.errors import NonFiniteError
from checks.gram import KeyGram
from checks.projection import log_phi_sq_norm, projection_terms_batched
from checks.value_vectors import value_vector_metrics_batched
from claims.verdicts import UNDETERMINED
from fixtures.models import capture, capture_batches, checkpoints, hub, loading as models, catalogue as registry
from fixtures import inputs
from fixtures.engine.progress import set_progress_writer
from claims.verdicts import allclose_tolerance

TOL = allclose_tolerance()  # [claim_v.allclose] of claims/thresholds.toml

ROOT = Path(__file__).resolve().parent.parent
# one xdist worker builds the module fixtures (a checkpoint, reference runs) once
pytestmark = pytest.mark.xdist_group("bad-inputs")
ARCH = "vit_tiny_patch16_224"
TINY_RUN = ("--layers", "0", "--heads", "0", "--n-samples", "2", "--threads", "1")
MINILM = ("--models", "all-MiniLM-L6-v2", *TINY_RUN)
pytest_plugins = ["pytester"]

# An --images folder or --text file that cannot be used is found at configure time (the plugin
# builds the input set on the controller before any test), so those are startup cases below, as
# a bad checkpoint is: exit 4 and one ERROR line.


# ------------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """Every bad input of the table, built once: checkpoints, image folders and text files."""
    root = tmp_path_factory.mktemp("bad")
    with torch.random.fork_rng():
        torch.manual_seed(0)
        state = {k: v.contiguous() for k, v in timm.create_model(ARCH).state_dict().items()}
    f = {"root": root, "tiny": root / "tiny.safetensors"}
    save_file(state, str(f["tiny"]))
    blob = f["tiny"].read_bytes()
    (root / "truncated.safetensors").write_bytes(blob[: len(blob) // 2])
    (root / "garbage.safetensors").write_bytes(np.random.default_rng(1).bytes(4096))
    (root / "garbage.pth").write_bytes(np.random.default_rng(2).bytes(4096))
    torch.save({"args": argparse.Namespace(lr=0.1), "state_dict": state}, root / "objects.pth")
    (root / "weights_folder.safetensors").mkdir()
    save_file({**state, "blocks.0.attn.qkv.weight": state["blocks.0.attn.qkv.weight"][:-3].clone()},
              str(root / "wrong_shape.safetensors"))
    save_file({k: v for k, v in state.items() if k != "blocks.11.norm1.weight"},
              str(root / "missing_key.safetensors"))
    nan = state["blocks.0.attn.qkv.weight"].clone()
    nan[70, 5] = float("nan")  # row 70 = q of head 1 (rows 64..127)
    save_file({**state, "blocks.0.attn.qkv.weight": nan}, str(root / "nan.safetensors"))
    inf = state["blocks.3.attn.qkv.bias"].clone()
    inf[2 * 192 + 64] = float("inf")  # the v part starts at 2·192; + 64 is head 1
    save_file({**state, "blocks.3.attn.qkv.bias": inf}, str(root / "inf.safetensors"))

    offset = state["blocks.0.attn.qkv.bias"].clone()
    offset[192:384] += 5.0  # every key of layer 0 shifted along (1, …, 1): s·‖k‖² ≈ 200 > 88.7
    save_file({**state, "blocks.0.attn.qkv.bias": offset}, str(root / "offset_keys.safetensors"))
    huge = state["blocks.0.attn.qkv.weight"].clone()
    huge[192:384] *= 200.0  # keys ×200: s·‖k‖² in the thousands, K_φ underflows even in float64
    save_file({**state, "blocks.0.attn.qkv.weight": huge}, str(root / "huge_keys.safetensors"))

    rng = np.random.default_rng(0)

    def png(path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)).save(path)

    (root / "no_images").mkdir()
    (root / "only_text").mkdir()
    (root / "only_text" / "README.txt").write_text("not an image")
    for i in range(3):
        png(root / "mixed" / f"img{i}.png")
    for name in ("README.txt", "labels.csv", "notes.md"):
        (root / "mixed" / name).write_text("not an image")
    png(root / "broken" / "good.png")
    (root / "broken" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n" + rng.bytes(200))
    (root / "empty.txt").write_text("")
    (root / "blank.txt").write_text("\n   \n\n")
    (root / "latin1.txt").write_bytes("caf\xe9 au lait\n".encode("latin-1"))
    long = " ".join(["the quick brown fox jumps over the lazy dog"] * 40)  # ~360 tokens
    (root / "long.txt").write_text(f"{long}\nA short line.\n")
    (root / "short.txt").write_text("A cat sat.\nDogs bark loudly.\n")  # 6 tokens < d = 32
    return {**f, **{p.name: p for p in root.iterdir()}}


def claims(pytester: pytest.Pytester, tmp_path: Path, *args: str) -> pytest.RunResult:
    """``pytest claims/ ARGS`` in-process, with its own output folder and cache."""
    try:
        return pytester.runpytest_inprocess(
            str(ROOT / "claims"), "--rootdir", str(ROOT), "-c", str(ROOT / "pyproject.toml"),
            "--out", str(tmp_path / "out"), "--cache-dir", str(tmp_path / "cache"), "-rs", *args)
    finally:
        set_progress_writer(None)  # the inner run's terminal is gone


def usage_error(result: pytest.RunResult, tmp_path: Path) -> str:
    """The one ``ERROR:`` line of a usage error, after checking everything else about it."""
    err, out = result.stderr.str(), result.stdout.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, (result.ret, out[-3000:], err[-3000:])
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("ERROR: "), err  # one line, nothing else
    assert "Traceback" not in err + out
    assert not (tmp_path / "out" / "results.json").exists()
    return lines[0]


def checkpoint_args(f: dict, name: str, arch: str = ARCH) -> list[str]:
    return ["--checkpoint", str(f[name]), "--arch", arch]


# ------------------------------------------------------------------------- 1. input: usage errors
# (id, args(files), fragments the ERROR line must contain)
STARTUP_CASES = [
    ("missing-file", lambda f: ["--checkpoint", str(f["root"] / "gone.safetensors"), "--arch", ARCH],
     lambda f: ["checkpoint file not found", str(f["root"] / "gone.safetensors")]),
    ("folder-not-file", lambda f: checkpoint_args(f, "weights_folder.safetensors"),
     lambda f: [str(f["weights_folder.safetensors"]), "is a folder, not a file"]),
    ("truncated-safetensors", lambda f: checkpoint_args(f, "truncated.safetensors"),
     lambda f: [str(f["truncated.safetensors"]), "not a complete safetensors file",
                "download or save it again"]),
    ("corrupt-safetensors", lambda f: checkpoint_args(f, "garbage.safetensors"),
     lambda f: [str(f["garbage.safetensors"]), "not a complete safetensors file"]),
    ("corrupt-pth", lambda f: checkpoint_args(f, "garbage.pth"),
     lambda f: [str(f["garbage.pth"]), "not a PyTorch checkpoint", "download or save it again"]),
    ("pth-with-objects", lambda f: checkpoint_args(f, "objects.pth"),
     lambda f: [str(f["objects.pth"]), "argparse.Namespace", "torch.save(model.state_dict()"]),
    ("wrong-shape", lambda f: checkpoint_args(f, "wrong_shape.safetensors"),
     lambda f: [str(f["wrong_shape.safetensors"]), f"does not fit arch '{ARCH}'",
                "'blocks.0.attn.qkv.weight'", "(573, 192) in the checkpoint", "(576, 192) in the model"]),
    ("wrong-arch", lambda f: checkpoint_args(f, "tiny", "vit_small_patch16_224"),
     lambda f: [str(f["tiny"]), "'vit_small_patch16_224'", "'cls_token'", "(1, 1, 192)", "(1, 1, 384)"]),
    ("missing-key", lambda f: checkpoint_args(f, "missing_key.safetensors"),
     lambda f: [str(f["missing_key.safetensors"]), "missing keys: 'blocks.11.norm1.weight'"]),
    ("nan-weight", lambda f: checkpoint_args(f, "nan.safetensors"),
     lambda f: [str(f["nan.safetensors"]), "'blocks.0.attn.qkv.weight' (layer 0, q of head 1)",
                "1 NaN", "index (70, 5)", "use another checkpoint"]),
    ("inf-weight", lambda f: checkpoint_args(f, "inf.safetensors"),
     lambda f: [str(f["inf.safetensors"]), "'blocks.3.attn.qkv.bias' (layer 3, v of head 1)", "1 Inf"]),
    ("unknown-model", lambda f: ["--models", "vit_tiny"],
     lambda f: ["unknown model 'vit_tiny'", "known models:", ARCH, "known groups: default"]),
    ("missing-image-folder", lambda f: ["--checkpoint", str(f["tiny"]), "--arch", ARCH,
                                        "--images", str(f["root"] / "nowhere")],
     lambda f: ["--images", str(f["root"] / "nowhere"), "no such file or folder"]),
    ("missing-text-file", lambda f: [*MINILM, "--text", str(f["root"] / "gone.txt")],
     lambda f: ["--text", str(f["root"] / "gone.txt"), "no such file or folder"]),
]


@pytest.mark.parametrize("args, fragments", [pytest.param(a, s, id=i) for i, a, s in STARTUP_CASES])
def test_bad_checkpoint_or_model_stops_at_startup(pytester, tmp_path, files, args, fragments):
    line = usage_error(claims(pytester, tmp_path, *args(files)), tmp_path)
    for fragment in fragments(files):
        assert fragment in line, line


def test_unreadable_checkpoint_says_permission_denied(tmp_path, monkeypatch):
    """A file the user may not read: safetensors itself calls it "No such file or directory".
    Root reads every file whatever its mode, so under root the denial is simulated through
    os.access (the check read_checkpoint relies on); otherwise the file is really chmod 000."""
    locked = tmp_path / "locked.safetensors"
    save_file({"w": torch.zeros(2)}, str(locked))
    locked.chmod(0)
    if os.access(locked, os.R_OK):  # root
        real_access = os.access
        monkeypatch.setattr(checkpoints.os, "access",
                            lambda p, mode: False if Path(p) == locked else real_access(p, mode))
    with pytest.raises(checkpoints.CheckpointError) as err:
        checkpoints.read_checkpoint(locked)
    assert str(err.value) == (
        f"checkpoint {locked} is not readable by this user (permission denied); fix the "
        "permissions of the file and its folders, or copy it somewhere readable")
    locked.chmod(0o644)


def test_arch_typo_is_one_line_with_suggestions(monkeypatch):
    """A misspelt timm name falls through to Hugging Face; its multi-line error is cut to one line
    and the nearest timm names are offered."""
    def offline(*args, **kwargs):
        raise OSError("We couldn't connect to 'https://huggingface.co' to load the files.\n"
                      "Check your internet connection or see how to run the library in offline mode.")

    monkeypatch.setattr(hub, "hf_config", offline)
    with pytest.raises(ValueError) as err:
        models.arch_shape("vit_tiny_patch16_22")
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("arch 'vit_tiny_patch16_22' is neither a timm model name nor")
    assert "couldn't connect" in message and "did you mean vit_tiny_patch16_224" in message


INPUT_CASES = [
    ("empty-image-folder", lambda f: ["--images", str(f["no_images"])],
     lambda f: [str(f["no_images"]), "holds no image files", "recognised extensions"]),
    ("folder-of-non-images", lambda f: ["--images", str(f["only_text"])],
     lambda f: [str(f["only_text"]), "holds no image files (1 non-image files)"]),
    ("images-is-a-file", lambda f: ["--images", str(f["empty.txt"])],
     lambda f: [str(f["empty.txt"]), "is not a folder; give a folder of images"]),
    ("undecodable-image", lambda f: ["--images", str(f["broken"])],
     lambda f: [str(f["broken"] / "broken.png"), "cannot decode image file", "remove or replace it"]),
]
TEXT_CASES = [
    ("empty-text-file", lambda f: ["--text", str(f["empty.txt"])],
     lambda f: [str(f["empty.txt"]), "holds no text", "one text per line"]),
    ("blank-lines-only", lambda f: ["--text", str(f["blank.txt"])],
     lambda f: [str(f["blank.txt"]), "holds no text"]),
    ("not-utf8", lambda f: ["--text", str(f["latin1.txt"])],
     lambda f: [str(f["latin1.txt"]), "is not valid UTF-8", "save it as UTF-8"]),
]


@pytest.mark.parametrize("args, fragments", [pytest.param(a, s, id=i) for i, a, s in INPUT_CASES])
def test_bad_image_input_stops_at_startup(pytester, tmp_path, files, args, fragments):
    line = usage_error(claims(pytester, tmp_path, "--checkpoint", str(files["tiny"]), "--arch", ARCH,
                                        *TINY_RUN, "-k", "test_value_vectors and not model", *args(files)),
                      tmp_path)
    for fragment in fragments(files):
        assert fragment in line, line


@pytest.mark.parametrize("args, fragments", [pytest.param(a, s, id=i) for i, a, s in TEXT_CASES])
def test_bad_text_input_stops_at_startup(pytester, tmp_path, files, args, fragments):
    line = usage_error(claims(pytester, tmp_path, *MINILM, "-k", "test_value_vectors and not model",
                              *args(files)), tmp_path)
    for fragment in fragments(files):
        assert fragment in line, line


# ------------------------------------------------------------------------ 1. input: warn cases
def _input_set(tmp_path: Path) -> dict:
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    (model,) = results["models"].values()
    return model["input_set"]


def test_non_image_files_are_skipped_and_counted(pytester, tmp_path, files):
    result = claims(pytester, tmp_path, "--checkpoint", str(files["tiny"]), "--arch", ARCH,
                    *TINY_RUN, "-k", "test_value_vectors and not model",
                    "--images", str(files["mixed"]))
    assert result.ret in (0, 1), result.stdout.str()[-3000:]
    out = result.stdout.str()
    assert "InputWarning" in out and f"image folder '{files['mixed']}': skipped 3 non-image files" in out
    notes = _input_set(tmp_path)["notes"]
    assert "skipped 3 non-image files (e.g. README.txt, labels.csv, notes.md)" in notes
    assert _input_set(tmp_path)["n_samples"] == 2


def test_long_lines_are_truncated_and_say_so(pytester, tmp_path, files):
    result = claims(pytester, tmp_path, *MINILM, "-k", "test_value_vectors and not model",
                    "--text", str(files["long.txt"]))
    assert result.ret in (0, 1), result.stdout.str()[-3000:]
    out = " ".join(result.stdout.str().split())
    # names the file once fixtures/engine/claim_session.py passes the InputSet (proposed diff), not before
    assert re.search(r"InputWarning: 1 of 2 texts( from text file \S*long\.txt)? are longer than "
                     r"max_length=128 tokens and were truncated", out), out[-3000:]
    notes = _input_set(tmp_path)["notes"]
    assert any(n.startswith("1 of 2 texts truncated to max_length=128 tokens") for n in notes), notes


def test_max_tokens_lifts_the_truncation_up_to_the_model_limit(pytester, tmp_path, files):
    """--max-tokens (long sequences): the ~360-token line is kept whole; MiniLM's own
    limit (512 positions) caps a larger request, and the input set says so."""
    result = claims(pytester, tmp_path, *MINILM, "-k", "test_value_vectors and not model",
                    "--text", str(files["long.txt"]), "--max-tokens", "1024")
    assert result.ret in (0, 1), result.stdout.str()[-3000:]
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["options"]["max_tokens"] == 1024
    notes = _input_set(tmp_path)["notes"]
    assert "--max-tokens 1024 is above the model's limit of 512 positions; texts truncated to " \
        "512 tokens" in notes
    kept = [re.match(r"0 of 2 texts truncated: longest has (\d+) tokens <= max_length=512", n)
            for n in notes]
    assert any(kept) and int(next(m for m in kept if m).group(1)) > 128, notes  # whole


def test_max_tokens_below_three_is_a_usage_error(pytester, tmp_path):
    line = usage_error(claims(pytester, tmp_path, *MINILM, "--max-tokens", "2"), tmp_path)
    assert line == "ERROR: --max-tokens must be at least 3 (two special tokens and a word)"


# -------------------------------------------------------- 1. selections and resource options
CONTROL = ("--models", "control-vit_tiny_patch16_224", "--n-samples", "2")
# (id, args, the exact ERROR line)
SELECTION_CASES = [
    ("reversed-layers", [*CONTROL, "--layers", "3-1"],
     "ERROR: --layers '3-1': the range 3-1 is reversed and selects no layer; write it as 1-3"),
    ("reversed-heads", [*CONTROL, "--heads", "2-0"],
     "ERROR: --heads '2-0': the range 2-0 is reversed and selects no head; write it as 0-2"),
    ("empty-layer-list", [*CONTROL, "--layers", ","],
     "ERROR: --layers ',' selects no layer: give numbers and ranges like '0,3,5-7', or leave "
     "--layers out for all"),
    ("empty-for-one-model", ["--models", "control-vit_tiny_patch16_224,tiny-vit-digits-softmax",
                             "--n-samples", "2", "--layers", "4-5"],
     "ERROR: --layers '4-5': tiny-vit-digits-softmax has layers 0..3, not 4, 5 (it would select "
     "no layer of it); select layers it has, or run that model separately"),
    ("empty-model-list", ["--models", ",", "--n-samples", "2"],
     "ERROR: empty model selection; known models: vit_tiny_patch16_224, "),
    ("max-memory-0", [*CONTROL, "--max-memory", "0"],
     "ERROR: --max-memory 0 is below what one head of control-vit_tiny_patch16_224 needs "
     "(4.8 MiB for its 198 tokens): give at least 5M"),
    ("max-memory-below-one-head", [*CONTROL, "--max-memory", "1M"],
     "ERROR: --max-memory 1M is below what one head of control-vit_tiny_patch16_224 needs "
     "(4.8 MiB for its 198 tokens): give at least 5M"),
    ("max-memory-not-a-size", [*CONTROL, "--max-memory", "lots"],
     "ERROR: --max-memory 'lots' is not a size like 2G or 512M; give a positive size such as 2G"),
    ("threads-0", [*CONTROL, "--threads", "0"],
     "ERROR: --threads 0 is below 1: give at least 1 thread, or leave --threads out for the "
     "automatic choice (1 per xdist worker, all cores serially)"),
    ("kernel-scale-0", [*CONTROL, "--kernel-scale", "0"],
     "ERROR: --kernel-scale 0 is not a positive number: give a multiple of the model's softmax "
     "scale such as 0.5 or 2 (default 1, the model's own)"),
    ("kernel-scale-nan", [*CONTROL, "--kernel-scale", "nan"],
     "ERROR: --kernel-scale nan is not a positive number: give a multiple of the model's softmax "
     "scale such as 0.5 or 2 (default 1, the model's own)"),
    ("batch-size-0", [*CONTROL, "--batch-size", "0"],
     "ERROR: --batch-size 0 is below 1: give at least 1 sample per forward pass (default 16)"),
    ("n-samples-0", [*CONTROL, "--n-samples", "0"],
     "ERROR: --n-samples 0 is below 1: give at least 1 sample per model (default 100)"),
]


@pytest.mark.parametrize("args, expected", [pytest.param(a, e, id=i) for i, a, e in SELECTION_CASES])
def test_selection_or_limit_that_makes_no_sense_stops_at_startup(pytester, tmp_path, args, expected):
    """Each stops at configure time (exit 4, one sentence, no results.json, no cache entry), so no
    model-level test ever meets an empty selection."""
    line = usage_error(claims(pytester, tmp_path, *args), tmp_path)
    assert line == expected or (expected.endswith(", ") and line.startswith(expected)), line
    assert not (tmp_path / "cache").exists() and not (tmp_path / "out").exists()


def test_series_test_is_not_collected_without_a_series(pytester, tmp_path):
    """No trained model and no --series: the trend test is not collected (no "got empty parameter
    set" skip line); with a trained model it is."""
    result = claims(pytester, tmp_path, *CONTROL, "--layers", "0", "--heads", "0", "--co", "-q")
    assert result.ret == pytest.ExitCode.OK
    out = result.stdout.str()
    assert "test_projection_trend" not in out and "empty parameter set" not in out
    # "6/33 tests collected (27 deselected)": claim R's tests run only with -m rpc
    assert "6 tests collected" in out or "6/33 tests collected (27 deselected)" in out, out
    result = claims(pytester, tmp_path, "--models", "tiny-vit-digits-softmax", "--layers", "0",
                    "--heads", "0", "--n-samples", "2", "--co", "-q")
    assert "test_projection_trend[tiny-vit-digits-softmax]" in result.stdout.str()


def test_model_level_unit_is_never_empty():
    """The generic guard behind every model-level test (the ``collected_heads`` fixture): an empty
    unit is a fault naming the model, never a torch.cat / StopIteration crash inside a claim."""
    from fixtures.plugin import faults
    from fixtures.plugin import EmptySelectionError, unit_of

    assert unit_of({"m": ([0, 2], [1])}, "m") == ([0, 2], [1])
    for selection in ({"m": ([], [0])}, {"m": ([0], [])}, {}):
        with pytest.raises(EmptySelectionError, match="the model-level test of m has no") as err:
            unit_of(selection, "m")
        assert faults.classify(err.value) == "internal"


# ------------------------------------------------------------ 1. paths and outputs (pre-flight)
@pytest.fixture(scope="module")
def paths(tmp_path_factory, files) -> dict[str, Path]:
    """A regular file where folders are expected, an HF folder without a tokenizer, a baseline."""
    root = tmp_path_factory.mktemp("paths")
    (root / "plain.txt").write_text("a regular file")
    hf = root / "bert_no_tokenizer"
    config = transformers.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=128, vocab_size=100)
    BertModel(config).save_pretrained(hf)  # config.json + model.safetensors, no tokenizer
    (root / "report_dir").mkdir()
    (root / "loop").symlink_to(root / "loop")  # a link to itself: ELOOP on every look-up
    os.mkfifo(root / "pipe")  # a FIFO where an output goes: an atomic write would replace it
    (root / "out_fifo").mkdir()
    os.mkfifo(root / "out_fifo" / "results.json")
    (root / "out_folder" / "results.json").mkdir(parents=True)
    import socket

    listener = socket.socket(socket.AF_UNIX)  # a socket file where an output goes
    listener.bind(str(root / "sock"))
    listener.close()  # the socket file stays
    return {"root": root, "plain": root / "plain.txt", "hf": hf, "loop": root / "loop",
            "hf_weights": hf / "model.safetensors", "report_dir": root / "report_dir",
            "pipe": root / "pipe", "out_fifo": root / "out_fifo", "out_folder": root / "out_folder",
            "sock": root / "sock"}


TINY_CKPT = lambda f: ["--checkpoint", str(f["tiny"]), "--arch", ARCH, *TINY_RUN]  # noqa: E731
# (id, args(files, paths, tmp_path), the ERROR line's fragments)
PATH_CASES = [
    ("out-is-a-file", lambda f, p, t: [*TINY_CKPT(f), "--out", str(p["plain"])],
     lambda f, p, t: [f"--out {p['plain']} is a file, not a folder; give another folder"]),
    ("out-under-a-file", lambda f, p, t: [*TINY_CKPT(f), "--out", str(p["plain"] / "run")],
     lambda f, p, t: [f"--out {p['plain'] / 'run'}: {p['plain']} is a file, so the folder cannot "
                      "be created; give another folder"]),
    ("cache-dir-is-a-file", lambda f, p, t: [*TINY_CKPT(f), "--cache-dir", str(p["plain"])],
     lambda f, p, t: [f"--cache-dir {p['plain']} is a file, not a folder; give another folder "
                      "with --cache-dir"]),
    ("report-is-the-results-file", lambda f, p, t: [*TINY_CKPT(f), "--report",
                                                    str(t / "out" / "results.json")],
     lambda f, p, t: [f"--report {(t / 'out' / 'results.json').resolve()} is also the file --out "
                      "writes; give them different paths"]),
    ("report-overwrites-checkpoint", lambda f, p, t: [*TINY_CKPT(f), "--report", str(f["tiny"])],
     lambda f, p, t: [f"--report {f['tiny'].resolve()} would overwrite the input of --checkpoint; "
                      "write the output somewhere else"]),
    ("report-is-a-folder", lambda f, p, t: [*TINY_CKPT(f), "--report", str(p["report_dir"])],
     lambda f, p, t: [f"--report {p['report_dir']} is a folder, not a file; give a file path"]),
    ("baseline-missing", lambda f, p, t: [*TINY_CKPT(f), "--baseline", str(p["root"] / "nope.json")],
     lambda f, p, t: [f"--baseline {p['root'] / 'nope.json'} does not exist; give a baseline file, "
                      "or write one first with --update-baseline"]),
    ("baseline-not-json", lambda f, p, t: [*TINY_CKPT(f), "--baseline", str(p["plain"])],
     lambda f, p, t: [f"--baseline: baseline {p['plain']} is not valid JSON (", "give a baseline "
                      "written by --update-baseline"]),
    ("update-baseline-is-the-results-file",
     lambda f, p, t: [*TINY_CKPT(f), "--update-baseline", "--baseline", str(t / "out" / "results.json")],
     lambda f, p, t: [f"--baseline {(t / 'out' / 'results.json').resolve()} is also the file --out "
                      "writes; give them different paths"]),
    ("hf-folder-without-tokenizer", lambda f, p, t: ["--checkpoint", str(p["hf_weights"]), "--arch",
                                                      str(p["hf"]), *TINY_RUN],
     lambda f, p, t: [f"--arch {p['hf']} holds no tokenizer (tokenizer.json, tokenizer_config.json, "
                      f"vocab.txt); save it beside the model: tokenizer.save_pretrained('{p['hf']}')"]),
    ("hf-folder-without-config", lambda f, p, t: ["--checkpoint", str(f["tiny"]), "--arch",
                                                   str(p["report_dir"]), *TINY_RUN],
     lambda f, p, t: [f"--arch {p['report_dir']} is a folder without config.json"]),
    # path names the system refuses: usage errors (before: INTERNALERROR, OSError Errno 36, exit 3)
    ("out-name-too-long", lambda f, p, t: [*TINY_CKPT(f), "--out", str(t / ("o" * 300))],
     lambda f, p, t: ["--out ", "is 300 bytes long, more than this file system allows (255); "
                      "give a shorter name"]),
    ("cache-dir-name-too-long", lambda f, p, t: [*TINY_CKPT(f), "--cache-dir", str(t / ("c" * 300))],
     lambda f, p, t: ["--cache-dir ", "is 300 bytes long, more than this file system allows"]),
    ("report-name-too-long", lambda f, p, t: [*TINY_CKPT(f), "--report", "r" * 300 + ".html"],
     lambda f, p, t: ["--report ", "is 305 bytes long, more than this file system allows"]),
    ("out-in-a-link-loop", lambda f, p, t: [*TINY_CKPT(f), "--out", str(p["loop"] / "run")],
     lambda f, p, t: [f"--out {p['loop'] / 'run'}: too many levels of symbolic links at "
                      f"{p['loop']}", "fix the link or give another path"]),
    ("report-under-a-file", lambda f, p, t: [*TINY_CKPT(f), "--report", str(p["plain"] / "r.html")],
     lambda f, p, t: [f"--report {p['plain'] / 'r.html'}: {p['plain']} is a file, not a folder, "
                      "so nothing can be written inside it; give a path in another folder"]),
    # outputs that are not ours to replace (before: a FIFO turned into a regular file)
    ("report-is-a-fifo", lambda f, p, t: [*TINY_CKPT(f), "--report", str(p["pipe"])],
     lambda f, p, t: [f"--report {p['pipe']} is a FIFO (named pipe), not a regular file, and the "
                      "run would replace it; give the path of a regular file or a new one"]),
    ("report-is-a-socket", lambda f, p, t: [*TINY_CKPT(f), "--report", str(p["sock"])],
     lambda f, p, t: [f"--report {p['sock']} is a socket, not a regular file, and the run would "
                      "replace it"]),
    ("out-is-a-fifo", lambda f, p, t: [*TINY_CKPT(f), "--out", str(p["pipe"])],
     lambda f, p, t: [f"--out {p['pipe']} is a FIFO (named pipe), not a folder; give another folder"]),
    ("results-file-is-a-fifo", lambda f, p, t: [*TINY_CKPT(f), "--out", str(p["out_fifo"])],
     lambda f, p, t: [f"--out {p['out_fifo']}: {p['out_fifo'] / 'results.json'} is a FIFO (named "
                      "pipe), not a regular file, and the run would replace it; remove it or give "
                      "another folder"]),
    ("results-file-is-a-folder", lambda f, p, t: [*TINY_CKPT(f), "--out", str(p["out_folder"])],
     lambda f, p, t: [f"--out {p['out_folder']}: {p['out_folder'] / 'results.json'} is a folder, "
                      "not a regular file"]),
    ("cache-dir-is-a-fifo", lambda f, p, t: [*TINY_CKPT(f), "--cache-dir", str(p["pipe"])],
     lambda f, p, t: [f"--cache-dir {p['pipe']} is a FIFO (named pipe), not a folder; give another "
                      "folder with --cache-dir"]),
    ("out-inside-the-cache", lambda f, p, t: [*TINY_CKPT(f), "--out", str(t / "cache" / "run")],
     lambda f, p, t: [f"--out {t / 'cache' / 'run'} is inside the cache folder "
                      f"{(t / 'cache').resolve()} (--cache-dir)", "give a path outside it"]),
    ("report-inside-the-cache", lambda f, p, t: [*TINY_CKPT(f), "--report",
                                                 str(t / "cache" / "capture" / "r.html")],
     lambda f, p, t: [f"--report {t / 'cache' / 'capture' / 'r.html'} is inside the cache folder"]),
    ("revision-without-hub-model", lambda f, p, t: [*TINY_CKPT(f), "--revision", "v1"],
     lambda f, p, t: ["--revision v1: a revision pins a model downloaded from the Hugging Face hub, "
                      "and no hub model is selected (checkpoint-tiny load from files",
                      "drop --revision, or select a hub model with --models"]),
]


@pytest.mark.parametrize("args, fragments", [pytest.param(a, s, id=i) for i, a, s in PATH_CASES])
def test_bad_path_stops_at_startup(pytester, tmp_path, files, paths, args, fragments):
    """Every path option is checked before any test runs: exit 4, one sentence, and
    nothing written (no results.json, no output folder, no cache folder)."""
    line = usage_error(claims(pytester, tmp_path, *args(files, paths, tmp_path)), tmp_path)
    for fragment in fragments(files, paths, tmp_path):
        assert fragment in line, line
    assert not (tmp_path / "cache").exists() and not (tmp_path / "out").exists()


def test_an_output_that_is_a_device_is_refused_and_stays_a_device(pytester, tmp_path, files):
    """--report naming a character device (a private copy of /dev/null made with mknod in the
    test's folder, never the machine's own): exit 4, one sentence, and the device is untouched
    (before: replaced by a regular file; as root, ``--report /dev/null`` would replace /dev/null)."""
    import stat

    device = tmp_path / "null"
    try:
        os.mknod(device, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except OSError as exc:
        pytest.skip(f"mknod needs root ({exc})")
    line = usage_error(claims(pytester, tmp_path, *TINY_CKPT(files), "--report", str(device)),
                       tmp_path)
    assert f"--report {device} is a character device, not a regular file, and the run would " \
           "replace it" in line, line
    assert stat.S_ISCHR(os.stat(device).st_mode)


def test_cache_from_the_environment_variable_is_named(pytester, tmp_path, files, paths, monkeypatch):
    """KPCA_CACHE pointing at a regular file: the sentence names the variable, not --cache-dir."""
    monkeypatch.setenv("KPCA_CACHE", str(paths["plain"]))
    result = pytester.runpytest_inprocess(
        str(ROOT / "claims"), "--rootdir", str(ROOT), "-c", str(ROOT / "pyproject.toml"),
        "--out", str(tmp_path / "out"), *TINY_CKPT(files))
    set_progress_writer(None)
    line = usage_error(result, tmp_path)
    assert line == f"ERROR: KPCA_CACHE {paths['plain']} is a file, not a folder; give another " \
        "folder with --cache-dir"


def test_unwritable_output_folder_stops_at_startup(pytester, tmp_path, files, monkeypatch):
    """A folder the user may not write into. Root writes everywhere, so under root the denial is
    simulated through os.access (what the pre-flight check asks)."""
    from fixtures.plugin import path_checks

    locked = tmp_path / "locked"
    locked.mkdir()
    real_access = os.access
    monkeypatch.setattr(path_checks.os, "access",
                        lambda p, mode: False if Path(p) == locked else real_access(p, mode))
    line = usage_error(claims(pytester, tmp_path, *TINY_CKPT(files), "--out", str(locked / "run")),
                       tmp_path)
    assert line == (f"ERROR: --out {locked / 'run'}: folder {locked} is not writable by this user; "
                    "fix its permissions or give another folder")


def test_report_command_never_overwrites_its_input(tmp_path):
    """``python -m report R -o R`` (the same file, spelt differently): exit 4, R untouched."""
    import subprocess
    import sys

    results = tmp_path / "results.json"
    results.write_text('{"not": "read"}')
    done = subprocess.run([sys.executable, "-m", "report", str(results), "-o",
                           str(tmp_path / "." / "results.json")], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 4, done.stderr
    assert done.stderr.strip() == (f"python -m report: error: the output {tmp_path / '.' / 'results.json'} "
                                   "is the results file itself; give another path with -o")
    assert results.read_text() == '{"not": "read"}'


# ---------------------------------------------------------- 1. faults during the run: not verdicts
def _results(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "out" / "results.json").read_text())


def _fault_paragraph(result: pytest.RunResult) -> str:
    lines = [line for line in result.stdout.lines if line.startswith("FAULT (exit ")]
    assert len(lines) == 1, result.stdout.str()[-3000:]
    return lines[0]


def test_disk_full_in_the_cache_is_a_fault_not_a_verdict(pytester, tmp_path, files, monkeypatch):
    """ENOSPC while the cache writes (simulated: tests/test_interrupts.py fills a real tmpfs): exit 7,
    no traceback, the serial run stops, and results.json says complete: false with the error and
    every test under not_run; never complete: true with no records."""
    from fixtures import cache as cache_module

    def full(self, namespace, key, build, info=None):
        raise OSError(errno.ENOSPC, "No space left on device", str(self.root / namespace / key))

    monkeypatch.setattr(cache_module.Cache, "get_or_create", full)
    result = claims(pytester, tmp_path, *TINY_CKPT(files))
    out = result.stdout.str()
    assert result.ret == 7, out[-3000:]
    assert "Traceback" not in out + result.stderr.str() and "\nE   " not in out
    results = _results(tmp_path)
    assert results["complete"] is False and results["exit_status"] == 7 and results["records"] == []
    assert len(results["not_run"]) == 6
    (error,) = results["errors"]
    assert error["kind"] == "environment" and error["when"] == "call"
    assert error["error"].startswith("OSError: No space left on device: " + str(tmp_path / "cache"))
    paragraph = _fault_paragraph(result)
    assert paragraph.startswith("FAULT (exit 7, not a verdict): environment fault OSError: No space "
                                "left on device: ")
    assert "6 claim tests have no verdict and are listed under not_run in" in paragraph
    assert f"free space on the disk of the cache folder {tmp_path / 'cache'}" in paragraph


@pytest.mark.parametrize("exc, kind", [
    (AssertionError("refuted"), None), (pytest.skip.Exception("undetermined"), None),
    (KeyboardInterrupt(), None),
    (OSError(errno.ENOSPC, "No space left on device", "/c/x"), "environment"),
    (PermissionError(errno.EACCES, "Permission denied", "/c/x"), "environment"),
    (RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)"),
     "environment"),
    (ValueError("a bug"), "internal"), (FileNotFoundError(errno.ENOENT, "gone", "/x"), "internal"),
])
def test_faults_are_told_from_claim_outcomes(exc, kind):
    """A claim outcome (assert, skip) or an interruption is no fault; an OSError of the machine
    (also when another library words it as "os error N", as safetensors does) is an environment
    fault, exit 7; anything else is internal, exit 3."""
    from fixtures.plugin import faults

    assert faults.classify(exc) == kind
    wrapped = RuntimeError("while capturing")
    wrapped.__cause__ = exc
    assert faults.classify(wrapped) == (kind if kind == "environment" else "internal")
    if kind == "environment":
        assert "os error" not in faults.describe(exc) and "errno" in faults.describe(exc) or \
            faults.describe(exc).endswith(": /c/x")
        assert faults.exit_code([{"kind": kind}]) == 7
    assert faults.exit_code([{"kind": "environment"}, {"kind": "internal"}]) == 3


def test_internal_error_is_exit_3_with_its_traceback(pytester, tmp_path, files, monkeypatch):
    """A bug (any exception that is not a claim outcome): exit 3, the traceback kept for the bug
    report, the test under not_run, complete: false; other tests keep their records."""
    from claims import claim_v

    def broken(*args, **kwargs):
        raise KeyError("a bug")

    monkeypatch.setattr(claim_v, "head_record", broken)
    result = claims(pytester, tmp_path, *TINY_CKPT(files), "-k", "test_value_vectors or gamma")
    assert result.ret == 3, result.stdout.str()[-3000:]
    results = _results(tmp_path)
    assert results["complete"] is False and results["exit_status"] == 3
    assert [e["test"] for e in results["errors"]] == [
        "claims/test_value_vectors.py::test_value_vectors[checkpoint-tiny-L00-H0]",
        "claims/test_value_vectors.py::test_value_vectors_model[checkpoint-tiny]"]
    assert results["errors"][0]["error"] == "KeyError: 'a bug'"
    assert results["errors"][0]["where"].startswith("tests/test_bad_inputs.py:")
    assert set(results["not_run"]) == {e["test"] for e in results["errors"]}
    assert [r["claim"] for r in results["records"]] == ["E"]  # the gamma test still judged
    assert "this is a bug of kpca-claims" in _fault_paragraph(result)


def test_unwritable_output_at_the_end_keeps_the_results(pytester, tmp_path, files, monkeypatch):
    """The output folder cannot be written when results.json is due (it passed the pre-flight
    check): the results go to a fallback file in the temporary folder, and the run says where."""
    from fixtures.plugin import results as results_module

    real = results_module.atomic_write_text

    def refuse(path, text):
        if Path(path).parent == tmp_path / "out":
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real(path, text)

    monkeypatch.setattr(results_module, "atomic_write_text", refuse)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    result = claims(pytester, tmp_path, *TINY_CKPT(files), "-k", "test_value_vectors and not model")
    assert result.ret == 7, result.stdout.str()[-3000:]
    (fallback,) = tmp_path.glob("kpca-claims-*-results.json")
    saved = json.loads(fallback.read_text())
    assert saved["complete"] is False and len(saved["records"]) == 1  # the verdict is kept
    assert saved["errors"][-1]["error"] == (f"PermissionError: Permission denied: "
                                            f"{tmp_path / 'out' / 'results.json'}")
    assert (f"FAULT (exit 7, not a verdict): results.json could not be written to "
            f"{tmp_path / 'out' / 'results.json'} (PermissionError: Permission denied: "
            f"{tmp_path / 'out' / 'results.json'}); the results were written to {fallback} instead "
            "(complete: false).") in result.stdout.str()


def test_a_complete_run_has_a_record_for_every_collected_claim_test(pytester, tmp_path, files):
    """The invariant of results.json: ``complete: true`` only when every collected claim test
    left a record (a skipped test's record says undetermined) and nothing is under not_run."""
    collected = claims(pytester, tmp_path, *TINY_CKPT(files), "--co", "-q")
    ids = sorted(line for line in collected.stdout.lines if line.startswith("claims/"))
    assert len(ids) == 6  # no series test without a series
    result = claims(pytester, tmp_path, *TINY_CKPT(files))
    assert result.ret in (0, 1), result.stdout.str()[-3000:]
    results = _results(tmp_path)
    assert results["complete"] is True and results["not_run"] == [] and "errors" not in results
    assert sorted(r["test_id"] for r in results["records"]) == sorted(i.split("::")[-1] for i in ids)


def test_a_test_without_a_record_makes_the_run_incomplete(pytester, tmp_path, files, monkeypatch):
    """A claim test that passes without recording (a bug) cannot leave complete: true behind."""
    from fixtures.plugin.results import ResultsCollector

    real = ResultsCollector.pytest_runtest_logreport

    def drop(self, report):  # the controller loses the value-vector head record (records.py)
        if "test_value_vectors[" in report.nodeid and hasattr(report, "kpca_record"):
            del report.kpca_record
        return real(self, report)

    monkeypatch.setattr(ResultsCollector, "pytest_runtest_logreport", drop)
    result = claims(pytester, tmp_path, *TINY_CKPT(files), "-k", "test_value_vectors and not model")
    results = _results(tmp_path)
    assert result.ret == 3 and results["complete"] is False
    assert results["errors"][0]["error"] == "the test finished without a result record"


def test_texts_shorter_than_head_dim_are_undetermined_and_skipped(pytester, tmp_path, files):
    """MiniLM has head dim d = 32; texts of 6 tokens give N < d, so V̂ has fewer than d columns.
    P2's code dropped such heads silently. Every claim runs (no ``-k``): V and J (whose output
    fit needs V̂: before, "The expanded size of the tensor (32) must match the existing size
    (6)", a FAULT, exit 3) and E (whose statistics read d eigenvalues of an N×N Gram) are
    undetermined with the token count in the reason, and skipped."""
    result = claims(pytester, tmp_path, *MINILM, "--text", str(files["short.txt"]))
    # skipped, not failed; nothing judged: exit 9, not 0 (issue 45)
    assert result.ret == 9, result.stdout.str()[-3000:]
    assert "NOTHING JUDGED (exit 9, not a verdict)" in result.stdout.str()
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["complete"] and not results.get("errors") and results["exit_status"] == 9
    head = next(r for r in results["records"] if r["claim"] == "V" and r["level"] == "head")
    assert head["verdict"] == UNDETERMINED and head["outcome"] == "skipped"
    assert head["n_undetermined"] == head["n_samples"] == 2
    assert head["mu_d_min"] == 0.0  # the missing eigenvalues of an N < d spectrum
    skip_lines = [line for line in result.stdout.lines if line.startswith(("SKIPPED", "UNDETERMINED"))]
    assert any(head["reason"] in line for line in skip_lines), skip_lines
    claimed = {(r["claim"], r["level"]) for r in results["records"]}
    assert {("V", "head"), ("V", "model"), ("J", "layer"), ("J", "model"), ("E", "head"),
            ("E", "model")} <= claimed, claimed
    for record in results["records"]:
        assert record["verdict"] == UNDETERMINED, (record["claim"], record["level"], record["reason"])
        assert record["outcome"] == "skipped"
    for claim, level in (("J", "layer"), ("J", "model"), ("E", "model")):
        record = next(r for r in results["records"] if (r["claim"], r["level"]) == (claim, level))
        assert "2 of 2 samples have" in record["reason"] and "N = 6" in record["reason"], record


def test_texts_of_mixed_lengths_leave_the_short_ones_out_of_the_fit_and_the_spectrum(
        pytester, tmp_path, files):
    """One text longer than d, one shorter (6 tokens): the claims judge the long one; claim J's
    output fit and claim E's statistics say which samples they left out and why."""
    result = claims(pytester, tmp_path, *MINILM, "--text", str(files["long.txt"]))
    assert result.ret in (0, 1), result.stdout.str()[-3000:]
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["complete"] and not results.get("errors")
    layer = next(r for r in results["records"] if (r["claim"], r["level"]) == ("J", "layer"))
    assert layer["output_fit"]["excluded"].startswith("1 of 2 samples have fewer tokens than "
                                                      "the head dimension (N < d, N = 6)")
    e_model = next(r for r in results["records"] if (r["claim"], r["level"]) == ("E", "model"))
    assert "left out: 1 of 2 samples have fewer tokens than the head dimension" in \
        e_model["evidence"]


def test_short_text_reason_names_the_token_count(pytester, tmp_path, files):
    claims(pytester, tmp_path, *MINILM, "-k", "test_value_vectors and not model",
           "--text", str(files["short.txt"]))
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    head = next(r for r in results["records"] if r["claim"] == "V" and r["level"] == "head")
    assert "no more tokens than the head dimension (N <= d, N = 6)" in head["reason"], head["reason"]


# -------------------------------------------------------------------------------- 2. numbers
def _tiny_vit() -> models.LoadedModel:
    spec = registry.ModelSpec(key="tiny-nan", family="timm-vit", source="random", arch=ARCH,
                              modality="image", n_layers=2, n_heads=3, head_dim=64, seed=0,
                              model_kwargs=(("depth", 2), ("img_size", 32)))
    return models.load_model(spec)


def test_non_finite_activation_names_model_layer_head_and_sample_across_batches():
    """A NaN pixel in sample 3 (the second sample of the second batch of two) is named as
    sample 3, not as the batch-local 1; a NaN q weight row names its head for every sample."""
    loaded = _tiny_vit()
    x = torch.randn(5, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    x[3, 0, 7, 7] = float("nan")
    with pytest.raises(capture.NonFiniteCaptureError) as err:
        capture_batches.capture_in_batches(loaded, x, batch_size=2)
    assert isinstance(err.value, NonFiniteError) and err.value.index == (3, 0)
    assert "q of model 'tiny-nan', layer 0 at head 0, sample 3 (3 of 6" in str(err.value)

    with torch.no_grad():
        loaded.model.blocks[1].attn.qkv.weight[64 + 192 + 5, 0] = float("inf")  # k of head 1
    x[3, 0, 7, 7] = 0.0
    with pytest.raises(capture.NonFiniteCaptureError) as err:
        capture_batches.capture_in_batches(loaded, x, batch_size=2)
    assert (err.value.tensor, err.value.layer, err.value.head, err.value.sample) == ("k", 1, 1, 0)


def _finite(values: dict) -> bool:
    return all(bool(torch.isfinite(v.double()).all()) for v in values.values()
               if isinstance(v, torch.Tensor))


def test_keys_that_overflow_a_naive_exp():
    """Scores of order 10⁴: exp(S) overflows float32 (S > 88.7). The log-space routes stay finite;
    the naive route reports the overflow per item and stage instead of a NaN statistic."""
    gen = torch.Generator().manual_seed(0)
    k = 50 * torch.randn(2, 3, 20, 8, generator=gen, dtype=torch.float64)
    v = torch.randn(2, 3, 20, 8, generator=gen, dtype=torch.float64)
    assert float((KeyGram(k).scores).max()) > 1e4
    mu = spectrum.gram_spectrum_batched(k)
    assert bool(torch.isfinite(mu).all())
    gram = KeyGram(k).gram
    assert bool(((gram >= 0) & (gram <= 1)).all())
    naive = spectrum.naive_gram_spectrum(k)
    assert not bool(naive.finite.any())
    assert bool(naive.first_nonfinite_stage["exp"].all())  # the first stage to fail, every item
    naive_stats = spectrum.eigenvalue_statistics(naive.mu, 8)
    assert naive_stats["n_nonfinite"] == 2 and naive_stats["mean"]["max"] is None  # not NaN
    verdict_inputs = spectrum.route_comparison(spectrum.eigenvalue_statistics(mu, 8), naive_stats)
    assert verdict_inputs["nonfinite"] and verdict_inputs["max_ratio"] > 1
    assert _finite(value_vector_metrics_batched(k, v, **TOL))
    terms = projection_terms_batched(k, k, v)  # self-attention, q = k: ‖φ‖² ≤ exp(−s‖k‖²)
    assert _finite(terms) and bool((terms["phi_sq"] >= 0).all())
    q = 50 * torch.randn(2, 3, 20, 8, generator=gen, dtype=torch.float64)
    assert bool(torch.isfinite(log_phi_sq_norm(q, k)).all())
    with pytest.raises(NonFiniteError, match="exceeds the dtype's range"):  # ‖φ‖² itself overflows
        projection_terms_batched(q, k, v)


def _degenerate_keys(case: str) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    n, d = (5, 8) if case == "N < d" else (20, 8)
    k = torch.randn(2, 3, n, d, generator=gen, dtype=torch.float64)
    if case == "identical keys":
        k = k[..., :1, :].expand(-1, -1, n, -1).clone()
    elif case == "two distinct keys":
        k = torch.cat([k[..., :1, :].expand(-1, -1, n // 2, -1),
                       k[..., 1:2, :].expand(-1, -1, n - n // 2, -1)], dim=-2)
    return k, torch.randn(2, 3, n, d, generator=gen, dtype=torch.float64)


def _flat(obj):
    if isinstance(obj, dict):
        for value in obj.values():
            yield from _flat(value)
    elif isinstance(obj, list):
        for value in obj:
            yield from _flat(value)
    else:
        yield obj


def test_naive_route_overflow_is_reported_by_claim_e(pytester, tmp_path, files):
    """A checkpoint whose layer-0 keys share a large offset: exp(S) overflows float32 on every
    head and sample, and claim E says so (route, layer, count, stage); the log-space routes give
    finite statistics; no NaN reaches results.json."""
    result = claims(pytester, tmp_path, *checkpoint_args(files, "offset_keys.safetensors"),
                    *TINY_RUN, "-k", "eigenvalue_statistics", "-v")  # -v: the full evidence
    assert result.ret == pytest.ExitCode.TESTS_FAILED  # refuted, with the reason on screen
    assert "naive route went non-finite at L00: 2 of 2 heads×samples (exp)" in result.stdout.str()
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    (record,) = [r for r in results["records"] if r["claim"] == "E"]
    routes = record["routes"]
    assert routes["naive_float32"]["n_nonfinite"] == 2
    for route in ("log_raw", "log_standardized"):
        assert routes[route]["n_nonfinite"] == 0
        assert all(isinstance(v["mean"], float) and v["mean"] > 0 for v in routes[route]["stats"].values())
    assert record["metrics"]["naive_finite_share"] == 0.0 and record["verdict"] == "refuted"
    assert "nan" not in list(_flat(results["records"]))


def test_keys_beyond_float64_range_leave_claim_e_standing(pytester, tmp_path, files):
    """Keys ×200: K_φ underflows to zero even in float64, so K̃'s eigenvectors are unit vectors.
    The head is undetermined; claim E must still report its routes (the naive one non-finite)."""
    result = claims(pytester, tmp_path, *checkpoint_args(files, "huge_keys.safetensors"),
                    *TINY_RUN, "-k", "eigenvalue_statistics or gamma")
    assert result.ret == pytest.ExitCode.TESTS_FAILED and "ValueError" not in result.stdout.str()
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    model = next(r for r in results["records"] if r["claim"] == "E" and r["level"] == "model")
    head = next(r for r in results["records"] if r["claim"] == "E" and r["level"] == "head")
    assert model["routes"]["naive_float32"]["n_nonfinite"] == 2
    assert head["verdict"] == UNDETERMINED


@pytest.mark.parametrize("case", ["identical keys", "two distinct keys", "N < d"])
def test_degenerate_keys_are_undetermined_not_nan(case):
    """All keys equal (K̃ = 0), two distinct keys (K̃ of rank one) and N < d tokens: V̂ is not
    determined by the keys, so the head is flagged undetermined; every number stays finite."""
    k, v = _degenerate_keys(case)
    gram = KeyGram(k)
    assert bool(gram.undetermined.all())
    if case != "N < d":
        rank = int((gram.eigenvalues[0, 0] > gram.threshold[0, 0]).sum())
        assert rank == (0 if case == "identical keys" else 1)
    metrics = value_vector_metrics_batched(k, v, **TOL)
    assert bool(metrics["undetermined"].all()) and _finite(metrics)
    if case != "identical keys":  # see the next test
        gamma = gamma_constancy.gamma_spread_batched(k, v)
        assert bool(gamma["undetermined"].all())
        assert _finite({name: gamma[name] for name in ("learned", "eigen", "perturbed")})


def test_gamma_spread_of_identical_keys_is_undetermined_not_an_error():
    k, v = _degenerate_keys("identical keys")
    gamma = gamma_constancy.gamma_spread_batched(k, v)
    assert bool(gamma["undetermined"].all())
    assert _finite({name: gamma[name] for name in ("learned", "eigen", "perturbed")})


def test_a_javascript_method_url_stops_at_startup(pytester, tmp_path, files, monkeypatch):
    """KPCA_METHOD_URL='javascript:…' would put javascript: links into the report."""
    monkeypatch.setenv("KPCA_METHOD_URL", "javascript:alert(document.cookie)")
    line = usage_error(claims(pytester, tmp_path, *TINY_CKPT(files)), tmp_path)
    assert line == ("ERROR: KPCA_METHOD_URL='javascript:alert(document.cookie)' is not a link the "
                    "report may carry: give an http(s) address or a relative path of "
                    "docs/method.md, or unset it")
