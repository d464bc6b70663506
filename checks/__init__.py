"""Pure, batched tensor math for the claims of Teo & Nguyen (2024), as specified in
``shared/spec/claims.md``. No models, no files, no pytest: tensors in, tensors out.
"""

from .errors import NonFiniteError, check_finite
from .gram import KeyGram, resolve_scale, standardize_tokens

__all__ = ["KeyGram", "NonFiniteError", "check_finite", "resolve_scale", "standardize_tokens"]
