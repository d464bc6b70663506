"""The cluster path on a real single-node Slurm (scripts/local-slurm.sh): docs/cluster.md's
commands run word for word from another folder, the merged results against one unsharded run,
and a run under a time limit with a shard cancelled while it runs.

Skipped, with the reason, where Slurm is not installed (``bash scripts/local-slurm.sh install``;
CI installs it) or the tests do not run as root (the daemons need it). Daemons this test starts
it stops by their PIDs. Measured (2-core machine shared with other jobs, `-n 2`): 266 s for both
tests at load ~6 (118 s the docs commands + reference run + rerun, 110 s the time limit +
scancel), 339 s at load ~14 (145 s, 91 s)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "slurm-shards.sh"
LOCAL = ROOT / "scripts" / "local-slurm.sh"
PID_FILES = (Path("/run/slurm/slurmd.pid"), Path("/run/slurm/slurmctld.pid"),
             Path("/run/munge/munged.pid"))
JOBCOMP = Path("/var/log/slurm/jobcomp.log")
pytestmark = pytest.mark.xdist_group("real-slurm")  # one worker starts and stops the daemons
SELECTION = ("--models", "random-vit_tiny_patch16_224,random-bert-minilm-shape", "--layers", "0",
             "--heads", "0,1", "--n-samples", "4", "--threads", "1")


def _alive(pid_file: Path) -> int | None:
    try:
        pid = int(pid_file.read_text().strip())
        os.kill(pid, 0)
        return pid
    except (OSError, ValueError):
        return None


@pytest.fixture(scope="module")
def slurm():
    missing = [t for t in ("sbatch", "squeue", "scancel", "slurmctld", "slurmd", "munged")
               if shutil.which(t) is None and not Path("/usr/sbin", t).exists()]
    require = os.environ.get("KPCA_REQUIRE_SLURM") == "1"  # CI: a skip would hide the test
    if missing:
        (pytest.fail if require else pytest.skip)(f"Slurm is not installed here (no {', '.join(missing)}): "
                    "`bash scripts/local-slurm.sh install` installs it (CI does)")
    before = {f: _alive(f) for f in PID_FILES}
    if not all(before.values()) and os.geteuid() != 0:
        (pytest.fail if require else pytest.skip)("starting the Slurm daemons needs root (scripts/local-slurm.sh start)")
    started = subprocess.run(["bash", str(LOCAL), "start"], capture_output=True, text=True,
                             timeout=120)
    assert started.returncode == 0, started.stdout + started.stderr
    ours = {f: _alive(f) for f in PID_FILES if not before[f]}
    try:
        yield
    finally:  # stop what this test started, by PID, slurmd first
        for f, pid in ours.items():
            if pid is None:
                continue
            os.kill(pid, signal.SIGTERM)
            for _ in range(50):
                try:
                    os.kill(pid, 0)
                except OSError:
                    break
                time.sleep(0.2)


def _doc_block() -> str:
    """The "Try it on one machine" commands of docs/cluster.md."""
    text = (ROOT / "docs" / "cluster.md").read_text()
    part = text.split("### Try it on one machine", 1)[1]
    return re.search(r"```bash\n(.*?)```", part, re.S).group(1)


def _jobs() -> dict[str, dict]:
    """JobId (array tasks as JOB_K) → the fields of its line in the job completion file."""
    out = {}
    for line in JOBCOMP.read_text().splitlines() if JOBCOMP.exists() else []:
        fields = dict(re.findall(r"(\w+)=(\S*)", line))
        key = (f"{fields['ArrayJobId']}_{fields['ArrayTaskId']}" if fields.get("ArrayTaskId")
               else fields.get("JobId"))
        out[key] = fields
    return out


def _wait(job_ids: list[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        queued = subprocess.run(["squeue", "-h", "-j", ",".join(job_ids), "-o", "%i"],
                                capture_output=True, text=True).stdout.strip()
        if not queued:
            return
        time.sleep(2)
    pytest.fail(f"jobs {job_ids} still queued after {timeout} s: {queued}")


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "KPCA_", "PYTEST_"))}
    return {**env, **extra}


def test_docs_commands_on_a_real_slurm_merge_to_one_runs_results(slurm, tmp_path, request):
    user = tmp_path / "user"  # the folder the user submits from: not the checkout
    user.mkdir()
    block = _doc_block()
    assert " ".join(SELECTION) in block, "docs/cluster.md's selection is the one compared here"
    lines = [ln for ln in block.splitlines()
             if "local-slurm.sh" not in ln and not ln.startswith("export KPCA_ROOT")]
    first = max(_jobs(), key=lambda j: int(j.split("_")[0]), default="0").split("_")[0]
    # one unsharded run, same options and threads, another cache folder (beside the Slurm jobs)
    single = tmp_path / "single"
    python = ROOT / ".venv" / "bin" / "python"
    ref = subprocess.Popen(
        [str(python) if python.exists() else sys.executable, "-m", "pytest", "claims/",
         *SELECTION, "--out", str(single), "-q", "-p", "no:cacheprovider"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=_env(KPCA_CACHE=str(tmp_path / "cache-b")))
    request.addfinalizer(lambda: ref.poll() is None and (ref.kill(), ref.wait()))
    t0 = time.monotonic()
    done = subprocess.run(["bash", "-e", "-c", "\n".join(lines)], cwd=user,
                          capture_output=True, text=True, timeout=600,
                          env=_env(KPCA_ROOT=str(ROOT), KPCA_CACHE=str(tmp_path / "cache-a")))
    took = time.monotonic() - t0
    assert done.returncode == 0, done.stdout + done.stderr
    assert "merged run complete" in done.stdout, done.stdout
    run = user / "kpca-run"
    match = re.search(r"array job (\d+) \(2 shards\) and merge job (\d+)", done.stdout)
    assert match, done.stdout
    array, merge = match.groups()
    assert int(array) > int(first)
    # every job a success: the shards' refuted claims are findings (pytest exit 1 → job exit 0)
    jobs = _jobs()
    for key in (f"{array}_1", f"{array}_2", merge):
        assert jobs[key]["JobState"] == "COMPLETED" and jobs[key]["ExitCode"] == "0:0", jobs[key]
        assert jobs[key]["WorkDir"] == str(ROOT)  # --chdir to the checkout
    assert jobs[merge]["Tres"].startswith("cpu=1,mem=2G")  # the merge asks for little
    logs = sorted(p.name for p in (run / "logs").iterdir())
    assert logs == [f"merge.{merge}.out", f"shard-1.{array}.out", f"shard-2.{array}.out"]
    for k in (1, 2):
        text = (run / "logs" / f"shard-{k}.{array}.out").read_text()
        assert "some claims are not supported (a finding" in text and "job exit 0" in text
    merged = _load(run / "merged" / "results.json")
    shard_results = [_load(run / f"shard-{k}" / "results.json") for k in (1, 2)]
    run_id = merged["provenance"]["run_id"]
    assert run_id and all(s["provenance"]["run_id"] == run_id for s in shard_results)
    assert all(s["exit_status"] == 1 for s in shard_results)  # refuted claims: the finding

    output, _ = ref.communicate(timeout=600)
    assert ref.returncode == 1, output[-3000:]
    one = _load(single / "results.json")
    assert merged["complete"] and one["complete"]
    assert merged["records"] == one["records"]  # bitwise: JSON floats written by repr
    assert merged["models"] == one["models"]
    assert merged["summary"] == one["summary"] and merged["not_run"] == one["not_run"] == []
    assert merged["exit_status"] == one["exit_status"] == 1
    print(f"docs commands on Slurm: {took:.0f} s (array of 2 + merge)")

    # docs/cluster.md's rerun recipe: shard 2 again (a one-task array: KPCA_SHARDS wins over
    # SLURM_ARRAY_TASK_COUNT 1), then a new merge of the same run
    t0 = time.monotonic()
    again = subprocess.run(["bash", str(SCRIPT), "rerun", "2"], cwd=user, capture_output=True,
                           text=True, timeout=120, env=_env(KPCA_RUN_DIR=str(run)))
    assert again.returncode == 0, again.stdout + again.stderr
    jid, mid = re.search(r"as job (\d+), merge job (\d+)", again.stdout).groups()
    _wait([jid, mid], timeout=400)
    jobs = _jobs()
    assert jobs[f"{jid}_2"]["JobState"] == jobs[mid]["JobState"] == "COMPLETED", jobs[mid]
    rerun_log = (run / "logs" / f"shard-2.{jid}.out").read_text()
    assert "shard 2/2: finished" in rerun_log, rerun_log[-2000:]
    remerged = _load(run / "merged" / "results.json")
    assert remerged["complete"] and remerged["records"] == one["records"]
    assert remerged["provenance"]["run_id"] == run_id
    print(f"rerun of shard 2 and merge: {time.monotonic() - t0:.0f} s")


def test_time_limit_and_scancel_leave_partial_shards_and_a_merge_that_names_them(slurm, tmp_path):
    # a plugin that holds the first claim test of each shard until Slurm stops it
    plugin = tmp_path / "plugins" / "hold_first_test.py"
    plugin.parent.mkdir()
    plugin.write_text(
        "import os, pathlib, time\n"
        "def pytest_runtest_call(item):\n"
        "    pathlib.Path(os.environ['KPCA_RUN_DIR'], 'started-' + os.environ['SLURM_ARRAY_TASK_ID']).touch()\n"
        "    time.sleep(900)\n")
    run = tmp_path / "limited"
    env = _env(KPCA_RUN_DIR=str(run), KPCA_CACHE=str(tmp_path / "cache"),
               PYTHONPATH=str(plugin.parent))
    t0 = time.monotonic()
    done = subprocess.run(["bash", str(SCRIPT), "submit", "--sbatch", "--time=1", "2", *SELECTION,
                           "-p", "hold_first_test"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    array, merge = re.search(r"array job (\d+) \(2 shards\) and merge job (\d+)", done.stdout).groups()
    deadline = time.monotonic() + 300
    while not (run / "started-2").exists():  # shard 2 is running its first claim test
        assert time.monotonic() < deadline, "shard 2 never started a test"
        time.sleep(1)
    subprocess.run(["scancel", f"{array}_2"], check=True, timeout=30)
    _wait([array, merge], timeout=400)
    took = time.monotonic() - t0
    jobs = _jobs()
    assert jobs[f"{array}_1"]["JobState"] == "TIMEOUT", jobs[f"{array}_1"]
    assert jobs[f"{array}_2"]["JobState"] == "CANCELLED", jobs[f"{array}_2"]
    for k in (1, 2):  # each shard wrote what finished: nothing, clearly partial
        log = run / "logs" / f"shard-{k}.{array}.out"
        assert (run / f"shard-{k}" / "results.json").is_file(), (
            f"shard {k} left no results.json (stopped before its first test, or killed before "
            f"the write?); its log ends: {log.read_text()[-2000:] if log.exists() else 'no log'}")
        res = _load(run / f"shard-{k}" / "results.json")
        assert res["complete"] is False and res["interrupted_by"] == "SIGTERM"
        assert res["exit_status"] == 2 and res["not_run"], res["not_run"]
        log = log.read_text()
        assert "Traceback" not in log and "SIGTERM received" in log, log[-3000:]
    # the merge ran (afterany), merged both partial shards, said why in its log, exit 2
    merge_log = (run / "logs" / f"merge.{merge}.out").read_text()
    assert jobs[merge]["JobState"] == "FAILED" and jobs[merge]["ExitCode"] == "2:0", \
        (jobs[merge], merge_log[-2000:])  # 4 would be a refusal: the log says which shard
    line = next(x for x in merge_log.splitlines() if x.startswith("partial merge"))
    assert "Shard 1/2" in line and "Shard 2/2" in line and "stopped by SIGTERM" in line, line
    merged = _load(run / "merged" / "results.json")
    assert merged["complete"] is False
    html = (run / "merged" / "report.html").read_text()
    assert "Shard 1/2" in html and "Shard 2/2" in html and "(unknown model)" not in html
    assert "before collection finished" not in html
    print(f"time limit + scancel on Slurm: {took:.0f} s")
