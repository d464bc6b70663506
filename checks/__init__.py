"""Pure, batched tensor math for the claims of Teo & Nguyen (2024), as specified in
``docs/method.md``. No models, no files, no pytest: tensors in, tensors out.

Single-head entry points (tensors of shape [N, d]):
- :func:`value_vector_metrics` — claim V (method §2)
- :func:`projection_terms` — claim J (method §3)
- :func:`gram_spectrum`, :func:`gamma_spread` — claim E (method §4)
Each has a batched twin over any leading dimensions in its module.

One module per job: ``gram`` (the key Gram matrix K̃ in log space), ``value_vectors`` (claim V)
with its similarity metrics (``similarity_scaling``, ``row_similarity``, ``cka``,
``matrix_similarity``, all at once in ``metric_suite``), ``projection`` (claim J's per-head
terms) and ``projection_summary`` (their pooling and trend), ``spectrum`` (claim E's eigenvalue
statistics) and ``gamma`` (claim E's γ constancy), ``stats``, ``errors`` and ``_validation``
(shared argument checks).
"""

from . import gram
from .errors import NonFiniteError, check_finite
from .gram import KeyGram, resolve_scale, standardize_tokens
from .gamma import gamma_spread, gamma_spread_batched
from .projection import projection_terms, projection_terms_batched
from .projection_summary import pooled_terms, spearman_rho, term_attribution
from .spectrum import gram_spectrum, naive_gram_spectrum
from .value_vectors import METRIC_NAMES, value_vector_metrics, value_vector_metrics_batched

__all__ = [
    "KeyGram", "METRIC_NAMES", "NonFiniteError", "check_finite", "gamma_spread",
    "gamma_spread_batched", "gram", "gram_spectrum", "naive_gram_spectrum", "pooled_terms",
    "projection_terms", "projection_terms_batched", "resolve_scale", "spearman_rho", "standardize_tokens",
    "term_attribution", "value_vector_metrics", "value_vector_metrics_batched",
]
