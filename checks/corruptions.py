"""digits-C: corruptions of test images for claim R's contamination check (method §15.3).

Every function takes images ``[n, c, H, W]`` with pixel values in [0, 1] and returns a corrupted
copy in [0, 1]; random corruptions draw from a ``torch.Generator`` seeded by the caller, so both
variants and every seed see the same corrupted images. Two kinds, after what robust PCA is built
for:

- sparse (a few entries changed by a lot, what the sparse part S is designed to absorb):
  ``impulse`` (salt-and-pepper: a share p of pixels set to 0 or 1) and ``patch`` (k whole patches
  of the model's patch grid replaced by uniform noise);
- dense (every pixel changed a little): ``gaussian`` noise of standard deviation σ, ``blur``
  (Gaussian kernel of width σ pixels) and ``contrast`` (pixels pulled towards each image's mean by
  a factor c).

:data:`SEVERITIES` lists the three severities of each (mild, medium, strong).

>>> import torch
>>> x = torch.rand(2, 1, 8, 8, generator=torch.Generator().manual_seed(0))
>>> y = corrupt(x, "impulse", 0.25, seed=1)
>>> bool(((y == 0) | (y == 1) | (y == x)).all()), bool(y.min() >= 0 and y.max() <= 1)
(True, True)
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

#: corruption → (kind, severities from mild to strong); parameters as in the module docstring.
SEVERITIES: dict[str, tuple[str, tuple[float, ...]]] = {
    "impulse": ("sparse", (0.03, 0.08, 0.16)),   # share of pixels set to 0 or 1
    "patch": ("sparse", (1, 2, 4)),              # patches replaced by uniform noise
    "gaussian": ("dense", (0.08, 0.16, 0.32)),   # noise standard deviation
    "blur": ("dense", (0.6, 1.0, 1.6)),          # Gaussian kernel sigma, pixels
    "contrast": ("dense", (0.5, 0.3, 0.15)),     # contrast factor (1 = unchanged)
}


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(int(seed))


def impulse(x: torch.Tensor, share: float, seed: int) -> torch.Tensor:
    """Salt-and-pepper noise: each pixel (all channels together) set to 0 or 1 with probability
    ``share`` (each value half of the time)."""
    gen = _generator(seed)
    n, _, h, w = x.shape
    hit = torch.rand(n, 1, h, w, generator=gen) < share
    salt = (torch.rand(n, 1, h, w, generator=gen) < 0.5).to(x.dtype)
    return torch.where(hit, salt.expand_as(x), x)


def patch(x: torch.Tensor, count: int, patch_size: int, seed: int) -> torch.Tensor:
    """Replace ``count`` distinct patches of the ``patch_size`` grid of each image by uniform
    noise in [0, 1] (a few tokens wholly corrupted)."""
    n, c, h, w = x.shape
    if h % patch_size or w % patch_size:
        raise ValueError(f"image size {h}x{w} is not a multiple of patch size {patch_size}")
    gh, gw = h // patch_size, w // patch_size
    if not 0 <= count <= gh * gw:
        raise ValueError(f"patch count must be in [0, {gh * gw}], got {count}")
    gen = _generator(seed)
    scores = torch.rand(n, gh * gw, generator=gen)
    chosen = torch.zeros(n, gh * gw, dtype=torch.bool)
    chosen.scatter_(1, scores.argsort(dim=1)[:, :int(count)], True)
    mask = chosen.view(n, 1, gh, gw).repeat_interleave(patch_size, 2).repeat_interleave(patch_size, 3)
    noise = torch.rand(n, c, h, w, generator=gen).to(x.dtype)
    return torch.where(mask, noise, x)


def gaussian(x: torch.Tensor, sigma: float, seed: int) -> torch.Tensor:
    """Additive Gaussian noise of standard deviation ``sigma``, clipped to [0, 1]."""
    noise = torch.randn(x.shape, generator=_generator(seed)).to(x.dtype)
    return (x + sigma * noise).clamp(0.0, 1.0)


def blur(x: torch.Tensor, sigma: float) -> torch.Tensor:
    """Separable Gaussian blur of width ``sigma`` pixels (kernel radius ⌈3σ⌉, edges replicated)."""
    radius = max(1, math.ceil(3 * sigma))
    t = torch.arange(-radius, radius + 1, dtype=x.dtype)
    kernel = torch.exp(-0.5 * (t / sigma) ** 2)
    kernel = kernel / kernel.sum()
    c = x.shape[1]
    out = F.pad(x, (radius, radius, 0, 0), mode="replicate")
    out = F.conv2d(out, kernel.view(1, 1, 1, -1).expand(c, 1, 1, -1), groups=c)
    out = F.pad(out, (0, 0, radius, radius), mode="replicate")
    out = F.conv2d(out, kernel.view(1, 1, -1, 1).expand(c, 1, -1, 1), groups=c)
    return out.clamp(0.0, 1.0)


def contrast(x: torch.Tensor, factor: float) -> torch.Tensor:
    """Pull every pixel towards its image's mean: m + c·(x − m)."""
    mean = x.mean(dim=(1, 2, 3), keepdim=True)
    return (mean + factor * (x - mean)).clamp(0.0, 1.0)


def corrupt(x: torch.Tensor, name: str, severity: float, seed: int = 0,
            patch_size: int | None = None) -> torch.Tensor:
    """Apply corruption ``name`` (a key of :data:`SEVERITIES`) at ``severity`` to ``x``."""
    if x.ndim != 4:
        raise ValueError(f"images must have shape [n, c, H, W], got {tuple(x.shape)}")
    if name == "impulse":
        return impulse(x, float(severity), seed)
    if name == "patch":
        if patch_size is None:
            raise ValueError("the patch corruption needs the model's patch_size")
        return patch(x, int(severity), patch_size, seed)
    if name == "gaussian":
        return gaussian(x, float(severity), seed)
    if name == "blur":
        return blur(x, float(severity))
    if name == "contrast":
        return contrast(x, float(severity))
    raise ValueError(f"unknown corruption {name!r}; known: {', '.join(SEVERITIES)}")
