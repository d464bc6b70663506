"""``python -m report diff``: the comparison of a run with a reference run, its tolerances per
field kind and its exit codes (0 reproduces, 6 changed, 4 not comparable, 2 bad input)."""

from __future__ import annotations

import copy
import json

import pytest

from report import diff
from report.__main__ import main as report_main
from report.tolerances import TOLERANCES, kind_of, rel_diff


def _results() -> dict:
    rec_v = {"claim": "V", "level": "head", "model": "m", "layer": 0, "head": 1,
             "test_id": "test_value_vectors[m-L00-H1]", "verdict": "refuted",
             "verdicts": {"p2": "inconclusive", "ours": "refuted"}, "outcome": "failed",
             "metrics": {"optimal_cosine": 0.31, "pearson": 0.004},
             "ci": {"optimal_cosine": [0.30, 0.32]}, "p2_code": {"direct_cosine": -0.2},
             "evidence": "optimal_cosine 0.31", "n_samples": 6}
    rec_e = {"claim": "E", "level": "head", "model": "m", "layer": 0, "head": 1,
             "test_id": "test_gamma_constancy[m-L00-H1]", "verdict": "refuted",
             "verdicts": {"p2": "refuted", "ours": "refuted"},
             "metrics": {"eigen": 4e-14, "gamma_position": 1.1}, "abs": {"eigen": 3e-19},
             "directions_imprecise": {"learned": 0.39}}
    rec_j = {"claim": "J", "level": "series", "model": "m", "layer": None, "head": None,
             "test_id": "test_projection_trend[m]", "verdict": "refuted",
             "verdicts": {"p2": "refuted", "ours": "refuted"},
             "series": [{"checkpoint": "/home/a/.kpca-cache/trained/x/step_000000.safetensors",
                         "checkpoint_hash": "abc", "j_proj": -0.5}]}
    return {"schema": "kpca-claims/results/1",
            "provenance": {"git_commit": "abc", "date": "2026-11-24", "versions": {"torch": "2.13"},
                           "command": "pytest claims/",
                           "numeric_environment": {"cpu": {"model": "AMD EPYC"},
                                                   "torch_cpu_capability": "AVX2", "env": {}}},
            "options": {"n_samples_requested": 6, "rules": "ours", "device": "cpu",
                        "dtype": "float64"},
            "thresholds": {"claim_v": {"refuted": {"optimal_cosine": {"value": 0.32}}}},
            "models": {"m": {"key": "m", "n_layers": 1, "n_heads": 2, "checkpoint_hash": "sha256:1",
                             "input_set": {"kind": "images", "n_samples": 6, "names": [],
                                           "hash": "h", "tensor_hash": "t"}}},
            "records": [rec_v, rec_e, rec_j], "not_run": [], "complete": True, "exit_status": 1}


def test_identical_runs_reproduce():
    d = diff.compare(_results(), _results())
    assert d.status == diff.REPRODUCES and d.n_records == 3 and not d.informational


def test_round_off_within_tolerance_and_other_cache_folder_reproduce():
    run = _results()
    run["records"][0]["metrics"]["optimal_cosine"] *= 1 + 3e-7
    run["records"][1]["abs"]["eigen"] = 7e-14              # round-off kind: absolute bound
    run["records"][1]["metrics"]["eigen"] = 3e-3           # solver-dependent: finiteness only
    run["records"][0]["p2_code"]["direct_cosine"] = 0.2     # solver-dependent: sign is free
    run["records"][1]["directions_imprecise"]["learned"] = 0.393  # ill-conditioned: 0.1 relative
    run["records"][2]["series"][0]["checkpoint"] = "/other/cache/trained/x/step_000000.safetensors"
    run["records"][0]["evidence"] = "optimal_cosine 0.3100001"  # text: through its numbers
    run["provenance"]["numeric_environment"]["torch_cpu_capability"] = "DEFAULT"
    d = diff.compare(run, _results())
    assert d.status == diff.REPRODUCES, d
    assert any("torch_cpu_capability: AVX2 → DEFAULT" in line for line in d.informational)
    text = diff.format_diff(d, "run.json", "ref.json", run, _results())
    line = next(x for x in text.splitlines() if x.startswith("solver_dependent:"))
    assert "2 numbers compared for presence and finiteness only" in line, text
    assert "largest relative difference 2 at test_value_vectors[m-L00-H1] p2_code" in line, text


@pytest.mark.parametrize("path, value", [
    ("p2_code.direct_cosine", float("nan")), ("metrics.eigen", float("inf")),
    ("directions_imprecise.learned", 0.5), ("routes.naive_float32.stats.min.mean", 1.01e-6)])
def test_a_declared_kind_still_catches_what_it_bounds(path, value):
    """Solver-dependent numbers must stay present and finite; ill-conditioned and float32 ones
    within their measured relative bounds (0.1 and 1e-3)."""
    run, ref = _results(), _results()
    for r in (run, ref):
        r["records"][1]["routes"] = {"naive_float32": {"stats": {"min": {"mean": 1e-6}}}}
        r["records"][1]["p2_code"] = {"direct_cosine": -0.2}
    rec, key = run["records"][1], path.split(".")
    for part in key[:-1]:
        rec = rec[part]
    rec[key[-1]] = value
    d = diff.compare(run, ref)
    assert d.status == diff.CHANGED and len(d.outside) == 1 and path in d.outside[0], d.outside
    assert kind_of(path, value) in d.outside[0]


def test_a_number_outside_its_tolerance_is_a_change():
    run = _results()
    run["records"][0]["ci"]["optimal_cosine"][1] = 0.3201
    d = diff.compare(run, _results())
    assert d.status == diff.CHANGED
    assert len(d.outside) == 1 and "ci.optimal_cosine[1]" in d.outside[0]
    text = diff.format_diff(d, "run.json", "ref.json", run, _results())
    assert "outside their tolerance: 1" in text and "exit 6" in text


def test_a_changed_verdict_and_rule_are_named():
    run = _results()
    run["thresholds"]["claim_v"]["refuted"]["optimal_cosine"]["value"] = 0.35
    run["records"][0]["verdicts"]["p2"] = "refuted"
    d = diff.compare(run, _results())
    assert d.status == diff.CHANGED
    assert d.verdicts == ["test_value_vectors[m-L00-H1]: p2 inconclusive → refuted"]
    assert d.rules == ["rule claim_v.refuted.optimal_cosine.value: 0.32 → 0.35"]


@pytest.mark.parametrize("change, named", [
    (lambda r: r["models"]["m"].update(checkpoint_hash="sha256:2"), "checkpoint_hash"),
    (lambda r: r["options"].update(n_samples_requested=8), "n_samples_requested"),
    (lambda r: r["records"].pop(), "other claim tests"),
])
def test_other_weights_options_or_selection_are_not_comparable(change, named):
    run = _results()
    change(run)
    d = diff.compare(run, _results())
    assert d.status == diff.NOT_COMPARABLE
    assert any(named in line for line in d.not_comparable)


def test_device_alone_does_not_make_runs_incomparable():
    """Nor the device map; in the run's options or in each record's."""
    run, ref = _results(), _results()
    ref["records"][0]["options"] = {"device": "cpu", "dtype": "float64"}
    run["records"][0]["options"] = {"device": "cuda", "device_map": "auto", "dtype": "float64"}
    run["options"].update(device="cuda", device_map="auto")
    assert diff.compare(run, ref).status == diff.REPRODUCES
    run["records"][0]["options"]["dtype"] = "float32"  # a record's other options still count
    assert diff.compare(run, ref).status == diff.CHANGED


def test_a_reference_older_than_an_option_reads_as_its_default():
    """A reference written before --forward-dtype existed ran its forward pass in float64: a
    float64 run reproduces it, a bfloat16 run is not comparable, whichever side is older; the
    records' own options likewise; and a baseline likewise (report/baseline.IMPLIED_OPTIONS)."""
    from report.baseline import BaselineMismatch
    from report.baseline_matching import check_options

    old = _results()
    old["records"][0]["options"] = {"dtype": "float64"}
    for forward, status in (("float64", diff.REPRODUCES), ("bfloat16", diff.NOT_COMPARABLE)):
        new = copy.deepcopy(old)
        new["options"]["forward_dtype"] = forward
        new["records"][0]["options"]["forward_dtype"] = forward
        assert diff.compare(new, old).status == diff.compare(old, new).status == status
    assert diff.compare(new, old).not_comparable == ["option forward_dtype: float64 → bfloat16"]
    check_options({"dtype": "float64", "forward_dtype": "float64"}, {"dtype": "float64"})
    with pytest.raises(BaselineMismatch, match="the option forward_dtype differs: 'float64' in "
                                               "the baseline, 'bfloat16' in this run"):
        check_options({"dtype": "float64", "forward_dtype": "bfloat16"}, {"dtype": "float64"})


def test_a_reference_older_than_a_declared_field_is_compared_on_the_rest():
    """A reference written before every vs_null entry had the same fields (method §7.2,
    report/tolerances.ADDED_FIELDS): the run's added fields are counted, not compared; where
    both have them they are compared; a run without them, or with any other new field, differs."""
    old = _results()
    old["records"][0]["vs_null"] = {"subspace_overlap": {"p": 0.01, "p_adjusted": 0.02}}
    new = copy.deepcopy(old)
    new["records"][0]["vs_null"]["subspace_overlap"].update(smallest_p=0.0156, n_samples=6)
    d = diff.compare(new, old)
    assert d.status == diff.REPRODUCES
    assert d.informational == ["2 fields added since the reference, not compared"]
    assert diff.compare(old, new).status == diff.CHANGED  # the run lacks fields the reference has
    moved = copy.deepcopy(new)
    moved["records"][0]["vs_null"]["subspace_overlap"]["smallest_p"] = 0.5
    assert diff.compare(moved, new).outside  # compared by its kind where both have it
    other = copy.deepcopy(old)
    other["records"][0]["vs_null"]["subspace_overlap"]["q"] = 0.5
    assert diff.compare(other, old).exact == ["test_value_vectors[m-L00-H1] "
                                               "vs_null.subspace_overlap.q: <absent> → 0.5"]


def test_kinds_and_tolerances_are_declared_once():
    assert kind_of("metrics.optimal_cosine", 0.3) == "judged"
    assert kind_of("ci.optimal_cosine[0]", 0.3) == "interval"
    assert kind_of("ci_null.kernel_cka[1]", 0.3) == "interval"
    assert kind_of("abs.eigen", 1e-19) == "round_off"
    assert kind_of("subspace.eigen", 1e-16) == "round_off"
    assert kind_of("metrics.eigen", 1e-14) == "solver_dependent"
    assert kind_of("ci.eigen[1]", 1e-14) == "solver_dependent"
    assert kind_of("p2_code.pearson", 0.1) == "solver_dependent"
    assert kind_of("directions_imprecise.null", 0.3) == "ill_conditioned"
    assert kind_of("routes.naive_float32.stats.max.std", 0.3) == "float32"
    assert kind_of("metrics.max_route_ratio", 1.2) == "float32"
    assert kind_of("ci.max_route_ratio[0]", 1.2) == "float32"
    assert kind_of("routes.log_raw.stats.max.std", 0.3) == "judged"
    solver = TOLERANCES["solver_dependent"]
    assert solver.agree(0.2, -0.2) and solver.agree(1e-5, 3e-3)
    assert not solver.agree(0.2, float("nan")) and not solver.agree(float("inf"), 1.0)
    assert TOLERANCES["float32"].agree(1.0, 1.0 + 9e-4) and not TOLERANCES["float32"].agree(1.0, 1.002)
    assert kind_of("evidence", "x") == "text"
    assert kind_of("verdict", "refuted") == "exact" and kind_of("n_samples", 6) == "exact"
    judged = TOLERANCES["judged"]
    assert judged.agree(1.0, 1.0 + 9e-7) and not judged.agree(1.0, 1.0 + 2e-6)
    assert not judged.agree(float("nan"), 1.0) and judged.agree(float("nan"), float("nan"))
    assert rel_diff(0.0, 0.0) == 0.0 and rel_diff(1.0, 2.0) == 0.5


def test_command_line_exit_codes(tmp_path, capsys):
    ref = tmp_path / "ref.json"
    ref.write_text(json.dumps(_results()))
    same, moved, other = (tmp_path / n for n in ("same.json", "moved.json", "other.json"))
    same.write_text(json.dumps(_results()))
    changed = _results()
    changed["records"][0]["verdicts"]["ours"] = "inconclusive"
    changed["records"][0]["verdict"] = "inconclusive"
    moved.write_text(json.dumps(changed))
    incomparable = copy.deepcopy(_results())
    incomparable["models"]["m"]["checkpoint_hash"] = "sha256:other"
    other.write_text(json.dumps(incomparable))
    assert report_main(["diff", str(same), str(ref)]) == 0
    assert "REPRODUCES" in capsys.readouterr().out
    assert report_main(["diff", str(moved), str(ref), "--json", str(tmp_path / "d.json")]) == 6
    out = capsys.readouterr().out
    assert "verdicts changed: 1" in out and "refuted → inconclusive" in out
    assert json.loads((tmp_path / "d.json").read_text())["status"] == 6
    assert report_main(["diff", str(other), str(ref)]) == 4
    assert "NOT COMPARABLE" in capsys.readouterr().out
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(SystemExit) as exc:
        report_main(["diff", str(bad), str(ref)])
    assert exc.value.code == 2 and "is not a kpca-claims results file" in capsys.readouterr().err


def test_the_verdict_and_its_reason_are_the_first_line(tmp_path, capsys):
    """A reader sees the answer first: REPRODUCES / DOES NOT REPRODUCE / NOT COMPARABLE, the
    exit status and why, on line one (and again on the last line), before any detail."""
    ref = tmp_path / "ref.json"
    ref.write_text(json.dumps(_results()))
    other = _results()
    other["models"]["m"]["checkpoint_hash"] = "sha256:other"
    other["options"]["n_samples_requested"] = 8
    moved = _results()
    moved["records"][0]["verdicts"]["ours"] = moved["records"][0]["verdict"] = "inconclusive"
    cases = {"same": (_results(), 0, "REPRODUCES the reference (exit 0): 3 records, 0 verdicts "
                                     "changed, 0 of "),
             "moved": (moved, 6, "DOES NOT REPRODUCE the reference (exit 6): 3 records, 1 "
                                 "verdicts changed"),
             "other": (other, 4, "NOT COMPARABLE with the reference (exit 4): option "
                                 "n_samples_requested: 6 → 8 (and 1 more reason below)")}
    for name, (results, code, first) in cases.items():
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(results))
        assert report_main(["diff", str(path), str(ref)]) == code
        lines = capsys.readouterr().out.splitlines()
        assert lines[0].startswith(first), (name, lines[0])
        assert lines[-1].split(" (exit")[0] == lines[0].split(" (exit")[0], name


@pytest.mark.parametrize("target", ["run", "reference", "folder", "missing-folder"])
def test_json_output_is_refused_before_anything_when_it_would_destroy_an_input(tmp_path, capsys,
                                                                               target):
    """``--json`` naming the run or the reference (which it would replace), a folder, or a file
    in a folder that does not exist: one sentence, exit 2, no verdict printed, inputs intact."""
    run, ref = tmp_path / "run.json", tmp_path / "ref.json"
    for path in (run, ref):
        path.write_text(json.dumps(_results()))
    before = run.read_bytes(), ref.read_bytes()
    (tmp_path / "folder").mkdir()
    out = {"run": run, "reference": ref, "folder": tmp_path / "folder",
           "missing-folder": tmp_path / "nowhere" / "d.json"}[target]
    with pytest.raises(SystemExit) as exc:
        report_main(["diff", str(run), str(ref), "--json", str(out)])
    captured = capsys.readouterr()
    assert exc.value.code == 2 and captured.out == ""
    assert len(captured.err.strip().splitlines()) == 1 and "--json" in captured.err
    assert "nothing was compared or written" in captured.err
    assert (run.read_bytes(), ref.read_bytes()) == before
