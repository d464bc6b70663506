"""Speed and memory benchmark of the claim-V pipeline against a plain per-head reference.

- :mod:`bench.reference`: an independent, deliberately plain float64 NumPy/SciPy reference that
  computes every (sample, layer, head) on its own with the formulas of method §1–§2.
- :mod:`bench.run`: ``python -m bench.run [--quick]``: times the suite's batched path stage by
  stage against the reference, checks that both give the same numbers, and writes a JSON table.
"""
