"""The claims: one registered :class:`claims.registry.ClaimSpec` each (``import claims``
registers the built-in V, J and E, :mod:`claims.builtin`), their per-layer computations, records
and verdict rules (thresholds in thresholds.toml), and the thin claim tests."""

from . import builtin  # registers V, J, E, R

__all__ = ["builtin"]
