"""pytest habits: every kpca-claims option is an ini key of [tool.pytest.ini_options] (the command
line wins), and --lf works for the project's own tests (no -p no:cacheprovider in addopts)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MODEL = "random-vit_tiny_patch16_224"


def _pytest(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=600)


def _team_pyproject(tmp_path: Path, **keys: str) -> Path:
    """A team's own pyproject.toml that pins its selection in [tool.pytest.ini_options]."""
    lines = ["[tool.pytest.ini_options]"] + [f'{k} = "{v}"' for k, v in keys.items()]
    path = tmp_path / "pyproject.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _collect(ini: Path, *extra: str) -> subprocess.CompletedProcess:
    return _pytest("claims/", "-c", str(ini), "--rootdir", str(ROOT), "--confcutdir", str(ROOT),
                   "--collect-only", "-q", "-p", "no:cacheprovider", *extra)


def _ids(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("claims/")]


@pytest.mark.slow
def test_ini_keys_change_the_selection_and_the_command_line_wins(tmp_path):
    ini = _team_pyproject(tmp_path, kpca_models=MODEL, kpca_layers="0", kpca_heads="0")
    run = _collect(ini, "-k", "test_value_vectors")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert _ids(run.stdout) == [
        f"claims/test_value_vectors.py::test_value_vectors[{MODEL}-L00-H0]",
        f"claims/test_value_vectors.py::test_value_vectors_model[{MODEL}]"]
    run = _collect(ini, "-k", "test_value_vectors", "--heads", "1,2")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    heads = [i for i in _ids(run.stdout) if "-L00-H" in i]
    assert [i[-3:-1] for i in heads] == ["H1", "H2"]


@pytest.mark.slow
def test_ini_values_are_typed_like_their_options(tmp_path):
    ini = _team_pyproject(tmp_path, kpca_models=MODEL, kpca_n_samples="0")
    run = _collect(ini)  # reached --n-samples: the plugin's own check refuses 0
    assert run.returncode == 4 and "--n-samples 0 is below 1" in run.stderr + run.stdout
    assert _collect(ini, "--n-samples", "3").returncode == 0  # the command line wins
    ini = _team_pyproject(tmp_path, kpca_models=MODEL, kpca_n_samples="many")
    run = _collect(ini)
    assert run.returncode == 4 and "ini key kpca_n_samples = 'many'" in run.stderr + run.stdout
    ini = _team_pyproject(tmp_path, kpca_models=MODEL, kpca_dtype="float16")
    run = _collect(ini)
    assert run.returncode == 4 and "choose one of float64, float32" in run.stderr + run.stdout


def test_every_option_of_the_group_has_an_ini_key():
    run = _pytest("--help", "-p", "no:cacheprovider")
    text = run.stdout
    lines = text.split("\nkpca-claims:", 1)[1].splitlines()[1:]
    group = []
    for line in lines:  # the group's section ends at the next unindented header
        if line and not line.startswith(" "):
            break
        group.append(line.strip())
    options = {line.split()[0].split("=")[0].rstrip(",") for line in group
               if line.startswith("--")}
    assert len(options) >= 20
    for option in options:
        assert f"kpca_{option[2:].replace('-', '_')} (string)" in text, option


def test_last_failed_works_for_the_project_tests(tmp_path):
    addopts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert "cacheprovider" not in addopts["addopts"]
    (tmp_path / "test_two.py").write_text("def test_ok():\n    pass\n\ndef test_bad():\n    assert 0\n")
    ini = tmp_path / "pytest.ini"
    ini.write_text(f"[pytest]\naddopts = {addopts['addopts']}\n")
    first = _pytest("-c", str(ini), str(tmp_path), cwd=tmp_path)
    assert first.returncode == 1
    again = _pytest("-c", str(ini), str(tmp_path), "--lf", cwd=tmp_path)
    assert again.returncode == 1
    assert "1 failed" in again.stdout and "passed" not in again.stdout.splitlines()[-1]
    assert "run-last-failure" in again.stdout


def test_doctests_of_the_claims_modules_are_not_claim_tests(tmp_path):
    """``pytest --doctest-modules claims/verdicts.py`` runs the doctests as pytest would: no
    "finished without a result record" fault, no results.json; a doctest beside claim tests is
    not counted among them."""
    from fixtures.plugin.state import is_claim_test

    assert is_claim_test("claims/test_value_vectors.py::test_value_vectors[m-L00-H0]")
    assert is_claim_test("claims/test_gram_spectrum.py::TestX::test_y[a.b]")
    assert not is_claim_test("claims/verdicts.py::claims.verdicts.missing_reason")
    assert is_claim_test("::test_attention_entropy[tiny-vit-digits-softmax-L00-H0]")  # outside rootdir
    assert not is_claim_test("claims/test_rpc_attention.py::claims.test_rpc_attention.helper")
    assert not is_claim_test("claims/test_value_vectors.py")
    assert not is_claim_test("report/__init__.py::report")  # a top-level package's doctest
    assert not is_claim_test("conftest.py::conftest")
    out = tmp_path / "out"
    done = _pytest("--doctest-modules", "claims/verdicts.py", "claims/multiverse.py",
                   "report/__init__.py", "-p",
                   "no:cacheprovider", "--out", str(out))
    assert done.returncode == 0, done.stdout[-2000:]
    assert "passed" in done.stdout.splitlines()[-1] and "fault" not in done.stdout
    assert not out.exists()


@pytest.mark.parametrize("args, dropped", [
    (["claims/"], True),
    (["claims/test_value_vectors.py::test_value_vectors"], True),
    (["claims/", "tests/test_stats.py"], False),  # the project's tests use hypothesis
    ([], False),                                    # the whole checkout: tests/ included
])
def test_a_run_of_the_claims_alone_drops_the_plugins_it_never_uses(args, dropped):
    """hypothesis's plugin imports all of hypothesis at the end of each session (about 1.7 s of
    CPU per claim run, measured); a run whose every path lies in claims/ unregisters it, any
    other run keeps it."""
    from types import SimpleNamespace

    from _pytest.config import PytestPluginManager

    from fixtures.plugin import configure

    pm = PytestPluginManager()
    plugin = SimpleNamespace()
    pm.register(plugin, name="hypothesispytest")
    config = SimpleNamespace(args=args or [str(ROOT)], pluginmanager=pm,
                             invocation_params=SimpleNamespace(dir=ROOT))
    configure._drop_unused_plugins(config)
    assert (pm.get_plugin("hypothesispytest") is None) is dropped
    assert configure.UNUSED_BY_CLAIM_RUNS == ("hypothesispytest",)
