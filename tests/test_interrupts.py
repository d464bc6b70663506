"""Interruptions and concurrency: killed runs, Ctrl-C, a corrupted cache and two runs sharing one
cache, each on real ``pytest claims/`` subprocesses over a tiny random vit_tiny checkpoint
(``--layers 0 --heads 0 --n-samples 2``).

To interrupt a run at a known moment, the killed runs load a small plugin (written to a temporary
folder, passed with ``-p``) that pauses inside ``Cache.get_or_create`` right after an entry's
files were written into its temporary folder, before the manifest and the rename, which is the
moment a crash could do most harm, and drops a marker file. The test waits for the marker and
then sends the signal. Every other run is unmodified.

The unit tests of the cache itself (atomic entries, one build under concurrency, corruption) are
in tests/test_cache.py; these tests check that the whole suite keeps those promises.
"""

from __future__ import annotations

import html as htmllib
import importlib.util
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
import torch
from safetensors.torch import save_file

import fixtures  # noqa: F401  (torchvision shim before timm)
import timm

ROOT = Path(__file__).resolve().parent.parent
# one xdist worker builds the module fixtures (a checkpoint, reference runs) once
pytestmark = pytest.mark.xdist_group("interrupts")
RUN_TIMEOUT = 400
SLOW_PLUGIN = '''\
"""Pause in Cache.get_or_create after an entry's files are built (namespaces starting with
$KPCA_SLOW_NAMESPACE), append "built <namespace>" to $KPCA_SLOW_MARK, then sleep."""
import os
import time

from fixtures import cache

_get_or_create = cache.Cache.get_or_create


def get_or_create(self, namespace, key, build, info=None):
    if not namespace.startswith(os.environ["KPCA_SLOW_NAMESPACE"]):
        return _get_or_create(self, namespace, key, build, info)

    def paused(folder):
        extra = build(folder)
        with open(os.environ["KPCA_SLOW_MARK"], "a") as f:
            f.write(f"built {namespace}\\n")
        time.sleep(120)
        return extra

    return _get_or_create(self, namespace, key, paused, info)


cache.Cache.get_or_create = get_or_create
'''
V_TESTS = ["claims/test_value_vectors.py::test_value_vectors[checkpoint-tiny-L00-H0]",
           "claims/test_value_vectors.py::test_value_vectors_model[checkpoint-tiny]"]


# --------------------------------------------------------------------------------- helpers
@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """The tiny checkpoint and the pausing plugin, in one folder (the subprocesses' cwd)."""
    folder = tmp_path_factory.mktemp("interrupts")
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = timm.create_model("vit_tiny_patch16_224", pretrained=False)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()},
              str(folder / "tiny.safetensors"))
    (folder / "kpca_slow.py").write_text(SLOW_PLUGIN)
    return folder


def _command(workdir: Path, out: Path, cache: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "pytest", str(ROOT / "claims"), "--rootdir", str(ROOT),
            "-c", str(ROOT / "pyproject.toml"), "--checkpoint", str(workdir / "tiny.safetensors"),
            "--arch", "vit_tiny_patch16_224", "--layers", "0", "--heads", "0", "--n-samples", "2",
            "--out", str(out), "--cache-dir", str(cache), "--report", "none", *extra]


def _env(**extra: str) -> dict:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
            **extra}


def run_claims(workdir: Path, out: Path, cache: Path, *extra: str) -> subprocess.CompletedProcess:
    done = subprocess.run(_command(workdir, out, cache, *extra), cwd=workdir, env=_env(),
                          capture_output=True, text=True, timeout=RUN_TIMEOUT)
    assert done.returncode in (0, 1), (done.returncode, done.stdout[-3000:], done.stderr[-3000:])
    return done


def start_claims(workdir: Path, out: Path, cache: Path, *extra: str, pause_in: str | None = None):
    """Popen of a claims run; with ``pause_in`` it loads the pausing plugin for that namespace."""
    env = _env()
    if pause_in is not None:
        mark = out.with_name(out.name + ".mark")
        mark.unlink(missing_ok=True)
        env.update(KPCA_SLOW_NAMESPACE=pause_in, KPCA_SLOW_MARK=str(mark))
        extra = (*extra, "-p", "kpca_slow")
    # A shell that starts jobs in the background sets SIGINT to "ignored", which children inherit
    # and Python then keeps: give the run the default disposition, as a terminal's Ctrl-C finds it.
    return subprocess.Popen(_command(workdir, out, cache, *extra), cwd=workdir, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def wait_for_pause(proc: subprocess.Popen, out: Path, namespace: str) -> None:
    """Block until the pausing plugin reports ``namespace``; fail if the run ends first."""
    mark = out.with_name(out.name + ".mark")
    deadline = time.monotonic() + RUN_TIMEOUT
    while not (mark.exists() and f"built {namespace}" in mark.read_text()):
        if proc.poll() is not None:
            pytest.fail(f"the run ended (exit {proc.returncode}) before pausing in {namespace}:\n"
                        + proc.stdout.read()[-3000:])
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"no pause in {namespace} within {RUN_TIMEOUT} s")
        time.sleep(0.05)


def interrupt(proc: subprocess.Popen, sig: int) -> tuple[int, str]:
    proc.send_signal(sig)
    output, _ = proc.communicate(timeout=RUN_TIMEOUT)
    return proc.returncode, output


def results(out: Path) -> dict:
    return json.loads((out / "results.json").read_text())


def entries(cache: Path) -> dict[str, list[str]]:
    """Committed cache entries (folders holding entry.json) by namespace."""
    found: dict[str, list[str]] = {}
    for manifest in sorted(cache.glob("*/*/entry.json")):
        found.setdefault(manifest.parent.parent.name, []).append(manifest.parent.name)
    return found


def temporaries(cache: Path) -> list[Path]:
    """Temporary build folders (hidden siblings of the entries)."""
    return sorted(p for p in cache.glob("*/.*") if p.is_dir())


def assert_one_entry_each(cache: Path) -> None:
    """Two captures (the checkpoint's and its random-init twin's, which claim V reads: method
    §2.6) and one entry per claim (one layer was checked): each computed exactly once."""
    counts = {ns: len(keys) for ns, keys in entries(cache).items()}
    assert {"capture", "claim_E", "claim_J", "claim_V"} <= set(counts), counts
    assert counts.pop("capture") == 2 and set(counts.values()) == {1}, counts


def same_numbers(run: dict, reference: dict) -> None:
    """Records and model provenance identical to the reference run (dates and paths aside)."""
    assert run["records"] == reference["records"]
    assert run["models"] == reference["models"]
    assert run["complete"] and not run["not_run"]


@pytest.fixture(scope="module")
def reference(workdir, tmp_path_factory) -> dict:
    """A clean serial run (one thread: bitwise equal to one-thread xdist workers)."""
    out = tmp_path_factory.mktemp("reference")
    run_claims(workdir, out / "out", out / "cache", "--threads", "1")
    return {"results": results(out / "out"), "cache": out / "cache",
            "bytes": (out / "out" / "results.json").read_bytes()}


# ----------------------------------------------------------------------------------- tests
@pytest.mark.slow
def test_sigkill_mid_capture_and_mid_metrics_leaves_nothing_trusted(workdir, reference, tmp_path):
    """SIGKILL while the capture entry is being built, then while the first claim's metrics are:
    neither half-built entry is trusted, an earlier results.json is left untouched, and the next
    run finishes with exactly the numbers of a clean run."""
    out, cache = tmp_path / "out", tmp_path / "cache"
    out.mkdir()
    (out / "results.json").write_bytes(reference["bytes"])  # from an earlier run

    proc = start_claims(workdir, out, cache, "--threads", "1", pause_in="capture")
    wait_for_pause(proc, out, "capture")
    code, _ = interrupt(proc, signal.SIGKILL)
    assert code == -signal.SIGKILL
    assert entries(cache) == {}  # nothing committed ...
    (half,) = temporaries(cache)  # ... although the capture's files were all written
    assert half.parent.name == "capture"  # the run's one layer (--layers 0) was written
    assert sorted(p.name for p in half.glob("layer_*")) == ["layer_00.safetensors"]
    assert not (half / "entry.json").exists()
    assert (out / "results.json").read_bytes() == reference["bytes"]
    assert [p.name for p in out.iterdir()] == ["results.json"]  # no partial or temporary file

    proc = start_claims(workdir, out, cache, "--threads", "1", pause_in="claim_")
    wait_for_pause(proc, out, "claim_")
    code, _ = interrupt(proc, signal.SIGKILL)
    assert code == -signal.SIGKILL
    assert list(entries(cache)) == ["capture"]  # the capture finished this time, no claim did
    assert any(p.parent.name.startswith("claim_") for p in temporaries(cache))
    assert (out / "results.json").read_bytes() == reference["bytes"]

    run_claims(workdir, out, cache, "--threads", "1")
    same_numbers(results(out), reference["results"])
    assert_one_entry_each(cache)


def _load_cache_module():
    """fixtures/cache.py on its own (no torch import: the killed child starts in a blink)."""
    spec = importlib.util.spec_from_file_location("kpca_cache_alone", ROOT / "fixtures" / "cache.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_later_writer_removes_the_temporary_folder_of_a_killed_one(tmp_path):
    """A killed writer leaves its temporary folder behind (it may hold gigabytes of captures, and
    enforce_limit only evicts entries). The next writer of that key, holding its lock, can know
    no live writer owns it, and should remove it."""
    code = ("import sys, time, importlib.util\n"
            "spec = importlib.util.spec_from_file_location('c', sys.argv[1])\n"
            "c = importlib.util.module_from_spec(spec); spec.loader.exec_module(c)\n"
            "def build(folder):\n"
            "    (folder / 'data.bin').write_bytes(b'x' * 4096)\n"
            "    open(sys.argv[3], 'w').close()\n"
            "    time.sleep(60)\n"
            "c.Cache(sys.argv[2]).get_or_create('ns', 'k' * 64, build)\n")
    mark = tmp_path / "mark"
    child = subprocess.Popen([sys.executable, "-c", code, str(ROOT / "fixtures" / "cache.py"),
                              str(tmp_path / "cache"), str(mark)])
    deadline = time.monotonic() + 60
    while not mark.exists() and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    child.kill()
    child.wait(timeout=60)
    assert len(temporaries(tmp_path / "cache")) == 1
    cache = _load_cache_module().Cache(tmp_path / "cache")
    def build(folder: Path) -> None:
        (folder / "data.bin").write_bytes(b"y")

    folder = cache.get_or_create("ns", "k" * 64, build)
    assert (folder / "data.bin").read_bytes() == b"y"  # the lock was released by the kill
    assert temporaries(tmp_path / "cache") == []


def test_results_file_gets_the_usual_permissions(tmp_path):
    """The atomic rewrite must not change who can read results.json (CI artifacts, shared runs)."""
    from report.atomic import atomic_write_text

    umask = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "results.json", "{}")
    finally:
        os.umask(umask)
    assert (tmp_path / "results.json").stat().st_mode & 0o777 == 0o644


@pytest.mark.slow
def test_corrupt_cache_entries_are_recomputed_with_a_warning(workdir, reference, tmp_path):
    """Flip one byte in a captured layer and one in a claim's metrics: both entries fail their
    content hash, are recomputed with a warning naming them, and the numbers match a clean run."""
    cache = tmp_path / "cache"
    shutil.copytree(reference["cache"], cache)
    targets = [next(cache.glob("capture/*/layer_00.safetensors")),
               next(cache.glob("claim_V/*/metrics.safetensors"))]
    for path in targets:
        blob = bytearray(path.read_bytes())
        blob[-1] ^= 0xFF  # the last byte of the tensor data: still a valid safetensors file
        path.write_bytes(bytes(blob))
    done = run_claims(workdir, tmp_path / "out", cache, "--threads", "1")
    for path in targets:
        assert (f"cache entry {path.parent} is corrupt ({path} does not match its recorded hash); "
                "recomputing it") in " ".join(done.stdout.split()), done.stdout[-4000:]
    same_numbers(results(tmp_path / "out"), reference["results"])


@pytest.mark.slow
def test_two_concurrent_xdist_runs_share_one_cache(workdir, reference, tmp_path):
    """Two ``-n 2`` runs started together on one --cache-dir: both finish, with the serial run's
    numbers, and every entry was committed once, with no temporary folder left."""
    cache = tmp_path / "cache"
    procs = [start_claims(workdir, tmp_path / f"out{i}", cache, "-n", "2") for i in range(2)]
    outputs = [proc.communicate(timeout=RUN_TIMEOUT)[0] for proc in procs]
    for proc, output in zip(procs, outputs):
        assert proc.returncode in (0, 1), output[-3000:]
    for i in range(2):
        same_numbers(results(tmp_path / f"out{i}"), reference["results"])
    assert_one_entry_each(cache)
    assert temporaries(cache) == []


@pytest.mark.slow
def test_ctrl_c_writes_partial_results_and_the_report_says_what_is_missing(
        workdir, reference, tmp_path):
    """SIGINT while claim V's metrics are computed: claims E and J (run first) are kept with the
    clean run's numbers, the two V tests are listed under not_run, complete is false, the
    half-built V entry is cleaned up, and the report renders the partial file and names them."""
    out, cache = tmp_path / "out", tmp_path / "cache"
    proc = start_claims(workdir, out, cache, "--threads", "1", pause_in="claim_V")
    wait_for_pause(proc, out, "claim_V")
    code, output = interrupt(proc, signal.SIGINT)
    assert code == pytest.ExitCode.INTERRUPTED, output[-3000:]
    partial = results(out)
    assert partial["complete"] is False and partial["exit_status"] == 2
    assert partial["not_run"] == V_TESTS
    kept = [r for r in reference["results"]["records"] if r["claim"] != "V"]
    assert partial["records"] == kept and {r["claim"] for r in kept} >= {"E", "J"}
    assert "claim_V" not in entries(cache) and temporaries(cache) == []
    assert [p.name for p in out.iterdir()] == ["results.json"]  # written atomically: no temp left

    html = tmp_path / "report.html"
    done = subprocess.run([sys.executable, "-m", "report", str(out / "results.json"), "-o", str(html)],
                          cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    text = " ".join(htmllib.unescape(re.sub(r"<[^>]+>", " ", html.read_text())).split())
    assert "Partial run , exit status 2" in text
    assert "This is a partial run: the results are incomplete." in text
    assert "2 collected claim tests did not run (pytest exit status 2)" in text
    for node in V_TESTS:
        assert node in text


@pytest.mark.slow
@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["serial", "xdist"])
def test_sigterm_behaves_like_ctrl_c(workdir, reference, tmp_path, workers):
    """SIGTERM (a CI cancellation, a Slurm time limit) while claim V's metrics are computed: exit 2,
    one line saying so, and a partial results.json (complete: false, the finished records kept,
    the rest under not_run) that the report marks partial; serial and -n 2."""
    out, cache = tmp_path / "out", tmp_path / "cache"
    proc = start_claims(workdir, out, cache, *workers, pause_in="claim_V")
    wait_for_pause(proc, out, "claim_V")
    code, output = interrupt(proc, signal.SIGTERM)
    assert code == pytest.ExitCode.INTERRUPTED, output[-3000:]
    lines = [line for line in output.splitlines() if line.startswith("kpca-claims: SIGTERM")]
    assert lines == ["kpca-claims: SIGTERM received: stopping as for Ctrl-C; results.json will hold "
                     "what finished (complete: false), exit 2"], output[-3000:]
    partial = results(out)
    assert partial["complete"] is False and partial["exit_status"] == 2
    assert partial["interrupted_by"] == "SIGTERM"
    assert set(V_TESTS) <= set(partial["not_run"])
    kept = {r["test_id"]: r for r in reference["results"]["records"]}
    assert partial["records"] and all(kept[r["test_id"]] == r for r in partial["records"])
    assert not {r["claim"] for r in partial["records"]} & {"V"}
    done = subprocess.run([sys.executable, "-m", "report", str(out / "results.json"), "-o",
                           str(tmp_path / "report.html")], cwd=ROOT, env=_env(),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "This is a partial run: the results are incomplete." in " ".join(
        htmllib.unescape(re.sub(r"<[^>]+>", " ", (tmp_path / "report.html").read_text())).split())


# ------------------------------------------------------- faults of the machine (real small disks)
@pytest.fixture
def small_disk(tmp_path):
    """``small_disk(size)`` mounts a tmpfs of ``size`` (e.g. "300k") and returns its folder;
    needs root and mount(8) (skipped elsewhere: tests/test_bad_inputs.py simulates these faults)."""
    mounted = []

    def mount(size: str) -> Path:
        folder = tmp_path / f"disk{len(mounted)}"
        folder.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip()})")
        mounted.append(folder)
        return folder

    yield mount
    for folder in mounted:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def _claims_exit(workdir, out, cache, *extra) -> subprocess.CompletedProcess:
    return subprocess.run(_command(workdir, out, cache, *extra), cwd=workdir, env=_env(),
                          capture_output=True, text=True, timeout=RUN_TIMEOUT)


@pytest.mark.parametrize("option", ["--cache-dir", "--out"])
def test_a_full_small_disk_stops_at_startup(workdir, tmp_path, small_disk, option):
    """--cache-dir or --out on a 300 KB disk: exit 4 before any test, one sentence with the free
    space and the need; nothing written (before: exit 1 and `complete: true` with no records)."""
    disk = small_disk("300k")
    out, cache = tmp_path / "out", tmp_path / "cache"
    if option == "--out":
        out = disk / "out"
    else:
        cache = disk / "cache"
    done = _claims_exit(workdir, out, cache)
    assert done.returncode == 4, (done.stdout[-2000:], done.stderr[-2000:])
    need = "64.0 MiB" if option == "--cache-dir" else "4.0 MiB"
    remedy = "give another folder with --cache-dir" if option == "--cache-dir" else "give another folder"
    value = cache if option == "--cache-dir" else out
    assert done.stderr.strip() == (f"ERROR: {option} {value}: the disk of {disk} has only 300.0 KiB "
                                   f"free, the run needs at least {need}; free space or {remedy}")
    assert list(disk.iterdir()) == [] and not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.parametrize("workers", [["--threads", "1"], ["-n", "2"]], ids=["serial", "xdist"])
def test_disk_full_midway_is_a_fault_not_a_verdict(workdir, tmp_path, small_disk, workers):
    """The cache disk fills up during the capture (65 MiB, 16 samples of 12 layers need more; a
    run captures only its --layers, so all are asked for): exit 7, one paragraph naming the fault
    and where, no traceback, and results.json says complete: false with the error, every test
    under not_run."""
    disk = small_disk("65m")
    out = tmp_path / "out"
    done = _claims_exit(workdir, out, disk / "cache", "--n-samples", "16", "--layers", "0-11",
                        *workers)
    assert done.returncode == 7, (done.stdout[-3000:], done.stderr[-3000:])
    assert "Traceback" not in done.stdout + done.stderr
    (paragraph,) = [line for line in done.stdout.splitlines() if line.startswith("FAULT")]
    assert paragraph.startswith("FAULT (exit 7, not a verdict): environment fault ")
    assert "No space left on device" in paragraph and "fixtures/models/capture_batches.py" in paragraph
    assert f"free space on the disk of the cache folder {disk / 'cache'}" in paragraph
    partial = results(out)
    assert partial["complete"] is False and partial["exit_status"] == 7
    # every test not run: V, γ and J of each of the 12 layers, and the 3 model-level tests
    assert partial["records"] == [] and len(partial["not_run"]) == 12 * 3 + 3
    assert partial["errors"][0]["kind"] == "environment"


@pytest.mark.slow
def test_a_read_only_complete_cache_is_used(workdir, reference, tmp_path, small_disk):
    """A complete cache on a read-only file system: the run reads it and gives the clean run's
    records (no lock file, no LRU touch needed)."""
    disk = small_disk("200m")
    shutil.copytree(reference["cache"], disk / "cache")
    done = subprocess.run(["mount", "-o", "remount,ro", str(disk)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    run = _claims_exit(workdir, tmp_path / "out", disk / "cache", "--threads", "1")
    assert run.returncode in (0, 1), (run.stdout[-3000:], run.stderr[-3000:])
    same_numbers(results(tmp_path / "out"), reference["results"])


# ------------------------------------------------- every edge of the run inside the fault handling
@pytest.mark.slow
def test_ctrl_c_before_the_first_test_finishes_still_writes_the_report(workdir, tmp_path):
    """SIGINT while the capture is built (no test has finished, no record exists): exit 2, a
    results.json listing every test under not_run, and a report.html that says it is partial
    (before: no report.html, although the run promised a "Partial run" page)."""
    out, cache = tmp_path / "out", tmp_path / "cache"
    proc = start_claims(workdir, out, cache, "--threads", "1", "--report",
                        str(out / "report.html"), pause_in="capture")
    wait_for_pause(proc, out, "capture")
    code, output = interrupt(proc, signal.SIGINT)
    assert code == 2, output[-3000:]
    partial = results(out)
    assert partial["records"] == [] and partial["complete"] is False and len(partial["not_run"]) == 6
    page = " ".join(htmllib.unescape(re.sub(r"<[^>]+>", " ", (out / "report.html").read_text())).split())
    assert "Partial run , exit status 2." in page and "This is a partial run" in page
    assert sorted(p.name for p in out.iterdir()) == ["report.html", "results.json"]


FILL_PLUGIN = '''\
"""Fill the disk of $KPCA_FILL (a small tmpfs) once the run has started: the pre-flight found
enough space, the end of the run finds none."""
import os


def pytest_sessionstart(session):
    with open(os.environ["KPCA_FILL"], "wb") as f:
        try:
            while True:
                f.write(b"\\0" * 65536)
                f.flush()
        except OSError:
            pass
'''


@pytest.mark.slow
def test_a_disk_that_fills_up_before_the_samples_are_written_is_a_fault(workdir, tmp_path,
                                                                        small_disk):
    """--save-samples and --update-baseline with --out on a 6 MiB tmpfs that fills up during the
    run: exit 7 with the FAULT paragraph naming samples.jsonl, no traceback, the results in the
    fallback file (samples: null, the error under errors), no temporary file left on the disk or
    in the temporary folder, no baseline written (before: a 76-line traceback, exit 1, a 0-byte
    samples.jsonl, no results.json anywhere, a stray kpca-samples-*.jsonl in /tmp)."""
    disk = small_disk("6m")
    out, tmp = disk / "out", tmp_path / "tmp"
    tmp.mkdir()
    (tmp_path / "kpca_fill.py").write_text(FILL_PLUGIN)
    env = {**_env(KPCA_FILL=str(disk / "filler"), TMPDIR=str(tmp)),
           "PYTHONPATH": os.pathsep.join((str(tmp_path), _env()["PYTHONPATH"]))}
    done = subprocess.run(_command(workdir, out, tmp_path / "cache", "--threads", "1",
                                   "--save-samples", "--update-baseline", "--baseline",
                                   str(disk / "baseline.json"), "-p", "kpca_fill"),
                          cwd=workdir, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT)
    text = done.stdout + done.stderr
    assert done.returncode == 7, text[-4000:]
    assert "Traceback" not in text and "INTERNALERROR" not in text
    paragraphs = [line for line in done.stdout.splitlines() if line.startswith("FAULT (exit 7")]
    assert any(f"while writing {out / 'samples.jsonl'} at the end of the run" in p and
               "No space left on device" in p for p in paragraphs), paragraphs
    fallback = list(tmp.glob("kpca-claims-*-results.json"))
    written = fallback[0] if fallback else out / "results.json"
    data = json.loads(written.read_text())
    assert data["complete"] is False and data["exit_status"] == 7 and data["samples"] is None
    assert any(e["where"] == str(out / "samples.jsonl") and "No space left" in e["error"]
               for e in data["errors"])
    assert len(data["records"]) == 6  # every verdict kept
    assert not (disk / "baseline.json").exists()
    left = sorted(p.name for p in out.iterdir()) if out.exists() else []
    assert not [n for n in left if n.endswith(".tmp") or n == "samples.jsonl"], left
    assert [p.name for p in tmp.iterdir()] == [p.name for p in fallback]  # nothing else in TMPDIR
