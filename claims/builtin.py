"""The built-in claims V, J, E and R as :class:`claims.registry.ClaimSpec` declarations.

This module holds only their declarations (standard library, no torch), so that ``import claims``
registers them cheaply, for the report as for the runtime. Each claim's code lives in its own
modules: ``claims/claim_v.py`` holds claim V's records, verdicts and per-sample rows, and
``claims/claim_v_layer.py`` its per-layer computation (``layer_metrics``, called by the session);
likewise ``claim_j.py`` with ``claim_j_layer.py`` and ``claim_e.py`` with ``claim_e_layer.py``.
Their rules are the ``claim_v*``, ``claim_j*`` and ``claim_e*`` sections of
``claims/thresholds.toml`` (which section judges which record level: ``record_sections``); their
tests are the thin ``claims/test_*.py`` named by ``tests``. A claim from outside this
repository declares its spec wherever it is defined (docs/architecture.md, "Adding a claim").
"""

from __future__ import annotations

from .names import J_METRICS, V_METRICS, V_P2_CODE_METRICS
from .registry import ClaimSpec, register

V = register(ClaimSpec(
    id="V", section="claim_v",
    title="Value vectors are the eigenvectors of the centred key Gram matrix",
    statement="The learned value vectors V of each head equal the kernel-PCA value matrix "
              "V̂ = G(I − 11ᵀ/N)A built from the keys' centred Gram eigenvectors.",
    source="P1 §2; P2 finding 1; method §2", unit="head", levels=("head", "model"),
    heads="kv",  # reads keys and values only: one test per KV head (method §5.7)
    layer_metrics="claims.claim_v_layer:layer_metrics",
    metrics=V_METRICS, settings="claims.claim_v_layer:cache_settings",
    # P2's code conventions run on a seeded subset of samples (method §8.3): NaN elsewhere
    nonfinite_ok=tuple(f"p2code_{name}" for name in V_P2_CODE_METRICS),
    init_twin=True,  # the tier "partial" is judged against the random-init twin (method §2.6)
    report_context="report.sections.claim_v_section:context",
    template="report/templates/sections/claim_v.html.j2", tests="claims/test_value_vectors.py",
    method_version="1", sample_rows="claims.claim_v:sample_rows",
    records={"head": "claims.claim_v:record_for_head", "model": "claims.claim_v:record_for_model"},
    controls="claims.claim_v_controls:expectations",  # expected verdicts on the controls (§12)
    # the specification curve (method §14): its specifications come from one grid per token set,
    # which also fills claim J's V̂ and claim E's values of the same specifications (§14.1)
    curve="claims.claim_v_curve:v_outcomes", curve_route="claims.claim_v_curve:route",
    curve_entries={"V": {"unit": "head", "headline": ("optimal_cosine", "linear_cka",
                                                      "kernel_cka", "subspace_overlap_excess",
                                                      "top_weighted_share")}},
    provides={"v_hat": ("standardize", "dtype"), "grams": ("standardize",)}))

J = register(ClaimSpec(
    id="J", section="claim_j",
    title="Attention minimises the KPCA projection loss J_proj",
    statement="J_proj = mean over queries of ‖φ(q)‖² − ‖h‖² is a projection error: "
              "non-negative, and falling over training.",
    source="P1 §2.2.1; P2 finding 2; method §3", unit="layer", levels=("layer", "model", "series"),
    layer_metrics="claims.claim_j_layer:layer_metrics",
    metrics=J_METRICS, report_context="report.sections.claim_j_section:context",
    # per-token tensors are NaN past each sample's own token count (method §3.7); the output fit
    # is NaN for a sample of no more tokens than the head dimension (V̂ undetermined, method §2)
    nonfinite_ok=("token_log_phi_sq", "token_h_sq", "token_fit_h_sq", "output_r2",
                  "output_r2_null"),
    template="report/templates/sections/claim_j.html.j2", tests="claims/test_projection_loss.py",
    method_version="1", record_sections={"series": "claim_j_trend"},
    records={"layer": "claims.claim_j:record_for_layer", "model": "claims.claim_j:record_for_model"},
    controls="claims.claim_j_controls:expectations",  # expected verdicts on the controls (§12)
    curve="claims.claim_j_curve:j_outcomes", curve_decide="claims.claim_j_curve:rejudge",
    curve_entries={"J": {"unit": "layer", "headline": ("log10_ratio", "bessel_share")}},
    takes={"v_hat": "batched"}))  # a specification's V̂ from claim V's grid (method §14.1)

E = register(ClaimSpec(
    id="E", section="claim_e",
    title="Gram eigenvalue statistics justify V as eigenvectors",
    statement="The Gram eigenvalue statistics are reproducible, and γ_i = (K̃â)_i/(N â_i) is "
              "constant over i for the â recovered from the learned V.",
    source="P1 §2.2.2; P2 finding 3; method §4", unit="head", levels=("head", "model"),
    heads="kv",  # reads keys and values only: one test per KV head (method §5.7)
    layer_metrics="claims.claim_e_layer:layer_metrics",
    report_context="report.sections.claim_e_section:context",
    template="report/templates/sections/claim_e.html.j2", tests="claims/test_gram_spectrum.py",
    # its head records judge γ constancy by their own rules; they have per-sample rows
    method_version="1", record_sections={"head": "claim_e_gamma"},
    sample_rows="claims.claim_e:sample_rows",
    records={"head": "claims.claim_e:record_for_head", "model": "claims.claim_e:record_for_model"},
    controls="claims.claim_e_controls:expectations",  # expected verdicts on the controls (§12)
    curve="claims.claim_e_curve:e_outcomes",
    curve_entries={"E": {"unit": None, "headline": ("raw_vs_standardized_ratio", "max_route_ratio",
                                                    "naive_finite_share")},
                   "E-gamma": {"unit": "head", "model_verdict": False}},
    # a specification's values from claim V's grid's float64 Gram matrices (method §14.1)
    takes={"grams": "grid"}, intake={"grams": "claims.claim_e_layer:values_from_grams"}))

R = register(ClaimSpec(
    id="R", section="claim_r",
    title="RPC-Attention is competitive on clean data and more robust under contamination",
    statement="RPC-SymViT (symmetric attention with Principal Attention Pursuit on the keys) is "
              "not worse than SymViT on clean images and more accurate under sparse and dense "
              "corruptions and adversarial attacks; a toy-scale mechanism check on digits, "
              "paired over training seeds.",
    source="P1 Algorithm 1 and its experiments; method §15", unit="series", levels=("series",),
    # no per-layer metrics: its numbers come from fixtures/engine/rpc_study.py (the results' code digest)
    code=("claims.claim_r", "fixtures.engine.rpc_study"),
    metrics=("paired_diff", "rpc_symvit", "symvit"),
    report_context="report.sections.claim_r_section:context",
    template="report/templates/sections/claim_r.html.j2", tests="claims/test_rpc_attention.py",
    extra={"label": "toy-scale mechanism check", "marker": "rpc",
           "not_checked": "claims.claim_r:NOT_CHECKED"}))
