"""The commands beside the run (``python -m report diff``, ``python -m report``, ``python -m
report merge``, ``python -m fixtures.cache info``, ``python -m fixtures.training``) under the run's
rules (issue 45, item 1): inputs parsed strictly and validated against docs/results.schema.json,
outputs checked before anything is compared, rendered or trained, inputs never written over, and
every refusal one sentence with a documented exit code (docs/bad-inputs.md, section 8), its names
printable."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from report.__main__ import main as report_main
from tests.test_report_diff import _results

ROOT = Path(__file__).resolve().parent.parent


def _write(path: Path, data) -> Path:
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def _refused(argv: list[str], capsys) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of a refused ``python -m report …``."""
    with pytest.raises(SystemExit) as exc:
        report_main(argv)
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


def _one_sentence(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_diff_refuses_a_run_with_a_nan_literal(tmp_path, capsys):
    """Before: reported as a number outside its tolerance, exit 6."""
    ref = _write(tmp_path / "ref.json", _results())
    text = json.dumps(_results()).replace('"optimal_cosine": 0.31', '"optimal_cosine": NaN')
    run = _write(tmp_path / "run.json", text)
    code, out, err = _refused(["diff", str(run), str(ref)], capsys)
    assert code == 2 and out == ""
    assert "holds the non-standard JSON constant NaN" in _one_sentence(err)


def test_diff_refuses_a_string_where_a_metric_number_belongs(tmp_path, capsys):
    """Before: reported as an exact field that differs, exit 6."""
    ref = _write(tmp_path / "ref.json", _results())
    data = _results()
    data["records"][0]["metrics"]["optimal_cosine"] = "0.31"
    run = _write(tmp_path / "run.json", data)
    code, out, err = _refused(["diff", str(run), str(ref)], capsys)
    assert code == 2 and out == ""
    line = _one_sentence(err)
    assert "does not fit docs/results.schema.json" in line and "optimal_cosine" in line


def test_diff_refuses_a_baseline_file_given_as_a_run(tmp_path, capsys):
    """Before: a baseline (it has a records list) was compared, NOT COMPARABLE, exit 4."""
    ref = _write(tmp_path / "ref.json", _results())
    base = _write(tmp_path / "b.json", {"schema": "kpca-claims/baseline/2", "identity": {},
                                        "records": []})
    code, out, err = _refused(["diff", str(base), str(ref)], capsys)
    assert code == 2 and out == ""
    assert "is a baseline file (written by --update-baseline)" in _one_sentence(err)


def test_diff_refuses_an_unwritable_json_output_before_any_verdict(tmp_path, capsys, monkeypatch):
    """The user may not write into --json's folder (simulated: this machine runs as root): the
    verdict is never printed and nothing is compared (before: the verdict, then a traceback)."""
    ref = _write(tmp_path / "ref.json", _results())
    run = _write(tmp_path / "run.json", _results())
    locked = tmp_path / "locked"
    locked.mkdir()
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if Path(p) == locked
                        else real(p, mode, **kw))
    code, out, err = _refused(["diff", str(run), str(ref), "--json", str(locked / "d.json")], capsys)
    assert code == 2 and out == "" and "REPRODUCES" not in err
    assert "which this user cannot write into" in _one_sentence(err)
    assert not (locked / "d.json").exists()


def test_terminal_escape_codes_in_names_are_printed_escaped(tmp_path, capsys):
    """A file name with an ESC sequence (clear the screen) reaches the terminal as ``\\x1b``."""
    ref = _write(tmp_path / "ref.json", _results())
    evil = tmp_path / "run\x1b[2J.json"
    code, out, err = _refused(["diff", str(evil), str(ref)], capsys)
    assert code == 2 and "\x1b" not in err and "run\\x1b[2J.json" in _one_sentence(err)
    cache = subprocess.run([sys.executable, "-m", "fixtures.cache", "info", "--cache-dir",
                            str(_write(tmp_path / "plain\x1b[31m.txt", "x"))],
                           cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert cache.returncode == 4 and "\x1b" not in cache.stderr and "\\x1b[31m" in cache.stderr


def test_a_usage_error_of_the_run_shows_an_escape_code_in_a_name_escaped(tmp_path):
    """``pytest claims/ --checkpoint $'\\e[2Jgone.safetensors'``: before, pytest's ``ERROR:``
    line carried the raw ESC and the terminal cleared its screen."""
    run = subprocess.run([sys.executable, "-m", "pytest", "claims/", "-p", "no:cacheprovider",
                          "--checkpoint", str(tmp_path / "\x1b[2Jgone.safetensors"),
                          "--arch", "vit_tiny_patch16_224", "--out", str(tmp_path / "out")],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 4, run.stderr[-2000:]
    assert "\x1b" not in run.stderr + run.stdout
    assert "ERROR: checkpoint file not found: " in run.stderr and "\\x1b[2Jgone" in run.stderr


def test_python_m_report_refuses_a_baseline_file_and_a_fifo_output(tmp_path, capsys):
    base = _write(tmp_path / "b.json", {"schema": "kpca-claims/baseline/2", "identity": {},
                                        "records": []})
    code, _, err = _refused([str(base), "-o", str(tmp_path / "r.html")], capsys)
    assert code == 2 and "kpca-claims/baseline/2" in _one_sentence(err)
    results = _write(tmp_path / "results.json", _results())
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    code, _, err = _refused([str(results), "-o", str(fifo)], capsys)
    assert code == 4 and "is not a regular file (a FIFO" in _one_sentence(err)
    assert fifo.exists() and not fifo.is_file()  # still the FIFO: nothing replaced it


def test_merge_refuses_a_shard_with_a_nan_literal(tmp_path, capsys):
    text = json.dumps(_results()).replace('"optimal_cosine": 0.31', '"optimal_cosine": NaN')
    shard = _write(tmp_path / "a.json", text)
    code, out, err = _refused(["merge", str(shard), "-o", str(tmp_path / "m")], capsys)
    assert code == 4 and out == ""
    assert "holds the non-standard JSON constant NaN" in _one_sentence(err)
    assert not (tmp_path / "m").exists()


def test_merge_refuses_an_output_that_is_a_fifo(tmp_path, capsys):
    shard = _write(tmp_path / "a.json", _results())
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    code, out, err = _refused(["merge", str(shard), "-o", str(fifo)], capsys)
    assert code == 4 and out == "" and "is a FIFO, a socket or a device, not a folder" in _one_sentence(err)
    assert fifo.exists() and not fifo.is_dir()


def _cache(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fixtures.cache", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_cache_info_refuses_what_is_not_a_cache_and_creates_nothing(tmp_path):
    """Before: info on a file, a FIFO, a folder of other files or a missing path printed
    '0 entries, 0.0 MB', exit 0."""
    plain = _write(tmp_path / "plain.txt", "x")
    other = tmp_path / "other"
    other.mkdir()
    _write(other / "important.txt", "keep")
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    for path, said in ((plain, "is a file, not a cache folder"),
                       (fifo, "is not a regular file or folder (a FIFO"),
                       (other, "is not a kpca-claims cache")):
        run = _cache("info", "--cache-dir", str(path))
        assert run.returncode == 4 and said in _one_sentence(run.stderr), run.stderr
        assert "nothing was read" in run.stderr
    missing = tmp_path / "missing"
    run = _cache("info", "--cache-dir", str(missing))
    assert run.returncode == 0 and "no cache at" in run.stdout and not missing.exists()


def _train(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fixtures.training", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_training_refuses_an_out_under_a_file_or_a_fifo_before_training(tmp_path):
    """Before: --out under a regular file was accepted and training began (it failed only when
    the first checkpoint was written); a FIFO was called "not an empty folder"."""
    plain = _write(tmp_path / "plain.txt", "x")
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    for out, said in ((plain / "run", "lies under"), (fifo, "is a FIFO, a socket or a device")):
        run = _train("--out", str(out), "--epochs", "1")
        assert run.returncode == 2 and said in _one_sentence(run.stderr), run.stderr
        assert "nothing was trained" in run.stderr and "config " not in run.stderr
    run = _train("--out", str(tmp_path / "new"), "--epochs", "0")
    assert run.returncode == 2 and "epochs" in _one_sentence(run.stderr)


def test_a_pickle_that_runs_code_is_refused_as_unsafe(tmp_path):
    """Before: 'not a PyTorch checkpoint, or a truncated or corrupt one', with torch's advice to
    load it with weights_only=False and without its warning of arbitrary code execution."""
    import torch

    from fixtures.models.checkpoints import CheckpointError, read_checkpoint

    class Payload:
        def __reduce__(self):
            return (os.system, ("echo never run",))

    path = tmp_path / "payload.pth"
    torch.save({"w": torch.zeros(2), "x": Payload()}, path)
    with pytest.raises(CheckpointError) as exc:
        read_checkpoint(path)
    message = str(exc.value)
    assert "refused as unsafe, not loaded" in message and "system" in message
    assert "weights_only" not in message and "corrupt" not in message
