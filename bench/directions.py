"""``python -m bench.directions``: claim V by directions (method §2.6) measured on real captures,
against claim V's own token-shuffled null, for the design of a "partial" verdict tier (issue 41).

For every (sample, head) of every layer of each model: V̂ from the key Gram (raw keys, float64,
P2's axis convention, as the default run), its null ΠV̂ with the very token permutations of the
claim test (claims/claim_v_grid.py ``_v_batches``), and three statistics of V against each:
the eigenvalue-weighted capture of V̂'s directions (:func:`checks.leading_directions.leading_capture`),
the number of V̂'s directions, in eigenvalue order, held to cos² ≥ 0.9, and the number of
principal angles with cos² ≥ 0.9 (:func:`checks.leading_directions.principal_angle_count`).
Prints, per model, the median over (sample, head) of each beside its null's, and how many heads'
mean exceeds their null's by a margin. Nothing is judged; the captures come from the cache of a
claims run (``pytest claims/`` first), or are made here.

    python -m bench.directions --models all-MiniLM-L6-v2,control-bert-minilm-shape
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch

from checks.leading_directions import leading_capture, principal_angle_count
from claims.claim_v_grid import _v_batches, grid_gram, padded_v_hat
from fixtures.engine.claim_session import ClaimSession
from fixtures.engine.layer_context import LayerContext
from fixtures.engine.run_options import RunOptions
from fixtures.models.catalogue import REGISTRY

#: The statistics, as (name, label).
STATISTICS = (("weighted", "eigenvalue-weighted capture"), ("leading", "leading directions held"),
              ("angles", "principal angles cos² ≥ 0.9"))


def layer_statistics(ctx) -> dict[str, list[torch.Tensor]]:
    """The three statistics of one layer against V̂ and against ΠV̂: ``{name: [..]}`` and
    ``{name + "_null": [..]}``, one tensor [b, h] per batch, and ``"heads"`` (the batch's head
    indices) and ``"n"`` (its token count) beside them."""
    info = ctx.info
    d = info["head_dim"]
    out: dict[str, list] = {}
    for _chunk, heads, k, v, perm, _a0 in _v_batches(ctx):
        if k.shape[-2] <= d:  # V̂ has fewer than d directions: not determined (method §2.2)
            continue
        gram = grid_gram(k, info, False, torch.float64)
        v_hat, v64 = padded_v_hat(gram, "p2", d), v.to(torch.float64)
        null = v_hat.gather(-2, perm.unsqueeze(-1).expand_as(v_hat))
        mu = gram.eigenvalues[..., :d]
        for tag, y in (("", v_hat), ("_null", null)):
            cap = leading_capture(v64, y, mu)
            out.setdefault("weighted" + tag, []).append(cap["weighted"])
            out.setdefault("leading" + tag, []).append(cap["shared"].to(torch.float64))
            out.setdefault("angles" + tag, []).append(
                principal_angle_count(v64, y).to(torch.float64))
        out.setdefault("heads", []).append(list(range(heads.start or 0, heads.stop)))
    return out


def model_summary(run, margin: float = 0.0) -> dict:
    """Per statistic: the median over (sample, head) and its null's, and how many heads' mean
    exceeds their null's mean by more than ``margin`` (in the statistic's own unit)."""
    info = run.prepare()
    values: dict[str, list[float]] = {}
    per_head: dict[tuple, dict[str, list[float]]] = {}
    for layer in range(info["n_layers"]):
        stats = layer_statistics(LayerContext(run, layer, info))
        for i, heads in enumerate(stats.get("heads", [])):
            for name in [s for s, _ in STATISTICS] + [f"{s}_null" for s, _ in STATISTICS]:
                t = stats[name][i]
                values.setdefault(name, []).extend(t.flatten().tolist())
                for j, h in enumerate(heads):
                    per_head.setdefault((layer, h), {}).setdefault(name, []).extend(
                        t[:, j].tolist())
    out = {"model": run.spec.key, "head_dim": info["head_dim"], "heads": len(per_head)}
    for name, _ in STATISTICS:
        if name not in values:
            continue
        means = [(statistics.fmean(h[name]), statistics.fmean(h[f"{name}_null"]))
                 for h in per_head.values()]
        out[name] = {"median": statistics.median(values[name]),
                     "null_median": statistics.median(values[f"{name}_null"]),
                     "heads_above_null": sum(1 for a, b in means if a > b + margin)}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.directions", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="all-MiniLM-L6-v2,control-bert-minilm-shape",
                        help="comma-separated registry keys (default: MiniLM and its random twin)")
    parser.add_argument("--n-samples", type=int, default=100, help="inputs per model (default 100)")
    parser.add_argument("--cache-dir", default=None, help="the claims cache (default: the run's)")
    args = parser.parse_args(argv)
    keys = [k for k in args.models.split(",") if k]
    unknown = [k for k in keys if k not in REGISTRY]
    if not keys or unknown:
        print(f"bench.directions: unknown model {', '.join(unknown) or '(none given)'}; give "
              "registry keys (fixtures/models/catalogue.py)", file=sys.stderr)
        return 2
    options = RunOptions(n_samples=args.n_samples,
                         **({"cache_dir": args.cache_dir} if args.cache_dir else {}))
    torch.set_num_threads(1)
    print("median over (sample, head), its token-shuffled null's, heads whose mean exceeds "
          "their null's")
    for key in keys:
        row = model_summary(ClaimSession({key: REGISTRY[key]}, options).run(key))
        cells = [f"{label} {row[s]['median']:.3f} (null {row[s]['null_median']:.3f}; "
                 f"{row[s]['heads_above_null']}/{row['heads']} heads above)"
                 for s, label in STATISTICS if s in row]
        print(f"{key} (d = {row['head_dim']}): " + "; ".join(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
