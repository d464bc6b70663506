"""Claim R: "RPC-Attention is competitive on clean data and more robust under contamination"
(P1 Algorithm 1 and its experiments; method §15), checked at toy scale.

Each record compares RPC-SymViT with SymViT, trained with the same seeds on the digits, under one
condition (clean; a digits-C corruption at one severity; FGSM, PGD or a transfer attack at one ε;
or a mechanism readout), by the paired difference over seeds, d_i = RPC-SymViT_i − SymViT_i, and
its Student-t 95% interval (``checks.paired``). Rules: ``[claim_r_*]`` of thresholds.toml,
applied by ``claims.verdicts.judge_both`` (``ours``: the bar must hold over the whole interval;
``p2``: on the mean). The whole claim is labelled :data:`LABEL`: it can say whether the effect
appears at this scale beyond seed-to-seed variation, never whether P1's ImageNet, ADE20K or
WikiText-103 tables hold (:data:`NOT_CHECKED`).
"""

from __future__ import annotations

from dataclasses import replace

from checks.paired import paired_difference

from . import verdicts

LABEL = "toy-scale mechanism check"
PAIR = "rpc-symvit-digits"  # the model key of every claim-R record (the pair of variants)
TREATED, CONTROL = "rpc-symvit", "symvit"
#: L∞ budgets of FGSM, PGD and the transfer attack, in pixel units (pixels in [0, 1]).
EPSILONS = (0.01, 0.02, 0.04)

#: Record family → its rule section in thresholds.toml.
SECTIONS = {"clean": "claim_r_clean", "sparse": "claim_r_robust", "dense": "claim_r_robust",
            "fgsm": "claim_r_robust", "pgd": "claim_r_robust", "transfer": "claim_r_robust",
            "sparse_share": "claim_r_sparse", "rank": "claim_r_rank"}
FAMILY_TITLES = {"clean": "R1 clean accuracy", "sparse": "R2 sparse corruptions (digits-C)",
                 "dense": "R2 dense corruptions (digits-C)", "fgsm": "R3 FGSM (white-box)",
                 "pgd": "R3 PGD (white-box)", "transfer": "R3 transfer PGD from SymViT",
                 "sparse_share": "mechanism: S absorbs sparse corruption",
                 "rank": "mechanism: rank of the low-rank part"}

#: P1's claims this check cannot test offline, each with the reason (shown in the report).
NOT_CHECKED = (
    {"claim": "ImageNet-1K clean top-1/top-5 of RPC-SymViT vs SymViT (P1's experiments)",
     "reason": "ImageNet-1K is not available offline and a toy model on 8×8 digits cannot stand "
               "in for a DeiT-Tiny on ImageNet; R1 only asks whether the effect appears here."},
    {"claim": "ImageNet-C, -A, -R and -O robustness (P1's experiments)",
     "reason": "the datasets are not available offline; digits-C (R2) imitates the kinds of "
               "corruption, not their distribution or severity scale."},
    {"claim": "PGD, FGSM and other attacks on ImageNet (P1's attack experiments)",
     "reason": "ImageNet is not available offline; R3 runs FGSM, PGD and a transfer attack on "
               "digits only, with ε in pixel units of the digits."},
    {"claim": "ADE20K semantic segmentation (P1's experiments)",
     "reason": "ADE20K and a segmentation model are not available offline."},
    {"claim": "WikiText-103 language modelling, clean and attacked (P1's experiments)",
     "reason": "WikiText-103 is not available offline, and training a causal language model is "
               "beyond a CPU check; the digits models are image classifiers."},
)


def comparison_record(condition: str, family: str, treated: list[float], control: list[float],
                      rules: str, quantity: str, **extra) -> dict:
    """One claim-R record: the paired difference ``treated − control`` over seeds, its interval,
    and the verdicts of the rule section of ``family`` (:data:`SECTIONS`)."""
    section = SECTIONS[family]
    pd = paired_difference(treated, control)
    metrics = {"paired_diff": pd["mean_diff"], "rpc_symvit": pd["treated_mean"],
               "symvit": pd["control_mean"]}
    ci = {"paired_diff": pd["ci"]} if pd["ci"] is not None else None
    undefined = None if ci else {"paired_diff": "one seed: no interval over seeds"}
    v, both = verdicts.judge_both(section, metrics, ci, rules_name=rules, undefined=undefined)
    if ci is None and rules == "ours":  # no interval: the ours rule set cannot judge
        both["ours"] = verdicts.UNDETERMINED
        v = verdicts.Verdict(section, verdicts.UNDETERMINED, metrics, v.supported_rules,
                             v.refuted_rules, reason="one seed: no interval over seeds")
    bar = next(iter(v.supported_rules), None)  # the margin: the supported bar's distance from 0
    return {"claim": "R", "level": "series", "model": PAIR, "layer": None, "head": None,
            "verdict": v.verdict, "verdicts": both, "rules": rules, "metrics": metrics,
            **({"ci": ci} if ci else {}),
            # the rule set's reason shows as "undetermined: ..." in the evidence: only then
            "evidence": verdicts.format_evidence(
                v if v.verdict == verdicts.UNDETERMINED else replace(v, reason=""), ci=ci,
                both=both),
            **({"reason": v.reason} if v.reason else {}),
            "condition": condition, "family": family, "section": section,
            "quantity": quantity, "label": LABEL,
            "margin": abs(bar.value) if bar is not None else None,
            "per_seed": {TREATED: list(treated), CONTROL: list(control), "diff": pd["diffs"]},
            "n_seeds": pd["n"], "interval": "Student t, 95%, over seeds (method §15.4)",
            **extra}


def clean_record(study: dict, rules: str = "ours") -> dict:
    """R1: clean test accuracy, RPC-SymViT not worse than SymViT by more than the margin."""
    clean = study["clean"]
    return comparison_record("clean", "clean", clean[TREATED], clean[CONTROL], rules,
                             "test accuracy", n_images=study["n_test"])


def corruption_record(study: dict, name: str, level: int, kind: str, rules: str = "ours") -> dict:
    """R2: accuracy under digits-C corruption ``name`` at severity index ``level`` (0-based)."""
    acc = study["corruption"][f"{name}/{level}"]
    severity = study["settings"]["severities"][name][level]
    return comparison_record(f"{name} s{level + 1} ({severity:g})", kind, acc[TREATED],
                             acc[CONTROL], rules, "test accuracy under corruption",
                             corruption=name, severity=severity, severity_level=level + 1,
                             n_images=study["n_test"])


def attack_record(study: dict, attack: str, eps: float, rules: str = "ours") -> dict:
    """R3: accuracy under ``attack`` ("fgsm", "pgd" or "transfer") at L∞ budget ``eps``."""
    acc = study[attack][f"{eps:g}"]
    steps = study["settings"]["pgd_steps"]
    how = {"fgsm": "white-box FGSM", "pgd": f"white-box PGD, {steps} steps of 0.15·ε",
           "transfer": f"PGD ({steps} steps) crafted on SymViT seed i, shown to RPC-SymViT "
                       f"seed i and to SymViT seed i+1"}[attack]
    extra = {}
    if attack == "transfer":
        white = study["pgd"][f"{eps:g}"][TREATED]
        # transfer accuracy below white-box accuracy: the white-box gradient was masked
        extra["rpc_transfer_minus_white_box"] = [t - w for t, w in zip(acc[TREATED], white)]
    return comparison_record(f"{attack} ε={eps:g}", attack, acc[TREATED], acc[CONTROL], rules,
                             f"test accuracy under {how}", epsilon=eps, attack=attack,
                             n_images=study["n_attack"], **extra)


def _layer_values(study: dict, variant: str, which: str, layer: str, name: str) -> list[float]:
    return [seed[which][layer][name] for seed in study["readout"][variant]]


def sparse_share_record(study: dict, layer: str = "0", rules: str = "ours") -> dict:
    """Mechanism: the share of non-zero entries of S in RPC-SymViT's PAP layer is larger on
    sparse-corrupted images than on clean ones (paired over seeds and within each model)."""
    corrupted = _layer_values(study, TREATED, "corrupted", layer, "sparse_nonzero_share")
    clean = _layer_values(study, TREATED, "clean", layer, "sparse_nonzero_share")
    info = study["readout_corruption"]
    condition = f"S non-zero share, {info['name']} s{info['level'] + 1} − clean (layer {layer})"
    rec = comparison_record(condition, "sparse_share", corrupted, clean, rules,
                            "share of non-zero entries of S (RPC-SymViT), corrupted vs clean",
                            readout_layer=int(layer), n_images=info["n_samples"])
    rec["metrics"] = {"paired_diff": rec["metrics"]["paired_diff"],
                      "corrupted": rec["metrics"]["rpc_symvit"], "clean": rec["metrics"]["symvit"]}
    rec["per_seed"] = {"corrupted": corrupted, "clean": clean, "diff": rec["per_seed"]["diff"]}
    return rec


def rank_record(study: dict, layer: str = "0", rules: str = "ours") -> dict:
    """Mechanism: the effective rank of the attention output L of RPC-SymViT's PAP layer is lower
    than that of SymViT's attention output in the same layer (clean images)."""
    rpc = _layer_values(study, TREATED, "clean", layer, "low_rank_effective_rank")
    sym = _layer_values(study, CONTROL, "clean", layer, "low_rank_effective_rank")
    rec = comparison_record(f"effective rank of the attention output (layer {layer})", "rank",
                            rpc, sym, rules,
                            "effective rank of L [N×d] per head, mean over images and heads",
                            readout_layer=int(layer),
                            n_images=study["readout_corruption"]["n_samples"])
    rec["keys_effective_rank"] = {
        TREATED: _layer_values(study, TREATED, "clean", layer, "keys_effective_rank"),
        CONTROL: _layer_values(study, CONTROL, "clean", layer, "keys_effective_rank")}
    rec["numerical_rank"] = {
        TREATED: _layer_values(study, TREATED, "clean", layer, "low_rank_numerical_rank"),
        CONTROL: _layer_values(study, CONTROL, "clean", layer, "low_rank_numerical_rank")}
    return rec


def message(record: dict) -> str:
    """The failure message of a claim-R test: label, condition, verdict and evidence."""
    return (f"claim R ({LABEL}) {record['condition']}: {record['verdict']}\n"
            f"  per-seed differences {', '.join(f'{d:+.4f}' for d in record['per_seed']['diff'])}"
            f"\n{record['evidence']}")
