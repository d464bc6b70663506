"""``python -m bench.capture_memory``: the capture's peak memory against the model's depth.

For each depth (4, 8, 16, 32 layers by default) a random-initialised Llama decoder of small
width (:class:`Shape`) is built from a seed in a fresh Python process, and its capture is written
to layer files as the cache does (:func:`fixtures.models.capture_batches.capture_to_layer_files`)
in two ways, each in its own process:

- ``streamed``: the suite's capture, each layer handed on from inside the forward pass;
- ``held`` (the reference): the same code with every layer of a batch held until the forward
  pass ends, as the capture did before it streamed (:func:`held_capture` wraps
  :func:`fixtures.models.capture.capture_qkv` and hands the layers on afterwards).

The process's peak resident size is reset once the model is loaded (``/proc/self/clear_refs``)
and read after the capture (``VmHWM``); the *growth* is that peak less the resident size after
loading. Both routes also hold the model's float64 copy for the forward pass (method §13), so the
table shows it beside the growth, and the growth less that copy as the capture's own. The ratio
held/streamed is printed at every depth. Linux only (the peak is the kernel's). The results go to
``bench/capture_memory.json``; ``--write-table`` rewrites docs/performance.md's memory table.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import fixtures  # noqa: F401  (torchvision shim before transformers)

import torch
import transformers

from fixtures.models import capture_batches, loading
from fixtures.models.catalogue import ModelSpec

from fixtures.engine.memory import resident_bytes

from .table import replace_block
from .timing import ROOT, cpu_model, provenance, set_threads

OUT = ROOT / "bench" / "capture_memory.json"
DOC = ROOT / "docs" / "performance.md"
START = "<!-- capture-memory-table:start (python -m bench.capture_memory --write-table) -->"
END = "<!-- capture-memory-table:end -->"
ROUTES = ("streamed", "held")


@dataclass(frozen=True)
class Shape:
    """The decoder and its inputs: width, heads, and the texts (random token ids, all real)."""

    hidden: int = 256
    heads: int = 8
    kv_heads: int = 4
    tokens: int = 128
    samples: int = 32
    batch: int = 16
    vocab: int = 512


QUICK = Shape(hidden=64, heads=4, kv_heads=2, tokens=32, samples=8, batch=4, vocab=128)


def _peak_kib() -> int:
    """The process's peak resident size since the last reset (``VmHWM``), in KiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise RuntimeError("/proc/self/status has no VmHWM")


def held_capture(capture_qkv):
    """``capture_qkv`` as it was before it streamed: every layer of the batch held until the
    forward pass ends, then handed to the sink one after another."""
    def capture(loaded, batch, layers=None, sink=None, **kwargs):
        got = capture_qkv(loaded, batch, layers=layers, **kwargs)
        if sink is not None:
            for row, layer in enumerate(got["layers"]):
                sink(layer, {name: got[name][row] for name in ("q", "k", "v")})
            for name in ("q", "k", "v"):
                del got[name]
        return got
    return capture


def measure(route: str, n_layers: int, shape: Shape) -> dict:
    """One (route, depth) in this process: the resident sizes in bytes and the capture's time."""
    set_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "model"
        transformers.LlamaConfig(
            vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=2 * shape.hidden,
            num_hidden_layers=n_layers, num_attention_heads=shape.heads,
            num_key_value_heads=shape.kv_heads, max_position_embeddings=shape.tokens,
        ).save_pretrained(folder)
        spec = ModelSpec(key=f"bench-llama-{n_layers}", family="hf-decoder", source="random",
                         arch=str(folder), modality="text", n_layers=n_layers, n_heads=shape.heads,
                         head_dim=shape.hidden // shape.heads, seed=0,
                         n_kv_heads=shape.kv_heads if shape.kv_heads != shape.heads else None)
        loaded = loading.load_model(spec)
        gen = torch.Generator().manual_seed(0)
        ids = torch.randint(0, shape.vocab, (shape.samples, shape.tokens), generator=gen)
        batches = [{"input_ids": ids[i:i + shape.batch],
                    "attention_mask": torch.ones_like(ids[i:i + shape.batch])}
                   for i in range(0, shape.samples, shape.batch)]
        weights = sum(p.numel() * p.element_size() for p in loaded.model.parameters())
        if route == "held":
            capture_batches.capture_qkv = held_capture(capture_batches.capture_qkv)
        Path("/proc/self/clear_refs").write_text("5")  # the peak starts again from here
        loaded_bytes = resident_bytes()
        t0 = time.perf_counter()
        meta = capture_batches.capture_to_layer_files(loaded, batches, Path(tmp) / "capture")
        seconds = time.perf_counter() - t0
        peak_bytes = _peak_kib() * 1024
    assert meta["n_layers"] == n_layers and meta["n_samples"] == shape.samples
    # float32 q per query head, k and v per KV head (as the layer files hold them)
    qkv_layer = (shape.heads + 2 * shape.kv_heads) * shape.samples * shape.tokens * \
        (shape.hidden // shape.heads) * 4
    return {"route": route, "layers": n_layers, "weights_bytes": weights,
            "float64_copy_bytes": 2 * weights, "qkv_bytes_per_layer": qkv_layer,
            "loaded_bytes": loaded_bytes, "peak_bytes": peak_bytes,
            "growth_bytes": peak_bytes - loaded_bytes, "capture_s": round(seconds, 2)}


def run(depths: list[int], shape: Shape) -> dict:
    """Every (depth, route) in a fresh process of its own, and the provenance of the run."""
    rows = []
    for n_layers in depths:
        for route in ROUTES:
            cmd = [sys.executable, "-m", "bench.capture_memory", "--child", route, str(n_layers),
                   json.dumps(asdict(shape))]
            done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
            if done.returncode:
                raise SystemExit(f"bench.capture_memory: the {route} capture of {n_layers} layers "
                                 f"failed:\n{done.stderr[-2000:]}")
            rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(_row_line(rows[-1]), flush=True)
    return {"schema": "kpca-claims/bench-capture-memory/1", **provenance(),
            "cpu": cpu_model(), "torch": torch.__version__,
            "shape": asdict(shape), "rows": rows}


def _mb(n: float) -> str:
    return f"{n / 2**20:.1f}"


def _row_line(row: dict) -> str:
    own = row["growth_bytes"] - row["float64_copy_bytes"]
    return (f"{row['layers']:>3} layers {row['route']:>8}: peak growth {_mb(row['growth_bytes'])} MB "
            f"(float64 weights {_mb(row['float64_copy_bytes'])} MB, capture's own {_mb(own)} MB), "
            f"{row['capture_s']} s")


def table(results: dict) -> str:
    """The Markdown table of docs/performance.md, one row per depth, with the held/streamed ratio."""
    s = results["shape"]
    by = {(r["layers"], r["route"]): r for r in results["rows"]}
    depths = sorted({r["layers"] for r in results["rows"]})
    lines = [f"Measured {results['date_utc']} UTC at commit {results['commit']} on {results['cpu']}, torch "
             f"{results['torch']}, one thread; random-initialised Llama decoder, hidden "
             f"{s['hidden']}, {s['heads']} query heads over {s['kv_heads']} KV heads, "
             f"{s['samples']} texts of {s['tokens']} tokens in batches of {s['batch']}. MB = 2^20 "
             "bytes; *growth* = peak resident size during the capture less the size after "
             "loading; *own* = growth less the model's float64 copy for the forward pass.", "",
             "| layers | weights (float32) | one layer's file (q, k, v of all texts) | streamed growth (own) "
             "| held growth (own) | held / streamed, own |", "|---|---|---|---|---|---|"]
    for n in depths:
        a, b = by[(n, "streamed")], by[(n, "held")]
        own_a = a["growth_bytes"] - a["float64_copy_bytes"]
        own_b = b["growth_bytes"] - b["float64_copy_bytes"]
        ratio = f"{own_b / own_a:.1f}×" if own_a > 0 else "—"
        lines.append(f"| {n} | {_mb(a['weights_bytes'])} MB | {_mb(a['qkv_bytes_per_layer'])} MB "
                     f"| {_mb(a['growth_bytes'])} ({_mb(own_a)}) MB | {_mb(b['growth_bytes'])} "
                     f"({_mb(own_b)}) MB | {ratio} |")
    return START + "\n" + "\n".join(lines) + "\n" + END


def write_table(results_path: Path = OUT, doc: Path = DOC) -> None:
    doc.write_text(replace_block(doc.read_text(), START, END,
                                 table(json.loads(results_path.read_text())), doc))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.capture_memory", description=__doc__.split("\n")[0])
    p.add_argument("--layers", default="4,8,16,32", help="depths to measure (default 4,8,16,32)")
    p.add_argument("--quick", action="store_true", help="a small decoder and depths 2,4 (CI size)")
    p.add_argument("--out", default=None, help=f"results file (default {OUT.relative_to(ROOT)})")
    p.add_argument("--write-table", action="store_true",
                   help="no run: rewrite docs/performance.md's memory table from the results file")
    p.add_argument("--child", nargs=3, metavar=("ROUTE", "LAYERS", "SHAPE"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        route, layers, shape = args.child
        print(json.dumps(measure(route, int(layers), Shape(**json.loads(shape)))))
        return 0
    out = Path(args.out) if args.out else OUT
    if args.write_table:
        write_table(out)
        print(f"{DOC.relative_to(ROOT)}: capture memory table rewritten from {out}")
        return 0
    if not Path("/proc/self/clear_refs").exists():
        p.exit(4, f"{p.prog}: error: the peak resident size is read from Linux's /proc; "
                  "run it on Linux\n")
    try:
        depths = [int(x) for x in ("2,4" if args.quick and args.layers == "4,8,16,32"
                                   else args.layers).split(",")]
    except ValueError:
        p.exit(4, f"{p.prog}: error: --layers {args.layers!r} is not a list of depths, e.g. 4,8\n")
    if any(n < 1 for n in depths):
        p.exit(4, f"{p.prog}: error: --layers needs depths of at least 1, got {args.layers!r}\n")
    results = run(depths, QUICK if args.quick else Shape())
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(results, indent=1) + "\n")
    tmp.replace(out)
    print(table(results).split("\n", 2)[2].rsplit("\n", 1)[0])
    print(f"written: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
