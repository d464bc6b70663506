"""The specification curve (``--multiverse``, method §14): every claim of a model judged under
every specification of claims/specifications.toml, from the cached capture. An analysis, not a
claim test: it passes when the curve is computed, and writes results.json's
``specification_curve`` (its default specification equals this run's claim records)."""

import pytest


@pytest.mark.kpca_opt_in("--multiverse")
def test_specification_curve(model_ref, specification_curve, record_extra):
    curve = specification_curve(model_ref.model)
    assert curve["entries"], f"no curve entry for {model_ref.model}"
    record_extra("specification_curve", curve)
