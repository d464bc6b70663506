"""The on-disk cache: atomic entries, one build under concurrency, corruption, size limit."""

import json
import multiprocessing as mp
import time
from pathlib import Path

import pytest

from fixtures.cache import Cache, stable_hash
from report.atomic import atomic_write_text


def _write(folder: Path, text: str = "payload") -> dict:
    (folder / "data.txt").write_text(text)
    return {"n": 1}


def test_get_or_create_builds_once_and_verifies(tmp_path):
    cache = Cache(tmp_path)
    calls = []
    build = lambda f: (calls.append(1), _write(f))[1]  # noqa: E731
    first = cache.get_or_create("ns", "k1", build, info={"what": "test"})
    second = cache.get_or_create("ns", "k1", build)
    assert first == second and len(calls) == 1
    meta = json.loads((first / "entry.json").read_text())
    assert meta["info"] == {"what": "test", "n": 1}
    assert set(meta["files"]) == {"data.txt"}


def test_failed_build_leaves_nothing_trusted(tmp_path):
    cache = Cache(tmp_path)

    def broken(folder: Path):
        (folder / "data.txt").write_text("half")
        raise KeyboardInterrupt  # as if the run was killed mid-write

    with pytest.raises(KeyboardInterrupt):
        cache.get_or_create("ns", "k", broken)
    assert cache.lookup("ns", "k") is None
    assert not any(p.name.startswith(".k") for p in (tmp_path / "ns").iterdir())
    assert cache.get_or_create("ns", "k", _write).joinpath("data.txt").read_text() == "payload"


def test_incomplete_folder_without_manifest_is_not_trusted(tmp_path):
    cache = Cache(tmp_path)
    stale = cache.entry_dir("ns", "k")
    stale.mkdir(parents=True)
    (stale / "data.txt").write_text("from a killed run")
    assert cache.lookup("ns", "k") is None
    folder = cache.get_or_create("ns", "k", _write)
    assert (folder / "data.txt").read_text() == "payload"


def test_corrupt_entry_is_recomputed_with_warning(tmp_path):
    cache = Cache(tmp_path)
    folder = cache.get_or_create("ns", "k", _write)
    (folder / "data.txt").write_text("tampered")
    with pytest.warns(UserWarning, match="corrupt"):
        assert cache.lookup("ns", "k") is None
    assert (cache.get_or_create("ns", "k", _write) / "data.txt").read_text() == "payload"


def _concurrent_build(root: str, log: str) -> str:
    def build(folder: Path):
        with open(log, "a") as f:
            f.write("built\n")
        time.sleep(0.5)
        return _write(folder)

    return str(Cache(root).get_or_create("ns", "shared", build))


def test_two_processes_build_an_entry_once(tmp_path):
    log = tmp_path / "log.txt"
    ctx = mp.get_context("spawn")
    with ctx.Pool(2) as pool:
        folders = pool.starmap(_concurrent_build, [(str(tmp_path / "c"), str(log))] * 2)
    assert folders[0] == folders[1]
    assert log.read_text().count("built") == 1


def test_size_limit_evicts_least_recently_used(tmp_path):
    cache = Cache(tmp_path, max_bytes=2500)
    for i in range(3):
        cache.get_or_create("ns", f"k{i}", lambda f: _write(f, "x" * 1000))
        time.sleep(0.02)
    keys = sorted(p.name for p in cache.entries())
    assert "k2" in keys and "k0" not in keys
    assert cache.size_bytes() <= 2500 + 3000  # manifests are small
    from fixtures.cache_cli import clear_cache

    assert clear_cache(cache.root)[0] > 0 and cache.entries() == []


def test_stable_hash_is_order_independent_and_atomic_write(tmp_path):
    assert stable_hash({"a": 1, "b": [1, 2]}) == stable_hash({"b": [1, 2], "a": 1})
    assert stable_hash({"a": 1}) != stable_hash({"a": 2})
    target = tmp_path / "sub" / "r.json"
    atomic_write_text(target, "{}")
    assert target.read_text() == "{}" and list(target.parent.iterdir()) == [target]


def test_scans_tolerate_folders_vanishing_underneath(tmp_path):
    """Workers rename and delete temporary folders while another measures the cache (a real
    race seen under -n 2): size and entry scans must skip what vanishes, never raise."""
    import threading

    cache = Cache(tmp_path)
    cache.get_or_create("ns", "kept", _write)
    stop = threading.Event()

    def churn():
        i = 0
        while not stop.is_set():
            d = tmp_path / "ns" / f".tmp{i}"
            d.mkdir()
            (d / "f").write_text("x" * 100)
            d.rename(tmp_path / "ns" / f".gone{i}")
            for p in (tmp_path / "ns" / f".gone{i}").iterdir():
                p.unlink()
            (tmp_path / "ns" / f".gone{i}").rmdir()
            i += 1

    worker = threading.Thread(target=churn)
    worker.start()
    try:
        for _ in range(300):
            assert cache.size_bytes() >= 7
            assert [p.name for p in cache.entries()] == ["kept"]
    finally:
        stop.set()
        worker.join()


def test_cache_entries_and_atomic_files_follow_the_umask(tmp_path):
    """A cache filled by one user of a group is readable (and its locks usable) by the others:
    entry folders get 0777 less the umask (mkdtemp's 0700 before), their files 0666 less the
    umask, and a set-group-ID cache folder passes its group bit on (README, "Sharing a cache")."""
    import os
    import stat

    from fixtures.cache import Cache
    from report.atomic import atomic_open

    root = tmp_path / "shared"
    root.mkdir()
    os.chmod(root, 0o2775)
    old = os.umask(0o002)
    try:
        def build(folder):
            (folder / "data.bin").write_bytes(b"x")

        entry = Cache(root).get_or_create("capture", "k" * 64, build)
        with atomic_open(tmp_path / "samples.jsonl") as f:
            f.write("{}\n")
    finally:
        os.umask(old)
    mode = entry.stat().st_mode
    assert stat.S_IMODE(mode) & 0o777 == 0o775 and mode & stat.S_ISGID
    for path in (entry / "data.bin", entry / "entry.json", Path(str(entry) + ".lock"),
                 tmp_path / "samples.jsonl"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o664, path
    assert stat.S_IMODE(entry.parent.stat().st_mode) & 0o777 == 0o775


# ------------------------------------------------------------- keys that follow the code, not its prose
def _project_copy(tmp_path, monkeypatch):
    """A throw-away checkout holding two modules: ``checks/formula.py`` (a docstring, a comment and
    one formula) and ``claims/uses.py``, which imports it inside a function."""
    import fixtures

    root = tmp_path / "checkout"
    for pkg in ("checks", "claims"):
        (root / pkg).mkdir(parents=True)
        (root / pkg / "__init__.py").write_text("")
    (root / "checks" / "formula.py").write_text(
        '"""The formula of a metric."""\n\n\ndef metric(x):\n'
        '    """Twice x (the metric of eq. 0)."""\n    return 2 * x  # eq. 0\n')
    (root / "claims" / "uses.py").write_text(
        "def run(x):\n    from checks.formula import metric\n\n    return metric(x)\n")
    monkeypatch.setattr(fixtures, "ROOT", root)
    return root


def _key(*modules):
    from fixtures import cache

    cache._fingerprint.cache_clear()
    return cache.code_fingerprint(*modules)


def test_a_docstring_or_comment_edit_keeps_the_metric_cache_valid(tmp_path, monkeypatch):
    root = _project_copy(tmp_path, monkeypatch)
    before = _key("claims.uses")
    formula = root / "checks" / "formula.py"
    text = formula.read_text()
    formula.write_text(text.replace("The formula of a metric.", "The formula of one metric (typo fixed).")
                       .replace("Twice x (the metric of eq. 0).", "Two times x, eq. 0.")
                       .replace("# eq. 0", "# eq. (0)"))
    assert formula.read_text() != text
    assert _key("claims.uses") == before


def test_a_formula_edit_invalidates_the_keys_that_depend_on_it(tmp_path, monkeypatch):
    root = _project_copy(tmp_path, monkeypatch)
    before, alone = _key("claims.uses"), _key("claims")
    formula = root / "checks" / "formula.py"
    formula.write_text(formula.read_text().replace("return 2 * x", "return 3 * x"))
    # the module that imports the formula (inside a function) gets a new key ...
    assert _key("claims.uses") != before
    # ... and a module that does not import it keeps its own
    assert _key("claims") == alone


def test_code_fingerprint_names_what_it_cannot_find(tmp_path, monkeypatch):
    _project_copy(tmp_path, monkeypatch)
    with pytest.raises(ValueError, match="'checks.nothing_here' is neither a project module"):
        _key("checks.nothing_here")


def test_the_capture_key_covers_the_model_side_by_its_imports():
    """The capture key's module list is derived from the imports: the loaders, every model
    family, the inputs and the trained models' code are in it; the claim math is not."""
    from fixtures.cache import _closure
    from fixtures.engine.model_run import CAPTURE_MODULES

    covered = set(_closure(CAPTURE_MODULES))
    assert {"fixtures.models.capture", "fixtures.models.families.timm_vit",
            "fixtures.models.families.hf_bert", "fixtures.models.checkpoints",
            "fixtures.inputs.images", "fixtures.inputs.texts", "fixtures.training.model"} <= covered
    assert not any(name.startswith(("claims", "fixtures.engine", "fixtures.plugin"))
                   for name in covered)


def test_size_limit_counts_own_writes_and_measures_again_when_stale(tmp_path, monkeypatch):
    """After a write the cache is measured whole only when this process's running count passes
    the limit or is older than RESCAN_SECONDS; what another process wrote meanwhile is evicted
    at the next measurement."""
    from fixtures import cache as cache_module

    calls = []
    cache = Cache(tmp_path, max_bytes=2500)
    real = cache.enforce_limit
    monkeypatch.setattr(cache, "enforce_limit", lambda keep=None: calls.append(keep) or real(keep))
    cache.get_or_create("ns", "k0", lambda f: _write(f, "x" * 100))
    cache.get_or_create("ns", "k1", lambda f: _write(f, "x" * 100))
    assert len(calls) == 1  # the first write measures; the second is counted
    other = Cache(tmp_path, max_bytes=2500)  # another process fills the cache past the limit
    for i in range(3):
        time.sleep(0.02)
        other.get_or_create("ns", f"o{i}", lambda f: _write(f, "x" * 1000))
    cache.get_or_create("ns", "k2", lambda f: _write(f, "x" * 100))
    assert len(calls) == 1 and cache.size_bytes() > 2500  # not yet seen by this process
    monkeypatch.setattr(cache_module, "RESCAN_SECONDS", 0.0)
    cache.get_or_create("ns", "k3", lambda f: _write(f, "x" * 100))
    assert len(calls) == 2 and cache.size_bytes() <= 2500 + 3000
    assert "k0" not in {p.name for p in cache.entries()}  # the least recently used went first
    cache.get_or_create("ns", "k4", lambda f: _write(f, "x" * 3000))  # its own write passes it
    assert len(calls) == 3


# ------------------------------------------------- a cache that deletes and serves only its own
def _cache_command(*args: str):
    import subprocess
    import sys

    from fixtures import ROOT

    return subprocess.run([sys.executable, "-m", "fixtures.cache", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_clear_refuses_a_folder_that_is_not_a_cache(tmp_path):
    """`clear` of a folder with no marker and no entries: one sentence, exit 4, nothing gone."""
    folder = tmp_path / "mine"
    (folder / "sub").mkdir(parents=True)
    (folder / "important.txt").write_text("keep")
    (folder / "sub" / "data.csv").write_text("1,2")
    done = _cache_command("clear", "--cache-dir", str(folder))
    assert done.returncode == 4, done
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert "is not a kpca-claims cache" in done.stderr and "nothing was deleted" in done.stderr
    assert (folder / "important.txt").read_text() == "keep"
    assert (folder / "sub" / "data.csv").read_text() == "1,2"


def test_clear_of_a_regular_file_is_one_sentence_not_a_traceback(tmp_path):
    plain = tmp_path / "plain.txt"
    plain.write_text("keep")
    done = _cache_command("clear", "--cache-dir", str(plain))
    assert done.returncode == 4, done
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert "is a file, not a cache folder" in done.stderr
    assert plain.read_text() == "keep"


def test_clear_removes_a_marked_cache_and_keeps_what_is_not_its_own(tmp_path):
    from fixtures.cache import MARKER

    root = tmp_path / "cache"
    Cache(root).get_or_create("capture", "k" * 64, _write)
    assert (root / MARKER).is_file()  # written when the cache made its folder
    (root / "notes.txt").write_text("mine")
    done = _cache_command("clear", "--cache-dir", str(root))
    assert done.returncode == 0, done
    assert "kept 1 that are not the cache's: notes.txt" in done.stdout
    assert sorted(p.name for p in root.iterdir()) == ["notes.txt"]
    (root / "notes.txt").unlink()
    Cache(root).get_or_create("claim_V", "k" * 64, _write)
    assert _cache_command("clear", "--cache-dir", str(root)).returncode == 0
    assert not root.exists()


def test_clear_recognises_a_cache_made_before_the_marker_by_its_layout(tmp_path):
    from fixtures.cache import MARKER

    root = tmp_path / "cache"
    Cache(root).get_or_create("capture", "k" * 64, _write)
    (root / MARKER).unlink()  # as an earlier version left it
    done = _cache_command("clear", "--cache-dir", str(root))
    assert done.returncode == 0, done
    assert not root.exists()


def test_clear_refuses_a_cache_in_use_by_a_run_and_deletes_nothing(tmp_path):
    """A process using the cache holds a shared lock on it: `clear` beside a live run refuses in
    one sentence (exit 4) instead of deleting its entries beneath it (before: the run ended in
    tracebacks, exit 3); once the run has ended, it clears."""
    root = tmp_path / "cache"
    run = Cache(root)  # as a run's session holds it
    run.get_or_create("capture", "k" * 64, _write)
    done = _cache_command("clear", "--cache-dir", str(root))
    assert done.returncode == 4, done
    assert done.stderr.count("\n") == 1 and "is in use by a running kpca-claims run" in done.stderr
    assert run.lookup("capture", "k" * 64) is not None
    del run  # the run ends
    assert _cache_command("clear", "--cache-dir", str(root)).returncode == 0
    assert not root.exists()


def test_a_folder_holding_other_files_is_never_marked_as_a_cache(tmp_path):
    from fixtures.cache import MARKER

    root = tmp_path / "mine"
    root.mkdir()
    (root / "important.txt").write_text("keep")
    Cache(root).get_or_create("capture", "k" * 64, _write)
    assert not (root / MARKER).exists()
    assert _cache_command("clear", "--cache-dir", str(root)).returncode == 0  # entries: a cache
    assert sorted(p.name for p in root.iterdir()) == ["important.txt"]


def test_an_entry_with_a_file_its_record_does_not_list_is_never_read(tmp_path):
    """A forged entry: a file's line removed from entry.json and the file replaced. The entry is
    not used (recomputed with a warning), and read_verified never reads an unlisted file."""
    from fixtures.cache import CorruptEntry

    cache = Cache(tmp_path)

    def build(folder):
        (folder / "a.bin").write_bytes(b"honest a")
        (folder / "b.bin").write_bytes(b"honest b")

    folder = cache.get_or_create("capture", "k" * 64, build)
    meta = json.loads((folder / "entry.json").read_text())
    del meta["files"]["b.bin"]
    (folder / "entry.json").write_text(json.dumps(meta))
    (folder / "b.bin").write_bytes(b"forged")
    with pytest.raises(CorruptEntry, match="does not list b.bin"):
        Cache.read_verified(folder, "b.bin")
    with pytest.warns(UserWarning, match="b.bin, which its record does not list"):
        assert cache.lookup("capture", "k" * 64) is None
    folder = cache.get_or_create("capture", "k" * 64, build)
    assert Cache.read_verified(folder, "b.bin") == b"honest b"


def test_a_file_altered_after_it_was_verified_is_caught_when_read(tmp_path):
    from fixtures.cache import CorruptEntry

    cache = Cache(tmp_path)
    builds = []

    def build(folder):
        builds.append(1)
        (folder / "metrics.bin").write_bytes(b"honest")

    folder = cache.get_or_create("claim_V", "k" * 64, build)
    (folder / "metrics.bin").write_bytes(b"forged")  # after lookup, before the read
    with pytest.raises(CorruptEntry, match="metrics.bin no longer matches its recorded hash"):
        Cache.read_verified(folder, "metrics.bin")
    with pytest.warns(UserWarning, match="corrupt"):
        data, _ = cache.load("claim_V", "k" * 64, build, "metrics.bin")
    assert data == b"honest" and len(builds) == 2


def test_an_entry_moved_under_another_key_is_not_used(tmp_path):
    import shutil

    cache = Cache(tmp_path)
    first = cache.get_or_create("claim_V", "a" * 64, lambda f: _write(f, "model a"))
    shutil.copytree(first, cache.entry_dir("claim_V", "b" * 64))
    with pytest.warns(UserWarning, match="its record is of the entry claim_V/a"):
        assert cache.lookup("claim_V", "b" * 64) is None


def test_safetensors_cache_files_follow_the_umask(tmp_path):
    """safetensors writes 0600; the cache gives every file of an entry 0666 less the umask, so
    a shared cache's entries are never taken for corrupt by another user."""
    import os
    import stat

    import torch
    from safetensors.torch import save_file

    old = os.umask(0o002)
    try:
        entry = Cache(tmp_path).get_or_create(
            "capture", "k" * 64,
            lambda f: save_file({"q": torch.zeros(2)}, str(f / "layer_00.safetensors")))
    finally:
        os.umask(old)
    assert stat.S_IMODE((entry / "layer_00.safetensors").stat().st_mode) == 0o664


def test_two_model_names_of_the_same_weights_never_share_metric_entries(tmp_path):
    """A control and a random model of the same weights share a capture, but the claims seed
    their nulls by the model's name: each name gets its own per-layer entry, and a cache the
    other name filled first gives the numbers of a fresh cache."""
    from types import SimpleNamespace

    import torch

    from tests._synthetic_run import SyntheticRun

    def run(name, cache):
        r = SyntheticRun(seed=0, cache=cache)
        r.spec = SimpleNamespace(key=name)
        return r

    shared = Cache(tmp_path / "shared")
    first = run("random-synthetic", shared).layer_metrics("V", 0)
    second = run("control-synthetic", shared).layer_metrics("V", 0)
    fresh = run("control-synthetic", Cache(tmp_path / "fresh")).layer_metrics("V", 0)
    assert len(shared.entries()) == 2
    assert set(second) == set(fresh)
    assert all(torch.equal(second[n], fresh[n]) for n in fresh)
    assert any(not torch.equal(first[n], second[n]) for n in fresh)  # the names do matter


def test_the_test_session_caches_outside_the_checkout(tmp_path):
    """tests/conftest.py: a tool or claim run a test starts without --cache-dir takes the
    session's temporary cache (KPCA_CACHE), not the checkout's .kpca-cache (the user's own,
    README command 1's)."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    cache = Path(os.environ["KPCA_CACHE"])
    assert cache.resolve() != root / ".kpca-cache" and root not in cache.resolve().parents
    done = subprocess.run([sys.executable, "-m", "fixtures.cache", "info"], cwd=root,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert str(cache) in done.stdout, done.stdout  # "no cache at …" or "…: N entries"
