"""Model families (fixtures/models/families): the registry, the GPT-2 adapter on a random-init small GPT-2
saved the way users save one (``save_pretrained`` + a locally trained byte-level BPE tokenizer,
no hub access), capture parity against the module's own attention output, and a claims run in
which claim J is skipped with the family's reason (method §5.5).

The timm ViT and BERT-family adapters have their parity tests in tests/test_capture.py."""

from __future__ import annotations

import html
import json
import re
from collections import Counter
from pathlib import Path

import pytest
import torch

import fixtures  # noqa: F401  (torchvision compat before timm/transformers)
from fixtures.models import families
from fixtures import inputs
from fixtures.models.capture import capture_qkv, recompute_attention
from fixtures.models.checkpoints import CheckpointError
from fixtures.models.loading import arch_shape, load_model, spec_for_checkpoint, validate_checkpoint
from fixtures.models.catalogue import FAMILIES, REGISTRY, ModelSpec

ROOT = Path(__file__).resolve().parent.parent
pytest_plugins = ["pytester"]
#: The small GPT-2: 2 layers, 4 heads, n_embd 64 (head dim 16), 128 positions.
GPT2 = dict(n_layer=2, n_head=4, n_embd=64, n_positions=128)
EOT = "<|endoftext|>"


# --------------------------------------------------------------------------- a local GPT-2 folder
def _byte_alphabet() -> dict[int, str]:
    """GPT-2's reversible byte → printable character map: printable Latin-1 bytes map to
    themselves, the others to code points from 256 up, in byte order."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out


def _train_bpe(texts: list[str], n_merges: int) -> tuple[dict[str, int], list[str]]:
    """A byte-level BPE learnt from ``texts``: greedy most-frequent-pair merges over words
    (a leading space belongs to its word, as in GPT-2)."""
    alphabet = _byte_alphabet()
    words = Counter()
    for text in texts:
        for word in re.findall(r" ?[^\s]+", text):
            words[tuple(alphabet[b] for b in word.encode("utf-8"))] += 1
    vocab = {ch: i for i, ch in enumerate(alphabet.values())}
    merges = []
    for _ in range(n_merges):
        pairs = Counter()
        for word, count in words.items():
            for pair in zip(word, word[1:]):
                pairs[pair] += count
        if not pairs:
            break
        (a, b), _ = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))
        merges.append(f"{a} {b}")
        vocab[a + b] = len(vocab)
        merged = Counter()
        for word, count in words.items():
            out, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == (a, b):
                    out.append(a + b)
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            merged[tuple(out)] += count
        words = merged
    vocab[EOT] = len(vocab)
    return vocab, merges


@pytest.fixture(scope="module")
def gpt2_folder(tmp_path_factory) -> Path:
    """A random-init GPT2LMHeadModel (seed 0) and its tokenizer, saved with save_pretrained."""
    from transformers import GPT2Config, GPT2LMHeadModel, GPT2Tokenizer

    folder = tmp_path_factory.mktemp("gpt2") / "tiny-gpt2"
    folder.mkdir()
    vocab, merges = _train_bpe(inputs.default_texts(None).items, n_merges=200)
    (folder / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8")
    tokenizer = GPT2Tokenizer(str(folder / "vocab.json"), str(folder / "merges.txt"))
    tokenizer.save_pretrained(str(folder))
    eot = tokenizer.convert_tokens_to_ids(EOT)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), bos_token_id=eot,
                                       eos_token_id=eot, **GPT2))
    model.save_pretrained(str(folder))
    return folder


@pytest.fixture(scope="module")
def gpt2(gpt2_folder):
    """The folder loaded as a user checkpoint: ``--checkpoint DIR/model.safetensors --arch DIR``."""
    spec = spec_for_checkpoint(gpt2_folder / "model.safetensors", str(gpt2_folder))
    return load_model(spec, attn_implementation="eager")


#: Texts of different lengths, so that a batch is right-padded.
SHORT_TEXTS = ["The keys of a layer.", "Attention spreads its weight over the tokens a query sees.",
               "Values.", "A decoder reads left to right, one token after another, never ahead.",
               "Each head has its own queries and keys."]


def _texts(loaded):
    encoded, _ = inputs.tokenize_texts(loaded.tokenizer, SHORT_TEXTS, max_length=64)
    return encoded


# --------------------------------------------------------------------------- the registry
def test_built_in_families_are_registered_in_order():
    assert families.names() == FAMILIES == ("timm-vit", "hf-bert", "hf-gpt2", "kpca-oracle",
                                            "hf-decoder")
    assert [f.modality for f in families.all_families()] == ["image", "text", "text", "image", "text"]
    assert [f.causal for f in families.all_families()] == [False, False, True, False, True]
    with pytest.raises(ValueError, match="unknown model family 'llama'; known families: timm-vit, "
                                         "hf-bert, hf-gpt2, kpca-oracle, hf-decoder"):
        families.get("llama")


def test_unsupported_claims_come_from_the_family():
    gpt2 = REGISTRY["gpt2"]
    assert (gpt2.family, gpt2.source, REGISTRY["distilgpt2"].family) == ("hf-gpt2", "hub", "hf-gpt2")
    assert set(gpt2.unsupported_claims) == {"J"}
    reason = gpt2.unsupported_claims["J"]
    assert "method §5.5" in reason and "causal" in reason and "\n" not in reason
    assert reason.count(". ") == 0  # one sentence
    for key in ("all-MiniLM-L6-v2", "control-vit_tiny_patch16_224", "vit_base_patch16_224"):
        assert REGISTRY[key].unsupported_claims == {}
    # a copy: changing it changes nothing in the family
    gpt2.unsupported_claims["V"] = "x"
    assert set(REGISTRY["gpt2"].unsupported_claims) == {"J"}


def test_a_new_family_registers_where_it_is_defined():
    @families.register
    class Toy(families.FamilyAdapter):
        name, modality, unsupported_claims = "toy-family", "text", {"E": "no spectrum here"}

    try:
        spec = ModelSpec(key="toy", family="toy-family", source="random", arch="x", modality="text",
                         n_layers=1, n_heads=1, head_dim=1, seed=0)
        assert spec.unsupported_claims == {"E": "no spectrum here"}
    finally:
        families.base._FAMILIES.pop("toy-family")
    with pytest.raises(ValueError, match="needs a name and a modality"):
        families.register(type("Nameless", (families.FamilyAdapter,), {}))


def test_hf_model_types_pick_the_family():
    assert arch_shape("gpt2") == ("hf-gpt2",) + tuple(
        getattr(REGISTRY["gpt2"], a) for a in ("n_layers", "n_heads", "head_dim"))
    assert arch_shape("bert")[0] == "hf-bert"
    assert families.for_model_type("roberta", "x").name == "hf-bert"
    with pytest.raises(NotImplementedError, match="model_type 't5', whose attention the suite "
                                                  "cannot capture; supported model types: bert, "
                                                  ".*, gpt2, llama"):
        families.for_model_type("t5", "t5")


def test_prefix_tokens_per_family():
    """Class and distillation tokens are tokens like the others (method §1.1); text has none."""
    import timm

    with torch.device("meta"):
        vit = timm.create_model("vit_tiny_patch16_224", depth=1)
        deit = timm.create_model("deit_tiny_distilled_patch16_224", depth=1)
    timm_family = families.get("timm-vit")
    assert (timm_family.prefix_tokens(vit), timm_family.prefix_tokens(deit)) == (1, 2)
    assert families.get("hf-gpt2").prefix_tokens(vit) == families.get("hf-bert").prefix_tokens(vit) == 0


def test_gpt2_with_a_per_layer_scale_is_refused():
    """scale_attn_by_inverse_layer_idx gives every layer its own s: one model, one scale."""
    from transformers import GPT2Config, GPT2Model

    model = GPT2Model(GPT2Config(vocab_size=50, scale_attn_by_inverse_layer_idx=True, **GPT2))
    with pytest.raises(NotImplementedError, match="layers differ in .* scale"):
        families.get("hf-gpt2").shape(model)
    with pytest.raises(NotImplementedError, match="no h .*only GPT-2-style decoders"):
        families.get("hf-gpt2").attention_modules(torch.nn.Linear(2, 2))


# --------------------------------------------------------------------------- GPT-2: loading
def test_a_local_gpt2_folder_loads_like_any_local_checkpoint(gpt2_folder, gpt2):
    spec = gpt2.spec
    assert (spec.family, spec.modality, spec.source) == ("hf-gpt2", "text", "checkpoint")
    assert (spec.n_layers, spec.n_heads, spec.head_dim) == (2, 4, 16)
    assert spec.unsupported_claims == families.get("hf-gpt2").unsupported_claims
    validate_checkpoint(spec)  # the pre-flight check of --checkpoint/--arch
    # save_pretrained of an LM head model prefixes every key with transformer.: it is dropped
    assert type(gpt2.model).__name__ == "GPT2Model"
    assert gpt2.scale == pytest.approx(16 ** -0.5)
    assert gpt2.tokenizer.pad_token == EOT and gpt2.tokenizer.padding_side in ("right", "left")
    # the same folder as a hub-style source (AutoModel.from_pretrained): the same weights
    as_hub = ModelSpec(key="tiny-gpt2", family="hf-gpt2", source="hub", arch=str(gpt2_folder),
                       modality="text", n_layers=2, n_heads=4, head_dim=16)
    assert load_model(as_hub).checkpoint_hash == gpt2.checkpoint_hash


def test_a_nan_in_c_attn_names_layer_part_and_head(gpt2_folder, tmp_path):
    from safetensors.torch import load_file, save_file

    state = load_file(str(gpt2_folder / "model.safetensors"))
    key = next(k for k in state if k.endswith("h.1.attn.c_attn.weight"))
    state[key][3, 64 + 20] = float("nan")  # Conv1D [in, 3·64]: column 84 is k, head 20 // 16 = 1
    save_file(state, str(tmp_path / "bad.safetensors"))
    spec = spec_for_checkpoint(tmp_path / "bad.safetensors", str(gpt2_folder))
    with pytest.raises(CheckpointError, match=r"\(layer 1, k of head 1\) holds 1 NaN"):
        validate_checkpoint(spec)


# --------------------------------------------------------------------------- GPT-2: capture parity
def _attention_outputs(loaded, batch, dtype=torch.float32):
    """The capture of ``batch``, and each layer's GPT2Attention output (after c_proj) recorded
    by a hook during that same forward pass."""
    got, handles = {}, []
    for i, attn in enumerate(families.get("hf-gpt2").attention_modules(loaded.model)):
        handles.append(attn.register_forward_hook(
            lambda m, a, o, i=i: got.__setitem__(i, o[0].detach().clone())))
    try:
        captured = capture_qkv(loaded, batch, dtype=dtype)
    finally:
        for h in handles:
            h.remove()
    return captured, [got[i] for i in captured["layers"]]


def _replay(loaded, cap, causal=True):
    """softmax(s·qkᵀ + causal mask)·v, heads merged, through each layer's c_proj."""
    attns = families.get("hf-gpt2").attention_modules(loaded.model)
    out = []
    for layer, (q, k, v) in enumerate(zip(cap["q"], cap["k"], cap["v"])):
        weights = recompute_attention(q, k, cap["scale"], cap["token_mask"], causal=causal)
        merged = (weights @ v).transpose(1, 2).flatten(2)  # [B, N, H·d]
        with torch.no_grad():
            out.append(attns[layer].c_proj(merged))
    return out


def test_gpt2_capture_reproduces_the_attention_output(gpt2):
    batch = _texts(gpt2)
    cap, module_out = _attention_outputs(gpt2, batch)
    mask = cap["token_mask"]
    assert mask.sum(dim=1).unique().numel() > 1  # right padding really happens
    assert cap["q"].shape == (2, 5, 4, mask.shape[1], 16) and cap["layers"] == (0, 1)
    replay = _replay(gpt2, cap)
    errors = [float((r - m[:, :mask.shape[1]])[mask].abs().max()) for r, m in zip(replay, module_out)]
    assert max(errors) < 1e-5, errors
    # without the causal mask the same q, k, v do not give the module's output
    print(f"GPT-2 capture parity, float32: max |error| per layer {errors}")
    loose = _replay(gpt2, cap, causal=False)
    assert float((loose[0] - module_out[0][:, :mask.shape[1]])[mask].abs().max()) > 1e-3


def test_the_last_query_sees_every_key():
    """Method §5.5: under the causal mask the last query attends over all N keys, so its row is
    the unmasked one; earlier rows put no weight on later keys."""
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, 2, 7, 4, generator=g, dtype=torch.float64) for _ in range(2))
    causal = recompute_attention(q, k, 0.5, causal=True)
    full = recompute_attention(q, k, 0.5)
    torch.testing.assert_close(causal[..., -1, :], full[..., -1, :], rtol=0, atol=0)
    assert float(causal.triu(1).abs().max()) == 0.0
    torch.testing.assert_close(causal.sum(-1), torch.ones(1, 2, 7, dtype=torch.float64))


def test_gpt2_capture_in_float64_matches_to_round_off(gpt2_folder):
    spec = spec_for_checkpoint(gpt2_folder / "model.safetensors", str(gpt2_folder))
    loaded = load_model(spec, attn_implementation="eager")
    loaded.model.double()
    cap, module_out = _attention_outputs(loaded, _texts(loaded), dtype=torch.float64)
    mask = cap["token_mask"]
    replay = _replay(loaded, cap)
    errors = [float((r - m[:, :mask.shape[1]])[mask].abs().max()) for r, m in zip(replay, module_out)]
    print(f"GPT-2 capture parity, float64: max |error| per layer {errors}")
    assert max(errors) < 1e-12, errors


# --------------------------------------------------------------------------- GPT-2: claims
@pytest.mark.slow
def test_claims_run_on_gpt2_and_skip_claim_j_with_the_family_reason(pytester, gpt2_folder, tmp_path):
    out = tmp_path / "out"
    result = pytester.runpytest_subprocess(
        str(ROOT / "claims"), "--rootdir", str(ROOT), "-c", str(ROOT / "pyproject.toml"),
        "--checkpoint", str(gpt2_folder / "model.safetensors"), "--arch", str(gpt2_folder),
        "--layers", "0", "--heads", "0,1", "--n-samples", "4", "--threads", "1", "-rs",
        "--out", str(out), "--cache-dir", str(out / "cache"), timeout=600)
    text = result.stdout.str()
    assert result.ret in (0, 1), text  # supported or not: a verdict, not a fault
    reason = families.get("hf-gpt2").unsupported_claims["J"]
    skipped = [line for line in text.splitlines() if line.startswith("SKIPPED")]
    assert skipped and all(reason in line for line in skipped), skipped
    assert any("test_projection_loss" in line for line in skipped)
    results = json.loads((out / "results.json").read_text())
    claims = {r["claim"] for r in results["records"]}
    assert claims == {"V", "E"}, claims
    model = next(iter(results["models"].values()))
    assert model["family"] == "hf-gpt2"
    # the reason is in results.json and the report too, not only in the terminal with -rs
    j_tests = [t for t in results["skipped"] if "test_projection_loss" in t]
    assert len(j_tests) == 2 and all(reason in results["skipped"][t] for t in j_tests), results["skipped"]
    assert results["complete"] is True
    page = (out / "report.html").read_text()
    assert 'id="skipped"' in page and reason in html.unescape(page)


@pytest.mark.slow
def test_a_gpt2_series_skips_the_claim_j_trend(pytester, gpt2_folder, tmp_path):
    series = tmp_path / "run"
    series.mkdir()
    for step in (1, 2):
        (series / f"step_{step}.safetensors").write_bytes((gpt2_folder / "model.safetensors").read_bytes())
    out = tmp_path / "out"
    result = pytester.runpytest_subprocess(
        str(ROOT / "claims"), "--rootdir", str(ROOT), "-c", str(ROOT / "pyproject.toml"),
        "--series", str(series), "--arch", str(gpt2_folder), "--n-samples", "2", "--threads", "1",
        "-rs", "--out", str(out), "--cache-dir", str(out / "cache"), "--report", "none", timeout=600)
    reason = families.get("hf-gpt2").unsupported_claims["J"]
    # the only test the series selects is skipped: nothing was judged, exit 9 (README, Exit codes)
    assert result.ret == 9, result.stdout.str()
    result.stdout.fnmatch_lines([f"SKIPPED [[]1[]] *claims/test_projection_loss.py: claim J is not supported for series-run: {reason}"])
