"""Speed and memory benchmark of claims V, J and E against plain per-head references.

- :mod:`bench.reference`: an independent, deliberately plain float64 NumPy/SciPy reference that
  computes every (sample, layer, head) on its own with the formulas of method §1–§4.
- :mod:`bench.run`: ``python -m bench.run [--quick]``, the command line: times the suite's batched
  path stage by stage against the reference (:mod:`bench.claim_v`, :mod:`bench.claims_je`), checks
  that both give the same numbers, and writes a JSON table (:mod:`bench.table`; the Speed
  table is generated from it); the instruments are in :mod:`bench.timing`, the inputs in
  :mod:`bench.models`; :mod:`bench.crossover` and :mod:`bench.solvers` measure eigensolvers and
  assignment solvers on their own.
"""
