"""The cluster path without a cluster: scripts/slurm-shards.sh under stub ``sbatch`` and ``python``
(what it submits, with which options, from which folder, with which exit codes), run ids against
stale shard folders, merges that say why they are partial, SIGTERM around the results write, the
assignment threads of a job's CPU allocation and trend records independent of the cache path.
The same script on a real Slurm: tests/test_slurm_real.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "slurm-shards.sh"


# --------------------------------------------------------------------- the script, stubbed
@pytest.fixture
def slurm_stub(tmp_path):
    """Stub ``sbatch`` (logs its arguments and the KPCA_* environment, answers ``JOB;cluster``)
    and ``python`` (``-c`` goes to the real interpreter; anything else is logged with its
    working folder and exits $STUB_RC)."""
    stub = tmp_path / "bin"
    stub.mkdir()
    log = tmp_path / "calls.log"
    (stub / "sbatch").write_text(textwrap.dedent(f"""\
        #!/bin/sh
        echo "sbatch $*" >> "{log}"
        env | grep '^KPCA_' | sort | sed 's/^/  env /' >> "{log}"
        n=$(cat "{tmp_path}/jobs" 2>/dev/null || echo 122); n=$((n + 1)); echo $n > "{tmp_path}/jobs"
        echo "$n;cluster"
        """))
    (stub / "python").write_text(textwrap.dedent(f"""\
        #!/bin/sh
        if [ "$1" = "-c" ]; then exec "{sys.executable}" "$@"; fi
        echo "python $* @ $PWD" >> "{log}"
        exit ${{STUB_RC:-0}}
        """))
    for f in stub.iterdir():
        f.chmod(0o755)
    user = tmp_path / "user"  # the folder the user submits from
    user.mkdir()
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "KPCA_"))}
    base.update(PATH=f"{stub}:{os.environ['PATH']}", KPCA_PYTHON="python")

    def run(*args, cwd=user, **extra):
        log.unlink(missing_ok=True)
        env = {**base, **extra}
        env = {k: v for k, v in env.items() if v is not None}
        done = subprocess.run(["bash", str(SCRIPT), *args], env=env, cwd=cwd,
                              capture_output=True, text=True, timeout=120)
        calls = log.read_text().splitlines() if log.exists() else []
        return done, calls

    run.user = user
    return run


def _sbatch(calls: list[str]) -> list[str]:
    return [c for c in calls if c.startswith("sbatch ")]


def _env_of(calls: list[str], index: int) -> dict:
    """The KPCA_* environment of the index-th sbatch call."""
    out, seen = {}, -1
    for c in calls:
        if c.startswith("sbatch "):
            seen += 1
        elif seen == index and c.startswith("  env "):
            k, v = c[len("  env "):].split("=", 1)
            out[k] = v
    return out


def test_script_is_valid_bash_and_asks_for_no_resources_of_its_own():
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0
    directives = [ln for ln in SCRIPT.read_text().splitlines() if ln.startswith("#SBATCH")]
    assert directives == ["#SBATCH --job-name=kpca-claims"]  # resources come from --sbatch


def test_submit_passes_sbatch_options_to_the_shards_and_a_small_merge(slurm_stub):
    """Resources without editing the script, the merge asking for little, --chdir to the
    checkout, logs in the run folder, the ;cluster suffix of the job id dropped."""
    done, calls = slurm_stub("submit", "--sbatch", "--time=10 --partition=cpu --gres=gpu:1",
                             "--merge-sbatch=--account=lab", "3", "--models", "paper", "-n", "2",
                             KPCA_RUN_DIR="runs/x")
    assert done.returncode == 0, done.stderr
    run_dir = slurm_stub.user / "runs" / "x"  # relative to the folder submitted from
    shard, merge = _sbatch(calls)
    assert shard == (f"sbatch --parsable --array=1-3 --job-name=kpca-claims --chdir={ROOT} "
                     f"--output={run_dir}/logs/shard-%a.%A.out --export=ALL --time=10 "
                     f"--partition=cpu --gres=gpu:1 {SCRIPT} shard --models paper -n 2")
    assert merge == (f"sbatch --parsable --dependency=afterany:123 --job-name=kpca-claims-merge "
                     f"--chdir={ROOT} --output={run_dir}/logs/merge.%j.out --ntasks=1 "
                     f"--cpus-per-task=1 --mem=2G --time=00:15:00 --export=ALL --account=lab "
                     f"{SCRIPT} merge")
    env = _env_of(calls, 0)
    assert env["KPCA_RUN_DIR"] == str(run_dir) and env["KPCA_SHARDS"] == "3"
    assert env["KPCA_ROOT"] == str(ROOT) and env["KPCA_RUN_ID"] and env["KPCA_PYTHON"] == "python"
    assert _env_of(calls, 1)["KPCA_RUN_ID"] == env["KPCA_RUN_ID"]
    assert f"array job 123 (3 shards) and merge job 124 into {run_dir}/merged" in done.stdout
    assert (run_dir / "logs").is_dir() and (run_dir / "run.env").is_file()


def test_submit_uses_the_checkouts_python_and_refuses_one_without_torch(slurm_stub, tmp_path):
    venv_python = ROOT / ".venv" / "bin" / "python"
    if venv_python.exists():
        done, calls = slurm_stub("submit", "1", "--models", "paper", KPCA_PYTHON=None,
                                 KPCA_RUN_DIR=str(tmp_path / "a"))
        assert done.returncode == 0, done.stderr
        assert _env_of(calls, 0)["KPCA_PYTHON"] == str(venv_python)
    done, calls = slurm_stub("submit", "1", "--models", "paper", KPCA_PYTHON="/bin/false",
                             KPCA_RUN_DIR=str(tmp_path / "b"))
    assert done.returncode == 4 and not _sbatch(calls)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "KPCA_PYTHON" in lines[0] and "cannot import torch" in lines[0]


@pytest.mark.parametrize("pytest_rc, job_rc, words", [
    (0, 0, "every claim supported"), (1, 0, "a finding, not a failure"),
    (2, 2, "failed with pytest exit status 2"), (3, 3, "failed with pytest exit status 3")])
def test_refuted_claims_are_a_successful_job_and_faults_a_failed_one(slurm_stub, tmp_path,
                                                                     pytest_rc, job_rc, words):
    done, calls = slurm_stub("shard", "--models", "paper", SLURM_ARRAY_TASK_ID="2",
                             SLURM_ARRAY_TASK_COUNT="3", KPCA_RUN_DIR=str(tmp_path / "r"),
                             STUB_RC=str(pytest_rc))
    assert done.returncode == job_rc, done.stdout + done.stderr
    assert words in done.stdout + done.stderr
    assert calls == [f"python -m pytest claims/ --shard 2/3 --out {tmp_path}/r/shard-2 "
                     f"--models paper @ {ROOT}"]


def test_a_shard_runs_in_the_checkout_from_any_folder(slurm_stub, tmp_path):
    """Submitted from another folder (no KPCA_ROOT: `sbatch` by hand), the shard still runs
    `pytest claims/` in the checkout, so the plugin (and --shard) is there."""
    done, calls = slurm_stub("shard", "1/1", KPCA_RUN_DIR=str(tmp_path / "r"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert calls[0].endswith(f"@ {ROOT}")


def test_a_rerun_of_one_task_keeps_the_runs_shard_count(slurm_stub, tmp_path):
    run_dir = tmp_path / "r"
    stale = run_dir / "shard-2" / "results.json"
    stale.parent.mkdir(parents=True)
    stale.write_text("{}")
    # sbatch --array=2 of a 3-shard run: Slurm says 1 task; KPCA_SHARDS wins
    done, calls = slurm_stub("shard", SLURM_ARRAY_TASK_ID="2", SLURM_ARRAY_TASK_COUNT="1",
                             KPCA_SHARDS="3", KPCA_RUN_DIR=str(run_dir))
    assert done.returncode == 0 and "--shard 2/3 " in calls[0], calls
    assert not stale.exists()  # an earlier attempt's results never stand for this one
    done, calls = slurm_stub("shard", "2/3", SLURM_ARRAY_TASK_ID="1", SLURM_ARRAY_TASK_COUNT="1",
                             KPCA_RUN_DIR=str(run_dir))
    assert "--shard 2/3 " in calls[0]  # an explicit K/N wins over both
    done, _ = slurm_stub("shard", KPCA_RUN_DIR=str(run_dir))  # not inside an array job
    assert done.returncode != 0 and "sbatch --array" in done.stderr


def test_rerun_resubmits_shards_with_the_runs_options_and_run_id(slurm_stub, tmp_path):
    run_dir = tmp_path / "r"
    done, calls = slurm_stub("submit", "--sbatch", "--time=5", "3", "--models", "paper",
                             "--heads", "0,1", KPCA_RUN_DIR=str(run_dir))
    assert done.returncode == 0, done.stderr
    run_id = _env_of(calls, 0)["KPCA_RUN_ID"]
    done, calls = slurm_stub("rerun", "2", KPCA_RUN_DIR=str(run_dir), KPCA_PYTHON=None)
    assert done.returncode == 0, done.stderr
    shard, merge = _sbatch(calls)
    assert shard.startswith("sbatch --parsable --array=2 ") and " --time=5 " in shard
    assert shard.endswith(f"{SCRIPT} shard --models paper --heads 0,1")
    assert "--dependency=afterany:125 " in merge and merge.endswith(" merge")
    env = _env_of(calls, 0)
    assert env["KPCA_RUN_ID"] == run_id and env["KPCA_SHARDS"] == "3"
    assert env["KPCA_PYTHON"] == "python"  # the run's own, from run.env
    for bad, words in (("4", "has 3 shards"), ("x", "give shard numbers")):
        done, calls = slurm_stub("rerun", bad, KPCA_RUN_DIR=str(run_dir))
        assert done.returncode == 4 and words in done.stderr and not _sbatch(calls)
    done, _ = slurm_stub("rerun", "1", KPCA_RUN_DIR=str(tmp_path / "none"))
    assert done.returncode == 4 and "no submitted run" in done.stderr


def test_submit_into_an_earlier_runs_folder_is_refused_or_cleared(slurm_stub, tmp_path):
    run_dir = tmp_path / "r"
    done, _ = slurm_stub("submit", "2", "--models", "paper", KPCA_RUN_DIR=str(run_dir))
    assert done.returncode == 0
    (run_dir / "shard-1").mkdir()
    (run_dir / "shard-1" / "results.json").write_text("{}")
    (run_dir / "merged").mkdir()
    done, calls = slurm_stub("submit", "2", "--models", "paper", KPCA_RUN_DIR=str(run_dir))
    assert done.returncode == 4 and not _sbatch(calls)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "holds an earlier run" in lines[0] and "--replace" in lines[0]
    done, calls = slurm_stub("submit", "--replace", "2", "--models", "paper",
                             KPCA_RUN_DIR=str(run_dir))
    assert done.returncode == 0 and len(_sbatch(calls)) == 2
    assert "cleared the earlier run" in done.stdout
    assert not (run_dir / "shard-1").exists() and not (run_dir / "merged").exists()


# ------------------------------------------------------------------ merges of shard folders
def _fake_results(shard: int, count: int = 3, models=("m-a", "m-b", "m-c"),
                  run_id: str | None = "run-1", complete: bool = True) -> dict:
    from claims.names import RESULTS_SCHEMA

    mine = [models[shard - 1]]
    recs = [{"claim": "V", "level": "head", "model": m, "layer": 0, "head": h,
             "verdict": "supported", "metrics": {"x": 0.5 + h},
             "test_id": f"claims/test_value_vectors.py::test_value_vectors[{m}-L00-H{h}]",
             "options": {"seed": 0}} for m in mine for h in ((0, 1) if complete else (0,))]
    prov = {"date": "2026-01-01T00:00:00+00:00", "command": "pytest claims/", "git_commit": "abc",
            "versions": {"torch": "2"}, "platform": "x", "device": "cpu", "dtype": "float64",
            "workers": 0, "shard": {"index": shard, "count": count, "models": mine,
                                    "declared_models": sorted(models)}}
    if run_id:
        prov["run_id"] = run_id
    out = {"schema": RESULTS_SCHEMA, "provenance": prov, "options": {"seed": 0},
           "thresholds": {"V": {"x": 0.5}}, "records": recs, "not_run": [], "complete": True,
           "exit_status": 0,
           "models": {m: {"key": m, "checkpoint_hash": "c-" + m, "n_layers": 1, "n_heads": 2, "input_set": {
               "kind": "image", "source": "skimage", "hash": "h1", "n_samples": 4, "names": ["a.png"]}} for m in mine}}
    if not complete:  # stopped by SIGTERM (a time limit) after its model's first test
        out.update(complete=False, exit_status=2, interrupted_by="SIGTERM", not_run=[
            f"claims/test_value_vectors.py::test_value_vectors[{mine[0]}-L00-H1]",
            f"claims/test_value_vectors.py::test_value_vectors_model[{mine[0]}]"])
    return out


def _put(path: Path, data: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


def test_the_merge_job_leaves_out_a_stale_shard_folder_and_removes_an_old_merge(slurm_stub,
                                                                                tmp_path):
    run_dir = tmp_path / "r"
    for k in (1, 3):
        _put(run_dir / f"shard-{k}" / "results.json", _fake_results(k))
    _put(run_dir / "shard-2" / "results.json", _fake_results(2, run_id="run-0"))  # earlier run
    (run_dir / "merged").mkdir()
    (run_dir / "merged" / "results.json").write_text("{}")
    done, calls = slurm_stub("merge", KPCA_SHARDS="3", KPCA_RUN_ID="run-1",
                             KPCA_RUN_DIR=str(run_dir))
    assert "removed the earlier merge" in done.stdout
    assert not (run_dir / "merged").exists()  # (the stub python wrote nothing new)
    assert "shard 2/3" in done.stderr and "from run run-0, not this run run-1" in done.stderr
    assert calls == [f"python -m report merge {run_dir}/shard-1/results.json "
                     f"{run_dir}/shard-3/results.json -o {run_dir}/merged @ {ROOT}"]
    (run_dir / "shard-1" / "results.json").unlink()
    (run_dir / "shard-3" / "results.json").unlink()
    done, calls = slurm_stub("merge", KPCA_SHARDS="3", KPCA_RUN_ID="run-1",
                             KPCA_RUN_DIR=str(run_dir))
    assert done.returncode == 4 and "nothing to merge" in done.stderr and not calls


def test_report_merge_refuses_shards_of_different_submissions():
    from report.merge import MergeError, merge

    with pytest.raises(MergeError, match=r"differ in provenance\.run_id \('run-1' and 'run-0'\)"):
        merge([(Path("a"), _fake_results(1)), (Path("b"), _fake_results(2, run_id="run-0"))])
    merged = merge([(Path("a"), _fake_results(1)), (Path("b"), _fake_results(2))])
    assert merged["provenance"]["run_id"] == "run-1"


def _merge_cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "report", "merge", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def test_a_merge_of_cut_short_shards_says_partial_and_why_in_its_log_and_report(tmp_path):
    """Every model recorded, but shard 1 was stopped by a time limit: the merge's line says
    partial and names the shard; the report names it (and the missing shard 3) in its summary,
    and the not-run tests under their model, never "(unknown model)"."""
    a = _put(tmp_path / "s1" / "results.json", _fake_results(1, complete=False))
    b = _put(tmp_path / "s2" / "results.json", _fake_results(2))
    out = tmp_path / "merged"
    done = _merge_cli(a, b, "-o", out)
    assert done.returncode == 0, done.stderr
    line = done.stderr.strip()
    assert line.startswith("partial merge (complete: false): ") and len(line.splitlines()) == 1
    assert "Shard 3/3 left no results.json" in line and "no results for m-c" in line
    assert f"Shard 1/3 ({a}) was stopped by SIGTERM (a job time limit or scancel)" in line
    assert "2 claim tests of it did not run" in line
    merged = json.loads((out / "results.json").read_text())
    entry = merged["provenance"]["merged_from"][0]
    assert entry["interrupted_by"] == "SIGTERM" and entry["not_run"] == 2
    html = (out / "report.html").read_text()
    banner = html[html.index('id="partial-banner"'):html.index("1.1 Scope")]
    assert "partial merge of shards" in banner and "Shard 1/3" in banner and "Shard 3/3" in banner
    assert "collected by the shards that reported did not run" in banner
    assert "(unknown model)" not in html and "before collection finished" not in html
    assert "<td>m-a</td>" in banner  # the not-run tests under their model


def test_a_merge_with_only_a_missing_shard_has_no_not_run_table_but_says_why(tmp_path):
    a = _put(tmp_path / "s1" / "results.json", _fake_results(1))
    b = _put(tmp_path / "s2" / "results.json", _fake_results(2))
    out = tmp_path / "merged"
    done = _merge_cli(a, b, "-o", out)
    assert done.returncode == 0 and "Shard 3/3 left no results.json" in done.stderr
    html = (out / "report.html").read_text()
    assert "Shard 3/3 left no results.json" in html
    assert "0 claim tests collected by the shards that reported did not run" in html
    assert "before collection finished" not in html and "pytest exit status" not in html


def test_partial_reasons_of_a_merge_with_a_fault_and_of_a_complete_one():
    from report.partial import partial_reasons

    assert partial_reasons({"complete": True, "provenance": {"merged_from": [
        {"file": "a", "shard": "1/1", "complete": True}]}, "not_run": []}) == []
    reasons = partial_reasons({"complete": False, "not_run": ["t"], "errors": [
        {"kind": "environment", "error": "OSError: [Errno 28] No space left on device"}],
        "provenance": {"merged_from": [{"file": "s1/results.json", "shard": "1/1",
                                        "complete": False, "exit_status": 7, "not_run": 1}]}})
    assert reasons == [
        "Shard 1/1 (s1/results.json) ended with exit status 7; 1 claim test of it did not run",
        "1 fault (not verdicts): the first, environment fault OSError: [Errno 28] No space left "
        "on device", "1 collected claim test did not run"]


# ------------------------------------------- shard accounting: cut short, or edited by hand
def _as_written(shard: int, recorded: int, stopped: bool = True, reached: bool = True) -> dict:
    """A shard of models m-a, m-b as a run writes it: its model's three collected tests, of which
    the first ``recorded`` left a record. A ``stopped`` shard got SIGTERM (a time limit,
    ``scancel``) in its next test, after that test's setup (``reached``, so durations lists it)
    or before it, and lists the tests it did not finish under not_run."""
    from report.summary import summary

    data = _fake_results(shard, count=2, models=("m-a", "m-b"))
    model = ("m-a", "m-b")[shard - 1]
    data["models"][model]["n_layers"] = 2
    tests = [f"claims/test_value_vectors.py::test_value_vectors[{model}-L0{layer}-H{head}]"
             for layer, head in ((0, 0), (0, 1), (1, 0))]
    data["records"] = [{"claim": "V", "level": "head", "model": model, "layer": layer, "head": head,
                        "verdict": "supported", "metrics": {"x": 0.5 + head},
                        "test_id": t.split("::")[-1], "options": {"seed": 0}, "outcome": "passed"}
                       for t, (layer, head) in zip(tests[:recorded], ((0, 0), (0, 1), (1, 0)))]
    if not recorded:
        data["models"] = {}  # a model's provenance comes with its first record
    data["durations"] = {t: 0.5 for t in tests[:recorded]}
    data["skipped"] = {}
    if stopped:
        if reached and recorded < len(tests):
            data["durations"][tests[recorded]] = 0.001  # its setup ran; SIGTERM in its call
        data.update(complete=False, exit_status=2, interrupted_by="SIGTERM",
                    not_run=tests[recorded:])
    else:
        assert recorded == len(tests)
    data["summary"] = summary(data["records"], data["not_run"])
    return data


@pytest.mark.parametrize("recorded, reached", [(0, False), (0, True), (1, True), (2, True)],
                         ids=["before-any-test", "in-its-first-test", "after-1-record",
                              "after-2-records"])
def test_report_merge_takes_shards_stopped_early_as_partial_and_names_them(tmp_path, recorded,
                                                                          reached):
    """Both shards stopped by SIGTERM, with no record or fewer than they collected: merged as a
    partial run (complete: false) whose one line and report name both shards."""
    shards = [_put(tmp_path / f"s{k}" / "results.json", _as_written(k, recorded, reached=reached))
              for k in (1, 2)]
    out = tmp_path / "merged"
    done = _merge_cli(*shards, "-o", out)
    assert done.returncode == 0, done.stderr
    line = done.stderr.strip()
    assert line.startswith("partial merge (complete: false): ") and len(line.splitlines()) == 1
    for k, shard in zip((1, 2), shards):
        assert (f"Shard {k}/2 ({shard}) was stopped by SIGTERM (a job time limit or scancel); "
                f"{3 - recorded} claim test{'s' if recorded < 2 else ''} of it did not run") in line, line
    merged = json.loads((out / "results.json").read_text())
    assert merged["complete"] is False and len(merged["records"]) == 2 * recorded
    assert len(merged["not_run"]) == 2 * (3 - recorded)
    assert merged["summary"]["records"] == 2 * recorded
    assert merged["provenance"]["missing_models"] == ([] if recorded else ["m-a", "m-b"])
    assert [e["interrupted_by"] for e in merged["provenance"]["merged_from"]] == ["SIGTERM"] * 2
    html = (out / "report.html").read_text()
    assert "Shard 1/2" in html and "Shard 2/2" in html and "(unknown model)" not in html


def test_the_merge_job_of_two_shards_stopped_before_any_record_exits_2_with_a_report(slurm_stub,
                                                                                    tmp_path):
    """The real-Slurm case (a time limit and a scancel, both in the first test) through the
    script's merge mode with the real Python: a partial merge, exit 2, not a refusal (exit 4)."""
    run_dir = tmp_path / "r"
    for k in (1, 2):
        data = _as_written(k, 0)
        data["provenance"]["run_id"] = "run-1"
        _put(run_dir / f"shard-{k}" / "results.json", data)
    done, _ = slurm_stub("merge", KPCA_SHARDS="2", KPCA_RUN_ID="run-1", KPCA_RUN_DIR=str(run_dir),
                         KPCA_PYTHON=sys.executable)
    assert done.returncode == 2, done.stdout + done.stderr
    partial = next(x for x in done.stderr.splitlines() if x.startswith("partial merge"))
    assert "Shard 1/2" in partial and "Shard 2/2" in partial and "stopped by SIGTERM" in partial
    assert "merged run partial (complete: false)" in done.stderr
    assert json.loads((run_dir / "merged" / "results.json").read_text())["complete"] is False
    assert (run_dir / "merged" / "report.html").is_file()


def _edit(data: dict, change) -> dict:
    change(data)
    return data


def _drop_record_and_duration(data: dict) -> None:
    rec = data["records"].pop()
    del data["durations"][next(t for t in data["durations"] if t.endswith(rec["test_id"]))]


def _drop_record_into_not_run(data: dict) -> None:
    rec = data["records"].pop()
    data["not_run"] = sorted(data["not_run"] + [
        next(t for t in data["durations"] if t.endswith(rec["test_id"]))])


#: shard 2 edited by hand → words of the one-line refusal
EDITED = {
    "complete, a record removed": (
        lambda: _edit(_as_written(2, 3, stopped=False), lambda d: d["records"].pop()),
        "test_value_vectors[m-b-L01-H0] under durations (it ran) but holds no record of it"),
    "complete, a record and its duration removed": (
        lambda: _edit(_as_written(2, 3, stopped=False), _drop_record_and_duration),
        "states summary.records 3 but its records and not_run give 2"),
    "complete, a verdict altered": (
        lambda: _edit(_as_written(2, 3, stopped=False),
                      lambda d: d["records"][0].update(verdict="refuted")),
        'states summary.verdicts {"V": {"head": {"supported": 3}}} but its records and not_run '
        'give {"V": {"head": {"refuted": 1, "supported": 2}}}'),
    "complete, with tests under not_run": (
        lambda: _edit(_as_written(2, 1), lambda d: d.update(complete=True, exit_status=0)),
        "says complete: true but lists 2 tests under not_run"),
    "complete, stopped by SIGTERM": (
        lambda: _edit(_as_written(2, 3, stopped=False), lambda d: d.update(interrupted_by="SIGTERM")),
        "says complete: true but lists interrupted_by 'SIGTERM'"),
    "stopped, a record removed": (
        lambda: _edit(_as_written(2, 2), lambda d: d["records"].pop()),
        "test_value_vectors[m-b-L00-H1] under durations (it ran) but holds no record of it"),
    "stopped, a record moved to not_run": (
        lambda: _edit(_as_written(2, 2), _drop_record_into_not_run),
        "states summary.records 2 but its records and not_run give 1"),
    "stopped, a string metric": (
        lambda: _edit(_as_written(2, 1), lambda d: d["records"][0]["metrics"].update(x="0.5")),
        '.metrics.x is "0.5"'),
    "stopped, a record that is not an object": (
        lambda: _edit(_as_written(2, 1), lambda d: d["records"].__setitem__(0, "V m-b L0 H0")),
        "records[0] must be an object"),
    "stopped, a record added": (
        lambda: _edit(_as_written(2, 1), lambda d: d["records"].append(
            {**d["records"][0], "layer": 1, "test_id": "test_value_vectors[m-b-L01-H0]"})),
        "holds a record of test_value_vectors[m-b-L01-H0], a test its durations do not list"),
}


@pytest.mark.parametrize("case", sorted(EDITED))
def test_report_merge_refuses_a_shard_whose_account_was_edited_by_hand(tmp_path, case):
    """Beside a shard stopped by SIGTERM (accepted above), a shard whose records were removed,
    added or altered, or that claims complete: true beside tests that did not run: exit 4, one
    line naming the shard and what does not add up, nothing written."""
    make, words = EDITED[case]
    a = _put(tmp_path / "s1" / "results.json", _as_written(1, 1))
    b = _put(tmp_path / "s2" / "results.json", make())
    out = tmp_path / "merged"
    done = _merge_cli(a, b, "-o", out)
    assert done.returncode == 4, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and str(b) in lines[0] and words in lines[0], done.stderr
    assert "Traceback" not in done.stderr and not out.exists()


def test_both_sides_of_the_line_are_real_shards_with_a_valid_account():
    """The hand-made shards above are consistent as written (so each refusal is the edit's)."""
    from report.merge import check_accounted

    for k, recorded, stopped in ((1, 0, True), (2, 1, True), (1, 3, False)):
        check_accounted("s", _as_written(k, recorded, stopped=stopped))


# --------------------------------------------------------------------------------- SIGTERM
_SIGNAL_PROBE = textwrap.dedent("""\
    import os, signal, sys, time
    from fixtures.plugin import faults
    signal.signal(signal.SIGTERM, faults._on_sigterm)
    faults.defer_sigterm()
    os.kill(os.getpid(), signal.SIGTERM)  # lands during the writes: noted, no exception
    time.sleep(0.2)
    print("written", flush=True)
    if sys.argv[1] == "during":
        faults.results_written()  # acts on it now
        print("not reached", flush=True)
    else:
        faults._STATE["pending"] = False
        faults.results_written()
        print("default restored", flush=True)
        os.kill(os.getpid(), signal.SIGTERM)  # after the write: default action, no traceback
        time.sleep(5)
        print("not reached", flush=True)
    """)


@pytest.mark.parametrize("when", ["during", "after"])
def test_sigterm_during_the_write_waits_for_it_and_after_it_stops_at_once(when):
    done = subprocess.run([sys.executable, "-c", _SIGNAL_PROBE, when], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == -signal.SIGTERM, done.stdout + done.stderr
    assert "written" in done.stdout and "not reached" not in done.stdout
    assert "Traceback" not in done.stderr and "KeyboardInterrupt" not in done.stderr
    if when == "during":
        assert "SIGTERM received while results.json was being written" in done.stderr


_WRITE_PLUGIN = textwrap.dedent("""\
    import os, signal
    import fixtures.plugin.results as results

    _write = results.atomic_write_text

    def _sigterm_then_write(path, text):
        if str(path).endswith("results.json"):
            os.kill(os.getpid(), signal.SIGTERM)  # inside pytest_sessionfinish, before the write
        return _write(path, text)

    results.atomic_write_text = _sigterm_then_write
    """)


@pytest.mark.slow
def test_a_sigterm_inside_the_end_of_session_write_still_leaves_complete_results(tmp_path):
    (tmp_path / "sigterm_in_write.py").write_text(_WRITE_PLUGIN)
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "KPCA_CACHE": str(tmp_path / "cache")}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "claims/", "--models", "control-vit_tiny_patch16_224",
         "--layers", "0", "--heads", "0", "--n-samples", "2", "-k", "test_value_vectors",
         "--out", str(out), "-p", "sigterm_in_write", "-p", "no:cacheprovider", "-q"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == -signal.SIGTERM, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert results["complete"] is True and results["records"] and not results["not_run"]
    assert "Traceback" not in done.stdout + done.stderr
    assert "SIGTERM received while results.json was being written" in done.stdout + done.stderr


# ------------------------------------------------------------- a job's CPUs, trend records
def test_accelerator_assignment_threads_follow_the_cpu_affinity_not_the_node(monkeypatch):
    from fixtures.engine import layer_context
    from fixtures.engine.device import ACCELERATOR_PATH_ENV

    monkeypatch.setenv(ACCELERATOR_PATH_ENV, "1")
    monkeypatch.delenv("PYTEST_XDIST_WORKER_COUNT", raising=False)
    monkeypatch.setattr(layer_context.os, "cpu_count", lambda: 64)  # the whole node
    monkeypatch.setattr(layer_context.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})  # the job's
    assert layer_context.usable_cpus() == 4 and layer_context.assignment_threads("cpu") == 3
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    assert layer_context.assignment_threads("cpu") == 1


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="no CPU affinity on this OS")
def test_usable_cpus_under_taskset_is_the_allowed_set():
    code = "from fixtures.engine.layer_context import usable_cpus; print(usable_cpus())"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, preexec_fn=lambda: os.sched_setaffinity(0, {0}))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "1"


def test_trend_records_name_cache_checkpoints_relative_to_the_cache(tmp_path):
    from fixtures.engine.claim_session import SeriesPoint, cache_relative

    for root in (tmp_path / "cache-a", tmp_path / "elsewhere" / "cache-b"):
        path = root / "trained" / "tiny" / "step-0003.safetensors"
        name, inside = cache_relative(path, root)
        assert (name, inside) == ("trained/tiny/step-0003.safetensors", True)
        point = SeriesPoint(3, name, {}, run=None, in_cache=inside)
        assert point.record_fields() == {"checkpoint": "trained/tiny/step-0003.safetensors",
                                         "checkpoint_base": "cache"}
    user = tmp_path / "mine" / "epoch-3.safetensors"
    name, inside = cache_relative(user, tmp_path / "cache-a")
    assert (name, inside) == (str(user), False)
    assert SeriesPoint(3, name, {}, run=None).record_fields() == {"checkpoint": str(user)}


# ------------------------------------------------------------------------------------- docs
def test_readme_points_to_the_cluster_guide_which_covers_every_mode_and_option():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Run on a cluster: shards and merge", 1)[1].split("\n## ", 1)[0]
    body = [ln for ln in section.strip().splitlines() if ln.strip()]
    assert len(body) <= 6 and "docs/cluster.md" in section
    guide = (ROOT / "docs" / "cluster.md").read_text()
    assert "no slurm was available" not in (readme + guide).lower()
    usage = SCRIPT.read_text()
    for word in ("submit", "rerun", "--sbatch", "--merge-sbatch", "--replace", "KPCA_SHARDS",
                 "KPCA_PYTHON", "KPCA_RUN_DIR", "KPCA_CACHE", "afterany", "afterok",
                 "logs/shard-K.JOBID.out", "logs/merge.JOBID.out", "${jid%%;*}"):
        assert word in guide, word
    for mode in ("submit)", "rerun)", "shard)", "merge)"):
        assert mode in usage


def test_a_trained_series_names_its_checkpoints_relative_to_the_cache(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from fixtures.models.catalogue import REGISTRY
    from fixtures.engine.claim_session import ClaimSession
    from fixtures.engine.run_options import RunOptions

    spec = REGISTRY["tiny-vit-digits-softmax"]
    cache = tmp_path / "somewhere" / "cache"
    session = ClaimSession({spec.key: spec}, RunOptions(n_samples=4, seed=0, cache_dir=str(cache)))
    checkpoints = [(s, cache / "trained" / "abc" / f"step_{s:06d}.safetensors", {}) for s in (0, 45)]
    monkeypatch.setattr(session, "_trained", lambda s: SimpleNamespace(checkpoints=checkpoints))
    monkeypatch.setattr(session, "_trained_run", lambda s, index, tag="": f"run {index}")
    points = session.series(spec.key)
    assert [p.record_fields() for p in points] == [
        {"checkpoint": f"trained/abc/step_{s:06d}.safetensors", "checkpoint_base": "cache"}
        for s in (0, 45)]
    assert [p.run for p in points] == ["run 0", "run 1"]
    assert session.series(spec.key) is points  # kept under the series' name
