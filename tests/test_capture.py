"""Q/K/V capture adapters: fixtures/models/capture.py against the models' own eager attention."""

from __future__ import annotations

import contextlib
import math

import pytest
import torch

import fixtures  # noqa: F401  (torchvision compat before timm)
from timm.layers import Attention

from checks.errors import NonFiniteError
from checks.gram import standardize_tokens
from fixtures.models.capture import capture_qkv, model_output, recompute_attention
from fixtures.models.capture_batches import capture_in_batches, capture_to_layer_files
from fixtures.models.families import check_right_padding
from fixtures.models.loading import attention_modules, load_model, wrap_model
from fixtures.models.catalogue import REGISTRY, ModelSpec

F64 = torch.float64
IMG = 64  # 16 patches of 16×16


def vit_spec(key, arch="vit_tiny_patch16_224", depth=2, seed=0, **extra) -> ModelSpec:
    kwargs = dict(depth=depth, img_size=IMG, **extra)
    return ModelSpec(key=key, family="timm-vit", source="random", arch=arch, modality="image",
                     n_layers=depth, n_heads=3, head_dim=64, seed=seed, control=True,
                     model_kwargs=tuple(sorted(kwargs.items())), label="test")


def hf_spec(model_type, heads=4, hidden=32, **extra) -> ModelSpec:
    kwargs = dict(vocab_size=120, hidden_size=hidden, num_hidden_layers=2, num_attention_heads=heads,
                  intermediate_size=64, max_position_embeddings=64, **extra)
    return ModelSpec(key=f"tiny-{model_type}", family="hf-bert", source="random", arch=model_type,
                     modality="text", n_layers=2, n_heads=heads, head_dim=hidden // heads, seed=0,
                     control=True, model_kwargs=tuple(sorted(kwargs.items())), label="test")


def as_f64(loaded):
    loaded.model.double()
    return loaded


def images(n, seed=0):
    return torch.randn(n, 3, IMG, IMG, generator=torch.Generator().manual_seed(seed), dtype=F64)


def text_batch(lengths, vocab=120, seed=0):
    """Right-padded token ids with the given real lengths (token 0 is the pad id)."""
    g = torch.Generator().manual_seed(seed)
    n = max(lengths)
    ids = torch.randint(5, vocab, (len(lengths), n), generator=g)
    mask = (torch.arange(n)[None] < torch.tensor(lengths)[:, None]).long()
    return {"input_ids": ids * mask, "attention_mask": mask}


def merge_heads(x):
    """[..., B, H, N, d] → [..., B, N, H·d]."""
    return x.transpose(-3, -2).flatten(-2)


@contextlib.contextmanager
def hooks(pairs):
    """Record each module's output (``fn(output)``) under its name while inside."""
    got, handles = {}, []
    for name, module, fn in pairs:
        handles.append(module.register_forward_hook(
            lambda m, i, o, name=name, fn=fn: got.__setitem__(name, fn(o).detach().clone())))
    try:
        yield got
    finally:
        for h in handles:
            h.remove()


@contextlib.contextmanager
def eager_timm(model):
    """timm attention without SDPA, so that attn_drop sees the attention matrix."""
    attns = attention_modules(model, "timm-vit")
    old = [a.fused_attn for a in attns]
    for a in attns:
        a.fused_attn = False
    try:
        yield attns
    finally:
        for a, f in zip(attns, old):
            a.fused_attn = f


@pytest.fixture(scope="module")
def vit():
    return as_f64(load_model(vit_spec("tiny-vit")))


@pytest.fixture(scope="module")
def deit_distilled():
    return as_f64(load_model(vit_spec("tiny-deit-distilled", arch="deit_tiny_distilled_patch16_224")))


@pytest.fixture(scope="module")
def bert():
    return as_f64(load_model(hf_spec("bert"), attn_implementation="eager"))


@pytest.fixture(scope="module")
def minilm():
    return load_model(REGISTRY["all-MiniLM-L6-v2"], attn_implementation="eager")


# --- timm ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("which", ["vit", "deit_distilled"])
def test_timm_capture_matches_the_models_eager_attention(request, which):
    loaded = request.getfixturevalue(which)
    x = images(3)
    with eager_timm(loaded.model) as attns:
        plain = model_output(loaded, x)
        pairs = [(("p", i), a.attn_drop, lambda o: o) for i, a in enumerate(attns)]
        pairs += [(("out", i), a, lambda o: o) for i, a in enumerate(attns)]
        with hooks(pairs) as ref:
            cap = capture_qkv(loaded, x, dtype=F64)
    prefix = 2 if which == "deit_distilled" else 1  # class (+ distillation) token attended over
    assert cap["q"].shape == (2, 3, 3, prefix + 16, 64) == cap["k"].shape == cap["v"].shape
    assert cap["token_mask"].all() and cap["token_mask"].shape == (3, prefix + 16)
    assert torch.equal(cap["output"], plain)  # the hooks change nothing
    assert cap["scale"] == 1 / 8 and not cap["standardized_qk"] and not cap["qk_normed"]
    attn = recompute_attention(cap["q"], cap["k"], cap["scale"], cap["token_mask"])
    for i, a in enumerate(attention_modules(loaded.model, "timm-vit")):
        torch.testing.assert_close(attn[i], ref[("p", i)], rtol=0, atol=1e-12)
        # v too: the head outputs through the module's own output projection give its output.
        torch.testing.assert_close(a.proj(merge_heads(attn[i] @ cap["v"][i])), ref[("out", i)],
                                   rtol=0, atol=1e-12)


def test_timm_fused_and_eager_forward_agree_with_capture(vit):
    # Same captured q, k, v whichever attention kernel the model runs.
    x = images(2, seed=1)
    fused = capture_qkv(vit, x, dtype=F64)
    assert torch.equal(fused["output"], model_output(vit, x))  # the hooks change nothing
    with eager_timm(vit.model):
        eager = capture_qkv(vit, x, dtype=F64)
    for name in ("q", "k", "v"):  # layer 0 sees the same input; later layers differ by round-off
        assert torch.equal(fused[name][0], eager[name][0])
        torch.testing.assert_close(fused[name], eager[name], rtol=0, atol=1e-12)
    torch.testing.assert_close(fused["output"], eager["output"], rtol=0, atol=1e-12)


class _StandardizedAttention(Attention):
    """P1-style attention: q and k standardised per token before the scores (eager)."""

    qk_standardize = True

    def forward(self, x, attn_mask=None, is_causal=False):
        b, n, _ = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        q, k = standardize_tokens(q), standardize_tokens(k)
        attn = self.attn_drop(((q * self.scale) @ k.transpose(-2, -1)).softmax(dim=-1))
        return self.proj((attn @ v).transpose(1, 2).reshape(b, n, self.attn_dim))


def test_standardised_attention_is_captured_as_used(vit):
    spec = vit_spec("tiny-vit-std", seed=3)
    base = load_model(spec).model
    raw = capture_qkv(wrap_model(base, spec), images(2).float(), dtype=F64)
    for block in base.blocks:
        new = _StandardizedAttention(192, num_heads=3, qkv_bias=True)
        new.load_state_dict(block.attn.state_dict())
        block.attn = new
    loaded = wrap_model(base.double(), spec)
    with hooks([(i, b.attn.attn_drop, lambda o: o) for i, b in enumerate(base.blocks)]) as ref:
        cap = capture_qkv(loaded, images(2), dtype=F64)
    assert cap["standardized_qk"] and not raw["standardized_qk"]
    torch.testing.assert_close(cap["q"].mean(-1), torch.zeros_like(cap["q"][..., 0]), rtol=0, atol=1e-12)
    torch.testing.assert_close(cap["k"].std(-1), torch.ones_like(cap["k"][..., 0]), rtol=0, atol=1e-6)
    # Layer 0's v is untouched (same input, same weights); q and k are what standardisation made.
    torch.testing.assert_close(cap["v"][0], raw["v"][0], rtol=0, atol=1e-5)
    torch.testing.assert_close(cap["k"][0], standardize_tokens(raw["k"][0]), rtol=0, atol=1e-4)
    attn = recompute_attention(cap["q"], cap["k"], cap["scale"])
    for i in range(2):
        torch.testing.assert_close(attn[i], ref[i], rtol=0, atol=1e-12)


def test_qk_norm_is_applied_like_the_model():
    loaded = as_f64(load_model(vit_spec("tiny-vit-qknorm", qk_norm=True)))
    with eager_timm(loaded.model) as attns:
        with hooks([(i, a.attn_drop, lambda o: o) for i, a in enumerate(attns)]) as ref:
            cap = capture_qkv(loaded, images(2), dtype=F64)
    assert cap["qk_normed"]
    attn = recompute_attention(cap["q"], cap["k"], cap["scale"])
    for i in range(2):
        torch.testing.assert_close(attn[i], ref[i], rtol=0, atol=1e-12)


def test_non_finite_activations_are_named(vit):
    spec = vit_spec("tiny-vit-nan", seed=5)
    loaded = load_model(spec)
    with torch.no_grad():
        loaded.model.blocks[1].attn.qkv.bias[3] = float("nan")  # head 0's q, every token
    with pytest.raises(NonFiniteError, match=r"q of model 'tiny-vit-nan', layer 1 .* at batch index \(0, 0\)"):
        capture_qkv(loaded, images(2).float())


def test_layer_selection_and_bad_batches(vit):
    x = images(2)
    full = capture_qkv(vit, x, dtype=F64)
    one = capture_qkv(vit, x, layers=[1], dtype=F64)
    assert one["layers"] == (1,) and torch.equal(one["k"][0], full["k"][1])
    assert capture_qkv(vit, x)["q"].dtype == torch.float32  # default dtype
    with pytest.raises(ValueError, match="distinct indices"):
        capture_qkv(vit, x, layers=[2])
    with pytest.raises(ValueError, match=r"\[B, 3, H, W\]"):
        capture_qkv(vit, x[0])


def test_image_batches_concatenate(vit):
    x = images(5)
    seen = []
    got = capture_in_batches(vit, x, batch_size=2, progress=seen.append, dtype=F64)
    once = capture_qkv(vit, x, dtype=F64)
    assert seen == [2, 4, 5]
    for name in ("q", "k", "v", "output"):
        torch.testing.assert_close(got[name], once[name], rtol=0, atol=1e-12)
    listed = capture_in_batches(vit, list(x), batch_size=3, dtype=F64)  # an iterable of single images
    torch.testing.assert_close(listed["v"], once["v"], rtol=0, atol=1e-12)
    seen.clear()  # a list of ready batches, kept as they are
    ready = capture_in_batches(vit, [x[:3], x[3:]], progress=seen.append, dtype=F64)
    assert seen == [3, 5]
    torch.testing.assert_close(ready["k"], once["k"], rtol=0, atol=1e-12)


# --- Hugging Face BERT family --------------------------------------------------------------------

def test_bert_capture_matches_eager_attentions_with_padding(bert):
    batch = text_batch([9, 5, 2])
    plain = model_output(bert, batch)
    cap = capture_qkv(bert, batch, dtype=F64)
    assert torch.equal(cap["output"], plain)
    assert cap["q"].shape == (2, 3, 4, 9, 8)
    assert cap["token_mask"].sum(-1).tolist() == [9, 5, 2]
    with torch.no_grad():
        ref = bert.model(**batch, output_attentions=True).attentions
    attn = recompute_attention(cap["q"], cap["k"], cap["scale"], cap["token_mask"])
    for i in range(2):
        for b, n in enumerate([9, 5, 2]):  # real queries over real keys; padded keys get 0
            torch.testing.assert_close(attn[i, b, :, :n, :], ref[i][b, :, :n, :], rtol=0, atol=1e-12)
            assert bool((attn[i, b, :, :, n:] == 0).all())


HF_TINY = [
    ("bert", {}),
    ("roberta", {"pad_token_id": 1}),
    ("electra", {"embedding_size": 16}),
    ("xlm-roberta", {"pad_token_id": 1}),
    ("camembert", {"pad_token_id": 1}),
    ("longformer", {"attention_window": 16, "pad_token_id": 1}),
    ("luke", {"entity_vocab_size": 10, "entity_emb_size": 16}),
]


@pytest.mark.parametrize("model_type, extra", HF_TINY, ids=[m for m, _ in HF_TINY])
def test_every_hf_family_head_outputs_match(model_type, extra):
    """softmax(s q kᵀ)·v from the capture equals each model's own self-attention output."""
    loaded = as_f64(load_model(hf_spec(model_type, **extra)))
    lengths = [9, 6, 3]
    batch = text_batch(lengths, seed=2)
    selfs = attention_modules(loaded.model, "hf-bert")
    plain = model_output(loaded, batch)
    with hooks([(i, a, lambda o: o[0]) for i, a in enumerate(selfs)]) as ref:
        cap = capture_qkv(loaded, batch, dtype=F64)
    assert torch.equal(cap["output"], plain)
    assert cap["scale"] == pytest.approx(1 / math.sqrt(8), rel=1e-15)
    attn = recompute_attention(cap["q"], cap["k"], cap["scale"], cap["token_mask"])
    heads = merge_heads(attn @ cap["v"])  # [L, B, N, C]
    atol = 1e-6 if model_type == "longformer" else 1e-12  # Longformer's softmax runs in float32
    for i in range(2):
        for b, n in enumerate(lengths):
            torch.testing.assert_close(heads[i, b, :n], ref[i][b, :n], rtol=0, atol=atol)


def test_longformer_beyond_its_window_is_refused():
    loaded = load_model(hf_spec("longformer", attention_window=4, pad_token_id=1))
    capture_qkv(loaded, text_batch([3, 2]))  # within ±2 tokens: full attention
    with pytest.raises(NotImplementedError, match="sliding window of ±2 tokens"):
        capture_qkv(loaded, text_batch([4, 2]))


def test_text_batch_errors(bert):
    left = text_batch([4, 2])
    left["attention_mask"] = left["attention_mask"].flip(-1)
    with pytest.raises(ValueError, match="not right-padded"):
        capture_qkv(bert, left)
    global_marks = text_batch([3, 3])
    global_marks["attention_mask"][0, 0] = 2
    with pytest.raises(ValueError, match="0/1 only"):
        capture_qkv(bert, global_marks)
    with pytest.raises(ValueError, match="no real token"):
        check_right_padding(torch.tensor([[True, False], [False, False]]))
    with pytest.raises(ValueError, match="dict with input_ids"):
        capture_qkv(bert, torch.zeros(2, 3, 8, 8))


def test_minilm_real_weights_parity_and_batches(minilm):
    sentences = ["Attention is kernel PCA, or so the paper says.",
                 "Short.",
                 "The reproduction study measured the value vectors against the Gram eigenvectors.",
                 "Padding tokens are excluded.",
                 "Keys, queries and values."]
    enc = minilm.tokenizer(sentences, padding=True, return_tensors="pt")
    cap = capture_qkv(minilm, dict(enc))
    assert cap["q"].shape[:3] == (6, 5, 12) and cap["q"].shape[-1] == 32
    assert cap["scale"] == pytest.approx(1 / math.sqrt(32), rel=1e-7)
    with torch.no_grad():
        ref = minilm.model(**enc, output_attentions=True).attentions
    attn = recompute_attention(cap["q"], cap["k"], cap["scale"], cap["token_mask"])
    lengths = cap["token_mask"].sum(-1).tolist()
    for i in range(6):
        for b, n in enumerate(lengths):
            torch.testing.assert_close(attn[i, b, :, :n], ref[i][b, :, :n], rtol=1e-4, atol=2e-6)
    # Strings in batches of 2: each batch padded to its own longest, then to the overall longest.
    seen = []
    got = capture_in_batches(minilm, sentences, batch_size=2, progress=seen.append)
    assert seen == [2, 4, 5]
    # The same as a list of ready tokenised batches (the session's way).
    ready = [dict(minilm.tokenizer(sentences[j:j + 2], padding=True, return_tensors="pt"))
             for j in range(0, 5, 2)]
    assert torch.equal(capture_in_batches(minilm, ready)["k"], got["k"])
    assert torch.equal(got["token_mask"], cap["token_mask"])
    real = cap["token_mask"][None, :, None, :, None]
    own = [max(lengths[j:j + 2]) for j in range(0, 5, 2) for _ in lengths[j:j + 2]]
    beyond = torch.arange(cap["q"].shape[-2])[None, :] >= torch.tensor(own)[:, None]  # [B, N]
    assert bool(beyond.any())
    for name in ("q", "k", "v"):
        torch.testing.assert_close(got[name] * real, cap[name] * real, rtol=1e-5, atol=1e-5)
        assert bool((got[name].transpose(2, 3)[:, beyond] == 0).all())  # cross-batch padding is zeros


def test_streamed_layer_files_equal_the_in_memory_capture(minilm, vit, tmp_path):
    """capture_to_layer_files (the session's route, one layer in memory at a time) writes per layer
    exactly what capture_in_batches returns, padding across batches of different lengths included."""
    from safetensors.torch import load_file

    sentences = ["Short.", "Attention is kernel PCA, or so the paper says.", "Keys.",
                 "The reproduction study measured the value vectors against the eigenvectors.",
                 "Values."]
    for loaded, inputs, bs, folder in ((minilm, sentences, 2, tmp_path / "text"),
                                       (vit, images(5), 2, tmp_path / "image")):
        seen = []
        meta = capture_to_layer_files(loaded, inputs, folder, batch_size=bs, progress=seen.append,
                                      dtype=F64)
        whole = capture_in_batches(loaded, inputs, batch_size=bs, dtype=F64)
        assert seen == [2, 4, 5] and meta["n_samples"] == 5
        assert meta["n_layers"] == whole["q"].shape[0]
        assert meta["standardized_qk"] == whole["standardized_qk"]
        assert sorted(p.name for p in folder.iterdir()) == [
            f"layer_{i:02d}.safetensors" for i in range(meta["n_layers"])]  # shards removed
        for layer in range(meta["n_layers"]):
            got = load_file(str(folder / f"layer_{layer:02d}.safetensors"))
            for name in ("q", "k", "v"):
                assert torch.equal(got[name], whole[name][layer])
            assert torch.equal(got["token_mask"], whole["token_mask"])


# --- the reference attention ---------------------------------------------------------------------

def test_recompute_attention_known_answers():
    q = torch.zeros(2, 1, 3, 4, 5, dtype=F64)  # [L, B, H, N, d] with q = 0: uniform attention
    k = torch.randn(2, 1, 3, 4, 5, dtype=F64)
    mask = torch.tensor([[True, True, True, False]])
    attn = recompute_attention(q, k, 0.3, mask)
    torch.testing.assert_close(attn[..., :3], torch.full((2, 1, 3, 4, 3), 1 / 3, dtype=F64))
    assert bool((attn[..., 3] == 0).all())
    # One dominant key: q = k_j scaled up puts (almost) all weight on j.
    k = torch.eye(4, dtype=F64)[None, None]
    attn = recompute_attention(40 * k, k, 1.0)
    torch.testing.assert_close(attn[0, 0], torch.eye(4, dtype=F64), rtol=0, atol=1e-15)
    with pytest.raises(ValueError, match="token_mask must be"):
        recompute_attention(q, q, 1.0, mask[:, :3])
    with pytest.raises(ValueError, match="no real token"):
        recompute_attention(q, q, 1.0, torch.zeros(1, 4, dtype=torch.bool))
