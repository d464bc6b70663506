"""This module owns which baseline model each candidate model is compared with (by architecture,
or as ``--baseline-model`` says) and the checks that two runs are comparable before and after a
run: architectures, options, judging thresholds and, for ``--gate same-checkpoint``, the
checkpoint hash. Each failure is a :class:`~report.baseline.BaselineMismatch` naming what differs.
"""

from __future__ import annotations

from .baseline import OPTION_FIELDS, BaselineMismatch, judging_thresholds, with_implied_options

_ARCH_FIELDS = ("arch", "family", "n_layers", "n_heads", "head_dim")


def parse_baseline_model(text: str | None) -> dict[str | None, str]:
    """``--baseline-model KEY`` (every candidate model of KEY's architecture) or
    ``CAND=KEY,CAND2=KEY2``."""
    if not text:
        return {}
    out: dict[str | None, str] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        cand, sep, base = part.partition("=")
        if sep and (not cand.strip() or not base.strip()):
            raise BaselineMismatch(f"--baseline-model {text!r}: write KEY or CANDIDATE=KEY pairs")
        out[cand.strip() if sep else None] = (base if sep else cand).strip()
    return out


def match_models(candidates: dict, baseline_models: dict, chosen: dict | None = None) -> dict:
    """Which baseline model each candidate model is compared with.

    ``candidates`` and ``baseline_models`` map model keys to identities (at least ``arch``).
    The rule: ``chosen`` (from --baseline-model) first; otherwise the baseline model of the same
    key if it has the candidate's architecture; otherwise the only baseline model of that
    architecture. None, or several without a choice, is a :class:`BaselineMismatch`.
    """
    chosen = chosen or {}
    held = ", ".join(f"{k} ({m.get('arch')})" for k, m in sorted(baseline_models.items())) or "none"
    for want in sorted(set(chosen.values()) - set(baseline_models)):
        raise BaselineMismatch(f"--baseline-model {want}: the baseline has no such model "
                               f"(it holds {held})")
    for cand in sorted(k for k in chosen if k is not None and k not in candidates):
        raise BaselineMismatch(f"--baseline-model {cand}={chosen[cand]}: this run has no model "
                               f"{cand} (it runs {', '.join(sorted(candidates))})")
    out = {}
    for key, ident in candidates.items():
        pick = chosen.get(key)
        if pick is None and chosen.get(None) is not None and \
                baseline_models[chosen[None]].get("arch") == ident.get("arch"):
            pick = chosen[None]  # a bare KEY: for every candidate of its architecture
        if pick is None and key in baseline_models and \
                baseline_models[key].get("arch") == ident.get("arch"):
            pick = key
        if pick is None:
            same = sorted(k for k, m in baseline_models.items()
                          if m.get("arch") == ident.get("arch"))
            if not same:
                raise BaselineMismatch(
                    f"the baseline holds no model of architecture {ident.get('arch')} for {key} "
                    f"(it holds {held}): a candidate is compared with an accepted checkpoint of "
                    "its own architecture")
            if len(same) > 1:
                raise BaselineMismatch(
                    f"the baseline holds several models of architecture {ident.get('arch')} "
                    f"({', '.join(same)}): say which one {key} is compared with by "
                    "--baseline-model KEY")
            pick = same[0]
        for f in _ARCH_FIELDS:
            if baseline_models[pick].get(f) != ident.get(f):
                raise BaselineMismatch(
                    f"the architecture differs: {f} of baseline model {pick} is "
                    f"{baseline_models[pick].get(f)}, of {key} {ident.get(f)}")
        out[key] = pick
    return out


def check_comparable_before_run(specs: dict, options: dict, thresholds: dict, baseline: dict,
                                chosen: dict | None = None) -> dict:
    """The checks that need no result: models, architectures, options and thresholds.

    ``specs`` maps candidate keys to ``{"arch", "family", "n_layers", "n_heads", "head_dim"}``.
    Run at configure time, so that a wrong baseline stops the run before any model is loaded.
    """
    then = baseline["identity"]
    pairs = match_models(specs, then["models"], chosen)
    known = {k for k in OPTION_FIELDS if options.get(k) is not None or k != "rules"}
    check_options({k: options.get(k) for k in known}, {k: then["options"].get(k) for k in known})
    check_thresholds(judging_thresholds(thresholds), then["thresholds"])
    return pairs


def check_same_checkpoint(cand: str, cand_hash, base: str, base_hash, origin: str = "") -> None:
    """``--gate same-checkpoint``: the candidate's weight hash is the baseline model's, else a
    :class:`BaselineMismatch` naming both. Made at start-up where the hash is known before the
    run (fixtures/identity.py), and by :func:`compare` after it (the backstop)."""
    if cand_hash != base_hash:
        where = f" ({origin})" if origin else ""
        raise BaselineMismatch(
            f"--gate same-checkpoint: the checkpoint hash of {cand}{where} is {cand_hash}, "
            f"the baseline's ({base}) {base_hash}: use the default --gate candidate to gate a "
            "new checkpoint, or regenerate the baseline with --update-baseline")


def check_options(now: dict, then: dict) -> None:
    now, then = with_implied_options(now), with_implied_options(then)
    for k in (k for k in OPTION_FIELDS if k in now or k in then):
        if now.get(k) != then.get(k):
            raise BaselineMismatch(f"the option {k} differs: {then.get(k)!r} in the baseline, "
                                   f"{now.get(k)!r} in this run")


def _first_difference(a, b, path=""):
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            d = _first_difference(a.get(k), b.get(k), f"{path}.{k}" if path else k)
            if d:
                return d
        return None
    return None if a == b else (path, a, b)


def check_thresholds(now: dict, then: dict) -> None:
    d = _first_difference(then, now)
    if d:
        raise BaselineMismatch(f"the thresholds differ: {d[0]} is {d[1]!r} in the baseline, "
                               f"{d[2]!r} in this run (claims/thresholds.toml)")
