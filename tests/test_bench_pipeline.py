"""``python -m bench.run --pipeline``: the stage attribution of :mod:`bench.attribution` on a tiny
fake pipeline with a fake clock (nested stages counted once, absorbing and shared stages, every name
of a function wrapped and restored, totals adding up), and the per-model × stage table of
docs/performance.md (:func:`bench.table.pipeline_table`). Nothing here is timed."""

from __future__ import annotations

import json
import sys
import types

import pytest

from bench import table
from bench.attribution import Attribution, Stage, patch_everywhere
from bench.pipeline import IMPORTS, OTHER, STAGES, stage_totals


class FakeClock:
    """CPU and wall time that move only when the fake pipeline says so."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def spend(self, seconds: float) -> None:
        self.t += seconds


@pytest.fixture()
def fake_pipeline(monkeypatch):
    """A package ``fakepipe`` of two modules: ``kernels`` defines the stages, ``claim`` imports
    some of them by name (``from fakepipe.kernels import eigh``), as the suite's modules do."""
    clock = FakeClock()
    kernels = types.ModuleType("fakepipe.kernels")

    def eigh():
        clock.spend(2.0)

    def twin():
        clock.spend(0.5)
        kernels.eigh()  # nested inside an absorbing stage: charged to the twin
        clock.spend(0.25)

    def metrics():
        clock.spend(1.0)
        kernels.eigh()  # nested: counted once, under eigendecompositions
        kernels.twin()  # callers look a name up in a module, and that name is wrapped

    kernels.eigh, kernels.twin, kernels.metrics = eigh, twin, metrics
    claim = types.ModuleType("fakepipe.claim")
    claim.eigh = eigh  # a second name of the same function

    def layer():
        clock.spend(0.125)
        kernels.metrics()
        claim.eigh()

    claim.layer = layer
    package = types.ModuleType("fakepipe")
    for name, mod in (("fakepipe", package), ("fakepipe.kernels", kernels),
                      ("fakepipe.claim", claim)):
        monkeypatch.setitem(sys.modules, name, mod)
    return clock, kernels, claim


def _stages() -> list[Stage]:
    return [Stage("fakepipe.kernels:eigh", "eigendecompositions", shared=True),
            Stage("fakepipe.kernels:metrics", "V metrics", claim="V"),
            Stage("fakepipe.kernels:twin", "V twin", claim="V", absorb=True),
            Stage("fakepipe.claim:layer", "V layer rest", claim="V"),
            Stage("fakepipe.kernels:gone", "never")]


def test_nested_stages_count_once_and_add_up(fake_pipeline):
    clock, kernels, claim = fake_pipeline
    originals = (kernels.eigh, kernels.metrics, claim.eigh, claim.layer)
    att = Attribution(cpu_clock=clock, wall_clock=clock)
    with patch_everywhere(att, _stages(), packages=("fakepipe",)) as patches:
        assert kernels.eigh is not originals[0] and claim.eigh is not originals[2]
        claim.layer()
        kernels.eigh()  # outside any claim: the shared label has no claim
    assert (kernels.eigh, kernels.metrics, claim.eigh, claim.layer) == originals  # restored
    assert patches.missing and patches.missing[0].startswith("fakepipe.kernels:gone")
    assert att.cpu == {"V layer rest": 0.125, "V metrics": 1.0, "V twin": 2.75,
                       "eigendecompositions (V)": 4.0, "eigendecompositions": 2.0}
    assert att.calls["eigendecompositions (V)"] == 2 and att.calls["V twin"] == 1
    assert att.detail_cpu == {"V twin > (itself)": 0.75, "V twin > eigendecompositions (V)": 2.0}
    assert sum(att.cpu.values()) == clock.t == 9.875  # every second counted once
    assert att.wall == att.cpu  # the same fake clock


def test_stage_totals_add_up_to_the_process(fake_pipeline):
    clock, _kernels, claim = fake_pipeline
    att = Attribution(cpu_clock=clock, wall_clock=clock)
    with patch_everywhere(att, _stages(), packages=("fakepipe",)):
        with att.stage("pytest collection"):
            clock.spend(0.5)
        claim.layer()
    run_cpu = clock.t + 1.0  # one second no wrapper saw
    stages = stage_totals(att, import_cpu=3.0, run_cpu=run_cpu, child_cpu=0.25)
    assert stages[OTHER] == 1.0 and stages[IMPORTS] == 3.0 and stages["pytest collection"] == 0.5
    assert sum(stages.values()) == pytest.approx(3.0 + run_cpu + 0.25)
    assert list(stages.values()) == sorted(stages.values(), reverse=True)


def test_every_pipeline_stage_names_a_function_of_the_suite():
    """A renamed function would silently fall to its caller's stage: every target resolves (the
    run also lists any that does not under ``missing_targets``)."""
    from bench.attribution import Patches

    patches = Patches(Attribution(), STAGES, packages=())
    assert patches.missing == []


def _results() -> dict:
    model = {"models": "m1", "label": "m1", "cpu_s": 10.0, "wall_s": 12.5,
             "stages_cpu_s": {"V round-off twin": 4.0, "eigendecompositions (V)": 3.0,
                              OTHER: 2.0, IMPORTS: 1.0}, "missing_targets": []}
    ladder = {"models": "controls", "label": "kpca-oracle ladder (18 models)", "cpu_s": 5.0,
              "wall_s": 6.0, "stages_cpu_s": {"eigendecompositions (V)": 2.5, OTHER: 2.5},
              "missing_targets": ["checks.x:y (AttributeError: gone)"]}
    return {"commit": "abc1234", "date_utc": "2026-11-28 18:00", "n_samples": 100,
            "machine": {"cpus": 2, "cpu_model": "Test CPU", "torch": "2.0", "python": "3.11",
                        "load_before": [1.0], "load_after": [2.0]},
            "models": [model, ladder],
            "kernels": [{"model": "all-MiniLM-L6-v2", "n_samples": 100, "n_heads_total": 1200,
                         "agreement_passed": True,
                         "claims": {"V": {"ours_cpu_s": 4.0, "loop_cpu_s": 5.2, "ratio_cpu": 1.3,
                                          "loop_extrapolated": True}}}]}


def test_pipeline_table_renders_between_its_markers(tmp_path):
    res = tmp_path / "pipeline.json"
    res.write_text(json.dumps(_results()))
    doc = tmp_path / "performance.md"
    doc.write_text(f"# x\n{table.TABLE_START}\nkernels\n{table.TABLE_END}\n"
                   f"{table.PIPELINE_START}\nold\n{table.PIPELINE_END}\nafter\n")
    table.update_pipeline_doc(res, doc)
    text = doc.read_text()
    assert "\nold\n" not in text and "\nkernels\n" in text and text.endswith("after\n")
    assert "2026-11-28 18:00 UTC at commit abc1234 on 2 CPUs (Test CPU)" in text
    assert "| stage | m1 | kpca-oracle ladder (18 models) |" in text
    assert "| eigendecompositions (V) | 3.0 (30%) | 2.5 (50%) |" in text
    assert "| V round-off twin | 4.0 (40%) | – |" in text
    assert "| **total CPU s** | **10.0** | **5.0** |" in text
    lines = text.splitlines()
    assert lines.index(f"| {OTHER} | 2.0 (20%) | 2.5 (50%) |") > lines.index(
        "| V round-off twin | 4.0 (40%) | – |")  # 'other' after the stages
    assert "claim V 1.30× (4.0 s ours, 5.2 s loop*)" in text and "agreement with the loop passed" in text
    assert "`checks.x:y`" in text
    table.update_pipeline_doc(res, doc)  # idempotent
    assert doc.read_text() == text


def test_the_shipped_page_holds_the_pipeline_table_of_the_shipped_results():
    """docs/performance.md's pipeline block is that of bench/pipeline.json when one is shipped
    (``python -m bench.run --write-table``), else it says how to make one."""
    text = table.DOC.read_text(encoding="utf-8")
    assert text.count(table.PIPELINE_START) == 1 and text.count(table.PIPELINE_END) == 1
    block = text.split(table.PIPELINE_START, 1)[1].split(table.PIPELINE_END, 1)[0]
    shipped = table.ROOT / "bench" / "pipeline.json"
    if shipped.is_file():
        expected = table.pipeline_table(json.loads(shipped.read_text()))
        assert table.PIPELINE_START + block + table.PIPELINE_END == expected
    else:
        assert "python -m bench.run --pipeline" in block
