"""What a claims run prints: the evidence, not our stack; the verdict table and the
two paths last; one line per failure by default, the full account under -v, only the table under
-q; the one-line evidence as the JUnit failure message; progress with rate and ETA; and a report
without the machine's absolute paths."""

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

import fixtures  # noqa: F401  (torchvision shim before timm)
import timm  # noqa: F401  (imported here so that in-process runs never import (and register) it twice)
import torch
from claims import outcome
from fixtures.models import capture, loading as models  # noqa: F401  (likewise)
from fixtures import plugin
from fixtures.engine import progress, claim_session as session  # noqa: F401  (session: likewise)
from fixtures.engine.progress import set_progress_writer
from report.path_scrub import display_path, scrub_paths

ROOT = Path(__file__).resolve().parent.parent
pytest_plugins = ["pytester"]
MODEL = ("--models", "random-vit_tiny_patch16_224", "--n-samples", "4", "--heads", "0,1")
SMALL = (*MODEL, "--layers", "0")
# The in-process runs compute on one thread: a serial run's default (all cores) spin-waits beside
# the other test worker (the default-run test: 62 s, 4 s on one thread, 2 cores at load ~5);
# what a run prints does not depend on it.
ONE_THREAD = ("--threads", "1")


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    """One cache for the module: the first run computes, the others read."""
    return tmp_path_factory.mktemp("cache")


def claims(pytester: pytest.Pytester, out: Path, cache: Path, *args: str,
           plugins=()) -> pytest.RunResult:
    threads = torch.get_num_threads()
    try:
        return pytester.runpytest_inprocess(
            str(ROOT / "claims"), "--rootdir", str(ROOT), "-c", str(ROOT / "pyproject.toml"),
            *SMALL, *ONE_THREAD, "--out", str(out), "--cache-dir", str(cache), *args,
            plugins=list(plugins))
    finally:
        set_progress_writer(None)  # the inner run's terminal is gone
        torch.set_num_threads(threads)  # --threads 1 was the inner run's, not this worker's


def nonempty(result: pytest.RunResult) -> list[str]:
    return [line for line in result.outlines if line.strip()]


def closing(results: dict, out: Path) -> list[str]:
    """The lines every run must end with: the verdict table, then the two paths."""
    return [*plugin.verdict_table(results["records"]), f"results: {out / 'results.json'}",
            f"report: {out / 'report.html'}"]


def test_default_run_ends_with_the_table_and_prints_one_line_of_evidence_per_failure(
        pytester, tmp_path, cache_dir):
    out = tmp_path / "out"
    result = claims(pytester, out, cache_dir, "--junitxml", str(tmp_path / "junit.xml"))
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    results = json.loads((out / "results.json").read_text())
    lines = nonempty(result)
    table = closing(results, out)
    assert lines[-len(table):] == table, "\n".join(lines[-15:])
    assert table[0] == "kpca-claims verdicts" and len(table) == 2 + 3 + 2  # V, J, E rows
    text = result.stdout.str()
    for marker in ("object at 0x", "Traceback", "def test_", "assert_supported(", "AssertionError",
                   "FAILURES", "short test summary"):
        assert marker not in text, marker
    not_supported = [r for r in results["records"] if r["verdict"] != "supported"]
    assert not_supported  # a random-init control: the claims do not hold
    expected = {outcome.one_line(r) for r in not_supported}
    assert expected <= set(lines)  # each failure: its one line of evidence, nothing more
    assert not any("supported if" in line for line in lines)  # the thresholds stay in -v
    # one line per failure on top of a fixed frame (measured: 40 lines, 32 + 8 evidence, cold cache)
    assert len(lines) <= 36 + len(not_supported), len(lines)
    assert re.search(r"\d+ refuted", lines[-len(table) - 1])  # pytest's line reads as verdicts

    # JUnit: each claim test's failure message is its one-line evidence, the text that line and
    # where the full evidence is (a test case stays under 2 KB)
    by_test = {r["test_id"]: r for r in results["records"]}
    failures = 0
    for case in ET.parse(tmp_path / "junit.xml").iter("testcase"):
        failure = case.find("failure")
        if failure is None:
            continue
        failures += 1
        record = by_test[case.get("name")]
        assert failure.get("message") == outcome.one_line(record)
        assert "\n" not in failure.get("message") and "object at 0x" not in failure.text
        assert failure.text.startswith(failure.get("message")) and "results.json" in failure.text
    assert failures == sum(r["outcome"] == "failed" for r in results["records"]) > 0

    # the report names no folder of this machine
    html = (out / "report.html").read_text()
    assert str(tmp_path) not in html and str(ROOT) not in html


class SessionEndProbe:
    """What pytest's terminal summary (step 3 of fixtures/plugin/session_end.py) sees."""

    seen: dict = {}

    def pytest_terminal_summary(self, config: pytest.Config) -> None:
        from fixtures.plugin.state import _COLLECTED

        store = config.stash[_COLLECTED]
        self.seen = {
            "gate": store.gate,
            "results": store.written is not None and store.written.is_file(),
            "report": store.report is not None and store.report.is_file(),
            "kpca session-end hooks": sorted(
                f"{impl.function.__module__}.{impl.function.__name__}"
                for impl in config.hook.pytest_sessionfinish.get_hookimpls()
                if impl.function.__module__.split(".")[0] in ("fixtures", "claims", "report"))}


def test_session_end_runs_its_steps_in_the_stated_order(pytester, tmp_path, cache_dir):
    """fixtures/plugin/session_end.py: results.json, the gate and the report before pytest's
    own session end (the terminal summary sees the gate's outcome and both files; junitxml's
    file has the gate's property), the closing lines after pytest's summary line."""
    base, junit = tmp_path / "baseline.json", tmp_path / "junit.xml"
    first = claims(pytester, tmp_path / "first", cache_dir, "--baseline", str(base),
                   "--update-baseline")
    assert first.ret == pytest.ExitCode.OK and base.is_file(), first.stdout.str()[-3000:]
    probe, out = SessionEndProbe(), tmp_path / "out"
    result = claims(pytester, out, cache_dir, "--baseline", str(base), "--junitxml", str(junit),
                    plugins=[probe])
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()[-3000:]
    assert probe.seen["kpca session-end hooks"] == ["fixtures.plugin.session_end.pytest_sessionfinish"]
    assert probe.seen["gate"].startswith(f"no regression against baseline {base}")
    assert probe.seen["results"] and probe.seen["report"]
    # results.json carries the gate's outcome; the report, rendered from it, came after it
    assert json.loads((out / "results.json").read_text())["gate"]["summary"] == probe.seen["gate"]
    assert (out / "results.json").stat().st_mtime_ns <= (out / "report.html").stat().st_mtime_ns
    props = {p.get("name"): p.get("value") for p in ET.parse(junit).iter("property")}
    assert props["kpca_gate"] == probe.seen["gate"] and "kpca_git_commit" in props
    lines = nonempty(result)
    summary = max(i for i, line in enumerate(lines) if line.startswith("=") and " in " in line)
    gate = lines.index(f"gate: {probe.seen['gate']}")
    assert summary < gate < lines.index(f"results: {out / 'results.json'}") == len(lines) - 2
    assert lines[-1] == f"report: {out / 'report.html'}"


def test_quiet_run_prints_only_the_table_and_the_paths(pytester, tmp_path, cache_dir):
    out = tmp_path / "out"
    result = claims(pytester, out, cache_dir, "-q")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    results = json.loads((out / "results.json").read_text())
    lines = nonempty(result)
    table = closing(results, out)
    assert lines[-len(table):] == table
    rest = lines[:-len(table)]
    # pytest's own count line, and the empty series parametrisation's letter at most
    assert len(rest) <= 2 and re.search(r"refuted|inconclusive", rest[-1]), rest
    assert not any(line.startswith(("[kpca]", "claim ")) for line in rest)


def test_verbose_run_prints_the_full_evidence(pytester, tmp_path, cache_dir):
    out = tmp_path / "out"
    result = claims(pytester, out, cache_dir, "-v")
    results = json.loads((out / "results.json").read_text())
    lines = nonempty(result)
    table = closing(results, out)
    assert lines[-len(table):] == table
    text = result.stdout.str()
    assert "object at 0x" not in text and "Traceback" not in text
    v_head = next(r for r in results["records"] if r["claim"] == "V" and r["level"] == "head")
    # the full account: every judged metric with its rules and their sources
    assert "supported if >= 0.9" in text and "optimal_cosine" in text
    assert f"{outcome.record_label(v_head)}:" in lines
    assert re.search(r"test_value_vectors\[random-vit_tiny_patch16_224-L00-H0\] "
                     rf"{v_head['verdict'].upper()}", text)


def test_an_internal_error_keeps_its_traceback(pytester, tmp_path, cache_dir, monkeypatch):
    """A fault is not a verdict: pytest's traceback stays, listed under FAILURES."""
    from claims import claim_v

    def broken(record, what):
        raise RuntimeError("message formatting broke")

    monkeypatch.setattr(claim_v, "message", broken)
    out = tmp_path / "out"
    result = claims(pytester, out, cache_dir, "-k", "test_value_vectors_model")
    text = result.stdout.str()
    assert result.ret != pytest.ExitCode.OK
    assert "FAILURES" in text and "RuntimeError: message formatting broke" in text
    assert "def broken" in text  # the source of the fault, as for any bug
    assert re.search(r"\b1 failed\b", text)


# ------------------------------------------------------------------------------- units
def _record(**extra):
    return {"claim": "V", "level": "head", "model": "all-MiniLM-L6-v2", "layer": 0, "head": 5,
            "verdict": "refuted",
            "metrics": {"optimal_cosine": 0.2712, "linear_cka": 0.05, "kernel_cka": 0.3,
                        "subspace_overlap_excess": 0.1, "pearson": 0.0},
            "null": {"optimal_cosine": 0.351, "linear_cka": 0.04, "kernel_cka": 0.2,
                     "subspace_overlap_excess": 0.0}, **extra}


def test_one_line_evidence_shows_the_interval_when_the_record_has_one():
    plain = outcome.one_line(_record())
    assert plain.startswith("claim V all-MiniLM-L6-v2-L00-H5: refuted (optimal cosine 0.271, "
                            "null 0.351; linear CKA 0.05, null 0.04; kernel CKA 0.3, null 0.2; ")
    assert "pearson" not in plain  # only the judged metrics
    with_ci = outcome.one_line(_record(ci={"optimal_cosine": [0.25, 0.29]}))
    assert "optimal cosine 0.271 [0.25, 0.29], null 0.351" in with_ci
    undetermined = outcome.one_line(_record(verdict="undetermined", reason="mu_d is round-off"))
    assert undetermined == "claim V all-MiniLM-L6-v2-L00-H5: undetermined (mu_d is round-off)"
    model = outcome.one_line(_record(level="model", layer=None, head=None))
    assert model.startswith("claim V all-MiniLM-L6-v2 (model): refuted")
    unknown = outcome.one_line({"claim": "X", "level": "head", "model": "m", "layer": 1,
                                 "head": 0, "verdict": "inconclusive", "metrics": {"a": 1.0}})
    assert unknown == "claim X m-L01-H0: inconclusive (a 1)"


def test_assert_supported_raises_the_evidence_not_an_assertion():
    with pytest.raises(outcome.ClaimNotSupported) as info:
        outcome.assert_supported(_record(), "full evidence\nline 2")
    assert info.value.evidence == "full evidence\nline 2"
    assert info.value.line == outcome.one_line(_record())
    outcome.assert_supported(_record(verdict="supported"), "unused")
    with pytest.raises(pytest.skip.Exception, match="why"):
        outcome.assert_supported(_record(verdict="undetermined"), "why")


def test_verdict_table_counts_units_and_shows_the_model_verdict():
    records = [_record(head=h, verdict=v) for h, v in enumerate(["refuted", "refuted", "inconclusive"])]
    records += [_record(level="model", layer=None, head=None, verdict="refuted"),
                {"claim": "J", "level": "series", "model": "run", "layer": None, "head": None,
                 "verdict": "supported"}]
    records.append({"claim": "J", "level": "model", "model": "run", "layer": None, "head": None,
                    "verdict": "refuted"})
    title, header, j_row, j_trend, v_row = plugin.verdict_table(records)
    assert title == "kpca-claims verdicts" and header.split() == ["claim", "model", "heads/layers",
                                                                  "model", "verdict"]
    assert v_row.split() == ["V", "all-MiniLM-L6-v2", "3", "heads:", "2", "refuted,", "1",
                             "inconclusive", "refuted"]
    assert j_row.split() == ["J", "run", "-", "refuted"]
    assert j_trend.split() == ["J", "run", "(trend)", "-", "supported"]
    assert plugin.verdict_table([]) == []


def test_progress_lines_give_rate_and_eta(monkeypatch):
    lines: list[str] = []
    set_progress_writer(lines.append)
    clock = iter(range(0, 1000, 5))
    monkeypatch.setattr(progress.time, "monotonic", lambda: float(next(clock)))
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    try:
        stage = progress.StageProgress("all-MiniLM-L6-v2 claim E", 6, "layer")
        stage.step(None)  # layer 0 from the cache: nothing to follow yet
        assert lines == []
        for _ in range(5):
            stage.step(21.0)
    finally:
        set_progress_writer(None)
    assert lines[0] == "[gw1] all-MiniLM-L6-v2 claim E 2/6 layers, 21 s/layer, ~84 s left"
    assert lines[-1] == "[gw1] all-MiniLM-L6-v2 claim E 6/6 layers, 21 s/layer, done in 2 min"
    assert len(lines) == 2  # throttled: the first computed layer, then the end


def test_report_paths_are_relative_inside_the_checkout_and_hashed_outside(tmp_path):
    inside = ROOT / "fixtures" / "data" / "sentences.txt"
    assert display_path(str(inside)) == "fixtures/data/sentences.txt"
    outside = tmp_path / "texts" / "mine.txt"
    outside.parent.mkdir()
    outside.write_text("a line\n")
    shown = display_path(str(outside))
    assert re.fullmatch(r"mine\.txt \(sha256 [0-9a-f]{12}\)", shown), shown
    text = f"text file {inside}; --out {tmp_path}/run -n 2; https://arxiv.org/abs/2406.13762; /255"
    scrubbed = scrub_paths(text)
    assert scrubbed == ("text file fixtures/data/sentences.txt; --out run -n 2; "
                        "https://arxiv.org/abs/2406.13762; /255")


def _logged_run(tmp_path: Path, name: str, *args: str) -> tuple[str, str, Path]:
    """A ``-n 2`` claims run with its output redirected to files, as on CI or in a Slurm job (no
    TTY): (stdout, stderr, out folder); refuted claims, exit 1."""
    import os
    import subprocess
    import sys

    out, log = tmp_path / f"out-{name}", tmp_path / f"log-{name}"
    with open(log.with_suffix(".out"), "w") as stdout, open(log.with_suffix(".err"), "w") as stderr:
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "claims/", "-p", "no:cacheprovider", *args,
             "-n", "2", "--out", str(out), "--cache-dir", str(tmp_path / f"cache-{name}")],
            cwd=ROOT, stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL, timeout=600,
            env={**os.environ, "PYTHONPATH": str(ROOT)})
    text = log.with_suffix(".out").read_text()
    assert done.returncode == pytest.ExitCode.TESTS_FAILED, text[-3000:]
    return text, log.with_suffix(".err").read_text(), out


@pytest.fixture(scope="module")
def workers_run(tmp_path_factory) -> tuple[str, str, Path]:
    """One ``-n 2`` run over two layers, logged to files, that the two tests below read."""
    return _logged_run(tmp_path_factory.mktemp("workers"), "n2", *MODEL, "--layers", "0,1")


@pytest.mark.slow
@pytest.mark.xdist_group("terminal-workers")  # one worker makes the module's -n 2 run
def test_workers_print_rate_and_eta_and_the_run_still_ends_with_the_table(workers_run):
    """-n 2: each worker's progress lines (model, stage, rate, ETA) reach the terminal, no
    per-test letter breaks them, and the table and paths are still the last lines."""
    stdout, stderr, out = workers_run
    text = stdout + stderr
    # (a stage this short prints only its closing line; the ETA lines: the unit tests above)
    assert re.search(r"^\[gw[01]\] random-vit_tiny_patch16_224 claim V 2/2 layers, [\d.]+ "
                     r"s/layer, done in (<1|\d+) (s|min)$", text, re.M), text[-3000:]
    assert not re.search(r"[RI.]\[gw", text)  # no letter glued to a progress line
    results = json.loads((out / "results.json").read_text())
    lines = [line for line in stdout.splitlines() if line.strip()]
    table = closing(results, out)
    assert lines[-len(table):] == table


def test_a_series_checkpoint_prints_one_line_per_stage(monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    lines: list[str] = []
    set_progress_writer(lines.append)
    try:
        stage = progress.StageProgress("tiny step 450 claim J", 3, "layer", only_last=True)
        for _ in range(3):
            stage.step(0.5)
    finally:
        set_progress_writer(None)
    assert lines == ["[kpca] tiny step 450 claim J 3/3 layers, 0.5 s/layer, done in 2 s"]


def test_a_short_stage_prints_only_its_closing_line(monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    lines: list[str] = []
    set_progress_writer(lines.append)
    try:
        stage = progress.StageProgress("m claim J", 6, "layer")
        for _ in range(6):
            stage.step(0.2)
    finally:
        set_progress_writer(None)
    assert lines == ["[kpca] m claim J 6/6 layers, 0.2 s/layer, done in 1 s"]


@pytest.mark.slow
@pytest.mark.xdist_group("terminal-workers")
def test_a_run_logged_to_a_file_shows_each_model_and_stage_while_it_runs(workers_run, tmp_path):
    """Output redirected to files, as on CI or in a Slurm job (no TTY), -n 2: stderr carries one
    line per model and stage (loading, captured, claim V/J/E done with its time) from the
    workers; under -q, none."""
    m = "random-vit_tiny_patch16_224"
    err = workers_run[1]
    assert re.search(rf"^\[gw[01]\] loading {m} \(", err, re.M), err[-3000:]
    assert re.search(rf"^\[gw[01]\] {m} ready in [\d.]+ s \(captured Q/K/V of 4 samples", err, re.M)
    for claim in "VJE":
        assert re.search(rf"^\[gw[01]\] {m} claim {claim} 2/2 layers, [\d.]+ s/layer, done in "
                         r"(<1|\d+) (s|min)$", err, re.M), err[-3000:]
    _, quiet, _ = _logged_run(tmp_path, "quiet", *SMALL, "-q")
    assert not re.search(r"^\[(gw\d|kpca)\] ", quiet, re.M), quiet[-3000:]
