"""Claim E in the specification curve (``--multiverse``, method §14): its records of one compute
combination (``ClaimSpec.curve``): the model record of the eigenvalue statistics and the γ head
records (claims/test_gram_spectrum.py)."""

from __future__ import annotations

from . import claim_e
from .multiverse import plain


def e_outcomes(model: str, per_layer: dict, heads: list[int], head_dim: int, rules: str) -> dict:
    """Claim E's model record (eigenvalue statistics) and γ head records."""
    units = {f"L{layer:02d}-H{head}": rec
             for (layer, head), rec in claim_e.head_records(model, per_layer, heads, rules).items()}
    return plain({"model": claim_e.model_record(model, per_layer, heads, head_dim, rules=rules),
                  "units": units})
