"""The method document and the thresholds file are live: every "method §N.M" names a section of
docs/method.md, and every number in claims/thresholds.toml moves a record or a verdict when it is
changed (method §9). Small synthetic inputs only: no model is loaded."""

from __future__ import annotations

import json
import math
import re
import subprocess
import tomllib
from pathlib import Path

import pytest
import torch

from checks.errors import UndefinedValueError, defined
from checks.gram import KeyGram
from checks.projection_summary import pooled_terms, spearman_rho
from checks.value_vectors import value_vector_metrics_batched
from claims import claim_e, claim_j, claim_r, claim_v, claim_e_gamma_stats, outcome, verdicts
from tests._helpers import F64

ROOT = Path(__file__).resolve().parent.parent
METHOD = ROOT / "docs" / "method.md"


# ------------------------------------------------------------------ method § references

def _tracked_files() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: scan the tree
        out = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file()
               and ".venv" not in p.parts and ".git" not in p.parts]
    return [ROOT / p for p in out if (ROOT / p).is_file()]


def _texts():
    for path in _tracked_files():
        try:
            yield path, path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary files


def method_sections() -> set[str]:
    """Section numbers of docs/method.md: "2" and "2.3" for the headings "## 2 …", "### 2.3 …"."""
    found = set()
    for line in METHOD.read_text(encoding="utf-8").splitlines():
        m = re.match(r"#{2,4} (\d+(?:\.\d+)?) ", line)
        if m:
            found.add(m.group(1))
    return found


def test_method_document_numbers_the_shared_sections_with_anchors():
    """§1-§11 exist (§1-§6 keep the numbering of the method's first version), each heading with its anchor."""
    text = METHOD.read_text(encoding="utf-8")
    sections = method_sections()
    assert {str(n) for n in range(1, 12)} <= sections
    for number in sections:
        anchor = "s" + number.replace(".", "-")
        assert f'<a id="{anchor}"></a>' in text, f"method §{number} has no anchor #{anchor}"


REFERENCE = re.compile(r"method §(\d+(?:\.\d+)?)")
LINK = re.compile(r"method\.md#(s\d+(?:-\d+)?)")


def test_every_method_reference_names_an_existing_section():
    sections = method_sections()
    anchors = {"s" + s.replace(".", "-") for s in sections}
    bad = []
    seen = 0
    for path, text in _texts():
        for m in REFERENCE.finditer(text):
            seen += 1
            if m.group(1).rstrip(".") not in sections:
                bad.append(f"{path.relative_to(ROOT)}: method §{m.group(1)}")
        for m in LINK.finditer(text):
            if m.group(1) not in anchors:
                bad.append(f"{path.relative_to(ROOT)}: method.md#{m.group(1)}")
    assert seen > 20, "the reference scan found (almost) nothing: is the pattern still right?"
    assert not bad, "references to sections docs/method.md does not have:\n" + "\n".join(bad)


def test_no_file_points_outside_the_repository_for_its_method():
    bad = []
    for path, text in _texts():
        if path == METHOD or path == Path(__file__).resolve():
            continue
        for needle in ("spec" + " §", "Spec" + " §", "../shared", "shared/spec", "shared/notes", "as the spec records it"):
            if needle in text:
                bad.append(f"{path.relative_to(ROOT)}: {needle!r} ({text.count(needle)}x)")
    assert not bad, "\n".join(bad)


# ------------------------------------------------------------------ undefined values (§6.2)

def test_defined_records_a_reason_instead_of_nan_inf_or_zero():
    why: dict[str, str] = {}

    def constant():
        return spearman_rho(torch.ones(4, dtype=F64), torch.arange(4.0, dtype=F64))

    assert defined("rho", constant, why) is None and "constant" in why["rho"]
    assert defined("x", lambda: math.inf, why) is None and "not finite" in why["x"]
    with pytest.raises(ValueError):  # still a ValueError for callers that catch those
        constant()
    assert issubclass(UndefinedValueError, ValueError)


def test_pooled_terms_without_cut_offs():
    one = torch.ones(2, 3, dtype=F64)
    zero_h = pooled_terms(torch.zeros_like(one), 0 * one, one, one)
    assert zero_h["log10_ratio"] is None and "log10_ratio" in zero_h["undefined"]
    huge = pooled_terms(torch.full_like(one, 800.0), one, one, one, torch.full_like(one, -800.0))
    assert huge["phi_sq_mean"] is None and huge["j_proj"] is None  # exp(800) is beyond float64
    assert huge["log10_ratio"] == pytest.approx(-800 / math.log(10))  # still defined, in log space
    assert huge["p1_log_mean_error"] is None and "p1_log_mean_error" in huge["undefined"]
    tiny = pooled_terms(torch.zeros_like(one), one, one, one, torch.full_like(one, -750.0))
    assert tiny["p1_log_mean_error"] is None  # no overflow of h·exp(750) on the way
    ok = pooled_terms(torch.zeros_like(one), 0.5 * one, one, one, torch.zeros_like(one))
    assert ok["p1_log_mean_error"] == pytest.approx(math.log(0.5)) and ok["undefined"] == {}
    assert json.dumps(huge, allow_nan=False)  # nothing JSON cannot hold


def _points(j_values):
    return [{"step": i, "j_proj": j, "phi_sq_mean": j + 1.0, "h_sq_mean": 1.0}
            for i, j in enumerate(j_values)]


def test_a_constant_trend_is_undetermined_not_rho_zero():
    record = claim_j.trend_record("s", _points([0.5, 0.5, 0.5]), rules="p2")
    assert record["metrics"]["spearman_j"] is None and record["trend"]["spearman_j"] is None
    assert record["verdict"] == verdicts.UNDETERMINED
    assert "spearman_j" in record["reason"] and "constant" in record["undefined"]["spearman_j"]
    json.dumps(record.to_json(), allow_nan=False)
    assert record["trend"]["share_h"] is None and "share_h" in record["undefined"]  # no ΔJ: no share
    assert "did not change" in claim_j.message(record, "s")
    # a negative J_proj settles the verdict on its own: refuted stands
    assert claim_j.trend_record("s", _points([-1.0, -1.0]), rules="p2")["verdict"] == verdicts.REFUTED
    # ours reads the output fit, which these points lack: undetermined, with the reason
    ours = claim_j.trend_record("s", _points([-1.0, -1.0]))
    assert ours["verdict"] == verdicts.UNDETERMINED and "spearman_fit_excess" in ours["undefined"]


def test_zero_head_outputs_make_claim_j_undetermined_with_the_reason():
    terms = _j_terms(log10_ratio=0.0, bessel_share=1.0)
    terms["h_sq_mean"] = torch.zeros_like(terms["h_sq_mean"])
    record = claim_j.layer_record("m", 0, terms, [0], rules="p2")
    assert record["metrics"]["log10_ratio"] is None and record["verdict"] == verdicts.UNDETERMINED
    assert "mean ||h||^2 is 0" in record["reason"]
    assert "undefined" in claim_j.message(record, "m L00")


def test_a_claim_j_fit_that_cannot_discriminate_gives_its_reason_once():
    """The token-shuffled V̂ explains the output as well as V̂ (1 − null R² below
    [claim_j.ours] min_room): the four `ours` metrics have no value for one reason, which the
    record's reason and the test's message (the skip text of an undetermined test) state once,
    naming the metrics the rules judge."""
    terms = _j_ours_terms({"output_r2": 1.0})
    terms["output_r2_null"] = torch.full_like(terms["output_r2_null"], 0.99999)
    record = claim_j.layer_record("m", 0, terms, [0], rules="ours")
    assert record["verdict"] == verdicts.UNDETERMINED
    why = "the output fit cannot discriminate"
    assert set(record["undefined"]) >= set(claim_j.OURS_METRICS)
    assert record["reason"].count(why) == 1, record["reason"]
    judged = {r.metric for kind in ("supported", "refuted")
              for r in verdicts.ours_rules("claim_j", kind)}
    assert record["reason"].startswith(", ".join(sorted(judged)) + " have no value: ")
    message = claim_j.message(record, "m L00")  # the full evidence (terminal, -v)
    assert message.count(why) == 1 and message.count("have no value") == 1, message
    line = outcome.one_line(record)  # what JUnit's skip message carries (fixtures/plugin/results.py)
    assert line.count(why) == 1 and len(line.encode()) < 512, line
    # reasons that differ stay apart, each after its own metrics
    assert verdicts.missing_reason(["a", "b", "c"], {"a": "x", "c": "x", "b": "y"}) == \
        "a, c have no value: x; b has no value: y"


# ------------------------------------------------------------------ live thresholds (§9)

def _toml_path_items(data, prefix=()):
    for key, value in data.items():
        path = prefix + (key,)
        if isinstance(value, dict):
            yield from _toml_path_items(value, path)
        elif isinstance(value, bool):
            continue
        elif isinstance(value, (int, float)) or (
                isinstance(value, list) and value and all(isinstance(x, (int, float)) for x in value)):
            yield path, value


NUMBERS = list(_toml_path_items(tomllib.loads(verdicts.THRESHOLDS_FILE.read_text("utf-8"))))


def _edited_copy(tmp_path: Path, path: tuple[str, ...], value) -> Path:
    """A copy of the thresholds file with the number at ``path`` replaced by ``value``."""
    header, key = "[" + ".".join(path[:-1]) + "]", path[-1]
    lines = verdicts.THRESHOLDS_FILE.read_text("utf-8").splitlines()
    if header not in lines:  # a number inside an inline table: [a.b] "name" = { key = value, … }
        table, inline = "[" + ".".join(path[:-2]) + "]", f'"{path[-2]}" = {{'
        start = lines.index(table)
        for i in range(start + 1, len(lines)):
            if lines[i].startswith(inline):
                lines[i], n = re.subn(rf"\b{re.escape(key)} = [^,}}]+", f"{key} = {json.dumps(value)}",
                                      lines[i], count=1)
                assert n == 1, f"{'.'.join(path)} not found in its inline table"
                out = tmp_path / "thresholds.toml"
                out.write_text("\n".join(lines) + "\n", encoding="utf-8")
                assert tomllib.loads(out.read_text("utf-8"))
                return out
        raise AssertionError(f"{'.'.join(path)} not found in the thresholds file")
    start = lines.index(header)
    for i in range(start + 1, len(lines)):
        if lines[i].startswith("["):
            break
        if re.match(rf"{re.escape(key)}\s*=", lines[i]):
            lines[i] = f"{key} = {json.dumps(value)}"
            out = tmp_path / "thresholds.toml"
            out.write_text("\n".join(lines) + "\n", encoding="utf-8")
            assert tomllib.loads(out.read_text("utf-8"))  # still valid TOML
            return out
    raise AssertionError(f"{'.'.join(path)} not found in the thresholds file")


# One builder per claim: measured values in, the claim module's record out (its live path).

def _v_record(m: dict) -> dict:
    """P2's bars alone decide under ``rules="p2"`` (``ours`` adds its own refutations)."""
    n = 4
    values = {name: torch.full((n,), 0.5, dtype=F64) for name in claim_v.METRICS}
    values.update({f"{name}_null": torch.zeros(n, dtype=F64) for name in claim_v.METRICS})
    for name in ("optimal_cosine", "linear_cka", "kernel_cka"):
        values[name] = torch.full((n,), m.get(name, 0.0), dtype=F64)
    # with a null of 0 the excess over the null is the overlap itself
    values["subspace_overlap"] = torch.full((n,), m.get("subspace_overlap_excess", 0.0), dtype=F64)
    return claim_v.decide(values, torch.zeros(n, dtype=torch.bool), rules="p2")


def _j_terms(log10_ratio: float, bessel_share: float) -> dict:
    shape = (2, 1)
    return {"log_phi_sq_mean": torch.zeros(shape, dtype=F64),  # mean ||phi||^2 = 1
            "h_sq_mean": torch.full(shape, 10.0 ** log10_ratio, dtype=F64),
            "bessel_share": torch.full(shape, bessel_share, dtype=F64),
            "n_tokens": torch.full(shape, 10.0, dtype=F64),
            "p1_log_phi_sq_mean": torch.zeros(shape, dtype=F64)}


def _j_record(m: dict) -> dict:
    return claim_j.layer_record("m", 0, _j_terms(m.get("log10_ratio", 1.0),
                                                 m.get("bessel_share", 1.0)), [0], rules="p2")


def _trend_record(m: dict) -> dict:
    low = m.get("min_j_proj", 0.0)
    rho = m.get("spearman_j", -1.0)
    j = [low + 1.0, low + 2.0, low] if rho < 0 else [low, low + 2.0, low + 1.0]  # rho = ∓0.5
    return claim_j.trend_record("s", _points(j), rules="p2")


def _trend_ours_record(m: dict) -> dict:
    """A series whose output-fit excess over its null (null R² 0.5) rises (rho = +1) when the
    wanted rho is positive and falls otherwise (method §3.4)."""
    rising = m.get("spearman_fit_excess", 1.0) > 0
    excess = [0.1, 0.3, 0.6] if rising else [0.6, 0.3, 0.1]
    points = [dict(p, output_r2=0.5 + 0.5 * e, output_r2_null=0.5)
              for p, e in zip(_points([1.0, 0.8, 0.6]), excess)]
    return claim_j.trend_record("s", points)


def _e_record(m: dict) -> dict:
    samples, n = 20, 4
    ratio = m.get("raw_vs_standardized_ratio", m.get("max_route_ratio", 1.0))
    base = torch.tensor([4.0, 3.0, 2.0, 1.0], dtype=F64).expand(samples, 1, n).clone()
    finite = torch.ones(samples, 1, dtype=torch.bool)
    finite[: round(samples * (1 - m.get("naive_finite_share", 1.0)))] = False
    per_layer = {0: {"mu_log_raw": base, "mu_log_standardized": base * ratio,
                     "mu_naive_float32": base.clone(), "naive_finite": finite}}
    return claim_e.model_record("m", per_layer, [0], n)


def _gamma_tensors(position: float, undetermined: int = 0) -> dict:
    s = 4
    t = {"undetermined": torch.zeros(s, 1, dtype=torch.bool)}
    t["undetermined"][:undetermined] = True
    for name, value in (("learned", position), ("eigen", 0.0), ("perturbed", 1.0)):
        t[f"gamma_{name}"] = torch.full((s, 1), value, dtype=F64)
        t[f"gamma_{name}_abs"] = torch.full((s, 1), value, dtype=F64)
    return t


def _gamma_record(m: dict) -> dict:
    return claim_e.head_record("m", 0, 0, _gamma_tensors(m.get("gamma_position", 0.0)), rules="p2")


def _training_record(m: dict) -> dict:
    """[claim_v_training] on paired changes whose intervals span [low, high] (method §14.4)."""
    from claims import dynamics

    low = m.get("min_delta_ci_low", -1.0)
    high = m.get("max_delta_ci_high", 1.0)
    names = verdicts.load_thresholds()["claim_v_training"]["metrics"]
    return dynamics.training_verdict({n: {"ci": [low, max(low, high)]} for n in names})


def _r_record(section: str):
    """Claim R (method §15): three seeds whose paired difference is the wanted value exactly."""
    family = {"claim_r_clean": "clean", "claim_r_robust": "pgd", "claim_r_sparse": "sparse_share",
              "claim_r_rank": "rank"}[section]

    def build(wanted):
        diff = wanted["paired_diff"]
        return claim_r.comparison_record("probe", family, [diff] * 3, [0.0] * 3, "ours", "probe")
    return build


BUILDERS = {"claim_v": _v_record, "claim_j": _j_record, "claim_j_trend": _trend_record,
            "claim_e": _e_record, "claim_e_gamma": _gamma_record,
            "claim_v_training": _training_record,
            **{s: _r_record(s) for s in ("claim_r_clean", "claim_r_robust", "claim_r_sparse",
                                         "claim_r_rank")}}


def _margin(value: float) -> float:
    return 0.05 * (abs(value) + 1.0)


def _satisfying(rule: verdicts.Rule) -> float:
    step = _margin(rule.value)
    return {">=": rule.value, "<=": rule.value, ">": rule.value + step,
            "<": rule.value - step}[rule.direction]


def _rule_probe(path, tmp_path, monkeypatch):
    """A verdict rule: measured values that meet every rule of its kind give that verdict; with
    this one rule's value moved past the measured value, the verdict changes."""
    claim, kind, metric, _ = path
    section = verdicts.load_thresholds()[claim]
    rules = verdicts.rules(claim, kind)
    any_mode = kind == "refuted" and section.get("refuted_mode", "all") == "any"
    wanted = {r.metric: _satisfying(r) for r in rules if not any_mode or r.metric == metric}
    before = BUILDERS[claim](wanted)
    assert before["verdict"] == kind, (path, wanted, before["verdict"])
    measured = before["metrics"][metric]
    rule = next(r for r in rules if r.metric == metric)
    push = 2 * _margin(measured)
    moved = measured + push if rule.direction in (">=", ">") else measured - push
    monkeypatch.setattr(verdicts, "THRESHOLDS_FILE", _edited_copy(tmp_path, path, moved))
    after = BUILDERS[claim](wanted)
    assert after["verdict"] != kind, (path, moved, after["verdict"])


def _allclose_probe(path, tmp_path, monkeypatch):
    k = torch.randn(3, 12, 4, generator=torch.Generator().manual_seed(0), dtype=F64)
    v = KeyGram(k).kpca_values()
    v = v + 0.5 * v.abs().amax()  # far outside P2's tolerances
    before = value_vector_metrics_batched(k, v, **verdicts.allclose_tolerance())["allclose"]
    assert before.tolist() == [0.0, 0.0, 0.0]
    monkeypatch.setattr(verdicts, "THRESHOLDS_FILE", _edited_copy(tmp_path, path, 1e9))
    after = value_vector_metrics_batched(k, v, **verdicts.allclose_tolerance())["allclose"]
    if path[-1] == "atol":
        assert after.tolist() == [1.0, 1.0, 1.0]  # atol = 1e9: the allclose rate is 1
    else:
        assert after.tolist() != before.tolist()


def _shared_bar_probe(path, tmp_path, monkeypatch):
    """``[claim_v.partial] shared_bar`` (method §2.6): every principal angle of a head whose
    directions are all tilted to cos² 0.5 is not shared at the bar 0.9, and shared at 0.4; the
    claim's layer reads the bar from the file (its cache settings)."""
    from checks.value_vectors import direction_metrics
    from claims import claim_v_layer

    g = torch.Generator().manual_seed(0)
    z = torch.randn(24, 9, generator=g, dtype=F64)
    z[:, 0] = 1.0
    q = torch.linalg.qr(z).Q[:, 1:]  # 8 orthonormal columns orthogonal to the ones vector
    y, other = q[:, :4], q[:, 4:]
    mu = torch.tensor([4.0, 3.0, 2.0, 1.0], dtype=F64)

    def count() -> float:
        bar = claim_v_layer.cache_settings()["shared_bar"]
        return float(direction_metrics((y + other) / 2 ** 0.5, y, mu, v_null=other,
                                       bar=bar)["shared_directions"])

    assert count() == 0.0
    monkeypatch.setattr(verdicts, "THRESHOLDS_FILE", _edited_copy(tmp_path, path, 0.4))
    assert count() == 4.0


def _undetermined_probe(path, tmp_path, monkeypatch):
    """Two of four samples undetermined: share 0.5 is judged at max_share 0.5, not at 0.4."""
    def verdict():
        if path[0] == "claim_v":
            values = {name: torch.full((4,), 0.95, dtype=F64) for name in claim_v.METRICS}
            values.update({f"{n}_null": torch.zeros(4, dtype=F64) for n in claim_v.METRICS})
            return claim_v.decide(values, torch.tensor([True, True, False, False]))["verdict"]
        return claim_e.head_record("m", 0, 0, _gamma_tensors(0.1, undetermined=2),
                                   rules="p2")["verdict"]

    assert verdict() == verdicts.SUPPORTED
    monkeypatch.setattr(verdicts, "THRESHOLDS_FILE", _edited_copy(tmp_path, path, 0.4))
    assert verdict() == verdicts.UNDETERMINED


def _reference_probe(path, tmp_path, monkeypatch):
    before = _j_record({})["reference"][path[-1]]
    monkeypatch.setattr(verdicts, "THRESHOLDS_FILE", _edited_copy(tmp_path, path, [0.0, 9.0]))
    after = _j_record({})["reference"][path[-1]]
    assert before != after == [0.0, 9.0]


def _baseline_probe(path, tmp_path, monkeypatch):
    from report import baseline, baseline_gate

    def results(value):
        return {"models": {"m": {"checkpoint_hash": "c", "input_set": {"hash": "i"}}},
                "options": {}, "records": [{"claim": "V", "model": "m", "level": "model",
                                            "verdict": "refuted", "metrics": {"relative_frobenius": value}}]}

    old = baseline.make_baseline(results(1.0))
    moved = results(1.0 + 5e-4)  # beyond 1e-6 + 1e-4·1, within a looser tolerance

    def regressions():
        return baseline_gate.compare(moved, old, verdicts.load_thresholds()["baseline"])

    assert regressions().regressions
    monkeypatch.setattr(verdicts, "THRESHOLDS_FILE", _edited_copy(tmp_path, path, 1e-2))
    assert not regressions().regressions


def _candidate_probe(path, tmp_path, monkeypatch):
    """A metric moved just beyond its candidate-mode tolerance regresses; a looser number lets it."""
    from report import baseline_gate

    metric = path[2] if path[1] == "metrics" else "V.optimal_cosine"  # the latter uses the defaults
    claim, name = metric.split(".", 1)

    def regressions(delta):
        tolerances = verdicts.load_thresholds()["baseline_candidate"]
        direction = tolerances["metrics"][metric]["regression"]
        old = {"claim": claim, "verdict": "refuted", "metrics": {name: 0.5}}
        moved = 0.5 + (delta if direction == "increase" else -delta)
        new = {"claim": claim, "verdict": "refuted", "metrics": {name: moved}}
        result = baseline_gate.GateResult(mode="candidate", baseline="")
        baseline_gate._compare_pair(new, old, "k", "candidate", tolerances, result)
        return result.regressions

    rule = verdicts.load_thresholds()["baseline_candidate"]
    tol = {**{k: rule[k] for k in ("abs", "rel")},
           **{k: v for k, v in rule["metrics"][metric].items() if k in ("abs", "rel")}}
    delta = tol["abs"] + tol["rel"] * 0.5 + 1e-3
    assert regressions(delta)
    monkeypatch.setattr(verdicts, "THRESHOLDS_FILE", _edited_copy(tmp_path, path, 1.0))
    assert not regressions(delta)


def _rule_set_probe(path, tmp_path, monkeypatch):
    """[rule_sets.ours]: the interval level and the resample count move a record's CI; the
    permutation count and alpha move the test against chance (method §7)."""
    name = path[-1]
    gen = torch.Generator().manual_seed(5)
    if name in ("confidence", "bootstrap_resamples"):
        terms = {k: v[:1].expand(30, 1).clone() for k, v in _j_terms(1.0, 1.0).items()}
        terms["h_sq_mean"] = torch.rand(30, 1, generator=gen, dtype=F64) * 10 + 1

        def measured():
            return claim_j.layer_record("m", 0, terms, [0])["ci"]["log10_ratio"]
        edited = 0.5 if name == "confidence" else 20
    else:
        metrics = {}
        for metric in claim_v.METRICS:
            metrics[metric] = 0.5 + 0.1 * torch.rand(30, 1, generator=gen, dtype=F64)
            metrics[f"{metric}_null"] = torch.zeros(30, 1, dtype=F64)
        metrics["undetermined"] = torch.zeros(30, 1, dtype=torch.bool)

        def measured():
            test = claim_v.head_statistics("m", {0: metrics}, [0])[(0, 0)]["vs_null"]["subspace_overlap"]
            return test["p"] if name == "permutation_resamples" else test["above_chance"]
        edited = 99 if name == "permutation_resamples" else 1e-9
    before = measured()
    monkeypatch.setattr(verdicts, "THRESHOLDS_FILE", _edited_copy(tmp_path, path, edited))
    assert measured() != before, (path, before)


def _v_ours_record(m: dict) -> dict:
    """``ours`` on the overlap excess (null 0: the excess is the overlap); 4 samples, so
    neither chance test can reject and the bars alone decide."""
    n = 4
    values = {name: torch.full((n,), 0.5, dtype=F64) for name in claim_v.METRICS}
    values.update({f"{name}_null": torch.zeros(n, dtype=F64) for name in claim_v.METRICS})
    values["subspace_overlap"] = torch.full((n,), m.get("subspace_overlap_excess", 0.7), dtype=F64)
    return claim_v.decide(values, torch.zeros(n, dtype=torch.bool), rules="ours")


def _j_ours_terms(m: dict, samples: int = 4, spread: float = 0.0) -> dict:
    gen = torch.Generator().manual_seed(0)
    terms = {k: v[:1].expand(samples, 1).clone() for k, v in _j_terms(1.0, 1.0).items()}
    n_tok = 10
    terms["token_log_phi_sq"] = torch.zeros(samples, 1, n_tok, dtype=F64)
    terms["token_h_sq"] = torch.ones(samples, 1, n_tok, dtype=F64)
    fit = torch.full((samples, 1, n_tok), 10.0 ** m.get("fit_median_log10_ratio", 1.0), dtype=F64)
    bad = round(n_tok * (1 - m["fit_bessel_share"])) if "fit_bessel_share" in m else 0
    fit[..., :bad] = 10.0  # these tokens break Bessel's inequality at the fit
    if "fit_median_log10_ratio" in m:
        fit[..., bad:] = 10.0 ** m["fit_median_log10_ratio"] if m["fit_median_log10_ratio"] > 0 \
            else 10.0 ** min(m["fit_median_log10_ratio"], -1e-9)
    terms["token_fit_h_sq"] = fit
    r2 = m.get("output_r2", m.get("output_r2_excess", 0.7))
    terms["output_r2"] = r2 + spread * torch.randn(samples, 1, generator=gen, dtype=F64)
    terms["output_r2_null"] = torch.zeros(samples, 1, dtype=F64)
    return terms


def _j_ours_record(m: dict) -> dict:
    return claim_j.layer_record("m", 0, _j_ours_terms(m), [0], rules="ours")


def _gamma_ours_record(m: dict) -> dict:
    t = _gamma_tensors(0.9)
    for name, value in (("learned", m.get("gamma_subspace_position", 0.5)), ("eigen", 0.0),
                        ("perturbed", 1.0), ("null", 1.0)):
        t[f"gamma_{name}_subspace"] = torch.full((4, 1), value, dtype=F64)
    for name, value in (("learned", m.get("gamma_direction_position", 0.5)), ("eigen", 0.0),
                        ("perturbed", 1.0), ("null", 1.0)):  # 1 − ω placed between 0 and 1
        t[f"gamma_{name}_directions"] = torch.full((4, 1), 1.0 - value, dtype=F64)
    return claim_e.head_record("m", 0, 0, t, rules="ours")


OURS_BUILDERS = {"claim_v": _v_ours_record, "claim_j": _j_ours_record,
                 "claim_e_gamma": _gamma_ours_record, "claim_j_trend": _trend_ours_record}


def _ours_rule_probe(path, tmp_path, monkeypatch):
    """An ``ours`` rule (``[claim.ours.kind.metric]``): values meeting its kind's rules give that
    verdict; with this rule's value moved past the measured value, the verdict changes."""
    claim, _, kind, metric, _ = path
    section = verdicts.load_thresholds()[claim]
    rules = verdicts.ours_rules(claim, kind)
    any_mode = kind == "refuted" and section["ours"].get("refuted_mode", "all") == "any"
    wanted = {r.metric: _satisfying(r) for r in rules if not any_mode or r.metric == metric}
    if claim == "claim_j" and kind == "supported":
        wanted["fit_median_log10_ratio"] = -0.5
    before = OURS_BUILDERS[claim](wanted)
    assert before["verdicts"]["ours"] == kind, (path, wanted, before["verdicts"])
    measured = before["metrics"][metric]
    rule = next(r for r in rules if r.metric == metric)
    push = 2 * _margin(measured)
    moved = measured + push if rule.direction in (">=", ">") else measured - push
    monkeypatch.setattr(verdicts, "THRESHOLDS_FILE", _edited_copy(tmp_path, path, moved))
    after = OURS_BUILDERS[claim](wanted)
    assert after["verdicts"]["ours"] != kind, (path, moved, after["verdicts"])


def _chance_margin_probe(path, tmp_path, monkeypatch):
    """[claim.ours.chance_margin]: a metric within 0.01 of its null over 20 samples is at chance
    with the file's margin, and not with a margin of 1e-9 (method §7.2)."""
    claim, metric = path[0], path[3]
    gen = torch.Generator().manual_seed(1)
    if claim == "claim_v":
        metrics = {}
        for name in claim_v.METRICS:
            metrics[name] = 0.5 + 0.01 * torch.randn(20, 1, generator=gen, dtype=F64)
            metrics[f"{name}_null"] = torch.full((20, 1), 0.5, dtype=F64)
        metrics["undetermined"] = torch.zeros(20, 1, dtype=torch.bool)

        def at_chance():
            return claim_v.head_statistics("m", {0: metrics}, [0])[(0, 0)]["vs_null"][metric]["at_chance"]
    elif claim == "claim_e_gamma":
        t = {"gamma_learned_subspace": 0.5 + 0.01 * torch.randn(20, 1, generator=gen, dtype=F64),
             "gamma_null_subspace": torch.full((20, 1), 0.5, dtype=F64),
             "gamma_eigen_subspace": torch.zeros(20, 1, dtype=F64)}
        keep = torch.ones(20, 1, dtype=torch.bool)

        def at_chance():
            return claim_e_gamma_stats.chance_tests(t, keep, 0)[0]["at_chance"]
    else:
        terms = _j_ours_terms({"output_r2": 0.0}, samples=20, spread=0.01)

        def at_chance():
            return claim_j.output_fit_statistics([terms], [0], 0)["vs_null"]["at_chance"]
    assert at_chance() is True
    monkeypatch.setattr(verdicts, "THRESHOLDS_FILE", _edited_copy(tmp_path, path, 1e-9))
    assert at_chance() is False


def _margin_best_probe(path, tmp_path, monkeypatch):
    """[claim.ours.chance_margin.<metric>] best: the margin is a share of the room |best − null|,
    so a residual null of 0.3 gets 0.1·0.3 with best = 0 and 0.1·0.7 with best = 1, and the
    record's margin follows (method §7.2)."""
    claim, metric = path[0], path[3]
    t = {"gamma_learned_subspace": torch.full((8, 1), 0.2, dtype=F64),
         "gamma_null_subspace": torch.full((8, 1), 0.3, dtype=F64),
         "gamma_eigen_subspace": torch.zeros(8, 1, dtype=F64)}
    keep = torch.ones(8, 1, dtype=torch.bool)
    assert claim == "claim_e_gamma" and metric == "gamma_subspace_residual", path
    share = verdicts.chance_margins(claim)[metric]
    before = claim_e_gamma_stats.chance_tests(t, keep, 0)[0]["margin"]
    assert before == pytest.approx(share * 0.3)
    monkeypatch.setattr(verdicts, "THRESHOLDS_FILE", _edited_copy(tmp_path, path, 1.0))
    assert claim_e_gamma_stats.chance_tests(t, keep, 0)[0]["margin"] == pytest.approx(share * 0.7)


def _min_room_probe(path, tmp_path, monkeypatch):
    """[claim_j.ours] min_room: a head whose token-shuffled V̂ leaves 5e-5 of the output's
    variance unexplained is undetermined at the file's 1e-4 and judged at 1e-6 (method §3.6)."""
    terms = _j_ours_terms({"output_r2": 1.0, "fit_median_log10_ratio": -1.0}, samples=8)
    terms["output_r2_null"] = torch.full_like(terms["output_r2_null"], 1 - 5e-5)
    assert claim_j.layer_record("m", 0, terms, [0])["verdict"] == verdicts.UNDETERMINED
    monkeypatch.setattr(verdicts, "THRESHOLDS_FILE", _edited_copy(tmp_path, path, 1e-6))
    assert claim_j.layer_record("m", 0, terms, [0])["verdict"] != verdicts.UNDETERMINED


def _degenerate_probe(path, tmp_path, monkeypatch):
    """A head with effective rows 1.5 is degenerate (undetermined) at the file's bar, judged at 1."""
    values = {name: torch.full((4,), 0.95, dtype=F64) for name in claim_v.METRICS}
    values.update({f"{n}_null": torch.zeros(4, dtype=F64) for n in claim_v.METRICS})

    def verdict():
        return claim_v.decide(values, torch.zeros(4, dtype=torch.bool),
                              effective_rows=torch.full((4,), 1.5, dtype=F64))["verdict"]
    assert verdict() == verdicts.UNDETERMINED
    monkeypatch.setattr(verdicts, "THRESHOLDS_FILE", _edited_copy(tmp_path, path, 1.0))
    assert verdict() == verdicts.SUPPORTED


def _probe_for(path):
    if len(path) == 5 and path[1] == "ours" and path[2] in ("supported", "refuted"):
        return _ours_rule_probe
    if len(path) == 5 and path[1:3] == ("ours", "chance_margin"):
        return _margin_best_probe if path[4] == "best" else _chance_margin_probe
    if path[1:] == ("ours", "min_room"):
        return _min_room_probe
    if path[1:] == ("degenerate", "max_effective_rows"):
        return _degenerate_probe
    if path[0] == "rule_sets":
        return _rule_set_probe
    if path[0] == "baseline":
        return _baseline_probe
    if path[0] == "baseline_candidate":
        return _candidate_probe
    if path[:2] == ("claim_v", "allclose"):
        return _allclose_probe
    if path == ("claim_v", "partial", "shared_bar"):
        return _shared_bar_probe
    if path[1:] == ("undetermined", "max_share"):
        return _undetermined_probe
    if path[0] == "claim_j_reference":
        return _reference_probe
    if len(path) == 4 and path[1] in ("supported", "refuted") and path[3] == "value":
        return _rule_probe
    return None


@pytest.mark.parametrize("path", [p for p, _ in NUMBERS], ids=[".".join(p) for p, _ in NUMBERS])
def test_every_number_in_the_thresholds_file_is_live(path, tmp_path, monkeypatch):
    probe = _probe_for(path)
    assert probe is not None, (f"{'.'.join(path)}: no test shows that this number changes a record "
                               "or a verdict; read it in the code and add a probe here")
    probe(path, tmp_path, monkeypatch)


def test_the_thresholds_file_holds_numbers_to_probe():
    assert len(NUMBERS) >= 25  # a parse that finds nothing would make the test above vacuous


def test_names_are_defined_once_and_agree_with_the_math():
    from checks.value_vectors import DIRECTION_NAMES, METRIC_NAMES
    from claims import names
    from report import results_file

    # the math's outputs, named by the claims (the directions of method §2.6 among them)
    assert set(METRIC_NAMES) | set(DIRECTION_NAMES) == set(names.V_MEASURED)
    assert set(names.V_MEASURED) < set(names.V_METRICS)
    from report.sections import claim_v_section as v_section

    assert results_file.SCHEMA == names.RESULTS_SCHEMA and v_section.V_METRICS is names.V_METRICS
    assert claim_v.METRICS is names.V_MEASURED
    from checks.spectrum import STATISTICS

    assert STATISTICS == names.E_STATISTICS and claim_e.ROUTES is names.E_ROUTES


def test_gamma_without_contrast_between_the_controls_is_undetermined():
    t = _gamma_tensors(0.3)
    t["gamma_perturbed"] = t["gamma_eigen"].clone()  # the two controls coincide
    record = claim_e.head_record("m", 0, 0, t, rules="p2")
    assert record["metrics"]["gamma_position"] is None
    assert record["verdict"] == verdicts.UNDETERMINED and "no contrast" in record["reason"]
    json.dumps(record.to_json(), allow_nan=False)


def test_claim_e_ratios_without_a_finite_route_are_null_with_a_reason():
    record = _e_record({"naive_finite_share": 0.0})  # the naive route has no finite sample
    assert record["metrics"]["max_route_ratio"] is None and "max_route_ratio" in record["undefined"]
    assert record["verdict"] == verdicts.REFUTED  # settled by the naive route's failure alone
    json.dumps(record.to_json(), allow_nan=False)


def test_a_rescaled_exact_series_is_not_trend_refuted_under_ours():
    """Exact kernel-PCA checkpoints whose V grows ×10 per step (W_O shrinking: the same network)
    have J_proj going negative, which `p2` refutes; `ours` reads the output fit's excess, 1 at
    every checkpoint, which has no trend: undetermined, never refuted (method §3.4)."""
    points = [{"step": i, "j_proj": 1.0 - 10.0 ** (2 * i), "phi_sq_mean": 1.0,
               "h_sq_mean": 10.0 ** (2 * i), "output_r2": 1.0, "output_r2_null": 0.62}
              for i in range(4)]  # c = 1, 10, 100, 1000: ||h||^2 grows with c^2
    p2 = claim_j.trend_record("s", points, rules="p2")
    ours = claim_j.trend_record("s", points)
    assert p2["verdict"] == verdicts.REFUTED
    assert ours["verdict"] == verdicts.UNDETERMINED and ours["verdicts"]["p2"] == verdicts.REFUTED
    assert ours["trend"]["fit_excess"] == [1.0] * 4
