"""Names the layers above share, defined once: the results schema id and the metric names of the
claim records. No imports beyond the standard library, so the report can read them without torch.

The math (``checks``) sits below this module and names its own outputs
(``checks.value_vectors.METRIC_NAMES``); a test keeps that list equal to :data:`V_MEASURED`.
"""

from __future__ import annotations

#: The ``schema`` of results.json: written by the pytest plugin, checked by the report.
RESULTS_SCHEMA = "kpca-claims/results/1"

#: Claim V metrics measured per sample (each also against its null, method §2.1, §2.3).
V_MEASURED = ("optimal_cosine", "linear_cka", "kernel_cka", "subspace_overlap", "direct_cosine",
              "pearson", "relative_frobenius", "allclose", "shared_directions",
              "top_weighted_share")
#: Claim V metrics of a record, in report order: the measured ones and the derived overlap excess
#: (method §2.4).
V_METRICS = ("optimal_cosine", "linear_cka", "kernel_cka", "subspace_overlap",
             "subspace_overlap_excess", "top_weighted_share", "shared_directions", "direct_cosine",
             "pearson", "relative_frobenius", "allclose")
#: Claim V's sign-dependent metrics also computed with P2's code conventions (method §8), never
#: judged: the per-layer tensors ``p2code_<metric>`` and a record's ``p2_code`` table.
V_P2_CODE_METRICS = ("direct_cosine", "optimal_cosine", "pearson")
#: Claim J metrics of a layer or model record (method §3.1-§3.3).
J_METRICS = ("phi_sq_mean", "h_sq_mean", "j_proj", "bessel_share", "log10_ratio")

#: Claim E's eigenvalue routes (method §4): log space on raw keys, log space on standardised
#: keys, and P2's exp(S) in float32.
E_ROUTES = ("log_raw", "log_standardized", "naive_float32")
#: Claim E's eigenvalue statistics per route (P2 Table 2); ``checks.spectrum.STATISTICS`` names
#: the same (a test keeps them equal).
E_STATISTICS = ("max", "min", "mean", "median")
