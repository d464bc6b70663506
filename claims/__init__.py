"""The claim tests (thin) and the verdict rules they apply (thresholds in thresholds.toml)."""
