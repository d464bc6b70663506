"""TEMPORARY, tests only: registers the built-in claims V, J, E with their report sections when
``import claims`` has not (the claim interface registers them in claims/claim_*.py; once it does,
this is a no-op). Fields as the report needs them; the texts are those of the claims' specs."""

from __future__ import annotations

import importlib
from claims import registry

CLAIM_TEXT = {
    "V": {"title": "Value vectors are the eigenvectors of the centred key Gram matrix",
          "source": "P1 §2; P2 finding 1; method §2",
          "statement": "The learned value vectors V of each head equal the kernel-PCA value "
                       "matrix V̂ = G(I − 11ᵀ/N)A built from the keys' centred Gram eigenvectors."},
    "J": {"title": "Attention minimises the KPCA projection loss J_proj",
          "source": "P1 §2.2.1; P2 finding 2; method §3",
          "statement": "J_proj = mean over queries of ‖φ(q)‖² − ‖h‖² is a projection error: "
                       "non-negative, and falling over training."},
    "E": {"title": "Gram eigenvalue statistics justify V as eigenvectors",
          "source": "P1 §2.2.2; P2 finding 3; method §4",
          "statement": "The Gram eigenvalue statistics are reproducible, and γ_i = (K̃â)_i/(N â_i) "
                       "is constant over i for the â recovered from the learned V."},
}

_SPECS = {
    "V": dict(section="claim_v", unit="head", levels=("head", "model"),
              report_context="report.sections.claim_v:context",
              template="report/templates/sections/claim_v.html.j2",
              extra={"tests": "claims/test_value_vectors.py"}),
    "J": dict(section="claim_j", unit="layer", levels=("layer", "model", "series"),
              report_context="report.sections.claim_j:context",
              template="report/templates/sections/claim_j.html.j2",
              extra={"tests": "claims/test_projection_loss.py"}),
    "E": dict(section="claim_e", unit="head", levels=("head", "model"),
              report_context="report.sections.claim_e:context",
              template="report/templates/sections/claim_e.html.j2",
              extra={"tests": "claims/test_gram_spectrum.py"}),
}


def ensure_builtin_specs() -> None:
    importlib.import_module("claims")  # registers the built-in claims where the interface does
    registered = {s.id for s in registry.all_claims()}
    for claim_id, fields in _SPECS.items():
        if claim_id not in registered:
            registry.register(registry.ClaimSpec(id=claim_id, **CLAIM_TEXT[claim_id], **fields))
