"""Speed and memory benchmark of claims V, J and E against plain per-head references.

- :mod:`bench.loop_reference`: an independent, deliberately plain float64 NumPy/SciPy reference
  that computes every (sample, layer, head) on its own with the formulas of method §1–§4
  (method §1 in :mod:`bench.loop_reference_kpca`, the metrics of method §2 in
  :mod:`bench.loop_reference_metrics`).
- :mod:`bench.run`: ``python -m bench.run [--quick]``, the command line: times the suite's batched
  path stage by stage against the reference (:mod:`bench.claim_v_timing`,
  :mod:`bench.claims_je_timing`), checks that both give the same numbers, and writes a JSON table
  (:mod:`bench.table`; the Speed table of docs/performance.md is generated from it); the instruments are in
  :mod:`bench.timing`, the models and input sets in :mod:`bench.workloads`;
  :mod:`bench.crossover` and :mod:`bench.solvers` measure eigensolvers and assignment solvers on
  their own.
- :mod:`bench.pipeline`: ``python -m bench.run --pipeline``, the whole per-model pipeline of
  ``pytest claims/`` (command 1) in process, each model in a fresh process, its CPU time
  attributed to stages by wrappers put around the suite's functions from the outside
  (:mod:`bench.attribution`); written to ``bench/pipeline.json``, tabled by :mod:`bench.table`.
"""
